#!/usr/bin/env bash
# Archived probe: ran at commit 2231382 against that commit's bench.py and pipelines.py (with this folder's probe.py);
# kept as a record, not maintained. To rerun: git checkout 2231382.
# ResNet-18 / ResNet-50: eager vs CUDA-graphed step, synthetic vs DALI
export PYTHONPATH=/tmp/site:$PWD/.gpu-extra PYTHONUNBUFFERED=1
(nproc; lscpu | grep -E "Model name|Thread|Core|Socket|NUMA node"; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python3 -c "import torch, nvidia.dali; print(torch.__version__, nvidia.dali.__version__)") > $OUT/machine.txt 2>&1
PROBE_ARGS="--workers 16 --seg-samples 1024 --iters 150 --max-seconds 6" timeout 570 python3 results/h200-2026-11-29d/probe.py graph > $OUT/graph.log 2>&1
echo "rc $?" >> $OUT/graph.log
tail -40 $OUT/graph.log
