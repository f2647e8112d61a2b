# The same rows on bench.py's JPEGs capped at 256 px (make_shards.py --max-size 256), ResNet-18 and
# ResNet-50, all 16 cores
python3 -c "import bench; bench.jpeg_set(bench.parse_args(['--workers', '16']))"
python3 results/h200-2026-12-02a/cap256.py /tmp/jpegs256 > $OUT/cap256.log 2>&1
timeout 450 python3 results/h200-2026-12-02f/abba.py $OUT/c256.json --data /tmp/jpegs256 \
  --workers 16 --models resnet18,resnet50 --iters 300 --max-seconds 7 > $OUT/c256.log 2>&1
grep -E "SUMMARY|  (ours|nvidia).*batches" $OUT/c256.log
tail -n 2 $OUT/c256.log
