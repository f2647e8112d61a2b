#!/usr/bin/env bash
# Issue 24 on one H200 (16 cores): train_classify.py's start-up on a 1.28 M-file ImageFolder tree (bench.py --startup,
# ResNet-50, batch 256, DALI on the GPU with 8 threads), then make_shards.py's throughput on 16 cores.
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
set -o pipefail
python3 bench.py --startup 1281167 --num-images 256 --models resnet50 --batch-size 256 --workers 8 \
    --json $OUT/startup.json 2>&1 | tee $OUT/startup.log
python3 results/cpu2-2026-12-01-shards/shard_speed.py --images 8000 --shard-size 128 --workers 1 16 --repeats 1 \
    --wait 5 2>&1 | tee $OUT/shard_speed.log
