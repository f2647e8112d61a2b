"""The best-fed variant of sweep.py's share lines, among those with the decoder cache ("on") or
without it ("off"), as one line for a shell: ENV|FLAGS|SHARE (the environment for patch.py, the
trainer's flags, --compile-mode where the best row was in another mode, and its share).

    python3 pick.py SWEEP_JSONL on|off
"""

import json
import sys

path, cache = sys.argv[1], sys.argv[2] == "on"
shares = [json.loads(line) for line in open(path) if line.startswith("{")]
shares = [r for r in shares if r.get("row") == "share"]
shares = [r for r in shares if ("--decoder-cache" in r["trainer"]["flags"]) == cache]
best = max(shares, key=lambda r: r["share"])
flags = [f for f in best["trainer"]["flags"] if f not in ("--decoder-cache", "on")]
if best["mode"] != "default":
    flags += ["--compile-mode", best["mode"]]
env = " ".join(f"{k}={v}" for k, v in best["trainer"]["env"].items())
print(f"{env}|{' '.join(flags)}|{best['share']}")
