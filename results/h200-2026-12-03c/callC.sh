# train_segment.py's DeepLabV3-MobileNetV3-Large, eager, fed by DALI against --loader synthetic on
# the 400 training pairs of callA (12 steps an epoch), 10 epochs each.
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
for l in synthetic dali synthetic dali; do
  rm -rf /tmp/s-$l
  timeout 120 python3 train_segment.py --data /tmp/seg --arch deeplabv3_mobilenet_v3_large -b 32 \
    --amp bf16 --channels-last --epochs 10 --loader $l --output-dir /tmp/s-$l > /tmp/s-$l.log 2>&1
  python3 -c "
import json, statistics, sys
rs = [json.loads(l) for l in open('/tmp/s-$l/metrics.jsonl')]
ep = [r for r in rs if r.get('type') == 'epoch']
print('$l', 'epochs', len(ep), 'keys', sorted(ep[-1])[:30] if ep else None)
rates = [r.get('img_s') or r.get('images_per_s') for r in ep]
print('$l rates', rates, 'median of 3-10', statistics.median([x for x in rates[2:] if x]))
" 2>&1 | tee -a $OUT/seg-trainer.log
  cp /tmp/s-$l/metrics.jsonl $OUT/seg-$l.jsonl
done
tail -n 5 /tmp/s-dali.log
