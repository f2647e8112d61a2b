"""Train a segmentation model, DALI feeding PyTorch. Needs pipelines.py beside it (data_processing.py for PNG data).

    python train_segment.py --data demo                    # builds a synthetic nail set (no download), trains on it
    python train_segment.py --data data/nails --amp bf16 --channels-last    # a prepared root (csv_file/ inside)
    python train_segment.py --data data/nails_png          # a PNG root (Images/, Masks/): prepared into data/nails_png/npy
    torchrun --nproc_per_node=8 train_segment.py --data data/nails --amp bf16 --channels-last
    python train_segment.py --data data/nails --resume runs/segment/exp1/checkpoint.pth             # continue a run
    python train_segment.py --data data/nails --resume runs/segment/exp1/best.pth --evaluate

DALI reads image and mask in lock-step, resizes both to --size, flips both alike and augments the image, on the GPU
when there is one, else on the CPU. --num-classes 1 is binary (BCE + Dice); 2 or more use cross-entropy + Dice.
Read top to bottom: flags, model and loss, train_one_epoch / evaluate, main; the plumbing sits below the banner.
"""

import argparse
import contextlib
import datetime
import fcntl
import functools
import json
import math
import os
import time
from types import SimpleNamespace

import torch
import torch.distributed as dist
import torchvision
from torch import nn

from pipelines import (DataError, StopSignals, alongside, atomic_open, fetch_dali_loader, first_mask_above, isdir,
                       read_split, remote, run_main, save_overlay, segment_iterator)

RUNS_DIR = "runs/segment"
# --data demo: a small, quick run; flags given on the command line still win.
DEMO_DEFAULTS = dict(epochs=6, batch_size=8, lr=2.0, size=96, unet_width=16, print_freq=5, lr_warmup_epochs=1,
                     lr_scheduler="cosine", workers=min(4, os.cpu_count() or 1))


def get_args_parser(add_help=True):
    parser = argparse.ArgumentParser(description="Semantic segmentation on DALI", add_help=add_help,
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter, allow_abbrev=False)
    # A bad flag ends the run as every usage error does: one `error:` line, exit status 2.
    parser.error = lambda message: parser.exit(2, f"error: {message}\n")
    g = parser.add_argument_group("data")
    g.add_argument("--data", "--data-path", required=True, help="prepared root (csv_file/; local or s3://), PNG root "
                   "(Images/, Masks/: prepared into <root>/npy), or 'demo' for a built-in synthetic set (demo also changes the "
                   "defaults to: " + ", ".join(f"--{k.replace('_', '-')} {v}" for k, v in DEMO_DEFAULTS.items()) + ")")
    g.add_argument("--num-classes", type=at_least_1, default=1, help="1: binary (BCE + Dice); more: CE + Dice")
    g.add_argument("--size", type=number(int, "a multiple of 32 (the models down-sample by up to 32)",
                                         lambda v: v >= 32 and v % 32 == 0), default=384, help="side of the input")
    g.add_argument("-j", "--workers", type=at_least_1, default=min(8, os.cpu_count() or 1), help="DALI threads")
    g.add_argument("--dali-device", choices=["gpu", "cpu"], help="where DALI runs (default: gpu if CUDA is available)")
    g.add_argument("--loader", choices=["dali", "synthetic"], default="dali", help="synthetic: train on one random "
                   "batch already on the device (the speed ceiling; validation still reads --data)")
    g = parser.add_argument_group("model")
    g.add_argument("--arch", "--model", default="unet", choices=ARCHS,
                   help="the compact U-Net of this file, or a torchvision model")
    g.add_argument("--weights", help="start from these weights: a torchvision weights name "
                   "(FCN_ResNet50_Weights.DEFAULT; the U-Net has none) or a file (a state dict or a "
                   "checkpoint of this script); tensors of another shape (a head for other classes) start anew")
    g.add_argument("--unet-width", type=at_least_1, default=32, help="channels of the U-Net's first level")
    g.add_argument("--sync-bn", action="store_true", help="SyncBatchNorm across processes under torchrun (CUDA only)")
    g.add_argument("--model-ema", action="store_true", help="an EMA of the weights, validated and saved beside them")
    g.add_argument("--model-ema-steps", type=at_least_1, default=32, help="steps between EMA updates")
    g.add_argument("--model-ema-decay", type=number(float, "in (0, 1)", lambda v: 0 < v < 1), default=0.99998,
                   help="EMA decay for a 1024-image reference, as torchvision's")
    g = parser.add_argument_group("optimisation")
    g.add_argument("--epochs", type=at_least_1, default=50, help="epochs to train")
    g.add_argument("-b", "--batch-size", type=at_least_1, default=32, help="images per process (per GPU)")
    g.add_argument("--opt", choices=["sgd", "adamw"], default="sgd", help="optimizer")
    g.add_argument("--lr", type=positive, default=0.1, help="lr per 256 images, scaled by global batch / 256 "
                   "(torchvision's --lr is the lr itself: pass it x 256 / global batch)")
    g.add_argument("--momentum", type=below_one, default=0.9, help="SGD momentum")
    g.add_argument("--wd", "--weight-decay", type=non_negative, default=1e-4, dest="wd", help="weight decay")
    g.add_argument("--norm-weight-decay", type=non_negative, help="weight decay of norm layers and biases (default: --wd)")
    g.add_argument("--clip-grad-norm", type=non_negative, default=0.0, help="clip the gradients' total norm (0: off)")
    g.add_argument("--lr-scheduler", choices=["cosine", "step", "poly"], default="poly",
                   help="decay after warm-up, stepped every iteration")
    g.add_argument("--lr-warmup-epochs", type=non_negative, default=1, help="warm-up epochs")
    g.add_argument("--lr-warmup-method", choices=["linear", "constant"], default="linear", help="warm-up shape")
    g.add_argument("--lr-warmup-decay", type=non_negative, default=0.01, help="warm-up starts at this share of the lr")
    g.add_argument("--lr-step-size", type=at_least_1, default=30, help="step schedule: epochs between decays")
    g.add_argument("--lr-gamma", type=non_negative, default=0.1, help="step schedule: factor per decay")
    g.add_argument("--lr-min", type=non_negative, default=0.0, help="cosine schedule: the final lr")
    g.add_argument("--amp", nargs="?", const="default", choices=["bf16", "fp16", "none", "default"], default="none",
                   help="mixed precision (autocast); bare --amp: torch's default for the device (fp16 CUDA, bf16 CPU)")
    g.add_argument("--channels-last", action="store_true", help="channels_last memory format")
    g.add_argument("--compile", action="store_true", help="torch.compile the model")
    g.add_argument("--seed", type=int, default=0, help="seed of model init and DALI augmentations")
    g = parser.add_argument_group("output and checkpoints")
    g.add_argument("--output-dir", help=f"the run's folder (default: a new {RUNS_DIR}/expN, or --resume's folder)")
    g.add_argument("--overwrite", action="store_true", help="replace a previous run's checkpoints in --output-dir")
    g.add_argument("--resume", default="", help="checkpoint to continue from, at its exact step")
    g.add_argument("--checkpoint-every", type=at_least_0, default=0, help="also save every N steps (0: per epoch)")
    g.add_argument("--evaluate", "--test-only", action="store_true",
                   help="only validate the --resume model (with --model-ema, its EMA)")
    g.add_argument("--print-freq", type=at_least_1, default=50, help="log a line every N steps")
    g.add_argument("--tensorboard", action="store_true", help="also write the logged scalars for TensorBoard into the "
                   "run folder (needs the tensorboard package)")
    return parser


