#!/usr/bin/env bash
# Archived probe: ran at commit dc4b6e1 against that commit's bench.py, pipelines.py and test_bench.py; kept as a
# record, not maintained. To rerun: git checkout dc4b6e1.
# the bench command, then test_bench.py with its GPU sections
export PYTHONPATH=/tmp/site:$PWD/.gpu-extra PYTHONUNBUFFERED=1
python3 bench.py --workers 16 --iters 150 --max-seconds 10 --seg-samples 1024 --json $OUT/bench.json > $OUT/bench.log 2>&1
echo "rc $?" >> $OUT/bench.log
grep -A60 "^date" $OUT/bench.log
timeout 150 python3 -m pytest -q test_bench.py 2>&1 | tail -3
