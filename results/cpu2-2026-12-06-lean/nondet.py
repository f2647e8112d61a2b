"""nondet.py RUN1_DIR RUN2_DIR OUT.json: top-level entries that differ between two identical runs
(pipes.json configurations; classify.json/segment.json top-level fields), for diff.py to skip."""
import json
import os
import sys

from diff import FILES, differences

run1, run2, out = sys.argv[1:]
result = {}
for name in FILES:
    with open(os.path.join(run1, name)) as f:
        a = json.load(f)
    with open(os.path.join(run2, name)) as f:
        b = json.load(f)
    tops = set()
    for path, _, _ in differences(a, b):
        parts = path.split("/")
        if name == "pipes.json" and len(parts) > 2 and parts[1] == "configs":
            # "/configs/<task>/<pipeline>[/<via>]/<name>": the configuration
            key = [k for k in a["configs"] if path.startswith(f"/configs/{k}/")
                   or path.startswith(f"/configs/{k}[") or path == f"/configs/{k}"]
            tops.add(f"/configs/{key[0]}" if key else path)
        else:
            tops.add(path.split("[")[0])
    if tops:
        result[name] = sorted(tops)
with open(out, "w") as f:
    json.dump(result, f, indent=1)
for name, paths in result.items():
    for p in paths:
        print(f"NOT REPRODUCIBLE at base, excluded: {name}{p}")
if not result:
    print("baseline reproducible: two runs identical")
