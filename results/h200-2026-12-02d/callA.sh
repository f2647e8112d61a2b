# The GPU tests at bc7d9e0: every test with a GPU case in the pipelines, data sources and other modules
# (--decoder cpu's among them), then the s3:// tests with boto3 and moto from wheels carried in .wheels
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > $OUT/gpu.txt
nproc >> $OUT/gpu.txt
python3 -m pip install -q --no-index --find-links .wheels --target /tmp/s3site boto3 moto flask \
  flask_cors > $OUT/pip.log 2>&1
timeout 330 python3 -m pytest -q -rs -p no:cacheprovider --durations=8 \
  -k "(gpu or exif or hardware_decoder or decoder) and not test_bench and not test_train_" \
  > $OUT/tests.log 2>&1
PYTHONPATH=/tmp/site:/tmp/s3site timeout 90 python3 -m pytest -q -rs -p no:cacheprovider test_s3.py \
  -k "gpu or decoder or replaced or digest or readable or holding" > $OUT/s3.log 2>&1
tail -n 25 $OUT/tests.log; tail -n 5 $OUT/s3.log
