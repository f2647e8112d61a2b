#!/usr/bin/env bash
export PYTHONPATH=/tmp/site:$PWD/.gpu-extra PYTHONUNBUFFERED=1
DALI_USE_NEW_THREAD_POOL=1 timeout 200 python3 results/h200-2026-11-29d/ratio_gpu_machine.py 2>&1 | grep -v "Forced\|^$\|JPEGs$\|pairs$" > $OUT/ratio_gpu_machine.log
cat $OUT/ratio_gpu_machine.log
