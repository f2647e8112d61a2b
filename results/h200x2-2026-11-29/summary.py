"""One line per run folder: steady-state training img/s and data wait from its metrics.jsonl (every logged
window of epochs 2 and later except each epoch's first), and the last epoch's validation figure."""

import json
import sys

for run in sys.argv[1:]:
    try:
        rows = [json.loads(line) for line in open(f"{run}/metrics.jsonl")]
    except OSError as e:
        print(f"{run}  FAILED ({e.strerror})")
        continue
    train = [r for r in rows if r["type"] == "train"]
    first = {}
    for r in train:
        first.setdefault(r["epoch"], r["step"])
    w = [r for r in train if r["epoch"] >= 2 and r["step"] != first[r["epoch"]]]
    epochs = [r for r in rows if r["type"] == "epoch"]
    if not w:
        print(f"{run}  FAILED (no steady-state windows)")
        continue
    val = epochs[-1].get("val_top1", epochs[-1].get("val_dice")) if epochs else float("nan")
    print(f"{run.rstrip('/').split('/')[-1]:<28} img/s {sum(r['img_s'] for r in w) / len(w):8.0f}  "
          f"data-wait {sum(r['data_wait'] for r in w) / len(w):4.1f}% ({min(r['data_wait'] for r in w):.1f}-"
          f"{max(r['data_wait'] for r in w):.1f})  windows {len(w)}  last val {val:.2f}", flush=True)
