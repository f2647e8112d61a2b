"""ResNet-50 in train_classify.py: epochs at a fixed 224 px against --progressive-resize 160 1 3.

Run from the project root on a GPU machine after bench.py has generated its JPEGs:
    python results/h200-2026-12-02a/progressive.py OUT_DIR [auto|off]
The training set is the bench's JPEGs four times over (hard links under new names, 4 x 8,192), the
validation set the JPEGs once. Prints, per run and epoch, the crop size, the median of the log's
img/s windows (the first window of each epoch left out: cuDNN tries its kernels at a new size) and
the epoch's time (training and validation).
"""

import glob
import json
import os
import statistics
import subprocess
import sys

out, cache = sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 else "auto")
src = sorted(glob.glob(".cache/bench-jpegs/n8192-*"))[0]
data = "/tmp/progressive-data"
if not os.path.isdir(data):
    for name in sorted(os.listdir(src)):
        if not os.path.isdir(os.path.join(src, name)):
            continue
        os.makedirs(f"{data}/train/{name}")
        os.symlink(os.path.abspath(os.path.join(src, name)), f"{data}/val_{name}")
        for f in os.listdir(os.path.join(src, name)):
            for k in range(4):
                os.link(os.path.join(src, name, f), f"{data}/train/{name}/{k}_{f}")
    os.makedirs(f"{data}/val")
    for name in os.listdir(data):
        if name.startswith("val_"):
            os.rename(f"{data}/{name}", f"{data}/val/{name[4:]}")
common = "--arch resnet50 --epochs 3 -b 256 --amp bf16 --channels-last --print-freq 16".split()
runs = {"fixed-224": [], "progressive-160-1-3": ["--progressive-resize", "160", "1", "3"]}
for name, extra in runs.items():
    folder = os.path.join(out, f"{name}-cache-{cache}")
    cmd = [sys.executable, "train_classify.py", "--data", data, *common, *extra]
    cmd += ["--decoder-cache", cache, "--output-dir", folder]
    print(" ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    with open(os.path.join(folder, "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f]
    for r in records:
        if r["type"] == "decoder_cache":
            print(f"  {r}")
    for r in (r for r in records if r["type"] == "epoch"):
        windows = [t["img_s"] for t in records if t["type"] == "train" and t["epoch"] == r["epoch"]]
        print(
            f"  {name:<22} epoch {r['epoch']}  crop {r.get('train_crop_size', 224)}  "
            f"median {statistics.median(windows[1:]):,.0f} img/s over {len(windows) - 1} windows  "
            f"epoch {r['epoch_time']:.1f} s  val_top1 {r.get('val_top1', float('nan')):.1f}",
            flush=True,
        )
