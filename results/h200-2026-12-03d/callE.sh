# What the device time left allowed after callD was refused for capacity: issue 48's bad-file
# checks on the GPU (one run each), then the trainers' GPU tests, now that a GPU run compiles its
# model by default (issue 46).
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
RUNS=1 timeout 50 bash results/h200-2026-12-03b/badfile.sh 2>&1 | tail -n 2
timeout 175 python3 -m pytest -q -rs -p no:cacheprovider --durations=6 test_train_classify.py \
  test_train_segment.py -k "gpu" > $OUT/tests.log 2>&1
tail -n 10 $OUT/tests.log
