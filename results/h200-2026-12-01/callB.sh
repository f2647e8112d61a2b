#!/usr/bin/env bash
# bench.py's cache rows (issue 27), alone and feeding ResNet-50 / ResNet-18: the crop-decode HWC loader, whole-image
# decode without a cache, and with a cache that holds every image; then, in a process of its own (DALI keeps one
# decoder cache per GPU and process, of one size), with a cache that holds half of them.
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
set -o pipefail
python3 bench.py --workers 16 --iters 100 --max-seconds 8 --only dali-mixed-hwc,dali-mixed-full,dali-mixed-cached \
    --json $OUT/bench.json 2>&1 | tee $OUT/bench.log
python3 bench.py --workers 16 --iters 100 --max-seconds 8 --only dali-mixed-half \
    --json $OUT/bench-half.json 2>&1 | tee $OUT/bench-half.log
