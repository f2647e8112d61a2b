# ResNet-18 on the 256-px WebDataset shards callA made (make_shards.py --max-size 256), without
# and with the decoder cache; then the segmentation GPU demo test (six epochs since 68f07b2).
export ONLY_C=1
source results/h200-2026-12-03g/callB.sh  # its run() alone
OUTFILE=$OUT/C-summary.jsonl
run wds256-off "" "" --data /tmp/wds256 --decoder-cache off
run wds256-on "" "" --data /tmp/wds256 --decoder-cache on
timeout 150 python3 -m pytest -q -p no:cacheprovider test_train_segment.py \
  -k test_demo_learns_on_the_gpu > $OUT/C-segtest.log 2>&1
tail -n 4 $OUT/C-segtest.log
