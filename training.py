"""What train_classify.py and train_segment.py share: flags, distributed set-up, the optimiser and
its schedule, mixed precision, the timed training loop, logging and atomic checkpoints.

Each script keeps its own model, loss, metric and pipeline; everything here is written once.
"""

import argparse
import datetime
import json
import math
import os
import sys
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import torch
import torch.distributed as tdist

from pipelines import DataError


class UsageError(Exception):
    """A flag or input the script cannot work with; printed as one line, exit status 2."""


def run(main, parser):
    """Parse the flags and run ``main(args)``; bad input ends in one ``error:`` line, no traceback."""
    args = parser.parse_args()
    try:
        main(args)
    except (UsageError, DataError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


# ------------------------------------------------------------------------------------------
# flags shared by both scripts
# ------------------------------------------------------------------------------------------


def add_training_args(parser, defaults):
    """The flags both scripts take; ``defaults`` holds each script's own defaults."""
    g = parser.add_argument_group("data loading")
    g.add_argument("-j", "--workers", type=int, default=defaults.get("workers", min(8, os.cpu_count() or 1)),
                   help="DALI CPU threads per process, or DataLoader workers with --loader torch")
    g.add_argument("--dali-device", choices=["gpu", "cpu"], default=None,
                   help="where DALI decodes and augments: gpu (mixed decode, GPU ops) or cpu (DALI CPU-only) "
                        "(unset: gpu when CUDA is available, else cpu)")

    g = parser.add_argument_group("optimisation")
    g.add_argument("--epochs", type=int, default=defaults["epochs"], help="epochs to train")
    g.add_argument("-b", "--batch-size", type=int, default=defaults["batch_size"],
                   help="images per GPU (per process)")
    g.add_argument("--lr", type=float, default=defaults["lr"],
                   help="learning rate for a global batch of 256, scaled linearly by global batch / 256")
    g.add_argument("--momentum", type=float, default=0.9, help="SGD momentum")
    g.add_argument("--wd", "--weight-decay", type=float, default=defaults.get("wd", 1e-4), dest="wd",
                   help="weight decay")
    g.add_argument("--lr-warmup-epochs", type=float, default=defaults.get("lr_warmup_epochs", 0),
                   help="linear warm-up from 1%% of the lr, then cosine decay to 0")
    g.add_argument("--amp", choices=["bf16", "fp16", "none"], default="none",
                   help="mixed precision: bf16 autocast, fp16 autocast with a GradScaler, or none")
    g.add_argument("--channels-last", action="store_true", help="channels_last memory format")
    g.add_argument("--compile", action="store_true", help="torch.compile the model")

    g = parser.add_argument_group("output and checkpoints")
    g.add_argument("--output-dir", default=defaults["output_dir"],
                   help="where metrics.jsonl, checkpoint.pth and best.pth go")
    g.add_argument("--resume", default="", help="checkpoint to continue from")
    g.add_argument("--evaluate", action="store_true", help="only run validation (with --resume: of that model)")
    g.add_argument("--print-freq", type=int, default=defaults.get("print_freq", 50),
                   help="log a line every N steps")
    g.add_argument("--seed", type=int, default=0, help="seed of model init and DALI augmentations")


def check_args(args):
    for name in ("epochs", "batch_size", "workers", "print_freq"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")


# ------------------------------------------------------------------------------------------
# distributed
# ------------------------------------------------------------------------------------------


@dataclass
class Dist:
    rank: int = 0  # global rank: the DALI shard this process reads
    local_rank: int = 0  # GPU index on this node: the DALI device_id
    world_size: int = 1  # number of shards
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self):
        return self.rank == 0


def init_distributed():
    """One process per GPU under torchrun (NCCL), or per CPU process (gloo); a single process otherwise."""
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
        torch.backends.cudnn.benchmark = True  # fixed input sizes: pick the fastest convolutions once
        # Training kernels get the higher stream priority, so DALI's decoding and augmentation
        # kernels, on DALI's own streams, fill the gaps instead of delaying the steps.
        torch.cuda.set_stream(torch.cuda.Stream(device, priority=-1))
    if "RANK" not in os.environ:
        return Dist(device=device)
    tdist.init_process_group("nccl" if cuda else "gloo", device_id=device if cuda else None)
    return Dist(tdist.get_rank(), local_rank, tdist.get_world_size(), device)


@contextmanager
def main_process_first(dist):
    """Rank 0 runs the block (preparing or generating data) before the others read its result."""
    if not dist.is_main:
        tdist.barrier()
    yield
    if dist.is_main and dist.world_size > 1:
        tdist.barrier()


def dali_device_id(args, dist):
    """DALI's ``device_id``: this process's GPU, or None for DALI CPU-only."""
    if args.dali_device is None:
        args.dali_device = "gpu" if torch.cuda.is_available() else "cpu"
    if args.dali_device == "gpu":
        if not torch.cuda.is_available():
            raise UsageError("--dali-device gpu: no CUDA device is visible; use --dali-device cpu")
        return dist.local_rank
    return None


def all_reduce_sum(values, dist):
    """Sum a list of floats over all processes (a host-device sync point: call it rarely)."""
    t = torch.tensor(values, dtype=torch.float64, device=dist.device)
    if dist.world_size > 1:
        tdist.all_reduce(t)
    return t.tolist()


# ------------------------------------------------------------------------------------------
# optimiser, schedule, precision
# ------------------------------------------------------------------------------------------


def make_optimizer(model, args, dist, steps_per_epoch):
    """SGD at lr x global batch / 256, linear warm-up then cosine decay, stepped every iteration."""
    lr = args.lr * args.batch_size * dist.world_size / 256
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=args.momentum, weight_decay=args.wd)
    warmup = int(args.lr_warmup_epochs * steps_per_epoch)
    total = args.epochs * steps_per_epoch

    def factor(step):
        if step < warmup:
            return 0.01 + 0.99 * step / warmup
        return 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, total - warmup)))

    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, factor), lr


