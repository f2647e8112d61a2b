# ResNet-18: our loaders (uncached, cache of all / half / a tenth) against NVIDIA's example, and ours
# with one of the example's settings at a time (--against-example)
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > $OUT/gpu.txt
nproc >> $OUT/gpu.txt
timeout 540 python3 bench.py --workers 16 --models resnet18 --against-example \
  --only dali-mixed-hwc,nvidia-example,cache --iters 300 --max-seconds 7 --json $OUT/r18.json \
  > $OUT/r18.log 2>&1
grep -E "img/s|FAILED|Error" $OUT/r18.log | tail -45
