# The GPU tests at the default hw_decoder_load 0.35: every test with a GPU case, bench.py's GPU
# sections (test_bench.py), and the s3:// tests with boto3 and moto from wheels carried in .wheels
python3 -m pip install -q --no-index --find-links .wheels --target /tmp/s3site boto3 moto flask \
  flask_cors > $OUT/pip.log 2>&1
timeout 480 python3 -m pytest -q -rs -p no:cacheprovider --durations=10 \
  -k "gpu or exif or hardware_decoder or test_bench" > $OUT/tests.log 2>&1
PYTHONPATH=/tmp/site:/tmp/s3site timeout 90 python3 -m pytest -q -rs -p no:cacheprovider test_s3.py \
  -k "gpu or decoder_cache or replaced or digest or readable or holding" > $OUT/s3.log 2>&1
tail -n 15 $OUT/tests.log; tail -n 5 $OUT/s3.log
