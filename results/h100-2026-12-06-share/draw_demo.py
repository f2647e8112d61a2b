"""The PNG root that `data_processing.py SRC --demo --demo-per-group N --demo-size S` writes, byte
for byte, drawn in a process per core (data_processing.py draws in one): the share rows' 2,000
pairs in a fraction of the GPU machine's time. Run from the project root:
    python3 results/h100-2026-12-06-share/draw_demo.py SRC N S"""

import multiprocessing
import os
import sys

import numpy as np

sys.path.insert(0, os.getcwd())
import data_processing as dp  # noqa: E402


def draw(root, size, group, i):
    image, mask = dp._demo_scene(np.random.default_rng([0, group, i]), size, size)
    for kind, picture in (("Images", image), ("Masks", mask)):
        path = os.path.join(root, kind, str(group), f"{i:03d}.png")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        picture.save(path, "PNG", compress_level=1)


if __name__ == "__main__":
    root, per_group, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    keys = [(root, size, g, i) for g in range(1, dp.DEMO_GROUPS + 1) for i in range(per_group)]
    with multiprocessing.Pool() as pool:
        pool.starmap(draw, keys, chunksize=4)
    print(f"{root}: {len(keys)} pairs drawn")
