#!/usr/bin/env bash
# train_classify.py's own rate (issue 27): ResNet-18 and ResNet-50, bf16, channels_last, batch 256, on bench.py's
# 8192 JPEGs as train/ and val/, fed by a synthetic batch, by DALI with the decoder cache off, and with it on.
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
tree=/tmp/tree && mkdir -p $tree
src=$(ls -d $PWD/.cache/bench-jpegs/n8192-* | head -1)
ln -sfn "$src" $tree/train && ln -sfn "$src" $tree/val
for arch in resnet18 resnet50; do
  for mode in synthetic off on; do
    case $mode in synthetic) flags="--loader synthetic";; *) flags="--decoder-cache $mode";; esac
    echo "== $arch $mode: train_classify.py --data $tree --arch $arch --amp bf16 --channels-last -b 256 --epochs 8 --print-freq 16 $flags" >> $OUT/train.log
    python3 train_classify.py --data $tree --arch $arch --amp bf16 --channels-last -b 256 --epochs 8 --print-freq 16 \
        --output-dir /tmp/runs/$arch-$mode $flags 2>&1 | grep -v "^Epoch: \[" >> $OUT/train.log
    cp /tmp/runs/$arch-$mode/metrics.jsonl $OUT/$arch-$mode.jsonl
  done
done