def parse_args(argv=None):
    """The flags, with --data demo's defaults where it is given, and the rules that tie flags together."""
    parser = get_args_parser()
    args = parser.parse_args(argv)
    if args.data == "demo":
        parser.set_defaults(**DEMO_DEFAULTS)
        args = parser.parse_args(argv)
    if args.batch_size < 2 and not args.evaluate:
        parser.error("--batch-size must be at least 2 for training (BatchNorm needs more than one sample)")
    if args.evaluate and not args.resume:
        parser.error("--evaluate scores the model of --resume CHECKPOINT; pass one (without it the weights are random)")
    return args


class UNet(nn.Module):
    """A compact U-Net: four 2x down-samplings, skip connections, bilinear up-sampling."""

    def __init__(self, in_channels, num_classes, width=32):
        super().__init__()
        chans = [width, 2 * width, 4 * width, 8 * width, 8 * width]

        def block(cin, cout):
            return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(True),
                                 nn.Conv2d(cout, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(True))
        self.down = nn.ModuleList([block(in_channels, chans[0])] + [block(a, b) for a, b in zip(chans, chans[1:])])
        self.up = nn.ModuleList([block(chans[i] + chans[i + 1], chans[i]) for i in reversed(range(4))])
        self.head = nn.Conv2d(chans[0], num_classes, 1)

    def forward(self, x):
        skips = []
        for i, block in enumerate(self.down):
            x = block(x if i == 0 else nn.functional.max_pool2d(x, 2))
            skips.append(x)
        for block, skip in zip(self.up, reversed(skips[:-1])):
            x = nn.functional.interpolate(x, size=skip.shape[-2:], mode="bilinear", align_corners=False)
            x = block(torch.cat([skip, x], dim=1))
        return self.head(x)


class TorchvisionSegmentation(nn.Module):
    """A torchvision segmentation model's main output; one-channel images are repeated to its backbone's three."""

    def __init__(self, arch, num_classes):
        super().__init__()
        self.model = torchvision.models.get_model(arch, weights=None, weights_backbone=None, num_classes=num_classes)

    def forward(self, x):
        return self.model(x.expand(-1, 3, -1, -1))["out"]


ARCHS = ["unet", "lraspp_mobilenet_v3_large", "deeplabv3_mobilenet_v3_large", "deeplabv3_resnet50", "fcn_resnet50"]


def make_model(args, in_channels):
    return (UNet(in_channels, args.num_classes, args.unet_width) if args.arch == "unet"
            else TorchvisionSegmentation(args.arch, args.num_classes))


