# GPU tests of what changed since the last GPU run: bench.py's GPU sections, the trainer's cache sizes
timeout 560 python3 -m pytest -q -rs test_bench.py "test_train_classify.py::test_demo_learns_on_the_gpu_with_the_decoder_cache" \
  > $OUT/tests.log 2>&1
tail -25 $OUT/tests.log
