"""The best-fed variant of sweep.py's share lines, as one line for a shell: ENV|FLAGS (the
environment for patch.py, the trainer's flags, with --compile-mode where its best row was another
mode), or nothing where the default variant in the default mode was best.

    python3 pick.py SWEEP_JSONL
"""

import json
import sys

shares = [json.loads(line) for line in open(sys.argv[1]) if line.startswith("{")]
shares = [r for r in shares if r.get("row") == "share"]
best = max(shares, key=lambda r: r["share"])
print(json.dumps(dict(best=best["variant"], mode=best["mode"], share=best["share"])), file=sys.stderr)
if best["variant"] != "default" or best["mode"] != "default":
    flags = list(best["trainer"]["flags"])
    if best["mode"] != "default":
        flags += ["--compile-mode", best["mode"]]
    env = " ".join(f"{k}={v}" for k, v in best["trainer"]["env"].items())
    print(f"{env}|{' '.join(flags)}")
