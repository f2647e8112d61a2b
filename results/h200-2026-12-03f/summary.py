"""One line per run folder: the compile's seconds, the median img/s and mean data wait of the
training lines of epochs 3-4 in its metrics.jsonl (as issue 46 measured), the last epoch's memory
and validation score.

    python3 summary.py RUN_DIR...
"""

import json
import statistics
import sys

for run in sys.argv[1:]:
    try:
        records = [json.loads(line) for line in open(f"{run}/metrics.jsonl")]
    except OSError as e:
        print(json.dumps(dict(run=run, error=str(e))), flush=True)
        continue
    train = [r for r in records if r["type"] == "train" and r["epoch"] in (3, 4) and r["img_s"]]
    epochs = [r for r in records if r["type"] == "epoch"]
    compiled = [r["seconds"] for r in records if r["type"] == "compile"]
    last = epochs[-1] if epochs else {}
    score = {k: round(v, 2) for k, v in last.items() if k in ("val_top1", "val_dice")}
    print(
        json.dumps(
            dict(
                run=run,
                img_s=round(statistics.median(r["img_s"] for r in train)) if train else None,
                data_wait=round(statistics.mean(r["data_wait"] for r in train), 2) if train else None,
                lines=len(train),
                compile_s=round(compiled[0], 1) if compiled else None,
                epochs=len(epochs),
                memory=last.get("memory"),
                **score,
            )
        ),
        flush=True,
    )
