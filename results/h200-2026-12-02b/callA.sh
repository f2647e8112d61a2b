# ResNet-18: ours at the default hw_decoder_load (0.5 since this commit) against NVIDIA's example,
# one change at a time (--against-example); then ResNet-18 and ResNet-50, ours against the example
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > $OUT/gpu.txt
nproc >> $OUT/gpu.txt
timeout 330 python3 bench.py --workers 16 --models resnet18 --against-example \
  --only dali-mixed-hwc,nvidia-example --iters 300 --max-seconds 7 --json $OUT/r18.json \
  > $OUT/r18.log 2>&1
timeout 200 python3 bench.py --workers 16 --models resnet18,resnet50 \
  --only dali-mixed-hwc,nvidia-example --iters 300 --max-seconds 7 --json $OUT/both.json \
  > $OUT/both.log 2>&1
grep -E "img/s|FAILED|Error" $OUT/r18.log $OUT/both.log | grep -v "JPEGs$" | tail -50
