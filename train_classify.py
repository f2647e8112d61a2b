"""Train an ImageNet-style classifier with DALI feeding PyTorch directly. Needs only pipelines.py beside it.

    python train_classify.py --data demo                  # builds a small demo set (no download), trains on it
    python train_classify.py --data /data/imagenet --amp bf16 --channels-last       # one GPU
    torchrun --nproc_per_node=8 train_classify.py --data /data/imagenet --amp bf16 --channels-last
    python train_classify.py --data demo --dali-device cpu  # DALI CPU-only (what runs without a GPU)
    python train_classify.py --data /data/imagenet --loader synthetic               # the model's own speed ceiling
    python train_classify.py --data /data/imagenet --resume runs/classify/exp1/checkpoint.pth   # continue a run
    python train_classify.py --data /data/imagenet --resume runs/classify/exp1/best.pth --evaluate

--data (local or s3://) holds train/ and val/: ImageFolder trees, TFRecords or WebDataset tars (make_shards.py writes both).
DALI decodes and augments on the GPU when there is one, else every operator and the training run on the CPU.
Read top to bottom: flags, model and loss, train_one_epoch / evaluate, main; the plumbing sits below the banner.
"""

import argparse
import contextlib
import datetime
import difflib
import fcntl
import json
import math
import os
import time
from types import SimpleNamespace

import torch
import torch.distributed as dist
import torchvision
from torchvision.transforms import v2

from pipelines import (DEFAULT_HW_DECODER_LOAD, ClassifyTrainPipeline, ClassifyValPipeline, StopSignals,
                       alongside, atomic_open, classify_iterator, decode_errors_named, isdir, make_demo_images,
                       plan_decoder_cache, run_main)

RUNS_DIR = "runs/classify"
# --data demo: a small, quick run; flags given on the command line still win.
DEMO_DEFAULTS = dict(arch="resnet18", epochs=6, batch_size=32, lr=0.2, train_crop_size=64, val_crop_size=64,
                     val_resize_size=73, print_freq=10, workers=min(4, os.cpu_count() or 1))


