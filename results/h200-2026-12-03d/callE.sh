# What the device time left allowed after callD was refused for capacity: issue 48's bad-file
# checks on the GPU (one run each), then the classification demo on the GPU, now compiled by
# default (issue 46), with and without the decoder cache.
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
RUNS=1 timeout 45 bash results/h200-2026-12-03b/badfile.sh 2>&1 | tail -n 2
timeout 110 python3 -m pytest -q -rs -p no:cacheprovider --durations=6 test_train_classify.py \
  -k "test_demo_learns_on_the_gpu or compile_is_on_where" > $OUT/tests.log 2>&1
tail -n 10 $OUT/tests.log
