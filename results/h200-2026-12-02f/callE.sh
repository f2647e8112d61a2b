# ResNet-18 on the full-size JPEGs on callC's machine (typed in the tool as one command), then bench.py's
# GPU tests
timeout 230 python3 results/h200-2026-12-02f/abba.py $OUT/full16b.json --workers 16 --models resnet18 \
  --iters 300 --max-seconds 7 > $OUT/full16b.log 2>&1
grep -E "SUMMARY|  (ours|nvidia).*batches" $OUT/full16b.log
timeout 300 python3 -m pytest -q -rs -p no:cacheprovider --durations=5 test_bench.py -k "test_bench or gpu" \
  > $OUT/tests-bench.log 2>&1
tail -n 8 $OUT/tests-bench.log