def get_args_parser(add_help=True):
    parser = argparse.ArgumentParser(description="Image classification on DALI", add_help=add_help,
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter, allow_abbrev=False)
    # A bad flag ends the run as every usage error does: one `error:` line, exit status 2.
    parser.error = lambda message: parser.exit(2, f"error: {message}\n")
    g = parser.add_argument_group("data")
    g.add_argument("--data", "--data-path", required=True, help="folder or s3:// prefix with train/ and val/, each "
                   "an ImageFolder tree, TFRecord files or WebDataset tars; or 'demo' for a built-in synthetic set (demo "
                   "also changes the defaults to: " + ", ".join(f"--{k.replace('_', '-')} {v}" for k, v in
                                                                DEMO_DEFAULTS.items()) + ")")
    g.add_argument("--num-classes", type=at_least_1, help="classes of shards without a classes.txt (ImageFolder "
                   "trees count their class folders)")
    g.add_argument("--label-offset", type=int, default=0, help="subtracted from every stored label (1 for TFRecords "
                   "of TensorFlow's ImageNet scripts)")
    g.add_argument("--train-crop-size", type=at_least_1, default=224, help="random-resized crop for training")
    g.add_argument("--val-resize-size", type=at_least_1, default=256, help="shorter side before the val crop")
    g.add_argument("--val-crop-size", type=at_least_1, default=224, help="centre crop for validation")
    g.add_argument("--crop-size", type=at_least_1, help="sets --train-crop-size and --val-crop-size (an older name)")
    g.add_argument("--random-erase", type=probability, default=0.0, help="probability of random erasing (in DALI)")
    g.add_argument("-j", "--workers", type=at_least_1, default=min(8, os.cpu_count() or 1), help="DALI threads")
    g.add_argument("--dali-device", choices=["gpu", "cpu"], help="where DALI runs (default: gpu if CUDA is available)")
    g.add_argument("--hw-decoder-load", type=probability, default=DEFAULT_HW_DECODER_LOAD,
                   help="share of JPEGs for the GPU's hardware decoder")
    g.add_argument("--decoder-cache", choices=["auto", "on", "off"], default="auto", help="keep decoded images in "
                   "DALI's GPU cache (auto: when this process's share fits in half the free GPU memory)")
    g.add_argument("--loader", choices=["dali", "synthetic"], default="dali", help="synthetic: train on one random "
                   "batch already on the device (the speed ceiling; validation still reads --data)")
    g = parser.add_argument_group("model")
    g.add_argument("--arch", "--model", default="resnet50", help="any torchvision classification model")
    g.add_argument("--weights", help="start from these weights: a torchvision weights name "
                   "(ResNet50_Weights.IMAGENET1K_V2, downloaded by torchvision) or a file (a state dict or a "
                   "checkpoint of this script); tensors of another shape (a head for other classes) start anew")
    g.add_argument("--sync-bn", action="store_true", help="SyncBatchNorm across processes under torchrun (CUDA only)")
    g.add_argument("--model-ema", action="store_true", help="an EMA of the weights, validated and saved beside them")
    g.add_argument("--model-ema-steps", type=at_least_1, default=32, help="steps between EMA updates")
    g.add_argument("--model-ema-decay", type=number(float, "in (0, 1)", lambda v: 0 < v < 1), default=0.99998,
                   help="EMA decay for a 1024-image reference, as torchvision's")
    g = parser.add_argument_group("optimisation")
    g.add_argument("--epochs", type=at_least_1, default=90, help="epochs to train")
    g.add_argument("-b", "--batch-size", type=at_least_1, default=256, help="images per process (per GPU)")
    g.add_argument("--opt", choices=["sgd", "adamw"], default="sgd", help="optimizer")
    g.add_argument("--lr", type=positive, default=0.1, help="lr per 256 images, scaled by global batch / 256 "
                   "(torchvision's --lr is the lr itself: pass it x 256 / global batch)")
    g.add_argument("--momentum", type=below_one, default=0.9, help="SGD momentum")
    g.add_argument("--wd", "--weight-decay", type=non_negative, default=1e-4, dest="wd", help="weight decay")
    g.add_argument("--norm-weight-decay", type=non_negative, help="weight decay of norm layers and biases (default: --wd)")
    g.add_argument("--label-smoothing", type=below_one, default=0.0, help="cross-entropy label smoothing")
    g.add_argument("--mixup-alpha", type=non_negative, default=0.0, help="MixUp alpha (0: off)")
    g.add_argument("--cutmix-alpha", type=non_negative, default=0.0, help="CutMix alpha (0: off)")
    g.add_argument("--clip-grad-norm", type=non_negative, default=0.0, help="clip the gradients' total norm (0: off)")
    g.add_argument("--lr-scheduler", choices=["cosine", "step", "poly"], default="cosine",
                   help="decay after warm-up, stepped every iteration")
    g.add_argument("--lr-warmup-epochs", type=non_negative, default=0, help="warm-up epochs")
    g.add_argument("--lr-warmup-method", choices=["linear", "constant"], default="linear", help="warm-up shape")
    g.add_argument("--lr-warmup-decay", type=non_negative, default=0.01, help="warm-up starts at this share of the lr")
    g.add_argument("--lr-step-size", type=at_least_1, default=30, help="step schedule: epochs between decays")
    g.add_argument("--lr-gamma", type=non_negative, default=0.1, help="step schedule: factor per decay")
    g.add_argument("--lr-min", type=non_negative, default=0.0, help="cosine schedule: the final lr")
    g.add_argument("--amp", nargs="?", const="default", choices=["bf16", "fp16", "none", "default"], default="none",
                   help="mixed precision (autocast); bare --amp: torch's default for the device (fp16 CUDA, bf16 CPU)")
    g.add_argument("--channels-last", action="store_true", help="channels_last memory format")
    g.add_argument("--compile", action="store_true", help="torch.compile the model")
    g.add_argument("--seed", type=int, default=0, help="seed of model init, DALI augmentations, mixup and cutmix")
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
    if args.crop_size:
        args.train_crop_size = args.val_crop_size = args.crop_size
    if args.val_resize_size < args.val_crop_size:
        parser.error(f"--val-resize-size {args.val_resize_size} is below --val-crop-size {args.val_crop_size}: the "
                     f"centre crop must fit in the resized image")
    return args


def make_model(args, num_classes):
    names = torchvision.models.list_models(module=torchvision.models)
    if args.arch not in names:
        close = difflib.get_close_matches(args.arch, names, n=5, cutoff=0.5)
        hint = f"; close names: {', '.join(close)}" if close else "; see torchvision.models.list_models()"
        raise UsageError(f"--arch {args.arch}: not a torchvision classification model{hint}")
    return torchvision.models.get_model(args.arch, weights=None, num_classes=num_classes)


def get_mixup_cutmix(args, num_classes):
    """torchvision's MixUp and/or CutMix on the batch (one of the two, at random, when both are on)."""
    transforms = [t(alpha=alpha, num_classes=num_classes)
                  for t, alpha in ((v2.MixUp, args.mixup_alpha), (v2.CutMix, args.cutmix_alpha)) if alpha > 0]
    return (v2.RandomChoice(transforms) if len(transforms) > 1 else transforms[0]) if transforms else None


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
                    log, model_ema=None, mixup_cutmix=None, save_mid_epoch=None, stop=None, loss_sum=0.0):
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
        correct1, correct5, count = correct1 + hits[:, 0].sum(), correct5 + hits.any(dim=1).sum(), count + len(labels)
    correct1, correct5, count = all_reduce_sum([float(correct1), float(correct5), count], device)
    return {"val_top1": 100 * correct1 / count, "val_top5": 100 * correct5 / count}


