# ResNet-50: the same loaders against the example; then train_classify.py, fixed 224 against
# --progressive-resize 160 1 3
timeout 300 python3 bench.py --workers 16 --models resnet50 \
  --only dali-mixed-hwc,nvidia-example,cache --iters 300 --max-seconds 7 --json $OUT/r50.json \
  > $OUT/r50.log 2>&1
grep -E "img/s|FAILED|Error" $OUT/r50.log | tail -20
timeout 250 python3 results/h200-2026-12-02a/progressive.py /tmp/prog auto > $OUT/progressive.log 2>&1
cat $OUT/progressive.log
for d in /tmp/prog/*/; do cp $d/metrics.jsonl $OUT/$(basename $d).jsonl; done
