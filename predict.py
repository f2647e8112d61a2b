"""What --predict needs around a trainer's own predict(), written once for train_classify.py and
train_segment.py: the model to predict with (a checkpoint or a weights file, loaded whole), the
images to predict on, and the refusal to overwrite what a run already wrote.
"""

import os

import torch.distributed as dist

from data_sources import walk
from training import (
    UsageError,
    checkpoint_to_resume,
    evaluate_as_trained,
    named_as,
    read_weights,
)

# What --predict reads: PNG and JPEG files, known by their extension (any case).
PREDICT_EXTENSIONS = (".png", ".jpg", ".jpeg")


def checkpoint_to_predict(args, as_trained):
    """--predict's model: --resume's checkpoint (see checkpoint_to_resume), or --weights' file: a
    checkpoint of the trainer's (the flags in ``as_trained`` then its run's unless given) or a
    bare state dict (the flags as given), as {"model": state dict}."""
    if args.resume:
        return checkpoint_to_resume(args, as_trained)
    try:
        ckpt = read_weights(args.weights)
    except Exception as e:
        why = (str(e).strip() or type(e).__name__).splitlines()[-1][:200]
        raise UsageError(
            f"--weights {args.weights}: not a weights file (a state dict or a checkpoint; {why})"
        ) from None
    if isinstance(ckpt, dict) and isinstance(ckpt.get("args"), dict) and "model" in ckpt:
        evaluate_as_trained(args, ckpt["args"], as_trained)
        return ckpt
    return {"model": ckpt}


def load_to_predict(model, ckpt, args, world):
    """``model`` with ``ckpt``'s weights, every tensor (a head left random would predict
    nonsense), on this process's device, in eval mode."""
    state = named_as(ckpt["model"], model.state_dict())
    try:
        model.load_state_dict(state)
    except RuntimeError as e:
        where = f"--resume {args.resume}" if args.resume else f"--weights {args.weights}"
        raise UsageError(
            f"{where}: its weights do not fit this model ({str(e).splitlines()[1].strip()}); "
            f"pass the model flags it was trained with"
        ) from None
    return model.to(world.device).eval()


def images_to_predict(args):
    """Every PNG or JPEG file under --predict DIR, in any subfolder, sorted; none inside
    --output-dir, which may lie within DIR: a second run must not predict on the first's output."""
    root = args.predict
    if not os.path.isdir(root):
        raise UsageError(
            f"--predict {root}: no such directory (expected PNG or JPEG files under DIR)"
        )
    out = os.path.join(os.path.abspath(args.output_dir), "")
    files = [
        f
        for f in walk(root)
        if f.lower().endswith(PREDICT_EXTENSIONS) and not os.path.abspath(f).startswith(out)
    ]
    if not files:
        raise UsageError(
            f"--predict {root}: no image found (expected PNG or JPEG files under DIR, in any "
            f"subfolder, named .png, .jpg or .jpeg)"
        )
    return files


def refuse_overwrite(args, outputs):
    """``outputs``, (file to write, the input it comes from) pairs: refused in one line where two
    inputs would write one file, or, without --overwrite, where a file exists. Every process
    checks before any writes."""
    made_from = {}
    for path, source in outputs:
        if path in made_from:
            raise UsageError(
                f"{made_from[path]} and {source}: both would be written as {path}; rename one"
            )
        made_from[path] = source
    if not args.overwrite and (found := next(filter(os.path.exists, made_from), None)):
        raise UsageError(
            f"{found}: exists; pass --overwrite to replace it, or another --output-dir"
        )
    if dist.is_initialized():
        dist.barrier()  # no process writes before every one has checked
