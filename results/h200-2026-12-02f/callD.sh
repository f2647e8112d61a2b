# The GPU tests at the new default hw_decoder_load (0.65): the trainers', then the pipelines' of the
# classification pipelines and the decoder
timeout 260 python3 -m pytest -q -rs -p no:cacheprovider --durations=5 test_train_classify.py \
  test_train_segment.py -k "gpu or exif or hardware_decoder or decoder" > $OUT/tests-train.log 2>&1
tail -n 8 $OUT/tests-train.log
timeout 300 python3 -m pytest -q -rs -p no:cacheprovider --durations=5 test_pipelines.py \
  -k "gpu and (classify or decoder or hardware)" > $OUT/tests-pipelines.log 2>&1
tail -n 10 $OUT/tests-pipelines.log
