#!/usr/bin/env bash
# One call of the run tool on the H200, from the project root, once DALI is up: DeepLabV3-MobileNetV3
# compiled with CUDA graphs (--compile-mode reduce-overhead), one run with --loader synthetic and one
# fed by DALI, each then read as share.py reads a run (median img/s of its windows after epoch 1).
set -uo pipefail
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
[ -d /tmp/seg/csv_file ] || python3 data_processing.py /tmp/segpng /tmp/seg --demo \
  --demo-per-group 500 --demo-size 512 | tail -n 1
for loader in synthetic dali; do
  flags=()
  [ $loader = synthetic ] && flags=(--loader synthetic)
  rm -rf /tmp/ro-$loader
  timeout 250 python3 train_segment.py --data /tmp/seg --size 384 -b 32 \
    --arch deeplabv3_mobilenet_v3_large --amp bf16 --channels-last --epochs 12 --print-freq 8 \
    --compile-mode reduce-overhead "${flags[@]}" --output-dir /tmp/ro-$loader >/tmp/ro-$loader.log 2>&1
  echo "$loader: status $?"
  grep -v "^Epoch: \[" /tmp/ro-$loader.log | tail -n 3
  cp /tmp/ro-$loader/metrics.jsonl "$OUT/graphs-$loader.jsonl"
  python3 - /tmp/ro-$loader/metrics.jsonl <<'PY'
import json, statistics, sys
records = [json.loads(line) for line in open(sys.argv[1])]
by_epoch = {}
for r in records:
    if r["type"] == "train" and r["epoch"] > 1 and r.get("img_s"):
        by_epoch.setdefault(r["epoch"], []).append(r["img_s"])
rates = [x for v in by_epoch.values() for x in v]
print("median", round(statistics.median(rates)), "epochs", [round(statistics.median(v)) for v in by_epoch.values()])
PY
done