def autocast(args, device):
    if args.amp == "none":
        return nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16 if args.amp == "bf16" else torch.float16)


def make_scaler(args, device):
    # fp16 gradients underflow without loss scaling; bf16 has fp32's range and needs none.
    return torch.amp.GradScaler(device.type, enabled=args.amp == "fp16")


def prepare_model(model, args, dist):
    """(model to train, model to save): channels_last, DDP and compile applied in that order."""
    model = model.to(dist.device)
    if args.channels_last:
        model = model.to(memory_format=torch.channels_last)
    model_without_ddp = model
    if dist.world_size > 1:
        model = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[dist.local_rank] if dist.device.type == "cuda" else None)
    if args.compile:
        model = torch.compile(model)
    return model, model_without_ddp


def synthetic_batches(batch, steps):
    """One batch already on the device, ``steps`` times: the model's own speed, the ceiling for any loader."""
    for _ in range(steps):
        yield batch


# ------------------------------------------------------------------------------------------
# the training loop
# ------------------------------------------------------------------------------------------


class DataWait:
    """Time the device spends waiting for its next batch.

    On the CPU that is the wall time blocked in ``next()``. On a GPU the CPU runs ahead, so time
    blocked in ``next()`` also covers waiting for the GPU to finish earlier work; there two CUDA
    events per step time the gap on the GPU between the end of one step and the start of the next,
    read when the window is logged (already a sync point), so measuring adds no sync.
    """

    def __init__(self, device):
        self.cuda = device.type == "cuda"
        self.cpu_wait, self.gaps, self.step_end = 0.0, [], None

    def before_next(self):
        self.t0 = time.perf_counter()

    def got_batch(self):
        if not self.cuda:
            self.cpu_wait += time.perf_counter() - self.t0
        elif self.step_end is not None:  # the first step of an epoch has no step before it
            start = torch.cuda.Event(enable_timing=True)
            start.record()
            self.gaps.append((self.step_end, start))

    def step_done(self):
        if self.cuda:
            self.step_end = torch.cuda.Event(enable_timing=True)
            self.step_end.record()

    def take(self):
        """Seconds waited since the last call; call it after a sync point."""
        wait = sum(a.elapsed_time(b) for a, b in self.gaps) / 1000 if self.cuda else self.cpu_wait
        self.cpu_wait, self.gaps = 0.0, []
        return wait


