# Ran at commit b355a3c (make_shards.py as of that commit) on the 2-core machine, no GPU; its output is shard_speed.log.
"""make_shards.py's throughput on an ImageNet-like set of JPEGs: images/s and MB/s written and the average bytes per
image of the shards, for --format wds and tfrecord, each --workers count given, without and with --max-size 256.

    python results/cpu2-2026-12-01-shards/shard_speed.py --images 4000 --workers 1 2 > shard_speed.log
    python results/cpu2-2026-12-01-shards/shard_speed.py --images 20000 --shard-size 128 --workers 1 8 16  # 16 cores

The set is bench.py's (write_jpeg: procedural photo-like JPEGs, 400-500 px a side, quality 90, 16 classes), 90 % in
train/ and 10 % in val/, written once under --root and reused; its files are read once before the runs, so that every
run reads them from the page cache. Each run writes a fresh DST under --root (no fsync: the written bytes may still be
in the page cache when the run ends). A run is ``make_shards.main(argv)`` in a fresh Python process, the same work
as ``python make_shards.py argv``; "s" is main() alone, "cmd s" the whole process (Python, torch and DALI imports).
Before each run the script waits (up to --wait s) for the other processes on the machine to go quiet, and it logs the
CPU time of the run (its workers included) and that of every other process meanwhile, from /proc/stat.
"""

import argparse
import multiprocessing
import os
import platform
import re
import resource
import shutil
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)
import bench  # noqa: E402  (the repo's bench.py, read only: its JPEG generator)
import PIL  # noqa: E402
from pipelines import ClassifyTrainPipeline, classify_iterator  # noqa: E402

TIMED = ("import sys, time; sys.path.insert(0, {repo!r}); import make_shards; t = time.perf_counter(); "
         "make_shards.main({argv!r}); print('main_seconds', time.perf_counter() - t)")


def write_image(job):
    root, i = job
    bench.write_jpeg(root, i)


def make_set(src, count, workers):
    """SRC/train and SRC/val, bench.py's JPEGs 0..count-1 (the last tenth in val), unless already complete."""
    done = os.path.join(src, f"complete-{count}")
    if not os.path.exists(done):
        shutil.rmtree(src, ignore_errors=True)
        n_train = count - count // 10
        jobs = [(os.path.join(src, "train" if i < n_train else "val"), i) for i in range(count)]
        for root, i in jobs[:bench.NUM_CLASSES] + jobs[n_train:n_train + bench.NUM_CLASSES]:
            os.makedirs(os.path.dirname(bench.jpeg_path(root, i)), exist_ok=True)
        with multiprocessing.get_context("fork").Pool(workers) as pool:
            pool.map(write_image, jobs, chunksize=16)
        open(done, "w").close()
    files = [os.path.join(d, n) for split in ("train", "val") for d, _, ns in os.walk(os.path.join(src, split))
             for n in ns]
    size = 0
    for f in files:  # into the page cache
        with open(f, "rb") as fh:
            size += len(fh.read())
    return len(files), size


def shard_bytes(dst):
    return sum(os.path.getsize(os.path.join(dst, split, n)) for split in ("train", "val")
               for n in os.listdir(os.path.join(dst, split)) if re.fullmatch(r".*(\.tar|-\d{5}-of-\d{5})", n))


def busy_seconds():
    """CPU seconds that every process on the machine has spent so far (/proc/stat: all but idle and iowait)."""
    ticks = [int(v) for v in open("/proc/stat").readline().split()[1:9]]
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def children_seconds():
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)  # the waited-for run and its workers
    return usage.ru_utime + usage.ru_stime


def wait_for_quiet(longest):
    """Seconds waited (at most ``longest``) until other processes use under 5 % of one CPU for 3 s: the machine may
    be shared, and a run beside another job measures both."""
    start = time.perf_counter()
    while time.perf_counter() - start < longest:
        busy = busy_seconds()
        time.sleep(3)
        if busy_seconds() - busy < 0.15:
            break
    return time.perf_counter() - start


def run(src, dst, fmt, shard_size, workers, max_size):
    """(main() s, command s, bytes of the shards, CPU s of the run, CPU s of other processes meanwhile)."""
    shutil.rmtree(dst, ignore_errors=True)
    argv = [src, dst, "--format", fmt, "--shard-size", str(shard_size), "--workers", str(workers)]
    argv += ["--max-size", str(max_size)] if max_size else []
    start, busy, ours = time.perf_counter(), busy_seconds(), children_seconds()
    out = subprocess.run([sys.executable, "-c", TIMED.format(repo=REPO, argv=argv)], capture_output=True, text=True,
                         check=True)
    command, busy, ours = time.perf_counter() - start, busy_seconds() - busy, children_seconds() - ours
    return float(out.stdout.split("main_seconds")[1]), command, shard_bytes(dst), ours, busy - ours


