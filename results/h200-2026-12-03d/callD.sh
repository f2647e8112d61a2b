# After issue 46's changes (compiled by default on CUDA, DALI's own decoder paddings, memory in the
# log): ResNet-18 in train_classify.py on bench.py's 8,192 JPEGs as train/ and val/, batch 256, bf16,
# channels_last, no decoder cache, fed by DALI against --loader synthetic; the bad-file checks of
# issue 48 on the GPU; then the GPU tests of the trainers, --predict and the bad-file checks.
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
python3 - <<'PY'
import argparse, os, bench
root, _ = bench.jpeg_set(argparse.Namespace(data=None, cache_dir="/tmp/cache", num_images=8192, workers=16))
os.makedirs("/tmp/jpegs", exist_ok=True)
for split in ("train", "val"):
    if not os.path.exists(f"/tmp/jpegs/{split}"):
        os.symlink(os.path.abspath(root), f"/tmp/jpegs/{split}")
PY
for l in synthetic dali; do
  timeout 100 python3 train_classify.py --data /tmp/jpegs --arch resnet18 -b 256 --amp bf16 \
    --channels-last --epochs 6 --decoder-cache off --loader $l --output-dir /tmp/r18-$l \
    > $OUT/r18-$l.log 2>&1
  cp /tmp/r18-$l/metrics.jsonl $OUT/r18-$l.jsonl
  grep -E "compile|memory|Epoch 6|done in" $OUT/r18-$l.log | cut -c1-200
done
timeout 60 bash results/h200-2026-12-03b/badfile.sh 2>&1 | tail -n 4
cp $OUT/badfile.log $OUT/badfile-2.log 2>/dev/null
timeout 200 python3 -m pytest -q -rs -p no:cacheprovider --durations=8 test_train_classify.py \
  test_train_segment.py test_predict.py -k "gpu or decoder_cache" > $OUT/tests.log 2>&1
tail -n 12 $OUT/tests.log