def train_one_epoch(model, criterion, optimizer, scheduler, scaler, batches, steps, epoch, args, dist, log):
    """One pass over ``batches`` (pairs already on the device); returns the mean training loss.

    The logged data wait is ``DataWait``'s time over the wall time of the logging window.
    ``.item()`` and the all-reduce, both sync points, happen only on logging steps.
    """
    model.train()
    loss_sum = torch.zeros((), device=dist.device)
    window = {"images": 0, "loss": torch.zeros((), device=dist.device), "steps": 0}
    data_wait = DataWait(dist.device)
    epoch_start = window_start = time.perf_counter()
    it = iter(batches)
    step = 0
    while True:
        data_wait.before_next()
        try:
            inputs, targets = next(it)
        except StopIteration:
            break
        data_wait.got_batch()
        n = inputs.shape[0]
        if n == 0:
            # A shard one sample short of the others can end its epoch on an empty batch: the reader
            # pads every shard to the same step count and the iterator drops the padding. DDP still
            # needs this rank's backward, so it trains on two zero samples (BatchNorm needs more than
            # one) with zero weight.
            inputs = inputs.new_zeros((2, *inputs.shape[1:]))
            targets = targets.new_zeros((2, *targets.shape[1:]))
        if args.channels_last:
            inputs = inputs.contiguous(memory_format=torch.channels_last)
        with autocast(args, dist.device):
            loss = criterion(model(inputs), targets) * (n > 0)
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        scheduler.step()
        data_wait.step_done()
        step += 1
        loss = loss.detach()
        loss_sum += loss
        window["loss"] += loss
        window["images"] += n
        window["steps"] += 1
        if step % args.print_freq == 0 or step == steps:
            loss_item = window["loss"].item()
            loss_total, images, wait = all_reduce_sum([loss_item, window["images"], data_wait.take()], dist)
            now = time.perf_counter()
            elapsed = now - window_start
            record = {"type": "train", "epoch": epoch, "step": step, "steps": steps,
                      "loss": loss_total / (window["steps"] * dist.world_size),
                      "lr": optimizer.param_groups[0]["lr"], "img_s": images / elapsed,
                      "data_wait": 100 * wait / (elapsed * dist.world_size)}
            eta = (now - epoch_start) / step * (steps - step)
            log.write(record, f"Epoch: [{epoch}/{args.epochs}] [{step:>{len(str(steps))}}/{steps}]  "
                              f"loss {record['loss']:.4f}  lr {record['lr']:.5f}  img/s {record['img_s']:.1f}  "
                              f"data-wait {record['data_wait']:.1f}%  eta {datetime.timedelta(seconds=round(eta))}")
            window = {"images": 0, "loss": torch.zeros((), device=dist.device), "steps": 0}
            window_start = time.perf_counter()
    (loss_total,) = all_reduce_sum([loss_sum.item()], dist)
    return loss_total / max(1, step * dist.world_size)


# ------------------------------------------------------------------------------------------
# logging and checkpoints
# ------------------------------------------------------------------------------------------


class Log:
    """Prints a line and appends its record to ``metrics.jsonl``; only the main process writes."""

    def __init__(self, output_dir, dist):
        self.enabled = dist.is_main
        self.path = os.path.join(output_dir, "metrics.jsonl")
        if self.enabled:
            os.makedirs(output_dir, exist_ok=True)

    def write(self, record, line):
        if not self.enabled:
            return
        print(line, flush=True)
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")

    def info(self, line):
        if self.enabled:
            print(line, flush=True)


def save_atomic(obj, path):
    """torch.save to a temporary file, then rename: a crash never leaves a half-written checkpoint."""
    tmp = f"{path}.tmp-{os.getpid()}"
    torch.save(obj, tmp)
    os.replace(tmp, path)


def save_checkpoint(output_dir, model_without_ddp, optimizer, scheduler, scaler, epoch, args, best, is_best, extra):
    state = {"model": model_without_ddp.state_dict(), "optimizer": optimizer.state_dict(),
             "scheduler": scheduler.state_dict(), "scaler": scaler.state_dict(), "epoch": epoch,
             "args": vars(args), "best": best, **extra}
    save_atomic(state, os.path.join(output_dir, "checkpoint.pth"))
    if is_best:
        save_atomic(state, os.path.join(output_dir, "best.pth"))


def resume(args, model_without_ddp, optimizer, scheduler, scaler):
    """(first epoch to train, best metric so far), restored from ``--resume`` when given.

    With ``--evaluate`` only the model is restored.
    """
    if not args.resume:
        return 1, 0.0
    if not os.path.isfile(args.resume):
        raise UsageError(f"--resume {args.resume}: no such checkpoint file")
    ckpt = torch.load(args.resume, map_location="cpu", weights_only=False)
    model_without_ddp.load_state_dict(ckpt["model"])
    if not args.evaluate:
        optimizer.load_state_dict(ckpt["optimizer"])
        scheduler.load_state_dict(ckpt["scheduler"])
        scaler.load_state_dict(ckpt["scaler"])
    return ckpt["epoch"] + 1, ckpt["best"]


def describe(args, dist, steps_per_epoch, lr):
    """The derived quantities, printed once."""
    return (f"world size {dist.world_size}, batch {args.batch_size} per process, global batch "
            f"{args.batch_size * dist.world_size}, {steps_per_epoch} steps per epoch, lr {lr:.5f} "
            f"(--lr {args.lr} x global batch / 256), model on {dist.device}, DALI on {args.dali_device}")


def parser_with_demo_defaults(parser_fn, demo_defaults):
    """A parser whose defaults switch to ``demo_defaults`` when ``--data demo`` is given.

    Flags given on the command line still win over either set of defaults.
    """
    probe = argparse.ArgumentParser(add_help=False)
    probe.add_argument("--data")
    known, _ = probe.parse_known_args()
    parser = parser_fn()
    if known.data == "demo":
        parser.set_defaults(**demo_defaults)
    return parser