def describe(metrics):
    return f"Acc@1 {metrics['val_top1']:.3f} Acc@5 {metrics['val_top5']:.3f}"


def main(args):
    ddp = setup_distributed(args)  # torchrun's RANK, LOCAL_RANK and WORLD_SIZE; this process's device
    device = ddp.device
    ckpt = load_checkpoint(args.resume) if args.resume else None
    locate_data(args, ddp)  # builds the demo set, or checks --data
    run_dir, log = open_run(args, ddp, ckpt)  # the run's own folder, locked; log() prints and appends to metrics.jsonl
    data = build_data(args, ddp, ckpt, log)  # DALI pipelines and iterators over this process's shard
    model, model_without_ddp, model_ema, optimizer, scheduler, scaler = build_model(args, ddp, data, log)
    criterion = torch.nn.CrossEntropyLoss(label_smoothing=args.label_smoothing)
    mixup_cutmix = get_mixup_cutmix(args, data.num_classes)
    state = {"model": model_without_ddp, "model_ema": model_ema, "optimizer": optimizer, "scheduler": scheduler,
             "scaler": scaler}  # what a checkpoint holds beside the run's position
    start_epoch, first_step, best, loss_sum = resume(ckpt, args, ddp, state, data.steps, log)

    if args.evaluate:
        metrics = evaluate(model_ema if model_ema is not None else model_without_ddp, data.val_batches(), args, device)
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
                                     epoch, first_step, data.steps, args, device, log, model_ema, mixup_cutmix,
                                     lambda step, loss_sum: save(epoch, step, loss_sum=loss_sum), stop, loss_sum)
        first_step, loss_sum = 0, 0.0
        if dist.is_initialized():  # rank 0's BatchNorm statistics to all: DDP copies them only as a forward pass starts
            for buffer in (b for m in (model_without_ddp, model_ema) if m is not None for b in m.buffers()):
                dist.broadcast(buffer, 0)
        metrics = evaluate(model_without_ddp, data.val_batches(), args, device)
        record, line = {"type": "epoch", "epoch": epoch, "train_loss": train_loss, **metrics}, describe(metrics)
        if model_ema is not None:
            ema_metrics = evaluate(model_ema, data.val_batches(), args, device)
            record.update({f"ema_{k}": v for k, v in ema_metrics.items()})
            line += f"  EMA {describe(ema_metrics)}"
        is_best, best = metrics["val_top1"] > best, max(metrics["val_top1"], best)
        path = save(epoch, data.steps, is_best)
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
    model = make_model(args, data.num_classes)
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
    """--data demo becomes the demo set, built once per node; any other --data must hold train/ and val/."""
    if args.data == "demo":
        if ddp.local_rank == 0:  # one process per node builds it, the others wait at the barrier
            make_demo_images(DEMO_DIR)
        if ddp.active:
            dist.barrier()
        args.data = DEMO_DIR
    if not all(isdir(os.path.join(args.data, split)) for split in ("train", "val")):  # s3:// prefixes too
        raise UsageError(f"--data {args.data}: expected subfolders train/ and val/ in it (each an ImageFolder tree, "
                         f"TFRecord files or WebDataset tars), or --data demo for the built-in demo set")

