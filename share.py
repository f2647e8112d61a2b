"""A trainer's speed as a share of its model's own: the img/s of its runs fed by DALI over that of
its runs with --loader synthetic (one random batch already on the GPU), each run the median of its
log windows after the first epochs, over several runs, with their spread.

    python share.py --runs 3 -- train_classify.py --data DIR --arch resnet18 -b 256 --amp bf16 \\
        --channels-last --epochs 40 --print-freq 8
    python share.py --runs 3 --variant "--decoder-cache on" -- train_classify.py ...

Every variant (the trainer as given, and each --variant's flags added) and the synthetic run take
their turn in each round, so a slow spell of the machine falls on all of them. A run counts its
windows from epoch --skip + 1 on (the compile, the decoder cache's fill before); one that times
fewer than --min-seconds of steps is said to be too short. Each run's line gives its img/s and its
data wait (the share of step time spent waiting for DALI: high, the loader is short; low with a low
share, the loader's GPU work slows the model). A line per variant gives the median share and its
spread; --json keeps every run.
"""

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile

from outputs import file_to_write


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=3, help="runs of each variant (at least 3)")
    p.add_argument("--skip", type=int, default=1, help="epochs whose windows are not counted")
    p.add_argument("--min-seconds", type=float, default=20.0, help="timed steps a run needs")
    p.add_argument("--variant", action="append", default=[], help="flags added to the trainer's")
    p.add_argument(
        "--json", type=file_to_write, help="every run's rate, and the shares, into this file"
    )
    p.add_argument("trainer", nargs=argparse.REMAINDER, help="the trainer and its flags")
    args = p.parse_args(argv)
    args.trainer = args.trainer[1:] if args.trainer[:1] == ["--"] else args.trainer
    if not args.trainer or args.runs < 3:
        p.error("expected --runs 3 or more and a trainer with its flags after --")
    return args


def run_rate(command, out, skip):
    """(median img/s of the run's windows after ``skip`` epochs, seconds those windows timed, their
    median data wait in %)."""
    proc = subprocess.run([sys.executable, *command, "--output-dir", out], text=True)
    if proc.returncode:
        sys.exit(f"error: {shlex.join(command)} ended with status {proc.returncode}")
    with open(os.path.join(out, "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f]
    batch = next(r for r in records if r["type"] == "config")["args"]["batch_size"]
    windows, last = [], 0
    for r in (r for r in records if r["type"] == "train"):
        images = (r["step"] - last) * batch  # a process's; img_s is all processes'
        last = 0 if r["step"] == r["steps"] else r["step"]
        if r["epoch"] > skip and r["img_s"]:
            windows.append((r["img_s"], images, r["data_wait"]))
    if not windows:
        sys.exit(f"error: {shlex.join(command)}: no window after epoch {skip}; train longer")
    world = next(r for r in records if r["type"] == "config")["world_size"]
    seconds = sum(images * world / rate for rate, images, _ in windows)
    rates, waits = [rate for rate, _, _ in windows], [wait for _, _, wait in windows]
    return statistics.median(rates), seconds, statistics.median(waits)


def main():
    args = parse_args()
    variants = {"synthetic": ["--loader", "synthetic"], "dali": []}
    variants.update({flags: shlex.split(flags) for flags in args.variant})
    rates, waits = {name: [] for name in variants}, {name: [] for name in variants}
    with tempfile.TemporaryDirectory(prefix="share-") as tmp:
        for k in range(args.runs):
            for name, flags in variants.items():
                out = os.path.join(tmp, f"{k}-{len(rates[name])}-{abs(hash(name))}")
                rate, seconds, wait = run_rate([*args.trainer, *flags], out, args.skip)
                rates[name].append(rate)
                waits[name].append(wait)
                short = f" (too short: {seconds:.0f} s timed)" if seconds < args.min_seconds else ""
                line = f"run {k + 1}/{args.runs} {name}: {rate:,.0f} img/s, data wait {wait:.1f} %"
                print(line + short, flush=True)
    synthetic = statistics.median(rates["synthetic"])
    report = {"command": args.trainer, "rates": rates, "data_wait": waits, "shares": {}}
    print(
        f"synthetic: median {synthetic:,.0f} img/s, {min(rates['synthetic']):,.0f} to "
        f"{max(rates['synthetic']):,.0f}"
    )
    for name in list(variants)[1:]:
        shares = [100 * rate / synthetic for rate in rates[name]]
        report["shares"][name] = shares
        print(
            f"{name}: median {statistics.median(rates[name]):,.0f} img/s, share "
            f"{statistics.median(shares):.1f} % ({min(shares):.1f} to {max(shares):.1f})"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
