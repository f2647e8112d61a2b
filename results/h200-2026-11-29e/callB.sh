#!/usr/bin/env bash
# Archived probe: ran at commit 9e73d43 against that commit's bench.py and pipelines.py; kept as a record, not
# maintained. To rerun: git checkout 9e73d43.
# README's bench command; $1 = suffix, $2.. = environment (e.g. DALI_USE_NEW_THREAD_POOL=1)
export PYTHONPATH=/tmp/site:$PWD/.gpu-extra PYTHONUNBUFFERED=1
name=bench$1; shift
env "$@" timeout 560 python3 bench.py --workers 16 --iters 150 --max-seconds 10 --seg-samples 1024 --json $OUT/$name.json > $OUT/$name.log 2>&1
echo "rc $?" >> $OUT/$name.log
grep -v "Forced" $OUT/$name.log | grep -A60 "^date\|^bench\|^=" | tail -60
