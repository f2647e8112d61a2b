"""A checkpoint of N processes resumed on M (2 -> 1, 1 -> 2, 2 -> 3 -> 1), on the CPU under torchrun
with gloo: the global batch, the steps per epoch and the lr schedule are as they were, and the
interrupted epoch's samples are trained on exactly once across the runs; a checkpoint taken in the
rest of that epoch is of its first run's shape and resumes the same way. A global batch the new
processes cannot share, or a -b that gives another, is refused in one line."""

import json
import math
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
from PIL import Image

from conftest import id_coded_root
from make_shards import make_shards
from test_ddp import CPU_ENV, HERE

N_TRAIN = 48  # one image a class: a training batch's labels name its samples
GLOBAL_BATCH = 6  # 8 steps an epoch; 48 samples fill them, none repeated

# Runs the trainer named by {script}, unchanged; appends [epoch, step, sample ids] of each training
# step of this process to $SPY_OUT/seen<RANK>.jsonl, the ids its labels (one image a class) or its
# masks' foreground pixels (pair k has k + 1). With STOP_AT=epoch,step every process signals
# itself after that step, as a preemption does; they agree on a step and save it.
SPY = """
import json, os, runpy, signal, sys
sys.path.insert(0, {here!r})
import training
epoch_of = training.StepLog.epoch

def spy_epoch(self, batches, epoch, *args, **kwargs):
    seen = os.path.join(os.environ["SPY_OUT"], f"seen{{os.environ['RANK']}}.jsonl")
    for step, batch in epoch_of(self, batches, epoch, *args, **kwargs):
        ids = batch[1].flatten(1).sum(1) if batch[1].dim() > 1 else batch[1]
        with open(seen, "a") as f:
            f.write(json.dumps([epoch, step, ids.tolist()]) + "\\n")
        yield step, batch
        if os.environ.get("STOP_AT") == f"{{epoch}},{{step}}":
            os.kill(os.getpid(), signal.SIGTERM)

training.StepLog.epoch = spy_epoch
sys.argv = [{script!r}] + sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""

CLASSIFY = [
    "--arch",
    "resnet18",
    "--train-crop-size",
    "32",
    "--val-crop-size",
    "32",
    "--val-resize-size",
    "36",
    "--workers",
    "1",
    "--dali-device",
    "cpu",
    "--print-freq",
    "1",
]
SEGMENT = ["--size", "32", "--unet-width", "8", "--workers", "1", "--dali-device", "cpu"]
SEGMENT += ["--print-freq", "1"]


def torchrun(tmp_path, trainer, nproc, *flags, phase, stop_at=None):
    """``trainer`` under torchrun with ``nproc`` processes, spied on (SPY); its samples go to
    tmp_path/``phase``/."""
    script = tmp_path / "spy.py"
    script.write_text(SPY.format(here=HERE, script=os.path.join(HERE, trainer)))
    os.makedirs(tmp_path / phase)
    env = {**CPU_ENV, "SPY_OUT": str(tmp_path / phase), "STOP_AT": stop_at or ""}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    cmd += [f"--nproc_per_node={nproc}", str(script), *flags]
    return subprocess.run(cmd, cwd=HERE, capture_output=True, text=True, timeout=600, env=env)


def seen(folder):
    """{(epoch, step): [the step's sample ids, rank 0's first]} of one run."""
    steps = {}
    for rank in range(len(list(folder.glob("seen*.jsonl")))):
        for line in (folder / f"seen{rank}.jsonl").read_text().splitlines():
            epoch, step, ids = json.loads(line)
            steps.setdefault((epoch, step), []).extend(ids)
    return steps


def records(out, kind):
    with open(out / "metrics.jsonl") as f:
        return [r for r in map(json.loads, f) if r["type"] == kind]


def make_classify_data(root):
    for split, n in (("train", N_TRAIN), ("val", 4)):
        for i in range(n):
            os.makedirs(root / split / f"c{i:02d}")
            Image.new("RGB", (40, 40), (5 * i, 90, 160)).save(root / split / f"c{i:02d}" / "0.png")


def run_in_shapes(tmp_path, trainer, flags, sizes, stops):
    """Runs ``trainer`` on each of ``sizes`` processes in turn, the same command each time (the
    first's -b, --resume auto: a requeued job's), each stopped at its ``stops`` (epoch, step);
    returns each stopped run's checkpoint, and each run's samples by (epoch, step)."""
    batch = ["--batch-size", str(GLOBAL_BATCH // sizes[0])]
    out = tmp_path / "out"
    flags = [*flags, *batch, "--epochs", "2", "--output-dir", str(out), "--resume", "auto"]
    saved, runs = [], []
    for k, (size, stop) in enumerate(zip(sizes, stops)):
        proc = torchrun(tmp_path, trainer, size, *flags, phase=f"run{k}", stop_at=stop)
        if stop:
            assert proc.returncode != 0 and "stopped by SIGTERM" in proc.stderr, proc.stderr[-3000:]
            saved.append(torch.load(out / "checkpoint.pth", weights_only=True))
        else:
            assert proc.returncode == 0, proc.stderr[-3000:]
        if k:
            then, batch = saved[k - 1]["world_size"], saved[k - 1]["args"]["batch_size"]
            told = (
                f"taken with {then} process(es) x batch {batch}, goes on with {size} x "
                f"{GLOBAL_BATCH // size}, the same global batch {GLOBAL_BATCH}; the rest of epoch 1 "
                f"reads its run's {then} shard(s) as they would have, each remaining sample once"
            )
            assert told in proc.stdout, proc.stdout[-3000:]
        runs.append(seen(tmp_path / f"run{k}"))
    return saved, runs


def assert_each_sample_once_an_epoch(saved, runs, expected):
    """Epoch 1 across the runs, each run's steps up to its checkpoint's, and epoch 2: each sample
    exactly once, in 8 steps of the global batch."""
    epochs, done = {1: {}, 2: {}}, 0
    for k, steps in enumerate(runs):
        last = saved[k]["step"] if k < len(saved) else math.inf
        for (epoch, step), ids in steps.items():
            if epoch == 2 or done < step <= last:
                assert step not in epochs[epoch] and len(ids) == GLOBAL_BATCH, (k, epoch, step)
                epochs[epoch][step] = ids
        done = last
    for epoch, steps in epochs.items():
        assert sorted(steps) == list(range(1, 9)), (epoch, sorted(steps))
        assert sorted(sum(steps.values(), [])) == sorted(expected), (epoch, steps)


def assert_schedule_and_loss_as_one_run(out):
    """Every global step logged once, in order, at the cosine schedule's lr of that step; the
    epochs' mean loss is that of their steps' logged losses."""
    train = records(out, "train")
    assert [r["global_step"] for r in train] == list(range(1, 17))
    (config, *_) = records(out, "config")
    lr, total = config["lr"], 16
    for r in train:  # the lr after the step, as torch's CosineAnnealingLR gives it
        expected = lr * (1 + math.cos(math.pi * r["global_step"] / total)) / 2
        assert math.isclose(r["lr"], expected, rel_tol=1e-6, abs_tol=1e-9), (r, expected)
    for e in records(out, "epoch"):
        losses = [r["loss"] for r in train if r["epoch"] == e["epoch"]]
        assert math.isclose(e["train_loss"], sum(losses) / len(losses), rel_tol=1e-5)
    assert [e["epoch"] for e in records(out, "epoch")] == [1, 2]


@pytest.mark.parametrize(
    "layout,sizes,stops",
    [
        ("folder", [2, 1], ["1,2", None]),
        ("folder", [1, 2], ["1,3", None]),
        # stopped again in the rest of the epoch: that checkpoint is of 2 processes, resumed on 1
        ("folder", [2, 3, 1], ["1,2", "1,5", None]),
        ("tfrecord", [2, 3], ["1,2", None]),
        ("wds", [3, 2], ["1,2", None]),
    ],
)
def test_classify_resumes_on_another_number_of_processes(tmp_path, layout, sizes, stops):
    make_classify_data(tmp_path / "png")
    data = tmp_path / "png"
    if layout != "folder":
        data = tmp_path / layout
        make_shards(str(tmp_path / "png"), str(data), layout, 5, 0)
    flags = ["--data", str(data), *CLASSIFY]
    saved, runs = run_in_shapes(tmp_path, "train_classify.py", flags, sizes, stops)
    # each mid-epoch 1, of the first run's shape: also the second's, taken in the epoch's rest
    size = sizes[0]
    for ckpt in saved:
        assert ckpt["world_size"] == size and ckpt["args"]["batch_size"] == GLOBAL_BATCH // size
        assert len(ckpt["dali"]) == len(ckpt["rng"]) == len(ckpt["loss_sum"]) == size
        assert ckpt["epoch"] == 1 and 1 < ckpt["step"] < 8
    assert [ckpt["step"] for ckpt in saved] == sorted({ckpt["step"] for ckpt in saved})
    assert_each_sample_once_an_epoch(saved, runs, list(range(N_TRAIN)))
    assert_schedule_and_loss_as_one_run(tmp_path / "out")
    final = torch.load(tmp_path / "out" / "checkpoint.pth", weights_only=True)
    assert (final["world_size"], final["first_epoch"], final["steps"]) == (sizes[-1], 2, 8)


def test_segment_resumes_on_another_number_of_processes(tmp_path):
    """Pair k's mask has k + 1 foreground pixels: its id; 48 training pairs, 4 validation."""
    root = tmp_path / "prepared"
    expected = id_coded_root(root, 52, valid_fraction=1 / 13, grey_step=4)["train"]
    assert len(expected) == N_TRAIN
    flags = ["--data", str(root), *SEGMENT]
    saved, runs = run_in_shapes(tmp_path, "train_segment.py", flags, [2, 3], ["1,2", None])
    assert saved[0]["world_size"] == 2 and 1 < saved[0]["step"] < 8
    assert_each_sample_once_an_epoch(saved, runs, expected)
    train = records(tmp_path / "out", "train")
    assert [r["global_step"] for r in train] == list(range(1, 17))


