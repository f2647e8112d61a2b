# The bad-file checks (badfile.sh), then the trainers' and predict's GPU tests after issue 48's fixes.
bash results/h200-2026-12-03b/badfile.sh
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
timeout 170 python3 -m pytest -q -rs -p no:cacheprovider --durations=5 test_train_classify.py \
  test_train_segment.py -k "gpu or exif or hardware_decoder or decoder" > $OUT/tests-train.log 2>&1
timeout 60 python3 -m pytest -q -rs -p no:cacheprovider test_predict.py test_data_sources.py \
  -k "gpu or not_an_image or undecodable" > $OUT/tests-predict.log 2>&1
tail -n 3 $OUT/tests-train.log $OUT/tests-predict.log
