"""End-to-end tests of train_classify.py on the CPU (any GPU hidden, so that runs are bit-for-bit repeatable): the
demo learns; resume and --evaluate pick up exactly where the run was; the recipe switches do what torchvision's
reference does; bad input gives one clear line and loses nothing. Where there is a GPU, the demo also learns on
it."""

import argparse
import csv
import fcntl
import hashlib
import json
import math
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import time
import urllib.error
import zlib
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torchvision
from PIL import Image

import predict
import resume
import train_classify
import training
from conftest import DELETE_AT_FIRST_SAVE

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "train_classify.py")
CPU_ENV = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def run(*flags, check=True, cwd=HERE, script=SCRIPT, timeout=600, env=CPU_ENV):
    proc = subprocess.run(
        [sys.executable, script, *flags],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


def records(output_dir, kind):
    with open(os.path.join(output_dir, "metrics.jsonl")) as f:
        return [r for r in map(json.loads, f) if r["type"] == kind]


def assert_one_line_error(proc, *needles):
    assert proc.returncode == 2, proc.stderr
    # DALI's native decoder may log its own line first; ours is the one "error:" line, last, with no traceback
    lines = proc.stderr.strip().splitlines()
    errors = [line for line in lines if line.startswith("error: ")]
    assert errors == lines[-1:] and "Traceback" not in proc.stderr, proc.stderr
    for needle in needles:
        assert needle in errors[0], errors[0]


def started_training(out, *flags):
    """The trainer with ``flags`` and TINY's into ``out``, in the background (its stderr piped),
    once it has logged a training step."""
    proc = subprocess.Popen(
        [sys.executable, SCRIPT, *flags, *TINY, "--output-dir", out],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=CPU_ENV,
        cwd=HERE,
    )
    deadline = time.time() + 300
    while not (os.path.exists(os.path.join(out, "metrics.jsonl")) and records(out, "train")):
        assert proc.poll() is None and time.time() < deadline, proc.stderr.read()
        time.sleep(0.01)
    return proc


def tiny_imagefolder(root, train=("a", "b"), val=("a", "b"), per_class=3, size=(40, 40)):
    """Solid-colour PNGs: image i of class k is (40 k + 10 i, 90, 160), so any crop says which it was."""
    for split, classes in (("train", train), ("val", val)):
        for k, c in enumerate(classes):
            os.makedirs(os.path.join(root, split, c))
            for i in range(per_class):
                Image.new("RGB", size, (40 * k + 10 * i, 90, 160)).save(
                    os.path.join(root, split, c, f"{i}.png")
                )
    return root


TINY = [
    "--arch",
    "resnet18",
    "--train-crop-size",
    "32",
    "--val-crop-size",
    "32",
    "--val-resize-size",
    "36",
    "--batch-size",
    "4",
    "--epochs",
    "1",
    "--workers",
    "1",
    "--dali-device",
    "cpu",
    "--print-freq",
    "1",
]


def tiny_run(root, out, *flags, check=True, env=CPU_ENV):
    return run("--data", root, *TINY, "--output-dir", out, *flags, check=check, env=env)


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("demo"))
    run("--data", "demo", "--epochs", "2", "--print-freq", "5", "--output-dir", out)
    return out


def test_demo_learns(demo_run):
    (start,) = records(demo_run, "start")
    assert (
        start["layout"] == "folder"
        and start["train_samples"] == 720
        and start["val_samples"] == 180
    )
    assert start["classes"] == 6 and start["output_dir"] == demo_run
    epochs = records(demo_run, "epoch")
    assert [e["epoch"] for e in epochs] == [1, 2]
    # a pipeline with shuffled labels, wrong normalisation or misaligned crops stays near chance
    # (16.7 %); the best epoch is asserted, as best.pth keeps it: one point of a short run's curve
    # moves with the machine's floating point
    assert max(e["val_top1"] for e in epochs) >= 50, epochs
    assert epochs[-1]["train_loss"] < epochs[0]["train_loss"]
    train = records(demo_run, "train")
    assert {"epoch", "step", "steps", "loss", "lr", "img_s", "data_wait"} <= set(train[0])
    assert all(0 <= r["data_wait"] <= 100 and r["img_s"] > 0 for r in train)
    steps = train[0]["steps"]
    assert steps == -(
        -6 * 120 // 32
    )  # 720 training images, batch 32: the last batch is filled up, not dropped
    assert [r["step"] for r in train if r["epoch"] == 1] == [*range(5, steps, 5), steps]
    ckpt = torch.load(os.path.join(demo_run, "checkpoint.pth"), weights_only=True)
    assert ckpt["epoch"] == 2 and ckpt["step"] == steps and ckpt["args"]["arch"] == "resnet18"
    assert ckpt["classes"] == ["circle", "cross", "ring", "square", "stripes", "triangle"]
    assert not any(k.startswith("module.") for k in ckpt["model"])
    assert len(ckpt["dali"]) == 1 and ckpt["world_size"] == 1 and ckpt["num_samples"] == 720
    assert os.path.isfile(os.path.join(demo_run, "best.pth"))


@gpu
def test_demo_learns_on_the_gpu(tmp_path):
    out = str(tmp_path)
    run(
        "--data",
        "demo",
        "--epochs",
        "2",
        "--print-freq",
        "5",
        "--amp",
        "bf16",
        "--channels-last",
        "--output-dir",
        out,
        env=os.environ,
    )
    epochs = records(out, "epoch")
    assert [e["epoch"] for e in epochs] == [1, 2]
    best = max(e["val_top1"] for e in epochs)  # the best epoch's, as best.pth keeps it
    assert best >= 50 and epochs[-1]["train_loss"] < epochs[0]["train_loss"], epochs
    ckpt = torch.load(os.path.join(out, "checkpoint.pth"), weights_only=True)
    assert ckpt["args"]["dali_device"] == "gpu" and ckpt["step"] == -(-6 * 120 // 32)


@gpu
@pytest.mark.parametrize("cache", ["on", "1"])
def test_demo_learns_on_the_gpu_with_the_decoder_cache(tmp_path, cache):
    """``on`` caches every decoded image; a size in MB smaller than that caches what fits."""
    out = str(tmp_path)
    proc = run(
        "--data",
        "demo",
        "--epochs",
        "2",
        "--print-freq",
        "5",
        "--amp",
        "bf16",
        "--channels-last",
        "--decoder-cache",
        cache,
        "--output-dir",
        out,
        env=os.environ,
    )
    (decision,) = records(out, "decoder_cache")
    assert decision["mb"] > 1 if cache == "on" else decision["mb"] == 1
    # the demo's train and val images take about 26 MB decoded: 1 MB holds a few percent of them
    state = "on (on)" if cache == "on" else "on, about 4% (1)"
    assert f"decoder cache {state}: " in proc.stdout + proc.stderr
    epochs = records(out, "epoch")
    best = max(e["val_top1"] for e in epochs)  # the best epoch's, as best.pth keeps it
    assert best >= 50 and epochs[-1]["train_loss"] < epochs[0]["train_loss"], epochs
    assert (
        torch.load(os.path.join(out, "checkpoint.pth"), weights_only=True)["decoder_cache"]
        == decision["mb"]
    )


def test_compile_trains_as_eager_and_saves_the_plain_model(tmp_path):
    """--compile (torch.compile, inductor) computes the eager model's loss, up to float rounding, and its checkpoint
    holds the plain model's weights: --evaluate without --compile reproduces the run's accuracy. One step (4 images,
    batch 4): on these one-colour images BatchNorm over 4 samples magnifies rounding, so that the weights after
    it were up to 0.16 % apart and a second step's loss 13 %."""
    root = tiny_imagefolder(str(tmp_path / "data"), per_class=2)
    eager, compiled = str(tmp_path / "eager"), str(tmp_path / "compiled")
    tiny_run(root, eager)
    tiny_run(root, compiled, "--compile")
    assert records(compiled, "config")[0]["args"]["compile"] is True
    eager_loss, compiled_loss = (
        [r["loss"] for r in records(out, "train")] for out in (eager, compiled)
    )
    assert len(compiled_loss) == 1 and compiled_loss == pytest.approx(eager_loss, rel=1e-3)
    plain = torch.load(os.path.join(eager, "checkpoint.pth"), weights_only=True)["model"]
    saved = torch.load(os.path.join(compiled, "checkpoint.pth"), weights_only=True)["model"]
    assert saved.keys() == plain.keys()  # no torch.compile "_orig_mod." prefix
    assert all(saved[k].shape == plain[k].shape and saved[k].dtype == plain[k].dtype for k in plain)
    tiny_run(
        root,
        str(tmp_path / "eval"),
        "--resume",
        os.path.join(compiled, "checkpoint.pth"),
        "--evaluate",
    )
    (evaluation,) = records(str(tmp_path / "eval"), "eval")
    assert evaluation["val_top1"] == records(compiled, "epoch")[-1]["val_top1"]


def test_compile_is_on_where_the_model_is_on_cuda_and_no_compile_turns_it_off(capsys):
    """--compile and --no-compile say it; without either, a GPU run compiles and a CPU run does not
    (a --compile-mode given compiles there too)."""
    assert [parse(*f).compile for f in ([], ["--compile"], ["--no-compile"])] == [None, True, False]
    assert parse().compile_mode is None  # settled by training.setup
    for flags, compiled in (
        ([], False),
        (["--compile"], True),
        (["--compile-mode", "max-autotune"], True),
    ):
        args = train_classify.parse_args(["--data", "x", "--device", "cpu", *flags])
        training.setup(args)
        assert args.compile is compiled, flags
        assert args.compile_mode == ("max-autotune" if "--compile-mode" in flags else "default")
    with pytest.raises(SystemExit) as e:
        train_classify.parse_args(["--data", "x", "--no-compile", "--compile-mode", "default"])
    assert e.value.code == 2 and capsys.readouterr().err == (
        "error: --compile-mode default: sets how the model is compiled, and --no-compile turns "
        "compiling off; pass one of the two\n"
    )


@gpu
def test_a_gpu_run_compiles_by_default():
    args = train_classify.parse_args(["--data", "x"])
    training.setup(args)
    assert args.compile is True


def test_a_resume_on_a_node_with_an_empty_compile_cache_loads_the_runs_compiled_graphs(tmp_path):
    """A compiled run keeps torch.compile's work beside its checkpoint (compile-cache.bin); a
    resume whose node's own cache is empty (a requeue elsewhere: here another
    TORCHINDUCTOR_CACHE_DIR) finds its graphs compiled. A damaged copy is said and not used, and
    the next checkpoint writes a whole one."""
    root = tiny_imagefolder(str(tmp_path / "d"), per_class=4)
    out = str(tmp_path / "run")

    def node(name):  # a node's own compile cache
        return {**CPU_ENV, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / name)}

    tiny_run(root, out, "--compile", "--epochs", "1", env=node("a"))
    saved = os.path.join(out, "compile-cache.bin")
    assert records(out, "compile")[0]["cache_hits"] == 0  # a cold cache: compiled from scratch
    ckpt = os.path.join(out, "checkpoint.pth")
    run("--data", root, "--resume", ckpt, "--compile", "--epochs", "2", env=node("b"))
    assert [(r["path"], r["used"]) for r in records(out, "compile_cache")] == [(saved, True)]
    assert records(out, "compile")[-1]["cache_hits"] >= 1
    with open(saved, "r+b") as f:  # a byte of the artifacts flipped
        f.seek(40)
        byte = f.read(1)
        f.seek(40)
        f.write(bytes([byte[0] ^ 0xFF]))
    proc = run("--data", root, "--resume", ckpt, "--compile", "--epochs", "3", env=node("c"))
    assert f"{saved}: damaged, not used" in proc.stdout
    assert records(out, "compile")[-1]["cache_hits"] == 0
    with open(saved, "rb") as f:  # rewritten whole with the third epoch's checkpoint
        digest, artifacts = f.read(32), f.read()
    assert hashlib.sha256(artifacts).digest() == digest


def test_a_compiled_run_resumes_exactly_and_its_checkpoint_predicts_and_gives_weights(tmp_path):
    """--compile with --model-ema: the compile is a phase of its own in the log, kept out of the
    img/s; killed mid-epoch and resumed, the run ends as the uninterrupted one, its EMA too; its
    checkpoint (the plain model's keys) predicts as the run validated, and starts a run with
    --weights."""
    root = tiny_imagefolder(str(tmp_path / "d"), per_class=12)
    ema = ["--model-ema", "--model-ema-steps", "1", "--model-ema-decay", "0.9"]
    flags = ["--data", root, *TINY, "--print-freq", "2", "--epochs", "2", "--checkpoint-every", "2"]
    assert_resume_is_exact(SCRIPT, [*flags, "--compile", *ema], tmp_path)
    whole, broken = str(tmp_path / "whole"), str(tmp_path / "broken")
    assert records(whole, "config")[0]["compiled"] is True
    (compiled,) = records(whole, "compile")
    assert (compiled["epoch"], compiled["step"], compiled["mode"]) == (1, 1, "default")
    assert compiled["seconds"] > 0
    # the first line's window held the compile's step: its rate is that of the step after it
    rates = [r["img_s"] for r in records(whole, "train")]
    assert rates[0] > 0.5 * min(rates[1:]), rates
    # the resumed process compiled again, at its first step
    (resumed,) = records(broken, "resume")
    steps = [(r["epoch"], r["step"]) for r in records(broken, "compile")]
    assert steps == [(1, 1), (resumed["epoch"], resumed["step"] + 1)]
    a, b = (
        torch.load(os.path.join(out, "checkpoint.pth"), weights_only=True)
        for out in (whole, broken)
    )
    assert a["model_ema"]["n_averaged"] == b["model_ema"]["n_averaged"] == 12
    assert (
        max(
            (a["model_ema"][k].double() - b["model_ema"][k].double()).abs().max().item()
            for k in a["model_ema"]
        )
        <= 1e-6
    )

    predicted = str(tmp_path / "predicted")
    val = os.path.join(root, "val")
    ckpt = os.path.join(whole, "checkpoint.pth")
    run("--predict", val, "--resume", ckpt, "--output-dir", predicted)
    with open(os.path.join(predicted, "predictions.csv"), newline="") as f:
        rows = list(csv.DictReader(f))
    right = sum(row["class1"] == row["path"].split(os.sep)[0] for row in rows)
    assert len(rows) == 24
    assert 100 * right / len(rows) == pytest.approx(
        records(whole, "epoch")[-1]["val_top1"], abs=1e-9
    )
    n = len(a["model"])
    proc = tiny_run(root, str(tmp_path / "weights"), "--weights", ckpt)
    assert f"{n} of the model's {n} tensors loaded" in proc.stdout


def test_each_process_peak_memory_is_logged_every_epoch(tmp_path):
    """Each epoch's record holds each process's peak host memory in bytes (no GPU figures on the
    CPU); its line the largest, in GB. Nothing is logged of memory at start-up."""
    root, out = tiny_imagefolder(str(tmp_path / "d")), str(tmp_path / "o")
    proc = tiny_run(root, out, "--epochs", "2")
    assert records(out, "memory") == [] and proc.stdout.count("host_rss_peak") == 2
    logged = [e["memory"] for e in records(out, "epoch")]
    assert len(logged) == 2
    for (memory,) in logged:  # one process
        assert memory.keys() == {"rank", "host_rss_peak"} and memory["rank"] == 0
        assert type(memory["host_rss_peak"]) is int and 10**8 < memory["host_rss_peak"] < 64 * 10**9
    peaks = [memory["host_rss_peak"] for (memory,) in logged]
    assert peaks[0] <= peaks[1]  # a peak does not fall
    epochs = [line for line in proc.stdout.splitlines() if line.startswith("epoch: ")]
    assert [line.rsplit("  ", 1)[1] for line in epochs] == [
        f"host_rss_peak {peak / 1e9:.1f} GB" for peak in peaks
    ]


def test_evaluate_reproduces_last_logged_accuracy(demo_run, tmp_path):
    run(
        "--data",
        "demo",
        "--resume",
        os.path.join(demo_run, "checkpoint.pth"),
        "--evaluate",
        "--output-dir",
        str(tmp_path),
    )
    (evaluation,) = records(str(tmp_path), "eval")
    last = records(demo_run, "epoch")[-1]
    assert evaluation["val_top1"] == pytest.approx(last["val_top1"], abs=1e-9)
    assert evaluation["val_top5"] == pytest.approx(last["val_top5"], abs=1e-9)


def test_evaluate_takes_the_model_and_validation_sizes_from_the_checkpoint(demo_run, tmp_path):
    """The demo trains resnet18 at 64 px; --evaluate on its folder (not --data demo, whose defaults
    would say so) without --arch or sizes scores the model as its run validated it, and a size
    given on the command line wins."""
    (start,) = records(demo_run, "start")
    best = os.path.join(demo_run, "best.pth")
    proc = run(
        "--data", start["data"], "--resume", best, "--evaluate", "--output-dir", str(tmp_path)
    )
    assert (
        f"--evaluate: --arch resnet18 --val-resize-size 73 --val-crop-size 64, as in {best}"
        in proc.stdout
    )
    (evaluation,) = records(str(tmp_path), "eval")
    assert evaluation["val_top1"] == max(e["val_top1"] for e in records(demo_run, "epoch"))
    proc = run(
        "--data",
        start["data"],
        "--resume",
        best,
        "--evaluate",
        "--val-crop-size",
        "48",
        "--val-resize-size",
        "48",
    )
    assert "--evaluate: --arch resnet18, as in" in proc.stdout


