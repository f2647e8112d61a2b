# The same comparison with DALI's new thread pool; then on the JPEGs capped at 256 px
# (make_shards.py --max-size 256), WebDataset shards of them too
DALI_USE_NEW_THREAD_POOL=1 timeout 200 python3 bench.py --workers 16 --models resnet18,resnet50 \
  --only dali-mixed-hwc,nvidia-example --iters 300 --max-seconds 7 --json $OUT/newpool.json \
  > $OUT/newpool.log 2>&1
python3 results/h200-2026-12-02a/cap256.py /tmp/jpegs256 > $OUT/cap256.log 2>&1
timeout 260 python3 bench.py --data /tmp/jpegs256 --workers 16 --models resnet18,resnet50 \
  --only dali-mixed-hwc,nvidia-example,wds --iters 300 --max-seconds 7 \
  --json $OUT/c256.json > $OUT/c256.log 2>&1
grep -E "img/s|FAILED|Error" $OUT/newpool.log $OUT/c256.log | grep -v "JPEGs$" | tail -40
