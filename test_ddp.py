"""train_classify.py under torchrun with two CPU processes (gloo, DALI CPU-only): the two ranks
together see every training and validation image exactly once per epoch, and report identical
all-reduced metrics."""

import json
import os
import subprocess
import sys

import numpy as np
from PIL import Image

HERE = os.path.dirname(os.path.abspath(__file__))
N_TRAIN, N_VAL = 17, 9  # odd: one shard is a sample short, and its last batch is empty

# Runs train_classify.main unchanged; records which images each rank's batches held (every image is
# one solid colour, so a crop of it still says which it was) and what evaluate() returned.
SPY = """
import json, os, sys
sys.path.insert(0, {here!r})
import numpy as np
import torch
import train_classify, training
from pipelines import IMAGENET_MEAN, IMAGENET_STD

seen, results = [], []
dali_batches, evaluate = train_classify.dali_batches, train_classify.evaluate
mean, std = torch.tensor(IMAGENET_MEAN)[:, None, None], torch.tensor(IMAGENET_STD)[:, None, None]

def spy_batches(loader, device, files):
    split = "train" if os.sep + "train" + os.sep in files[0] else "val"
    ids = []
    seen.append((split, ids))
    for images, labels in dali_batches(loader, device, files):
        ids += [int(round(float((im * std + mean)[0].mean()))) for im in images.float()]
        yield images, labels

def spy_evaluate(*args):
    results.append(evaluate(*args))
    return results[-1]

train_classify.dali_batches, train_classify.evaluate = spy_batches, spy_evaluate
try:
    training.run(train_classify.main, train_classify.get_args_parser())
finally:
    with open(os.path.join({out!r}, f"rank{{os.environ['RANK']}}.json"), "w") as f:
        json.dump({{"seen": seen, "evaluate": results}}, f)
"""


def test_two_processes_cover_every_sample_once_and_agree(tmp_path):
    for split, n in (("train", N_TRAIN), ("val", N_VAL)):
        for i in range(n):
            os.makedirs(tmp_path / "data" / split / f"c{i % 2}", exist_ok=True)
            # red channel = 10 * (i + 1): the image's id, readable after crop, resize and flip
            Image.fromarray(np.full((64, 80, 3), (10 * (i + 1), 90, 160), np.uint8)).save(
                tmp_path / "data" / split / f"c{i % 2}" / f"{i}.png")
    spy = tmp_path / "spy.py"
    spy.write_text(SPY.format(here=HERE, out=str(tmp_path)))
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_port=29517", str(spy),
         "--data", str(tmp_path / "data"), "--arch", "resnet18", "--crop-size", "64", "--val-resize-size", "64",
         "--batch-size", "4", "--epochs", "2", "--workers", "1", "--dali-device", "cpu", "--print-freq", "1",
         "--output-dir", str(tmp_path / "out")],
        cwd=HERE, capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]

    # epochs 1 and 2 each run one train and one val pass on every rank
    assert [s for s, _ in ranks[0]["seen"]] == [s for s, _ in ranks[1]["seen"]] == ["train", "val"] * 2
    for k, (split, _) in enumerate(ranks[0]["seen"]):
        ids = [ranks[0]["seen"][k][1], ranks[1]["seen"][k][1]]
        n = N_TRAIN if split == "train" else N_VAL
        assert not set(ids[0]) & set(ids[1]), (split, ids)
        if split == "train":  # full batches: each rank's 8 or 9 samples filled up with its own repeats
            assert len(ids[0]) == len(ids[1]) == 12, ids
            assert sorted(set(ids[0]) | set(ids[1])) == [10 * (i + 1) for i in range(n)], ids
        else:
            assert sorted(ids[0] + ids[1]) == [10 * (i + 1) for i in range(n)], (split, ids)

    # the all-reduced validation metrics are the same on both ranks, and match rank 0's log
    assert ranks[0]["evaluate"] == ranks[1]["evaluate"]
    with open(tmp_path / "out" / "metrics.jsonl") as f:
        epochs = [r for r in map(json.loads, f) if r["type"] == "epoch"]
    assert [[e["val_top1"], e["val_top5"]] for e in epochs] == ranks[0]["evaluate"]
    assert not os.path.exists(tmp_path / "out" / "rank1")  # only rank 0 writes
