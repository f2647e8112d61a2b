# Issue 46, item 2: train_classify.py on bench.py's 8,192 JPEGs as train/ and val/ (made in the
# bring-up), batch 256, bf16, channels_last, compiled (the GPU default), 4 epochs: --loader
# synthetic, DALI without and with the decoder cache, for ResNet-18 and ResNet-50; then
# feedcost.py on the uncached DALI runs.
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
D=results/h200-2026-12-03e
mkdir -p /tmp/A
for arch in resnet18 resnet50; do
  for how in "synthetic:--loader synthetic" "off:--decoder-cache off" "on:--decoder-cache on"; do
    name=$arch-${how%%:*}
    rm -rf /tmp/A/$name
    timeout 150 python3 train_classify.py --data /tmp/jpegs --arch $arch -b 256 --amp bf16 \
      --channels-last --epochs 4 ${how#*:} --output-dir /tmp/A/$name > /tmp/A/$name.log 2>&1
    python3 $D/summary.py /tmp/A/$name | tee -a $OUT/A-summary.jsonl
  done
done
for arch in resnet18 resnet50; do
  timeout 110 python3 $D/feedcost.py classify /tmp/jpegs --arch $arch -b 256 --decoder-cache off \
    > /tmp/A/feedcost-$arch.log 2>&1
  grep '^{' /tmp/A/feedcost-$arch.log | tee -a $OUT/A-feedcost.jsonl | grep -E 'shares|kernels' | cut -c1-400
done
tar -czf $OUT/A.tar.gz -C /tmp A
