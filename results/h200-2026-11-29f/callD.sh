#!/usr/bin/env bash
# Archived probe: ran at commit 9dc1999 against that commit's bench.py and pipelines.py (with this folder's
# stages.py); kept as a record, not maintained. To rerun: git checkout 9dc1999.
# Where the 16 cores go in the CPU-only classification pipeline: the stage probe at 16 threads with page faults and
# user/sys CPU time per image, as is, with glibc's malloc kept from returning memory to the kernel, with torch's
# intra-op threads off, and with DALI's new thread pool.
export PYTHONPATH=/tmp/site:$PWD/.gpu-extra PYTHONUNBUFFERED=1
D=results/h200-2026-11-29f
ldconfig -p | grep -i -E "jemalloc|tcmalloc" > $OUT/allocators.txt 2>&1  # (came back empty: neither is installed)
python3 -c "import sys; sys.path.insert(0, '.'); import bench; a = bench.parse_args([]); a.workers = 16; print(bench.jpeg_set(a))" > /dev/null 2>&1
{
echo "== as is"; timeout 80 python3 $D/stages.py 16 decode decode+torch_resize decode+dali_resize full loader
echo "== GLIBC_TUNABLES trim/mmap thresholds at their maximum"
GLIBC_TUNABLES=glibc.malloc.trim_threshold=4294967295:glibc.malloc.mmap_threshold=33554432 timeout 80 python3 $D/stages.py 16 decode decode+torch_resize full loader
echo "== OMP_NUM_THREADS=1"; OMP_NUM_THREADS=1 timeout 60 python3 $D/stages.py 16 decode+torch_resize full loader
echo "== DALI_USE_NEW_THREAD_POOL=1"; DALI_USE_NEW_THREAD_POOL=1 timeout 60 python3 $D/stages.py 16 decode+torch_resize full loader
} > $OUT/stages-cpu.log 2>&1
cat $OUT/allocators.txt $OUT/stages-cpu.log
