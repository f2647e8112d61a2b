"""Train an ImageNet-style classifier with DALI feeding PyTorch directly. Needs only pipelines.py beside it.

    python train_classify.py --data demo                  # builds a small demo set (no download), trains on it
    python train_classify.py --data /data/imagenet --amp bf16 --channels-last       # one GPU
    torchrun --nproc_per_node=8 train_classify.py --data /data/imagenet --amp bf16 --channels-last
    python train_classify.py --data demo --dali-device cpu  # DALI CPU-only (what runs without a GPU)
    python train_classify.py --data /data/imagenet --loader synthetic               # the model's own speed ceiling
    python train_classify.py --data /data/imagenet --resume runs/classify/exp1/checkpoint.pth   # continue a run
    python train_classify.py --data /data/imagenet --resume runs/classify/exp1/best.pth --evaluate

--data holds train/ and val/, each an ImageFolder tree, TFRecord files or WebDataset tars (make_shards.py
writes both). On a GPU, DALI decodes JPEGs with nvJPEG and augments on the GPU, so batches arrive normalized
on the device; without one, every DALI operator and the training run on the CPU. Under torchrun each
process reads shard RANK of WORLD_SIZE on GPU LOCAL_RANK. Every run gets its own folder (runs/classify/expN,
or --output-dir) for metrics.jsonl, checkpoint.pth and best.pth; --checkpoint-every N also saves mid-epoch,
and --resume continues at the exact step, with the same samples still to come.
"""

import argparse
import datetime
import difflib
import fcntl
import json
import math
import os
import sys
import time
import traceback
from contextlib import contextmanager

import numpy as np
import torch
import torch.distributed as dist
import torchvision
from PIL import Image, ImageDraw
from torchvision.transforms import v2

from pipelines import (
    DEFAULT_HW_DECODER_LOAD,
    ClassifyTrainPipeline,
    ClassifyValPipeline,
    DataError,
    classify_iterator,
    find_undecodable,
)


class UsageError(Exception):
    """A flag, file or condition the run cannot go on with; printed as one `error:` line, exit status 2."""


def autocast(args, device):
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(args.amp)
    return torch.autocast(device.type, dtype=dtype, enabled=dtype is not None)


def all_reduce_sum(values, device):
    """Sum floats over all processes (a host-device sync point: call it rarely)."""
    t = torch.tensor(values, dtype=torch.float64, device=device)
    if dist.is_initialized():
        dist.all_reduce(t)
    return t.tolist()


def broadcast_buffers(*models):
    """Give every process the main process's buffers (BatchNorm running statistics, EMA's too).

    DDP copies them from rank 0 only at the start of each forward pass, so after an epoch's last step
    each process holds the statistics of its own last batches; evaluating then would score a different
    model on each shard than the one rank 0 saves.
    """
    if dist.is_initialized():
        for model in models:
            for buffer in model.buffers():
                dist.broadcast(buffer, 0)


def train_one_epoch(model, criterion, optimizer, scheduler, scaler, batches, epoch, first_step, steps, args, device,
                    log, model_ema=None, mixup_cutmix=None, save_mid_epoch=None):
    """Steps ``first_step + 1 .. steps`` of one epoch over ``batches`` ((images, labels) on ``device``).

    Returns the mean training loss over these steps and all processes. Every --print-freq steps one line
    gives loss, lr, img/s, data wait and ETA: ``.item()`` and the all-reduce, both sync points, happen only
    there. ``save_mid_epoch(step)`` runs every --checkpoint-every steps.
    """
    model.train()
    world_size = dist.get_world_size() if dist.is_initialized() else 1
    loss_sum = torch.zeros((), device=device)
    window_loss, window_images, window_steps = torch.zeros((), device=device), 0, 0
    # Data wait: on the CPU, the wall time blocked in next(). On a GPU the CPU runs ahead, so time blocked
    # in next() also covers waiting for the GPU itself; there two CUDA events per step time the gap on the
    # GPU between the end of one step and the start of the next, read at the logging sync point.
    cpu_wait, gaps, step_end = 0.0, [], None
    epoch_start = window_start = fetch_start = time.perf_counter()
    for step, (images, targets) in enumerate(batches, first_step + 1):
        if device.type != "cuda":
            cpu_wait += time.perf_counter() - fetch_start
        elif step_end is not None:
            start = torch.cuda.Event(enable_timing=True)
            start.record()
            gaps.append((step_end, start))
        n = images.shape[0]
        if args.channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        if mixup_cutmix is not None:
            images, targets = mixup_cutmix(images, targets)  # soft targets: the loss takes class probabilities
        with autocast(args, device):
            loss = criterion(model(images), targets)
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        if args.clip_grad_norm:
            scaler.unscale_(optimizer)  # clip the true gradients, not fp16's scaled ones
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip_grad_norm)
        scaler.step(optimizer)
        scaler.update()
        scheduler.step()
        if model_ema is not None and step % args.model_ema_steps == 0:
            model_ema.update_parameters(model)
            if epoch <= args.lr_warmup_epochs:
                model_ema.n_averaged.fill_(0)  # during warm-up the EMA copies the weights (as torchvision's recipe)
        if device.type == "cuda":
            step_end = torch.cuda.Event(enable_timing=True)
            step_end.record()
        loss = loss.detach()
        loss_sum += loss
        window_loss += loss
        window_images += n
        window_steps += 1
        if step % args.print_freq == 0 or step == steps:
            window_loss = window_loss.item()  # a sync point: after it, this window's CUDA events have happened
            wait = sum(a.elapsed_time(b) for a, b in gaps) / 1000 if gaps else cpu_wait
            loss_total, images_total, wait_total = all_reduce_sum([window_loss, window_images, wait], device)
            now = time.perf_counter()
            elapsed = now - window_start
            record = {"type": "train", "epoch": epoch, "step": step, "steps": steps,
                      "loss": loss_total / (window_steps * world_size), "lr": optimizer.param_groups[0]["lr"],
                      "img_s": images_total / elapsed, "data_wait": 100 * wait_total / (elapsed * world_size)}
            eta = (now - epoch_start) / (step - first_step) * (steps - step)
            log(record, f"Epoch: [{epoch}/{args.epochs}] [{step:>{len(str(steps))}}/{steps}]  loss {record['loss']:.4f}  "
                        f"lr {record['lr']:.5f}  img/s {record['img_s']:.1f}  data-wait {record['data_wait']:.1f}%  "
                        f"eta {datetime.timedelta(seconds=round(eta))}")
            window_loss, window_images, window_steps = torch.zeros((), device=device), 0, 0
            cpu_wait, gaps = 0.0, []
            window_start = time.perf_counter()
        if save_mid_epoch is not None and args.checkpoint_every and step % args.checkpoint_every == 0 and step < steps:
            save_mid_epoch(step)
        fetch_start = time.perf_counter()
    (loss_total,) = all_reduce_sum([loss_sum.item()], device)
    return loss_total / max(1, (steps - first_step) * world_size)


