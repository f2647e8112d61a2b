"""metrics.py METRICS.jsonl OUT.json [PREFIX]: the reproducible part of a trainer's metrics.jsonl.

Keeps every record except the run's configuration (paths, output dir) and checkpoint notices, and
drops timing, speed and memory fields from the rest; float values are kept exactly (repr); paths
under PREFIX (the run's OUTDIR) are written relative to it, as <OUT>/...
"""
import glob
import hashlib
import json
import os
import sys

DROP_TYPES = {"config", "checkpoint"}
# fields that measure time, speed, memory or name a path: not reproducible run to run
DROP_KEYS = {"time", "rate", "eta", "elapsed", "wait", "seconds", "memory", "host", "pid",
             "date", "timestamp"}
PREFIX = None
DROP_PARTS = ("time", "rate", "img/s", "img_s", "per_s", "/s", "eta", "elapsed", "wait",
              "second", "memory", "mem", "throughput", "speed", "_s_", "duration", "lr_time")


def timing(key):
    k = key.lower()
    if k in DROP_KEYS:
        return True
    if k == "lr":  # the learning rate is data, not timing
        return False
    return any(part in k for part in DROP_PARTS) or k.endswith("_s") or k.endswith("_ms")


def clean(value):
    if isinstance(value, dict):
        return {k: clean(v) for k, v in value.items() if not timing(k)}
    if isinstance(value, list):
        return [clean(v) for v in value]
    if isinstance(value, str) and PREFIX and PREFIX in value:
        return value.replace(PREFIX, "<OUT>")
    if isinstance(value, float):
        return repr(value)  # exact, and NaN-safe in JSON
    return value


def main(src, dst, prefix=None):
    global PREFIX
    PREFIX = prefix
    records, dropped = [], set()
    with open(src) as f:
        for line in f:
            if not line.strip():
                continue
            record = json.loads(line)
            if record.get("type") in DROP_TYPES:
                continue
            for k in record:
                if timing(k):
                    dropped.add(k)
            records.append(clean(record))
    steps = [r for r in records if r.get("type") == "train"]
    out = {"records": records, "train_losses": [r.get("loss") for r in steps],
           "final": records[-1] if records else None, "dropped_fields": sorted(dropped)}
    out["checkpoints"] = checkpoint_tensors(os.path.dirname(src))
    with open(dst, "w") as f:
        json.dump(out, f, indent=1, sort_keys=True)


def tensors(value, path=""):
    """(path, sha256 of the bytes, dtype, shape) of every tensor in a loaded checkpoint."""
    import torch

    if isinstance(value, torch.Tensor):
        t = value.detach().cpu().contiguous().reshape(-1)
        digest = hashlib.sha256(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
        yield path, f"{digest.hexdigest()} {t.dtype} {tuple(t.shape)}"
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from tensors(v, f"{path}/{k}")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from tensors(v, f"{path}[{i}]")


def checkpoint_tensors(run_dir):
    """Every tensor of each .pth the run wrote, by file and key."""
    import torch

    found = {}
    for path in sorted(glob.glob(os.path.join(run_dir, "*.pth"))):
        ckpt = torch.load(path, map_location="cpu", weights_only=False)
        found[os.path.basename(path)] = dict(tensors(ckpt))
    return found


if __name__ == "__main__":
    main(*sys.argv[1:])
