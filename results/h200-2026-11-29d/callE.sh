#!/usr/bin/env bash
# Archived probe: ran at commit 465e2ed against that commit's bench.py, pipelines.py and test_pipelines.py; kept as a
# record, not maintained. To rerun: git checkout 465e2ed.
# bench.py with the GPU hidden (CPU-only DALI against the DataLoader, 16 workers, batches to the CPU): DALI's default
# thread pool, then DALI_USE_NEW_THREAD_POOL=1 (CPU-only pipelines run independent operators at once); GPU tests
export PYTHONPATH=/tmp/site:$PWD/.gpu-extra PYTHONUNBUFFERED=1
B="bench.py --workers 16 --iters 150 --max-seconds 10 --seg-samples 1024"
CUDA_VISIBLE_DEVICES= timeout 230 python3 $B --json $OUT/bench-cpu.json > $OUT/bench-cpu.log 2>&1; echo "rc $?" >> $OUT/bench-cpu.log
CUDA_VISIBLE_DEVICES= DALI_USE_NEW_THREAD_POOL=1 timeout 230 python3 $B --json $OUT/bench-cpu-newpool.json > $OUT/bench-cpu-newpool.log 2>&1; echo "rc $?" >> $OUT/bench-cpu-newpool.log
timeout 70 python3 -m pytest -q test_pipelines.py -k gpu 2>&1 | tail -2 | tee $OUT/pytest_gpu.log
for f in bench-cpu bench-cpu-newpool; do grep -A30 "^date" $OUT/$f.log | grep -v "^$"; tail -1 $OUT/$f.log; done
