# bench.py's GPU tests on their own: callC's 330 s timeout ran out during the second of them, after the
# trainers' nine GPU tests and bench.py's first had passed
timeout 420 python3 -m pytest -v -rs -p no:cacheprovider --durations=5 test_bench.py -k "test_bench or gpu" \
  > $OUT/tests-bench.log 2>&1
tail -n 14 $OUT/tests-bench.log
