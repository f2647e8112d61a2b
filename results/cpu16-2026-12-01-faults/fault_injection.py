"""Fault injection: train_classify.py under torchrun, killed at random steps, must end with the
weights of an uninterrupted run of the same command.

    python results/cpu16-2026-12-01-faults/fault_injection.py --trials 24 --parallel 6

Each trial draws one fault:
  sigkill   a random worker SIGKILLed after a random step; `torchrun --max-restarts 3` restarts
            both, and `--resume auto` continues from the last `--checkpoint-every` checkpoint
  sigterm   SIGTERM or SIGUSR1 to launch.py after a random step (a preemption), then the same
            command again, as a requeue runs it
Every trial runs 2 CPU workers (gloo), 2 epochs over 96 PNGs at 32 px, --checkpoint-every k with
k drawn from 1..4.
"""

import argparse
import concurrent.futures
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch
from PIL import Image

HERE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
# SIGKILLs the worker of rank KILL_RANK after step KILL_STEP of the run, once (a marker file).
KILLER = """
import os, runpy, signal, sys
sys.path.insert(0, {here!r})
import training
after_step = training.StepLog.after_step
def after_step_then_die(self, step):
    after_step(self, step)
    done = (self.epoch_no - 1) * self.steps + step
    if os.environ["RANK"] == os.environ["KILL_RANK"] and done == int(os.environ["KILL_STEP"]):
        if not os.path.exists(os.environ["KILL_MARK"]):
            open(os.environ["KILL_MARK"], "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
training.StepLog.after_step = after_step_then_die
sys.argv = [os.path.join({here!r}, "train_classify.py")] + sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""
STEPS = 12  # 48 samples a rank, batch 4: steps per epoch


def make_data(root):
    for split, n in (("train", 96), ("val", 16)):
        for i in range(n):
            os.makedirs(os.path.join(root, split, f"c{i % 3}"), exist_ok=True)
            rgb = (37 * i % 250, 90 + 40 * (i % 3), 160)
            Image.fromarray(np.full((64, 80, 3), rgb, np.uint8)).save(
                os.path.join(root, split, f"c{i % 3}", f"{i}.png")
            )


def flags(data, out, every):
    return [
        "--data", data, "--arch", "resnet18", "--train-crop-size", "32", "--val-crop-size", "32",
        "--val-resize-size", "32", "-b", "4", "-j", "1", "--dali-device", "cpu",
        "--print-freq", "1", "--epochs", "2", "--checkpoint-every", str(every),
        "--output-dir", out, "--resume", "auto",
    ]


def launch(script, args, restarts=0):
    return [sys.executable, os.path.join(HERE, "launch.py"), "--standalone", "--nproc_per_node=2",
            f"--max-restarts={restarts}", script, *args]


def trained_steps(out):
    with open(os.path.join(out, "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f]
    return max((r["global_step"] for r in records if r["type"] == "train"), default=0)


def trial(n, data, root, reference, seed):
    rng = random.Random(seed)
    kind, every = rng.choice(["sigkill", "sigterm", "sigusr1"]), rng.randint(1, 4)
    at, out = rng.randint(1, 2 * STEPS - 1), os.path.join(root, f"t{n}")
    args = flags(data, out, every)
    trainer = os.path.join(HERE, "train_classify.py")
    if kind == "sigkill":
        killer = os.path.join(root, f"killer{n}.py")
        with open(killer, "w") as f:
            f.write(KILLER.format(here=HERE))
        env = {**ENV, "KILL_RANK": str(rng.randint(0, 1)), "KILL_STEP": str(at),
               "KILL_MARK": os.path.join(root, f"mark{n}")}
        proc = subprocess.run(launch(killer, args, 3), env=env, capture_output=True, text=True)
        what = f"rank {env['KILL_RANK']} SIGKILLed after step {at}, torchrun restarts"
        ok_exit = proc.returncode == 0 and os.path.exists(env["KILL_MARK"])
    else:
        sig = signal.SIGTERM if kind == "sigterm" else signal.SIGUSR1
        proc = subprocess.Popen(launch(trainer, args), env=ENV, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)
        while not (os.path.exists(os.path.join(out, "metrics.jsonl")) and trained_steps(out) >= at):
            if proc.poll() is not None:
                break
            time.sleep(0.02)
        proc.send_signal(sig)
        stopped = proc.communicate()[1]
        again = subprocess.run(launch(trainer, args), env=ENV, capture_output=True, text=True)
        what = f"{sig.name} to launch.py after step {at}, then the same command"
        ok_exit = (proc.returncode in (0, 128 + sig)) and again.returncode == 0
        if proc.returncode == 0:
            what += " (it had ended)"
        proc = again if proc.returncode in (0, 128 + sig) else subprocess.CompletedProcess(
            [], proc.returncode, "", stopped)
    same = False
    if ok_exit:
        a = torch.load(os.path.join(reference, "checkpoint.pth"), weights_only=True)["model"]
        b = torch.load(os.path.join(out, "checkpoint.pth"), weights_only=True)["model"]
        same = all(torch.equal(a[k], b[k]) for k in a)
    return f"trial {n:2d}: {what}, --checkpoint-every {every}: " + (
        "weights bit-identical to the uninterrupted run" if same
        else f"DIFFERENT (exit {proc.returncode}) {proc.stderr[-400:]!r}"
    ), same


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=24)
    parser.add_argument("--parallel", type=int, default=6)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    root = tempfile.mkdtemp(prefix="faults-")
    data = os.path.join(root, "data")
    make_data(data)
    reference = os.path.join(root, "reference")
    subprocess.run(launch(os.path.join(HERE, "train_classify.py"), flags(data, reference, 1)),
                   env=ENV, check=True, capture_output=True)
    with concurrent.futures.ThreadPoolExecutor(args.parallel) as pool:
        results = list(pool.map(
            lambda n: trial(n, data, root, reference, args.seed * 1000 + n), range(args.trials)))
    for line, _ in results:
        print(line, flush=True)
    same = sum(ok for _, ok in results)
    print(f"{same} of {len(results)} trials ended with the uninterrupted run's weights")


if __name__ == "__main__":
    main()