@torch.no_grad()
def evaluate(model, batches, args, device):
    """Top-1 and top-5 accuracy in percent over the whole validation set (all shards)."""
    model.eval()
    correct1 = correct5 = count = 0
    for images, labels in batches:
        if images.shape[0] == 0:  # a shard one sample short of the others ends on an empty batch
            continue
        if args.channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        with autocast(args, device):
            logits = model(images)
        hits = logits.topk(min(5, logits.shape[1]), dim=1).indices == labels[:, None]
        correct1 += hits[:, 0].sum()
        correct5 += hits.any(dim=1).sum()
        count += labels.shape[0]
    correct1, correct5, count = all_reduce_sum([float(correct1), float(correct5), count], device)
    return 100 * correct1 / count, 100 * correct5 / count


# ------------------------------------------------------------------------------------------
# data
# ------------------------------------------------------------------------------------------

DEMO_CLASSES = ["circle", "square", "triangle", "ring", "cross", "stripes"]
DEMO_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), ".cache", "demo-classify-v1")


def demo_image(k, rng):
    """A shape of class ``k`` in its own hue band, at a random place and scale, on a textured background."""
    w, h = (int(v) for v in rng.integers(80, 113, size=2))
    yy, xx = np.mgrid[0:h, 0:w] / max(w, h)
    base = rng.integers(0, 256, size=3)
    gradient = rng.uniform(-80, 80, size=(2, 3))
    background = base + xx[..., None] * gradient[0] + yy[..., None] * gradient[1] + rng.normal(0, 12, (h, w, 3))
    image = Image.fromarray(np.clip(background, 0, 255).astype(np.uint8))
    hue = (k / len(DEMO_CLASSES) + rng.uniform(-0.04, 0.04)) % 1
    colour = Image.new("HSV", (1, 1), (int(hue * 255), int(rng.integers(170, 256)), int(rng.integers(170, 256))))
    colour = colour.convert("RGB").getpixel((0, 0))
    draw = ImageDraw.Draw(image)
    r = rng.uniform(0.25, 0.4) * min(w, h)
    cx, cy = rng.uniform(r, w - r), rng.uniform(r, h - r)
    angle = rng.uniform(0, 2 * np.pi)

    def polygon(n):
        return [(cx + r * np.cos(angle + 2 * np.pi * i / n), cy + r * np.sin(angle + 2 * np.pi * i / n)) for i in range(n)]

    name = DEMO_CLASSES[k]
    if name == "circle":
        draw.ellipse((cx - r, cy - r, cx + r, cy + r), fill=colour)
    elif name == "square":
        draw.polygon(polygon(4), fill=colour)
    elif name == "triangle":
        draw.polygon(polygon(3), fill=colour)
    elif name == "ring":
        draw.ellipse((cx - r, cy - r, cx + r, cy + r), outline=colour, width=max(3, int(r / 3)))
    elif name == "cross":
        for phase in (angle, angle + np.pi / 2):
            c, s, t = np.cos(phase), np.sin(phase), r / 4
            draw.polygon([(cx + r * c - t * s, cy + r * s + t * c), (cx + r * c + t * s, cy + r * s - t * c),
                          (cx - r * c + t * s, cy - r * s - t * c), (cx - r * c - t * s, cy - r * s + t * c)],
                         fill=colour)
    else:  # stripes across the whole image
        period = rng.uniform(8, 14)
        c, s = np.cos(angle), np.sin(angle)
        for offset in np.arange(-2 * max(w, h), 2 * max(w, h), period):
            draw.line([(offset * c - 2 * w * s, offset * s + 2 * w * c), (offset * c + 2 * w * s, offset * s - 2 * w * c)],
                      fill=colour, width=int(period / 2))
    return image


