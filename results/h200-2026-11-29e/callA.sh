#!/usr/bin/env bash
# Archived probe: ran at commit 9e73d43 against that commit's code and tests (the whole suite); kept as a record, not
# maintained. To rerun: git checkout 9e73d43.
# machine facts and the whole test suite with the GPU visible (test_pipelines.py's GPU tests run, not skipped)
export PYTHONPATH=/tmp/site:$PWD/.gpu-extra PYTHONUNBUFFERED=1
(nproc; lscpu | grep -E "Model name|Thread|Core|Socket|NUMA node"; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python3 -c "import torch, torchvision, nvidia.dali, sys; print(sys.version.split()[0], torch.__version__, torchvision.__version__, nvidia.dali.__version__)") > $OUT/machine.txt 2>&1
cat $OUT/machine.txt
timeout 450 python3 -m pytest -q -rs -p no:cacheprovider 2>&1 | tail -25 > $OUT/pytest.log
cat $OUT/pytest.log