def dice_ce_loss(logits, masks, num_classes):
    """Cross-entropy (BCE when binary) plus soft Dice over the foreground classes."""
    logits = logits.float()
    if num_classes == 1:
        target = masks.float()
        ce, probs = nn.functional.binary_cross_entropy_with_logits(logits, target), logits.sigmoid()
    else:
        target = nn.functional.one_hot(masks[:, 0], num_classes).permute(0, 3, 1, 2).float()[:, 1:]
        ce, probs = nn.functional.cross_entropy(logits, masks[:, 0]), logits.softmax(1)[:, 1:]
    dice = (2 * (probs * target).sum((0, 2, 3)) + 1) / (probs.sum((0, 2, 3)) + target.sum((0, 2, 3)) + 1)
    return ce + 1 - dice.mean()


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
    """The lr of every step: warm-up over --lr-warmup-epochs from --lr-warmup-decay x lr (a linear ramp or constant),
    then cosine to --lr-min, step (x --lr-gamma every --lr-step-size epochs), or poly ((1 - t/T) ** 0.9)."""
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


def train_one_epoch(model, criterion, optimizer, scheduler, scaler, batches, epoch, first_step, steps, args, device,
                    log, model_ema=None, save_mid_epoch=None, stop=None, loss_sum=0.0):
    """Steps ``first_step + 1 .. steps`` of one epoch; returns the epoch's mean loss over all processes (``loss_sum``:
    this process's sum over the steps before ``first_step``). Every --print-freq steps a line gives loss, lr, img/s,
    data wait and ETA: the only sync points (``.item()``, the all-reduce). A non-finite loss ends the run there;
    a stop signal (``stop``) at the next step, after ``save_mid_epoch(step, loss_sum)``."""
    model.train()
    world_size = dist.get_world_size() if dist.is_initialized() else 1
    loss_sum, first_bad = torch.full((), loss_sum, device=device), torch.zeros((), dtype=torch.long, device=device)
    window_loss, window_images, window_steps = torch.zeros((), device=device), 0, 0
    # Data wait: on the CPU, the time blocked in next(). On a GPU, where the CPU runs ahead, two CUDA events per step
    # time the gap between one step's end and the next one's start, read at the logging sync point.
    cpu_wait, gaps, step_end = 0.0, [], None
    epoch_start = window_start = fetch_start = time.perf_counter()
    for step, (images, targets) in enumerate(batches, first_step + 1):
        if device.type != "cuda":
            cpu_wait += time.perf_counter() - fetch_start
        elif step_end is not None:
            start = torch.cuda.Event(enable_timing=True)
            start.record()
            gaps.append((step_end, start))
        if args.channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
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
        loss_sum, window_loss = loss_sum + loss.detach(), window_loss + loss.detach()
        first_bad = torch.where((first_bad == 0) & ~torch.isfinite(loss.detach()), step, first_bad)  # no sync
        window_images, window_steps = window_images + len(targets), window_steps + 1
        if step % args.print_freq == 0 or step == steps:
            window_loss = window_loss.item()  # a sync point: after it, this window's CUDA events have happened
            wait = sum(a.elapsed_time(b) for a, b in gaps) / 1000 if gaps else cpu_wait
            loss_total, images_total, wait_total = all_reduce_sum([window_loss, window_images, wait], device)
            check_finite(math.isfinite(loss_total), epoch, int(first_bad) or step, "loss")
            now = time.perf_counter()
            elapsed = now - window_start
            record = {"type": "train", "epoch": epoch, "step": step, "steps": steps,
                      "global_step": (epoch - 1) * steps + step,
                      "loss": loss_total / (window_steps * world_size), "lr": optimizer.param_groups[0]["lr"],
                      "img_s": images_total / elapsed, "data_wait": 100 * wait_total / (elapsed * world_size)}
            eta = (now - epoch_start) / (step - first_step) * (steps - step)
            log(record, f"Epoch: [{epoch}/{args.epochs}] [{step:>{len(str(steps))}}/{steps}]  "
                        f"loss {record['loss']:.4f}  lr {record['lr']:.5f}  img/s {record['img_s']:.1f}  "
                        f"data-wait {record['data_wait']:.1f}%  eta {datetime.timedelta(seconds=round(eta))}")
            window_loss, window_images, window_steps, cpu_wait, gaps = torch.zeros((), device=device), 0, 0, 0.0, []
            window_start = time.perf_counter()
        signum = stop.requested() if stop else None  # the same answer on every process
        if save_mid_epoch is not None and step < steps and (signum or args.checkpoint_every and
                                                            step % args.checkpoint_every == 0):
            path = save_mid_epoch(step, loss_sum.item())
            if signum:
                StopSignals.exit(signum, path, epoch, step)
        fetch_start = time.perf_counter()
    (loss_total,) = all_reduce_sum([loss_sum.item()], device)
    check_finite(math.isfinite(loss_total), epoch, int(first_bad) or steps, "loss")
    return loss_total / (steps * world_size)


