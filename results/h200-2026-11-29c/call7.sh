#!/usr/bin/env bash
# Archived probe: ran at commit 2da0839 (dc4b6e1, committed the same second, changes only bench.py) against that commit's
# bench.py and pipelines.py (with this folder's probe.py); kept as a record, not maintained.
# To rerun: git checkout 2da0839.
# second probe call: CPU-only segmentation stage by stage at 16 threads; ResNet-18 end-to-end variants
export PYTHONPATH=/tmp/site:$PWD/.gpu-extra PYTHONUNBUFFERED=1
timeout 560 python3 results/h200-2026-11-29c/probe.py seg-cpu2 rn18b > $OUT/probe2.log 2>&1
echo "rc $?" >> $OUT/probe2.log
tail -40 $OUT/probe2.log
