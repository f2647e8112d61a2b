#!/usr/bin/env bash
# Archived probe: ran at commit 9dc1999 against that commit's bench.py and pipelines.py (with this folder's stages.py;
# RESIZE=before is 09a5f6a's resize); kept as a record, not maintained. To rerun: git checkout 9dc1999.
# A/B on one machine: resize_with_torch before (09a5f6a) and after the GIL change, 16 threads, in turn, twice.
export PYTHONPATH=/tmp/site:$PWD/.gpu-extra PYTHONUNBUFFERED=1
D=results/h200-2026-11-29f
python3 -c "import sys; sys.path.insert(0, '.'); import bench; a = bench.parse_args([]); a.workers = 16; print(bench.jpeg_set(a))" > /dev/null 2>&1
for r in 1 2; do for v in before after; do RESIZE=$v timeout 60 python3 $D/stages.py 16 decode+torch_resize full loader; done; done > $OUT/ab.log 2>&1
cat $OUT/ab.log
