#!/usr/bin/env bash
# Archived probe: ran at commit 2231382 against that commit's bench.py and pipelines.py (with this folder's probe2.py,
# probe3.py); kept as a record, not maintained. To rerun: git checkout 2231382.
# bash callC.sh probe2   (decode-then-crop against crop-decode), then bash callC.sh probe3   (two pipelines)
export PYTHONPATH=/tmp/site:$PWD/.gpu-extra PYTHONUNBUFFERED=1
timeout 570 python3 results/h200-2026-11-29d/$1.py > $OUT/$1.log 2>&1
echo "rc $?" >> $OUT/$1.log
tail -30 $OUT/$1.log
