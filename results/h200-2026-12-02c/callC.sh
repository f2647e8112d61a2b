# The trainers' GPU tests that callB's time limit cut off; then ResNet-50 fed with the decode on
# the CPU (cpudecode.py), 14 DALI threads, beside NVIDIA's example on as many
timeout 200 python3 -m pytest -q -rs -p no:cacheprovider test_train_classify.py \
  test_train_segment.py -k "gpu or exif or hardware_decoder" > $OUT/tests-train.log 2>&1
tail -n 3 $OUT/tests-train.log
PYTHONPATH=/tmp/site:. timeout 150 python3 results/h200-2026-12-02c/cpudecode.py --workers 16 --models resnet50 \
  --gpu-threads 14 --only dali-mixed-hwc,nvidia-example --iters 300 --max-seconds 7 \
  --json $OUT/cpudecode-t14.json > $OUT/cpudecode-t14.log 2>&1
grep -E "img/s|FAILED|Error" $OUT/cpudecode-t14.log | grep -v "JPEGs$" | tail -20
