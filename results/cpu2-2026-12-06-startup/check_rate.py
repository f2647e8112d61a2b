"""Files a second of data_sources.check_image_heads over one folder of images, in a process of its
own for each copy of the project (an empty header-check cache each: a first check), alternated
twice; the first copy's check is run a second time, over its cache (a second start).

    python results/cpu2-2026-12-06-startup/check_rate.py TREE/train AFTER_DIR BEFORE_DIR OUT.json
"""

import json
import os
import subprocess
import sys
import tempfile

CHILD = r"""
import sys, time
sys.path.insert(0, sys.argv[1])
import data_sources
files = data_sources.walk(sys.argv[2])
for attempt in range(int(sys.argv[3])):
    start = time.perf_counter()
    data_sources.check_image_heads(files, sys.argv[2])
    seconds = time.perf_counter() - start
    print(len(files), round(seconds, 2), round(len(files) / seconds), flush=True)
"""


def main(folder, after, before, out):
    rows = []
    for _ in range(2):
        for code, name, checks in ((after, "after", 2), (before, "before", 1)):
            with tempfile.TemporaryDirectory() as cache:
                load = os.getloadavg()[0]
                found = subprocess.run(
                    [sys.executable, "-c", CHILD, code, folder, str(checks)],
                    capture_output=True, text=True, check=True,
                    env=dict(os.environ, XDG_CACHE_HOME=cache),
                )  # fmt: skip
            for k, line in enumerate(found.stdout.splitlines()):
                files, seconds, rate = line.split()
                rows.append(
                    dict(code=name, start=("first", "second")[k], files=int(files),
                         seconds=float(seconds), files_per_s=int(rate), load_average=load)
                )  # fmt: skip
                print(rows[-1], flush=True)
    with open(out, "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main(*sys.argv[1:])