def build_data(args, ddp, ckpt, log):
    """The pipelines (DALI shard RANK of WORLD_SIZE, on GPU LOCAL_RANK or all on the CPU), their iterators, and what
    the run needs to know of the data; checks that a --resume checkpoint fits it."""
    dali_state = ckpt.get("dali") if ckpt and not args.evaluate else None
    pipeline_args = dict(num_threads=args.workers, device_id=ddp.local_rank if args.dali_device == "gpu" else None,
                         shard_id=ddp.rank, num_shards=ddp.world_size, seed=args.seed + ddp.rank,
                         hw_decoder_load=args.hw_decoder_load, label_offset=args.label_offset, num_classes=args.num_classes,
                         output_layout="HWC" if args.channels_last else "CHW")  # HWC is channels_last: no transpose

    def pipelines(cache=None):  # MB of DALI's decoder cache, one for both pipelines: see plan_decoder_cache
        # Checkpointing the train pipeline (reader position, random states) costs nothing until asked for.
        train = ClassifyTrainPipeline(args.batch_size, data_dir=os.path.join(args.data, "train"), decoder_cache=cache,
                                      crop_size=args.train_crop_size, random_erase=args.random_erase,
                                      enable_checkpointing=True, checkpoint=dali_state[ddp.rank] if dali_state else None,
                                      **pipeline_args)
        if train.num_classes is None:
            raise UsageError(f"--data {args.data}: the number of classes is unknown (no classes.txt beside the "
                             f"shards); pass --num-classes")
        classes = train.classes or [str(k) for k in range(train.num_classes)]  # names: checkpoints compare them
        return train, ClassifyValPipeline(args.batch_size, data_dir=os.path.join(args.data, "val"), classes=classes,
                                          crop_size=args.val_crop_size, resize_size=args.val_resize_size,
                                          decoder_cache=cache, **pipeline_args), classes

    if ddp.active and ddp.local_rank > 0:
        dist.barrier()  # local rank 0 indexes the node's new shards first; the others then find the indexes made
    train_pipe, val_pipe, classes = pipelines()
    if ddp.active and ddp.local_rank == 0:
        dist.barrier()
    cache, why = (ckpt.get("decoder_cache"), None) if dali_state else plan_decoder_cache(args.decoder_cache,
                                                                                         (train_pipe, val_pipe))
    if why:
        log({"type": "decoder_cache", "mb": cache}, why)
    if cache:  # the pipelines again, decoding whole images into the cache (DALI builds nothing until iterated)
        train_pipe, val_pipe, classes = pipelines(cache)
    num_classes = train_pipe.num_classes
    if ckpt:
        check_resumable(ckpt, args, classes, train_pipe.num_samples, ddp.world_size)
    with decode_errors_named(train_pipe):  # the iterators decode their first batches right away
        train_loader = classify_iterator(train_pipe)
    with decode_errors_named(val_pipe):
        val_loader = classify_iterator(val_pipe)
    steps = len(train_loader)  # the same on every process: every shard runs as many full batches
    in_val = {os.path.relpath(f, os.path.join(args.data, "val")).split(os.sep)[0] for f in val_pipe.files}
    missing = len(set(classes) - in_val) if val_pipe.layout == "folder" else 0  # val may lack some of train's
    log({"type": "start", "output_dir": log.run_dir, "data": args.data, "layout": train_pipe.layout,
         "train_samples": train_pipe.num_samples, "val_samples": val_pipe.num_samples, "classes": num_classes},
        (f"run folder {log.run_dir}; " if log.run_dir else "") + f"data {args.data}: {train_pipe.layout}, "
        f"{train_pipe.num_samples} train and {val_pipe.num_samples} val samples, {num_classes} classes"
        + (f" ({missing} of them have no val samples)" if missing else ""))

    def dali_batches(loader, pipe):  # HWC batches become NCHW tensors in channels_last memory, with no copy
        with decode_errors_named(pipe):
            for batch in loader:
                images, labels = batch[0]["data"], batch[0]["label"].squeeze(-1).long()
                images = images.permute(0, 3, 1, 2) if pipe.output_layout == "HWC" else images
                yield images.to(ddp.device, non_blocking=True), labels.to(ddp.device, non_blocking=True)

    def train_batches(first_step):
        if args.loader == "dali":
            return dali_batches(train_loader, train_pipe)
        images = torch.randn(args.batch_size, 3, args.train_crop_size, args.train_crop_size, device=ddp.device)
        batch = (images.contiguous(memory_format=torch.channels_last) if args.channels_last else images,
                 torch.randint(0, num_classes, (args.batch_size,), device=ddp.device))
        return [batch] * (steps - first_step)  # one batch already on the device: the ceiling for any loader

    return SimpleNamespace(train_loader=train_loader, steps=steps, classes=classes, num_classes=num_classes,
                           num_samples=train_pipe.num_samples, train_batches=train_batches, decoder_cache=cache,
                           val_batches=lambda: dali_batches(val_loader, val_pipe))

DEMO_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), ".cache", "demo-classify-v2")

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
                decoder_cache=data.decoder_cache,
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
    torch.set_rng_state(ckpt["rng"][ddp.rank])  # mixup and cutmix draw from it
    start_epoch, first_step = (ckpt["epoch"] + 1, 0) if ckpt["step"] == steps else (ckpt["epoch"], ckpt["step"])
    log({"type": "resume", "epoch": start_epoch, "step": first_step},
        f"resumed from {args.resume}: epoch {start_epoch}, after step {first_step} of {steps}")
    return start_epoch, first_step, ckpt["best"], ckpt.get("loss_sum", [0.0] * ddp.world_size)[ddp.rank] * (first_step > 0)

if __name__ == "__main__":
    run_main(main, parse_args(), UsageError)  # a UsageError or DataError: one `error:` line, exit status 2
