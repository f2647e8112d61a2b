#!/usr/bin/env bash
# Archived probe: ran at commit ee8ebdf against that commit's bench.py and pipelines.py (with this folder's probe.py);
# kept as a record, not maintained. To rerun: git checkout ee8ebdf.
export PYTHONPATH=/tmp/site:$PWD/.gpu-extra PYTHONUNBUFFERED=1
(nproc; lscpu | grep -E "Model name|Thread|Core|Socket|NUMA node"; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python3 -c "import torch, nvidia.dali; print(torch.__version__, nvidia.dali.__version__)") > $OUT/machine.txt 2>&1
timeout 570 python3 results/h200-2026-11-29c/probe.py seg-cpu seg-gpu rn18 profile > $OUT/probe.log 2>&1
echo "rc $?" >> $OUT/probe.log
tar czf $OUT/traces.tgz -C /tmp/traces . 2>/dev/null
tail -70 $OUT/probe.log
