"""bench.py's JPEGs with their shorter side capped at 256 px, as make_shards.py --max-size 256 stores
them, written as an image folder: NVIDIA's example reads files, so every row of bench.py reads the same
capped images.

Run from the project root after bench.py has generated its JPEGs:
    python results/h200-2026-12-02a/cap256.py DST
"""

import glob
import multiprocessing
import os
import sys

sys.path.insert(0, os.getcwd())
from make_shards import encoded  # noqa: E402

dst = sys.argv[1]
src = sorted(glob.glob(".cache/bench-jpegs/n8192-*"))[0]
paths = sorted(glob.glob(os.path.join(src, "*", "*.*")))


def write(path):
    data, ext = encoded(path, max_size=256)
    out = os.path.join(dst, os.path.relpath(os.path.splitext(path)[0], src) + ext)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "wb") as f:
        f.write(data)
    return len(data)


if __name__ == "__main__":
    with multiprocessing.Pool() as pool:
        sizes = pool.map(write, paths, chunksize=64)
    print(f"{len(sizes)} images, {sum(sizes) / len(sizes) / 1024:.1f} KiB each on average, in {dst}")