@torch.no_grad()
def evaluate(model, batches, args, device):
    """Dice and IoU in percent per class and their mean, from the pixel counts of the whole validation set (all
    shards); also the first batch's images, masks and predictions, for the overlay."""
    model.eval()
    n = max(2, args.num_classes)
    confusion, first = torch.zeros(n * n, dtype=torch.float64, device=device), None  # (true class, predicted class)
    for images, masks in batches:
        if images.shape[0] == 0:  # a shard one sample short of the others ends on an empty batch
            continue
        if args.channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        with autocast(args, device):
            logits = model(images)
        pred, target = (logits[:, 0] > 0).long() if args.num_classes == 1 else logits.argmax(1), masks[:, 0]
        confusion += torch.bincount((target * n + pred).flatten(), minlength=n * n).double()
        if first is None:
            first = (images[:4].float(), target[:4], pred[:4])
    confusion = torch.tensor(all_reduce_sum(confusion.tolist(), device), dtype=torch.float64).view(n, n)
    classes = [1] if args.num_classes == 1 else list(range(n))  # binary runs report the foreground only
    inter, npred, ntarget = confusion.diag()[classes], confusion.sum(0)[classes], confusion.sum(1)[classes]
    dice, iou = 200 * inter / (npred + ntarget).clamp(min=1), 100 * inter / (npred + ntarget - inter).clamp(min=1)
    return {"val_dice": dice.mean().item(), "val_iou": iou.mean().item(),
            "val_dice_per_class": dict(zip(map(str, classes), dice.tolist())),
            "val_iou_per_class": dict(zip(map(str, classes), iou.tolist()))}, first


def describe(metrics):
    return f"Dice {metrics['val_dice']:.3f} IoU {metrics['val_iou']:.3f}"


def main(args):
    ddp = setup_distributed(args)  # torchrun's RANK, LOCAL_RANK and WORLD_SIZE; this process's device
    device = ddp.device
    ckpt = load_checkpoint(args.resume) if args.resume else None
    locate_data(args, ddp)  # builds the demo set or prepares a PNG root, or checks --data
    run_dir, log = open_run(args, ddp, ckpt)  # the run's own folder, locked; log() prints and appends to metrics.jsonl
    data = build_data(args, ddp, ckpt, log)  # DALI pipelines and iterators over this process's shard
    model, model_without_ddp, model_ema, optimizer, scheduler, scaler = build_model(args, ddp, data, log)
    criterion = functools.partial(dice_ce_loss, num_classes=args.num_classes)
    state = {"model": model_without_ddp, "model_ema": model_ema, "optimizer": optimizer, "scheduler": scheduler,
             "scaler": scaler}  # what a checkpoint holds beside the run's position
    start_epoch, first_step, best, loss_sum = resume(ckpt, args, ddp, state, data.steps, log)

    if args.evaluate:
        metrics, _ = evaluate(model_ema if model_ema is not None else model_without_ddp, data.val_batches(), args, device)
        log({"type": "eval", **metrics, "ema": model_ema is not None},
            f"Test{' (EMA)' if model_ema is not None else ''}: {describe(metrics)}")
        return
    stop = StopSignals(ddp)  # from here on SIGTERM, SIGINT and SIGUSR1 stop the run at a step, its checkpoint saved

    def save(epoch, step, is_best=False, loss_sum=0.0):
        return save_checkpoint(run_dir, state, data, args, ddp, epoch=epoch, step=step, best=best, is_best=is_best,
                               log=log, loss_sum=loss_sum)

    for epoch in range(start_epoch, args.epochs + 1):
        start = time.perf_counter()
        # The first epoch reads validation too, a batch a step: a bad file shows at once, yet step 1 waits for none.
        batches = alongside(data.train_batches(first_step), data.val_batches() if epoch == start_epoch else ())
        train_loss = train_one_epoch(model, criterion, optimizer, scheduler, scaler, batches,
                                     epoch, first_step, data.steps, args, device, log, model_ema,
                                     lambda step, loss_sum: save(epoch, step, loss_sum=loss_sum), stop, loss_sum)
        first_step, loss_sum = 0, 0.0
        if dist.is_initialized():  # rank 0's BatchNorm statistics to all: DDP copies them only as a forward pass starts
            for buffer in (b for m in (model_without_ddp, model_ema) if m is not None for b in m.buffers()):
                dist.broadcast(buffer, 0)
        metrics, first = evaluate(model_without_ddp, data.val_batches(), args, device)
        record, line = {"type": "epoch", "epoch": epoch, "train_loss": train_loss, **metrics}, describe(metrics)
        if model_ema is not None:
            ema_metrics, _ = evaluate(model_ema, data.val_batches(), args, device)
            record.update({f"ema_{k}": v for k, v in ema_metrics.items()})
            line += f"  EMA {describe(ema_metrics)}"
        is_best, best = metrics["val_dice"] > best, max(metrics["val_dice"], best)
        path = save(epoch, data.steps, is_best)
        if ddp.master:
            save_overlay(os.path.join(run_dir, f"val_epoch{epoch:03d}.png"), *first, args.num_classes)
        record.update(epoch_time=time.perf_counter() - start, step=data.steps, global_step=epoch * data.steps)
        log(record, f"Epoch {epoch}: val {line}  train loss {train_loss:.4f}  time {record['epoch_time']:.1f}s")
        if signum := stop.requested():
            StopSignals.exit(signum, path, epoch, data.steps)


