#!/usr/bin/env bash
# Archived probe: ran between callA.sh (09a5f6a) and callC.sh (9dc1999), at which of the two is not recorded;
# train_classify.py and the GPU pipelines it uses are the same at both; kept as a record, not maintained.
# To rerun: git checkout 9dc1999.
# Issue 13: --compile in train_classify.py on the GPU, against eager and the synthetic loader, ResNet-18 and -50,
# bf16 channels_last batch 256, bench.py's 8192 JPEGs as train and val, 4 epochs of 32 steps.
export PYTHONPATH=/tmp/site:$PWD/.gpu-extra PYTHONUNBUFFERED=1
root=$(ls -d .cache/bench-jpegs/n8192-*)
mkdir -p /tmp/tc && ln -sfn $PWD/$root /tmp/tc/train && ln -sfn $PWD/$root /tmp/tc/val
run() {  # name, extra flags
  echo "== $1: $2"
  timeout 150 python3 train_classify.py --data /tmp/tc --amp bf16 --channels-last -b 256 --epochs 4 --print-freq 8 \
    --output-dir /tmp/out-$1 --overwrite $2 2>&1 | grep -E "img/s|Acc|top1|error|Error" | tail -18
}
{
run r18-eager "--arch resnet18"
run r18-compile "--arch resnet18 --compile"
run r18-eager-synthetic "--arch resnet18 --loader synthetic"
run r18-compile-synthetic "--arch resnet18 --loader synthetic --compile"
run r50-eager "--arch resnet50"
run r50-compile "--arch resnet50 --compile"
run r50-compile-synthetic "--arch resnet50 --loader synthetic --compile"
} > $OUT/compile_train.log 2>&1
cat $OUT/compile_train.log
