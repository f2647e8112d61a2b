#!/usr/bin/env bash
# Archived probe: ran at commit 2231382 against that commit's bench.py and pipelines.py (with this folder's probe.py);
# kept as a record, not maintained. To rerun: git checkout 2231382.
# CPU-only segmentation (as is vs fused brightness/contrast) and CPU-only classification dtypes, 16 cores
export PYTHONPATH=/tmp/site:$PWD/.gpu-extra PYTHONUNBUFFERED=1
timeout 570 python3 results/h200-2026-11-29d/probe.py seg-cpu cls-cpu > $OUT/cpu.log 2>&1
echo "rc $?" >> $OUT/cpu.log
tail -45 $OUT/cpu.log
