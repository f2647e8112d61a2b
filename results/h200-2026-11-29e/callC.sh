#!/usr/bin/env bash
# Archived probe: ran at commit 9e73d43 against that commit's bench.py and pipelines.py (with this folder's
# compile.py); kept as a record, not maintained. To rerun: git checkout 9e73d43.
# torch.compile probe
export PYTHONPATH=/tmp/site:$PWD/.gpu-extra PYTHONUNBUFFERED=1
timeout 570 python3 results/h200-2026-11-29e/compile.py > $OUT/compile.log 2>&1
echo "rc $?" >> $OUT/compile.log
grep -v "^\s*$" $OUT/compile.log | tail -40
