#!/usr/bin/env bash
# bench.py --startup at de11f4f (new) and 7fccbd2 (old) in turn, one round each, three times.
cd /tmp/r70/ab  # copies: git archive 7fccbd2 into old/, de11f4f into new/ (the demo set copied in)
source /work/main/.venv/bin/activate
for r in 1 2 3; do for v in new old; do
  (cd $v && python bench.py --startup 1281167 --num-images 1000 --cache-dir /tmp/h70/cache \
    --models resnet18 --batch-size 64 --workers 2 --startup-runs 1 --json ../startup-$v-$r.json \
    > ../startup-$v-$r.log 2>&1)
  echo "$v round $r: $(grep -o 'first training step after [0-9.]* s' startup-$v-$r.log | tr '\n' ' ')"
done; done