# ==========================================================================================
# Plumbing: processes and devices, data, run folder, checkpoints. main() above is the plan of a run.
# ==========================================================================================


class UsageError(Exception):
    """A flag, file or condition the run cannot go on with: one `error:` line, exit status 2."""

def number(kind, allowed, ok):
    """An argparse type: a ``kind`` value for which ``ok(value)`` holds, else the error 'must be <allowed>'."""
    def parse(text):
        value = kind(text)  # a ValueError is argparse's "invalid int value: 'x'"
        if not (math.isfinite(value) and ok(value)):
            raise argparse.ArgumentTypeError(f"must be {allowed}, got {text}")
        return value
    parse.__name__ = kind.__name__
    return parse


at_least_1, at_least_0 = number(int, "at least 1", lambda v: v >= 1), number(int, "at least 0", lambda v: v >= 0)
positive, non_negative = number(float, "> 0", lambda v: v > 0), number(float, ">= 0", lambda v: v >= 0)
probability, below_one = number(float, "in [0, 1]", lambda v: 0 <= v <= 1), number(float, "in [0, 1)", lambda v: 0 <= v < 1)

def setup_distributed(args):
    """torchrun's process group (NCCL on GPUs, gloo on CPUs); this process's place in it, device and switches."""
    rank, local_rank, world_size = (int(os.environ.get(k, d)) for k, d in (("RANK", 0), ("LOCAL_RANK", 0), ("WORLD_SIZE", 1)))
    ddp = SimpleNamespace(active="RANK" in os.environ, rank=rank, local_rank=local_rank, world_size=world_size,
                          master=rank == 0, device=torch.device("cuda", local_rank) if torch.cuda.is_available() else
                          torch.device("cpu"))  # master: the one process that writes logs and checkpoints
    if ddp.device.type == "cuda":
        if local_rank >= torch.cuda.device_count():
            raise UsageError(f"LOCAL_RANK {local_rank}: this machine shows {torch.cuda.device_count()} CUDA device(s) "
                             f"and each process needs one; start at most that many (torchrun --nproc_per_node), or "
                             f"hide them (CUDA_VISIBLE_DEVICES=) to train on the CPU")
        torch.cuda.set_device(ddp.device)
        torch.backends.cudnn.benchmark = True  # fixed input sizes: cuDNN times its kernels once and keeps the fastest
        # Training kernels get the higher stream priority, so DALI's kernels, on DALI's own streams, fill the gaps.
        torch.cuda.set_stream(torch.cuda.Stream(ddp.device, priority=-1))
    args.dali_device = args.dali_device or ("gpu" if ddp.device.type == "cuda" else "cpu")
    args.amp = ("fp16" if ddp.device.type == "cuda" else "bf16") if args.amp == "default" else args.amp
    if args.dali_device == "gpu" and ddp.device.type != "cuda":
        raise UsageError("--dali-device gpu: no CUDA device is visible; use --dali-device cpu")
    if args.sync_bn and ddp.device.type != "cuda" and not args.evaluate:
        raise UsageError("--sync-bn: SyncBatchNorm trains on CUDA devices only")
    if ddp.active:
        dist.init_process_group("nccl" if ddp.device.type == "cuda" else "gloo",
                                device_id=ddp.device if ddp.device.type == "cuda" else None)
    return ddp

def check_finite(finite, epoch, step, what):
    """A run whose loss or weights are not finite ends here, before a checkpoint can save the damage."""
    if not finite:
        raise UsageError(f"epoch {epoch} step {step}: the {what} went NaN or infinite; stopped there, the checkpoints "
                         f"kept (usual causes: too high an --lr, or bad input such as NaN or infinite pixels)")

def all_reduce_sum(values, device):
    """Sum floats over all processes (a host-device sync point: call it rarely)."""
    t = torch.tensor(values, dtype=torch.float64, device=device)
    if dist.is_initialized():
        dist.all_reduce(t)
    return t.tolist()

def autocast(args, device):
    return torch.autocast(device.type, dtype=torch.bfloat16 if args.amp == "bf16" else torch.float16,
                          enabled=args.amp != "none")

