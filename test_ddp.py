"""train_classify.py under torchrun with two CPU processes (gloo, DALI CPU-only; any GPU hidden): every training
step on every rank sees full batches of real images only, validation sees every image exactly once, and the
job shuts down cleanly, also when one rank fails; the segmentation trainer's logged Dice is its checkpoint's.
On a machine with GPUs, more processes than GPUs are refused with one line."""

import functools
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
N_TRAIN, N_VAL = 17, 9  # odd: the shards differ by one sample
BATCH = 4
# every process on the CPU, as on a machine without a GPU, whatever this one has
CPU_ENV = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}

# Runs train_classify.py as a script, unchanged; records which images each rank's DALI batches held (every
# image is one solid colour, so a crop of it still says which it was) and how many times the model's first
# BatchNorm layer updated its running statistics.
SPY = """
import atexit, json, os, runpy, sys
sys.path.insert(0, {here!r})
import torch, torchvision
from nvidia.dali.plugin.pytorch import DALIGenericIterator
from pipelines import IMAGENET_MEAN, IMAGENET_STD, ClassifyTrainPipeline

events, bn = {{"train": [], "val": []}}, []
mean, std = torch.tensor(IMAGENET_MEAN)[:, None, None], torch.tensor(IMAGENET_STD)[:, None, None]
next_batch, get_model = DALIGenericIterator.__next__, torchvision.models.get_model

def spy_next(self):
    split = "train" if isinstance(self._pipes[0], ClassifyTrainPipeline) else "val"
    if getattr(self, "_first_batch", None) is not None:  # handing over the batch it read when it was built
        return next_batch(self)
    try:
        batch = next_batch(self)
    except StopIteration:
        events[split].append(None)  # the end of a pass
        raise
    images = batch[0]["data"].float()
    events[split].append([int(round(float((im * std + mean)[0].mean()))) for im in images])
    return batch

def spy_get_model(*args, **kwargs):
    model = get_model(*args, **kwargs)
    bn.append(model.bn1)
    return model

@atexit.register
def dump():
    passes = {{split: [[]] for split in events}}
    for split, batches in events.items():
        for batch in batches:
            passes[split][-1].append(batch) if batch is not None else passes[split].append([])
    with open(os.path.join({out!r}, f"rank{{os.environ['RANK']}}.json"), "w") as f:
        json.dump({{"passes": {{k: v[:-1] for k, v in passes.items()}},
                   "bn_updates": int(bn[0].num_batches_tracked) if bn else None}}, f)

DALIGenericIterator.__next__, torchvision.models.get_model = spy_next, spy_get_model
sys.argv = [os.path.join({here!r}, "train_classify.py")] + sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def torchrun(tmp_path, *flags, port, script=None, nproc=2, env=CPU_ENV):
    if script is None:
        script = tmp_path / "spy.py"
        script.write_text(SPY.format(here=HERE, out=str(tmp_path)))
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            f"--nproc_per_node={nproc}",
            f"--master_port={port}",
            str(script),
            "--data",
            str(tmp_path / "data"),
            "--arch",
            "resnet18",
            "--train-crop-size",
            "64",
            "--val-crop-size",
            "64",
            "--val-resize-size",
            "64",
            "--batch-size",
            str(BATCH),
            "--workers",
            "1",
            "--dali-device",
            "cpu",
            "--print-freq",
            "1",
            "--output-dir",
            str(tmp_path / "out"),
            *flags,
        ],
        cwd=HERE,
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )


def two_class_folder(root, train, val):
    """An ImageFolder root of two classes of small PNGs: ``train`` and ``val`` images."""
    for split, n in (("train", train), ("val", val)):
        for i in range(n):
            os.makedirs(root / split / f"c{i % 2}", exist_ok=True)
            Image.fromarray(np.full((64, 80, 3), (i % 250, 90, 160), np.uint8)).save(
                root / split / f"c{i % 2}" / f"{i}.png"
            )


# A small, quick run on the CPU: the flags of the tests that start train_classify.py themselves.
TINY_RUN = [
    "--arch",
    "resnet18",
    "--train-crop-size",
    "32",
    "--val-crop-size",
    "32",
    "--val-resize-size",
    "32",
    "--batch-size",
    str(BATCH),
    "--workers",
    "1",
    "--dali-device",
    "cpu",
    "--print-freq",
    "1",
]


def make_data(root):
    for split, n in (("train", N_TRAIN), ("val", N_VAL)):
        for i in range(n):
            os.makedirs(root / split / f"c{i % 2}", exist_ok=True)
            # red channel = 10 * (i + 1): the image's id, readable after crop, resize and flip
            Image.fromarray(np.full((64, 80, 3), (10 * (i + 1), 90, 160), np.uint8)).save(
                root / split / f"c{i % 2}" / f"{i}.png"
            )


def test_two_processes_train_on_real_samples_and_validate_each_once(tmp_path):
    make_data(tmp_path / "data")
    proc = torchrun(tmp_path, "--epochs", "2", port=29517)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "destroy_process_group" not in proc.stderr  # shut down cleanly
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text())["passes"] for r in range(2)]
    bn_updates = [
        json.loads((tmp_path / f"rank{r}.json").read_text())["bn_updates"] for r in range(2)
    ]

    # training: equal step counts, full batches of nothing but real images, every image at least once
    steps = -(-((N_TRAIN + 1) // 2) // BATCH)  # the larger shard's batches: 9 samples -> 3
    assert len(ranks[0]["train"]) == len(ranks[1]["train"]) == 2  # epochs
    for epoch in range(2):
        batches = [ranks[r]["train"][epoch] for r in range(2)]
        assert [len(b) for b in batches] == [steps, steps]
        assert all(len(batch) == BATCH for b in batches for batch in b)
        assert set(sum(batches[0] + batches[1], [])) == {10 * (i + 1) for i in range(N_TRAIN)}
    # BatchNorm statistics moved once per training step, each a full batch of real images
    assert bn_updates == [2 * steps, 2 * steps]

    # validation: a pass beside the first epoch's steps, then once per epoch; together the ranks see each image once
    assert len(ranks[0]["val"]) == len(ranks[1]["val"]) == 3
    for k in range(3):
        ids = [sum(ranks[r]["val"][k], []) for r in range(2)]
        assert not set(ids[0]) & set(ids[1]), ids
        assert sorted(ids[0] + ids[1]) == [10 * (i + 1) for i in range(N_VAL)], ids
    with open(tmp_path / "out" / "metrics.jsonl") as f:
        epochs = [r for r in map(json.loads, f) if r["type"] == "epoch"]
    assert [r["epoch"] for r in epochs] == [1, 2]
    # each epoch's record holds every process's peak memory, gathered; its line the largest
    for epoch in epochs:
        assert [m["rank"] for m in epoch["memory"]] == [0, 1]
        peaks = [m["host_rss_peak"] for m in epoch["memory"]]
        assert all(type(peak) is int and peak > 10**8 for peak in peaks)
        assert f"  host_rss_peak {max(peaks) / 1e9:.1f} GB\n" in proc.stdout


# Runs train_classify.py, unchanged, noting each shard that a process scans to build its index.
INDEX_SPY = """
import os, runpy, sys
sys.path.insert(0, {here!r})
import data_sources
scan = data_sources._scan_shard

