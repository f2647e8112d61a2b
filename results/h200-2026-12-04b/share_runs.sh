#!/usr/bin/env bash
# One call of the run tool on the H200, from the project root, once DALI is up: share.py's three
# rounds of a compiled model fed by DALI against --loader synthetic.
#   bash results/h200-2026-12-04b/share_runs.sh classify MODEL EPOCHS [trainer flags ...]
#   bash results/h200-2026-12-04b/share_runs.sh segment MODEL EPOCHS [trainer flags ...]
# classify: bench.py's 8,192 JPEGs (400-500 px) as train/ (all) and val/ (one class of 512), -b 256.
# segment: 2,000 demo pairs of 512 px (1,600 to train), as issue 56 set them up, --size 384 -b 32.
set -euo pipefail
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
task=$1 model=$2 epochs=$3
shift 3
if [ "$task" = classify ]; then
  root=/tmp/share-data
  if [ ! -d $root/train/class00 ]; then
    rm -rf $root
    set=$(python3 -c "import bench; a = bench.parse_args(['--num-images', '8192', '--cache-dir', '/tmp/bench']); print(bench.jpeg_set(a)[0])" | tail -1)
    mkdir -p $root/val && ln -s "$set" $root/train && ln -s "$set/class00" $root/val/class00
  fi
  trainer=(train_classify.py --data $root -b 256)
else
  root=/tmp/seg
  if [ ! -f $root/csv_file/train.csv ] && [ ! -d $root/csv_file ]; then
    python3 data_processing.py /tmp/segpng $root --demo --demo-per-group 500 --demo-size 512 | tail -n 1
  fi
  trainer=(train_segment.py --data $root --size 384 -b 32)
fi
python3 share.py --runs 3 --json "$OUT/share-$model-$(date +%H%M%S).json" -- "${trainer[@]}" \
  --arch "$model" --amp bf16 --channels-last --epochs "$epochs" --print-freq 8 "$@" \
  2> >(grep -v "^Epoch\|^W\|warn" >&2) | grep -v "^Epoch: \["
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu --format=csv,noheader
