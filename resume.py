"""Continuing a run from its checkpoint, written once for train_classify.py and train_segment.py.
A fresh run enters none of it; a trainer calls it where a checkpoint is in play:

    ckpt = resume.load(args, world) if args.resume or args.evaluate else None  # the run's flags
    dali_states, first_epoch = resume.pipeline_state(ckpt, args, world)   # its pipelines' state
    start = resume.restore(ckpt, args, world, state, data, log, build)     # its weights and step

The rule: a resume is its run continued. Every flag is the checkpoint's, but
    COMMAND_FLAGS   this command's own: which checkpoint, where the run is, what to do with it;
    MAY_CHANGE      the run's plumbing: this command's, one line where given otherwise;
    SCHEDULE_FLAGS  the run's where left out; given otherwise, this command's, and the lr schedule
                    is drawn again from the checkpoint's step (follow_schedule's line).
Any other flag given with another value than its run's would change what is trained or read: it
is refused in one line. A flag the checkpoint predates was its default in that run. The global
batch is the run's, -b its share on this number of processes (take_run_batch); the learning rate is
compared as the rate the flags give (take_run_rate). --evaluate and --predict take the flags that
shape the model (SCORED_AS_TRAINED) and may score at other sizes (RESCORABLE).
"""

import argparse
import dataclasses
import hashlib
import math
import os
import sys
import warnings

import torch

from training import (
    COMPILE_CACHE,
    RunComplete,
    Start,
    UsageError,
    check_whole,
    learning_rate,
    make_scheduler,
)

# What a checkpoint must hold to be resumed, or only scored (--evaluate, --predict).
TO_RESUME = (
    "model",
    "optimizer",
    "scheduler",
    "scaler",
    "epoch",
    "step",
    "best",
    "classes",
    "rng",
    "num_samples",
    "world_size",
    "args",
)
TO_EVALUATE = ("model", "classes", "args")
# The types of what a resume reads of a checkpoint beside the state dicts.
CHECKPOINT_TYPES = dict(
    epoch=int,
    step=int,
    world_size=int,
    num_samples=int,
    batch_size=int,
    best=float,
    classes=list,
    rng=list,
    model=dict,
)

# This command's own, never the checkpoint's: which checkpoint, where the data and the run folder
# are, what the command does; the decoder cache is the run's by a rule of its own (decoder_cache).
COMMAND_FLAGS = (
    "resume",
    "output_dir",
    "overwrite",
    "evaluate",
    "predict",
    "data",
    "weights",
    "decoder_cache",
    "dist_url",
    "tta",
    "given",
    "demo",
)
# The run's plumbing, which a continuation may change: this command's, said where given otherwise.
MAY_CHANGE = (
    "workers",
    "print_freq",
    "checkpoint_every",
    "tensorboard",
    "device",
    "compile",
    "compile_mode",
    "use_deterministic_algorithms",
    "hw_decoder_load",
)
# The flags that shape the lr schedule besides the rate (the optimizer's state holds that): the
# run's where left out; given with other values, their schedule from the checkpoint's step on.
SCHEDULE_FLAGS = (
    "epochs",
    "lr_scheduler",
    "lr_warmup_epochs",
    "lr_warmup_method",
    "lr_warmup_decay",
    "lr_min",
    "lr_step_size",
    "lr_gamma",
)
# The flags that set the learning rate (training.learning_rate).
RATE_FLAGS = ("lr", "lr_base", "lr_base_size", "lr_base_scale")
# What --evaluate and --predict take from the checkpoint unless given: the model's flags and the
# sizes its run validated at. A given size scores at that size; another given model is refused.
SCORED_AS_TRAINED = (
    "arch",
    "num_classes",
    "label_offset",
    "unet_width",
    "val_resize_size",
    "val_crop_size",
    "size",
    "aux_loss",  # a torchvision model's auxiliary classifier: its weights are in the checkpoint
)
RESCORABLE = ("val_resize_size", "val_crop_size", "size")
# --evaluate scores what its run validated, its EMA too where it kept one: --model-ema is the run's
# unless given (--no-model-ema: the raw model).
EVALUATED_AS_TRAINED = SCORED_AS_TRAINED + ("model_ema",)


