# The same bench.py rows on the JPEGs capped at 256 px (make_shards.py --max-size 256); then bench.py's
# GPU tests (test_bench.py) and the trainers'
python3 results/h200-2026-12-02a/cap256.py /tmp/jpegs256 > $OUT/cap256.log 2>&1
timeout 200 python3 bench.py --data /tmp/jpegs256 --workers 16 --models resnet50,resnet18 \
  --only dali-mixed-hwc,cpu-decode,nvidia-example --iters 300 --max-seconds 7 \
  --json $OUT/c256.json > $OUT/c256.log 2>&1
grep -E "img/s|FAILED|Error" $OUT/c256.log | grep -v "JPEGs$" | tail -30
timeout 330 python3 -m pytest -q -rs -p no:cacheprovider --durations=5 test_train_classify.py \
  test_train_segment.py test_bench.py -k "gpu or exif or hardware_decoder or decoder or test_bench" \
  > $OUT/tests-train.log 2>&1
tail -n 12 $OUT/tests-train.log
