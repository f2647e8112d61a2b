#!/bin/bash
# ab.sh CODE_DIR -> seconds from start to the first training step's line of a resume
cd $1
export XDG_CACHE_HOME=/tmp/h71/xdg
R=/tmp/h70/cache/bench-startup/n1281167-from-1000
start=$(date +%s.%N)
/work/main/.venv/bin/python train_classify.py --data $R --arch resnet18 -b 64 -j 2 --epochs 1 --print-freq 1 --dali-device cpu --output-dir /tmp/h71/run0 --resume auto > /tmp/h71/ab.log 2>&1 &
pid=$!
while ! grep -q "train: epoch 1" /tmp/h71/ab.log; do sleep 0.05; if ! kill -0 $pid 2>/dev/null; then break; fi; done
t=$(echo "$(date +%s.%N) - $start" | bc)
s=$(grep -m1 "^start:" /tmp/h71/ab.log >/dev/null && echo ok)
kill -9 $pid; wait $pid 2>/dev/null
echo "$(basename $1) $t"
