#!/usr/bin/env bash
# Archived probe: ran at commit 09a5f6a (bench.py and pipelines.py as at 9e73d43; the trainers and tests with the fixes
# of b92cfa2, 2efa5a4 and ab83c8b) against that commit's files; kept as a record, not maintained.
# To rerun: git checkout 09a5f6a.
# the GPU-side tests after the fixes (test_pipelines.py -k gpu, the trainers' GPU demo tests, test_ddp.py with the
# GPU visible, the resume test), then the OMP probe, as is and with OMP_NUM_THREADS=1
export PYTHONPATH=/tmp/site:$PWD/.gpu-extra PYTHONUNBUFFERED=1
timeout 200 python3 -m pytest -q -rs -p no:cacheprovider test_pipelines.py test_train_classify.py test_train_segment.py test_ddp.py -k "gpu or ddp or processes or resume_after" 2>&1 | tail -15 > $OUT/pytest_gpu.log
cat $OUT/pytest_gpu.log
timeout 120 python3 results/h200-2026-11-29e/omp.py > $OUT/omp.log 2>&1
OMP_NUM_THREADS=1 timeout 90 python3 results/h200-2026-11-29e/omp.py >> $OUT/omp.log 2>&1
cat $OUT/omp.log
