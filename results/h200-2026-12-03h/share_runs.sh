#!/usr/bin/env bash
# One call of the run tool on the H200, from the project root: bench.py's 8,192 JPEGs (400-500 px)
# as a root of train/ (all of them) and val/ (one class of 512), then share.py over a compiled model
# fed by DALI, each variant against --loader synthetic, three runs each.
#   bash results/h200-2026-12-03h/share_runs.sh MODEL EPOCHS [share.py's --variant ...]
set -euo pipefail
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
root=/tmp/share-data
if [ ! -d $root/train/class00 ]; then
  rm -rf $root
  set=$(python3 -c "import bench; a = bench.parse_args(['--num-images', '8192', '--cache-dir', '/tmp/bench']); print(bench.jpeg_set(a)[0])" | tail -1)
  mkdir -p $root/val && ln -s "$set" $root/train && ln -s "$set/class00" $root/val/class00
fi
model=$1 epochs=$2; shift 2
python3 share.py --runs 3 --json "$OUT/share-$model-$(date +%H%M%S).json" "$@" -- train_classify.py \
  --data $root --arch $model -b 256 --amp bf16 --channels-last --epochs "$epochs" --print-freq 8 \
  2> >(grep -v "^Epoch\|^W\|warn" >&2) | grep -v "^Epoch: \["