def spy_scan(shard, layout):
    with open({log!r}, "a") as f:
        f.write(f"{{os.environ['LOCAL_RANK']}} {{os.path.basename(shard)}}\\n")
    return scan(shard, layout)

data_sources._scan_shard = spy_scan
sys.argv = [os.path.join({here!r}, "train_classify.py")] + sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def test_one_process_per_node_indexes_the_shards(tmp_path):
    from make_shards import make_shards

    make_data(tmp_path / "png")
    make_shards(str(tmp_path / "png"), str(tmp_path / "data"), "wds", 4, 0)
    shards = sorted(
        f
        for split in ("train", "val")
        for f in os.listdir(tmp_path / "data" / split)
        if f.endswith(".tar")
    )
    for split in ("train", "val"):
        for f in os.listdir(tmp_path / "data" / split):
            if ".idx" in f:
                os.remove(tmp_path / "data" / split / f)
    script = tmp_path / "spy.py"
    script.write_text(INDEX_SPY.format(here=HERE, log=str(tmp_path / "scans.log")))
    proc = torchrun(tmp_path, "--epochs", "1", port=29524, script=str(script))
    assert proc.returncode == 0, proc.stderr[-3000:]
    scans = (tmp_path / "scans.log").read_text().split("\n")[:-1]
    assert sorted(scans) == sorted(
        f"0 {shard}" for shard in shards
    )  # each shard once, by local rank 0