def build_model(args, ddp, data, log):
    """The model to train (DDP-wrapped, compiled), the plain one (saved), its EMA, optimizer, schedule, scaler."""
    torch.manual_seed(args.seed)
    model = make_model(args, data.channels)
    if args.weights and not args.resume:  # --resume loads its own weights
        log({"type": "weights", "weights": args.weights}, load_weights(model, args))
    if args.sync_bn and ddp.active:
        model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)  # batch statistics over all GPUs
    model = model.to(ddp.device, memory_format=torch.channels_last if args.channels_last else torch.preserve_format)
    model_without_ddp, model_ema = model, None  # the plain model's forward passes need no collective
    if ddp.active:
        model = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[ddp.local_rank] if ddp.device.type == "cuda" else None)
    if args.model_ema:
        # torchvision's recipe: the decay is set for a reference of 1024 images per EMA update over the run.
        alpha = min(1.0, (1.0 - args.model_ema_decay) * ddp.world_size * args.batch_size * args.model_ema_steps
                    / args.epochs)
        model_ema = torch.optim.swa_utils.AveragedModel(
            model_without_ddp, device=ddp.device, use_buffers=True,
            multi_avg_fn=torch.optim.swa_utils.get_ema_multi_avg_fn(1.0 - alpha))
    lr = args.lr * args.batch_size * ddp.world_size / 256  # --lr is for a global batch of 256
    if args.lr_scheduler == "cosine" and args.lr_min > lr:
        raise UsageError(f"--lr-min {args.lr_min} is above the learning rate, {lr:.6g} (--lr x global batch / 256): "
                         f"the cosine schedule would climb")
    optimizer = make_optimizer(model_without_ddp, args, lr)
    # fp16 gradients underflow without loss scaling; bf16 has fp32's range and needs none.
    scaler = torch.amp.GradScaler(ddp.device.type, enabled=args.amp == "fp16")
    log({"type": "config", "args": vars(args)},
        f"{args.arch}: world size {ddp.world_size}, batch {args.batch_size} per process, global batch "
        f"{args.batch_size * ddp.world_size}, {data.steps} steps per epoch, lr {lr:.5f} (--lr {args.lr} x global "
        f"batch / 256), {args.opt}, {args.lr_scheduler} schedule, model on {ddp.device}, DALI on {args.dali_device}")
    model = torch.compile(model) if args.compile else model
    return model, model_without_ddp, model_ema, optimizer, make_scheduler(optimizer, args, data.steps), scaler

def locate_data(args, ddp):
    """--data as a prepared root (csv_file/ inside): the demo set and PNG roots are prepared first, once per node."""
    local = not remote(args.data)  # an s3:// prefix holds a prepared root: data_processing.py writes to local disk
    if args.data != "demo" and not isdir(args.data if local else os.path.join(args.data, "csv_file")):
        raise UsageError(f"--data {args.data}: no such directory (expected a prepared root with csv_file/, "
                         f"a PNG root with Images/ and Masks/ (not s3://), or --data demo)")
    if args.data == "demo" or (local and not os.path.isdir(os.path.join(args.data, "csv_file"))):
        from data_processing import prepare  # needed only to build or convert a PNG set
        root = DEMO_DIR if args.data == "demo" else args.data
        if ddp.local_rank == 0:  # one process per node builds or converts the data, the others wait at the barrier
            args.data = prepare(root, demo=root == DEMO_DIR)
        if ddp.active:
            dist.barrier()
            args.data = prepare(root)  # finds what the first one made

def build_data(args, ddp, ckpt, log):
    """The pipelines (shard RANK of WORLD_SIZE, on GPU LOCAL_RANK or the CPU), their iterators, what the run needs to
    know of the data; checks the masks' values, and that a --resume checkpoint fits the data."""
    dali_state = ckpt.get("dali") if ckpt and not args.evaluate else None
    splits = {split: read_split(args.data, split) for split in ("train", "valid")}
    pipeline_args = dict(num_threads=args.workers, device_id=ddp.local_rank if args.dali_device == "gpu" else None,
                         size=(args.size, args.size), shard_id=ddp.rank, num_shards=ddp.world_size,
                         seed=args.seed + ddp.rank)
    # Checkpointing the train pipeline (reader position, random states) costs nothing until asked for.
    train_pipe = fetch_dali_loader(*splits["train"], args.batch_size, "train", enable_checkpointing=True,
                                   checkpoint=dali_state[ddp.rank] if dali_state else None, **pipeline_args)
    val_pipe = fetch_dali_loader(*splits["valid"], args.batch_size, "eval", **pipeline_args)
    for _, lbls in splits.values():  # each process reads its share of the masks: a class index beyond the model's?
        if found := first_mask_above(lbls[ddp.rank::ddp.world_size], max(1, args.num_classes - 1), args.workers):
            raise DataError(f"{found[0]}: mask holds class {found[1]}; expected values " + (
                "0 or 1 (binary, --num-classes 1)" if args.num_classes == 1 else f"below --num-classes {args.num_classes}"))
    classes, num_samples = [str(k) for k in range(args.num_classes)], len(splits["train"][0])
    if ckpt:
        check_resumable(ckpt, args, classes, num_samples, ddp.world_size)
    train_loader, val_loader = segment_iterator(train_pipe), segment_iterator(val_pipe)
    steps = len(train_loader)  # the same on every process: every shard runs as many full batches
    log({"type": "start", "output_dir": log.run_dir, "data": args.data, "train_samples": num_samples,
         "val_samples": len(splits["valid"][0]), "channels": train_pipe.channels},
        (f"run folder {log.run_dir}; " if log.run_dir else "") + f"data {args.data}: {num_samples} train and "
        f"{len(splits['valid'][0])} val pairs, {train_pipe.channels}-channel images")

    def dali_batches(loader):
        for batch in loader:
            yield batch[0]["image"].to(ddp.device, non_blocking=True), batch[0]["mask"].long().to(ddp.device,
                                                                                                 non_blocking=True)

    def train_batches(first_step):
        if args.loader == "dali":
            return dali_batches(train_loader)
        batch = (torch.randn(args.batch_size, train_pipe.channels, args.size, args.size, device=ddp.device),
                 torch.randint(0, max(2, args.num_classes), (args.batch_size, 1, args.size, args.size), device=ddp.device))
        return [batch] * (steps - first_step)  # one batch already on the device: the ceiling for any loader

    return SimpleNamespace(train_loader=train_loader, steps=steps, classes=classes, channels=train_pipe.channels,
                           num_samples=num_samples, train_batches=train_batches,
                           val_batches=lambda: dali_batches(val_loader))

