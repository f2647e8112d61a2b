#!/usr/bin/env bash
# Archived probe: ran at commit 465e2ed against that commit's bench.py and pipelines.py (with this folder's
# ratio_gpu_machine.py); kept as a record, not maintained. To rerun: git checkout 465e2ed.
export PYTHONPATH=/tmp/site:$PWD/.gpu-extra PYTHONUNBUFFERED=1
DALI_USE_NEW_THREAD_POOL=1 timeout 200 python3 results/h200-2026-11-29d/ratio_gpu_machine.py 2>&1 | grep -v "Forced\|^$\|JPEGs$\|pairs$" > $OUT/ratio_gpu_machine.log
cat $OUT/ratio_gpu_machine.log
