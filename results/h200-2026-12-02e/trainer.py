"""ResNet-50 in train_classify.py with no decoder cache: the mixed decoder against --decoder cpu,
beside --loader synthetic (one random batch on the GPU, the speed ceiling).

Run from the project root on a GPU machine after bench.py has generated its JPEGs:
    python results/h200-2026-12-02e/trainer.py RUNS_DIR
The training set is the bench's JPEGs four times over (hard links under new names, 4 x 8,192), the
validation set the JPEGs once, as in h200-2026-12-02a/progressive.py. Prints, per run and epoch, the
median of the log's img/s and data-wait windows (the first window of each epoch left out: it holds
the pipeline's first batches and cuDNN's choice of kernels), its share of synthetic's, and val top-1.
"""

import glob
import json
import os
import statistics
import subprocess
import sys

out = sys.argv[1]
src = min(glob.glob(".cache/bench-jpegs/n8192-*"))
data = "/tmp/trainer-data"
if not os.path.isdir(data):
    for name in sorted(os.listdir(src)):
        if not os.path.isdir(os.path.join(src, name)):
            continue
        os.makedirs(f"{data}/train/{name}")
        os.makedirs(f"{data}/val/{name}")
        for f in os.listdir(os.path.join(src, name)):
            os.link(os.path.join(src, name, f), f"{data}/val/{name}/{f}")
            for k in range(4):
                os.link(os.path.join(src, name, f), f"{data}/train/{name}/{k}_{f}")
common = "--arch resnet50 --epochs 2 -b 256 -j 8 --amp bf16 --channels-last --print-freq 16"
common = common.split() + ["--decoder-cache", "off"]
runs = {
    "synthetic": ["--loader", "synthetic"],
    "mixed": ["--decoder", "mixed"],
    "cpu-decode": ["--decoder", "cpu"],
}
ceiling = None
for name, extra in runs.items():
    folder = os.path.join(out, name)
    cmd = [sys.executable, "train_classify.py", "--data", data, *common, *extra]
    cmd += ["--output-dir", folder]
    print(" ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    with open(os.path.join(folder, "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f]
    windows = [r for r in records if r["type"] == "train"]
    first = {}
    for r in windows:
        first.setdefault(r["epoch"], r["step"])
    kept = [r for r in windows if r["step"] != first[r["epoch"]]]
    rate = statistics.median(r["img_s"] for r in kept)
    wait = statistics.median(r["data_wait"] for r in kept)
    ceiling = ceiling or rate
    top1 = [r.get("val_top1") for r in records if r["type"] == "epoch"]
    print(
        f"  {name:<11} median {rate:,.0f} img/s over {len(kept)} windows, data wait {wait:.1f} %, "
        f"{100 * rate / ceiling:.1f} % of synthetic, val top-1 by epoch {top1}",
        flush=True,
    )
