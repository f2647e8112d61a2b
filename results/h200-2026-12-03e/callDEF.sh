# What the device time left after callC allowed, each one call of the `run` tool: feedcost.py for
# ResNet-18 without the cache, with every JPEG on the hardware decoder (callD); with the training
# stream at normal priority, at the default share and at 1.0 (callE); with prefetch_queue_depth 4
# (callF, after two tries that failed at once: an import path, then an argument read too late).
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
D=results/h200-2026-12-03e
F="classify /tmp/jpegs --arch resnet18 -b 256 --decoder-cache off"
timeout 130 python3 $D/feedcost.py $F --hw-decoder-load 1.0 2>&1 | grep '^{' > $OUT/D-feedcost.jsonl
for h in 0.65 1.0; do
  timeout 70 python3 $D/noprio.py $D/feedcost.py $F --hw-decoder-load $h 2>&1 | grep '^{' >> $OUT/E-noprio.jsonl
done
PYTHONPATH=/tmp/site:. timeout 60 python3 $D/depth.py 4 $D/feedcost.py $F 2>&1 | grep -E '^\{|Error' > $OUT/F-depth4.jsonl