DEMO_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), ".cache", "demo-segment-v1")

def open_run(args, ddp, ckpt):
    """(the run's folder: --output-dir, --resume's, or a new RUNS_DIR/expN, on the main process unless only
    evaluating; ``log(record, line)``, which prints the line and appends the record to its metrics.jsonl)."""
    out = None
    if ddp.master and (args.output_dir or not args.evaluate):
        out = args.output_dir or (os.path.dirname(os.path.abspath(args.resume)) if args.resume else None)
        if out is None:
            os.makedirs(RUNS_DIR, exist_ok=True)
            n = 1 + max([int(d[3:]) for d in os.listdir(RUNS_DIR) if d[:3] == "exp" and d[3:].isdigit()], default=0)
        while out is None:  # mkdir is atomic: two runs starting at once get two folders
            with contextlib.suppress(FileExistsError):
                os.mkdir(os.path.join(RUNS_DIR, f"exp{n}"))
                out = os.path.join(RUNS_DIR, f"exp{n}")
            n += 1
        lock_run_dir(out, args, ckpt)

    writer = tensorboard_writer(out) if args.tensorboard and out else None

    def log(record, line):  # every record gets "time": seconds since the Unix epoch
        if ddp.master:
            print(line, flush=True)
            record = {**record, "time": time.time()}
            if out:
                with open(os.path.join(out, "metrics.jsonl"), "a") as f:
                    f.write(json.dumps(record) + "\n")
            for key, value in record.items() if writer and "global_step" in record else ():
                if isinstance(value, float) and key != "time":  # type/name: train/loss, epoch/val_top1, ...
                    writer.add_scalar(f"{record['type']}/{key}", value, record["global_step"], record["time"])

    log.run_dir = out
    return out, log

def tensorboard_writer(out):
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise UsageError("--tensorboard: needs the tensorboard package (pip install tensorboard)") from None
    return SummaryWriter(out, flush_secs=10)

def lock_run_dir(out, args, ckpt):
    """Refused: a folder another run writes to, or, without --overwrite, one holding another run's checkpoint.
    metrics.jsonl keeps each record once: a resumed run's from its checkpoint's step on, a new run's alone."""
    if os.path.exists(out) and not os.path.isdir(out):
        raise UsageError(f"--output-dir {out}: is a file, not a folder")
    try:
        os.makedirs(out, exist_ok=True)
        lock = os.open(os.path.join(out, ".lock"), os.O_WRONLY | os.O_CREAT, 0o644)  # open until the process ends
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released by the OS when the process ends, however it ends
    except BlockingIOError:
        raise UsageError(f"--output-dir {out}: another run is writing to it ({os.path.join(out, '.lock')} is "
                         f"locked); wait for it or pick another --output-dir") from None
    except OSError as e:
        raise UsageError(f"--output-dir {out}: cannot write there ({e.strerror})") from None
    continuing = args.resume and os.path.dirname(os.path.abspath(args.resume)) == os.path.abspath(out)
    previous = [f for f in ("checkpoint.pth", "best.pth") if os.path.exists(os.path.join(out, f))]
    if previous and not args.evaluate and not continuing and not args.overwrite:
        raise UsageError(f"--output-dir {out}: holds a previous run's {previous[0]}; pass --resume "
                         f"{os.path.join(out, previous[0])} to continue it or --overwrite to replace it")
    metrics = os.path.join(out, "metrics.jsonl")
    if continuing and not args.evaluate and os.path.exists(metrics):  # the steps after the checkpoint run again
        with open(metrics) as f:
            kept = [r for r in f if json.loads(r).get("global_step", 0) <= ckpt.get("global_step", math.inf)]
        with atomic_open(metrics, "w") as f:
            f.writelines(kept)
    elif not continuing and (args.overwrite or not previous) and os.path.exists(metrics):  # a run without checkpoints
        os.remove(metrics)
    for name in os.listdir(out):  # what a killed save left behind; the lock says no other run is saving here
        if ".pth.tmp-" in name or name.endswith(".partial"):
            os.remove(os.path.join(out, name))