def test_resume_after_a_kill_continues_the_schedule(demo_run, tmp_path):
    out = str(tmp_path)
    flags = ["--data", "demo", "--epochs", "2", "--print-freq", "5", "--output-dir", out]
    proc = subprocess.Popen(
        [sys.executable, SCRIPT, *flags],
        cwd=HERE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=CPU_ENV,
    )
    deadline = time.time() + 300
    while not (os.path.exists(os.path.join(out, "metrics.jsonl")) and records(out, "epoch")):
        assert proc.poll() is None and time.time() < deadline, "run ended before its first epoch"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)  # pre-empted during epoch 2
    proc.wait()
    assert torch.load(os.path.join(out, "checkpoint.pth"), weights_only=True)["epoch"] == 1

    run(*flags, "--resume", os.path.join(out, "checkpoint.pth"))
    resumed = [r for r in records(out, "train") if r["epoch"] == 2]
    reference = [r for r in records(demo_run, "train") if r["epoch"] == 2]
    assert [r["step"] for r in resumed] == [r["step"] for r in reference]
    assert [r["lr"] for r in resumed] == pytest.approx([r["lr"] for r in reference], rel=1e-12)
    assert [e["epoch"] for e in records(out, "epoch")] == [1, 2]
    # the same data in the same order from the same weights: epoch 2 ends where the uninterrupted run did
    assert records(out, "epoch")[-1]["val_top1"] == pytest.approx(
        records(demo_run, "epoch")[-1]["val_top1"], abs=1e-9
    )


def final_weights(out):
    return torch.load(os.path.join(out, "checkpoint.pth"), weights_only=True)["model"]


def kill_after_mid_epoch_checkpoint(cmd, out, epoch=1):
    """Start ``cmd``, SIGKILL it as soon as it has saved a mid-epoch checkpoint in ``epoch``; returns the
    checkpoint the kill left on disk: that one, or a later one if the kill came late."""
    proc = subprocess.Popen(
        cmd, cwd=HERE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=CPU_ENV
    )
    deadline = time.time() + 300
    while True:
        saved = os.path.exists(os.path.join(out, "metrics.jsonl")) and [
            r for r in records(out, "checkpoint") if r["epoch"] == epoch
        ]
        if saved:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            return torch.load(os.path.join(out, "checkpoint.pth"), weights_only=True)
        assert proc.poll() is None, f"run ended before a mid-epoch checkpoint: {proc.stderr.read()}"
        assert time.time() < deadline
        time.sleep(0.01)


def assert_resume_is_exact(script, data_flags, tmp_path, epoch=1):
    """An uninterrupted run and a run killed mid-``epoch`` then resumed end with the same weights."""
    whole, broken = str(tmp_path / "whole"), str(tmp_path / "broken")
    run(*data_flags, "--output-dir", whole, script=script)
    ckpt = kill_after_mid_epoch_checkpoint(
        [sys.executable, script, *data_flags, "--output-dir", broken], broken, epoch
    )
    assert ckpt["epoch"] == epoch and 0 < ckpt["step"] < records(whole, "train")[0]["steps"]
    run(*data_flags, "--resume", os.path.join(broken, "checkpoint.pth"), script=script)
    (resumed,) = records(broken, "resume")
    assert (resumed["epoch"], resumed["step"]) == (ckpt["epoch"], ckpt["step"])
    a, b = final_weights(whole), final_weights(broken)
    assert a.keys() == b.keys()
    assert max((a[k].double() - b[k].double()).abs().max().item() for k in a) <= 1e-6
    # the losses logged after the resume are the uninterrupted run's
    after = [
        (r["epoch"], r["step"], r["loss"]) for r in records(broken, "train") if r["epoch"] > epoch
    ]
    assert after == [
        (r["epoch"], r["step"], r["loss"]) for r in records(whole, "train") if r["epoch"] > epoch
    ]
    # metrics.jsonl holds each step once, as the uninterrupted run logged it, and each epoch's loss over all its steps
    logged = [(r["epoch"], r["step"], r["global_step"]) for r in records(broken, "train")]
    assert logged == [(r["epoch"], r["step"], r["global_step"]) for r in records(whole, "train")]
    assert [e["train_loss"] for e in records(broken, "epoch")] == pytest.approx(
        [e["train_loss"] for e in records(whole, "epoch")], rel=1e-9
    )


def test_mid_epoch_resume_gives_the_uninterrupted_weights(tmp_path):
    root = tiny_imagefolder(str(tmp_path / "d"), per_class=12)
    flags = [
        "--data",
        root,
        *TINY,
        "--epochs",
        "2",
        "--checkpoint-every",
        "2",
        "--mixup-alpha",
        "0.4",
        "--random-erase",
        "0.5",
    ]
    assert_resume_is_exact(SCRIPT, flags, tmp_path)


PROGRESSIVE = ["--progressive-resize", "32", "1", "3", "--train-crop-size", "96"]


def test_progressive_resize_grows_the_training_crop_each_epoch(tmp_path):
    root = tiny_imagefolder(str(tmp_path / "d"), size=(100, 100))
    out = str(tmp_path / "o")
    proc = tiny_run(root, out, *PROGRESSIVE, "--epochs", "4")
    # FFCV's ramp: 32 at epoch 1, 64 half way, 96 from epoch 3
    assert [e["train_crop_size"] for e in records(out, "epoch")] == [32, 64, 96, 96]
    # the progress lines say the crop their steps trained at
    train = records(out, "train")
    assert [(r["epoch"], r["train_crop_size"]) for r in train] == [
        (e, size) for e, size in ((1, 32), (2, 64), (3, 96), (4, 96)) for _ in range(2)
    ]
    lines = [line for line in proc.stdout.splitlines() if line.startswith("train: ")]
    assert [line.split("  ")[-2] for line in lines] == [
        f"train_crop_size {r['train_crop_size']}" for r in train
    ]
    # the pipelines the trainer builds: batches of each epoch's size, validation's always 32
    args = train_classify.parse_args(["--data", root, *TINY, *PROGRESSIVE])
    world = SimpleNamespace(local_rank=0, rank=0, size=1)
    train, val, _ = train_classify.make_pipelines(args, world, None)
    train_it, val_it = (train_classify.classify_iterator(p) for p in (train, val))
    for size in (32, 64, 96, 96):
        assert {b[0]["data"].shape[2:] for b in train_it} == {(size, size)}
        assert {b[0]["data"].shape[2:] for b in val_it} == {(32, 32)}


def test_the_synthetic_loader_follows_the_progressive_sizes(tmp_path):
    args = train_classify.parse_args(["--data", "x", *TINY, *PROGRESSIVE, "--loader", "synthetic"])
    world = SimpleNamespace(device=torch.device("cpu"))
    data = SimpleNamespace(steps=3, classes=["a", "b"])
    for epoch, size in ((1, 32), (2, 64), (3, 96), (4, 96)):
        batches = train_classify.train_batches(args, world, data, epoch, first_step=1)
        assert len(batches) == 2 and batches[0][0].shape == (args.batch_size, 3, size, size)


def test_progressive_resize_resumes_mid_epoch_at_its_size(tmp_path):
    """Killed in epoch 2 (64 pixels), resumed there, then on into epoch 3 (96)."""
    root = tiny_imagefolder(str(tmp_path / "d"), per_class=12, size=(100, 100))
    flags = ["--data", root, *TINY, *PROGRESSIVE, "--epochs", "3", "--checkpoint-every", "2"]
    assert_resume_is_exact(SCRIPT, flags, tmp_path, epoch=2)
    sizes = [e["train_crop_size"] for e in records(str(tmp_path / "broken"), "epoch")]
    assert sizes == [32, 64, 96]


@pytest.mark.parametrize(
    "values,needle",
    [
        (["0", "1", "3"], "must be in [1, 8192], got 0"),
        (["32", "3", "1"], "START_EPOCH 3 is after END_EPOCH 1"),
        (["128", "1", "3"], "MIN_RES 128 is above --train-crop-size 96"),
    ],
)
def test_error_bad_progressive_resize(tmp_path, values, needle):
    proc = tiny_run(
        tiny_imagefolder(str(tmp_path / "d")),
        str(tmp_path / "o"),
        "--train-crop-size",
        "96",
        "--progressive-resize",
        *values,
        check=False,
    )
    assert_one_line_error(proc, "--progressive-resize", needle)


def test_resume_turning_progressive_resize_on_is_refused(tmp_path):
    root, out = tiny_imagefolder(str(tmp_path / "d")), str(tmp_path / "o")
    tiny_run(root, out, "--train-crop-size", "96")  # only --progressive-resize differs
    path = os.path.join(out, "checkpoint.pth")
    proc = tiny_run(root, out, *PROGRESSIVE, "--epochs", "2", "--resume", path, check=False)
    assert_one_line_error(proc, f"--resume {path}: its run had no --progressive-resize")


def test_a_resume_takes_its_runs_flags_and_refuses_other_values_given(tmp_path):
    """A resume is its run continued: --wd, --momentum and --label-smoothing left out are its
    run's, said in one line; given with other values, each is refused in one line and the folder
    stays as it was. A flag that a checkpoint predates was its default in that run."""
    root, out = tiny_imagefolder(str(tmp_path / "d")), str(tmp_path / "o")
    tiny_run(root, out, "--wd", "0.001", "--momentum", "0.8", "--label-smoothing", "0.1")
    path = os.path.join(out, "checkpoint.pth")
    before = folder_bytes(out)
    for flag, value, had in (
        ("--wd", "0.01", "0.001"),
        ("--momentum", "0.5", "0.8"),
        ("--label-smoothing", "0.2", "0.1"),
    ):
        proc = tiny_run(root, out, "--epochs", "2", "--resume", path, flag, value, check=False)
        assert_one_line_error(
            proc,
            f"--resume {path}: its run had {flag} {had}, this command gives {flag} {value}; "
            f"resume with the run's, or --weights it",
        )
        assert folder_bytes(out) == before
    proc = tiny_run(root, out, "--epochs", "2", "--resume", path)
    told = f"--resume: --momentum 0.8 --wd 0.001 --label-smoothing 0.1, as in {path}"
    assert told in proc.stdout.splitlines()
    saved = torch.load(path, weights_only=True)
    assert (saved["args"]["wd"], saved["args"]["momentum"]) == (0.001, 0.8)
    assert saved["args"]["label_smoothing"] == 0.1
    group = saved["optimizer"]["param_groups"][0]
    assert (group["weight_decay"], group["momentum"]) == (0.001, 0.8)
    del saved["args"]["label_smoothing"]  # as a checkpoint written before the flag was
    torch.save(saved, path)
    proc = tiny_run(
        root, out, "--epochs", "3", "--resume", path, "--label-smoothing", "0.1", check=False
    )
    assert_one_line_error(
        proc,
        f"--resume {path}: its run had --label-smoothing 0.0, this command gives "
        "--label-smoothing 0.1",
    )
    tiny_run(root, out, "--epochs", "3", "--resume", path)
    assert records(out, "config")[-1]["args"]["label_smoothing"] == 0.0
    assert [e["epoch"] for e in records(out, "epoch")] == [1, 2, 3]


@pytest.mark.parametrize(
    "first,then,told",
    [
        (
            ["--auto-augment", "ta_wide"],
            ["--auto-augment", "ra"],
            "--auto-augment ta_wide, this command gives --auto-augment ra",
        ),
        (
            [],
            ["--random-erase", "0.25"],
            "--random-erase 0.0, this command gives --random-erase 0.25",
        ),
        (
            ["--decoder", "cpu"],
            ["--decoder", "mixed"],
            "--decoder cpu, this command gives --decoder mixed",
        ),
    ],
)
def test_resume_with_another_pipeline_graph_is_refused(tmp_path, first, then, told):
    # DALI's own error would be a stack trace: the executor does not recognise an operator. A flag
    # left out is its run's: the resume goes on with it.
    root, out = tiny_imagefolder(str(tmp_path / "d")), str(tmp_path / "o")
    tiny_run(root, out, *first)
    path = os.path.join(out, "checkpoint.pth")
    proc = tiny_run(root, out, *then, "--epochs", "2", "--resume", path, check=False)
    assert_one_line_error(proc, f"--resume {path}: its run had {told}; resume with the run's")
    if first:
        proc = tiny_run(root, out, "--epochs", "2", "--resume", path)
        assert f"--resume: {' '.join(first)}, as in {path}" in proc.stdout.splitlines()


@gpu
def test_gpu_checkpoint_resumed_with_dali_on_the_cpu_is_refused_in_one_line(tmp_path):
    # a GPU run's graph holds mixed and GPU operators that a CPU-only pipeline lacks
    root, out = tiny_imagefolder(str(tmp_path / "d")), str(tmp_path / "o")
    tiny_run(root, out, "--device", "cuda", "--dali-device", "gpu", env=os.environ)
    path = os.path.join(out, "checkpoint.pth")
    saved = torch.load(path, weights_only=True)["args"]
    assert (saved["dali_device"], saved["decoder"]) == ("gpu", "mixed")
    flags = ("--device", "cuda", "--dali-device", "cpu", "--epochs", "2", "--resume", path)
    proc = tiny_run(root, out, *flags, check=False, env=os.environ)
    assert_one_line_error(
        proc,
        f"--resume {path}: its run had --dali-device gpu, this command gives --dali-device cpu",
    )


def test_resume_with_another_batch_size_is_refused(demo_run):
    proc = run(
        "--data",
        "demo",
        "--resume",
        os.path.join(demo_run, "checkpoint.pth"),
        "--batch-size",
        "16",
        "--epochs",
        "3",
        check=False,
    )
    assert_one_line_error(proc, "--resume", "batch 32", "1 x 16")


def test_weights_holding_nan_are_refused_naming_the_file_and_tensor(tmp_path):
    """Not trained until the loss is NaN and then blamed on --lr."""
    root = tiny_imagefolder(str(tmp_path / "d"))
    state = torchvision.models.resnet18(num_classes=2).state_dict()
    state["layer1.0.conv1.weight"][0, 0, 0, 0] = float("nan")
    path = str(tmp_path / "nan.pth")
    torch.save(state, path)
    proc = tiny_run(root, str(tmp_path / "o"), "--weights", path, check=False)
    assert_one_line_error(
        proc,
        f"--weights {path}: its layer1.0.conv1.weight holds NaN or infinite values; not weights "
        "to train from",
    )


def test_a_resume_onto_another_number_of_samples_is_said_to_be_other_data(tmp_path):
    """Not blamed on the global batch, which is the run's."""
    root, out = tiny_imagefolder(str(tmp_path / "d")), str(tmp_path / "o")
    tiny_run(root, out)
    os.remove(
        os.path.join(root, "train", "a", sorted(os.listdir(os.path.join(root, "train", "a")))[0])
    )
    path = os.path.join(out, "checkpoint.pth")
    proc = tiny_run(root, out, "--epochs", "2", "--resume", path, check=False)
    n = torch.load(path, weights_only=True)["num_samples"]
    assert_one_line_error(
        proc,
        f"--resume {path}: trained on other data ({n} training samples, --data {root} has "
        f"{n - 1}); resume on that run's data, at any path, or --weights it",
    )


def test_resume_follows_the_data_it_trained_on_not_its_path(tmp_path):
    """The same files moved elsewhere resume; files of other sizes under the same names (as many,
    the same classes) are refused; a checkpoint from before the data was recorded resumes as it
    did."""
    root, out = tiny_imagefolder(str(tmp_path / "d")), str(tmp_path / "o")
    tiny_run(root, out)
    path = os.path.join(out, "checkpoint.pth")
    moved = shutil.move(root, str(tmp_path / "moved"))
    tiny_run(moved, out, "--epochs", "2", "--resume", path)
    assert [e["epoch"] for e in records(out, "epoch")] == [1, 2]
    for k, c in enumerate(("a", "b")):
        for i in range(3):
            Image.new("RGB", (44, 44), (40 * k + 10 * i, 90, 160)).save(
                os.path.join(moved, "train", c, f"{i}.png")
            )
    proc = tiny_run(moved, out, "--epochs", "3", "--resume", path, check=False)
    assert_one_line_error(proc, f"--resume {path}: trained on other data (")
    ckpt = torch.load(path, weights_only=True)
    assert len(ckpt.pop("data_digest")) == 64  # sha256, hex
    torch.save(ckpt, path)
    tiny_run(moved, out, "--epochs", "3", "--resume", path)
    assert [e["epoch"] for e in records(out, "epoch")] == [1, 2, 3]


def folder_bytes(out):
    return {n: open(os.path.join(out, n), "rb").read() for n in sorted(os.listdir(out))}


def test_a_refused_resume_leaves_the_run_folder_as_it_was(tmp_path):
    """best.pth older than checkpoint.pth, resumed with another batch size: refused before
    metrics.jsonl loses the later epochs' records, or anything else in the folder changes."""
    root, out = tiny_imagefolder(str(tmp_path / "d")), str(tmp_path / "o")
    tiny_run(root, out, "--epochs", "2")
    best = os.path.join(out, "best.pth")
    ckpt = torch.load(os.path.join(out, "checkpoint.pth"), weights_only=True)
    ckpt.update(epoch=1, global_step=ckpt["step"])  # as best.pth is when epoch 2 scored lower
    torch.save(ckpt, best)
    before = folder_bytes(out)
    proc = tiny_run(root, out, "--epochs", "2", "--batch-size", "2", "--resume", best, check=False)
    assert_one_line_error(proc, f"--resume {best}: taken with 1 process(es) x batch 4")
    assert folder_bytes(out) == before
    assert [e["epoch"] for e in records(out, "epoch")] == [1, 2]


