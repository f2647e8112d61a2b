#!/usr/bin/env bash
# The share rows on one GPU, medians of three (issue 70.5), from a copy of the project (the run
# tool lays the tree anew at each call), once DALI is up (/tmp/site):
#   cp -r . /tmp/proj && cd /tmp/proj && setsid nohup bash results/h100-2026-12-06-share/share_rows.sh /tmp/shareout &
# Names after DEST (resnet50 resnet18 deeplabv3 lraspp) run only those sets.
# Each set is one share.py (three rounds; a round runs --loader synthetic and each variant in
# turn), its log and JSON in DEST, in this order: ResNet-50 and ResNet-18 (the decoder cache on, the
# default, and off), DeepLabV3- and LRASPP-MobileNetV3-Large (CUDA graphs, their default on one GPU).
# Data as results/h200-2026-12-04b/share_runs.sh makes it: bench.py's 8,192 JPEGs; 2,000 demo pairs.
set -uo pipefail
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
dest=$1
shift
sets=${*:-resnet50 resnet18 deeplabv3 lraspp}
mkdir -p "$dest"
root=/tmp/share-data
if [[ $sets == *resnet* && ! -d $root/train/class00 ]]; then
  set=$(python3 -c "import bench; a = bench.parse_args(['--num-images', '8192', '--cache-dir', '/tmp/bench']); print(bench.jpeg_set(a)[0])" | tail -1)
  mkdir -p $root/val && ln -s "$set" $root/train && ln -s "$set/class00" $root/val/class00
fi
if [[ ($sets == *deeplabv3* || $sets == *lraspp*) && ! -d /tmp/seg/csv_file ]]; then
  # the PNGs of `data_processing.py /tmp/segpng --demo --demo-per-group 500 --demo-size 512`, drawn
  # in a process per core; then data_processing.py converts and splits them as with --demo
  python3 results/h100-2026-12-06-share/draw_demo.py /tmp/segpng 500 512
  python3 data_processing.py /tmp/segpng /tmp/seg | tail -n 1
fi
common=(--amp bf16 --channels-last --print-freq 8)
share() {  # name, share.py's flags and the trainer's
  local name=$1
  shift
  [[ " $sets " == *" $name "* ]] || return 0
  echo "$(date -u +%H:%M:%S) $name" >> "$dest/times.txt"
  python3 share.py --runs 3 --json "$dest/share-$name.json" "$@" 2>&1 \
    | grep -v "^Epoch\|^W\|warn\|^train: \|^val: " > "$dest/share-$name.log"
}
share resnet50 --variant "--decoder-cache off" -- train_classify.py --data $root -b 256 \
  --arch resnet50 --epochs 18 "${common[@]}"
share resnet18 --variant "--decoder-cache off" -- train_classify.py --data $root -b 256 \
  --arch resnet18 --epochs 44 "${common[@]}"
share deeplabv3 -- train_segment.py --data /tmp/seg --size 384 -b 32 \
  --arch deeplabv3_mobilenet_v3_large --epochs 24 "${common[@]}"
share lraspp -- train_segment.py --data /tmp/seg --size 384 -b 32 \
  --arch lraspp_mobilenet_v3_large --epochs 24 "${common[@]}"
echo "$(date -u +%H:%M:%S) done" >> "$dest/times.txt"
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu --format=csv,noheader >> "$dest/times.txt"
