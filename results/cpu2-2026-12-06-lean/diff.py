"""diff.py BASE_DIR OTHER_DIR [--max N]: compares pipes.json, classify.json and segment.json.

Prints "IDENTICAL" (exit 0) or the first N differing entries (exit 1). Entries listed in
BASE_DIR/nondeterministic.json (found by running the baseline twice) are left out, with a note.
"""
import argparse
import json
import os
import sys

FILES = ("pipes.json", "classify.json", "segment.json")


def short(value, width=160):
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= width else text[: width - 3] + "..."


def differences(a, b, path=""):
    """(path, a, b) of every differing leaf; a missing key reads as <absent>."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b), key=str):
            sub = f"{path}/{key}"
            if key not in a:
                yield sub, "<absent>", b[key]
            elif key not in b:
                yield sub, a[key], "<absent>"
            else:
                yield from differences(a[key], b[key], sub)
    elif isinstance(a, list) and isinstance(b, list):
        for i, (x, y) in enumerate(zip(a, b)):
            yield from differences(x, y, f"{path}[{i}]")
        if len(a) != len(b):
            yield f"{path}.length", len(a), len(b)
    elif a != b:
        yield path, a, b


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("base")
    parser.add_argument("other")
    parser.add_argument("--max", type=int, default=20)
    args = parser.parse_args()
    excluded = {}
    nondet = os.path.join(args.base, "nondeterministic.json")
    if os.path.exists(nondet):
        with open(nondet) as f:
            excluded = json.load(f)  # {file: [top-level paths to skip]}
    found, per_config = [], {}
    for name in FILES:
        with open(os.path.join(args.base, name)) as f:
            a = json.load(f)
        other = os.path.join(args.other, name)
        if not os.path.exists(other):
            found.append((name, "", "<present>", "<missing file>"))
            continue
        with open(other) as f:
            b = json.load(f)
        # Issue 67 removed the start-up memory record on purpose (memory is one peak figure in the
        # epoch record, whose memory fields metrics.py drops): compare the records without it.
        for side in (a, b):
            if "records" in side:
                side["records"] = [r for r in side["records"] if r.get("type") != "memory"]
        skip = excluded.get(name, [])
        configs = sorted(a.get("configs", {}), key=len, reverse=True) if name == "pipes.json" else []
        for path, x, y in differences(a, b):
            if any(path == s or path.startswith(s + "/") or path.startswith(s + "[")
                   for s in skip):
                continue
            found.append((name, path, x, y))
            top = path.split("[")[0]
            for key in configs:  # the configuration a pipes.json entry belongs to
                if path.startswith(f"/configs/{key}/") or path.startswith(f"/configs/{key}["):
                    top = f"/configs/{key}"
                    break
            per_config[f"{name}:{top}"] = per_config.get(f"{name}:{top}", 0) + 1
    for name, paths in excluded.items():
        for p in paths:
            print(f"note: {name}{p} left out (not reproducible run to run at base)")
    if not found:
        print("IDENTICAL")
        return 0
    print(f"DIFFERENT: {len(found)} differing entries in {len(per_config)} places")
    for name, path, x, y in found[: args.max]:
        print(f"  {name}{path}\n      base:  {short(x)}\n      other: {short(y)}")
    if len(found) > args.max:
        print(f"  ... {len(found) - args.max} more")
    print("differing entries per configuration:")
    for key, n in list(per_config.items())[:60]:
        print(f"  {key}: {n}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
