# ResNet-18 and ResNet-50, ours against NVIDIA's example, no decoder cache: the hardware decoder's
# share (0.25, 0.3) and the DALI threads (8, 12, for both pipelines), one process each
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > $OUT/gpu.txt
nproc >> $OUT/gpu.txt
for run in "0.25 12" "0.3 8" "0.3 12" "0.25 8"; do
  set -- $run
  timeout 150 python3 bench.py --workers 16 --models resnet18,resnet50 --hw-decoder-load $1 \
    --gpu-threads $2 --only dali-mixed-hwc,nvidia-example --iters 300 --max-seconds 7 \
    --json $OUT/hw$1-t$2.json > $OUT/hw$1-t$2.log 2>&1
done
grep -E "img/s|FAILED|Error" $OUT/hw*.log | grep -v "JPEGs$" | tail -60