def test_a_failing_rank_ends_the_job_with_its_error_line(tmp_path):
    make_data(tmp_path / "data")
    bad = tmp_path / "data" / "train" / "c1" / "3.png"  # in one rank's shard only
    bad.write_bytes(b"\x89PNG\r\n\x1a\n broken")
    proc = torchrun(
        tmp_path, "--epochs", "1", port=29518, script=os.path.join(HERE, "train_classify.py")
    )
    assert proc.returncode != 0
    assert f"error: {bad}: cannot decode this image" in proc.stderr, proc.stderr[-3000:]
    assert "destroy_process_group" not in proc.stderr


def test_two_process_segmentation_dice_equals_one_process_evaluation_of_its_checkpoint(tmp_path):
    """DDP leaves each process with the BatchNorm statistics of its own last batches; the trainer must give
    every process rank 0's before validating, so the logged Dice is the saved model's."""
    common = ["--data", "demo", "-b", "8", "--workers", "1", "--dali-device", "cpu"]
    env = CPU_ENV
    trained = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node=2",
            "--master_port=29519",
            "train_segment.py",
            *common,
            "--epochs",
            "1",
            "--output-dir",
            str(tmp_path / "out"),
        ],
        cwd=HERE,
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert trained.returncode == 0, trained.stderr[-3000:]
    with open(tmp_path / "out" / "metrics.jsonl") as f:
        (logged,) = [r for r in map(json.loads, f) if r["type"] == "epoch"]
    checkpoint = ["--resume", str(tmp_path / "out" / "checkpoint.pth"), "--evaluate"]
    for launcher in (
        [sys.executable],
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node=2",
            "--master_port=29520",
        ],
    ):
        proc = subprocess.run(
            [*launcher, "train_segment.py", *common, *checkpoint],
            cwd=HERE,
            capture_output=True,
            text=True,
            timeout=600,
            env=env,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert f"eval: val_dice {logged['val_dice']:.5g}  val_iou {logged['val_iou']:.5g}  " in (
            proc.stdout
        ), (
            logged,
            proc.stdout[-500:],
        )


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_more_processes_than_gpus_is_refused_with_one_line(tmp_path):
    make_data(tmp_path / "data")
    gpus = torch.cuda.device_count()
    proc = torchrun(
        tmp_path,
        "--epochs",
        "1",
        port=29521,
        script=os.path.join(HERE, "train_classify.py"),
        nproc=gpus + 1,
        env=os.environ,
    )
    assert proc.returncode != 0
    assert (
        f"error: LOCAL_RANK {gpus}: this machine shows {gpus} CUDA device(s) and each process needs one; "
        f"start at most that many (torchrun --nproc_per_node)"
    ) in proc.stderr, proc.stderr[-3000:]
    assert (
        "invalid device ordinal" not in proc.stderr and "destroy_process_group" not in proc.stderr
    )


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGUSR1, signal.SIGHUP, signal.SIGUSR2])
def test_a_stop_signal_to_the_launcher_stops_every_rank_at_one_step_with_one_checkpoint(
    tmp_path, signum
):
    """launch.py passes SIGTERM (a preemption) and SIGUSR1 (SLURM's warning) on to every process:
    they agree on one step, rank 0 saves the checkpoint of that step with both ranks' DALI and
    random state, says so once, the launcher exits 128 + the signal without a traceback, and the
    run resumes from it."""
    two_class_folder(tmp_path / "data", train=160, val=8)
    cmd = [
        sys.executable,
        os.path.join(HERE, "launch.py"),
        "--nproc_per_node=2",
        "--master_port=29522",
        os.path.join(HERE, "train_classify.py"),
        "--data",
        str(tmp_path / "data"),
        *TINY_RUN,
        "--epochs",
        "1",
        "--output-dir",
        str(tmp_path / "out"),
    ]
    proc = started_to_train(cmd, tmp_path / "out")
    metrics = tmp_path / "out" / "metrics.jsonl"
    proc.send_signal(signum)
    stderr = proc.communicate(timeout=300)[1]
    assert proc.returncode == 128 + signum and "Traceback" not in stderr, stderr[-3000:]
    ckpt = torch.load(tmp_path / "out" / "checkpoint.pth", weights_only=True)
    assert (
        ckpt["world_size"] == 2
        and len(ckpt["dali"]) == len(ckpt["rng"]) == len(ckpt["loss_sum"]) == 2
    )
    assert 2 <= ckpt["step"] < 20  # 80 samples a rank, batch 4
    assert stderr.count(f"stopped by {signum.name} at epoch 1 step") == 1, stderr[-3000:]
    assert f"step {ckpt['step']}: saved {tmp_path / 'out' / 'checkpoint.pth'}" in stderr
    resumed = subprocess.run(
        cmd[:3]
        + ["--master_port=29523"]
        + cmd[4:]
        + ["--resume", str(tmp_path / "out" / "checkpoint.pth")],
        cwd=HERE,
        capture_output=True,
        text=True,
        timeout=600,
        env=CPU_ENV,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    train = [
        json.loads(r) for r in metrics.read_text().splitlines() if json.loads(r)["type"] == "train"
    ]
    assert [r["global_step"] for r in train] == list(range(1, 21))


# Runs train_classify.py, unchanged, and SIGKILLs rank 1 once, right after training step {step} of
# the first epoch (a process lost mid-epoch); a marker file says it was done, so the workers that
# torchrun restarts run on.
KILL_ONCE = """
import os, runpy, signal, sys
sys.path.insert(0, {here!r})
import training
after_step = training.StepLog.after_step

def after_step_then_die(self, step):
    after_step(self, step)
    if os.environ["RANK"] == "1" and self.epoch_no == 1 and step == {step}:
        if not os.path.exists({marker!r}):
            open({marker!r}, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)

training.StepLog.after_step = after_step_then_die
sys.argv = [os.path.join({here!r}, "train_classify.py")] + sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def test_torchrun_restarts_a_killed_worker_and_the_job_ends_as_an_uninterrupted_one(tmp_path):
    """torchrun --max-restarts with --resume auto: a worker SIGKILLed mid-epoch, torchrun restarts
    both, the same command continues from the last --checkpoint-every checkpoint, and the job ends
    with the weights and the logged steps of an uninterrupted run."""
    make_data(tmp_path / "data")
    killer = tmp_path / "kill_once.py"
    marker = tmp_path / "killed"
    killer.write_text(KILL_ONCE.format(here=HERE, step=2, marker=str(marker)))
    flags = [
        "--data",
        str(tmp_path / "data"),
        *TINY_RUN,
        "--epochs",
        "2",
        "--checkpoint-every",
        "1",
        "--resume",
        "auto",
    ]

    def job(script, out):
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node=2",
            "--max-restarts=2",
            str(script),
            *flags,
            "--output-dir",
            str(tmp_path / out),
        ]
        return subprocess.run(
            cmd, cwd=HERE, capture_output=True, text=True, timeout=600, env=CPU_ENV
        )

    whole = job(os.path.join(HERE, "train_classify.py"), "whole")
    assert whole.returncode == 0, whole.stderr[-3000:]
    broken = job(killer, "broken")
    assert broken.returncode == 0 and marker.exists(), broken.stderr[-3000:]
    with open(tmp_path / "broken" / "metrics.jsonl") as f:
        resumed = [r for r in map(json.loads, f) if r["type"] == "resume"]
    assert [(r["epoch"], r["step"]) for r in resumed] == [(1, 2)]
    a, b = (
        torch.load(tmp_path / out / "checkpoint.pth", weights_only=True)
        for out in ("whole", "broken")
    )
    assert a["model"].keys() == b["model"].keys()
    assert (
        max((a["model"][k].double() - b["model"][k].double()).abs().max() for k in a["model"])
        <= 1e-6
    )

    def steps(out):
        with open(tmp_path / out / "metrics.jsonl") as f:
            return [
                (r["epoch"], r["step"], r["loss"])
                for r in map(json.loads, f)
                if r["type"] == "train"
            ]

    assert steps("broken") == steps("whole")
    # the same command once more, as a requeue after the end: one line, nothing trained
    again = job(os.path.join(HERE, "train_classify.py"), "broken")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "its run is complete (2 of 2 epochs" in again.stdout and steps("broken") == steps(
        "whole"
    )


def started_to_train(cmd, out):
    """``cmd`` started, its stderr piped, once its run folder ``out`` logs two training lines."""
    proc = subprocess.Popen(
        cmd, cwd=HERE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=CPU_ENV
    )
    metrics = out / "metrics.jsonl"
    deadline = time.time() + 300
    while not (
        metrics.exists()
        and sum(json.loads(r)["type"] == "train" for r in metrics.read_text().splitlines()) >= 2
    ):
        assert proc.poll() is None and time.time() < deadline, proc.stderr.read()[-3000:]
        time.sleep(0.01)
    return proc


def worker_pid(launcher, rank):
    """The pid of the worker of ``rank`` that ``launcher`` (torchrun's agent) started, or None."""
    try:
        with open(f"/proc/{launcher}/task/{launcher}/children") as f:
            children = f.read().split()
    except FileNotFoundError:
        return None
    for pid in children:
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if f"RANK={rank}".encode() in f.read().split(b"\0"):
                    return int(pid)
        except FileNotFoundError:
            pass
    return None


@pytest.mark.parametrize(
    "launcher, status",
    [("launch.py", 128 + signal.SIGTERM), ("torchrun", 1)],  # torchrun's own: 1, a traceback
)
def test_a_stop_signal_to_one_worker_under_max_restarts_stops_the_job(tmp_path, launcher, status):
    """SIGTERM to one worker (rank 1, which saves nothing itself) under --max-restarts stops the
    job as one to the launcher does: one checkpoint of both ranks at the stop's step, no restart
    trained on, the launcher's status a batch script requeues on, and the same command resumes."""
    two_class_folder(tmp_path / "data", train=160, val=8)
    out = tmp_path / "out"
    start = {
        "launch.py": [sys.executable, os.path.join(HERE, "launch.py")],
        "torchrun": [sys.executable, "-m", "torch.distributed.run"],
    }[launcher]
    cmd = [
        *start,
        "--standalone",
        "--nproc_per_node=2",
        "--max-restarts=2",
        os.path.join(HERE, "train_classify.py"),
        "--data",
        str(tmp_path / "data"),
        *TINY_RUN,
        "--epochs",
        "1",
        "--resume",
        "auto",
        "--output-dir",
        str(out),
    ]
    proc = started_to_train(cmd, out)
    metrics = out / "metrics.jsonl"
    os.kill(worker_pid(proc.pid, 1), signal.SIGTERM)
    stderr = proc.communicate(timeout=300)[1]
    assert proc.returncode == status, stderr[-3000:]
    assert stderr.count("stopped by SIGTERM at epoch 1 step") == 1, stderr[-3000:]
    ckpt = torch.load(out / "checkpoint.pth", weights_only=True)
    assert ckpt["world_size"] == 2 and len(ckpt["dali"]) == len(ckpt["loss_sum"]) == 2
    assert 2 <= ckpt["step"] < 20  # 80 samples a rank, batch 4
    with open(metrics) as f:
        records = list(map(json.loads, f))
    # nothing after the stop: no restart resumed and trained on
    assert not [r for r in records if r["type"] == "resume"]
    assert {k: v for k, v in records[-1].items() if k != "time"} == {
        "type": "checkpoint",
        "epoch": 1,
        "step": ckpt["step"],
        "global_step": ckpt["step"],
    }
    resumed = subprocess.run(
        cmd, cwd=HERE, capture_output=True, text=True, timeout=600, env=CPU_ENV
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    with open(metrics) as f:
        records = list(map(json.loads, f))
    assert [(r["epoch"], r["step"]) for r in records if r["type"] == "resume"] == [
        (1, ckpt["step"])
    ]
    assert [r["global_step"] for r in records if r["type"] == "train"] == list(range(1, 21))


# Runs train_classify.py, unchanged, with rank 0 sending SIGTERM to the launcher (which passes it
# on to both ranks) as the first epoch's validation begins.
STOP_IN_VALIDATION = """
import os, runpy, signal, sys
sys.path.insert(0, {here!r})
import training
stoppable = training.StepLog.stoppable

def signal_first(self, batches):
    if os.environ["RANK"] == "0" and self.epoch_no == 1:
        os.kill(os.getppid(), signal.SIGTERM)
    yield from stoppable(self, batches)

training.StepLog.stoppable = signal_first
sys.argv = [os.path.join({here!r}, "train_classify.py")] + sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def test_a_stop_signal_during_validation_stops_it_and_saves_the_epoch(tmp_path):
    """A stop during validation does not wait for the whole pass (it can outlast the grace period
    before SIGKILL): both ranks stop at one batch, the epoch's last step is saved, and a resume
    validates that epoch (its record written then) and goes on with the next."""
    two_class_folder(tmp_path / "data", train=32, val=160)
    script = tmp_path / "stop_in_validation.py"
    script.write_text(STOP_IN_VALIDATION.format(here=HERE))
    out = tmp_path / "out"
    flags = ["--data", str(tmp_path / "data"), *TINY_RUN, "--epochs", "2", "--output-dir", str(out)]
    launch = [sys.executable, os.path.join(HERE, "launch.py"), "--standalone", "--nproc_per_node=2"]
    run = functools.partial(
        subprocess.run, cwd=HERE, capture_output=True, text=True, timeout=600, env=CPU_ENV
    )
    stopped = run([*launch, str(script), *flags])
    assert stopped.returncode == 128 + signal.SIGTERM, stopped.stderr[-3000:]
    assert stopped.stderr.count("stopped by SIGTERM at epoch 1 step 4 in validation: saved") == 1
    ckpt = torch.load(out / "checkpoint.pth", weights_only=True)
    assert (ckpt["epoch"], ckpt["step"]) == (1, 4)  # 16 samples a rank, batch 4
    with open(out / "metrics.jsonl") as f:
        assert not [r for r in map(json.loads, f) if r["type"] == "epoch"]  # the pass was cut
    resumed = run([*launch, os.path.join(HERE, "train_classify.py"), *flags, "--resume", "auto"])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    with open(out / "metrics.jsonl") as f:
        records = list(map(json.loads, f))
    assert [(r["epoch"], r["step"]) for r in records if r["type"] == "resume"] == [(1, 4)]
    assert [r["epoch"] for r in records if r["type"] == "epoch"] == [1, 2]
    # epoch 1 trained no step again: its steps' records are the stopped run's, once each
    assert [(r["epoch"], r["step"]) for r in records if r["type"] == "train"] == [
        (1, 1),
        (1, 2),
        (1, 3),
        (1, 4),
        (2, 1),
        (2, 2),
        (2, 3),
        (2, 4),
    ]


# Runs a trainer (argv[1]), unchanged, with a stop signal that lands while the first epoch's last
# validation batches run: under torchrun rank 0 sends SIGTERM to the launcher (which passes it on
# to every rank) as the last batch is handed out, once every rank is there, and every rank waits
# until it has it; a process
# alone sends it to itself once that batch's check has passed. Either way only the epoch's end
# sees it.
STOP_AT_VALIDATION_END = """
import os, runpy, signal, sys, time
sys.path.insert(0, {here!r})
import torch
import training
stoppable = training.StepLog.stoppable
last, torchrun = int(os.environ["LAST_VAL_BATCH"]), "RANK" in os.environ

def counted(self, batches):
    for k, batch in enumerate(batches, 1):
        if self.epoch_no == 1 and k == last and torchrun:
            torch.distributed.barrier()  # every rank has agreed on the batch before
            if os.environ["RANK"] == "0":
                os.kill(os.getppid(), signal.SIGTERM)
            while not self.stop.signum:
                time.sleep(0.01)
        yield batch
    if self.epoch_no == 1 and not torchrun:
        os.kill(os.getpid(), signal.SIGTERM)

def signal_at_the_end(self, batches):
    yield from stoppable(self, counted(self, batches))

training.StepLog.stoppable = signal_at_the_end
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.mark.parametrize("nproc", [1, 2])
def test_a_stop_signal_in_the_last_validation_batches_stops_at_the_epochs_end(tmp_path, nproc):
    """A signal that only the epoch's end sees (it lands after validation's last check, or in its
    last batch under torchrun, whose processes agree a step later): every process exits with 128 +
    the signal and one line, the epoch's checkpoint is saved, and a resume goes on with the next
    epoch."""
    two_class_folder(tmp_path / "data", train=32, val=16)
    script = tmp_path / "stop_at_validation_end.py"
    script.write_text(STOP_AT_VALIDATION_END.format(here=HERE))
    out, trainer = tmp_path / "out", os.path.join(HERE, "train_classify.py")
    flags = ["--data", str(tmp_path / "data"), *TINY_RUN, "--epochs", "2", "--output-dir", str(out)]
    launch = [sys.executable]
    if nproc > 1:
        launch += [os.path.join(HERE, "launch.py"), "--standalone", f"--nproc_per_node={nproc}"]
    env = {**CPU_ENV, "LAST_VAL_BATCH": str(16 // nproc // BATCH)}
    run = functools.partial(
        subprocess.run, cwd=HERE, capture_output=True, text=True, timeout=600, env=env
    )
    stopped = run([*launch, str(script), trainer, *flags])
    steps = 32 // nproc // BATCH
    assert stopped.returncode == 128 + signal.SIGTERM, stopped.stderr[-3000:]
    assert "Traceback" not in stopped.stderr, stopped.stderr[-3000:]
    path = out / "checkpoint.pth"
    assert (
        stopped.stderr.count(
            f"stopped by SIGTERM at epoch 1 step {steps}: saved {path}; to continue, run the same "
            f"command with --resume {path}"
        )
        == 1
    ), stopped.stderr[-3000:]
    ckpt = torch.load(path, weights_only=True)
    assert (ckpt["epoch"], ckpt["step"], ckpt["world_size"]) == (1, steps, nproc)
    with open(out / "metrics.jsonl") as f:
        assert [r["epoch"] for r in map(json.loads, f) if r["type"] == "epoch"] == [1]
    resumed = run([*launch, trainer, *flags, "--resume", "auto"])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    with open(out / "metrics.jsonl") as f:
        records = list(map(json.loads, f))
    assert [(r["epoch"], r["step"]) for r in records if r["type"] == "resume"] == [(2, 0)]
    assert [r["epoch"] for r in records if r["type"] == "epoch"] == [1, 2]
