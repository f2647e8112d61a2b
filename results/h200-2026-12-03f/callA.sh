# Issue 46, item 2: sweep.py for the compiled ResNet-18 (the default mode and CUDA graphs) and
# ResNet-50, each fed by variants of the trainer's pipeline without the decoder cache.
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
D=results/h200-2026-12-03f
VARIANTS=default,pad-example,hw0.8,hw0.9,j12,fp16-out RO_VARIANTS=default \
  timeout 280 python3 $D/sweep.py /tmp/jpegs --arch resnet18 --modes default,reduce-overhead \
  > /tmp/A-r18.log 2>&1
grep '^{' /tmp/A-r18.log > /tmp/A-sweep-resnet18.jsonl; cp /tmp/A-sweep-resnet18.jsonl $OUT/; grep -E '^[A-Za-z]*Error' /tmp/A-r18.log | tail -3
VARIANTS=default,hw0.9,cpu-j12,cpu-j15 \
  timeout 280 python3 $D/sweep.py /tmp/jpegs --arch resnet50 > /tmp/A-r50.log 2>&1
grep '^{' /tmp/A-r50.log > /tmp/A-sweep-resnet50.jsonl; cp /tmp/A-sweep-resnet50.jsonl $OUT/; grep -E '^[A-Za-z]*Error' /tmp/A-r50.log | tail -3
grep -h "share\\|kernels" /tmp/A-sweep-*.jsonl | cut -c1-300
