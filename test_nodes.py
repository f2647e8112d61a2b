"""Both trainers over two nodes, as torchrun runs them: two launchers of one process each, meeting at
one c10d rendezvous endpoint, here on one machine, sharing tmp_path as nodes share a file system
(on the CPU with gloo). Every node has a local rank 0: what each does once per node (the demo set,
the shard indexes, the prepared segmentation data) must hold when both do it at once, the run
folder and its log are the global rank 0's alone, and the epoch's samples are split by global rank,
each read once across the nodes."""

import glob
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from types import SimpleNamespace

import numpy as np
import pytest
from PIL import Image

from conftest import id_coded_root
from data_processing import make_demo_images
from make_shards import make_shards
from outputs import atomic_open
from test_ddp import CPU_ENV, HERE, TINY_RUN

N_TRAIN, N_VAL = 16, 9  # 8 training samples a node: whole batches of 4, none repeated to fill one

# Runs the trainer named by {script}, unchanged; records the samples of each pass of each DALI
# iterator of this process (training or validation), by an id that survives augmentation: a
# classification image's red channel (each image is one solid colour), a segmentation mask's count
# of foreground pixels (flips keep it; the data is at the trained size, so nothing is resized).
SPY = """
import atexit, json, os, runpy, sys
sys.path.insert(0, {here!r})
import torch
from nvidia.dali.plugin.pytorch import DALIGenericIterator
from pipelines import IMAGENET_MEAN, IMAGENET_STD, ClassifyTrainPipeline, SegmentTrainPipeline

passes = {{"train": [[]], "val": [[]]}}
mean, std = torch.tensor(IMAGENET_MEAN)[:, None, None], torch.tensor(IMAGENET_STD)[:, None, None]
next_batch = DALIGenericIterator.__next__

def sample_ids(batch):
    if "mask" in batch:
        return [int(mask.sum()) for mask in batch["mask"]]
    return [int(round(float((im.float() * std + mean)[0].mean()))) for im in batch["data"]]

def spy_next(self):
    training = isinstance(self._pipes[0], (ClassifyTrainPipeline, SegmentTrainPipeline))
    split = "train" if training else "val"
    if getattr(self, "_first_batch", None) is not None:  # the batch it read when it was built
        return next_batch(self)
    try:
        batch = next_batch(self)
    except StopIteration:
        passes[split].append([])  # the end of a pass
        raise
    passes[split][-1] += sample_ids(batch[0])
    return batch

@atexit.register
def dump():
    with open(os.path.join({out!r}, f"rank{{os.environ['RANK']}}.json"), "w") as f:
        json.dump({{split: done[:-1] for split, done in passes.items()}}, f)

DALIGenericIterator.__next__ = spy_next
sys.argv = [{script!r}] + sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def two_nodes(tmp_path, script, *flags, cwd, pytorchjob=False, own=((), ())):
    """Two torchrun launchers, as one per node: --nnodes 2, one process each, one c10d rendezvous
    endpoint and id; the ranks are the rendezvous's to give. With ``pytorchjob``, launch.py with no
    flags of torchrun's, in the environment a PyTorchJob gives each node's pod: torchrun's PET_
    variables (its static rendezvous at node 0's address), and the job's own RANK, WORLD_SIZE and
    MASTER_ADDR, which torchrun replaces for its workers. ``own``: each node's flags of its own,
    after the others. Each node's (returncode, stdout, stderr)."""
    port = free_port()
    launcher = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes=2",
        "--nproc-per-node=1",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{port}",
        f"--rdzv-id={tmp_path.name}",
    ]
    envs = [CPU_ENV, CPU_ENV]
    if pytorchjob:
        launcher = [sys.executable, os.path.join(HERE, "launch.py")]
        job = dict(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="2")
        job.update(PET_NNODES="2", PET_NPROC_PER_NODE="1", PET_MASTER_ADDR="127.0.0.1")
        job.update(PET_MASTER_PORT=str(port))
        envs = [{**CPU_ENV, **job, "RANK": str(n), "PET_NODE_RANK": str(n)} for n in range(2)]
    nodes = [
        subprocess.Popen(
            [*launcher, str(script), *flags, *mine],
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for env, mine in zip(envs, own)
    ]
    try:
        ended = [node.communicate(timeout=480) for node in nodes]
    finally:
        for node in nodes:
            node.kill()
    return [
        SimpleNamespace(returncode=node.returncode, stdout=out, stderr=err)
        for node, (out, err) in zip(nodes, ended)
    ]


def assert_both_ended_well(nodes):
    for node in nodes:
        assert node.returncode == 0, node.stderr[-3000:]
        assert "destroy_process_group" not in node.stderr  # shut down cleanly


def spied(tmp_path, trainer, *flags, pytorchjob=False):
    """``trainer`` (train_classify.py or train_segment.py) on two nodes (``two_nodes``), spied on,
    with no --output-dir: each process's run folder would be a new runs/<task>/expN under the
    shared folder. The nodes, and each global rank's passes."""
    spy = tmp_path / "spy.py"
    spy.write_text(SPY.format(here=HERE, out=str(tmp_path), script=os.path.join(HERE, trainer)))
    nodes = two_nodes(tmp_path, spy, *flags, "--epochs", "1", cwd=tmp_path, pytorchjob=pytorchjob)
    assert_both_ended_well(nodes)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    return nodes, ranks


def assert_each_read_once(ranks, expected):
    """Every pass of each split saw each sample exactly once across the two ranks, and the ranks
    trained as many steps on halves of the same size."""
    for split, passes in (("train", 1), ("val", 2)):  # validation: beside epoch 1, then after it
        assert [len(rank[split]) for rank in ranks] == [passes, passes], split
        for k in range(passes):
            seen = [rank[split][k] for rank in ranks]
            assert sorted(seen[0] + seen[1]) == sorted(expected[split]), (split, k, seen)
    assert [len(rank["train"][0]) for rank in ranks] == [len(expected["train"]) // 2] * 2


def assert_one_writer(tmp_path, nodes, task, *written):
    """One run folder, one log, one set of checkpoints (and ``written``): the global rank 0's
    alone."""
    assert os.listdir(tmp_path / "runs" / task) == ["exp1"]
    run = tmp_path / "runs" / task / "exp1"
    files = [".lock", "best.pth", "checkpoint.pth", "metrics.jsonl", *written]
    assert sorted(os.listdir(run)) == sorted(files)
    with open(run / "metrics.jsonl") as f:
        types = [r["type"] for r in map(json.loads, f)]
    assert types.count("start") == types.count("epoch") == types.count("end") == 1, types
    assert sum(node.stdout.count("\nend: ") for node in nodes) == 1


def make_classify_data(root):
    """train/ and val/ of solid-colour PNGs in two classes; red channel 10 * (i + 1): the id."""
    for split, n in (("train", N_TRAIN), ("val", N_VAL)):
        for i in range(n):
            os.makedirs(root / split / f"c{i % 2}", exist_ok=True)
            Image.fromarray(np.full((48, 56, 3), (10 * (i + 1), 90, 160), np.uint8)).save(
                root / split / f"c{i % 2}" / f"{i}.png"
            )


@pytest.mark.parametrize("layout", ["folder", "tfrecord", "wds"])
def test_classify_on_two_nodes_reads_each_sample_once(tmp_path, layout):
    make_classify_data(tmp_path / "png")
    data = tmp_path / "png"
    if layout != "folder":
        data = tmp_path / layout
        make_shards(str(tmp_path / "png"), str(data), layout, 4, 0)
        for index in glob.glob(str(data / "*" / "*.idx*")):  # both nodes index the shards at once
            os.remove(index)
    nodes, ranks = spied(tmp_path, "train_classify.py", "--data", str(data), *TINY_RUN)
    expected = {
        split: [10 * (i + 1) for i in range(n)] for split, n in (("train", N_TRAIN), ("val", N_VAL))
    }
    assert_each_read_once(ranks, expected)
    assert_one_writer(tmp_path, nodes, "classify")
    if layout != "folder":
        # each shard's index whole, once (7 shards of at most 4 samples), whichever node wrote it
        for split, n in (("train", N_TRAIN), ("val", N_VAL)):
            summaries = glob.glob(str(data / split / "*.idx.json"))
            assert len(summaries) == len(glob.glob(str(data / split / "*.idx"))) == -(-n // 4)
            assert sum(json.loads(open(f).read())["samples"] for f in summaries) == n
        assert not glob.glob(str(data / "*" / ".*"))  # no temporary file of either node left


def test_segment_on_two_nodes_of_a_pytorchjob_reads_each_pair_once(tmp_path):
    """Pair k's mask has k + 1 foreground pixels: its id; 8 training pairs, 4 validation. The nodes
    are a PyTorchJob's: launch.py finds what torchrun needs in its environment."""
    root = tmp_path / "prepared"
    ids = id_coded_root(root, 12, valid_fraction=1 / 3, grey_step=20)
    expected = {"train": ids["train"], "val": ids["valid"]}
    assert (len(expected["train"]), len(expected["val"])) == (8, 4)
    flags = ["--size", "32", "--unet-width", "8", "--batch-size", "2", "--workers", "1"]
    nodes, ranks = spied(
        tmp_path,
        "train_segment.py",
        "--data",
        str(root),
        *flags,
        "--dali-device",
        "cpu",
        pytorchjob=True,
    )
    assert_each_read_once(ranks, expected)
    assert_one_writer(tmp_path, nodes, "segment", "val_epoch001.png")  # its overlay


def checkout(tmp_path):
    """A copy of the scripts in the shared folder, as nodes run one checkout: its .cache/ (where
    --data demo is built) starts empty."""
    repo = tmp_path / "checkout"
    repo.mkdir()
    for script in glob.glob(os.path.join(HERE, "*.py")):
        if not os.path.basename(script).startswith(("test_", "conftest")):
            shutil.copy(script, repo)
    return repo


def test_two_nodes_build_the_classification_demo_at_once(tmp_path):
    repo = checkout(tmp_path)
    flags = ["--train-crop-size", "32", "--val-crop-size", "32", "--val-resize-size", "32"]
    nodes = two_nodes(
        tmp_path,
        repo / "train_classify.py",
        "--data",
        "demo",
        *flags,
        "--epochs",
        "1",
        "--dali-device",
        "cpu",
        "--workers",
        "1",
        "--output-dir",
        str(tmp_path / "out"),
        cwd=repo,
    )
    assert_both_ended_well(nodes)
    assert os.listdir(repo / ".cache") == ["demo-classify-v2"]  # no other build's folder left
    demo = repo / ".cache" / "demo-classify-v2"
    counts = {
        split: len(glob.glob(str(demo / split / "*" / "*.jpg"))) for split in ("train", "val")
    }
    assert counts == {"train": 720, "val": 180}
    assert sum(node.stdout.count("  train_samples 720  val_samples 180") for node in nodes) == 1


def test_two_nodes_prepare_the_segmentation_demo_at_once(tmp_path):
    repo = checkout(tmp_path)
    nodes = two_nodes(
        tmp_path,
        repo / "train_segment.py",
        "--data",
        "demo",
        "--size",
        "32",
        "--unet-width",
        "8",
        "--epochs",
        "1",
        "--dali-device",
        "cpu",
        "--workers",
        "1",
        "--output-dir",
        str(tmp_path / "out"),
        cwd=repo,
    )
    assert_both_ended_well(nodes)
    demo = repo / ".cache" / "demo-segment-v1"
    pngs = glob.glob(str(demo / "*" / "*" / "*.png"))
    npys = glob.glob(str(demo / "npy" / "*" / "*" / "*.npy"))
    assert (len(pngs), len(npys)) == (320, 320)
    assert not [p for p in glob.glob(str(demo / "**" / ".*"), recursive=True) if "partial" in p]
    assert sum(node.stdout.count("  train_samples 128  val_samples 32") for node in nodes) == 1


# Nodes in containers (a PyTorchJob's pods) each number their processes from 1: two nodes' local
# rank 0 writing one shared folder at once may have one process id. Two writers in this process
# stand for them.


def test_two_writers_of_one_process_id_each_leave_a_whole_file(tmp_path):
    index = tmp_path / "train-000000.tar.idx"
    with atomic_open(index, "w") as first:
        first.write("v1.2 2\n")
        with atomic_open(index, "w") as second:  # the other node, as it indexes the same shard
            second.write("v1.2 2\njpg 0 10 a.jpg\njpg 512 10 b.jpg\n")
        first.write("jpg 0 10 a.jpg\njpg 512 10 b.jpg\n")
    assert index.read_text() == "v1.2 2\njpg 0 10 a.jpg\njpg 512 10 b.jpg\n"
    assert os.listdir(tmp_path) == [index.name]


def test_a_demo_build_of_another_node_with_one_process_id_is_left_to_it(tmp_path):
    root = tmp_path / "demo-classify"
    other = tmp_path / f"demo-classify.tmp-{os.getpid()}"  # its build under way, in the same name
    (other / "train" / "circle").mkdir(parents=True)
    assert make_demo_images(str(root), train_per_class=2, val_per_class=1) == str(root)
    assert [len(glob.glob(str(root / split / "*" / "*.jpg"))) for split in ("train", "val")] == [
        12,
        6,
    ]
    assert os.listdir(other) == ["train"] and sorted(os.listdir(tmp_path)) == sorted(
        [root.name, other.name]
    )


@pytest.mark.parametrize("which", ["-b", "--data", "images"])
def test_nodes_started_with_another_batch_or_other_data_stop_in_one_line(tmp_path, which):
    """Two nodes given another -b hung at their first step's collective; given sets of other files
    (as many, the same classes), or other images under the same names, they trained on both. Each
    process compares the run it was given with process 0's (flags, the training files' names and
    sizes) and the job ends with one line naming the difference."""
    make_classify_data(tmp_path / "png")
    shutil.copytree(tmp_path / "png", tmp_path / "other")
    other = tmp_path / "other" / "train" / "c0" / "0.png"
    if which == "images":  # another picture, of another size in bytes, under the same name
        Image.fromarray(np.arange(48 * 56 * 3, dtype=np.uint8).reshape(48, 56, 3)).save(other)
        assert other.stat().st_size != (tmp_path / "png" / "train" / "c0" / "0.png").stat().st_size
    else:
        os.rename(other, other.with_name("x.png"))
    flags = [*TINY_RUN, "--epochs", "1", "--output-dir", str(tmp_path / "out")]
    own = {
        "-b": (
            ["--data", str(tmp_path / "png")],
            ["--data", str(tmp_path / "png"), "--batch-size", "2"],
        ),
        "--data": (["--data", str(tmp_path / "png")], ["--data", str(tmp_path / "other")]),
        "images": (["--data", str(tmp_path / "png")], ["--data", str(tmp_path / "other")]),
    }[which]
    nodes = two_nodes(tmp_path, os.path.join(HERE, "train_classify.py"), *flags, cwd=HERE, own=own)
    errors = [line for n in nodes for line in n.stderr.splitlines() if line.startswith("error: ")]
    told = {
        "-b": r"another --batch-size than process 0 \((2, not 4|4, not 2)\)",
        "--data": r"another files than process 0",
        "images": r"another files than process 0",
    }[which]
    assert errors and all(
        re.search(f"^error: process 1 was started with {told}", e) for e in errors
    ), [n.stderr[-2000:] for n in nodes]
    assert all(n.returncode != 0 for n in nodes)
    assert not (tmp_path / "out" / "checkpoint.pth").exists()


def worker_pids(launcher):
    """The processes a torchrun launcher started (its workers run in sessions of their own)."""
    found = []
    for task in os.listdir(f"/proc/{launcher}/task"):
        with open(f"/proc/{launcher}/task/{task}/children") as f:
            found += [int(pid) for pid in f.read().split()]
    return found


def metrics(out):
    try:
        with open(out / "metrics.jsonl") as f:
            return [json.loads(line) for line in f]
    except (OSError, ValueError):
        return []


def wait_for(out, done, what, timeout=300):
    deadline = time.time() + timeout
    while not done(metrics(out)):
        assert time.time() < deadline, (what, [r["type"] for r in metrics(out)][-30:])
        time.sleep(0.2)


@pytest.mark.parametrize("trainer", ["train_classify.py", "train_segment.py"])
def test_an_elastic_job_goes_on_as_nodes_leave_and_join(tmp_path, trainer):
    """torchrun --nnodes 1:2 under launch.py, launchers on one machine sharing a folder: a second
    that joins a running job makes it restart and go on with two processes from the stop's
    checkpoint; killed mid-epoch with its worker (a node lost), it leaves the first to restart
    alone and go on from the last checkpoint, the epoch's rest read as its run would have. Each
    step is trained and logged once, and the job ends well. The first launcher hosts the
    rendezvous (torchrun's c10d store at --rdzv-endpoint), which a job cannot lose."""
    if trainer == "train_classify.py":
        two_class = tmp_path / "data"
        for split, n in (("train", 160), ("val", 8)):
            for i in range(n):
                os.makedirs(two_class / split / f"c{i % 2}", exist_ok=True)
                Image.fromarray(np.full((40, 40, 3), (i % 250, 90, 160), np.uint8)).save(
                    two_class / split / f"c{i % 2}" / f"{i}.png"
                )
        flags = ["--data", str(two_class), *TINY_RUN]
    else:
        id_coded_root(tmp_path / "data", 96, valid_fraction=1 / 12, grey_step=2)
        flags = ["--data", str(tmp_path / "data"), "--size", "32", "--unet-width", "8", "-b", "4"]
        flags += ["--workers", "1", "--dali-device", "cpu", "--print-freq", "1"]
    out = tmp_path / "out"
    port = free_port()
    cmd = [sys.executable, os.path.join(HERE, "launch.py"), "--nnodes=1:2", "--nproc-per-node=1"]
    cmd += [
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{port}",
        f"--rdzv-id={tmp_path.name}",
    ]
    cmd += ["--max-restarts=3", "--rdzv-conf=last_call_timeout=2", os.path.join(HERE, trainer)]
    cmd += [*flags, "--epochs", "20", "--checkpoint-every", "2", "--resume", "auto"]
    cmd += ["--output-dir", str(out)]

    def launch(name):  # its output in files: a pipe no one reads would fill and stop it
        return subprocess.Popen(
            cmd, cwd=tmp_path, stdout=open(tmp_path / f"{name}.out", "w"),
            stderr=open(tmp_path / f"{name}.err", "w"), env=CPU_ENV, start_new_session=True,
        )  # fmt: skip

    first, second = launch("first"), None  # it hosts the rendezvous: torchrun's c10d store
    try:
        trained = lambda r: sum(x["type"] == "train" for x in r)  # noqa: E731
        processes = lambda r: [len(x["memory"]) for x in r if x["type"] == "epoch"]  # noqa: E731
        resumes = lambda r: sum(x["type"] == "resume" for x in r)  # noqa: E731
        wait_for(out, lambda r: trained(r) >= 4, "no training")
        second = launch("second")  # a node joins
        wait_for(out, lambda r: 2 in processes(r), "no epoch on two processes")
        wait_for(out, lambda r: r[-1]["type"] == "train" and r[-1]["global_step"] % 2, "no step")
        lost = worker_pids(second.pid)
        os.killpg(second.pid, signal.SIGKILL)  # the node leaves: its launcher and its worker
        for pid in lost:
            os.kill(pid, signal.SIGKILL)
        second.wait()
        wait_for(out, lambda r: resumes(r) == 2, "no restart with one process")
        first.wait(timeout=600)
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    assert first.returncode == 0, (tmp_path / "first.err").read_text()[-3000:]
    records = metrics(out)
    steps = [r["global_step"] for r in records if r["type"] == "train"]
    assert steps == list(range(1, len(steps) + 1)) and steps[-1] == records[-2]["global_step"]
    # a restart's SIGTERM that lands in validation cuts the pass: that epoch has no scores (as
    # test_ddp's stop in validation), its training is kept
    said = "".join((tmp_path / f"{name}.err").read_text() for name in ("first", "second"))
    cut = {int(e) for e in re.findall(r"stopped by SIGTERM at epoch (\d+) step \d+ in valid", said)}
    assert [r["epoch"] for r in records if r["type"] == "epoch"] == [
        e for e in range(1, 21) if e not in cut
    ]
    assert (
        20 not in cut and len(records[-2]["memory"]) == 1
    )  # the last epoch on the node that stayed
