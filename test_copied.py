"""A trainer copied into an empty folder with the five files README.md's copy list names
(pipelines.py, data_sources.py, training.py, flags.py, outputs.py) trains a fresh run on the CPU:
resume.py, predict.py and data_processing.py are imported only where --resume, --evaluate,
--predict or --data demo need them, and asked for there, a missing one is named in one line."""

import csv
import json
import os
import shutil
import subprocess
import sys

import numpy as np
from PIL import Image

HERE = os.path.dirname(os.path.abspath(__file__))
FIVE = ("pipelines.py", "data_sources.py", "training.py", "flags.py", "outputs.py")
OPTIONAL = ("resume.py", "predict.py", "data_processing.py")
# no GPU, and no path back to this folder: the copy imports only what lies beside it
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"CUDA_VISIBLE_DEVICES": ""}
ONE_CPU_EPOCH = ("--epochs", "1", "-b", "4", "--dali-device", "cpu", "--device", "cpu", "-j", "1")


def copy_with_five_files(folder, trainer):
    os.makedirs(folder)
    for name in (trainer, *FIVE):
        shutil.copy(os.path.join(HERE, name), folder)
    return folder


def run(folder, trainer, *flags):
    return subprocess.run(
        [sys.executable, trainer, *flags],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=600,
        env=ENV,
    )


def epoch_record(output_dir):
    with open(os.path.join(output_dir, "metrics.jsonl")) as f:
        (record,) = [r for r in map(json.loads, f) if r["type"] == "epoch"]
    return record


def test_train_classify_copied_with_five_files_trains(tmp_path):
    folder = copy_with_five_files(str(tmp_path / "copy"), "train_classify.py")
    data = str(tmp_path / "data")
    rng = np.random.default_rng(0)
    for split, count in (("train", 4), ("val", 2)):  # an ImageFolder tree of small JPEGs
        for label in ("a", "b"):
            os.makedirs(os.path.join(data, split, label))
            for k in range(count):
                pixels = rng.integers(0, 256, (40, 40, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(os.path.join(data, split, label, f"{k}.jpg"))
    out = str(tmp_path / "out")
    sizes = ("-a", "resnet18", "--train-crop-size", "32", "--val-crop-size", "32")
    flags = ("--data", data, *ONE_CPU_EPOCH, *sizes, "--val-resize-size", "36")
    proc = run(folder, "train_classify.py", *flags, "--output-dir", out)
    assert proc.returncode == 0, proc.stderr
    record = epoch_record(out)
    assert 0 <= record["val_top1"] <= 100
    assert not set(OPTIONAL) & set(os.listdir(folder))
    # --evaluate needs resume.py: one line names it
    checkpoint = os.path.join(out, "checkpoint.pth")
    proc = run(folder, "train_classify.py", *flags, "--resume", checkpoint, "--evaluate")
    assert (proc.returncode, proc.stderr) == (
        2,
        "error: --resume needs resume.py beside train_classify.py (README.md: What to copy)\n",
    )


def test_train_segment_copied_with_five_files_trains(tmp_path):
    folder = copy_with_five_files(str(tmp_path / "copy"), "train_segment.py")
    root = str(tmp_path / "data")  # a prepared root: .npy pairs and csv_file/'s splits
    rng = np.random.default_rng(0)
    rows = {"train": [], "valid": []}
    for sub in ("Images/1", "Masks/1", "csv_file"):
        os.makedirs(os.path.join(root, sub))
    for k in range(12):  # 8 training pairs, 4 validation pairs; binary masks
        image, mask = f"Images/1/{k}.npy", f"Masks/1/{k}.npy"
        np.save(os.path.join(root, image), rng.integers(0, 256, (32, 32, 3), dtype=np.uint8))
        np.save(os.path.join(root, mask), rng.integers(0, 2, (32, 32, 1), dtype=np.uint8))
        rows["train" if k < 8 else "valid"].append([image, mask])
    for split, pairs in rows.items():
        with open(os.path.join(root, "csv_file", f"{split}.csv"), "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["index", "images", "masks"])
            writer.writerows([k, *pair] for k, pair in enumerate(pairs))
    out = str(tmp_path / "out")
    flags = ("--data", root, *ONE_CPU_EPOCH, "--size", "32", "--unet-width", "8")
    proc = run(folder, "train_segment.py", *flags, "--output-dir", out)
    assert proc.returncode == 0, proc.stderr
    record = epoch_record(out)
    assert 0 <= record["val_dice"] <= 100
    assert os.path.isfile(os.path.join(out, "val_epoch001.png"))
    assert not set(OPTIONAL) & set(os.listdir(folder))
    # --predict needs predict.py, resume.py and data_processing.py: one line names them
    checkpoint = os.path.join(out, "checkpoint.pth")
    proc = run(
        folder, "train_segment.py", "--predict", root, "--resume", checkpoint, "--output-dir", out
    )
    assert (proc.returncode, proc.stderr) == (
        2,
        "error: --predict needs predict.py, resume.py, data_processing.py beside "
        "train_segment.py (README.md: What to copy)\n",
    )
