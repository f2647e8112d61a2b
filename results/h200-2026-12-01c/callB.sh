#!/usr/bin/env bash
# The decoder cache on every local layout (issue 32, item 1): train_classify.py's own rate with
# --decoder-cache on, on bench.py's 8192 JPEGs as ImageFolder files, TFRecord shards and WebDataset
# shards (train/ and val/ are the same images), beside a synthetic batch; ResNet-18, bf16,
# channels_last, batch 256. Before it, a short bench.py run, which also writes those JPEGs.
set -u
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
python3 bench.py --workers 16 --iters 30 --max-seconds 4 --only dali-mixed-hwc > $OUT/bench.log 2>&1
src=$(ls -d $PWD/.cache/bench-jpegs/n8192-* | head -1)
tree=/tmp/tree && mkdir -p $tree && ln -sfn "$src" $tree/train && ln -sfn "$src" $tree/val
for fmt in tfrecord wds; do
  python3 make_shards.py $tree /tmp/$fmt --format $fmt --workers 16 >> $OUT/train.log 2>&1
done
for run in synthetic:$tree folder:$tree tfrecord:/tmp/tfrecord wds:/tmp/wds; do
  name=${run%%:*} root=${run#*:}
  flags="--decoder-cache on"
  [ "$name" = synthetic ] && flags="--loader synthetic"
  cmd="train_classify.py --data $root --arch resnet18 --amp bf16 --channels-last -b 256 --epochs 6 --print-freq 16 $flags"
  echo "== $name: $cmd" >> $OUT/train.log
  python3 $cmd --output-dir /tmp/runs/$name 2>&1 | grep -v "^Epoch: \[" >> $OUT/train.log
  cp /tmp/runs/$name/metrics.jsonl $OUT/$name.jsonl
done