def test_a_global_batch_the_processes_cannot_share_or_another_b_is_refused(tmp_path):
    make_classify_data(tmp_path / "png")
    out = tmp_path / "out"
    flags = ["--data", str(tmp_path / "png"), *CLASSIFY, "--epochs", "1", "--output-dir", str(out)]
    first = torchrun(tmp_path, "train_classify.py", 1, *flags, "-b", "6", phase="run0")
    assert first.returncode == 0, first.stderr[-3000:]
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    path = out / "checkpoint.pth"
    shares = torchrun(tmp_path, "train_classify.py", 4, *flags, "--resume", "auto", phase="run1")
    wrong_b = torchrun(
        tmp_path, "train_classify.py", 2, *flags, "-b", "4", "--resume", str(path), phase="run2"
    )
    for proc, told in (
        (
            shares,
            f"error: --resume {path}: taken with 1 process(es) x batch 6, a global batch of 6, "
            f"which 4 processes cannot share evenly; run on 1, 2 or 3 process(es), or --weights it",
        ),
        (
            wrong_b,
            f"error: --resume {path}: taken with 1 process(es) x batch 6: -b 4 on 2 processes "
            f"gives a global batch of 8, not its 6; pass -b 3 (or no -b), or --weights it",
        ),
    ):
        assert proc.returncode != 0 and told in proc.stderr.splitlines(), proc.stderr[-3000:]
        assert 'training.py", line' not in proc.stderr  # no trace of ours; torchrun has its own
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