def save_checkpoint(run_dir, state, data, args, ddp, *, epoch, step, best, is_best, log, loss_sum):
    """checkpoint.pth (and best.pth): ``state``'s state dicts, the position, every process's DALI and random state."""
    states = [(data.train_loader.checkpoints()[0], torch.get_rng_state(), loss_sum)]  # this process's
    if dist.is_initialized():
        states, mine = [None] * ddp.world_size if ddp.master else None, states[0]
        dist.gather_object(mine, states, dst=0)
    if not ddp.master:
        return None
    dali, rng, loss_sums = (list(s) for s in zip(*states))
    ckpt = {name: obj.state_dict() if obj is not None else None for name, obj in state.items()}
    check_finite(all(torch.isfinite(v).all() for v in ckpt["model"].values() if v.is_floating_point()), epoch, step,
                 "weights")
    ckpt.update(epoch=epoch, step=step, global_step=(epoch - 1) * data.steps + step, loss_sum=loss_sums,
                args=vars(args), best=best, classes=data.classes, rng=rng,
                num_samples=data.num_samples, world_size=ddp.world_size, dali=dali if args.loader == "dali" else None)
    for name in ("checkpoint.pth", "best.pth") if is_best else ("checkpoint.pth",):
        path, tmp = os.path.join(run_dir, name), os.path.join(run_dir, f"{name}.tmp-{os.getpid()}")
        try:  # a temporary file, then a rename: the previous file stays whole if saving fails or is killed
            torch.save(ckpt, tmp)
            os.replace(tmp, path)
        except (OSError, RuntimeError) as e:  # torch reports a full disk as a RuntimeError
            if os.path.exists(tmp):
                os.remove(tmp)
            why = e.strerror if isinstance(e, OSError) and e.strerror else str(e).strip().splitlines()[-1]
            raise UsageError(f"{path}: could not save the checkpoint ({why}); the previous one is kept") from None
    if step < data.steps:
        log({"type": "checkpoint", "epoch": epoch, "step": step, "global_step": ckpt["global_step"]},
            f"saved checkpoint.pth at epoch {epoch} step {step}")
    return os.path.join(run_dir, "checkpoint.pth")

def load_weights(model, args):
    """--weights: a torchvision weights name or a file (a state dict or a checkpoint of this script) into ``model``;
    tensors of another shape than the model's (a head for other classes) keep their fresh initialization."""
    name = args.weights
    try:
        state = (torch.load(name, map_location="cpu", weights_only=True) if os.path.isfile(name) else
                 torchvision.models.get_weight(name).get_state_dict(progress=False))
    except Exception as e:
        why = (str(e).strip() or type(e).__name__).splitlines()[-1][:200]
        raise UsageError(f"--weights {name}: neither a weights file nor a torchvision weights name such as "
                         f"ResNet50_Weights.IMAGENET1K_V2 ({why})") from None
    state, own = state.get("model", state), model.state_dict()  # a checkpoint's model, or the state dict itself
    state = state if state.keys() & own.keys() else {f"model.{k}": v for k, v in state.items()}  # in a wrapper
    fits = {k: v for k, v in state.items() if k in own and v.shape == own[k].shape}
    if not fits:
        raise UsageError(f"--weights {name}: none of its tensors fits the model of --arch {args.arch}")
    model.load_state_dict(fits, strict=False)
    return f"--weights {name}: {len(fits)} of the model's {len(own)} tensors loaded, the others newly initialized"

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
    if (theirs := ckpt["classes"]) != classes:
        k = next((i for i, (x, y) in enumerate(zip(theirs, classes)) if x != y), None)
        raise UsageError(f"{where}: trained on other classes (" + (f"class {k} is {theirs[k]!r} there and {classes[k]!r} "
                         f"in --data)" if k is not None else f"{len(theirs)} classes there, {len(classes)} in --data)"))
    if not args.evaluate and (ckpt["world_size"], saved["batch_size"], ckpt["num_samples"]) != (
            world_size, args.batch_size, num_samples):
        raise UsageError(f"{where}: taken with {ckpt['world_size']} process(es) x batch {saved['batch_size']} on "
                         f"{ckpt['num_samples']} training samples, this run has {world_size} x {args.batch_size} on "
                         f"{num_samples}; resume with the same, so the remaining steps and samples are the same")

def resume(ckpt, args, ddp, state, steps, log):
    """(first epoch, steps of it done, best score, this process's loss sum over them); ``state`` loaded from ``ckpt``."""
    if not ckpt:
        return 1, 0, -math.inf, 0.0
    if state["model_ema"] is not None and ckpt.get("model_ema") is None:
        raise UsageError(f"--resume {args.resume}: holds no EMA weights (its run had no --model-ema)")
    for name in ("model", "model_ema") if args.evaluate else state:
        try:
            if state[name] is not None:
                state[name].load_state_dict(ckpt[name])
        except RuntimeError as e:
            raise UsageError(f"--resume {args.resume}: its weights do not fit this model "
                             f"({str(e).splitlines()[1].strip()})") from None
    if args.evaluate:
        return 1, 0, -math.inf, 0.0
    torch.set_rng_state(ckpt["rng"][ddp.rank])
    start_epoch, first_step = (ckpt["epoch"] + 1, 0) if ckpt["step"] == steps else (ckpt["epoch"], ckpt["step"])
    log({"type": "resume", "epoch": start_epoch, "step": first_step},
        f"resumed from {args.resume}: epoch {start_epoch}, after step {first_step} of {steps}")
    return start_epoch, first_step, ckpt["best"], ckpt.get("loss_sum", [0.0] * ddp.world_size)[ddp.rank] * (first_step > 0)

if __name__ == "__main__":
    run_main(main, parse_args(), UsageError)  # a UsageError or DataError: one `error:` line, exit status 2
