# The two calls after callC, typed in the `run` tool as one line each (here as they ran, one
# command a line). callE: ResNet-18 with a float16 output and 12 threads, and with the decoder
# cache and a float16 output; then callD.sh. callF: ResNet-18 with a float16 output (8 threads)
# and at the defaults again, ResNet-50 with --decoder cpu at the default 8 threads; then the
# segmentation GPU demo test, which had failed in callD, once more.
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
D=results/h200-2026-12-03f
# callE
for v in "off-fp16-j12|--decoder-cache off -j 12" "on-fp16|--decoder-cache on"; do
  n=r18-${v%%|*}
  DTYPE=float16 timeout 120 python3 $D/patch.py train_classify.py --data /tmp/jpegs --arch resnet18 \
    -b 256 --amp bf16 --channels-last --epochs 4 ${v#*|} --output-dir /tmp/T/$n > /tmp/T/$n.log 2>&1
  python3 $D/summary.py /tmp/T/$n | sed "s/^{/{\"flags\": \"DTYPE=float16 ${v#*|}\", /" | tee -a $OUT/E-summary.jsonl
done
bash $D/callD.sh
# callF
for v in "resnet18|off-fp16|DTYPE=float16|--decoder-cache off" "resnet18|off2||--decoder-cache off" \
    "resnet50|off-cpu-j8||--decoder-cache off --decoder cpu"; do
  IFS='|' read a n e f <<< "$v"
  n=$a-$n
  env $e timeout 100 python3 $D/patch.py train_classify.py --data /tmp/jpegs --arch $a -b 256 \
    --amp bf16 --channels-last --epochs 4 $f --output-dir /tmp/T/$n > /tmp/T/$n.log 2>&1
  python3 $D/summary.py /tmp/T/$n | sed "s/^{/{\"flags\": \"$e $f\", /" | tee -a $OUT/F-summary.jsonl
done
timeout 100 python3 -m pytest -q -p no:cacheprovider test_train_segment.py -k test_demo_learns_on_the_gpu 2>&1 | tail -4
