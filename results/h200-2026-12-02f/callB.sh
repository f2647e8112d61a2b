# ResNet-18 on bench.py's full-size JPEGs: ours at hw_decoder_load 0.35 / 0.5 / 0.65 / 1.0 and NVIDIA's
# example, each row twice in A..E E..A order (abba.py); on all 16 cores, then held to 12 of them with
# taskset, as a machine whose CPUs are a quarter slower
timeout 300 python3 results/h200-2026-12-02f/abba.py $OUT/full16.json --workers 16 --iters 300 \
  --max-seconds 7 > $OUT/full16.log 2>&1
grep -E "SUMMARY|  (ours|nvidia).*batches" $OUT/full16.log
timeout 270 taskset -c 0-11 python3 results/h200-2026-12-02f/abba.py $OUT/full12.json --workers 12 \
  --iters 300 --max-seconds 7 > $OUT/full12.log 2>&1
grep -E "SUMMARY|  (ours|nvidia).*batches" $OUT/full12.log
tail -n 3 $OUT/full12.log
