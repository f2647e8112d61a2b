#!/usr/bin/env bash
# Archived probe: ran at commit 2231382 against that commit's bench.py and pipelines.py (with this folder's conc.py);
# kept as a record, not maintained. To rerun: git checkout 2231382.
# CPU-only pipelines on 16 cores: operator concurrency and thread pool
export PYTHONPATH=/tmp/site:$PWD/.gpu-extra PYTHONUNBUFFERED=1
python3 -c "
import sys; sys.path.insert(0, '.'); import bench
a = bench.parse_args('--workers 16 --seg-samples 1024'.split()); a.gpu = True
print('SETS', bench.jpeg_set(a)[0], bench.seg_set(a)[0][0])" 2>/dev/null | grep ^SETS > /tmp/sets.txt
JPEGS=$(cut -d" " -f2 /tmp/sets.txt); SEG=$(dirname $(dirname $(dirname $(cut -d" " -f3 /tmp/sets.txt))))
echo "$JPEGS $SEG" > $OUT/conc.log
for ntp in 0 1; do DALI_USE_NEW_THREAD_POOL=$ntp timeout 280 python3 results/h200-2026-11-29d/conc.py 16 $SEG $JPEGS 5 2>&1 | grep -v "Forced\|^$" >> $OUT/conc.log; done
cat $OUT/conc.log
