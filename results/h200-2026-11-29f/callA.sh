#!/usr/bin/env bash
# Archived probe: ran at commit 09a5f6a against that commit's bench.py and pipelines.py (with an earlier version of
# this folder's stages.py); kept as a record, not maintained. To rerun: git checkout 09a5f6a.
# Issue 13, CPU-only classification on 16 cores: the stage probe at 2/4/8/16 threads (taskset, cores = threads),
# then py-spy profiles (Python threads, native frames) of the whole pipeline and the loader at 16 threads.
export PYTHONPATH=/tmp/site:$PWD/.gpu-extra PYTHONUNBUFFERED=1
D=results/h200-2026-11-29f
{ nproc; which perf gdb; python3 -c "import torch, nvidia.dali as d; print(torch.__version__, d.__version__)"; } > $OUT/machine.txt 2>&1
python3 -c "import sys; sys.path.insert(0, '.'); import bench; a = bench.parse_args([]); a.workers = 16; print(bench.jpeg_set(a))" > $OUT/data.log 2>&1
for t in 2 4 8 16; do taskset -c 0-$((t-1)) timeout 100 python3 $D/stages.py $t; done > $OUT/stages.log 2>&1
DALI_USE_NEW_THREAD_POOL=1 timeout 60 python3 $D/stages.py 16 decode full loader >> $OUT/stages.log 2>&1
cat $OUT/stages.log
SECONDS_PER=8 timeout 90 .gpu-extra/bin/py-spy record -r 200 --native --threads --idle -f raw -o $OUT/spy_full16.txt -- python3 $D/stages.py 16 full > $OUT/spy.log 2>&1
SECONDS_PER=8 timeout 90 .gpu-extra/bin/py-spy record -r 200 --native --threads --idle -f raw -o $OUT/spy_loader16.txt -- python3 $D/stages.py 16 loader >> $OUT/spy.log 2>&1
tail -4 $OUT/spy.log
for f in full16 loader16; do echo "== $f"; python3 $D/spy_summary.py $OUT/spy_$f.txt 5 | head -60; done > $OUT/spy_summary.txt 2>&1
head -80 $OUT/spy_summary.txt
