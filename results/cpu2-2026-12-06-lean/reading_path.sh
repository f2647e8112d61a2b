#!/usr/bin/env bash
# reading_path.sh: the lines a fresh one-process CPU run of each trainer enters, from the project
# root (python: the project's venv; each run into a new folder, as a fresh run makes). Small sizes, so that it runs in seconds: at a45dbe5 they gave
# the same functions and lines as the default sizes (1,669 and 1,778).
set -euo pipefail
python -c "from data_processing import make_demo_images; make_demo_images('/tmp/rpdata')"
python train_segment.py --data demo --epochs 1 --output-dir "$(mktemp -d)" >/dev/null  # prepares .cache/demo-segment-v1/npy
python ../shared/tools/reading_path.py train_classify.py --data /tmp/rpdata --epochs 1 -b 8 \
    --output-dir "$(mktemp -u -d)" -a resnet18 --train-crop-size 32 --val-crop-size 32 \
    --val-resize-size 36 | tail -n1
python ../shared/tools/reading_path.py train_segment.py --data .cache/demo-segment-v1/npy \
    --epochs 1 -b 8 --output-dir "$(mktemp -u -d)" --size 32 | tail -n1
