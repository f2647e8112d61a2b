#!/usr/bin/env bash
# compile_cache.sh OUTDIR: on the GPU machine once DALI is up (from a copy of the project root),
# the first step of a compiled ResNet-50 run of train_classify.py on a node whose compile cache is
# empty, three rounds of three starts, each with its own empty TORCHINDUCTOR_CACHE_DIR (and
# TRITON_CACHE_DIR), as a job requeued on another node finds it:
#   fresh     a new run (one epoch), from nothing
#   resumed   that run resumed for a second epoch: it loads the run's compile-cache.bin
#   without   the same resume with compile-cache.bin removed: what a requeue did before it
# The training set is share_runs.sh's (bench.py's 8,192 JPEGs), -b 256, bf16, channels-last.
set -euo pipefail
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
out=$1
mkdir -p "$out"
root=/tmp/share-data
if [ ! -d $root/train/class00 ]; then
  rm -rf $root
  set=$(python3 -c "import bench; a = bench.parse_args(['--num-images', '8192', '--cache-dir', '/tmp/bench']); print(bench.jpeg_set(a)[0])" | tail -1)
  mkdir -p $root/val && ln -s "$set" $root/train && ln -s "$set/class00" $root/val/class00
fi
start() {  # NAME ARGS...: one start on an empty node cache
  local name=$1
  shift
  rm -rf /tmp/node && mkdir -p /tmp/node
  TORCHINDUCTOR_CACHE_DIR=/tmp/node TRITON_CACHE_DIR=/tmp/node/triton \
    python3 train_classify.py "$@" >"$out/$name.log" 2>&1
}
for round in 1 2 3; do
  run=/tmp/cc-run-$round
  rm -rf $run $run-without
  start fresh-$round --data $root -b 256 --arch resnet50 --amp bf16 --channels-last --epochs 1 \
    --print-freq 8 --output-dir $run
  cp -r $run $run-without && rm $run-without/compile-cache.bin
  ls -l $run/compile-cache.bin >>"$out/sizes.txt"
  start resumed-$round --data $root --resume $run/checkpoint.pth --epochs 2
  start without-$round --data $root --resume $run-without/checkpoint.pth --epochs 2
  for kind in fresh resumed without; do
    dir=$run; [ $kind = without ] && dir=$run-without
    python3 -c "import json, sys
r = [json.loads(l) for l in open('$dir/metrics.jsonl')]
c = [x for x in r if x['type'] == 'compile'][0 if '$kind' == 'fresh' else -1]
print('$kind', $round, round(c['seconds'], 1), c['cache_hits'], sep='\t')" | tee -a "$out/first-steps.tsv"
  done
done
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu --format=csv,noheader | tee "$out/gpu.txt"
