# The GPU tests after issue 45's reshaping (pipelines' graphs built once, one resume check of the
# graph record, helpers moved): every test with a GPU case in the pipelines, data sources, predict
# and ddp modules, then the trainers', then the s3:// ones with boto3 and moto from wheels carried
# in .wheels. From the project root, DALI in /tmp/site (shared/device/README.md).
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > $OUT/gpu.txt
nproc >> $OUT/gpu.txt; git log -1 --format=%H >> $OUT/gpu.txt 2>/dev/null
python3 -m pip install -q --no-index --find-links .wheels --target /tmp/s3site boto3 moto flask \
  flask_cors > $OUT/pip.log 2>&1
timeout 200 python3 -m pytest -q -rs -p no:cacheprovider --durations=5 \
  -k "(gpu or exif or hardware_decoder or decoder) and not test_bench and not test_train_" \
  > $OUT/tests.log 2>&1
timeout 220 python3 -m pytest -q -rs -p no:cacheprovider --durations=5 test_train_classify.py \
  test_train_segment.py -k "gpu or exif or hardware_decoder or decoder" > $OUT/tests-train.log 2>&1
PYTHONPATH=/tmp/site:/tmp/s3site timeout 100 python3 -m pytest -q -rs -p no:cacheprovider \
  test_s3.py -k "gpu or decoder or replaced or digest or readable or holding" > $OUT/s3.log 2>&1
tail -n 4 $OUT/tests.log $OUT/tests-train.log $OUT/s3.log
