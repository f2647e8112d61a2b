# The GPU tests at the new hw_decoder_load defaults: every test with a GPU case, then bench.py's GPU
# sections (test_bench.py); boto3 and moto from wheels carried in .wheels for the s3:// GPU test
pip install -q --no-index --find-links .wheels boto3 moto > $OUT/pip.log 2>&1
timeout 570 python3 -m pytest -q -rs -p no:cacheprovider --durations=10 \
  -k "gpu or exif or hardware_decoder or test_bench" > $OUT/tests.log 2>&1
tail -n 25 $OUT/tests.log