def loading(train_dir, threads, batch_size=64):
    """img/s of one epoch of the CPU-only training pipeline (decode with random crop, resize to 224, flip, normalize)
    over ``train_dir``, after a first epoch that warms it up."""
    pipe = ClassifyTrainPipeline(batch_size, threads, None, train_dir, seed=0)
    for epoch in range(2):
        start, images = time.perf_counter(), 0
        for batch in classify_iterator(pipe):
            images += batch[0]["data"].shape[0]
    return images / (time.perf_counter() - start)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=4000, help="images in the set (default: %(default)s)")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2], help="--workers counts (default: 1 2)")
    parser.add_argument("--max-size", type=int, default=256, help="the cap measured beside none (default: 256)")
    # a shard is a worker's unit of work: 256 gives each of 2 workers 7 train shards of 4,000 images (ImageNet's
    # 1,252 shards of 1,024 give each of 16 workers 78)
    parser.add_argument("--shard-size", type=int, default=256, help="make_shards.py's (default: %(default)s)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each setting (default: %(default)s)")
    parser.add_argument("--root", default="/tmp/shard_speed", help="the set and DSTs go here (default: %(default)s)")
    parser.add_argument("--wait", type=float, default=600, help="most seconds to wait for a quiet machine before a run "
                        "(default: %(default)s)")
    args = parser.parse_args()
    try:
        commit = subprocess.run(["git", "-C", REPO, "describe", "--always", "--dirty"], capture_output=True,
                                text=True).stdout.strip() or "unknown"
    except OSError:
        commit = "unknown (no git)"
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")
    print(f"# {time.strftime('%Y-%m-%d %H:%M:%S %Z')}; commit {commit}; {cpu}; {len(os.sched_getaffinity(0))} CPUs "
          f"for this process; Python {platform.python_version()}, Pillow {PIL.__version__}; {sys.argv[1:]}", flush=True)
    src = os.path.join(args.root, "src")
    t = time.perf_counter()
    count, size = make_set(src, args.images, len(os.sched_getaffinity(0)))
    print(f"# set: {count} JPEGs, {size / count / 1e3:.1f} kB each on average, {size / 1e6:.0f} MB "
          f"(ready in {time.perf_counter() - t:.0f} s)", flush=True)
    for fmt in ("wds", "tfrecord"):  # a first run of each format, not recorded: its first writes cost more
        seconds = run(src, os.path.join(args.root, "dst"), fmt, args.shard_size, 1, None)[0]
        print(f"warm-up: --format {fmt}: {seconds:.2f} s", flush=True)
    results = {}
    for repeat in range(args.repeats):
        for fmt in ("wds", "tfrecord"):
            for max_size in (None, args.max_size):
                for workers in args.workers:
                    waited = wait_for_quiet(args.wait)
                    r = run(src, os.path.join(args.root, "dst"), fmt, args.shard_size, workers, max_size)
                    results.setdefault((fmt, max_size, workers), []).append(r)
                    seconds, command, written, cpu, others = r
                    print(f"run {repeat + 1}: --format {fmt} --workers {workers} --max-size {max_size}: "
                          f"{seconds:.2f} s (cmd {command:.2f} s), {count / seconds:,.0f} img/s, "
                          f"{written / seconds / 1e6:,.1f} MB/s, {written / count / 1e3:.1f} kB/img; CPU s: "
                          f"{cpu:.1f} this run, {others:.1f} other processes (after {waited:.0f} s waiting for quiet)",
                          flush=True)
    threads = len(os.sched_getaffinity(0))
    print(f"\nloading: ClassifyTrainPipeline on the CPU, {threads} threads, batch 64, one epoch of DST/train after a "
          f"warm-up epoch, img/s", flush=True)
    speeds = {}
    for repeat in range(args.repeats):
        for fmt in ("wds", "tfrecord"):
            for max_size in (None, args.max_size):
                dst = os.path.join(args.root, "dst")
                run(src, dst, fmt, args.shard_size, max(args.workers), max_size)
                waited = wait_for_quiet(args.wait)
                busy, speed = busy_seconds(), loading(os.path.join(dst, "train"), threads)
                speeds.setdefault((fmt, max_size), []).append(speed)
                print(f"run {repeat + 1}: --format {fmt} --max-size {max_size}: {speed:,.0f} img/s (CPU s of every "
                      f"process meanwhile: {busy_seconds() - busy:.1f}; after {waited:.0f} s waiting for quiet)",
                      flush=True)

    print("\n| --format | --max-size | --workers | s | cmd s | img/s | MB/s written | kB/img | CPU s | others' CPU s |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for (fmt, max_size, workers), runs in results.items():
        def col(figure):  # every repeat, in order
            return " / ".join(figure(*r) for r in runs)
        print(f"| {fmt} | {max_size or 'none'} | {workers} | {col(lambda s, c, w, u, o: f'{s:.2f}')} | "
              f"{col(lambda s, c, w, u, o: f'{c:.2f}')} | {col(lambda s, c, w, u, o: f'{count / s:,.0f}')} | "
              f"{col(lambda s, c, w, u, o: f'{w / s / 1e6:,.1f}')} | {runs[0][2] / count / 1e3:.1f} | "
              f"{col(lambda s, c, w, u, o: f'{u:.1f}')} | {col(lambda s, c, w, u, o: f'{o:.1f}')} |")
    print("\n| --format | --max-size | loading img/s |")
    print("| --- | --- | --- |")
    for (fmt, max_size), runs in speeds.items():
        print(f"| {fmt} | {max_size or 'none'} | {' / '.join(f'{v:,.0f}' for v in runs)} |")


if __name__ == "__main__":
    main()
