# The trainers' GPU tests at this commit (training.pipeline_seed, 1e92ff5, had not run on a GPU),
# then the bad-file checks of issue 48 on the GPU, --predict included (one run).
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
timeout 300 python3 -m pytest -q -rs -p no:cacheprovider --durations=12 test_train_classify.py \
  test_train_segment.py -k gpu > $OUT/D-tests.log 2>&1
tail -n 16 $OUT/D-tests.log
RUNS=1 timeout 60 bash results/h200-2026-12-03b/badfile.sh > /dev/null 2>&1
cat $OUT/badfile.log