def test_a_resume_with_more_epochs_takes_up_their_schedule_and_says_what_it_ignores(tmp_path):
    """--epochs 3 after 2: the lr from the checkpoint's step on is a 3-epoch run's, falling to its
    end (the 2-epoch cosine, past its end, would climb); --weights beside --resume and the decoder
    cache of DALI on the CPU are said to be ignored."""
    root = tiny_imagefolder(str(tmp_path / "d"), per_class=6)
    whole, extended = str(tmp_path / "whole"), str(tmp_path / "extended")
    tiny_run(root, whole, "--epochs", "3")
    proc = tiny_run(root, extended, "--epochs", "2", "--decoder-cache", "on")
    assert (
        "decoder cache off (on): DALI runs on the CPU, and its cache holds only what its GPU "
        in (proc.stdout)
    )
    path, weights = os.path.join(extended, "checkpoint.pth"), os.path.join(whole, "best.pth")
    flags = ("--epochs", "3", "--resume", path, "--weights", weights, "--decoder-cache", "on")
    lines = tiny_run(root, extended, *flags).stdout.splitlines()
    assert f"--weights {weights}: not loaded; --resume {path} brings its own weights" in lines
    assert "decoder cache off, as its run had it: --decoder-cache on is not taken at a resume" in (
        lines
    )
    lrs = [r["lr"] for r in records(whole, "train")]  # a step's record: the lr of the next
    steps, was = records(whole, "train")[0]["steps"], records(extended, "train")[-1]["lr"]
    told = (
        f"--resume {path}: --epochs 3 (its run had 2): the lr schedule is this run's, taken up at "
        f"step {2 * steps}: lr {lrs[2 * steps - 1]:.5f}, where its run's was at {was:.5f}"
    )
    assert told in lines
    after = [r["lr"] for r in records(extended, "train") if r["epoch"] == 3]
    assert after == pytest.approx(lrs[2 * steps :], rel=1e-12)
    assert after[0] <= lrs[2 * steps - 1] and after == sorted(after, reverse=True)
    assert after[-1] == pytest.approx(0.0, abs=1e-12)  # --lr-min, at the new end


def test_a_progressive_resize_ramp_that_ends_after_the_run_says_so():
    said = []
    for end in (10, 4):
        args = train_classify.parse_args(
            ["--data", "x", "--epochs", "4", "--progressive-resize", "128", "2", str(end)]
        )
        train_classify.log_unfinished_ramp(args, lambda record, line: said.append((record, line)))
    assert said == [  # the ramp to epoch 4 ends with the run: nothing to say
        (
            {"type": "progressive_resize", "last_crop_size": 160},
            "--progressive-resize: its ramp ends at epoch 10, after this run's last (4): the "
            "training crop grows to 160, not to --train-crop-size 224",
        )
    ]


def test_a_log_edited_by_hand_or_linked_elsewhere_resumes_and_keeps_its_lines(tmp_path):
    """metrics.jsonl as another tool may leave it: records with a step that is not a number, a
    byte that is not UTF-8, a symbolic link to a file elsewhere; a folder in its place is refused
    in one line, as is a mid-epoch checkpoint whose loss sums were edited; the link stays one."""
    root, out = tiny_imagefolder(str(tmp_path / "d")), str(tmp_path / "o")
    tiny_run(root, out)
    path, metrics = os.path.join(out, "checkpoint.pth"), os.path.join(out, "metrics.jsonl")
    elsewhere = str(tmp_path / "elsewhere.jsonl")
    shutil.move(metrics, elsewhere)
    os.mkdir(metrics)
    proc = tiny_run(root, out, "--epochs", "2", "--resume", path, check=False)
    assert_one_line_error(proc, f"{metrics}: is a folder, not the run's log")
    os.rmdir(metrics)
    edited = [
        b'{"type": "note", "epoch": 1, "step": "x", "global_step": "x"}',
        b'{"type": "note", "epoch": 1, "step": null, "global_step": null}',
        b'{"type": "note", "text": "caf\xe9"}',  # Latin-1, not UTF-8
    ]
    with open(elsewhere, "ab") as f:
        f.write(b"\n".join(edited) + b"\n")
    os.symlink(elsewhere, metrics)
    logged = open(elsewhere, "rb").read()
    bad = os.path.join(out, "bad.pth")
    ckpt = torch.load(path, weights_only=True)
    ckpt.update(step=1, loss_sum="x")  # mid-epoch, its loss sums edited
    torch.save(ckpt, bad)
    proc = tiny_run(root, out, "--epochs", "2", "--resume", bad, check=False)
    assert_one_line_error(proc, f"--resume {bad}: its loss_sum is not 1 finite number(s), one a")
    assert open(elsewhere, "rb").read() == logged and os.path.islink(metrics)
    tiny_run(root, out, "--epochs", "2", "--resume", path)
    assert os.path.islink(metrics) and os.path.realpath(metrics) == os.path.realpath(elsewhere)
    lines = open(elsewhere, "rb").read().splitlines()
    assert lines[: len(logged.splitlines())] == logged.splitlines()  # each line as it was
    epochs = [json.loads(line.decode("utf-8", "replace")) for line in lines]
    assert [r["epoch"] for r in epochs if r["type"] == "epoch"] == [1, 2]


@pytest.mark.parametrize("loss_sum", ["x", None, [0.5, 0.5], [math.nan], [True], ["0.5"]])
def test_a_mid_epoch_checkpoint_with_bad_loss_sums_is_refused_in_one_line(loss_sum):
    with pytest.raises(training.UsageError) as refused:
        resume.resumed_loss_sum(
            {"loss_sum": loss_sum}, argparse.Namespace(resume="c.pth"), ONE_CPU_PROCESS
        )
    assert str(refused.value).startswith("--resume c.pth: its loss_sum is not 1 finite number(s)")
    assert resume.resumed_loss_sum({"loss_sum": [0.5]}, None, ONE_CPU_PROCESS) == 0.5
    assert (
        resume.resumed_loss_sum({}, None, ONE_CPU_PROCESS) == 0.0
    )  # a checkpoint older than the sums


# ------------------------------------------------------------------------------------------
# recipe switches
# ------------------------------------------------------------------------------------------


def parse(*flags):
    return train_classify.get_args_parser().parse_args(["--data", "x", *flags])


def test_help_lists_every_recipe_switch_with_its_default():
    text = " ".join(run("--help").stdout.split())  # argparse wraps lines
    for flag in (
        "--opt",
        "--norm-weight-decay",
        "--label-smoothing",
        "--mixup-alpha",
        "--cutmix-alpha",
        "--random-erase",
        "--model-ema",
        "--model-ema-steps",
        "--model-ema-decay",
        "--clip-grad-norm",
        "--sync-bn",
        "--lr-scheduler",
        "--train-crop-size",
        "--val-crop-size",
        "--val-resize-size",
        "--checkpoint-every",
        "--label-offset",
        "--num-classes",
        "--overwrite",
    ):
        assert flag in text
    assert "(default: sgd)" in text and "(default: cosine)" in text and "(default: 0.99998)" in text


@pytest.mark.parametrize(
    "flags",
    [
        ["--mixup-alpha", "0.2"],
        ["--cutmix-alpha", "1.0"],
        ["--mixup-alpha", "0.2", "--cutmix-alpha", "1.0"],
    ],
)
def test_mixup_and_cutmix_give_soft_targets_that_sum_to_one(flags):
    torch.manual_seed(0)
    mix = train_classify.get_mixup_cutmix(parse(*flags), num_classes=5)
    images, labels = torch.rand(8, 3, 16, 16), torch.arange(8) % 5
    mixed, targets = mix(images, labels)
    assert (
        mixed.shape == images.shape and targets.shape == (8, 5) and targets.dtype == torch.float32
    )
    torch.testing.assert_close(targets.sum(1), torch.ones(8))
    assert (targets > 0).sum(1).max() == 2 and (
        targets.max(1).values < 1
    ).all()  # two classes, neither whole
    assert not torch.equal(mixed, images)


def test_norm_weight_decay_puts_norm_layers_and_biases_in_their_own_group():
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3),
        torch.nn.BatchNorm2d(4),
        torch.nn.Flatten(),
        torch.nn.LazyLinear(2),
    )
    model(torch.zeros(1, 3, 5, 5))
    optimizer = training.make_optimizer(
        model, parse("--wd", "0.05", "--norm-weight-decay", "0"), lr=0.1
    )
    decayed, plain = optimizer.param_groups
    assert decayed["weight_decay"] == 0.05 and plain["weight_decay"] == 0
    assert {id(p) for p in decayed["params"]} == {id(model[0].weight), id(model[3].weight)}
    assert {id(p) for p in plain["params"]} == {
        id(model[0].bias),
        id(model[1].weight),
        id(model[1].bias),
        id(model[3].bias),
    }
    adamw = training.make_optimizer(model, parse("--opt", "adamw"), lr=0.1)
    assert isinstance(adamw, torch.optim.AdamW) and len(adamw.param_groups) == 1


def lr_at(flags, steps_per_epoch, at):
    args = parse(*flags)
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.4)
    scheduler = training.make_scheduler(optimizer, args, steps_per_epoch)
    lrs = []
    for step in range(max(at) + 1):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return [lrs[s] for s in at]


def test_schedules_follow_their_formulas():
    # 10 epochs of 10 steps, warm-up 2 epochs from 1 % of the lr
    warm = ["--epochs", "10", "--lr-warmup-epochs", "2"]
    assert lr_at(warm, 10, [0, 10, 20]) == pytest.approx(
        [0.4 * 0.01, 0.4 * (0.01 + 0.99 * 10 / 20), 0.4]
    )
    cosine = lr_at([*warm, "--lr-min", "0.04"], 10, [20, 60, 99])
    assert cosine == pytest.approx(
        [
            0.4,
            0.04 + 0.36 * 0.5 * (1 + math.cos(math.pi * 40 / 80)),
            0.04 + 0.36 * 0.5 * (1 + math.cos(math.pi * 79 / 80)),
        ]
    )
    step = lr_at(
        [*warm, "--lr-scheduler", "step", "--lr-step-size", "3", "--lr-gamma", "0.5"],
        10,
        [20, 49, 50, 80],
    )
    assert step == pytest.approx([0.4, 0.4, 0.2, 0.1])
    poly = lr_at([*warm, "--lr-scheduler", "poly"], 10, [20, 60, 99])
    assert poly == pytest.approx([0.4, 0.4 * 0.5**0.9, 0.4 * (1 / 80) ** 0.9])
    constant = lr_at(
        [
            "--epochs",
            "10",
            "--lr-warmup-epochs",
            "2",
            "--lr-warmup-method",
            "constant",
            "--lr-warmup-decay",
            "0.1",
        ],
        10,
        [0, 19, 20],
    )
    assert constant == pytest.approx([0.04, 0.04, 0.4])


def torchvision_lrs(name, epochs, warmup, step_size, gamma, lr_min):
    """Each epoch's lr under torchvision's reference: its --lr-scheduler built as it builds it,
    stepped once an epoch."""
    sched = torch.optim.lr_scheduler
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.4)
    if name == "steplr":
        main = sched.StepLR(optimizer, step_size=step_size, gamma=gamma)
    elif name == "cosineannealinglr":
        main = sched.CosineAnnealingLR(optimizer, T_max=epochs - warmup, eta_min=lr_min)
    else:
        main = sched.ExponentialLR(optimizer, gamma=gamma)
    if warmup:
        ramp = sched.LinearLR(optimizer, start_factor=0.01, total_iters=warmup)
        main = sched.SequentialLR(optimizer, [ramp, main], milestones=[warmup])
    lrs = []
    for _ in range(epochs):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        main.step()
    return lrs


@pytest.mark.parametrize("name", ["steplr", "cosineannealinglr", "exponentiallr"])
@pytest.mark.parametrize("warmup", [0, 2])
def test_torchvision_scheduler_names_give_its_lr_at_every_epoch(name, warmup):
    epochs, steps, knobs = 10, 7, dict(step_size=3, gamma=0.8, lr_min=0.04)
    flags = ["--epochs", "10", "--lr-warmup-epochs", str(warmup), "--lr-scheduler", name.upper()]
    flags += ["--lr-step-size", "3", "--lr-gamma", "0.8", "--lr-min", "0.04"]
    theirs = torchvision_lrs(name, epochs, warmup, **knobs)
    ours = lr_at(flags, steps, [e * steps for e in range(epochs)])
    assert ours == pytest.approx(theirs, rel=1e-12) and len(set(theirs)) > 3
    if name != "cosineannealinglr":  # a staircase, as torchvision's: one lr all epoch long
        last = lr_at(flags, steps, [e * steps + steps - 1 for e in range(warmup, epochs)])
        assert last == pytest.approx(theirs[warmup:], rel=1e-12)
    ours_named = {"steplr": "step", "cosineannealinglr": "cosine", "exponentiallr": "exponential"}
    assert parse("--lr-scheduler", name).lr_scheduler == ours_named[name]


# training.StepLog's view of a run of one process on the CPU, and a log that keeps nothing
ONE_CPU_PROCESS = SimpleNamespace(
    rank=0, local_rank=0, size=1, distributed=False, main=True, device=torch.device("cpu")
)


class NoLog:
    dir = None

    def __call__(self, record, line):
        pass

    def training_started(self):
        pass


def test_clip_grad_norm_clips_the_total_norm():
    seen = []

    class RecordingSGD(torch.optim.SGD):
        def step(self, closure=None):
            seen.append(
                torch.norm(
                    torch.stack([p.grad.norm() for g in self.param_groups for p in g["params"]])
                ).item()
            )
            return super().step(closure)

    def norms(flags):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(12, 3))
        optimizer = RecordingSGD(model.parameters(), lr=0.1)
        batches = [(100 * torch.randn(4, 3, 2, 2), torch.tensor([0, 1, 2, 0])) for _ in range(3)]
        seen.clear()
        args = parse("--print-freq", "100", *flags)
        step_log = training.StepLog(args, ONE_CPU_PROCESS, NoLog(), None, None, 3, optimizer)
        state = {
            "model": model,
            "model_ema": None,
            "optimizer": optimizer,
            "scheduler": torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0),
            "scaler": torch.amp.GradScaler("cpu", enabled=False),
        }
        steps = step_log.epoch(batches, 1, 0, 0.0)
        train_classify.train_one_epoch(
            model, torch.nn.CrossEntropyLoss(), state, steps, step_log, 1, args
        )
        return list(seen)

    assert min(norms([])) > 1
    assert norms(["--clip-grad-norm", "0.5"]) == pytest.approx([0.5] * 3, rel=1e-5)


def test_model_ema_is_checkpointed_and_is_what_evaluate_scores(tmp_path):
    root = tiny_imagefolder(str(tmp_path / "d"), per_class=6)
    out = str(tmp_path / "o")
    ema = ["--model-ema", "--model-ema-steps", "1", "--model-ema-decay", "0.9"]
    tiny_run(root, out, *ema, "--epochs", "2")
    ckpt = torch.load(os.path.join(out, "checkpoint.pth"), weights_only=True)
    averaged = {
        k[len("module.") :]: v for k, v in ckpt["model_ema"].items() if k.startswith("module.")
    }
    assert averaged.keys() == ckpt["model"].keys()
    assert ckpt["model_ema"]["n_averaged"] == 6  # 3 steps x 2 epochs, one update each
    assert not torch.equal(averaged["fc.weight"], ckpt["model"]["fc.weight"])
    last, path = records(out, "epoch")[-1], os.path.join(out, "checkpoint.pth")
    # --evaluate takes the run's EMA as it takes its model, and says how to score the other; its
    # log has no training set-up (the batch and rate of this command, not the run's)
    evaluated = str(tmp_path / "e")
    proc = run("--data", root, *TINY, "--resume", path, "--evaluate", "--output-dir", evaluated)
    assert f"--evaluate: scores the EMA of {path}; --no-model-ema: its raw model\n" in proc.stdout
    assert "config:" not in proc.stdout and not records(evaluated, "config")
    (score,) = records(evaluated, "eval")
    assert score["ema"] and score["val_top1"] == pytest.approx(last["ema_val_top1"], abs=1e-9)
    raw = str(tmp_path / "r")
    run(
        "--data", root, *TINY, "--resume", path, "--evaluate", "--no-model-ema", "--output-dir", raw
    )
    (score,) = records(raw, "eval")
    assert not score["ema"] and score["val_top1"] == pytest.approx(last["val_top1"], abs=1e-9)


def test_sync_bn_under_cpu_training_is_refused(tmp_path):
    proc = tiny_run(
        tiny_imagefolder(str(tmp_path / "d")), str(tmp_path / "o"), "--sync-bn", check=False
    )
    assert_one_line_error(proc, "--sync-bn", "CUDA")


def test_auto_augment_trains_and_an_unknown_policy_is_refused(tmp_path):
    root = tiny_imagefolder(str(tmp_path / "d"))
    tiny_run(root, str(tmp_path / "o"), "--auto-augment", "ta_wide")
    (config,) = records(str(tmp_path / "o"), "config")
    assert config["args"]["auto_augment"] == "ta_wide"
    assert [e["epoch"] for e in records(str(tmp_path / "o"), "epoch")] == [1]
    proc = tiny_run(root, str(tmp_path / "p"), "--auto-augment", "autoaugment", check=False)
    assert_one_line_error(proc, "--auto-augment", "'ta_wide', 'ra', 'imagenet'")


# ------------------------------------------------------------------------------------------
# output folders: never replace a previous run
# ------------------------------------------------------------------------------------------


def test_a_folder_with_a_previous_run_is_refused_and_left_as_it_was(tmp_path):
    root = tiny_imagefolder(str(tmp_path / "d"))
    out = str(tmp_path / "o")
    tiny_run(root, out)
    before = {
        name: open(os.path.join(out, name), "rb").read()
        for name in ("best.pth", "checkpoint.pth", "metrics.jsonl")
    }
    proc = tiny_run(root, out, check=False)
    assert_one_line_error(proc, out, "--resume", "--overwrite")
    assert before == {name: open(os.path.join(out, name), "rb").read() for name in before}
    tiny_run(root, out, "--overwrite")
    assert len(records(out, "start")) == 1  # the new run's log replaces the old one


def test_runs_without_output_dir_get_numbered_folders(tmp_path):
    root = tiny_imagefolder(str(tmp_path / "d"))
    for n in (1, 2):
        proc = run("--data", root, *TINY, cwd=str(tmp_path))
        folder = os.path.join("runs", "classify", f"exp{n}")
        (start,) = [line for line in proc.stdout.splitlines() if line.startswith("start: ")]
        assert start.startswith(f"start: output_dir {folder}  ")
        assert os.path.isfile(tmp_path / folder / "checkpoint.pth")


