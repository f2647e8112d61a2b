# ResNet-50 and ResNet-18 fed by the mixed decoder, by the decode on the CPU and by NVIDIA's example,
# no decoder cache, 8 DALI threads each, on bench.py's JPEGs; then train_classify.py with ResNet-50,
# no cache: --decoder mixed and cpu against --loader synthetic (trainer.py)
timeout 200 python3 bench.py --workers 16 --models resnet50,resnet18 \
  --only dali-mixed-hwc,cpu-decode,nvidia-example --iters 300 --max-seconds 7 \
  --json $OUT/full.json > $OUT/full.log 2>&1
grep -E "img/s|FAILED|Error" $OUT/full.log | grep -v "JPEGs$" | tail -30
timeout 240 python3 results/h200-2026-12-02e/trainer.py /tmp/trainer-runs > $OUT/trainer.log 2>&1
for r in synthetic mixed cpu-decode; do cp /tmp/trainer-runs/$r/metrics.jsonl $OUT/$r.jsonl; done
cat $OUT/trainer.log