def make_demo_images(root, train_per_class=120, val_per_class=30, seed=0):
    """The demo set: JPEGs in ImageFolder layout (``root/{train,val}/<class>/<n>.jpg``), same bytes every time.

    Built in a temporary folder and renamed into place, so an interrupted build is never used; when two
    runs build it at once, the first rename wins and the other run uses that set.
    """
    if os.path.isdir(root):
        return root
    tmp = f"{root}.tmp-{os.getpid()}"
    for s, (split, count) in enumerate((("train", train_per_class), ("val", val_per_class))):
        for k, name in enumerate(DEMO_CLASSES):
            os.makedirs(os.path.join(tmp, split, name))
            for i in range(count):
                demo_image(k, np.random.default_rng([seed, s, k, i])).save(
                    os.path.join(tmp, split, name, f"{i:04d}.jpg"), quality=90)
    try:
        os.rename(tmp, root)
    except OSError:  # another run renamed its copy first: the same bytes, so use it
        if not os.path.isdir(root):
            raise
        for dirpath, _, names in os.walk(tmp, topdown=False):
            for name in names:
                os.remove(os.path.join(dirpath, name))
            os.rmdir(dirpath)
    return root


@contextmanager
def naming_undecodable(pipe):
    """A DALI error caused by an image that cannot be decoded ends the run naming that image."""
    try:
        yield
    except RuntimeError as e:
        culprit = find_undecodable(pipe)
        if culprit is None:
            raise
        raise DataError(f"{culprit}: cannot decode this image (DALI: {str(e).strip().splitlines()[-1]}); "
                        f"remove or replace it") from None


def dali_batches(loader, pipe, device):
    """(images, labels) on ``device``; HWC batches become NCHW tensors in channels_last memory, with no copy."""
    with naming_undecodable(pipe):
        for batch in loader:
            images = batch[0]["data"]
            if pipe.output_layout == "HWC":
                images = images.permute(0, 3, 1, 2)
            yield images.to(device, non_blocking=True), batch[0]["label"].squeeze(-1).long().to(device, non_blocking=True)


def synthetic_batches(batch, steps):
    """One batch already on the device, ``steps`` times: the model's own speed, the ceiling for any loader."""
    for _ in range(steps):
        yield batch


def get_mixup_cutmix(args, num_classes):
    """torchvision's MixUp and/or CutMix on the batch (one of the two, at random, when both are on)."""
    transforms = [t(alpha=alpha, num_classes=num_classes)
                  for t, alpha in ((v2.MixUp, args.mixup_alpha), (v2.CutMix, args.cutmix_alpha)) if alpha > 0]
    if not transforms:
        return None
    return transforms[0] if len(transforms) == 1 else v2.RandomChoice(transforms)


# ------------------------------------------------------------------------------------------
# model, optimizer, schedule
# ------------------------------------------------------------------------------------------


def make_model(args, num_classes):
    names = torchvision.models.list_models(module=torchvision.models)
    if args.arch not in names:
        close = difflib.get_close_matches(args.arch, names, n=5, cutoff=0.5)
        hint = f"; close names: {', '.join(close)}" if close else "; see torchvision.models.list_models()"
        raise UsageError(f"--arch {args.arch}: not a torchvision classification model{hint}")
    return torchvision.models.get_model(args.arch, weights=None, num_classes=num_classes)


NORM_LAYERS = (torch.nn.modules.batchnorm._BatchNorm, torch.nn.GroupNorm, torch.nn.LayerNorm,
               torch.nn.modules.instancenorm._InstanceNorm, torch.nn.LocalResponseNorm)


def make_optimizer(model, args, lr):
    """SGD (momentum) or AdamW; with --norm-weight-decay, normalization layers and biases get their own decay."""
    params = [p for p in model.parameters() if p.requires_grad]
    if args.norm_weight_decay is not None:
        norm = [p for m in model.modules() if isinstance(m, NORM_LAYERS) for p in m.parameters(recurse=False)]
        norm += [p for name, p in model.named_parameters() if name.endswith(".bias")]
        norm_ids = {id(p) for p in norm}
        params = [{"params": [p for p in params if id(p) not in norm_ids], "weight_decay": args.wd},
                  {"params": [p for p in params if id(p) in norm_ids], "weight_decay": args.norm_weight_decay}]
    if args.opt == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=args.momentum, weight_decay=args.wd)
    return torch.optim.AdamW(params, lr=lr, weight_decay=args.wd)


