#!/usr/bin/env bash
# Archived probe: ran at commit dc4b6e1 against that commit's bench.py, pipelines.py and test_bench.py (with this
# folder's probes); kept as a record, not maintained. To rerun: git checkout dc4b6e1.
# third call: the noise's chunk size at 16 threads; the CPU-only segmentation ratio three times; the mixed-decode
# loader beside a training process; test_bench.py on the GPU
export PYTHONPATH=/tmp/site:$PWD/.gpu-extra PYTHONUNBUFFERED=1
python3 -c "import bench; a = bench.parse_args(['--seg-samples', '1024', '--workers', '16']); bench.seg_set(a)" > /dev/null
timeout 90 python3 results/h200-2026-11-29c/noise_pool.py .cache/bench-seg/n1024-512px 16 > $OUT/noise_pool.log 2>&1
timeout 150 python3 results/h200-2026-11-29c/probe.py seg-ratio > $OUT/seg_ratio.log 2>&1
cat $OUT/noise_pool.log; grep "img/s" $OUT/seg_ratio.log
timeout 120 python3 results/h200-2026-11-29c/contention.py > $OUT/contention.log 2>&1; grep 'img/s' $OUT/contention.log
timeout 300 python3 -m pytest -q test_bench.py > $OUT/pytest_bench_gpu.log 2>&1; tail -3 $OUT/pytest_bench_gpu.log
