# The same table on the JPEGs capped at 256 px (make_shards.py --max-size 256), WebDataset shards too
python3 results/h200-2026-12-02a/cap256.py /tmp/jpegs256 > $OUT/cap256.log 2>&1
timeout 420 python3 bench.py --data /tmp/jpegs256 --workers 16 --models resnet18,resnet50 \
  --only dali-mixed-hwc,nvidia-example,cache,wds --iters 300 --max-seconds 7 \
  --json $OUT/c256.json > $OUT/c256.log 2>&1
grep -E "img/s|FAILED|Error|images" $OUT/c256.log $OUT/cap256.log | tail -40