def make_scheduler(optimizer, args, steps_per_epoch):
    """The learning rate of every step (it changes each iteration, not each epoch).

    Warm-up over --lr-warmup-epochs from --lr-warmup-decay x lr (linear ramp or constant), then: cosine
    to --lr-min, step (x --lr-gamma every --lr-step-size epochs), or poly ((1 - t/T) ** 0.9, as torchvision's
    segmentation reference).
    """
    warmup = int(args.lr_warmup_epochs * steps_per_epoch)
    total = args.epochs * steps_per_epoch
    min_factor = args.lr_min / optimizer.param_groups[0]["lr"]

    def factor(step):
        if step < warmup:
            return args.lr_warmup_decay + (1 - args.lr_warmup_decay) * step / warmup \
                if args.lr_warmup_method == "linear" else args.lr_warmup_decay
        t, length = step - warmup, max(1, total - warmup)
        if args.lr_scheduler == "cosine":
            return min_factor + (1 - min_factor) * 0.5 * (1 + math.cos(math.pi * t / length))
        if args.lr_scheduler == "step":
            return args.lr_gamma ** (t // (args.lr_step_size * steps_per_epoch))
        return max(0.0, 1 - t / length) ** 0.9

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


# ------------------------------------------------------------------------------------------
# output folder and checkpoints
# ------------------------------------------------------------------------------------------


def open_output_dir(args):
    """The run's folder, created and locked: --output-dir, the --resume checkpoint's folder, or a fresh
    runs/classify/expN. A folder holding another run's checkpoint is refused unless --overwrite; a folder
    another run is writing to is refused. Returns (folder, lock file kept open for the run's life)."""
    out = args.output_dir
    if out is None and args.resume and not args.evaluate:
        out = os.path.dirname(os.path.abspath(args.resume))
    if out is None:
        os.makedirs(RUNS_DIR, exist_ok=True)
        n = 1 + max([int(d[3:]) for d in os.listdir(RUNS_DIR) if d.startswith("exp") and d[3:].isdigit()], default=0)
        while True:  # mkdir is atomic: two runs starting at once get two folders
            out = os.path.join(RUNS_DIR, f"exp{n}")
            try:
                os.mkdir(out)
                break
            except FileExistsError:
                n += 1
    if os.path.exists(out) and not os.path.isdir(out):
        raise UsageError(f"--output-dir {out}: is a file, not a folder")
    try:
        os.makedirs(out, exist_ok=True)
        lock = open(os.path.join(out, ".lock"), "w")
    except OSError as e:
        raise UsageError(f"--output-dir {out}: cannot write there ({e.strerror})") from None
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released by the OS when the process ends, however it ends
    except BlockingIOError:
        raise UsageError(f"--output-dir {out}: another run is writing to it ({lock.name} is locked); "
                         f"wait for it or pick another --output-dir") from None
    continuing = args.resume and os.path.dirname(os.path.abspath(args.resume)) == os.path.abspath(out)
    previous = [f for f in ("checkpoint.pth", "best.pth") if os.path.exists(os.path.join(out, f))]
    if previous and not args.evaluate and not continuing and not args.overwrite:
        raise UsageError(f"--output-dir {out}: holds a previous run's {previous[0]}; pass --resume "
                         f"{os.path.join(out, previous[0])} to continue it or --overwrite to replace it")
    if args.overwrite and not continuing and os.path.exists(os.path.join(out, "metrics.jsonl")):
        os.remove(os.path.join(out, "metrics.jsonl"))
    for name in os.listdir(out):  # what a killed save left behind; the lock says no other run is saving here
        if ".pth.tmp-" in name:
            os.remove(os.path.join(out, name))
    return out, lock


def save_atomic(state, path):
    """torch.save to a temporary file, then rename: the previous file stays whole if saving fails or is killed."""
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        torch.save(state, tmp)
        os.replace(tmp, path)
    except (OSError, RuntimeError) as e:  # torch reports a full disk as a RuntimeError
        if os.path.exists(tmp):
            os.remove(tmp)
        why = e.strerror if isinstance(e, OSError) and e.strerror else str(e).strip().splitlines()[-1]
        raise UsageError(f"{path}: could not save the checkpoint ({why}); the previous one is kept") from None


def load_checkpoint(path):
    if not os.path.isfile(path):
        raise UsageError(f"--resume {path}: no such checkpoint file")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UsageError(f"--resume {path}: not a readable checkpoint ({why[:200]})") from None
    if not isinstance(ckpt, dict) or not {"model", "args", "epoch", "step", "classes"} <= ckpt.keys():
        raise UsageError(f"--resume {path}: not a checkpoint written by {os.path.basename(__file__)}")
    return ckpt


def check_resumable(ckpt, args, classes, num_samples, world_size):
    """One line on the first way the checkpoint does not fit this run's model, data or layout."""
    where, saved = f"--resume {args.resume}", ckpt["args"]
    if saved["arch"] != args.arch:
        raise UsageError(f"{where}: a checkpoint of --arch {saved['arch']}, not --arch {args.arch}")
    if ckpt["classes"] != classes:
        a, b = ckpt["classes"], classes
        first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
        detail = (f"class {first} is {a[first]!r} there and {b[first]!r} in --data" if first is not None
                  else f"{len(a)} classes there, {len(b)} in --data")
        raise UsageError(f"{where}: trained on other classes ({detail})")
    if args.evaluate:
        return
    if (ckpt["world_size"], saved["batch_size"], ckpt["num_samples"]) != (world_size, args.batch_size, num_samples):
        raise UsageError(f"{where}: taken with {ckpt['world_size']} process(es) x batch {saved['batch_size']} on "
                         f"{ckpt['num_samples']} training samples, this run has {world_size} x {args.batch_size} on "
                         f"{num_samples}; resume with the same, so the remaining steps and samples are the same")


def gather_to_master(obj):
    """Every process's ``obj`` as a list on the main process (None elsewhere)."""
    if not dist.is_initialized():
        return [obj]
    out = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(obj, out, dst=0)
    return out


# ------------------------------------------------------------------------------------------
# main
# ------------------------------------------------------------------------------------------

RUNS_DIR = "runs/classify"


def main(args):
    for flag, ok, allowed in (
            ("--epochs", args.epochs >= 1, "at least 1"), ("--batch-size", args.batch_size >= 1, "at least 1"),
            ("--workers", args.workers >= 1, "at least 1"), ("--print-freq", args.print_freq >= 1, "at least 1"),
            ("--lr", args.lr > 0, "> 0"), ("--wd", args.wd >= 0, ">= 0"), ("--momentum", 0 <= args.momentum < 1, "in [0, 1)"),
            ("--label-smoothing", 0 <= args.label_smoothing < 1, "in [0, 1)"),
            ("--mixup-alpha", args.mixup_alpha >= 0, ">= 0"), ("--cutmix-alpha", args.cutmix_alpha >= 0, ">= 0"),
            ("--random-erase", 0 <= args.random_erase <= 1, "in [0, 1]"),
            ("--clip-grad-norm", args.clip_grad_norm >= 0, ">= 0"), ("--lr-warmup-epochs", args.lr_warmup_epochs >= 0, ">= 0"),
            ("--lr-step-size", args.lr_step_size >= 1, "at least 1"), ("--model-ema-steps", args.model_ema_steps >= 1, "at least 1"),
            ("--model-ema-decay", 0 < args.model_ema_decay < 1, "in (0, 1)"),
            ("--checkpoint-every", args.checkpoint_every >= 0, ">= 0")):
        if not ok:
            raise UsageError(f"{flag} must be {allowed}, got {getattr(args, flag[2:].replace('-', '_'))}")
    if args.batch_size < 2 and not args.evaluate:
        raise UsageError("--batch-size must be at least 2 for training (BatchNorm needs more than one sample)")

    # distributed: torchrun sets RANK (global), LOCAL_RANK (GPU on this node) and WORLD_SIZE
    ddp = int(os.environ.get("RANK", -1)) != -1
    ddp_rank, ddp_local_rank = int(os.environ.get("RANK", 0)), int(os.environ.get("LOCAL_RANK", 0))
    ddp_world_size = int(os.environ.get("WORLD_SIZE", 1))
    master_process = ddp_rank == 0  # the one process that writes logs and checkpoints
    device = torch.device("cuda", ddp_local_rank) if torch.cuda.is_available() else torch.device("cpu")
    if device.type == "cuda" and ddp_local_rank >= torch.cuda.device_count():
        raise UsageError(f"LOCAL_RANK {ddp_local_rank}: this machine shows {torch.cuda.device_count()} CUDA device(s) and "
                         f"each process needs one; start at most that many (torchrun --nproc_per_node), or hide them "
                         f"(CUDA_VISIBLE_DEVICES=) to train on the CPU")
    if device.type == "cuda":
        torch.cuda.set_device(device)
        torch.backends.cudnn.benchmark = True  # fixed input sizes: cuDNN times its kernels once and keeps the fastest
        # Training kernels get the higher stream priority, so DALI's decoding and augmentation kernels, on
        # DALI's own streams, fill the gaps instead of delaying the steps.
        torch.cuda.set_stream(torch.cuda.Stream(device, priority=-1))
    if args.dali_device is None:
        args.dali_device = "gpu" if device.type == "cuda" else "cpu"
    if args.dali_device == "gpu" and device.type != "cuda":
        raise UsageError("--dali-device gpu: no CUDA device is visible; use --dali-device cpu")
    if args.sync_bn and device.type != "cuda" and not args.evaluate:
        raise UsageError("--sync-bn: SyncBatchNorm trains on CUDA devices only")
    if ddp:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                                device_id=device if device.type == "cuda" else None)

    ckpt = load_checkpoint(args.resume) if args.resume else None
    if args.data == "demo":
        if ddp_local_rank == 0:  # one process per node builds it, the others wait at the barrier
            make_demo_images(DEMO_DIR)
        if ddp:
            dist.barrier()
        args.data = DEMO_DIR
    for split in ("train", "val"):
        if not os.path.isdir(os.path.join(args.data, split)):
            raise UsageError(f"--data {args.data}: expected subfolders train/ and val/ in it (each an ImageFolder "
                             f"tree, TFRecord files or WebDataset tars), or --data demo for the built-in demo set")

    # the lock file stays open, and so locked, until this process ends
    output_dir, lock = open_output_dir(args) if master_process and (args.output_dir or not args.evaluate) \
        else (None, None)

    def log(record, line):
        if master_process:
            print(line, flush=True)
            if output_dir:
                with open(os.path.join(output_dir, "metrics.jsonl"), "a") as f:
                    f.write(json.dumps(record) + "\n")

    # data: DALI shard RANK of WORLD_SIZE on GPU LOCAL_RANK (None: every DALI operator on the CPU)
    dali_state = ckpt.get("dali") if ckpt and not args.evaluate else None
    common = dict(num_threads=args.workers, device_id=ddp_local_rank if args.dali_device == "gpu" else None,
                  shard_id=ddp_rank, num_shards=ddp_world_size, seed=args.seed + ddp_rank,
                  hw_decoder_load=args.hw_decoder_load, label_offset=args.label_offset, num_classes=args.num_classes,
                  # channels_last: DALI writes HWC, which is already that memory format (no transpose per step)
                  output_layout="HWC" if args.channels_last else "CHW")
    # Checkpointing the train pipeline (reader position, random states) costs nothing until asked for.
    train_pipe = ClassifyTrainPipeline(args.batch_size, data_dir=os.path.join(args.data, "train"),
                                       crop_size=args.train_crop_size, random_erase=args.random_erase,
                                       enable_checkpointing=True,
                                       checkpoint=dali_state[ddp_rank] if dali_state else None, **common)
    num_classes = train_pipe.num_classes
    if num_classes is None:
        raise UsageError(f"--data {args.data}: the number of classes is unknown (no classes.txt beside the shards); "
                         f"pass --num-classes")
    classes = train_pipe.classes or [str(k) for k in range(num_classes)]  # names: checkpoints compare them
    val_pipe = ClassifyValPipeline(args.batch_size, data_dir=os.path.join(args.data, "val"),
                                   crop_size=args.val_crop_size, resize_size=args.val_resize_size,
                                   classes=classes, **common)
    if ckpt:
        check_resumable(ckpt, args, classes, train_pipe.num_samples, ddp_world_size)
    with naming_undecodable(train_pipe):  # the iterators decode their first batches right away
        train_loader = classify_iterator(train_pipe)
    with naming_undecodable(val_pipe):
        val_loader = classify_iterator(val_pipe)
    steps = len(train_loader)  # the same on every process: every shard runs as many full batches
    # an ImageFolder val tree may lack some of train's classes: say how many
    val_dir = os.path.join(args.data, "val")
    in_val = {os.path.relpath(f, val_dir).split(os.sep)[0] for f in val_pipe.files}
    missing = len(set(classes) - in_val) if val_pipe.layout == "folder" else 0
    log({"type": "start", "output_dir": output_dir, "data": args.data, "layout": train_pipe.layout,
         "train_samples": train_pipe.num_samples, "val_samples": val_pipe.num_samples, "classes": num_classes},
        (f"run folder {output_dir}; " if output_dir else "") + f"data {args.data}: {train_pipe.layout}, "
        f"{train_pipe.num_samples} train and {val_pipe.num_samples} val samples, {num_classes} classes"
        + (f" ({missing} of them have no val samples)" if missing else ""))

    torch.manual_seed(args.seed)
    model = make_model(args, num_classes)
    if args.sync_bn and ddp:
        model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)  # batch statistics over all GPUs
    model = model.to(device)
    if args.channels_last:
        model = model.to(memory_format=torch.channels_last)
    model_without_ddp = model  # what is saved and evaluated: its forward passes need no collective
    if ddp:
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[ddp_local_rank] if device.type == "cuda" else None)
    model_ema = None
    if args.model_ema:
        # torchvision's recipe: the decay is set for a reference of 1024 images per EMA update over the run.
        adjust = ddp_world_size * args.batch_size * args.model_ema_steps / args.epochs
        alpha = min(1.0, (1.0 - args.model_ema_decay) * adjust)
        model_ema = torch.optim.swa_utils.AveragedModel(
            model_without_ddp, device=device, multi_avg_fn=torch.optim.swa_utils.get_ema_multi_avg_fn(1.0 - alpha),
            use_buffers=True)
    if args.compile:
        model = torch.compile(model)
    criterion = torch.nn.CrossEntropyLoss(label_smoothing=args.label_smoothing)
    lr = args.lr * args.batch_size * ddp_world_size / 256  # --lr is for a global batch of 256
    optimizer = make_optimizer(model_without_ddp, args, lr)
    scheduler = make_scheduler(optimizer, args, steps)
    # fp16 gradients underflow without loss scaling; bf16 has fp32's range and needs none.
    scaler = torch.amp.GradScaler(device.type, enabled=args.amp == "fp16")
    mixup_cutmix = get_mixup_cutmix(args, num_classes)
    log({"type": "config", "args": vars(args)},
        f"{args.arch}: world size {ddp_world_size}, batch {args.batch_size} per process, global batch "
        f"{args.batch_size * ddp_world_size}, {steps} steps per epoch, lr {lr:.5f} (--lr {args.lr} x global "
        f"batch / 256), {args.opt}, {args.lr_scheduler} schedule, model on {device}, DALI on {args.dali_device}")

    start_epoch, first_step, best = 1, 0, -math.inf
    if ckpt:
        try:
            model_without_ddp.load_state_dict(ckpt["model"])
        except RuntimeError as e:
            raise UsageError(f"--resume {args.resume}: its weights do not fit this model ({str(e).splitlines()[1].strip()})") from None
        if model_ema is not None:
            if ckpt.get("model_ema") is None:
                raise UsageError(f"--resume {args.resume}: holds no EMA weights (its run had no --model-ema)")
            model_ema.load_state_dict(ckpt["model_ema"])
        if not args.evaluate:
            optimizer.load_state_dict(ckpt["optimizer"])
            scheduler.load_state_dict(ckpt["scheduler"])
            scaler.load_state_dict(ckpt["scaler"])
            torch.set_rng_state(ckpt["rng"][ddp_rank])  # mixup and cutmix draw from it
            best = ckpt["best"]
            start_epoch, first_step = (ckpt["epoch"] + 1, 0) if ckpt["step"] == steps else (ckpt["epoch"], ckpt["step"])
            log({"type": "resume", "epoch": start_epoch, "step": first_step},
                f"resumed from {args.resume}: epoch {start_epoch}, after step {first_step} of {steps}")

    def val_batches():
        return dali_batches(val_loader, val_pipe, device)

    if args.evaluate:
        top1, top5 = evaluate(model_ema if model_ema is not None else model_without_ddp, val_batches(), args, device)
        log({"type": "eval", "val_top1": top1, "val_top5": top5, "ema": model_ema is not None},
            f"Test{' (EMA)' if model_ema is not None else ''}: Acc@1 {top1:.3f} Acc@5 {top5:.3f}")
        return
    for _ in val_batches():  # decode the validation set once now, so a bad file costs seconds, not an epoch
        pass

    def save(epoch, step, is_best=False):
        """Every process's DALI state and random state go to the main process, which writes the checkpoint."""
        dali, rng = gather_to_master(train_loader.checkpoints()[0]), gather_to_master(torch.get_rng_state())
        if not master_process:
            return
        state = {"model": model_without_ddp.state_dict(), "optimizer": optimizer.state_dict(),
                 "scheduler": scheduler.state_dict(), "scaler": scaler.state_dict(),
                 "model_ema": model_ema.state_dict() if model_ema is not None else None, "epoch": epoch, "step": step,
                 "args": vars(args), "best": best, "classes": classes,
                 "num_samples": train_pipe.num_samples, "world_size": ddp_world_size,
                 "dali": dali if args.loader == "dali" else None, "rng": rng}
        save_atomic(state, os.path.join(output_dir, "checkpoint.pth"))
        if is_best:
            save_atomic(state, os.path.join(output_dir, "best.pth"))
        if step < steps:
            log({"type": "checkpoint", "epoch": epoch, "step": step}, f"saved checkpoint.pth at epoch {epoch} step {step}")

    for epoch in range(start_epoch, args.epochs + 1):
        start = time.perf_counter()
        if args.loader == "synthetic":
            images = torch.randn(args.batch_size, 3, args.train_crop_size, args.train_crop_size, device=device)
            batch = (images.contiguous(memory_format=torch.channels_last) if args.channels_last else images,
                     torch.randint(0, num_classes, (args.batch_size,), device=device))
            train_batches = synthetic_batches(batch, steps - first_step)
        else:
            train_batches = dali_batches(train_loader, train_pipe, device)
        train_loss = train_one_epoch(model, criterion, optimizer, scheduler, scaler, train_batches, epoch, first_step,
                                     steps, args, device, log, model_ema, mixup_cutmix,
                                     save_mid_epoch=lambda step: save(epoch, step))
        first_step = 0
        broadcast_buffers(*[m for m in (model_without_ddp, model_ema) if m is not None])
        top1, top5 = evaluate(model_without_ddp, val_batches(), args, device)
        record = {"type": "epoch", "epoch": epoch, "train_loss": train_loss, "val_top1": top1, "val_top5": top5}
        line = f"Epoch {epoch}: val Acc@1 {top1:.3f} Acc@5 {top5:.3f}"
        if model_ema is not None:
            record["ema_val_top1"], record["ema_val_top5"] = evaluate(model_ema, val_batches(), args, device)
            line += f"  EMA Acc@1 {record['ema_val_top1']:.3f} Acc@5 {record['ema_val_top5']:.3f}"
        is_best, best = top1 > best, max(top1, best)
        save(epoch, steps, is_best)
        record["epoch_time"] = time.perf_counter() - start
        log(record, f"{line}  train loss {train_loss:.4f}  time {record['epoch_time']:.1f}s")