def load(args, world):
    """The checkpoint --resume names, loaded, its run's flags taken into ``args`` (see the rule
    above); None for ``--resume auto`` where --output-dir holds no checkpoint.pth (a fresh start).
    ``--resume auto`` then names the file. A checkpoint that lacks what this command needs of it
    is refused in one line that says what is missing. The trainers call it before anything is
    built or written, also for --evaluate without --resume, whose rules it checks first."""
    if args.evaluate and not args.resume:
        raise UsageError(
            "--evaluate scores the model of --resume CHECKPOINT; pass one "
            "(without it the weights are random)"
        )
    if args.resume == "auto" and (not args.output_dir or args.evaluate):
        raise UsageError(
            "--resume auto continues the run in --output-dir: pass --output-dir, and no --evaluate"
        )
    scoring = bool(args.evaluate or getattr(args, "predict", None))  # the model, not the run
    if args.resume == "auto":
        path = os.path.join(args.output_dir, "checkpoint.pth")
        args.resume = path if os.path.isfile(path) else ""
    if not args.resume:
        return None
    ckpt = load_checkpoint(args.resume)
    needed = TO_EVALUATE if scoring else TO_RESUME
    missing = [key for key in needed if key not in ckpt]
    missing += [f"args.{key}" for key in ("arch", "batch_size") if key not in ckpt["args"]]
    if missing:
        raise UsageError(
            f"--resume {args.resume}: lacks {', '.join(missing)}, which {script()} writes in "
            f"every checkpoint (an older version's or an edited file); start anew, or --weights it"
        )
    if wrong := malformed(ckpt):
        raise UsageError(
            f"--resume {args.resume}: its {', '.join(wrong)} of another type than {script()} "
            f"writes (an edited or damaged file); start anew, or --weights it"
        )
    if args.weights and world.main:
        print(
            f"--weights {args.weights}: not loaded; --resume {args.resume} brings its own weights",
            flush=True,
        )
    take_run_flags(args, ckpt, world, args.resume, scoring)
    if not scoring and args.loader == "dali" and not ckpt.get("dali"):
        raise UsageError(
            f"--resume {args.resume}: holds no DALI state (its run had --loader synthetic), so "
            f"DALI cannot continue where it stopped; resume with --loader synthetic, "
            f"or --weights it"
        )
    return ckpt


def malformed(ckpt):
    """What of ``ckpt`` is of another type than the trainers write it: CHECKPOINT_TYPES, a batch of
    at least 1, the rate flags numbers (or unset), the DALI states one byte string a process."""
    saved = [(k, ckpt[k]) for k in CHECKPOINT_TYPES if k in ckpt]
    saved += [(f"args.{k}", ckpt["args"][k]) for k in ("batch_size",) if k in ckpt["args"]]
    wrong = [k for k, v in saved if not of_type(v, CHECKPOINT_TYPES[k.removeprefix("args.")])]
    if "args.batch_size" not in wrong and ckpt["args"].get("batch_size", 1) < 1:
        wrong.append("args.batch_size")
    rates = [k for k in RATE_FLAGS if ckpt["args"].get(k) is not None]
    wrong += [f"args.{k}" for k in rates if not of_type(ckpt["args"][k], float)]
    dali = ckpt.get("dali")
    states = isinstance(dali, list) and all(isinstance(state, bytes) for state in dali)
    if dali is not None and not (states and len(dali) == ckpt.get("world_size", len(dali))):
        wrong.append("dali")
    return wrong


def same_kind(then, now):
    """Whether a flag's value in a checkpoint, ``then``, is of the kind this command gives it,
    ``now``: either unset, both numbers, both lists, or of one type."""
    if then is None or now is None:
        return True
    if of_type(then, float) and of_type(now, float):
        return True
    lists = (list, tuple)
    return isinstance(then, lists) and isinstance(now, lists) or type(then) is type(now)


