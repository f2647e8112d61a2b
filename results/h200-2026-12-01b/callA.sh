#!/usr/bin/env bash
# The GPU tests of the suite (pipelines incl. the overlay, trainers incl. the decoder cache, DDP refusal) on one H200,
# after issue 24's start-up change and issue 25's flags; DALI from the bundle in /tmp/site.
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
set -o pipefail
nvidia-smi -L | tee $OUT/machine.txt
nproc | tee -a $OUT/machine.txt
python3 -c 'import torch, torchvision, nvidia.dali as d, sys; print(sys.version.split()[0], torch.__version__, torchvision.__version__, d.__version__)' | tee -a $OUT/machine.txt
python3 -m pytest -q -p no:cacheprovider -rs test_pipelines.py test_train_classify.py test_train_segment.py test_ddp.py \
    -k "gpu or exif or processes or overlay" 2>&1 | tee $OUT/pytest_gpu.log
