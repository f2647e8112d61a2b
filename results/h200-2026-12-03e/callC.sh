# The GPU tests of both trainers (compiled by default on the GPU now), then bench.py's compiled
# ResNet-50 rows beside NVIDIA's example (issue 46, item 5).
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
timeout 290 python3 -m pytest -q -rs -p no:cacheprovider --durations=12 test_train_classify.py \
  test_train_segment.py -k gpu > $OUT/C-tests.log 2>&1
tail -n 16 $OUT/C-tests.log
timeout 200 python3 bench.py --cache-dir /tmp/cache --models resnet50 --workers 16 \
  --only nvidia-example,dali-mixed-hwc --json $OUT/C-bench.json > $OUT/C-bench.log 2>&1
tail -n 30 $OUT/C-bench.log