def of_type(value, kind):
    """Whether ``value`` is a ``kind`` as torch.load gives it back (a float may be a whole number,
    or infinite; a bool is no number)."""
    if kind is float:
        kind = (int, float)
    return isinstance(value, kind) and not isinstance(value, bool)


def load_checkpoint(path):
    if not os.path.isfile(path):
        raise UsageError(f"--resume {path}: no such checkpoint file")
    check_whole(path, "--resume")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UsageError(f"--resume {path}: not a readable checkpoint ({why[:200]})") from None
    if not isinstance(ckpt, dict) or not isinstance(ckpt.get("args"), dict):
        raise UsageError(f"--resume {path}: not a checkpoint written by {script()}")
    return ckpt


# ------------------------------------------------------------------------------------------
# the rule
# ------------------------------------------------------------------------------------------


def take_run_flags(args, ckpt, world, source, scoring):
    """``args`` made the run's, by the rule of this module's docstring; ``source``, the checkpoint's
    file, is named in the lines it gives. ``scoring``: --evaluate or --predict, which take the
    SCORED_AS_TRAINED flags alone."""
    saved, given = ckpt["args"], args.given
    if alien := [k for k in SCORED_AS_TRAINED if k in saved and not hasattr(args, k)]:
        raise UsageError(
            f"{source}: another task's checkpoint (--arch {saved.get('arch')}, "
            f"{flag_text(alien[0], saved[alien[0]])}, a flag {script()} lacks); pass it to the "
            f"trainer that wrote it"
        )
    names = SCORED_AS_TRAINED if scoring else list(vars(args))
    if args.evaluate:
        names = EVALUATED_AS_TRAINED
    own = COMMAND_FLAGS + RATE_FLAGS + ("batch_size",)  # not compared, or by rules of their own
    # the command's, where given
    ours = RESCORABLE + ("model_ema",) if scoring else MAY_CHANGE + SCHEDULE_FLAGS
    if not scoring:
        take_run_rate(args, ckpt, world, source)
        take_run_batch(args, ckpt, world)
    taken, changed = [], []
    for name in names:
        if name in own or not hasattr(args, name):
            continue
        now = getattr(args, name)
        then = saved.get(name, given.get(name, now))  # a flag it predates: its default then
        if not same_kind(then, now):
            raise UsageError(
                f"{source}: its --{name.replace('_', '-')} is {then!r}, of another type than "
                f"{script()} gives it (an edited or damaged file); start anew, or --weights it"
            )
        if then == now:
            continue
        if name in given:
            if name not in ours:  # it would change what is trained or read
                raise refusal(source, name, then, now)
            if not scoring and name not in SCHEDULE_FLAGS:  # follow_schedule says the schedule's
                changed.append((name, then))
        elif scoring or name not in MAY_CHANGE:  # --epochs left out: the run's, not the default
            setattr(args, name, then)
            taken.append(name)
    if world.main and taken:
        what = "--evaluate" if args.evaluate else "--predict" if scoring else "--resume"
        flags = " ".join(flag_text(k, getattr(args, k)) for k in taken)
        print(f"{what}: {flags}, as in {source}", flush=True)
    if world.main and args.evaluate and args.model_ema:
        print(f"--evaluate: scores the EMA of {source}; --no-model-ema: its raw model", flush=True)
    if world.main and changed:
        flags = " ".join(flag_text(k, getattr(args, k)) for k, _ in changed)
        had = " ".join(flag_text(k, v) for k, v in changed)
        print(f"--resume {source}: {flags}, where its run had {had}", flush=True)
    if not scoring:
        check_device_flags(args, world, source)