def test_a_folder_another_run_is_writing_to_is_refused(tmp_path):
    root = tiny_imagefolder(str(tmp_path / "d"))
    out = tmp_path / "o"
    out.mkdir()
    with open(out / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        assert_one_line_error(tiny_run(root, str(out), check=False), str(out), "another run")
    assert not (out / "metrics.jsonl").exists()


def test_leftovers_of_killed_saves_are_removed(tmp_path):
    root = tiny_imagefolder(str(tmp_path / "d"))
    out = str(tmp_path / "o")
    tiny_run(root, out, "--epochs", "1")
    # atomic_open's temporary name, and an older version's
    leftovers = [
        os.path.join(out, n)
        for n in (".checkpoint.pth.999999-0a1b2c3d.partial", "checkpoint.pth.tmp-999999")
    ]
    for leftover in leftovers:
        with open(leftover, "wb") as f:
            f.write(b"x" * 1000)
    tiny_run(root, out, "--epochs", "2", "--resume", os.path.join(out, "checkpoint.pth"))
    assert not any(os.path.exists(leftover) for leftover in leftovers)


# epoch 2's checkpoint.pth: half of it written, then the disk is full. torch.save reports that as
# the OSError, or (a write cut short) in its zip writer's own words, with next to no space left.
FAIL_THIRD_SAVE = """
import collections, errno, os, runpy, shutil, sys, torch
sys.path.insert(0, os.path.dirname(sys.argv[1]))
calls, save = [0], torch.save
def failing_save(obj, f, *args, **kwargs):
    calls[0] += 1
    if calls[0] == 3:
        f.write(b"partial")
        if os.environ["SAYS"] == "os":
            raise OSError(errno.ENOSPC, "No space left on device")
        shutil.disk_usage = lambda path: collections.namedtuple("usage", "total used free")(9, 9, 0)
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 64 vs 7")
    return save(obj, f, *args, **kwargs)
torch.save = failing_save
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.mark.parametrize("says", ["os", "torch"])
def test_disk_full_while_saving_keeps_the_previous_checkpoint(tmp_path, says):
    root = tiny_imagefolder(str(tmp_path / "d"))
    out = str(tmp_path / "o")
    spy = tmp_path / "spy.py"
    spy.write_text(FAIL_THIRD_SAVE)
    flags = [SCRIPT, "--data", root, *TINY, "--epochs", "2", "--output-dir", out]
    proc = subprocess.run(
        [sys.executable, str(spy), *flags],
        cwd=HERE,
        capture_output=True,
        text=True,
        timeout=600,
        env={**CPU_ENV, "SAYS": says},
    )
    assert_one_line_error(
        proc,
        f"{os.path.join(out, 'checkpoint.pth')}: No space left on device; free space",
        "with --resume where the run has saved a checkpoint.pth",
    )
    assert torch.load(os.path.join(out, "checkpoint.pth"), weights_only=True)["epoch"] == 1
    assert sorted(os.listdir(out)) == [".lock", "best.pth", "checkpoint.pth", "metrics.jsonl"]


# Runs the script of argv[1] on a full disk under $FULL_DIR: every file written there fails.
DISK_FULL = """
import builtins, os, runpy, sys
sys.path.insert(0, os.path.dirname(sys.argv[1]))
real_open, full = builtins.open, os.environ["FULL_DIR"]
def open_on_a_full_disk(path, mode="r", *args, **kwargs):
    if str(path).startswith(full) and set(mode) & set("wax"):
        return real_open("/dev/full", "wb" if "b" in mode else "w", *args, **kwargs)
    return real_open(path, mode, *args, **kwargs)
builtins.open = open_on_a_full_disk
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.mark.parametrize("resuming", [False, True])
def test_a_full_disk_at_start_or_resume_is_one_line_and_keeps_the_run(tmp_path, resuming):
    root, out = tiny_imagefolder(str(tmp_path / "d")), str(tmp_path / "o")
    if resuming:
        tiny_run(root, out)
    before = (
        {n: open(os.path.join(out, n), "rb").read() for n in os.listdir(out)} if resuming else {}
    )
    full = tmp_path / "full.py"
    full.write_text(DISK_FULL)
    resume = ["--resume", os.path.join(out, "checkpoint.pth")] if resuming else []
    proc = subprocess.run(
        [
            sys.executable,
            str(full),
            SCRIPT,
            "--data",
            root,
            *TINY,
            "--epochs",
            "2",
            "--output-dir",
            out,
            *resume,
        ],
        cwd=HERE,
        capture_output=True,
        text=True,
        timeout=600,
        env={**CPU_ENV, "FULL_DIR": out},
    )
    if resuming:  # RunLog.begin rewrites metrics.jsonl without the steps to run again
        assert_one_line_error(proc, f"{out}/metrics.jsonl: No space left on device; free space")
        assert {n: open(os.path.join(out, n), "rb").read() for n in os.listdir(out)} == before
    else:  # the first record of a new run
        assert_one_line_error(
            proc, f"{os.path.join(out, 'metrics.jsonl')}: No space left on device; free space"
        )
        assert not os.path.exists(out)  # a start that failed leaves no folder


# ------------------------------------------------------------------------------------------
# bad input: one line, exit status 2
# ------------------------------------------------------------------------------------------


def test_error_missing_data(tmp_path):
    proc = run("--data", str(tmp_path / "nope"), check=False)
    assert_one_line_error(proc, str(tmp_path / "nope"), "train/ and val/", "--data demo")


def test_error_data_url_of_another_scheme(tmp_path):
    proc = run("--data", "gs://bkt/set", "--output-dir", str(tmp_path / "o"), check=False)
    assert_one_line_error(
        proc, "gs://bkt/set/train: gs:// URLs are not read; expected a local path or an s3:// URL"
    )
    assert not os.path.exists(tmp_path / "o")


def test_error_data_without_val(tmp_path):
    root = tiny_imagefolder(str(tmp_path / "d"))
    os.rename(os.path.join(root, "val"), os.path.join(root, "validation"))
    assert_one_line_error(
        run("--data", root, "--output-dir", str(tmp_path / "o"), check=False), root, "val/"
    )


def test_error_unknown_arch(tmp_path):
    proc = tiny_run(
        tiny_imagefolder(str(tmp_path / "d")),
        str(tmp_path / "o"),
        "--arch",
        "resnet5O",
        check=False,
    )
    assert_one_line_error(proc, "--arch resnet5O", "resnet50")
    # refused before the run folder is made: no line names one
    assert proc.stderr.strip().splitlines() == [
        "error: --arch resnet5O: not a torchvision classification model; close names: resnet50, "
        "resnet152, resnet34, resnet18, resnet101"
    ]
    assert "run folder" not in proc.stdout and not os.path.exists(tmp_path / "o")


@pytest.mark.parametrize(
    "flag,value,allowed",
    [
        ("--lr", "-1", "> 0"),
        ("--epochs", "0", "at least 1"),
        ("--label-smoothing", "1.5", "in [0, 1)"),
        ("--batch-size", "1", "at least 2"),
        ("--lr", "inf", "> 0"),
        ("--wd", "nan", ">= 0"),
        ("--momentum", "nan", "in [0, 1)"),
        ("--decoder-cache", "0", "expected auto, on, off or a number of MB (at least 1)"),
    ],
)
def test_error_bad_numbers(tmp_path, flag, value, allowed):
    proc = tiny_run(
        tiny_imagefolder(str(tmp_path / "d")), str(tmp_path / "o"), flag, value, check=False
    )
    assert_one_line_error(proc, flag, allowed)


def test_error_output_dir_is_a_file(tmp_path):
    (tmp_path / "o").write_text("not a folder")
    proc = tiny_run(tiny_imagefolder(str(tmp_path / "d")), str(tmp_path / "o"), check=False)
    assert_one_line_error(proc, str(tmp_path / "o"), "is a file")


def test_error_output_dir_cannot_be_made(tmp_path):
    (tmp_path / "f").write_text("a file, so no folder can be made under it")
    proc = tiny_run(tiny_imagefolder(str(tmp_path / "d")), str(tmp_path / "f" / "o"), check=False)
    assert_one_line_error(proc, f"{tmp_path / 'f' / 'o'}: Not a directory; ", "permissions")


@pytest.mark.parametrize(
    "content,told",
    [
        (b"", "not a readable checkpoint"),
        (b"PK\x03\x04 truncated zip", "damaged (cut short or overwritten"),
        (b"not a checkpoint at all", "not a readable checkpoint"),
    ],
)
def test_error_unreadable_resume_file(tmp_path, content, told):
    bad = tmp_path / "bad.pth"
    bad.write_bytes(content)
    proc = tiny_run(
        tiny_imagefolder(str(tmp_path / "d")),
        str(tmp_path / "o"),
        "--resume",
        str(bad),
        check=False,
    )
    assert_one_line_error(proc, f"--resume {bad}: {told}")


def test_error_truncated_resume_file(demo_run, tmp_path):
    data = open(os.path.join(demo_run, "checkpoint.pth"), "rb").read()
    cut = tmp_path / "cut.pth"
    cut.write_bytes(data[: len(data) // 2])
    assert_one_line_error(
        run("--data", "demo", "--resume", str(cut), "--evaluate", check=False), str(cut)
    )


def test_error_resume_of_another_arch(demo_run):
    proc = run(
        "--data",
        "demo",
        "--arch",
        "resnet34",
        "--resume",
        os.path.join(demo_run, "checkpoint.pth"),
        "--evaluate",
        check=False,
    )
    assert_one_line_error(proc, "--arch resnet18", "this command gives --arch resnet34")


def test_error_resume_on_other_classes(demo_run, tmp_path):
    root = str(tmp_path / "d")
    shutil.copytree(train_classify.DEMO_DIR, root)
    for split in ("train", "val"):
        os.rename(os.path.join(root, split, "ring"), os.path.join(root, split, "annulus"))
    proc = run(
        "--data",
        root,
        "--arch",
        "resnet18",
        "--resume",
        os.path.join(demo_run, "checkpoint.pth"),
        "--evaluate",
        check=False,
    )
    assert_one_line_error(proc, "other classes", "'circle' there and 'annulus' in --data")


def test_error_val_class_that_train_lacks(tmp_path):
    root = tiny_imagefolder(str(tmp_path / "d"), train=("a", "b", "c"), val=("a", "d"))
    proc = tiny_run(root, str(tmp_path / "o"), check=False)
    assert_one_line_error(proc, os.path.join(root, "val", "d"))


def test_val_missing_classes_is_fine_and_said(tmp_path):
    root = tiny_imagefolder(str(tmp_path / "d"), train=("a", "b", "c"), val=("a", "c"))
    proc = tiny_run(root, str(tmp_path / "o"))
    (start,) = [line for line in proc.stdout.splitlines() if line.startswith("start: ")]
    assert start.endswith("  (1 of the classes have no val samples)")


def corrupt(path, content):
    with open(path, "wb") as f:
        f.write(content)


@pytest.mark.parametrize("content", [b"", b"\xff\xd8\xff\xe0 this is not a JPEG" * 4])
def test_error_undecodable_training_image(tmp_path, content):
    root = tiny_imagefolder(str(tmp_path / "d"))
    bad = os.path.join(root, "train", "b", "1.jpg")
    corrupt(bad, content)
    assert_one_line_error(tiny_run(root, str(tmp_path / "o"), check=False), bad, "cannot decode")


@pytest.mark.parametrize("split", ["train", "val"])
def test_a_file_that_is_not_an_image_is_named_at_batch_32(tmp_path, split):
    # DALI 2.4 CPU-only killed the process (SIGSEGV) in some runs when such a file failed to decode
    # in the first batch of 32: now it is refused when the folder is listed, in every run
    root = tiny_imagefolder(str(tmp_path / "d"), per_class=12)
    bad = os.path.join(root, split, "b", "notes.jpg")
    corrupt(bad, b"a text file, not a JPEG\n" * 8)
    out = str(tmp_path / "o")
    proc = tiny_run(root, out, "--batch-size", "32", check=False)
    assert_one_line_error(proc, f"{bad}: cannot decode this image: not an image file")
    assert not os.path.exists(os.path.join(out, "checkpoint.pth"))


def test_error_undecodable_val_image_stops_in_the_first_steps(tmp_path):
    # the first epoch reads a validation batch after each step: 5.png is in val batch 2 (batch 4, unshuffled)
    root = tiny_imagefolder(str(tmp_path / "d"), per_class=8)
    bad = os.path.join(root, "val", "a", "5.png")
    # its header whole (the listing's check passes it), its pixels broken: only decoding tells
    with open(bad, "rb") as f:
        header = f.read(33)  # the signature and IHDR
    garbage = b"not deflate data" * 4
    idat = struct.pack(">I", len(garbage)) + b"IDAT" + garbage
    corrupt(bad, header + idat + struct.pack(">I", zlib.crc32(idat[4:])))
    out = str(tmp_path / "o")
    assert_one_line_error(tiny_run(root, out, check=False), bad, "cannot decode")
    assert [r["step"] for r in records(out, "train")] == [1, 2] and records(out, "epoch") == []
    assert not os.path.exists(os.path.join(out, "checkpoint.pth"))


def test_a_val_image_deleted_between_epochs_is_named_in_one_line(tmp_path):
    # the last of 16 val images: far past what the readers fetch ahead for epoch 2
    root, out = tiny_imagefolder(str(tmp_path / "d"), per_class=8), str(tmp_path / "o")
    gone = os.path.join(root, "val", "b", "7.png")
    spy = tmp_path / "spy.py"
    spy.write_text(DELETE_AT_FIRST_SAVE)
    flags = ["--data", root, *TINY, "--epochs", "2", "--output-dir", out]
    proc = run(gone, SCRIPT, *flags, script=str(spy), check=False)
    assert_one_line_error(proc, f"error: {gone}: gone since this run listed it")
    assert [e["epoch"] for e in records(out, "epoch")] == [1]


def test_last_batch_is_never_a_single_sample(tmp_path):
    # 5 images, batch 4: the last batch is filled up with real samples instead of BatchNorm failing on one
    root = tiny_imagefolder(str(tmp_path / "d"), train=("a",), val=("a",), per_class=5)
    out = str(tmp_path / "o")
    tiny_run(root, out, "--train-crop-size", "8", "--num-classes", "2")
    assert records(out, "train")[-1]["steps"] == 2


def test_concurrent_demo_builds_both_succeed(tmp_path):
    root = str(tmp_path / "demo")
    code = (
        "import sys, data_processing; data_processing.make_demo_images(sys.argv[1], train_per_class=20, "
        "val_per_class=4)"
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", code, root], cwd=HERE, stderr=subprocess.PIPE)
        for _ in range(2)
    ]
    assert [p.wait(timeout=300) for p in procs] == [0, 0], [p.stderr.read() for p in procs]
    assert sorted(os.listdir(tmp_path)) == ["demo"]  # no temporary folder left behind
    assert sum(len(files) for _, _, files in os.walk(root)) == 6 * 24


def test_error_gpu_requested_without_cuda(tmp_path):
    proc = run("--data", tiny_imagefolder(str(tmp_path / "d")), "--dali-device", "gpu", check=False)
    assert_one_line_error(proc, "--dali-device gpu", "no CUDA device")


def test_mid_epoch_resume_on_webdataset_shards_gives_the_uninterrupted_weights(tmp_path):
    from make_shards import make_shards

    root = tiny_imagefolder(str(tmp_path / "d"), per_class=12)
    make_shards(root, str(tmp_path / "wds"), "wds", shard_size=5, seed=0)
    flags = ["--data", str(tmp_path / "wds"), *TINY, "--epochs", "2", "--checkpoint-every", "2"]
    assert_resume_is_exact(SCRIPT, flags, tmp_path)
    (start,) = records(str(tmp_path / "whole"), "start")
    assert (start["layout"], start["train_samples"], start["classes"]) == ("wds", 24, 2)


# ------------------------------------------------------------------------------------------
# nothing lost, nothing silently wrong: divergence, preemption, flag combinations
# ------------------------------------------------------------------------------------------


def test_a_diverging_run_stops_with_one_line_and_keeps_the_checkpoints_there_were(tmp_path):
    """A non-finite loss, or weights, ends the run at that step with one line; what was saved stays as it was, and
    nothing from after the damage is saved."""
    root = tiny_imagefolder(str(tmp_path / "d"), per_class=12)
    out = str(tmp_path / "o")
    tiny_run(root, out)
    before = {
        name: open(os.path.join(out, name), "rb").read() for name in ("checkpoint.pth", "best.pth")
    }
    proc = tiny_run(root, out, "--overwrite", "--lr", "1e30", check=False)
    assert_one_line_error(
        proc, "epoch 1 step ", "went NaN or infinite", "--lr", "NaN or infinite pixels"
    )
    assert before == {name: open(os.path.join(out, name), "rb").read() for name in before}
    assert all(math.isfinite(r["loss"]) for r in records(out, "train"))
    proc = tiny_run(
        root, out, "--overwrite", "--lr", "1e30", "--checkpoint-every", "1", check=False
    )
    assert_one_line_error(proc, "went NaN or infinite")
    step = int(proc.stderr.strip().splitlines()[-1].split(" step ")[1].split(":")[0])
    ckpt = torch.load(os.path.join(out, "checkpoint.pth"), weights_only=True)
    assert ckpt["epoch"] == 1 and ckpt["step"] < step  # saved before the loss went bad, not after
    assert all(torch.isfinite(v).all() for v in ckpt["model"].values() if v.is_floating_point())
    assert open(os.path.join(out, "best.pth"), "rb").read() == before["best.pth"]


def test_flag_combinations_that_cannot_work_are_refused(tmp_path):
    root = tiny_imagefolder(str(tmp_path / "d"))
    assert_one_line_error(
        tiny_run(root, str(tmp_path / "a"), "--evaluate", check=False), "--evaluate", "--resume"
    )
    assert_one_line_error(
        tiny_run(root, str(tmp_path / "b"), "--val-resize-size", "30", check=False),
        "--val-resize-size 30 is below --val-crop-size 32",
    )
    assert_one_line_error(
        tiny_run(root, str(tmp_path / "c"), "--lr-min", "0.5", check=False),
        "--lr-min 0.5 is above the learning rate, 0.00156",
        "would climb",
    )
    assert not any(os.path.exists(tmp_path / o / "checkpoint.pth") for o in "abc")


# Runs train_classify.py, unchanged, sending itself the signal argv[1] after training step 2 of the
# first epoch: a stop that arrives mid-epoch however fast or slow the machine runs.
SIGNAL_AT_STEP_2 = """
import os, runpy, sys
signum, sys.argv = int(sys.argv[1]), sys.argv[2:]
sys.path.insert(0, os.path.dirname(sys.argv[0]))
import training
after_step = training.StepLog.after_step
def after_step_then_signal(self, step):
    after_step(self, step)
    if self.epoch_no == 1 and step == 2:
        os.kill(os.getpid(), signum)
training.StepLog.after_step = after_step_then_signal
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_saves_the_step_and_resume_ends_as_an_uninterrupted_run(tmp_path, signum):
    """SIGTERM (preemption) and Ctrl-C stop the run at the next step, with a checkpoint of that step, one line that
    names it and the --resume to give, and the exit status of that signal; resuming ends with the same weights."""
    root = tiny_imagefolder(str(tmp_path / "d"), per_class=40)  # 20 steps an epoch
    flags = ["--data", root, *TINY, "--epochs", "2"]
    whole, stopped = str(tmp_path / "whole"), str(tmp_path / "stopped")
    run(*flags, "--output-dir", whole)
    spy = tmp_path / "signal_at_step_2.py"
    spy.write_text(SIGNAL_AT_STEP_2)
    proc = subprocess.run(
        [sys.executable, str(spy), str(int(signum)), SCRIPT, *flags, "--output-dir", stopped],
        cwd=HERE,
        capture_output=True,
        text=True,
        timeout=300,
        env=CPU_ENV,
    )
    stderr = proc.stderr
    assert proc.returncode == 128 + signum and "Traceback" not in stderr, stderr
    path = os.path.join(stopped, "checkpoint.pth")
    ckpt = torch.load(path, weights_only=True)
    assert stderr.strip().splitlines()[-1] == (
        f"stopped by {signal.Signals(signum).name} at epoch 1 step {ckpt['step']}: saved {path}; to continue, run the "
        f"same command with --resume {path}"
    )
    assert ckpt["epoch"] == 1 and 2 <= ckpt["step"] < 20
    run(*flags, "--resume", path)
    a, b = final_weights(whole), final_weights(stopped)
    assert max((a[k].double() - b[k].double()).abs().max().item() for k in a) <= 1e-6
    assert [r["global_step"] for r in records(stopped, "train")] == list(range(1, 41))


# Sends the signal of argv[1] to itself after the first validation batch of the last epoch, argv[2]:
# a stop in the run's last validation.
SIGNAL_IN_LAST_VALIDATION = """
import os, runpy, sys
signum, last, sys.argv = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
sys.path.insert(0, os.path.dirname(sys.argv[0]))
import training
stoppable = training.StepLog.stoppable
def signal_after_the_first(batches):
    for batch in batches:
        yield batch
        os.kill(os.getpid(), signum)
def stoppable_then_signal(self, batches):
    return stoppable(self, signal_after_the_first(batches) if self.epoch_no == last else batches)
training.StepLog.stoppable = stoppable_then_signal
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def test_a_stop_in_the_last_validation_validates_that_epoch_at_resume(tmp_path):
    """SIGINT in the last epoch's validation: the resume validates that epoch (it said the run was
    complete, the epoch never validated), writing its record and best.pth as the uninterrupted run
    did; resumed again, the run is complete."""
    root = tiny_imagefolder(str(tmp_path / "d"), per_class=6)
    flags = ["--data", root, *TINY, "--epochs", "2", "--val-resize-size", "32"]
    whole, stopped = str(tmp_path / "whole"), str(tmp_path / "stopped")
    run(*flags, "--output-dir", whole)
    spy = tmp_path / "signal_in_validation.py"
    spy.write_text(SIGNAL_IN_LAST_VALIDATION)
    command = [sys.executable, str(spy), str(int(signal.SIGINT)), "2", SCRIPT, *flags]
    proc = subprocess.run(
        [*command, "--output-dir", stopped], cwd=HERE, capture_output=True, text=True, env=CPU_ENV
    )
    path = os.path.join(stopped, "checkpoint.pth")
    assert proc.returncode == 128 + signal.SIGINT, proc.stderr
    assert f"at epoch 2 step 3 in validation: saved {path}" in proc.stderr
    assert [r["epoch"] for r in records(stopped, "epoch")] == [1]
    resumed = run(*flags, "--output-dir", stopped, "--resume", path).stdout
    assert f"resumed from {path}: epoch 2, after step 3 of 3, stopped in its validation" in resumed
    a, b = records(whole, "epoch"), records(stopped, "epoch")
    assert [(r["epoch"], r["val_top1"], r["train_loss"]) for r in b] == [
        (r["epoch"], r["val_top1"], r["train_loss"]) for r in a
    ]
    assert [r["global_step"] for r in records(stopped, "train")] == list(range(1, 7))
    best = [torch.load(os.path.join(o, "best.pth"), weights_only=True) for o in (whole, stopped)]
    assert best[0]["epoch"] == best[1]["epoch"] and best[1]["validated"]
    again = run(*flags, "--output-dir", stopped, "--resume", path).stdout
    assert f"its run is complete (2 of 2 epochs, best {best[0]['best']:.3f})" in again


def test_a_resume_takes_its_runs_schedule_flags_where_left_out(capsys):
    """--epochs, the schedule and its warm-up left out at a resume are the run's (--epochs was the
    trainer's default, 90), said in the line of the flags taken."""
    ran = train_classify.parse_args(
        ["--data", "x", "--epochs", "2", "--lr-scheduler", "steplr", "--lr-warmup-epochs", "1"]
    )
    ran.batch_size = 8
    args = train_classify.parse_args(["--data", "x", "--resume", "c.pth"])
    resume.take_run_flags(
        args, {"args": vars(ran), "world_size": 1}, training.World(), "c.pth", False
    )
    assert (args.epochs, args.lr_scheduler, args.lr_warmup_epochs) == (2, "step", 1)
    told = capsys.readouterr().out
    assert "--epochs 2" in told and "--lr-scheduler step " in told and "as in c.pth" in told


def test_a_new_run_in_a_folder_whose_run_left_no_checkpoint_logs_alone(tmp_path):
    root = tiny_imagefolder(str(tmp_path / "d"))
    out = tmp_path / "o"
    out.mkdir()
    (out / "metrics.jsonl").write_text(
        json.dumps({"type": "train", "epoch": 1, "step": 1, "global_step": 1}) + "\n"
    )
    tiny_run(root, str(out))
    assert len(records(str(out), "start")) == 1 and [
        r["step"] for r in records(str(out), "train")
    ] == [1, 2]


# ------------------------------------------------------------------------------------------
# torchvision's conventions: flag names, pretrained weights, logs to plot
# ------------------------------------------------------------------------------------------


def test_torchvision_flag_names_are_aliases_and_no_prefix_is_taken_for_a_flag():
    args = parse("--model", "resnet18", "--test-only", "--amp", "--crop-size", "176")
    assert (args.arch, args.evaluate, args.amp, args.crop_size) == (
        "resnet18",
        True,
        "default",
        176,
    )
    assert train_classify.get_args_parser().parse_args(["--data-path", "/d"]).data == "/d"
    assert parse("--amp", "bf16").amp == "bf16" and parse().amp == "none"
    both = train_classify.parse_args(
        ["--data", "x", "--crop-size", "176", "--val-resize-size", "200"]
    )
    assert (both.train_crop_size, both.val_crop_size) == (176, 176)
    proc = run(
        "--data", "x", "--model-e", check=False
    )  # a prefix of --model-ema*: refused, never guessed
    assert proc.returncode == 2 and "unrecognized argument --model-e" in proc.stderr


def test_torchvision_device_determinism_and_dist_url_flags_parse_and_set_up(capsys):
    flags = ["--device", "cpu", "--use-deterministic-algorithms", "--dist-url", "env://"]
    args = train_classify.parse_args(["--data", "x", *flags])
    assert (args.device, args.use_deterministic_algorithms, args.dist_url) == (
        "cpu",
        True,
        "env://",
    )
    assert (parse().device, parse().use_deterministic_algorithms) == (None, False)
    assert capsys.readouterr().err == ""
    train_classify.parse_args(["--data", "x", "--dist-url", "tcp://10.0.0.1:23456"])
    assert (
        "note: --dist-url tcp://10.0.0.1:23456 is not used: the processes join through "
        "torchrun's rendezvous (env://)\n" in capsys.readouterr().out
    )
    with pytest.raises(SystemExit) as e:
        train_classify.parse_args(["--data", "x", "--device", "cpu", "--dali-device", "gpu"])
    assert e.value.code == 2 and capsys.readouterr().err.startswith("error: --dali-device gpu")
    # --device cpu: the model and DALI on the CPU, a GPU or not; torch's deterministic kernels
    try:
        world = training.setup(args)
        assert world.device == torch.device("cpu") and args.dali_device == "cpu"
        assert torch.are_deterministic_algorithms_enabled()
    finally:
        torch.use_deterministic_algorithms(False)


def test_torchvision_device_flags_train_on_the_cpu_and_device_cuda_needs_cuda(tmp_path):
    root, out = tiny_imagefolder(str(tmp_path / "d")), str(tmp_path / "o")
    flags = ["--device", "cpu", "--use-deterministic-algorithms", "--dist-url", "env://"]
    proc = tiny_run(root, out, *flags)
    assert "  device cpu  dali_device cpu  " in proc.stdout and proc.stderr.count("error") == 0
    assert records(out, "config")[0]["args"]["use_deterministic_algorithms"] is True
    assert [r["epoch"] for r in records(out, "epoch")] == [1]
    assert_one_line_error(
        tiny_run(root, str(tmp_path / "c"), "--device", "cuda", check=False),
        "--device cuda: no CUDA device is visible; use --device cpu",
    )


@gpu
def test_gpu_deterministic_runs_give_the_same_weights_and_device_cpu_leaves_the_gpu(tmp_path):
    root, weights = tiny_imagefolder(str(tmp_path / "d")), []
    for i in range(2):
        out = str(tmp_path / f"o{i}")
        flags = ["--dali-device", "gpu", "--use-deterministic-algorithms", "--epochs", "2"]
        assert (
            "  device cuda:0  dali_device gpu  "
            in tiny_run(root, out, *flags, env=os.environ).stdout
        )
        weights.append(torch.load(os.path.join(out, "checkpoint.pth"), weights_only=True)["model"])
    for name, tensor in weights[0].items():
        assert torch.equal(tensor, weights[1][name]), name
    # --device cpu with a GPU visible: DALI follows the model onto the CPU
    at = TINY.index("--dali-device")
    flags = [*TINY[:at], *TINY[at + 2 :], "--device", "cpu", "--output-dir", str(tmp_path / "c")]
    cpu = run("--data", root, *flags, env=os.environ)
    assert "  device cpu  dali_device cpu  " in cpu.stdout


# torchvision's ResNet-50 recipe (IMAGENET1K_V2) as torchvision writes it, less the flags of
# its own features: --auto-augment ta_wide --ra-sampler --ra-reps 4
TORCHVISION_RESNET50 = """--data-path /data/imagenet --model resnet50 --batch-size 128 --lr 0.5
--lr-scheduler cosineannealinglr --lr-warmup-epochs 5 --lr-warmup-method linear --epochs 600
--random-erase 0.1 --weight-decay 0.00002 --norm-weight-decay 0.0 --label-smoothing 0.1
--mixup-alpha 0.2 --cutmix-alpha 1.0 --train-crop-size 176 --model-ema --val-resize-size 232
--device cuda --dist-url env:// --amp --output-dir /out --auto-augment ta_wide --ra-sampler
--ra-reps 4"""


def test_torchvision_resnet50_recipe_parses_as_torchvision_writes_it():
    args = train_classify.parse_args(TORCHVISION_RESNET50.split())
    assert (args.arch, args.batch_size, args.lr_scheduler, args.lr_warmup_epochs) == (
        "resnet50",
        128,
        "cosine",
        5,
    )
    assert (args.wd, args.norm_weight_decay, args.train_crop_size, args.model_ema) == (
        2e-5,
        0.0,
        176,
        True,
    )
    assert (args.device, args.val_resize_size, args.epochs, args.amp) == (
        "cuda",
        232,
        600,
        "default",
    )
    assert (args.auto_augment, args.ra_sampler, args.ra_reps) == ("ta_wide", True, 4)
    assert training.learning_rate(args, 8 * 128) == (0.5, "--lr 0.5")  # its rate, as torchvision's


def test_lr_is_the_rate_itself_and_lr_base_a_rate_per_lr_base_size_images(tmp_path, capsys):
    """--lr as torchvision's; --lr-base as timm's, scaled to the global batch; neither: today's
    default, --lr-base 0.1 (--data demo: 0.2) per 256 images."""
    rate = training.learning_rate

    def parse(*flags):  # as the trainer parses them
        return train_classify.parse_args(["--data", "x", *flags])

    assert rate(parse("--lr", "0.5", "-b", "32"), 32) == (0.5, "--lr 0.5")
    assert rate(parse("--lr-base", "0.5", "-b", "32"), 64) == (
        0.125,
        "--lr-base 0.5 x global batch 64 / --lr-base-size 256",
    )
    assert rate(parse("--lr-base", "0.5", "--lr-base-size", "512"), 1024)[0] == 1.0
    assert rate(parse(), 256) == (
        0.1,
        "--lr-base 0.1 x global batch 256 / --lr-base-size 256, the default; --lr sets the rate "
        "itself",
    )
    demo = train_classify.parse_args(["--data", "demo"])
    assert (demo.lr, demo.lr_base, rate(demo, 32)[0]) == (None, 0.2, 0.025)
    assert rate(demo, 32)[1].endswith(", --data demo's; --lr sets the rate itself")
    assert train_classify.parse_args(["--data", "demo", "--lr", "0.3"]).lr_base is None
    # both, as timm takes them: --lr counts, and a line says so
    capsys.readouterr()
    both = parse("--lr", "0.5", "--lr-base", "0.4")
    assert rate(both, 32) == (0.5, "--lr 0.5") and both.lr_base is None
    assert "note: --lr-base 0.4 has no effect: --lr is the rate itself and wins, as in timm\n" in (
        capsys.readouterr().out
    )
    with pytest.raises(SystemExit) as e:
        parse("--lr", "0.5", "--lr-base-size", "512")
    assert e.value.code == 2 and capsys.readouterr().err == (
        "error: --lr-base-size 512: sets the batch of --lr-base; --lr 0.5 is the learning rate "
        "itself, for any batch\n"
    )
    out = str(tmp_path / "o")
    proc = tiny_run(tiny_imagefolder(str(tmp_path / "d")), out, "--lr", "0.5")
    assert "config: lr 0.5  lr_from --lr 0.5  " in proc.stdout
    (config,) = records(out, "config")
    assert (config["lr"], config["args"]["lr"], config["args"]["lr_base"]) == (0.5, 0.5, None)


def test_a_run_from_before_lr_base_resumes_at_the_rate_it_trained_with(tmp_path):
    """A checkpoint whose args lack lr_base is an older version's, whose --lr was per 256 images:
    its command run again, where --lr is now the rate itself, resumes at the rate it trained with,
    says so in one line, and ends as the uninterrupted run."""
    root = tiny_imagefolder(str(tmp_path / "d"), per_class=12)  # 6 steps an epoch
    flags = ["--data", root, *TINY, "--epochs", "2"]
    whole, stopped = str(tmp_path / "whole"), str(tmp_path / "stopped")
    run(*flags, "--lr-base", "0.5", "--output-dir", whole)
    spy = tmp_path / "signal_at_step_2.py"
    spy.write_text(SIGNAL_AT_STEP_2)
    cmd = [sys.executable, str(spy), str(int(signal.SIGTERM)), SCRIPT, *flags]
    cmd += ["--lr-base", "0.5", "--output-dir", stopped]
    proc = subprocess.run(cmd, cwd=HERE, capture_output=True, text=True, env=CPU_ENV)
    assert proc.returncode == 128 + signal.SIGTERM, proc.stderr
    path = os.path.join(stopped, "checkpoint.pth")
    ckpt = torch.load(path, weights_only=True)
    assert ckpt["epoch"] == 1 and ckpt["step"] < 6
    # its args as an older version saved them: --lr 0.5, per 256 images
    for key in ("lr_base", "lr_base_size"):
        del ckpt["args"][key]
    ckpt["args"]["lr"] = 0.5
    ckpt["args"]["given"] = [k.replace("lr_base", "lr") for k in ckpt["args"]["given"]]
    torch.save(ckpt, path)

    proc = run(*flags, "--lr", "0.5", "--resume", path)
    trained = 0.5 * 4 / 256
    assert (
        f"--resume {path}: continues at its run's lr {trained:.6g} (a run from before --lr-base: "
        f"its --lr was per 256), not this command's 0.5 (--lr 0.5); to train at another, "
        f"--weights it\n" in proc.stdout
    )
    assert (
        f"config: lr {trained:.5g}  lr_from --lr-base 0.5 x global batch 4 / --lr-base-size 256  "
        in proc.stdout
    )
    assert records(stopped, "config")[-1]["lr"] == trained
    saved = torch.load(path, weights_only=True)["args"]
    assert (saved["lr"], saved["lr_base"], saved["lr_base_size"]) == (None, 0.5, 256)
    ours, theirs = records(stopped, "train"), records(whole, "train")
    assert [r["global_step"] for r in ours] == list(range(1, 13))
    assert [r["lr"] for r in ours] == pytest.approx([r["lr"] for r in theirs], rel=1e-12)
    a, b = final_weights(whole), final_weights(stopped)
    assert max((a[k].double() - b[k].double()).abs().max().item() for k in a) <= 1e-6


@pytest.mark.parametrize("user", [False, True])
def test_a_cpu_run_gives_torch_its_threads_and_lets_idle_ones_sleep(tmp_path, user):
    """torch keeps its own threads beside DALI's -j (the user's OMP_NUM_THREADS, else torch's
    default), and OpenMP's idle threads sleep (OMP_WAIT_POLICY PASSIVE, in place as torch loads)
    unless the user set a policy. One line says the split."""
    env = {k: v for k, v in CPU_ENV.items() if k not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY")}
    if user:
        env.update(OMP_NUM_THREADS="3", OMP_WAIT_POLICY="ACTIVE")
    ask = [sys.executable, "-c", "import torch; print(torch.get_num_threads())"]
    torch_threads = int(subprocess.run(ask, env=env, capture_output=True, text=True).stdout)
    root = tiny_imagefolder(str(tmp_path / "d"))
    # OpenMP prints the settings it started with, as torch loads it
    proc = tiny_run(root, str(tmp_path / "o"), env=dict(env, OMP_DISPLAY_ENV="TRUE"))
    cores = len(os.sched_getaffinity(0))
    assert [line for line in proc.stdout.splitlines() if line.startswith("cpu_threads:")] == [
        f"cpu_threads: torch {torch_threads}  dali 1  cores {cores}"
    ]
    policy = "ACTIVE" if user else "PASSIVE"
    assert f"OMP_WAIT_POLICY = '{policy}'" in proc.stderr


def test_bare_amp_is_the_devices_default_and_every_record_has_a_time(tmp_path):
    root, out = tiny_imagefolder(str(tmp_path / "d")), str(tmp_path / "o")
    before = time.time()
    tiny_run(root, out, "--amp", "--epochs", "2")
    assert (
        records(out, "config")[0]["args"]["amp"] == "bf16"
    )  # on the CPU: torch.autocast's default there
    with open(os.path.join(out, "metrics.jsonl")) as f:
        stamps = [r["time"] for r in map(json.loads, f)]
    assert before < stamps[0] and stamps == sorted(stamps) and stamps[-1] < time.time()
    assert [(r["epoch"], r["step"], r["global_step"]) for r in records(out, "epoch")] == [
        (1, 2, 2),
        (2, 2, 4),
    ]
    assert [(r["epoch"], r["step"], r["global_step"]) for r in records(out, "train")] == [
        (1, 1, 1),
        (1, 2, 2),
        (2, 1, 3),
        (2, 2, 4),
    ]


def test_weights_from_a_file_load_every_tensor_that_fits_and_a_new_head(tmp_path):
    root = tiny_imagefolder(str(tmp_path / "d"))
    torch.manual_seed(1)
    pretrained = torchvision.models.resnet18(
        num_classes=1000
    ).state_dict()  # stands in for ImageNet weights
    torch.save(pretrained, tmp_path / "resnet18.pth")
    out = str(tmp_path / "o")
    proc = tiny_run(root, out, "--weights", str(tmp_path / "resnet18.pth"), "--lr", "1e-12")
    n = len(pretrained)
    assert (
        f"{n - 2} of the model's {n} tensors loaded" in proc.stdout
    )  # all but fc.weight and fc.bias
    trained = torch.load(os.path.join(out, "checkpoint.pth"), weights_only=True)["model"]
    torch.testing.assert_close(
        trained["conv1.weight"], pretrained["conv1.weight"]
    )  # lr 1e-12: as loaded
    torch.testing.assert_close(trained["layer4.1.bn2.weight"], pretrained["layer4.1.bn2.weight"])
    assert trained["fc.weight"].shape == (2, 512)
    # one of our checkpoints is a file of weights too: every tensor fits
    again = tiny_run(root, str(tmp_path / "o2"), "--weights", os.path.join(out, "checkpoint.pth"))
    assert f"{n} of the model's {n} tensors loaded" in again.stdout


def test_weights_in_lightnings_and_timms_layouts_load_every_tensor(tmp_path):
    torch.manual_seed(1)
    source = torchvision.models.resnet18(num_classes=2).state_dict()
    n = len(source)

    def prefixed(prefix, state=source):
        return {prefix + k: v for k, v in state.items()}

    timm_args = argparse.Namespace(model="resnet18", lr=0.1)  # timm saves its flags so
    layouts = {
        "lightning": {"state_dict": prefixed("model."), "epoch": 3, "global_step": 9},
        "timm_plain": dict(source),
        "timm_ddp": {"state_dict": prefixed("module."), "args": timm_args, "epoch": 3},
        "timm_model": {"model": prefixed("module."), "epoch": 3},
        "timm_ema": {"state_dict_ema": dict(source), "version": 2},
    }
    for layout, contents in layouts.items():
        path = str(tmp_path / f"{layout}.pth")
        torch.save(contents, path)
        args = SimpleNamespace(weights=path, arch="resnet18")
        torch.manual_seed(2)
        model = torchvision.models.resnet18(num_classes=2)
        line = training.load_weights(model, args)
        assert f"{n} of the model's {n} tensors loaded" in line, layout
        for key, tensor in model.state_dict().items():
            assert torch.equal(tensor, source[key]), (layout, key)
        # --predict --weights FILE: the same layouts, every tensor
        model = torchvision.models.resnet18(num_classes=2)
        ckpt = predict.checkpoint_to_predict(
            SimpleNamespace(resume="", weights=path, output_dir=str(tmp_path)), ONE_CPU_PROCESS
        )
        predict.load_to_predict(model, ckpt, args, ONE_CPU_PROCESS)
        assert all(torch.equal(t, source[k]) for k, t in model.state_dict().items()), layout
    # another model's weights in those layouts fit no tensor: still refused
    other = prefixed("model.", torchvision.models.alexnet().state_dict())
    torch.save({"state_dict": other}, tmp_path / "alexnet.ckpt")
    args = SimpleNamespace(weights=str(tmp_path / "alexnet.ckpt"), arch="resnet18")
    with pytest.raises(training.UsageError, match="none of its tensors fits the model of --arch"):
        training.load_weights(torchvision.models.resnet18(num_classes=2), args)


def test_bad_weights_are_one_error_line(tmp_path):
    root = tiny_imagefolder(str(tmp_path / "d"))
    assert_one_line_error(
        tiny_run(root, str(tmp_path / "a"), "--weights", "NoSuch_Weights.X", check=False),
        "--weights NoSuch_Weights.X: neither a weights file nor a torchvision weights name",
    )
    torch.save(torchvision.models.alexnet().state_dict(), tmp_path / "alexnet.pth")
    assert_one_line_error(
        tiny_run(
            root, str(tmp_path / "b"), "--weights", str(tmp_path / "alexnet.pth"), check=False
        ),
        "none of its tensors fits the model of --arch resnet18",
    )
    (tmp_path / "junk.pth").write_bytes(b"not a checkpoint")
    assert_one_line_error(
        tiny_run(root, str(tmp_path / "c"), "--weights", str(tmp_path / "junk.pth"), check=False),
        f"--weights {tmp_path / 'junk.pth'}: neither a weights file",
    )


def test_a_weights_name_that_cannot_be_downloaded_says_so_and_where_torch_looks(
    tmp_path, monkeypatch
):
    """Offline, --weights NAME said it was neither a file nor a torchvision weights name; now: its
    download failed, the file torch's cache looks for, and how to run without it."""
    monkeypatch.setattr(torch.hub, "_hub_dir", str(tmp_path / "hub"))

    def offline(url, dst, *args, **kwargs):
        raise urllib.error.URLError(OSError(101, "Network is unreachable"))

    monkeypatch.setattr(torch.hub, "download_url_to_file", offline)
    name = "ResNet18_Weights.IMAGENET1K_V1"
    args = train_classify.parse_args(["--data", "x", "--arch", "resnet18", "--weights", name])
    url = torchvision.models.get_weight(name).url
    with pytest.raises(training.UsageError) as refused:
        training.load_weights(torchvision.models.resnet18(), args)
    cached = tmp_path / "hub" / "checkpoints" / os.path.basename(url)
    assert str(refused.value) == (
        f"--weights {name}: its download failed (<urlopen error [Errno 101] Network is "
        f"unreachable>), as it does without a network; copy {url} to {cached}, where torch looks "
        f"before downloading, or pass its path to --weights"
    )


def test_tensorboard_without_the_package_is_one_error_line(tmp_path):
    hide = tmp_path / "hide"  # a sitecustomize that makes the tensorboard package unimportable
    hide.mkdir()
    (hide / "sitecustomize.py").write_text(
        "import sys\nsys.modules['tensorboard'] = None\n"
        "sys.modules['torch.utils.tensorboard'] = None\n"
    )
    root = tiny_imagefolder(str(tmp_path / "d"))
    proc = run(
        "--data",
        root,
        *TINY,
        "--output-dir",
        str(tmp_path / "o"),
        "--tensorboard",
        check=False,
        env={**CPU_ENV, "PYTHONPATH": str(hide)},
    )
    assert_one_line_error(
        proc, "--tensorboard: needs the tensorboard package (pip install tensorboard)"
    )


def test_tensorboard_scalars_are_the_metrics_records(tmp_path):
    event_accumulator = pytest.importorskip(
        "tensorboard.backend.event_processing.event_accumulator"
    )
    root, out = tiny_imagefolder(str(tmp_path / "d")), str(tmp_path / "o")
    tiny_run(root, out, "--tensorboard", "--epochs", "2")
    events = event_accumulator.EventAccumulator(out)
    events.Reload()
    for kind, key in (
        ("train", "loss"),
        ("train", "img_s"),
        ("epoch", "val_top1"),
        ("epoch", "train_loss"),
    ):
        logged = [(r["global_step"], r[key]) for r in records(out, kind)]
        scalars = [(e.step, e.value) for e in events.Scalars(f"{kind}/{key}")]
        assert [s for s, _ in scalars] == [s for s, _ in logged]
        assert [v for _, v in scalars] == pytest.approx([v for _, v in logged], rel=1e-6)


# ------------------------------------------------------------------------------------------
# what a user sees: --help at once, a line at least every LOG_EVERY seconds, the closing line,
# no run folder from a start that failed
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("script", ["train_classify.py", "train_segment.py"])
def test_help_and_flag_errors_answer_before_torch_loads(tmp_path, script):
    """A torch that cannot be imported stands first on the path: --help still prints the flags,
    and a bad flag its one error line, so neither waits for torch and DALI to load."""
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text("raise ImportError('torch was imported')\n")
    env = {**CPU_ENV, "PYTHONPATH": str(tmp_path)}
    path = os.path.join(HERE, script)
    shown = run("--help", script=path, env=env)
    assert shown.stdout.startswith(f"usage: {script}") and "--print-freq" in shown.stdout
    bad = run("--data", "x", "--lr", "-1", script=path, env=env, check=False)
    assert bad.returncode == 2
    assert bad.stderr == "error: argument --lr/--learning-rate: must be > 0, got -1\n"


def test_a_line_is_due_every_log_every_seconds_whatever_print_freq(monkeypatch):
    lines = []

    class Log(NoLog):
        def __call__(self, record, line):
            lines.append(record["step"])

    def steps_logged():
        lines.clear()
        model = torch.nn.Linear(2, 2)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        args = parse("--print-freq", "100", "--epochs", "1")
        step_log = training.StepLog(args, ONE_CPU_PROCESS, Log(), None, None, 4, optimizer)
        for _, (x, _y) in step_log.epoch([(torch.ones(3, 2), None)] * 4, 1):
            step_log.update(model(x).sum(), len(x))
        return list(lines)

    assert steps_logged() == [4]  # --print-freq 100: the epoch's last step only
    monkeypatch.setattr(training, "LOG_EVERY", 0.0)
    assert steps_logged() == [1, 2, 3, 4]  # a line overdue at every step


def test_a_run_ends_with_one_line_of_its_best_score_folder_and_time(tmp_path):
    root, out = tiny_imagefolder(str(tmp_path / "d")), str(tmp_path / "o")
    proc = tiny_run(root, out, "--epochs", "2")
    last = proc.stdout.strip().splitlines()[-1]
    best = max(r["val_top1"] for r in records(out, "epoch"))
    assert re.fullmatch(
        rf"end: val_top1 {best:.5g}  took \d+:\d\d:\d\d  output_dir {re.escape(out)}", last
    )
    (end,) = records(out, "end")
    assert end["val_top1"] == best


def test_a_start_that_fails_before_training_leaves_no_run_folder(tmp_path):
    root = tiny_imagefolder(str(tmp_path / "d"))
    os.makedirs(os.path.join(root, "train", "empty"))  # a class folder with no images
    proc = run("--data", root, *TINY, cwd=str(tmp_path), check=False)
    assert_one_line_error(proc, "empty: no images in this class folder")
    assert os.listdir(tmp_path / "runs" / "classify") == []  # no exp1 left behind
    new = str(tmp_path / "new")
    assert_one_line_error(tiny_run(root, new, check=False), "empty: no images")
    assert not os.path.exists(new)
    kept = tmp_path / "kept"
    kept.mkdir()  # a folder the user made: it stays
    assert_one_line_error(tiny_run(root, str(kept), check=False), "empty: no images")
    assert kept.is_dir()


def test_resume_auto_continues_the_same_command_and_a_finished_run_is_not_trained_again(tmp_path):
    """What a requeued job does: the command it was started with. --resume auto starts fresh in an
    empty --output-dir, continues from its checkpoint after a kill, ending with an uninterrupted
    run's weights, and after the end says in one line that the run is complete, training nothing."""
    root = tiny_imagefolder(str(tmp_path / "d"), per_class=12)
    flags = ["--data", root, *TINY, "--epochs", "2", "--checkpoint-every", "2", "--resume", "auto"]
    whole, broken = str(tmp_path / "whole"), str(tmp_path / "broken")
    run(*flags, "--output-dir", whole)
    assert records(whole, "resume") == []  # an empty folder: a fresh start
    command = [sys.executable, SCRIPT, *flags, "--output-dir", broken]
    ckpt = kill_after_mid_epoch_checkpoint(command, broken)
    assert (ckpt["epoch"], 0 < ckpt["step"] < records(whole, "train")[0]["steps"]) == (1, True)
    run(*flags, "--output-dir", broken)
    (resumed,) = records(broken, "resume")
    assert (resumed["epoch"], resumed["step"]) == (ckpt["epoch"], ckpt["step"])
    a, b = final_weights(whole), final_weights(broken)
    assert max((a[k].double() - b[k].double()).abs().max().item() for k in a) <= 1e-6
    before = os.stat(os.path.join(broken, "checkpoint.pth")).st_mtime_ns
    again = run(*flags, "--output-dir", broken)
    assert (
        again.stdout.strip()
        .splitlines()[-1]
        .endswith(
            "its run is complete (2 of 2 epochs, best "
            f"{max(r['val_top1'] for r in records(broken, 'epoch')):.3f}); nothing to train"
        )
    )
    assert os.stat(os.path.join(broken, "checkpoint.pth")).st_mtime_ns == before
    assert len(records(broken, "epoch")) == 2


def test_resume_auto_needs_an_output_dir(tmp_path):
    proc = run("--data", tiny_imagefolder(str(tmp_path / "d")), "--resume", "auto", check=False)
    assert proc.returncode == 2 and proc.stderr.startswith("error: --resume auto continues the run")


def test_a_torn_last_record_never_stops_a_resume(tmp_path):
    """A kill while a record was being appended leaves half a line in metrics.jsonl (an editor,
    an empty one): the resume drops it and goes on."""
    root, out = tiny_imagefolder(str(tmp_path / "d")), str(tmp_path / "o")
    tiny_run(root, out)
    with open(os.path.join(out, "metrics.jsonl"), "a") as f:
        f.write('\n{"type": "train", "epoch": 2, "st')
    tiny_run(root, out, "--epochs", "2", "--resume", os.path.join(out, "checkpoint.pth"))
    with open(os.path.join(out, "metrics.jsonl")) as f:
        kept = [json.loads(line) for line in f]  # every line a whole record
    assert [r["epoch"] for r in kept if r["type"] == "epoch"] == [1, 2]


def test_a_training_run_keeps_the_evaluate_scores_in_its_folder(tmp_path):
    """--evaluate writes its score to --output-dir's metrics.jsonl: a second --evaluate and a
    training run in that folder add to it; only --overwrite starts the log anew."""
    root, out = tiny_imagefolder(str(tmp_path / "d")), str(tmp_path / "o")
    tiny_run(root, str(tmp_path / "t"))
    path = os.path.join(str(tmp_path / "t"), "checkpoint.pth")
    tiny_run(root, out, "--evaluate", "--resume", path)
    tiny_run(root, out, "--evaluate", "--resume", path)
    tiny_run(root, out)
    assert len(records(out, "eval")) == 2 and len(records(out, "epoch")) == 1
    tiny_run(root, out, "--overwrite")
    assert not records(out, "eval") and len(records(out, "epoch")) == 1


@pytest.mark.parametrize(
    "drop, named", [(("world_size", "rng"), "lacks rng, world_size"), (("dali",), "no DALI state")]
)
def test_a_checkpoint_lacking_what_a_resume_needs_is_named_in_one_line(tmp_path, drop, named):
    root, out = tiny_imagefolder(str(tmp_path / "d")), str(tmp_path / "o")
    tiny_run(root, out)
    path = os.path.join(out, "checkpoint.pth")
    ckpt = torch.load(path, weights_only=True)
    for key in drop:
        ckpt.pop(key)
    torch.save(ckpt, path)
    proc = tiny_run(root, out, "--epochs", "2", "--resume", path, check=False)
    assert_one_line_error(proc, f"--resume {path}: ", named)
    # scoring it needs only its weights and classes
    tiny_run(root, str(tmp_path / "e"), "--evaluate", "--resume", path)


def flip_two_bytes_in_the_middle(path, damaged):
    data = bytearray(open(path, "rb").read())
    data[len(data) // 2] ^= 0xFF
    data[len(data) // 2 + 1] ^= 0xFF
    damaged.write_bytes(bytes(data))


def test_a_damaged_checkpoint_is_refused_in_one_line_at_resume_evaluate_predict_and_weights(
    tmp_path,
):
    """Two bytes flipped in the middle of checkpoint.pth: torch.load reads it without a word (its
    zip's CRC-32s unchecked) and the run resumed on other weights; now --resume, --evaluate,
    --predict (of --resume or --weights) and --weights each refuse it in one line naming it and
    saying what to do, before anything is trained or written."""
    root, out = tiny_imagefolder(str(tmp_path / "d")), str(tmp_path / "o")
    tiny_run(root, out)
    path = os.path.join(out, "checkpoint.pth")
    flip_two_bytes_in_the_middle(path, tmp_path / "flipped.pth")
    shutil.copy(tmp_path / "flipped.pth", path)
    before = folder_bytes(out)
    told = (
        "fails its CRC-32 check), not the bytes that were written; pass a whole copy, or its "
        "run's best.pth (another point of the run: resume from it, or --weights it)"
    )
    for flags in (["--epochs", "2"], ["--evaluate"]):
        proc = tiny_run(root, out, *flags, "--resume", path, check=False)
        assert_one_line_error(proc, f"--resume {path}: damaged (its member ", told)
        assert folder_bytes(out) == before
    images = os.path.join(root, "val")
    for flag in ("--resume", "--weights"):
        proc = run(
            "--predict", images, flag, path, "--output-dir", str(tmp_path / "p"), check=False
        )
        assert_one_line_error(proc, f"{flag} {path}: damaged (its member ", told)
    proc = tiny_run(root, str(tmp_path / "w"), "--weights", path, check=False)
    assert_one_line_error(proc, f"--weights {path}: damaged (its member ", told)
    assert not os.path.exists(tmp_path / "p") and not os.path.exists(tmp_path / "w")


def test_a_cut_short_or_foreign_file_is_refused_naming_it(tmp_path):
    """A checkpoint cut short has lost its zip's directory: damaged, named; a file that is no zip
    (torch's older format) is left to torch.load, which names it too; a whole one passes."""
    saved = tmp_path / "whole.pth"
    torch.save({"model": torchvision.models.resnet18().state_dict(), "args": {}}, saved)
    training.check_whole(str(saved), "--resume")
    (tmp_path / "cut.pth").write_bytes(saved.read_bytes()[: saved.stat().st_size // 3])
    with pytest.raises(training.UsageError) as refused:
        training.check_whole(str(tmp_path / "cut.pth"), "--weights")
    assert str(refused.value).startswith(
        f"--weights {tmp_path / 'cut.pth'}: damaged (cut short or overwritten: "
    )
    (tmp_path / "text.pth").write_text("not a checkpoint")
    training.check_whole(str(tmp_path / "text.pth"), "--resume")
    with pytest.raises(training.UsageError, match="not a readable checkpoint"):
        resume.load_checkpoint(str(tmp_path / "text.pth"))


@pytest.mark.parametrize(
    "edit,told",
    [
        (("dali", None, ["garbage"]), "its dali of another type"),
        (("dali", None, 5), "its dali of another type"),
        (("args", "batch_size", 0), "its args.batch_size of another type"),
        (("args", "lr", [0.1]), "its args.lr of another type"),
        (("args", "wd", "x"), "its --wd is 'x', of another type than"),
        (("args", "epochs", [3]), "its --epochs is [3], of another type"),
    ],
)
def test_an_edited_checkpoint_is_one_line(tmp_path, edit, told):
    """A checkpoint whose DALI states, batch, rate or another flag were edited to another type
    (its CRCs whole: it was saved again) was a traceback; now one line."""
    key, flag, value = edit
    ran = train_classify.parse_args(["--data", "x", "--epochs", "2"])
    ran.batch_size, ran.given = 8, {}
    ckpt = {k: None for k in resume.TO_RESUME}
    ckpt.update(epoch=1, step=3, world_size=1, num_samples=24, best=50.0, classes=["a"], rng=[])
    ckpt.update(model={}, args=vars(ran), dali=[b"state"])
    if flag:
        ckpt["args"][flag] = value
    else:
        ckpt[key] = value
    torch.save(ckpt, tmp_path / "c.pth")
    args = train_classify.parse_args(["--data", "x", "--resume", str(tmp_path / "c.pth")])
    with pytest.raises(training.UsageError) as refused:
        resume.load(args, training.World())
    assert told in str(refused.value) and "(an edited or damaged file)" in str(refused.value)


def test_srun_tasks_without_torchrun_are_refused_in_one_line(tmp_path):
    """srun -n 4 python train_classify.py: four processes with SLURM's variables and none of
    torchrun's would each train alone, world size 1."""
    env = {**CPU_ENV, "SLURM_NTASKS": "4", "SLURM_PROCID": "2"}
    root = tiny_imagefolder(str(tmp_path / "d"))
    proc = run("--data", root, *TINY, cwd=str(tmp_path), env=env, check=False)
    assert_one_line_error(proc, "SLURM started 4 tasks (SLURM_NTASKS) without torchrun's RANK")
    assert not os.path.exists(tmp_path / "runs")


def test_ra_sampler_runs_torchvisions_steps_and_validates_every_sample_once(tmp_path):
    root = tiny_imagefolder(str(tmp_path / "data"), per_class=130, size=(12, 12))
    out = str(tmp_path / "out")
    tiny_run(root, out, "--ra-sampler", "--ra-reps", "4", "--batch-size", "48")
    (start,) = records(out, "start")
    # RASampler: 260 // 256 * 256 / 1 process = 256 samples, in ceil(256 / 48) = 6 steps
    assert (start["ra_reps"], start["ra_samples"], start["steps_per_epoch"]) == (4, 256, 6)
    assert {r["steps"] for r in records(out, "train")} == {6} and records(out, "train")[-1][
        "step"
    ] == 6
    args = train_classify.parse_args(["--data", root, *TINY, "--ra-sampler", "--ra-reps", "4"])
    world = SimpleNamespace(local_rank=0, rank=0, size=1)
    train, val, _ = train_classify.make_pipelines(args, world, None)
    assert train.read.ra.reps == 4 and not val.read.ra
    seen = [len(b[0]["label"]) for b in train_classify.classify_iterator(val)]
    assert sum(seen) == val.num_samples == 260  # each validation sample once
    refused = tiny_run(root, out + "2", "--ra-reps", "4", check=False)
    assert_one_line_error(refused, "--ra-reps 4: needs --ra-sampler")
    # the sampler is a source of its own in the graph: a resume with other copies is refused in
    # one line; one without the flags goes on with its run's
    path = os.path.join(out, "checkpoint.pth")
    flags = ("--batch-size", "48", "--epochs", "2", "--resume", path)
    refused = tiny_run(root, out, *flags, "--ra-sampler", "--ra-reps", "3", check=False)
    assert_one_line_error(
        refused, f"--resume {path}: its run had --ra-reps 4, this command gives --ra-reps 3"
    )
    resumed = tiny_run(root, out, *flags)
    assert f"--resume: --ra-sampler --ra-reps 4, as in {path}" in resumed.stdout.splitlines()
    assert {r["steps"] for r in records(out, "train")} == {6}


@pytest.mark.parametrize("reps", ["0", "17", "256"])
def test_ra_reps_is_bounded(tmp_path, capsys, reps):
    # 256 copies of each image left an epoch of one or two images while the log said 256 copies
    with pytest.raises(SystemExit) as exit_info:
        train_classify.parse_args(["--data", str(tmp_path), "--ra-sampler", "--ra-reps", reps])
    assert exit_info.value.code == 2
    assert (
        capsys.readouterr()
        .err.splitlines()[-1]
        .endswith(f"error: argument --ra-reps: must be in [1, 16], got {reps}")
    )


# ------------------------------------------------------------------------------------------
# a command brought from torchvision, timm or DALI's example
# ------------------------------------------------------------------------------------------

TIMM = """--data-dir {root} --model resnet18 --sched cosine --warmup-epochs 1 --warmup-lr 1e-4
--min-lr 1e-5 --smoothing 0.1 --mixup 0.2 --cutmix 1.0 --aa rand-m9-mstd0.5-inc1 --img-size 32
--reprob 0.25 --clip-grad 1.0 --opt adamw --lr-base 1e-3 -b 16 --epochs 2 --log-interval 1
--output {out} --workers 1 --dali-device cpu"""


def test_timms_flags_are_taken_with_their_meaning_or_refused_with_ours(tmp_path, capsys):
    """timm's train.py flags name our features: each is taken as timm means it (--lr-base scales by
    the square root for AdamW, as timm's); one we lack is one line naming where it comes from and
    what to write; any other unknown flag, the closest of ours. The recipe shrunk trains."""
    root, out = tiny_imagefolder(str(tmp_path / "d"), per_class=16), str(tmp_path / "o")
    flags = TIMM.format(root=root, out=out).split()
    args = train_classify.parse_args(flags)
    assert (args.data, args.arch, args.lr_scheduler, args.lr_warmup_epochs) == (
        root,
        "resnet18",
        "cosine",
        1,
    )
    assert (args.warmup_lr, args.lr_min, args.label_smoothing) == (1e-4, 1e-5, 0.1)
    assert (args.mixup_alpha, args.cutmix_alpha, args.auto_augment) == (0.2, 1.0, "ra")
    assert (args.train_crop_size, args.val_crop_size, args.random_erase) == (32, 32, 0.25)
    assert (args.clip_grad_norm, args.print_freq, args.output_dir) == (1.0, 1, out)
    assert training.learning_rate(args, 16) == (
        2.5e-4,
        "--lr-base 0.001 x sqrt(global batch 16 / --lr-base-size 256)",
    )
    for extra, told in (
        (["--drop-path", "0.1"], "error: --drop-path: timm's stochastic depth: not here"),
        (["--sced", "step"], "error: unrecognized argument --sced: did you mean --sched?"),
        (["--aa", "rand-m7"], "error: argument --auto-augment/--aa: invalid choice: 'rand-m7'"),
    ):
        with pytest.raises(SystemExit) as e:
            train_classify.parse_args(flags + extra)
        assert e.value.code == 2 and capsys.readouterr().err.startswith(told)
    shown = " ".join(train_classify.get_args_parser().format_help().split())
    assert "(timm's --warmup-epochs overlaps its schedule's first epochs)" in shown
    assert "as torchvision's (not timm's per-step decay)" in shown
    run(*flags)
    (config,) = records(out, "config")
    assert config["lr"] == pytest.approx(2.5e-4) and config["args"]["auto_augment"] == "ra"
    first = records(out, "train")[0]  # a step into the warm-up from --warmup-lr
    steps = first["steps"]
    assert first["lr"] == pytest.approx(1e-4 + (2.5e-4 - 1e-4) / steps, rel=1e-6)


def test_a_warm_up_from_warmup_lr_starts_at_that_rate():
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    args = train_classify.parse_args(["--data", "x", "--warmup-epochs", "1", "--warmup-lr", "1e-4"])
    scheduler = training.make_scheduler(optimizer, args, steps_per_epoch=4)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(1e-4)
    for _ in range(4):
        optimizer.step()
        scheduler.step()
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.01)


def test_dalis_resnet50_example_command_trains_and_says_what_its_lr_means(tmp_path):
    """DALI's example: -a ARCH --dali_cpu -b N --lr LR DIR. Its --lr was scaled by the global batch
    / 256: one line says ours is the rate itself."""
    root, out = tiny_imagefolder(str(tmp_path / "d")), str(tmp_path / "o")
    proc = run(
        *("-a", "resnet18", "--dali_cpu", "-b", "4", "--lr", "0.1", root, "--epochs", "1"),
        *("--train-crop-size", "32", "--val-crop-size", "32", "--val-resize-size", "36"),
        *("--workers", "1", "--output-dir", out),
    )
    told = (
        "note: --lr 0.1 is the learning rate itself here; DALI's ResNet-50 example scales its --lr "
        "by the global batch / 256: for that rate, write --lr-base 0.1\n"
    )
    assert proc.stdout.count(told) == 1  # once, though the trainer reads its flags twice
    assert (
        "note: defaults that differ from DALI's ResNet-50 example: --lr-scheduler cosine (its: "
        "--lr-scheduler step, the nearest: it decays at epochs 30, 60 and 80), "
        "--lr-warmup-epochs 0 (its: --lr-warmup-epochs 5)\n" in proc.stdout
    )
    (config,) = records(out, "config")
    assert (config["lr"], config["args"]["arch"], config["args"]["dali_device"]) == (
        0.1,
        "resnet18",
        "cpu",
    )
    assert config["args"]["data"] == root


def test_the_ema_updates_in_an_epoch_shorter_than_model_ema_steps(tmp_path):
    """As torchvision's, the EMA updates at an epoch's first step: two epochs of 3 steps with
    --model-ema-steps 32 average twice (before, never: the log's EMA scores were the first
    weights')."""
    root, out = tiny_imagefolder(str(tmp_path / "d"), per_class=6), str(tmp_path / "o")
    tiny_run(root, out, "--model-ema", "--epochs", "2")
    ckpt = torch.load(os.path.join(out, "checkpoint.pth"), weights_only=True)
    assert ckpt["model_ema"]["n_averaged"] == 2


def test_a_cpu_run_takes_torchvisions_batch_of_32_and_data_mistakes_answer_at_once(tmp_path):
    root = tiny_imagefolder(str(tmp_path / "d"), per_class=16)  # 32 images: one step of 32
    out = str(tmp_path / "o")
    flags = [f for f in TINY if f not in ("--batch-size", "4")]
    run("--data", root, *flags, "--output-dir", out)
    assert records(out, "config")[0]["args"]["batch_size"] == 32
    # a torch that cannot be imported first on the path: the --data line comes before it loads
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text("raise ImportError('torch was imported')\n")
    env = {**CPU_ENV, "PYTHONPATH": str(tmp_path)}
    shutil.rmtree(os.path.join(root, "val"))
    proc = run("--data", root, check=False, env=env)
    assert proc.returncode == 2 and proc.stderr == (
        f"error: --data {root}: expected subfolders train/ and val/ in it (each an ImageFolder "
        "tree, TFRecord files or WebDataset tars), or --data demo for the built-in demo set\n"
    )


# ------------------------------------------------------------------------------------------
# bad input: what a hostile round found
# ------------------------------------------------------------------------------------------


def test_adding_a_warm_up_at_a_resume_takes_up_its_schedule(tmp_path):
    """--lr-warmup-epochs added at a resume: a schedule of another shape than the checkpoint's
    (it was a KeyError from the saved scheduler's state)."""
    root, out = tiny_imagefolder(str(tmp_path / "d")), str(tmp_path / "o")
    tiny_run(root, out)
    path = os.path.join(out, "checkpoint.pth")
    proc = tiny_run(root, out, "--epochs", "3", "--lr-warmup-epochs", "1", "--resume", path)
    assert f"--resume {path}: --epochs 3, --lr-warmup-epochs 1.0 (its run had 1, 0)" in proc.stdout
    assert [e["epoch"] for e in records(out, "epoch")] == [1, 2, 3]


def test_a_checkpoint_of_another_shape_is_refused_and_one_without_a_graph_record_resumes(
    tmp_path,
):
    root, out = tiny_imagefolder(str(tmp_path / "d")), str(tmp_path / "o")
    tiny_run(root, out)
    path = os.path.join(out, "checkpoint.pth")
    ckpt = torch.load(path, weights_only=True)
    ckpt.pop("graph", None)  # written before the record went, or edited
    edited = os.path.join(out, "edited.pth")
    torch.save({**ckpt, "epoch": "1", "world_size": 1.0}, edited)
    proc = tiny_run(root, out, "--epochs", "2", "--resume", edited, check=False)
    assert_one_line_error(
        proc, f"--resume {edited}: its epoch, world_size of another type than train_classify.py"
    )
    torch.save({**ckpt, "graph": "x"}, path)
    tiny_run(root, out, "--epochs", "2", "--resume", path)
    assert [e["epoch"] for e in records(out, "epoch")] == [1, 2]


def test_a_fifo_named_as_an_image_and_a_class_folder_linked_twice_are_one_line(tmp_path):
    root = tiny_imagefolder(str(tmp_path / "d"))
    os.mkfifo(os.path.join(root, "train", "a", "pipe.jpg"))  # its first bytes would never come
    proc = tiny_run(root, str(tmp_path / "o"), check=False)
    assert_one_line_error(proc, os.path.join(root, "train", "a", "pipe.jpg"), "not a regular file")
    os.remove(os.path.join(root, "train", "a", "pipe.jpg"))
    os.symlink(os.path.join(root, "train", "a"), os.path.join(root, "train", "c"))
    proc = tiny_run(root, str(tmp_path / "o"), check=False)
    assert_one_line_error(
        proc, os.path.join(root, "train", "c"), "the same folder as", "under two labels"
    )


def test_weights_of_another_model_are_refused(tmp_path):
    """ResNet-50's weights loaded 98 of ResNet-18's 122 tensors by name, a model of neither."""
    args = parse("--arch", "resnet18", "--weights", str(tmp_path / "r50.pth"))
    torch.save(torchvision.models.resnet50().state_dict(), tmp_path / "r50.pth")
    with pytest.raises(training.UsageError) as refused:
        training.load_weights(torchvision.models.resnet18(num_classes=2), args)
    assert str(refused.value).startswith(
        f"--weights {tmp_path / 'r50.pth'}: weights of another model than --arch resnet18 ("
    )
    torch.save(
        {"model": torchvision.models.resnet50().state_dict(), "args": {"arch": "resnet50"}},
        tmp_path / "c.pth",
    )
    args.weights = str(tmp_path / "c.pth")
    with pytest.raises(
        training.UsageError, match="a checkpoint of --arch resnet50, not --arch resnet18"
    ):
        training.load_weights(torchvision.models.resnet18(num_classes=2), args)


@pytest.mark.parametrize("flag", ["--train-crop-size", "--val-resize-size", "--crop-size"])
def test_sizes_past_any_image_are_one_line(capsys, flag):
    with pytest.raises(SystemExit) as e:
        train_classify.parse_args(["--data", "x", flag, "50000"])
    assert e.value.code == 2
    assert capsys.readouterr().err.endswith("must be in [1, 8192], got 50000\n")


@pytest.mark.parametrize("edit", ["text", "cut short"])
def test_an_image_changed_while_the_run_trains_stops_it_before_its_epoch_is_saved(tmp_path, edit):
    """An image overwritten while the run trains: DALI read the new bytes in a later epoch without
    a word (a JPEG cut short) or died on them (text). The run stats its files at each epoch's end,
    while validation runs, and stops before the epoch's checkpoint, naming the file."""
    root = tiny_imagefolder(str(tmp_path / "d"), per_class=20)
    bad = os.path.join(root, "train", "b", "7.png")
    out = str(tmp_path / "o")
    proc = started_training(out, "--data", root, "--epochs", "3", "--print-freq", "1")
    with open(bad, "rb") as f:
        data = f.read()
    with open(bad, "wb") as f:
        f.write(b"notes, not an image\n" * 20 if edit == "text" else data[: len(data) // 2])
    epochs_before = len(records(out, "epoch"))
    _, stderr = proc.communicate(timeout=300)
    # found at the epoch's end, or where DALI failed on it first (text): named as changed
    assert_one_line_error(SimpleNamespace(returncode=proc.returncode, stderr=stderr))
    assert re.fullmatch(
        f"error: {re.escape(bad)}: (changed or gone since this run listed it \\(another size or "
        "modification time\\); the data must stay as listed for the whole run|changed since this "
        "run listed it \\(DALI: .+\\))",
        stderr.strip().splitlines()[-1],  # after a line of DALI's native decoder, if any
    ), stderr
    # the epoch it changed in is not saved (one more where the change came after that check)
    assert len(records(out, "epoch")) <= min(epochs_before + 1, 2)
    assert not records(out, "end")


def cut_short(data):  # a copy or download stopped at a third: the header whole
    return data[: len(data) // 3]


def broken_header(data):  # random bytes after the first marker
    return b"\xff\xd8\xff\xe0" + bytes(np.random.default_rng(0).integers(0, 256, 3000, np.uint8))


@pytest.mark.parametrize("device", ["cpu", pytest.param("gpu", marks=gpu)])
@pytest.mark.parametrize(
    "edit, why",
    [
        (broken_header, "its header is broken or cut short"),
        (cut_short, "its bytes stop before the JPEG's end"),
    ],
)
def test_a_jpeg_that_does_not_decode_whole_is_named_at_batch_32(tmp_path, device, edit, why):
    """DALI 2.4 killed training at -b 32 in 2 runs of 10 on a JPEG whose header breaks (a first
    batch's decode), and trained on one cut short without a word (nvJPEG and the CPU decoder
    decode what is there); both are refused, before DALI reads them."""
    root = tiny_imagefolder(str(tmp_path / "d"), per_class=20)
    bad = os.path.join(root, "train", "b", "photo.jpg")
    pixels = np.random.default_rng(1).integers(0, 256, (64, 64, 3), np.uint8)
    Image.fromarray(pixels).save(bad, quality=95)
    with open(bad, "rb") as f:
        data = f.read()
    with open(bad, "wb") as f:
        f.write(edit(data))
    env = os.environ if device == "gpu" else CPU_ENV
    proc = tiny_run(root, str(tmp_path / "o"), "--batch-size", "32", check=False, env=env)
    assert_one_line_error(proc, f"{bad}: cannot decode this image: {why}")


# ------------------------------------------------------------------------------------------
# commands from elsewhere: one meaning per command line, and the defaults that differ said
# ------------------------------------------------------------------------------------------

# Every flag of the anchors' parsers and README commands: torchvision's classification and
# segmentation references, timm's train.py, DALI's ResNet-50 example (and its older flags),
# pytorch/examples' imagenet main.py.
ANCHOR_FLAGS = {
    "torchvision": """--data-path --model --device -b --batch-size --epochs -j --workers --opt --lr
    --momentum --wd --weight-decay --norm-weight-decay --bias-weight-decay
    --transformer-embedding-decay --label-smoothing --mixup-alpha --cutmix-alpha --lr-scheduler
    --lr-warmup-epochs --lr-warmup-method --lr-warmup-decay --lr-step-size --lr-gamma --lr-min
    --print-freq --output-dir --resume --start-epoch --cache-dataset --sync-bn --test-only
    --auto-augment --ra-magnitude --augmix-severity --random-erase --amp --world-size --dist-url
    --model-ema --model-ema-steps --model-ema-decay --use-deterministic-algorithms --interpolation
    --val-resize-size --val-crop-size --train-crop-size --clip-grad-norm --ra-sampler --ra-reps
    --weights --backend --use-v2 --pretrained --apex --apex-opt-level""",
    "torchvision-segmentation": """--data-path --dataset --model --aux-loss --device -b
    --batch-size --epochs -j --workers --lr --momentum --wd --weight-decay --lr-warmup-epochs
    --lr-warmup-method --lr-warmup-decay --print-freq --output-dir --resume --start-epoch
    --test-only --use-deterministic-algorithms --world-size --dist-url --weights
    --weights-backbone --amp --backend --use-v2 --pretrained""",
    "timm": """-c --config --data-dir --dataset -d --train-split --val-split --train-num-samples
    --val-num-samples --dataset-download --class-map --input-img-mode --input-key --target-key
    --dataset-trust-remote-code --model --pretrained --pretrained-path --initial-checkpoint
    --resume --no-resume-opt --num-classes --gp --img-size --in-chans --input-size --crop-pct
    --mean --std --interpolation -b --batch-size -vb --validation-batch-size --channels-last
    --fuser --grad-accum-steps --grad-checkpointing --fast-norm --model-kwargs --head-init-scale
    --head-init-bias --torchcompile-mode --torchscript --torchcompile --device --amp --amp-dtype
    --amp-impl --model-dtype --no-ddp-bb --synchronize-step --opt --opt-eps --opt-betas --momentum
    --weight-decay --clip-grad --clip-mode --layer-decay --layer-decay-min-scale
    --layer-decay-no-opt-scale --opt-kwargs --sched --sched-on-updates --lr --lr-base
    --lr-base-size --lr-base-scale --lr-noise --lr-noise-pct --lr-noise-std --lr-cycle-mul
    --lr-cycle-decay --lr-cycle-limit --lr-k-decay --warmup-lr --min-lr --epochs --epoch-repeats
    --start-epoch --decay-milestones --decay-epochs --warmup-epochs --warmup-prefix
    --cooldown-epochs --patience-epochs --decay-rate --dr --no-aug --train-crop-mode --scale
    --ratio --hflip --vflip --color-jitter --color-jitter-prob --grayscale-prob
    --gaussian-blur-prob --aa --aug-repeats --aug-splits --jsd-loss --jsd --bce-loss --bce-sum
    --bce-target-thresh --bce-pos-weight --reprob --remode --recount --resplit --mixup --cutmix
    --cutmix-minmax --mixup-prob --mixup-switch-prob --mixup-mode --mixup-off-epoch --smoothing
    --train-interpolation --drop --drop-connect --drop-path --drop-block --bn-momentum --bn-eps
    --sync-bn --dist-bn --split-bn --model-ema --model-ema-force-cpu --model-ema-decay
    --model-ema-warmup --seed --worker-seeding --log-interval --recovery-interval
    --checkpoint-hist -j --workers --save-images --pin-mem --no-prefetcher --output --experiment
    --eval-metric --tta --local_rank --use-multi-epochs-loader --log-wandb --wandb-project
    --wandb-tags --wandb-resume-id""",
    "dali": """--arch -a -j --workers --epochs --start-epoch -b --batch-size --lr --learning-rate
    --momentum --weight-decay --wd --print-freq -p --resume -e --evaluate --pretrained --dali_cpu
    --data_loader --prof --deterministic --fp16-mode --loss-scale --channels-last -t --test
    --local_rank --sync_bn --opt-level --keep-batchnorm-fp32 --static-loss-scale
    --dynamic-loss-scale --disable_dali""",
    "examples": """-a --arch -j --workers --epochs --start-epoch -b --batch-size --lr --learning-rate
    --momentum --wd --weight-decay -p --print-freq --resume -e --evaluate --pretrained --world-size
    --rank --dist-url --dist-backend --seed --gpu --no-accel --multiprocessing-distributed
    --dummy""",
}


@pytest.mark.parametrize("anchor", sorted(ANCHOR_FLAGS))
def test_every_flag_of_the_anchors_is_taken_or_answered_in_its_own_line(anchor):
    """Each is ours (taken), or a line of its own that names it and says what to write: never a
    "did you mean" to an unrelated flag of ours (torchvision's --dataset coco was "did you mean
    --data?", timm's --remode pixel "did you mean --model?")."""
    import flags

    segmentation = anchor == "torchvision-segmentation"
    parser = __import__("train_segment" if segmentation else "train_classify").get_args_parser()
    for flag in ANCHOR_FLAGS[anchor].split():
        answer = flags.unknown_flag(parser, [flag])
        assert answer is None or (answer.startswith(f"{flag}: ") and "did you mean" not in answer)
    assert flags.unknown_flag(parser, ["--remode", "pixel"]) == (
        "--remode: timm's random-erase fill: not here; --random-erase fills the box with 0 after "
        "normalization (timm's const, torchvision's); leave it out"
    )
    assert flags.unknown_flag(parser, ["--sced"]).endswith("did you mean --sched?")  # a typo


# (command, the lines a fresh run's start-up gives of it)
DEFAULTS_SAID = [
    (
        "--data-path /data --model resnet50",  # torchvision's reference's form
        "note: defaults that differ from torchvision's reference: --lr-scheduler cosine (its: "
        "--lr-scheduler steplr), -b 256 on a GPU (its: -b 32), --lr-base 0.1 per 256 images "
        "(its: --lr 0.1)\n",
    ),
    (
        "-a resnet50 --dali_cpu -b 256 /data",  # DALI's example's
        "note: defaults that differ from DALI's ResNet-50 example: --lr-scheduler cosine (its: "
        "--lr-scheduler step, the nearest: it decays at epochs 30, 60 and 80), --lr-warmup-epochs "
        "0 (its: --lr-warmup-epochs 5)\n",
    ),
    (
        "-a resnet18 --lr 0.1 --epochs 90 /data",  # DALI's example's or pytorch/examples'
        "note: --lr 0.1 is the learning rate itself here, as in pytorch/examples' main.py; DALI's "
        "ResNet-50 example scales its --lr by the global batch / 256: for that rate, write "
        "--lr-base 0.1\n"
        "note: defaults that differ from DALI's ResNet-50 example: --lr-scheduler cosine (its: "
        "--lr-scheduler step, the nearest: it decays at epochs 30, 60 and 80), --lr-warmup-epochs "
        "0 (its: --lr-warmup-epochs 5)\n"
        "note: defaults that differ from pytorch/examples' main.py: --lr-scheduler cosine (its: "
        "--lr-scheduler step), -b 256 on a GPU (its: -b 256 shared by the node's GPUs: here -b is "
        "each GPU's)\n",
    ),
    (
        "--data demo --lr-scheduler step",
        "note: --data demo's own settings: --train-crop-size 64 (else 224), --val-resize-size 73 "
        "(else 256), --val-crop-size 64 (else 224), --arch resnet18 (else resnet50), --epochs 6 "
        "(else 90), --lr-base 0.2 (else 0.1), --print-freq 10 (else 50)\n",
    ),
    (
        "--data-path /data --model resnet18 --lr 0.5 --lr-scheduler steplr --lr-warmup-epochs 5 "
        "--epochs 2 --model-ema -b 32",
        "note: defaults that differ from torchvision's reference: --lr-warmup-method linear (its: "
        "--lr-warmup-method constant)\n"
        "note: --lr-warmup-epochs 5 lasts the whole run (--epochs 2): the rate never reaches its "
        "peak and --lr-scheduler step never starts; --model-ema copies the weights at each update\n",
    ),
    (
        "--data-path /data --model resnet18 --lr 0.1 --lr-scheduler steplr -b 32 --warmup-lr 1e-5 "
        "--model-ema-steps 8 --opt adamw --momentum 0.8 --min-lr 0.001 --lr-base-scale sqrt",
        "note: --lr-base-scale sqrt has no effect: --lr is the rate itself and wins, as in timm\n"
        "note: --lr-min 0.001 has no effect: only --lr-scheduler cosine takes it\n"
        "note: --model-ema-steps 8 has no effect: only --model-ema takes it\n"
        "note: --momentum 0.8 has no effect: only --opt sgd takes it\n"
        "note: --warmup-lr 1e-05 has no effect: the run has no warm-up (--lr-warmup-epochs)\n",
    ),
    (
        "--data /data --decoder cpu --hw-decoder-load 0.5",
        "note: defaults that differ from torchvision's reference: --arch resnet50 (its: --arch "
        "resnet18), --lr-scheduler cosine (its: --lr-scheduler steplr), -b 256 on a GPU (its: -b "
        "32), --lr-base 0.1 per 256 images (its: --lr 0.1)\n"
        "note: --hw-decoder-load 0.5 has no effect: only --decoder mixed takes it\n",
    ),
    ("--data-path /data --model resnet18 --lr 0.1 --lr-scheduler steplr -b 32", ""),
    ("--data /data --resume run/checkpoint.pth", ""),  # its run's flags: resume.py's lines
]


@pytest.mark.parametrize("command, told", DEFAULTS_SAID)
def test_a_fresh_run_names_the_defaults_that_differ_from_its_commands_anchor(command, told, capsys):
    train_classify.parse_args(command.split())
    assert capsys.readouterr().out == told


TWO_VALUES = " give one flag two values; pass one of them"


@pytest.mark.parametrize(
    "command, told",
    [
        ("--smoothing 0.1 --label-smoothing 0.2", "--smoothing 0.1 and --label-smoothing 0.2"),
        ("--sched cosine --lr-scheduler steplr", "--sched cosine and --lr-scheduler steplr"),
        ("-a resnet50 --arch resnet18", "-a resnet50 and --arch resnet18"),
        ("--data-path /y", "--data /x and --data-path /y"),
        ("--dali_cpu --dali-device gpu", "--dali_cpu and --dali-device gpu"),
        ("--lr 0.1 --learning-rate=0.2", "--lr 0.1 and --learning-rate 0.2"),
        ("--model-ema --no-model-ema", "--model-ema and --no-model-ema"),
    ],
)
def test_an_alias_beside_its_flag_with_another_value_is_refused_naming_both(command, told, capsys):
    with pytest.raises(SystemExit) as e:
        train_classify.parse_args(["--data", "/x", *command.split()])
    assert e.value.code == 2 and capsys.readouterr().err == f"error: {told}{TWO_VALUES}\n"
    # the same value under both names is one meaning: taken
    same = train_classify.parse_args(
        ["--data", "/x", "--sched", "steplr", "--lr-scheduler", "step"]
    )
    assert same.lr_scheduler == "step"
    # --crop-size (timm's --img-size) sets both crops: beside either, one line
    with pytest.raises(SystemExit) as e:
        train_classify.parse_args(["--data", "/x", "--img-size", "192", "--train-crop-size", "176"])
    assert e.value.code == 2 and capsys.readouterr().err == (
        "error: --crop-size 192 sets --train-crop-size and --val-crop-size; --train-crop-size 176 "
        "too: pass one of the two\n"
    )


@pytest.mark.parametrize("script", ["train_classify.py", "train_segment.py"])
def test_a_torchvision_that_does_not_load_beside_torch_is_one_line(tmp_path, script):
    """A CUDA torchvision beside a CPU torch cannot load its operators ("operator
    torchvision::nms does not exist", a 20-line traceback): one line names the versions installed
    and how to install a matching pair."""
    from importlib import metadata

    (tmp_path / "torchvision").mkdir()
    (tmp_path / "torchvision" / "__init__.py").write_text(
        "raise RuntimeError('operator torchvision::nms does not exist')\n"
    )
    env = {**CPU_ENV, "PYTHONPATH": str(tmp_path)}
    proc = run("--data", "demo", check=False, env=env, script=os.path.join(HERE, script))
    installed = ", ".join(
        sorted(f"{name} {metadata.version(name)}" for name in ("torch", "torchvision"))
    )
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith(
        "error: torch, torchvision and DALI do not load together (operator torchvision::nms does "
        "not exist); installed: nvidia-dali-"
    )
    assert installed in proc.stderr and "pip install torch torchvision --index-url" in proc.stderr


def test_a_copy_without_data_processing_answers_data_demo_in_one_line(tmp_path):
    folder = tmp_path / "copy"
    folder.mkdir()
    copied = ("pipelines.py", "data_sources.py", "training.py", "flags.py", "outputs.py")
    for name in ("train_classify.py", *copied):  # README.md's five, and no data_processing.py
        shutil.copy(os.path.join(HERE, name), folder)
    env = {k: v for k, v in CPU_ENV.items() if k != "PYTHONPATH"}
    proc = run("--data", "demo", check=False, env=env, cwd=str(folder), script="train_classify.py")
    assert (proc.returncode, proc.stderr) == (
        2,
        "error: --data demo needs data_processing.py beside train_classify.py (README.md: What "
        "to copy)\n",
    )