DEMO_DEFAULTS = dict(arch="resnet18", epochs=6, batch_size=32, lr=0.2, train_crop_size=64, val_crop_size=64,
                     val_resize_size=73, print_freq=10, workers=min(4, os.cpu_count() or 1))


def get_args_parser(add_help=True):
    parser = argparse.ArgumentParser(description="Image classification on DALI", add_help=add_help,
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    g = parser.add_argument_group("data")
    g.add_argument("--data", required=True,
                   help="folder with train/ and val/, each an ImageFolder tree, TFRecord files or WebDataset tars; or "
                        "'demo' for a built-in synthetic set (demo also changes the defaults to: " +
                        ", ".join(f"--{k.replace('_', '-')} {v}" for k, v in DEMO_DEFAULTS.items()) + ")")
    g.add_argument("--num-classes", type=int, default=None,
                   help="classes of shards without a classes.txt (ImageFolder trees count their class folders)")
    g.add_argument("--label-offset", type=int, default=0,
                   help="subtracted from every stored label (1 for TFRecords of TensorFlow's ImageNet scripts)")
    g.add_argument("--train-crop-size", type=int, default=224, help="random-resized crop for training")
    g.add_argument("--val-resize-size", type=int, default=256, help="shorter side before the validation crop")
    g.add_argument("--val-crop-size", type=int, default=224, help="centre crop for validation")
    g.add_argument("--random-erase", type=float, default=0.0, help="probability of random erasing (in the DALI pipeline)")
    g.add_argument("-j", "--workers", type=int, default=min(8, os.cpu_count() or 1), help="DALI CPU threads per process")
    g.add_argument("--dali-device", choices=["gpu", "cpu"], default=None,
                   help="where DALI decodes and augments: gpu (mixed decode, GPU ops) or cpu (DALI CPU-only) "
                        "(default: gpu when CUDA is available, else cpu)")
    g.add_argument("--hw-decoder-load", type=float, default=DEFAULT_HW_DECODER_LOAD,
                   help="share of JPEG decoding on the GPU's hardware decoder (mixed decode only)")
    g.add_argument("--loader", choices=["dali", "synthetic"], default="dali",
                   help="synthetic: one random batch already on the device trains every step (the speed ceiling; "
                        "validation still reads --data with DALI)")

    g = parser.add_argument_group("model")
    g.add_argument("--arch", default="resnet50", help="any torchvision classification model")
    g.add_argument("--sync-bn", action="store_true", help="SyncBatchNorm across processes under torchrun (CUDA only)")
    g.add_argument("--model-ema", action="store_true", help="keep an exponential moving average of the weights, "
                                                             "evaluated and checkpointed beside the model")
    g.add_argument("--model-ema-steps", type=int, default=32, help="steps between EMA updates")
    g.add_argument("--model-ema-decay", type=float, default=0.99998,
                   help="EMA decay per image of a 1024-image reference (torchvision's; adjusted for batch, steps, epochs)")

    g = parser.add_argument_group("optimisation")
    g.add_argument("--epochs", type=int, default=90, help="epochs to train")
    g.add_argument("-b", "--batch-size", type=int, default=256, help="images per process (per GPU)")
    g.add_argument("--opt", choices=["sgd", "adamw"], default="sgd", help="optimizer")
    g.add_argument("--lr", type=float, default=0.1,
                   help="learning rate for a global batch of 256, scaled linearly by global batch / 256")
    g.add_argument("--momentum", type=float, default=0.9, help="SGD momentum")
    g.add_argument("--wd", "--weight-decay", type=float, default=1e-4, dest="wd", help="weight decay")
    g.add_argument("--norm-weight-decay", type=float, default=None,
                   help="weight decay of normalization layers and biases (default: --wd)")
    g.add_argument("--label-smoothing", type=float, default=0.0, help="cross-entropy label smoothing")
    g.add_argument("--mixup-alpha", type=float, default=0.0, help="MixUp alpha (0: off)")
    g.add_argument("--cutmix-alpha", type=float, default=0.0, help="CutMix alpha (0: off)")
    g.add_argument("--clip-grad-norm", type=float, default=0.0, help="clip the gradients' total norm (0: off)")
    g.add_argument("--lr-scheduler", choices=["cosine", "step", "poly"], default="cosine",
                   help="decay after warm-up, stepped every iteration")
    g.add_argument("--lr-warmup-epochs", type=float, default=0, help="warm-up epochs")
    g.add_argument("--lr-warmup-method", choices=["linear", "constant"], default="linear", help="warm-up shape")
    g.add_argument("--lr-warmup-decay", type=float, default=0.01, help="warm-up starts at this fraction of the lr")
    g.add_argument("--lr-step-size", type=int, default=30, help="step schedule: epochs between decays")
    g.add_argument("--lr-gamma", type=float, default=0.1, help="step schedule: factor per decay")
    g.add_argument("--lr-min", type=float, default=0.0, help="cosine schedule: the final lr")
    g.add_argument("--amp", choices=["bf16", "fp16", "none"], default="none",
                   help="mixed precision: bf16 autocast, fp16 autocast with a GradScaler, or none")
    g.add_argument("--channels-last", action="store_true", help="channels_last memory format")
    g.add_argument("--compile", action="store_true", help="torch.compile the model")
    g.add_argument("--seed", type=int, default=0, help="seed of model init, DALI augmentations, mixup and cutmix")

    g = parser.add_argument_group("output and checkpoints")
    g.add_argument("--output-dir", default=None,
                   help=f"where metrics.jsonl, checkpoint.pth and best.pth go (default: a new {RUNS_DIR}/expN, or the "
                        f"--resume checkpoint's folder)")
    g.add_argument("--overwrite", action="store_true", help="replace a previous run's checkpoints in --output-dir")
    g.add_argument("--resume", default="", help="checkpoint to continue from (the same step, the same samples to come)")
    g.add_argument("--checkpoint-every", type=int, default=0,
                   help="also save checkpoint.pth every N steps inside an epoch (0: at the end of each epoch only)")
    g.add_argument("--evaluate", action="store_true", help="only validate the --resume model (its EMA with --model-ema)")
    g.add_argument("--print-freq", type=int, default=50, help="log a line every N steps")
    return parser


if __name__ == "__main__":
    parser = get_args_parser()
    args = parser.parse_args()
    if args.data == "demo":  # a small, quick run; flags given on the command line still win
        parser.set_defaults(**DEMO_DEFAULTS)
        args = parser.parse_args()
    try:
        main(args)
    except (Exception, KeyboardInterrupt) as e:
        usage = isinstance(e, (UsageError, DataError))
        if dist.is_initialized() and dist.get_world_size() > 1:
            # The other processes may be waiting for this one in a collective, and with NCCL a graceful
            # destroy_process_group() then waits for them forever. Print the error and end this process
            # at once; torchrun then stops the others and the job ends with this error.
            if usage:
                print(f"error: {e}", file=sys.stderr, flush=True)
            else:
                traceback.print_exc()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(2 if usage else 1)
        if usage:
            parser.exit(2, f"error: {e}\n")
        raise
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