def flag_text(name, value):
    """A flag as a command line gives it: "--name value", "--name" for a switch that is on, "no
    --name" for one that is off or unset."""
    flag = "--" + name.replace("_", "-")
    if value is True:
        return flag
    if value is None or value is False:
        return f"no {flag}"
    if isinstance(value, (list, tuple)):
        return " ".join([flag, *map(str, value)])
    return f"{flag} {value}"


def refusal(source, name, then, now):
    """The line that refuses ``name``, given as ``now`` where its run had ``then``: both values as
    a command line gives them (a 0 is a value, a list its values)."""
    return UsageError(
        f"--resume {source}: its run had {flag_text(name, then)}, this command gives "
        f"{flag_text(name, now)}; resume with the run's, or --weights it"
    )


def take_run_rate(args, ckpt, world, source):
    """The learning rate is the run's (its optimizer's state holds it): the rate flags become the
    checkpoint's, so that the log and --lr-min's check say that rate. Given flags that give another
    rate are refused; but a run from before --lr-base, whose --lr was per 256 images, goes on at its
    rate with its own command, said in one line."""
    saved = ckpt["args"]
    given = {k for k in saved.get("given", ()) if k in RATE_FLAGS}
    older = "lr_base" not in saved
    # a run from before --lr-base-scale scaled --lr-base linearly
    rate = dict(opt=saved.get("opt"), lr_base_scale=saved.get("lr_base_scale", "linear"))
    if not older:
        then = argparse.Namespace(given=given, **{**{k: saved.get(k) for k in RATE_FLAGS}, **rate})
    elif "lr" in saved:
        given = {"lr_base"} if "lr" in given else set()
        then = argparse.Namespace(
            given=given, lr=None, lr_base=saved["lr"], lr_base_size=256, **rate
        )
    else:
        return
    global_batch = saved["batch_size"] * ckpt["world_size"]
    (lr, _), (asked, asked_from) = (learning_rate(run, global_batch) for run in (then, args))
    other = not math.isclose(lr, asked)
    if other and not older and any(k in args.given for k in RATE_FLAGS):
        raise UsageError(
            f"--resume {source}: taken with lr {lr:.6g}, this run has {asked:.6g} ({asked_from}); "
            f"resume with the same, or --weights it"
        )
    for k in RATE_FLAGS:
        setattr(args, k, getattr(then, k))
        args.given.pop(k, None)
    args.given.update({k: None for k in given})  # as the run had them
    if other and older and world.main:
        print(
            f"--resume {source}: continues at its run's lr {lr:.6g} (a run from before "
            f"--lr-base: its --lr was per 256), not this command's {asked:.6g} ({asked_from}); "
            f"to train at another, --weights it",
            flush=True,
        )


