"""What --predict needs around a trainer's own predict(), written once for train_classify.py and
train_segment.py: the model to predict with (a checkpoint or a weights file, loaded whole), the
images to predict on, and the refusal to overwrite what a run already wrote.
"""

import contextlib
import os

import torch.distributed as dist
from PIL import Image

import resume
from data_sources import walk
from outputs import atomic_open
from training import UsageError, check_whole, named_as, read_weights

# What --predict reads: PNG and JPEG files, known by their extension (any case).
PREDICT_EXTENSIONS = (".png", ".jpg", ".jpeg")
# The file that marks a folder --predict wrote into: a later --predict on a folder holding it does
# not predict on those outputs.
OUTPUT_MARK = ".predictions"
# The largest image --predict takes: DALI 2.4's CPU decoder decoded a 5,000 x 5,000 PNG and failed
# with std::bad_alloc on 8,000 x 8,000; the segmentation outputs are as large again, many times.
PREDICT_MAX_PIXELS = 5000 * 5000


def checkpoint_to_predict(args, world):
    """--predict's model: --resume's checkpoint (see resume.load), or --weights' file: a
    checkpoint of the trainer's (its run's model flags then taken, as from --resume) or a bare state
    dict (the flags as given), as {"model": state dict}. The trainers call it first: --predict's
    rule is checked before anything is read or written."""
    if not (args.resume or args.weights) or not args.output_dir:
        raise UsageError(
            "--predict runs the model of --resume CHECKPOINT (or --weights FILE) and writes into "
            "--output-dir; pass both"
        )
    if args.resume == "auto" and not os.path.isfile(
        os.path.join(args.output_dir, "checkpoint.pth")
    ):
        raise UsageError(
            f"--resume auto: no checkpoint.pth in --output-dir {args.output_dir} to predict with; "
            "pass --resume CHECKPOINT"
        )
    if args.resume:
        return resume.load(args, world)
    if os.path.isfile(args.weights):  # else torch.load's line names it
        check_whole(args.weights, "--weights")
    try:
        ckpt = read_weights(args.weights)
    except Exception as e:
        why = (str(e).strip() or type(e).__name__).splitlines()[-1][:200]
        raise UsageError(
            f"--weights {args.weights}: not a weights file (a state dict or a checkpoint; {why})"
        ) from None
    if isinstance(ckpt, dict) and isinstance(ckpt.get("args"), dict) and "model" in ckpt:
        resume.take_run_flags(args, ckpt, world, args.weights, scoring=True)
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


def images_to_predict(args, world, writes_images=True):
    """Every PNG or JPEG file under --predict DIR, in any subfolder, sorted; none inside
    --output-dir, which may lie within DIR, or inside an earlier --predict's (it holds OUTPUT_MARK):
    a second run must not predict on the first's output.
    A trainer that ``writes_images`` refuses an --output-dir that is DIR or holds it (its outputs
    would land among the images, on their names); each process needs an image (DALI's shards)."""
    root = args.predict
    if not os.path.isdir(root):
        raise UsageError(
            f"--predict {root}: no such directory (expected PNG or JPEG files under DIR)"
        )
    out = os.path.join(os.path.abspath(args.output_dir), "")
    holds_root = os.path.join(os.path.abspath(root), "").startswith(out)
    if holds_root and writes_images:
        raise UsageError(
            f"--output-dir {args.output_dir}: is --predict {root} or holds it, so the masks would "
            "be written among the images; pass a folder outside DIR (or one within it)"
        )
    found = walk(root)
    outputs = [os.path.join(os.path.dirname(f), "") for f in found if f.endswith(OUTPUT_MARK)]
    files = [
        f
        for f in found
        if f.lower().endswith(PREDICT_EXTENSIONS)
        and (holds_root or not os.path.abspath(f).startswith(out))
        and not f.startswith(tuple(outputs))  # another --predict's outputs
    ]
    if not files:
        raise UsageError(
            f"--predict {root}: no image found (expected PNG or JPEG files under DIR, in any "
            f"subfolder, named .png, .jpg or .jpeg)"
        )
    if len(files) < world.size:
        raise UsageError(
            f"--predict {root}: fewer images ({len(files)}) than processes ({world.size}); each "
            f"process needs one: run at most {len(files)}"
        )
    check_sizes(files)
    return files


def check_sizes(files):
    """An image of more than PREDICT_MAX_PIXELS is refused in one line naming it, from its header
    (PIL reads no pixels to say its size), before any is decoded."""
    for path in files:
        with contextlib.suppress(OSError):  # not an image: DALI's decoder names it
            try:
                with Image.open(path) as im:
                    size = f"{im.width} x {im.height} pixels"
                    small = im.width * im.height <= PREDICT_MAX_PIXELS
            except Image.DecompressionBombError:  # over PIL's own limit, ~179 M pixels
                size, small = "more pixels than PIL opens", False
            if not small:
                raise UsageError(
                    f"{path}: {size}, more than --predict takes ({PREDICT_MAX_PIXELS:,} pixels: "
                    "DALI's CPU decoder runs out of memory on larger ones); downscale it first"
                )


def refuse_overwrite(args, outputs):
    """``outputs``, (file to write, the input it comes from) pairs: refused in one line where two
    inputs would write one file, or, without --overwrite, where a file exists; an --output-dir
    that is a file is refused. Every process checks before any writes."""
    if os.path.exists(args.output_dir) and not os.path.isdir(args.output_dir):
        raise UsageError(
            f"--output-dir {args.output_dir}: is a file; expected a folder for the predictions"
        )
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


def mark_outputs(output_dir):
    """OUTPUT_MARK in --output-dir once predictions are written there: no later --predict takes
    them for its input. A run refused or failed before its first output leaves the folder as it was."""
    path = os.path.join(output_dir, OUTPUT_MARK)
    if not os.path.exists(path):
        with written(path) as f:
            f.write(b"--predict's outputs\n")


@contextlib.contextmanager
def written(path, mode="wb"):
    """``atomic_open(path)``, its folder made first: a full disk or a folder that cannot be written
    is one line naming the file, which is left out whole (the outputs written before it stay)."""
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with atomic_open(path, mode) as f:
            yield f
    except OSError as e:
        raise UsageError(
            f"{path}: could not write it ({e.strerror or e}); the outputs written before it are "
            "kept, none is half-written"
        ) from None
