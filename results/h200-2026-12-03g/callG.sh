# A second lease: split.py's decode (the hardware decoder and DALI's CPU threads, nothing on the
# CUDA cores) fed to the compiled ResNet-18 in sweep.py, then the trainer with --loader synthetic
# and with the sweep's best variant without the cache (callB.sh's run()).
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
D=results/h200-2026-12-03g
VARIANTS=default,split0.3,split0.4,split0.5,split0.4-j14,split0.5-j14 PROFILE=split0.4 \
  timeout 220 python3 $D/sweep.py /tmp/jpegs --arch resnet18 > /tmp/G-sweep.log 2>&1
grep '^{' /tmp/G-sweep.log > $OUT/G-sweep.jsonl
grep -E '^[A-Za-z]*Error' /tmp/G-sweep.log | tail -3
grep -h '"share"\|kernels' $OUT/G-sweep.jsonl | cut -c1-330
export ONLY_C=1
source $D/callB.sh
OUTFILE=$OUT/G-summary.jsonl
run synthetic5 "" "" --data /tmp/jpegs --loader synthetic
IFS='|' read -r e f s <<< "$(python3 $D/pick.py $OUT/G-sweep.jsonl off)"
run off-split "$e" "" --data /tmp/jpegs --decoder-cache off $f
grep -h "split.py" /tmp/T/r18-off-split.log | head -1