def take_run_batch(args, ckpt, world):
    """The run's global batch goes on: on another number of processes -b becomes its share, and
    with it the steps per epoch and the lr schedule are as they were. A -b as its run had it (a
    requeued job runs its first command again) asks for the same. One line names the choices
    where the processes cannot share the batch evenly, or -b gives another global batch; on as
    many processes as its run, check_fits refuses another -b."""
    then, batch = ckpt["world_size"], ckpt["args"]["batch_size"]
    total, size = then * batch, world.size
    if size == then:
        if "batch_size" not in args.given:
            args.batch_size = batch
        return
    where = f"--resume {args.resume}: taken with {then} process(es) x batch {batch}"
    if total % size or total // size < 2:  # training needs 2 samples a batch (BatchNorm)
        counts = [str(k) for k in range(1, total // 2 + 1) if total % k == 0]
        choices = " or ".join([", ".join(counts[:-1]), counts[-1]] if counts[1:] else counts)
        raise UsageError(
            f"{where}, a global batch of {total}, which {size} processes cannot share evenly; "
            f"run on {choices} process(es), or --weights it"
        )
    if "batch_size" in args.given and args.batch_size not in (batch, total // size):
        raise UsageError(
            f"{where}: -b {args.batch_size} on {size} processes gives a global batch of "
            f"{args.batch_size * size}, not its {total}; pass -b {total // size} (or no -b), or "
            f"--weights it"
        )
    args.batch_size = total // size


def check_device_flags(args, world, source):
    """The run's flags that need a GPU, on a machine where none is visible: DALI cannot restore a
    GPU pipeline's state on the CPU."""
    if world.device.type == "cuda":
        return
    for name, needs_gpu in (("dali_device", args.dali_device == "gpu"), ("sync_bn", args.sync_bn)):
        if needs_gpu:
            raise UsageError(
                f"--resume {source}: its run had {flag_text(name, getattr(args, name))}, which "
                f"needs a CUDA device, and none is visible; resume where one is, or --weights it"
            )


# ------------------------------------------------------------------------------------------
# the run's state
# ------------------------------------------------------------------------------------------


def pipeline_state(ckpt, args, world):
    """(the DALI states this run's training pipelines are restored from, or None; the epoch they
    count from, for the epoch's crop size, --ra-sampler's order and their seed). A checkpoint of
    another number of processes restores none: this run's pipelines start afresh with the epoch
    after its own (RestOfEpoch reads the rest of that)."""
    if not ckpt or args.evaluate:
        return None, 1
    if ckpt["world_size"] != world.size:
        return None, ckpt["epoch"] + 1
    return ckpt.get("dali"), ckpt.get("first_epoch", 1)


def decoder_cache(ckpt, args, log):
    """The decoder cache of a resume whose pipelines are restored: as its run had it (a GPU has one
    cache, and RestOfEpoch's pipelines are its run's); --decoder-cache is said not to be taken."""
    cache = ckpt.get("decoder_cache")
    if "decoder_cache" in args.given:
        had = f"{cache} MB" if cache else "off"
        log(
            {"type": "decoder_cache", "mb": cache},
            f"decoder cache {had}, as its run had it: --decoder-cache {args.decoder_cache} is "
            f"not taken at a resume",
        )
    return cache


def restore(ckpt, args, world, state, data, log, build):
    """Where the run goes on (training.Start), ``state`` loaded from ``ckpt``, once the checkpoint
    is found to fit this run's data (check_fits). ``data``: the trainer's training.RunData, which
    takes the rest of a mid-epoch checkpoint's epoch of another number of processes
    (RestOfEpoch, its iterators made by ``build``); ``log`` keeps the records up to the
    checkpoint's step."""
    check_fits(ckpt, args, data, world)
    schedule = changed_schedule(ckpt, args)
    load_state(ckpt, args, state, skip=("scheduler",) if schedule else ())
    if args.evaluate:
        return Start()
    start = position(ckpt, args, world, data.steps)
    validating = start.step == data.steps  # stopped in the epoch's validation: it runs again
    log(
        {"type": "resume", "epoch": start.epoch, "step": start.step},
        f"resumed from {args.resume}: epoch {start.epoch}, after step {start.step} of {data.steps}"
        + (", stopped in its validation: validated now" if validating else ""),
    )
    mid_epoch = 0 < start.step < data.steps
    log_new_shape(ckpt, args, world, mid_epoch, log)
    if args.compile:
        load_compile_cache(os.path.dirname(args.resume), log)
    if schedule:
        follow_schedule(ckpt, args, state, data.steps, schedule, log)
    if args.loader == "dali" and validating:
        data.rest = NoStepLeft()
    elif args.loader == "dali" and ckpt["world_size"] != world.size and mid_epoch:
        data.rest = RestOfEpoch(ckpt, args, world, build)
    if log.continuing:  # the steps after the checkpoint run again: their records go
        last = ckpt.get("global_step", math.inf)
        log.keep = lambda r: not logged_after(r, last)
    return start


def load_compile_cache(run_dir, log):
    """The run's torch.compile work (training.save_compile_cache) put into this node's cache, so
    the first step finds its graphs compiled. A damaged file is left out and replaced at the next
    checkpoint; one of another torch or GPU is never used: its entries' keys do not match."""
    path = os.path.join(run_dir, COMPILE_CACHE)
    try:
        with open(path, "rb") as f:
            digest, artifacts = f.read(32), f.read()
    except FileNotFoundError:
        return  # a run of an eager start, or saved before the compile
    if hashlib.sha256(artifacts).digest() != digest:
        log({"type": "compile_cache", "path": path, "used": False}, f"{path}: damaged, not used")
        return
    torch.compiler.load_cache_artifacts(artifacts)
    log({"type": "compile_cache", "path": path, "used": True})


def check_fits(ckpt, args, data, world):
    """One line on the first way the checkpoint does not fit this run's data: other classes,
    another global batch or number of samples, other training files (``data.digest``, the main
    process's alone; older checkpoints have none)."""
    where = f"--resume {args.resume}"
    if (theirs := ckpt["classes"]) != data.classes:
        k = next((i for i, (x, y) in enumerate(zip(theirs, data.classes)) if x != y), None)
        if k is None:
            differs = f"{len(theirs)} classes there, {len(data.classes)} in --data"
        else:
            differs = f"class {k} is {theirs[k]!r} there and {data.classes[k]!r} in --data"
        raise UsageError(f"{where}: trained on other classes ({differs})")
    if args.evaluate:  # scoring needs only the model and its classes
        return
    other_data = "resume on that run's data, at any path, or --weights it"
    if ckpt["num_samples"] != data.num_samples:
        raise UsageError(
            f"{where}: trained on other data ({ckpt['num_samples']} training samples, "
            f"--data {args.data} has {data.num_samples}); {other_data}"
        )
    then = (ckpt["world_size"], ckpt["args"]["batch_size"])
    if then[0] * then[1] != world.size * args.batch_size:
        raise UsageError(
            f"{where}: taken with {then[0]} process(es) x batch {then[1]}, this run has "
            f"{world.size} x {args.batch_size}; resume with the same global batch, so the "
            f"remaining steps and samples are the same"
        )
    if data.digest and ckpt.get("data_digest", data.digest) != data.digest:
        raise UsageError(
            f"{where}: trained on other data (the names, sizes or ETags of the training files in "
            f"--data {args.data} differ from its run's); {other_data}"
        )
    if ckpt.get("steps", data.steps) != data.steps:  # --ra-sampler's may differ on other processes
        raise UsageError(
            f"{where}: its run had {ckpt['steps']} steps per epoch, this one has {data.steps}; "
            f"resume on {ckpt['world_size']} process(es), or --weights it"
        )


def load_state(ckpt, args, state, skip=()):
    """``state``'s weights (and a resume's optimizer, schedule and scaler) from ``ckpt``."""
    if state["model_ema"] is not None and ckpt.get("model_ema") is None:
        raise UsageError(
            f"--resume {args.resume}: holds no EMA weights (its run had no --model-ema)"
        )
    for name in ("model", "model_ema") if args.evaluate else state:
        try:
            if state[name] is not None and name not in skip:
                state[name].load_state_dict(ckpt[name])
        except RuntimeError as e:
            raise UsageError(
                f"--resume {args.resume}: its weights do not fit this model "
                f"({str(e).splitlines()[1].strip()})"
            ) from None


def position(ckpt, args, world, steps):
    """The step after the checkpoint's, this process's random state and loss sum as they were."""
    if world.rank < len(ckpt["rng"]):
        torch.set_rng_state(ckpt["rng"][world.rank])  # mixup and cutmix draw from it
    else:  # a process its run did not have: a state of its own
        torch.manual_seed(args.seed + world.rank)
    if ckpt["step"] == steps and ckpt.get("validated", True):  # older ones: saved validated
        epoch, step = ckpt["epoch"] + 1, 0
    else:  # within the epoch, or after its last step and before its validation's end
        epoch, step = ckpt["epoch"], ckpt["step"]
    if epoch > args.epochs:
        raise RunComplete(
            f"--resume {args.resume}: its run is complete ({ckpt['epoch']} of {args.epochs} "
            f"epochs, best {ckpt['best']:.3f}); nothing to train"
        )
    loss_sum = resumed_loss_sum(ckpt, args, world) if step else 0.0
    return Start(epoch, step, ckpt["best"], loss_sum)


def log_new_shape(ckpt, args, world, mid_epoch, log):
    """One line where the run goes on with another number of processes: its batch per process,
    and how the rest of a ``mid_epoch`` checkpoint's epoch is read (see RestOfEpoch)."""
    then, batch = ckpt["world_size"], ckpt["args"]["batch_size"]
    if then == world.size:
        return
    rest = ""
    if mid_epoch and args.loader == "dali":
        rest = (
            f"; the rest of epoch {ckpt['epoch']} reads its run's {then} shard(s) as they would "
            f"have, each remaining sample once"
        )
    log(
        {"type": "new_shape", "world_size": [then, world.size], "batch": [batch, args.batch_size]},
        f"--resume {args.resume}: taken with {then} process(es) x batch {batch}, goes on with "
        f"{world.size} x {args.batch_size}, the same global batch {then * batch}{rest}",
    )


def resumed_loss_sum(ckpt, args, world):
    """This process's loss summed over the epoch's steps before a mid-epoch checkpoint (the
    epoch's mean loss needs it); 0 from a checkpoint older than the sums. Anything else than a
    finite number for each process is refused in one line. On another number of processes, each
    takes the mean of the sums (see shared_sums)."""
    then = ckpt.get("world_size", world.size)
    sums = ckpt.get("loss_sum", [0.0] * then)
    numbers = isinstance(sums, (list, tuple)) and len(sums) == then
    if not numbers or not all(type(s) in (int, float) and math.isfinite(s) for s in sums):
        raise UsageError(
            f"--resume {args.resume}: its loss_sum is not {then} finite number(s), one a "
            f"process, as {script()} writes it (an edited or damaged file); start anew, or "
            f"--weights it"
        )
    return sums[world.rank] if then == world.size else shared_sums(sums, world.size)[world.rank]


def shared_sums(sums, size):
    """Loss sums of one process count over ``size`` processes. Each is a sum of batch means, and
    the epoch's mean loss divides their total by the processes: each new one takes their mean."""
    return [sum(sums) / len(sums)] * size


def changed_schedule(ckpt, args):
    """The SCHEDULE_FLAGS whose values differ from the checkpoint's run's."""
    saved = ckpt["args"]
    return [k for k in SCHEDULE_FLAGS if k in saved and saved[k] != getattr(args, k)]


def follow_schedule(ckpt, args, state, steps, changed, log):
    """A resume with other schedule flags than its run's (--epochs 3 after 2, say) gets the
    schedule those flags give, at the checkpoint's step, as a run started with them would have
    it, and one line says so; the checkpoint's own schedule would go on past its end (a cosine
    climbs back to the peak)."""
    saved = ckpt["args"]
    optimizer, done = state["optimizer"], ckpt.get("global_step")
    if done is None:  # a checkpoint from before global_step was saved
        done = (ckpt["epoch"] - 1) * steps + ckpt["step"]
    was = optimizer.param_groups[0]["lr"]
    for group in optimizer.param_groups:  # as a new run's optimizer starts, at the full lr
        group["lr"] = group["initial_lr"]
    scheduler = make_scheduler(optimizer, args, steps)
    with warnings.catch_warnings():  # torch warns of a scheduler stepped before the optimizer
        warnings.simplefilter("ignore")
        for _ in range(done):
            scheduler.step()
    state["scheduler"] = scheduler
    now = optimizer.param_groups[0]["lr"]
    flags = ", ".join(f"--{k.replace('_', '-')} {getattr(args, k)}" for k in changed)
    had = ", ".join(str(saved[k]) for k in changed)
    log(
        {"type": "schedule", "changed": {k: [saved[k], getattr(args, k)] for k in changed}},
        f"--resume {args.resume}: {flags} (its run had {had}): the lr schedule is this run's, "
        f"taken up at step {done}: lr {now:.5f}, where its run's was at {was:.5f}",
    )


def logged_after(record, last):
    """Whether ``record`` is of a step after global step ``last``; one whose step is not a number
    (written by hand or by another tool) is kept, as one without a step is."""
    step = record.get("global_step")
    return isinstance(step, (int, float)) and not isinstance(step, bool) and step > last


def script():
    return os.path.basename(sys.argv[0])


class NoStepLeft:
    """The rest of an epoch whose steps were all trained before a stop in its validation: no batch
    (RunData.rest), so that the epoch is validated, its record and best.pth written, and the
    training iterator, restored at the next epoch's start, is read from the next epoch on."""

    pending = True

    def __iter__(self):
        self.pending = False
        return iter(())


# ------------------------------------------------------------------------------------------
# the rest of an epoch on another number of processes
# ------------------------------------------------------------------------------------------


class RestOfEpoch:
    """The rest of a mid-epoch checkpoint's epoch on another number of processes, each remaining
    sample once, as its run would have read it, whatever the data's layout. DALI restores a
    checkpoint only into the pipeline it was taken from (its shard, shard count and batch), so
    this process builds those of the run's training pipelines whose rows it needs, each restored,
    with ``build(args, world, dali_states, first_epoch)`` (an iterator), and steps them together:
    their batches of a step, in shard order, are the run's global batch of G, of which rank r of M
    takes rows r G/M to (r + 1) G/M. A checkpoint taken in it is of the run's shape (``as_saved``),
    so a resume from it takes this road again. ``pending`` until the epoch's end."""

    def __init__(self, ckpt, args, world, build):
        self.size, self.batch = ckpt["world_size"], ckpt["args"]["batch_size"]
        self.first_epoch, self.pending = ckpt.get("first_epoch", 1), True
        self.kept = {k: ckpt[k] for k in ("decoder_cache",) if k in ckpt}  # as its pipelines had
        share = self.size * self.batch // world.size
        self.rows = (world.rank * share, (world.rank + 1) * share)
        shards = range(self.rows[0] // self.batch, (self.rows[1] - 1) // self.batch + 1)
        their_args = argparse.Namespace(**{**vars(args), "batch_size": self.batch})
        self.loaders = {}
        for shard in shards:
            theirs = dataclasses.replace(world, rank=shard, size=self.size)
            self.loaders[shard] = build(their_args, theirs, ckpt["dali"], self.first_epoch)

    def __iter__(self):
        first = min(self.loaders) * self.batch
        low, high = self.rows[0] - first, self.rows[1] - first
        for batches in zip(*self.loaders.values()):
            outputs = batches[0][0].keys()
            yield [{k: torch.cat([b[0][k] for b in batches])[low:high] for k in outputs}]
        self.pending, self.loaders = False, {}  # their pipelines' memory goes

    def checkpoints(self):
        """As a DALI iterator's, a list of one: this process's pipelines' DALI states, by shard."""
        return [{shard: loader.checkpoints()[0] for shard, loader in self.loaders.items()}]

    def as_saved(self, ckpt, states):
        """What makes ``ckpt``, of ``states`` (each process's (DALI states by shard, random state,
        loss sum)), a checkpoint of the run's shape: a shard run by two processes is one state."""
        dali, rngs, sums = {}, [s[1] for s in states], [s[2] for s in states]
        for shards, _, _ in states:
            for shard, state in shards.items():
                dali.setdefault(shard, state)
        return dict(
            world_size=self.size,
            args={**ckpt["args"], "batch_size": self.batch},
            dali=[dali[shard] for shard in range(self.size)],
            rng=[rngs[k % len(rngs)] for k in range(self.size)],
            loss_sum=shared_sums(sums, self.size),
            first_epoch=self.first_epoch,
            **self.kept,
        )
