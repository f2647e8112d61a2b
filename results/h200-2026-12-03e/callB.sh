# Issue 46, item 3: train_segment.py on 2,000 demo pairs of 512 px (made in the bring-up), 384 px,
# batch 32, bf16, channels_last, 4 epochs: DeepLabV3-MobileNetV3-Large eager and compiled, U-Net
# compiled (the GPU default), each --loader synthetic against DALI; then feedcost.py for
# DeepLabV3 eager and compiled.
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
D=results/h200-2026-12-03e
mkdir -p /tmp/B
for run in "dl-eager:deeplabv3_mobilenet_v3_large:--no-compile" \
           "dl-compiled:deeplabv3_mobilenet_v3_large:--compile" "unet-compiled:unet:--compile"; do
  IFS=: read -r name arch how <<< "$run"
  for l in synthetic dali; do
    rm -rf /tmp/B/$name-$l
    timeout 150 python3 train_segment.py --data /tmp/seg --arch $arch --size 384 -b 32 --amp bf16 \
      --channels-last --epochs 4 $how --loader $l --output-dir /tmp/B/$name-$l \
      > /tmp/B/$name-$l.log 2>&1
    python3 $D/summary.py /tmp/B/$name-$l | tee -a $OUT/B-summary.jsonl
  done
done
for how in --no-compile --compile; do
  timeout 120 python3 $D/feedcost.py segment /tmp/seg --arch deeplabv3_mobilenet_v3_large \
    --size 384 -b 32 $how > /tmp/B/feedcost$how.log 2>&1
  grep '^{' /tmp/B/feedcost$how.log | tee -a $OUT/B-feedcost.jsonl | grep -E 'shares|kernels' | cut -c1-400
done
tar -czf $OUT/B.tar.gz -C /tmp B
