"""End-to-end tests of train_classify.py on the CPU: the demo learns, resume and --evaluate pick up
exactly where the run was, the torchvision loader runs, bad input gives one clear line."""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
from PIL import Image

HERE = os.path.dirname(os.path.abspath(__file__))
CHANCE = 100 / 6  # six demo classes


def run(*flags, check=True, timeout=600):
    proc = subprocess.run([sys.executable, os.path.join(HERE, "train_classify.py"), *flags], cwd=HERE,
                          capture_output=True, text=True, timeout=timeout)
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


def records(output_dir, kind):
    with open(os.path.join(output_dir, "metrics.jsonl")) as f:
        return [r for r in map(json.loads, f) if r["type"] == kind]


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("demo"))
    run("--data", "demo", "--epochs", "2", "--print-freq", "5", "--output-dir", out)
    return out


def test_demo_learns(demo_run):
    epochs = records(demo_run, "epoch")
    assert [e["epoch"] for e in epochs] == [1, 2]
    # a pipeline with shuffled labels, wrong normalisation or misaligned crops stays near chance (16.7 %)
    assert epochs[-1]["val_top1"] >= 50, epochs
    assert epochs[-1]["train_loss"] < epochs[0]["train_loss"]
    train = records(demo_run, "train")
    assert {"epoch", "step", "steps", "loss", "lr", "img_s", "data_wait"} <= set(train[0])
    assert all(0 <= r["data_wait"] <= 100 and r["img_s"] > 0 for r in train)
    steps = train[0]["steps"]
    assert steps == -(-6 * 120 // 32)  # 720 training images, batch 32, last batch partial
    assert [r["step"] for r in train if r["epoch"] == 1] == [*range(5, steps, 5), steps]
    ckpt = torch.load(os.path.join(demo_run, "checkpoint.pth"), weights_only=False)
    assert ckpt["epoch"] == 2 and ckpt["args"]["arch"] == "resnet18"
    assert ckpt["classes"] == ["circle", "cross", "ring", "square", "stripes", "triangle"]
    assert not any(k.startswith("module.") for k in ckpt["model"])
    assert os.path.isfile(os.path.join(demo_run, "best.pth"))


def test_evaluate_reproduces_last_logged_accuracy(demo_run, tmp_path):
    run("--data", "demo", "--resume", os.path.join(demo_run, "checkpoint.pth"), "--evaluate",
        "--output-dir", str(tmp_path))
    (evaluation,) = records(str(tmp_path), "eval")
    last = records(demo_run, "epoch")[-1]
    assert evaluation["val_top1"] == pytest.approx(last["val_top1"], abs=1e-9)
    assert evaluation["val_top5"] == pytest.approx(last["val_top5"], abs=1e-9)


def test_resume_after_a_kill_continues_the_schedule(demo_run, tmp_path):
    out = str(tmp_path)
    flags = ["--data", "demo", "--epochs", "2", "--print-freq", "5", "--output-dir", out]
    proc = subprocess.Popen([sys.executable, os.path.join(HERE, "train_classify.py"), *flags], cwd=HERE,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while not (os.path.exists(os.path.join(out, "metrics.jsonl")) and records(out, "epoch")):
        assert proc.poll() is None and time.time() < deadline, "run ended before its first epoch"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)  # pre-empted during epoch 2
    proc.wait()
    assert torch.load(os.path.join(out, "checkpoint.pth"), weights_only=False)["epoch"] == 1

    run(*flags, "--resume", os.path.join(out, "checkpoint.pth"))
    resumed = [r for r in records(out, "train") if r["epoch"] == 2]
    reference = [r for r in records(demo_run, "train") if r["epoch"] == 2]
    assert [r["step"] for r in resumed] == [r["step"] for r in reference]
    assert [r["lr"] for r in resumed] == pytest.approx([r["lr"] for r in reference], rel=1e-12)
    assert [e["epoch"] for e in records(out, "epoch")] == [1, 2]


def test_torch_loader_runs(tmp_path):
    run("--data", "demo", "--loader", "torch", "--epochs", "1", "--workers", "2", "--output-dir", str(tmp_path))
    (epoch,) = records(str(tmp_path), "epoch")
    assert 0 <= epoch["val_top1"] <= 100
    assert records(str(tmp_path), "train")[-1]["steps"] == 23


def tiny_imagefolder(root, corrupt=None):
    for split in ("train", "val"):
        for c in ("a", "b"):
            os.makedirs(os.path.join(root, split, c))
            for i in range(3):
                Image.fromarray(np.full((40, 40, 3), 60 * i, np.uint8)).save(os.path.join(root, split, c, f"{i}.jpg"))
    if corrupt:
        with open(os.path.join(root, corrupt), "wb") as f:
            f.write(b"\xff\xd8\xff\xe0 this is not a JPEG" * 4)
    return root


def assert_one_line_error(proc, *needles):
    assert proc.returncode == 2, proc.stderr
    # DALI's native decoder may log its own line first; ours is the one "error:" line, last, with no traceback
    lines = proc.stderr.strip().splitlines()
    errors = [line for line in lines if line.startswith("error: ")]
    assert errors == lines[-1:] and "Traceback" not in proc.stderr, proc.stderr
    for needle in needles:
        assert needle in errors[0]


def test_error_missing_data(tmp_path):
    proc = run("--data", str(tmp_path / "nope"), check=False)
    assert_one_line_error(proc, str(tmp_path / "nope"), "train/ and val/", "--data demo")


def test_error_data_without_val(tmp_path):
    root = tiny_imagefolder(str(tmp_path / "d"))
    os.rename(os.path.join(root, "val"), os.path.join(root, "validation"))
    assert_one_line_error(run("--data", root, check=False), root, "val/")


def test_error_unknown_arch(tmp_path):
    proc = run("--data", tiny_imagefolder(str(tmp_path / "d")), "--arch", "resnet5O", "--dali-device", "cpu",
               check=False)
    assert_one_line_error(proc, "--arch resnet5O", "resnet50")


def test_error_corrupt_image(tmp_path):
    root = tiny_imagefolder(str(tmp_path / "d"), corrupt=os.path.join("train", "b", "1.jpg"))
    proc = run("--data", root, "--arch", "resnet18", "--crop-size", "32", "--val-resize-size", "36",
               "--batch-size", "4", "--epochs", "1", "--dali-device", "cpu", "--output-dir", str(tmp_path / "o"),
               check=False)
    assert_one_line_error(proc, os.path.join(root, "train", "b", "1.jpg"), "cannot decode")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message where no GPU is visible")
def test_error_gpu_requested_without_cuda(tmp_path):
    proc = run("--data", tiny_imagefolder(str(tmp_path / "d")), "--dali-device", "gpu", check=False)
    assert_one_line_error(proc, "--dali-device gpu", "no CUDA device")
