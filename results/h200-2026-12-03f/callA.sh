# Issue 46, item 2: sweep.py for the compiled ResNet-18 (the default mode and CUDA graphs) and
# ResNet-50, each fed by variants of the trainer's pipeline without the decoder cache.
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
D=results/h200-2026-12-03f
VARIANTS=default,pad-example,hw0.5,hw0.8,hw0.9,j4,j12,fp16-out RO_VARIANTS=default,hw0.8 \
  timeout 280 python3 $D/sweep.py /tmp/jpegs --arch resnet18 --modes default,reduce-overhead \
  > /tmp/A-r18.log 2>&1
grep '^{' /tmp/A-r18.log > $OUT/A-sweep-resnet18.jsonl; grep -E '^[A-Za-z]*Error' /tmp/A-r18.log | tail -3
VARIANTS=default,hw0.9,pad-example,cpu-j12,cpu-j15,fp16-out \
  timeout 280 python3 $D/sweep.py /tmp/jpegs --arch resnet50 > /tmp/A-r50.log 2>&1
grep '^{' /tmp/A-r50.log > $OUT/A-sweep-resnet50.jsonl; grep -E '^[A-Za-z]*Error' /tmp/A-r50.log | tail -3
grep -h '"share"\|kernels' $OUT/A-sweep-*.jsonl | cut -c1-260