@pytest.mark.parametrize("ra_sampler", [False, True])
def test_training_pipelines_that_start_at_a_later_epoch_count_on_from_it(tmp_path, ra_sampler):
    """What a run on another number of processes builds after the interrupted epoch: pipelines that
    start with epoch 2 crop at epoch 2's --progressive-resize size, draw --ra-sampler's order of
    epoch 2, and do not replay epoch 1's order."""
    import train_classify
    from pipelines import classify_iterator

    for i in range(256):  # --ra-sampler keeps len // 256 * 256 samples an epoch
        os.makedirs(tmp_path / "train" / f"c{i:03d}")
        Image.new("RGB", (40, 40), (i, 90, 160)).save(tmp_path / "train" / f"c{i:03d}" / "0.png")
    flags = ["--data", str(tmp_path), "--batch-size", "32", "--dali-device", "cpu", "--workers"]
    flags += ["1", "--train-crop-size", "96", "--progressive-resize", "32", "1", "3"]
    args = train_classify.parse_args(flags + ["--ra-sampler"] * ra_sampler)
    world = SimpleNamespace(rank=0, size=1, local_rank=0)

    def epochs(first_epoch, count):
        """(crop sizes, labels) of each of ``count`` epochs of a pipeline starting with
        ``first_epoch``."""
        pipe = train_classify.make_train_pipeline(args, world, None, None, first_epoch)
        loader, seen = classify_iterator(pipe), []
        for _ in range(count):
            batches = [(b[0]["data"].shape[-1], b[0]["label"].flatten().tolist()) for b in loader]
            seen.append(({size for size, _ in batches}, sum((ids for _, ids in batches), [])))
        return seen

    (sizes1, order1), (sizes2, order2) = epochs(1, 2)
    ((later_sizes, later),) = epochs(2, 1)
    assert (sizes1, sizes2, later_sizes) == ({32}, {64}, {64})
    assert later != order1 and sorted(later) == sorted(order2)
    if ra_sampler:  # its order is a function of the seed and the epoch alone
        assert later == order2
