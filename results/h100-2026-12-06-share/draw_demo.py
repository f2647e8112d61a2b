"""The PNG root that `data_processing.py SRC --demo --demo-per-group N --demo-size S` writes, byte
for byte, drawn in a process per core (data_processing.py draws in one): the share rows' 2,000
pairs in a fraction of the GPU machine's time. Run from the project root:
    python3 results/h100-2026-12-06-share/draw_demo.py SRC N S"""

import multiprocessing
import os
import sys

sys.path.insert(0, os.getcwd())
import data_processing as dp  # noqa: E402


def draw(root, size, group, i):
    for name, data in dp.demo_pair(group, i, (size, size)).items():
        dp._write_atomic(os.path.join(root, name), data)


if __name__ == "__main__":
    root, per_group, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    keys = [(root, size, g, i) for g in range(1, dp.DEMO_GROUPS + 1) for i in range(per_group)]
    with multiprocessing.Pool() as pool:
        pool.starmap(draw, keys, chunksize=4)
    print(f"{root}: {len(keys)} pairs drawn")
