# Issue 46, item 2 (ResNet-18): sweep.py with the training stream at the trainer's high priority,
# then at normal priority (h200-2026-12-03e's noprio.py, with CUDA graphs as a second mode); then
# the 256-px shards for callC (make_shards.py --max-size 256). Lines stay in /tmp for callB.
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
D=results/h200-2026-12-03g
VARIANTS=default,linear,hw1.0,hw1.0-linear,fp16-out,cache,cache-linear,cache-fp16 \
PROFILE=default,linear,hw1.0-linear \
  timeout 250 python3 $D/sweep.py /tmp/jpegs --arch resnet18 > /tmp/A-hi.log 2>&1
grep '^{' /tmp/A-hi.log > /tmp/A-sweep-hi.jsonl; cp /tmp/A-sweep-hi.jsonl $OUT/
grep -E '^[A-Za-z]*Error' /tmp/A-hi.log | tail -3
VARIANTS=default,linear,hw1.0,hw1.0-linear RO_VARIANTS=default,hw1.0,hw1.0-linear \
PROFILE=default,hw1.0 \
  timeout 250 python3 results/h200-2026-12-03e/noprio.py $D/sweep.py /tmp/jpegs --arch resnet18 \
  --modes default,reduce-overhead > /tmp/A-np.log 2>&1
grep '^{' /tmp/A-np.log > /tmp/A-sweep-np.jsonl; cp /tmp/A-sweep-np.jsonl $OUT/
grep -E '^[A-Za-z]*Error' /tmp/A-np.log | tail -3
timeout 60 python3 make_shards.py /tmp/jpegs /tmp/wds256 --format wds --max-size 256 --workers 16 \
  > /tmp/A-shards.log 2>&1; tail -n 2 /tmp/A-shards.log
grep -h '"share"\|kernels\|built' /tmp/A-sweep-*.jsonl | cut -c1-330
