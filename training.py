"""What a training run needs around its loop, written once for train_classify.py and
train_segment.py.

    processes and devices   setup (World), autocast, all_reduce_sum, sync_buffers
    model and optimizer     prepare_model (DDP, EMA, optimizer, schedule, scaler), load_weights
    run folder and log      open_run: the run's folder, locked; its log (stdout, metrics.jsonl),
                            written from RunLog.begin on, once every check has passed
    checkpoints             RunData (what the trainer read), Checkpoints (atomic save)
    the loop's bookkeeping  StepLog: data wait, NaN checks, the windowed all-reduce, ETA, saves
    stopping and exiting    StopSignals (SIGTERM, SIGINT, SIGUSR1, SIGHUP, SIGUSR2), run_main

What happens on SIGTERM reads here alone: StopSignals catches it; every process agrees on the step
to stop at (StepLog.after_step, or the epoch's end); that step's checkpoint is saved
(Checkpoints.save); the process exits with 128 + the signal (StopSignals.exit). Continuing a run
from its checkpoint is resume.py's: a fresh run enters none of it.
"""

import argparse
import contextlib
import datetime
import errno
import fcntl
import hashlib
import json
import math
import os
import resource
import shutil
import signal
import sys
import time
import traceback
import urllib.parse
import zipfile
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torchvision

from data_sources import DataError
from outputs import atomic_open

# Seconds after which a log line is due whatever --print-freq says, so a slow run still shows life.
LOG_EVERY = 30.0


class UsageError(Exception):
    """A flag, file or condition the run cannot go on with: one `error:` line, exit status 2."""


# ------------------------------------------------------------------------------------------
# processes and devices
# ------------------------------------------------------------------------------------------


@dataclass
class World:
    """This process among torchrun's: its rank, its rank on its node, the number of processes,
    whether torchrun started it, and its device. The main process (rank 0) writes the logs and
    checkpoints."""

    rank: int = 0
    local_rank: int = 0
    size: int = 1
    distributed: bool = False
    device: torch.device = torch.device("cpu")
    cpu_threads: dict = None  # a CPU run's split of the cores (cpu_threads), for its log

    @property
    def main(self):
        return self.rank == 0


def torchrun_world():
    """The World that torchrun's environment describes: without torchrun, one process."""
    env = os.environ
    return World(
        rank=int(env.get("RANK", 0)),
        local_rank=int(env.get("LOCAL_RANK", 0)),
        size=int(env.get("WORLD_SIZE", 1)),
        distributed="RANK" in env,
    )


def setup(args, gpu_compile_mode="default"):
    """This process's World: its device, and under torchrun its place in the process group (NCCL
    on GPUs, gloo on CPUs). What follows from the device is settled here: bare --amp,
    --dali-device, --compile and --compile-mode get the device's defaults (``gpu_compile_mode``:
    the trainer's mode for its model on one GPU)."""
    refuse_tasks_without_torchrun()
    if args.device == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda: no CUDA device is visible; use --device cpu")
    cuda = args.device != "cpu" and torch.cuda.is_available()
    torch.use_deterministic_algorithms(args.use_deterministic_algorithms)  # torchvision's switch
    world = torchrun_world()
    if cuda:
        world.device = use_gpu(args, world.local_rank)
    if args.amp == "default":  # bare --amp: torch's default for the device
        args.amp = "fp16" if cuda else "bf16"
    args.dali_device = args.dali_device or ("gpu" if cuda else "cpu")
    if args.compile is None:  # a GPU run's model is compiled; a CPU run starts at once
        args.compile = cuda or "compile_mode" in args.given
    if args.compile_mode is None:
        args.compile_mode = gpu_compile_mode if cuda and not world.distributed else "default"
    if args.dali_device == "gpu" and not cuda:
        raise UsageError("--dali-device gpu: no CUDA device is visible; use --dali-device cpu")
    if args.sync_bn and not cuda and not args.evaluate:
        raise UsageError("--sync-bn: SyncBatchNorm trains on CUDA devices only")
    if not cuda:
        world.cpu_threads = cpu_threads(args)  # prepare_model logs it, in the run's log
    if world.distributed:
        join_process_group(world)
    return world


def use_gpu(args, local_rank):
    """This process's GPU, LOCAL_RANK, made the current device; its settings for training."""
    if local_rank >= torch.cuda.device_count():
        raise UsageError(
            f"LOCAL_RANK {local_rank}: this machine shows {torch.cuda.device_count()} CUDA "
            f"device(s) and each process needs one; start at most that many (torchrun "
            f"--nproc_per_node), or hide them (CUDA_VISIBLE_DEVICES=) to train on the CPU"
        )
    device = torch.device("cuda", local_rank)
    torch.cuda.set_device(device)
    if args.use_deterministic_algorithms:  # cuBLAS is, with a fixed workspace set before its use
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    # fixed input sizes: cuDNN picks its fastest kernels once (they may differ run to run)
    torch.backends.cudnn.benchmark = not args.use_deterministic_algorithms
    # float32 matmuls on TF32 tensor cores, as cuDNN's convolutions are by default: a float32 run
    # at the GPU's speed (--amp's run in bf16 or fp16)
    torch.set_float32_matmul_precision("high")
    # Training kernels get the higher stream priority, so DALI's kernels, on DALI's own streams,
    # fill the gaps.
    torch.cuda.set_stream(torch.cuda.Stream(device, priority=-1))
    return device


def join_process_group(world):
    """Under torchrun: the process group, through torchrun's env:// rendezvous."""
    store, _, _ = next(dist.rendezvous("env://"))
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        # The agent's store outlives its workers: those it restarts (--max-restarts) would find
        # their predecessors' addresses there, so each attempt keeps its own keys. Agents count
        # their attempts alike where every node restarts at once (a fixed --nnodes); an elastic
        # job's do not, and launch.py gives its workers a store of their own every round.
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        store = dist.PrefixStore(f"attempt{attempt}", store)
    cuda = world.device.type == "cuda"
    dist.init_process_group(
        "nccl" if cuda else "gloo",
        store=store,
        rank=world.rank,
        world_size=world.size,
        device_id=world.device if cuda else None,
    )


def cpu_threads(args):
    """A CPU-only run: torch keeps its own threads (a core each, or OMP_NUM_THREADS), beside DALI's
    -j. A core kept for DALI alone sat idle wherever DALI keeps up with the model; torch's idle
    threads sleep instead (flags.py sets OpenMP's wait policy), so the two share every core, and
    other work on the machine too. Returns the split's record, for the run's log."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return dict(type="cpu_threads", torch=torch.get_num_threads(), dali=args.workers, cores=cores)


def refuse_tasks_without_torchrun():
    """``srun -n N python train_*.py`` starts N processes that know nothing of each other: N runs
    of world size 1 in one folder. One line says to start torchrun instead."""
    tasks = int(os.environ.get("SLURM_NTASKS", 1))
    if tasks > 1 and "RANK" not in os.environ:
        raise UsageError(
            f"SLURM started {tasks} tasks (SLURM_NTASKS) without torchrun's RANK and WORLD_SIZE: "
            f"each would train alone; start one task per node that runs torchrun "
            f"(srun --ntasks-per-node=1 torchrun --nproc_per_node=GPUS ...)"
        )


def autocast(args, device):
    dtype = torch.bfloat16 if args.amp == "bf16" else torch.float16
    return torch.autocast(device.type, dtype=dtype, enabled=args.amp != "none")


def all_reduce_sum(values, device):
    """Sum floats over all processes (a host-device sync point: call it rarely)."""
    t = torch.tensor(values, dtype=torch.float64, device=device)
    if dist.is_initialized():
        dist.all_reduce(t)
    return t.tolist()


def sync_buffers(*models):
    """Under torchrun, rank 0's buffers (BatchNorm statistics) to every process: DDP copies them
    only as a forward pass starts, and validation should score one model everywhere."""
    for model in models:
        for buffer in model.buffers() if model is not None else ():
            dist.broadcast(buffer, 0)


def check_finite(finite, epoch, step, what):
    """A run whose loss or weights are not finite ends here, before a checkpoint can save the
    damage."""
    if not finite:
        raise UsageError(
            f"epoch {epoch} step {step}: the {what} went NaN or infinite; stopped there, before "
            f"a checkpoint could save them (usual causes: too high an --lr, or bad input such as "
            f"NaN or infinite pixels)"
        )


def alongside(items, extra):
    """``items``, passed through, taking one item of ``extra`` after each, and the rest of it after
    the last: work done beside a loop, a step at a time, that the loop's first item does not wait
    for."""
    extra = iter(extra)
    for item in items:
        yield item
        next(extra, None)
    for _ in extra:
        pass


# ------------------------------------------------------------------------------------------
# model, optimizer, schedule
# ------------------------------------------------------------------------------------------

NORM_LAYERS = (
    torch.nn.modules.batchnorm._BatchNorm,
    torch.nn.GroupNorm,
    torch.nn.LayerNorm,
    torch.nn.modules.instancenorm._InstanceNorm,
    torch.nn.LocalResponseNorm,
)


def make_optimizer(model, args, lr):
    """SGD (momentum) or AdamW; with --norm-weight-decay, normalization layers and biases get their
    own decay."""
    params = [p for p in model.parameters() if p.requires_grad]
    if args.norm_weight_decay is not None:
        params = norm_decay_groups(model, params, args)
    if args.opt == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=args.momentum, weight_decay=args.wd)
    return torch.optim.AdamW(params, lr=lr, weight_decay=args.wd)


def norm_decay_groups(model, params, args):
    """--norm-weight-decay: ``params`` in two groups, normalization layers and biases apart."""
    norm = [p for m in model.modules() if isinstance(m, NORM_LAYERS) for p in m.parameters(False)]
    norm += [p for name, p in model.named_parameters() if name.endswith(".bias")]
    norm_ids = {id(p) for p in norm}
    return [
        {"params": [p for p in params if id(p) not in norm_ids], "weight_decay": args.wd},
        {
            "params": [p for p in params if id(p) in norm_ids],
            "weight_decay": args.norm_weight_decay,
        },
    ]


def make_scheduler(optimizer, args, steps_per_epoch):
    """The lr of every step, torch's schedulers composed as torchvision's reference composes them:
    after --lr-warmup-epochs (warmed_up), cosine to --lr-min, step (x --lr-gamma every
    --lr-step-size epochs), exponential (x --lr-gamma every epoch) or poly ((1 - t/T) ** 0.9)."""
    sched = torch.optim.lr_scheduler
    warmup = int(args.lr_warmup_epochs * steps_per_epoch)
    length = max(1, args.epochs * steps_per_epoch - warmup)
    if args.lr_scheduler == "cosine":
        main = sched.CosineAnnealingLR(optimizer, T_max=length, eta_min=args.lr_min)
    elif args.lr_scheduler == "step":
        main = sched.StepLR(optimizer, args.lr_step_size * steps_per_epoch, gamma=args.lr_gamma)
    elif args.lr_scheduler == "exponential":  # torchvision's ExponentialLR, stepped once an epoch
        main = sched.StepLR(optimizer, steps_per_epoch, gamma=args.lr_gamma)
    else:
        main = sched.PolynomialLR(optimizer, total_iters=length, power=0.9)
    return warmed_up(optimizer, main, warmup, args) if warmup else main


def warmed_up(optimizer, main, warmup, args):
    """``main`` after ``warmup`` steps from --lr-warmup-decay x lr (a linear ramp or constant). At
    each epoch's start the lr is that of torchvision's schedulers stepped once an epoch."""
    sched = torch.optim.lr_scheduler
    start = args.lr_warmup_decay  # the share of the lr the warm-up starts at; timm's --warmup-lr:
    if getattr(args, "warmup_lr", None) is not None:  # that rate itself
        start = args.warmup_lr / optimizer.param_groups[0]["initial_lr"]
    if args.lr_warmup_method == "linear":
        ramp = sched.LinearLR(optimizer, start_factor=start, total_iters=warmup)
    else:
        ramp = sched.ConstantLR(optimizer, factor=start, total_iters=warmup)
    return sched.SequentialLR(optimizer, [ramp, main], milestones=[warmup])


def prepare_model(model, args, world, steps_per_epoch, log):
    """``model`` made ready to train (moved to the device, wrapped for DDP, compiled), and
    ``state``, what a checkpoint holds of the run: "model" (the plain model, what is saved),
    "model_ema" (or None), "optimizer", "scheduler" and "scaler"."""
    if args.weights and not args.resume:  # --resume loads its own weights
        log({"type": "weights", "weights": args.weights}, load_weights(model, args))
    if args.sync_bn and world.distributed:
        model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)  # batch statistics of all GPUs
    memory_format = torch.channels_last if args.channels_last else torch.preserve_format
    model = model.to(world.device, memory_format=memory_format)
    model_without_ddp = model  # the plain model's forward needs no collective
    if world.distributed:
        device_ids = [world.local_rank] if world.device.type == "cuda" else None
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=device_ids)
    model_ema = make_model_ema(model_without_ddp, args, world) if args.model_ema else None
    if world.cpu_threads:
        log(world.cpu_threads)
    lr, lr_from = learning_rate(args, args.batch_size * world.size)
    if args.lr_scheduler == "cosine" and args.lr_min > lr:
        raise UsageError(
            f"--lr-min {args.lr_min} is above the learning rate, {lr:.6g} ({lr_from}): the cosine "
            f"schedule would climb"
        )
    optimizer = make_optimizer(model_without_ddp, args, lr)
    # fp16 gradients underflow without loss scaling; bf16 has fp32's range and needs none.
    scaler = torch.amp.GradScaler(world.device.type, enabled=args.amp == "fp16")
    compiled = args.compile and not args.evaluate  # --evaluate scores the plain model
    if not args.evaluate:  # a training run's set-up: --evaluate's batch and rate are not its run's
        log(
            {
                "type": "config",
                "lr": lr,
                "lr_from": lr_from,
                "world_size": world.size,
                "batch_size": args.batch_size,
                "steps_per_epoch": steps_per_epoch,
                "device": str(world.device),
                "dali_device": args.dali_device,
                "compiled": compiled,
                "args": vars(args),
            }
        )
    state = {
        "model": model_without_ddp,
        "model_ema": model_ema,
        "optimizer": optimizer,
        "scheduler": make_scheduler(optimizer, args, steps_per_epoch),
        "scaler": scaler,
    }
    if compiled:  # the plain model stays what is saved and validated
        model = torch.compile(model, mode=args.compile_mode)
    return model, state


def make_model_ema(model, args, world):
    """--model-ema: torchvision's recipe, its decay set for a reference of 1024 images per EMA
    update."""
    images_per_update = world.size * args.batch_size * args.model_ema_steps
    alpha = min(1.0, (1.0 - args.model_ema_decay) * images_per_update / args.epochs)
    return torch.optim.swa_utils.AveragedModel(
        model,
        device=world.device,
        use_buffers=True,
        multi_avg_fn=torch.optim.swa_utils.get_ema_multi_avg_fn(1.0 - alpha),
    )


def update_ema(model_ema, model, step, epoch, args):
    """--model-ema's update after ``step`` of ``epoch``, as torchvision's: every --model-ema-steps
    from an epoch's first step (an epoch shorter than that updates too)."""
    if (step - 1) % args.model_ema_steps == 0:
        model_ema.update_parameters(model)
        if epoch <= args.lr_warmup_epochs:
            # in warm-up the EMA copies the weights, as torchvision's
            model_ema.n_averaged.fill_(0)


def learning_rate(args, global_batch):
    """(the run's learning rate, where it comes from): --lr as it is, torchvision's; else timm's
    --lr-base, a rate per --lr-base-size images, scaled to the global batch as timm scales it:
    by the ratio, or for AdamW by its square root (--lr-base-scale)."""
    if args.lr is not None:
        return args.lr, f"--lr {args.lr:g}"
    scale = getattr(args, "lr_base_scale", None) or ("sqrt" if args.opt == "adamw" else "linear")
    ratio = f"global batch {global_batch} / --lr-base-size {args.lr_base_size}"
    lr, how = args.lr_base * global_batch / args.lr_base_size, f"x {ratio}"
    if scale == "sqrt":
        lr, how = args.lr_base * math.sqrt(global_batch / args.lr_base_size), f"x sqrt({ratio})"
    if "lr_base" not in args.given:
        whose = "--data demo's" if getattr(args, "demo", False) else "the default"
        how += f", {whose}; --lr sets the rate itself"
    return lr, f"--lr-base {args.lr_base:g} {how}"


def load_weights(model, args):
    """--weights: a torchvision weights name or a file (a state dict, one of our checkpoints, or
    Lightning's or timm's layout) into ``model``; tensors of another shape than the model's (a head
    for other classes) keep their fresh initialization. A damaged file is refused (check_whole)."""
    name, is_file = args.weights, os.path.isfile(args.weights)
    if is_file:
        check_whole(name, "--weights")
    try:
        if is_file:
            state = read_weights(name)
        else:
            state = torchvision.models.get_weight(name).get_state_dict(progress=False)
    except Exception as e:
        if isinstance(e, OSError) and not is_file:  # a torchvision name's download, offline
            raise weights_refusal("--weights", name, e) from None
        why = (str(e).strip() or type(e).__name__).splitlines()[-1][:200]
        raise UsageError(
            f"--weights {name}: neither a weights file nor a torchvision weights name such as "
            f"ResNet50_Weights.IMAGENET1K_V2 ({why})"
        ) from None
    own = model.state_dict()
    named = named_as(state, own)
    fits = {k: v for k, v in named.items() if fits_in(own, k, v)}
    if not fits:
        raise UsageError(
            f"--weights {name}: none of its tensors fits the model of --arch {args.arch}"
        )
    check_same_model(name, state, named, own, args)
    if bad := next((k for k, v in fits.items() if not torch.isfinite(v).all()), None):
        raise UsageError(
            f"--weights {name}: its {bad} holds NaN or infinite values; not weights to train from"
        )
    model.load_state_dict(fits, strict=False)
    return (
        f"--weights {name}: {len(fits)} of the model's {len(own)} tensors loaded, the others newly "
        f"initialized"
    )


def check_same_model(name, state, named, own, args):
    """Weights of another model are refused: one of our checkpoints of another --arch, or tensors
    that other shapes than the model's set apart in more than their first dimension (only a head
    for other classes may differ, in its outputs)."""
    saved = state.get("args") if isinstance(state, dict) else None  # timm's: a Namespace
    their_arch = saved.get("arch") if isinstance(saved, dict) else None
    if isinstance(their_arch, str) and their_arch != args.arch:
        raise UsageError(
            f"--weights {name}: a checkpoint of --arch {their_arch}, not --arch {args.arch}; pass "
            f"--arch {their_arch}"
        )
    for key, value in named.items():
        ours = own.get(key)
        shape = getattr(value, "shape", None)
        if ours is not None and shape is not None and shape[1:] != ours.shape[1:]:
            raise UsageError(
                f"--weights {name}: weights of another model than --arch {args.arch} ({key} is "
                f"{tuple(shape)} there, {tuple(ours.shape)} here); pass the --arch they are of"
            )


# Where a file keeps its model's weights: our checkpoints' and timm's "model", Lightning's and
# timm's "state_dict", timm's EMA weights alone "state_dict_ema"; else the file is the state dict.
WEIGHTS_KEYS = ("model", "state_dict", "state_dict_ema")
# What others put before the model's own keys: DDP's "module." (timm), a LightningModule's
# attribute "model.", torch.compile's "_orig_mod.".
KEY_PREFIXES = ("module.", "model.", "_orig_mod.")


def read_weights(path):
    """A file of weights, loaded as plain data only; timm's checkpoints hold its flags as an
    argparse.Namespace, which is plain data too."""
    with torch.serialization.safe_globals([argparse.Namespace]):
        return torch.load(path, map_location="cpu", weights_only=True)


def check_whole(path, flag):
    """``path`` (a file ``flag`` names: --resume, --weights) refused in one line where it is not
    what was written: torch.load reads torch.save's zip without checking its CRC-32s, so a damaged
    file would load as other weights, without a word. A file in torch's older format, no zip, is
    left to torch.load."""
    with open(path, "rb") as f:
        if f.read(4) != b"PK\x03\x04":  # a zip's first bytes
            return
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()  # reads every member, checking its CRC-32
        why = bad and f"its member {bad} fails its CRC-32 check"
    except OSError:
        raise
    except Exception as e:  # no zip's directory at its end: cut short, or overwritten
        why = f"cut short or overwritten: {str(e).strip() or type(e).__name__}"
    if why:
        other = "checkpoint.pth" if os.path.basename(path) == "best.pth" else "best.pth"
        raise UsageError(
            f"{flag} {path}: damaged ({why}), not the bytes that were written; pass a whole copy, "
            f"or its run's {other} (another point of the run: resume from it, or --weights it)"
        )


def weights_refusal(flag, name, error, expected="MobileNet_V3_Large_Weights.IMAGENET1K_V1"):
    """The line for ``flag``'s torchvision weights ``name`` that did not load: a download that
    failed (``error``, an OSError: no network) says where torch's cache looks for the file; any
    other ``error`` says the name is another model's weights, or none of torchvision's, and names
    the ``expected`` kind."""
    why = (str(error).strip() or type(error).__name__).splitlines()[-1][:200]
    if not isinstance(error, OSError):
        try:
            torchvision.models.get_weight(name)
            what = "torchvision's weights of another model"
        except (ValueError, KeyError, AttributeError):
            what = "not a torchvision weights name it could load"
        return UsageError(f"{flag} {name}: {what} ({why}); expected one such as {expected}")
    url = torchvision.models.get_weight(name).url
    file = os.path.basename(urllib.parse.urlparse(url).path)
    cached = os.path.join(torch.hub.get_dir(), "checkpoints", file)  # where torch.hub looks first
    instead = f"pass its path to {flag}" if flag == "--weights" else f"leave {flag} out"
    return UsageError(
        f"{flag} {name}: its download failed ({why}), as it does without a network; copy {url} "
        f"to {cached}, where torch looks before downloading, or {instead}"
    )


def fits_in(own, key, value):
    return key in own and getattr(value, "shape", None) == own[key].shape


def named_as(state, own):
    """``state``, a file's weights, named as ``own``, the model's state dict, names them: as they
    are, a known prefix taken off, or (torchvision's keys for a model inside a wrapper) "model."
    put on; whichever way the most tensors fit."""
    if not isinstance(state, dict):
        return {}
    state = next((state[k] for k in WEIGHTS_KEYS if isinstance(state.get(k), dict)), state)
    ways = [state, {f"model.{k}": v for k, v in state.items()}]
    ways += [{k.removeprefix(p): v for k, v in state.items()} for p in KEY_PREFIXES]
    return max(ways, key=lambda way: sum(fits_in(own, k, v) for k, v in way.items()))


# ------------------------------------------------------------------------------------------
# run folder and log
# ------------------------------------------------------------------------------------------

# Run folders this process made and has not trained in yet: a start that fails removes them.
_unstarted = []


class RunLog:
    """A run's log: ``log(record)`` prints the record as a line (render; ``line``, a note's own
    words, instead) and appends it, with its "time" (seconds since the Unix epoch), to the run
    folder's metrics.jsonl, and with --tensorboard its numbers to TensorBoard. Only the main process
    writes. ``dir`` is the run folder, or None. Until ``begin`` the records wait in memory and the
    folder stays as it was: a start that a later check refuses (a resume with another batch size,
    say) loses nothing there."""

    def __init__(self, run_dir, world, tensorboard, keep=None, continuing=False, previous=False):
        self.dir, self.main, self.started = run_dir, world.main, time.time()
        self.world = world
        # the package is looked for now, with the other checks; its writer makes files, so later
        self.summary_writer = summary_writer() if tensorboard and run_dir else None
        self.writer, self.keep, self.held = None, keep, []
        self.continuing = continuing  # the folder is the run's that --resume continues
        self.previous = previous  # the folder was there before this run (previous_run_log)

    def __call__(self, record, line=None):
        if not self.main:
            return
        print(line or render(record), flush=True)
        record = {**record, "time": time.time()}
        if self.held is None:
            self.write(record)
        else:
            self.held.append(record)

    def begin(self):
        """Every check that can refuse the run has passed: from here the run folder changes, and
        the records logged so far are written."""
        held, self.held = self.held, None
        if not self.dir or not self.main:
            return
        if self.previous:
            self.tidy()
        if self.summary_writer:
            self.writer = self.summary_writer(self.dir, flush_secs=10)
        for record in held:
            self.write(record)

    def tidy(self):
        """A folder that was there before: metrics.jsonl keeps only the records ``keep`` accepts
        (previous_run_log's, or at a resume resume.restore's), and what killed saves left goes."""
        metrics = os.path.join(self.dir, "metrics.jsonl")
        if self.keep and os.path.exists(metrics):
            trim_log(metrics, self.keep)
        for name in os.listdir(self.dir):  # the lock says no other run saves here
            if ".pth.tmp-" in name or name.endswith(".partial"):  # ".pth.tmp-": older versions'
                os.remove(os.path.join(self.dir, name))

    def write(self, record):
        if self.dir:  # a full disk: run_main's line; a resume drops the torn record
            path = os.path.join(self.dir, "metrics.jsonl")
            with naming(path), open(path, "a") as f:
                f.write(json.dumps(record) + "\n")
        if self.writer and "global_step" in record:
            self.write_scalars(record)

    def write_scalars(self, record):
        """--tensorboard: the record's numbers as scalars named type/name: train/loss,
        epoch/val_top1, ..."""
        for key, value in record.items():
            if isinstance(value, float) and key != "time":
                name, step = f"{record['type']}/{key}", record["global_step"]
                self.writer.add_scalar(name, value, step, record["time"])

    def training_started(self):
        """From here on a failure leaves the run folder in place: it holds what the run did."""
        if self.dir in _unstarted:
            _unstarted.remove(self.dir)

    def epoch_end(self, epoch, steps, train_loss, metrics, took):
        """The epoch's record and line: its validation ``metrics``, its train loss and time, and
        each process's peak memory (its line the largest, in GB). Every process calls it: under
        torchrun the memory is gathered."""
        memory = [peak_memory(self.world)]
        if self.world.distributed:
            memory = gathered(memory[0], self.world)
        record = {"type": "epoch", "epoch": epoch, "train_loss": train_loss, **metrics}
        record.update(epoch_time=took, step=steps, global_step=epoch * steps, memory=memory)
        if self.main:
            most = {
                k: f"{max(m[k] for m in memory) / 1e9:.1f} GB" for k in memory[0] if k != "rank"
            }
            self(record, render({**record, **most}))

    def close(self, best_name, best):
        """The run's last line: its best score, its time, where its checkpoints are."""
        took = datetime.timedelta(seconds=round(time.time() - self.started))
        record = {"type": "end", best_name: best}
        self(record, render({**record, "took": took, "output_dir": self.dir}))


def render(record):
    """A record as its console line: its type, then each field as `name value`, floats to 5
    significant digits; lists and dicts (the run's flags, per-class scores, each process's memory)
    only in metrics.jsonl."""
    fields = (
        f"{k} {v:.5g}" if isinstance(v, float) else f"{k} {v}"
        for k, v in record.items()
        if k != "type" and not isinstance(v, (list, dict))
    )
    return f"{record['type']}: " + "  ".join(fields)


def peak_memory(world):
    """This process's peak memory in bytes: the most host memory (RSS) it has held; on CUDA also
    the most torch has reserved, and what the device has in use by any process or library (DALI's
    too)."""
    kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # the peak RSS; Linux counts in kB
    mine = {"rank": world.rank, "host_rss_peak": kb * 1024}
    if world.device.type == "cuda":
        free, total = torch.cuda.mem_get_info(world.device)
        mine.update(
            gpu_reserved_peak=torch.cuda.max_memory_reserved(world.device), gpu_used=total - free
        )
    return mine


def gathered(mine, world):
    """Every process's ``mine``, in rank order, on the main process (None on the others)."""
    everyone = [None] * world.size if world.main else None
    dist.gather_object(mine, everyone, dst=0)
    return everyone


def open_run(args, world, runs_dir):
    """The run's log, in its folder: --output-dir, --resume's folder, or a new ``runs_dir``/expN,
    made and locked by the main process (none when only evaluating without --output-dir)."""
    if not world.main or (args.evaluate and not args.output_dir):
        return RunLog(None, world, args.tensorboard)
    resumed = os.path.dirname(os.path.abspath(args.resume)) if args.resume else None
    out = args.output_dir or resumed or new_run_dir(runs_dir)
    if not os.path.exists(out):
        _unstarted.append(out)
    lock_run_dir(out)
    if out in _unstarted:
        return RunLog(out, world, args.tensorboard)
    return previous_run_log(out, args, world)  # a folder that was there: what it holds decides


def new_run_dir(runs_dir):
    """A new folder ``runs_dir``/expN, N one above the highest there."""
    os.makedirs(runs_dir, exist_ok=True)
    taken = [int(d[3:]) for d in os.listdir(runs_dir) if d[:3] == "exp" and d[3:].isdigit()]
    n = 1 + max(taken, default=0)
    while True:  # mkdir is atomic: two runs starting at once get two folders
        with contextlib.suppress(FileExistsError):
            os.mkdir(os.path.join(runs_dir, f"exp{n}"))
            _unstarted.append(os.path.join(runs_dir, f"exp{n}"))
            return os.path.join(runs_dir, f"exp{n}")
        n += 1


def parsed_record(line):
    """A metrics.jsonl line as its record, or None for a line that is not one whole record."""
    try:
        record = json.loads(line)
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def summary_writer():
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise UsageError(
            "--tensorboard: needs the tensorboard package (pip install tensorboard)"
        ) from None
    return SummaryWriter


def lock_run_dir(out):
    """``out`` made and locked for this run: refused where another run writes to it. Nothing in
    the folder changes here but the lock."""
    if os.path.exists(out) and not os.path.isdir(out):
        raise UsageError(f"--output-dir {out}: is a file, not a folder")
    os.makedirs(out, exist_ok=True)  # a folder that cannot be made: run_main's line names it
    lock = os.open(os.path.join(out, ".lock"), os.O_WRONLY | os.O_CREAT, 0o644)
    try:  # held while the process lives: the OS releases it however the process ends
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise UsageError(
            f"--output-dir {out}: another run is writing to it ({os.path.join(out, '.lock')} is "
            f"locked); wait for it or pick another --output-dir"
        ) from None


def previous_run_log(out, args, world):
    """The log of a run in a folder that was there before. Refused, without --overwrite: one
    holding another run's checkpoint (not the one --resume continues), or whose metrics.jsonl is a
    folder. A new run's log keeps only the --evaluate scores written there (--overwrite drops
    them); a resumed run's keeps what resume.restore says. Nothing in the folder changes here."""
    continuing = bool(args.resume) and (
        os.path.dirname(os.path.abspath(args.resume)) == os.path.abspath(out)
    )
    previous = [f for f in ("checkpoint.pth", "best.pth") if os.path.exists(os.path.join(out, f))]
    if previous and not args.evaluate and not continuing and not args.overwrite:
        raise UsageError(
            f"--output-dir {out}: holds a previous run's {previous[0]}; pass --resume "
            f"{os.path.join(out, previous[0])} to continue it or --overwrite to replace it"
        )
    metrics = os.path.join(out, "metrics.jsonl")
    if os.path.isdir(metrics):
        raise UsageError(f"{metrics}: is a folder, not the run's log; move it away or delete it")
    new_log = os.path.exists(metrics) and not (args.evaluate or continuing)
    keep = (lambda r: r.get("type") == "eval" and not args.overwrite) if new_log else None
    return RunLog(out, world, args.tensorboard, keep, continuing and not args.evaluate, True)


def trim_log(metrics, keep):
    """metrics.jsonl with only the records ``keep`` accepts, each line as it was. A record torn by
    a kill while it was being appended (or an empty line, or one that is not a record) goes too:
    no resume should trip on it. A byte that is not UTF-8 is read as U+FFFD and written back as it
    was. A symbolic link stays one: the file it points to is rewritten."""
    with open(metrics, "rb") as f:
        lines = f.read().splitlines()
    kept = []
    for line in lines:
        record = parsed_record(line.decode("utf-8", errors="replace"))
        if record and keep(record):
            kept.append(line + b"\n")
    path = os.path.realpath(metrics) if os.path.islink(metrics) else metrics  # a link stays one
    with naming(metrics), atomic_open(path, "wb") as f:  # a full disk: run_main's line
        f.writelines(kept)


# ------------------------------------------------------------------------------------------
# checkpoints
# ------------------------------------------------------------------------------------------


@dataclass
class RunData:
    """What a run reads, as its trainer built it: the pipelines and DALI iterators of this
    process's shards, and what the checkpoints record of the data (resume.restore checks it)."""

    train_pipe: Any
    val_pipe: Any
    train_loader: Any  # DALI's iterator over train_pipe; its checkpoints() are the pipeline's state
    val_loader: Any  # every validation sample of the shard once
    steps: int  # training steps an epoch, the same on every process
    classes: list  # class names, in label order
    num_samples: int  # training samples, all shards
    digest: str = None  # data_sources.data_digest of the training files: names and sizes
    watched: list = ()  # data_sources.watch's (root, files, stamps): checked every epoch
    first_epoch: int = 1  # the epoch the training pipeline started with (resume.pipeline_state)
    rest: Any = None  # resume.RestOfEpoch: a checkpoint's epoch on another number of processes

    def train_source(self):
        """The training iterator of the epoch at hand: the rest of a checkpoint's epoch of another
        number of processes while it lasts, else this run's own."""
        if self.rest is not None and self.rest.pending:
            return self.rest
        return self.train_loader


@dataclass
class Start:
    """Where the loop starts: a new run's first step, or a checkpoint's (resume.restore)."""

    epoch: int = 1
    step: int = 0  # steps of ``epoch`` already trained
    best: float = -math.inf  # the best validation score so far
    loss_sum: float = 0.0  # this process's loss summed over those steps


class Checkpoints:
    """checkpoint.pth (every epoch, every --checkpoint-every steps, at a stop signal) and best.pth
    of a run: ``state``'s state dicts, the position, the arguments, the classes, the training
    files' digest, and every process's DALI, random and loss state, for an exact resume. ``extra``
    goes in as it is."""

    def __init__(self, run, state, data, args, world, best=-math.inf, **extra):
        self.run, self.state, self.data, self.args, self.world = run, state, data, args, world
        self.best, self.extra = best, extra
        self.compiled = 0  # graphs compiled when compile-cache.bin was last written

    def save(self, epoch, step, loss_sum=0.0, score=None):
        """Saves; ``score``, the epoch's validation score, also makes best.pth when it is the best
        so far. Every process calls it; the main one writes and returns the checkpoint's path.
        Within the rest of an epoch of another number of processes, the checkpoint is of that
        shape (see resume.RestOfEpoch)."""
        loader = self.data.train_source()
        mine = (loader.checkpoints()[0], torch.get_rng_state(), loss_sum)
        states = [mine]
        if dist.is_initialized():
            states = [None] * self.world.size if self.world.main else None
            dist.gather_object(mine, states, dst=0)
        is_best = score is not None and score > self.best
        self.best = max(self.best, score) if score is not None else self.best
        if not self.world.main:
            return None
        ckpt = self.contents(epoch, step, states)
        ckpt["validated"] = score is not None  # a stop in validation saves none (resume.position)
        if loader is not self.data.train_loader:
            ckpt.update(loader.as_saved(ckpt, states))
        for name in ("checkpoint.pth", "best.pth") if is_best else ("checkpoint.pth",):
            write_checkpoint(ckpt, os.path.join(self.run.dir, name))
        if self.args.compile:
            self.compiled = save_compile_cache(self.run.dir, self.compiled)
        if step < self.data.steps:  # the epoch's end says so in its own line
            self.log_saved(epoch, step, ckpt["global_step"])
        return os.path.join(self.run.dir, "checkpoint.pth")

    def log_saved(self, epoch, step, global_step):
        """The line of a checkpoint within an epoch (--checkpoint-every, a stop signal)."""
        self.run({"type": "checkpoint", "epoch": epoch, "step": step, "global_step": global_step})

    def contents(self, epoch, step, states):
        dali, rng, loss_sums = (list(s) for s in zip(*states))
        ckpt = {
            name: obj.state_dict() if obj is not None else None for name, obj in self.state.items()
        }
        weights = [v for v in ckpt["model"].values() if v.is_floating_point()]
        check_finite(all(torch.isfinite(v).all() for v in weights), epoch, step, "weights")
        ckpt.update(
            epoch=epoch,
            step=step,
            global_step=(epoch - 1) * self.data.steps + step,
            loss_sum=loss_sums,
            args=vars(self.args),
            best=self.best,
            classes=self.data.classes,
            rng=rng,
            num_samples=self.data.num_samples,
            data_digest=self.data.digest,
            world_size=self.world.size,
            steps=self.data.steps,
            first_epoch=self.data.first_epoch,
            dali=dali if self.args.loader == "dali" else None,
            **self.extra,
        )
        return ckpt


# Flags the processes of one run may set each their own: where a node finds the data and the run
# folder, its threads, its logging.
PER_NODE = ("data", "output_dir", "resume", "workers", "given", "dist_url", "print_freq", "demo")


def check_one_run(args, world, data):
    """Under torchrun every process trains one run: the same flags (PER_NODE's aside) on the same
    data. A node started otherwise (another -b, another --data set, other images under the same
    names) would hang the job at its first collective or train on other samples; one line names the
    first difference."""
    mine = {f"--{k.replace('_', '-')}": v for k, v in vars(args).items() if k not in PER_NODE}
    # the training files' names relative to --data and their sizes (data_sources.data_digest)
    mine.update(classes=data.classes, samples=data.num_samples, files=data.digest)
    everyone = [None] * world.size
    dist.all_gather_object(everyone, mine)
    for rank, theirs in enumerate(everyone):
        if differ := next((k for k in mine if theirs.get(k) != everyone[0].get(k)), None):
            raise UsageError(
                f"process {rank} was started with another {differ} than process 0 "
                f"({theirs.get(differ)!r}, not {everyone[0].get(differ)!r}); start every node "
                f"with the same command and data"
            )


def pipeline_seed(args, world, first_epoch=1):
    """The seed of this process's DALI pipelines: --seed plus its rank. A training pipeline that
    starts with a later epoch (another number of processes took up the run, see
    resume.pipeline_state) takes one of its own: the seed's would replay the first epoch's order."""
    return args.seed + world.rank + (first_epoch - 1) * world.size


def write_checkpoint(ckpt, path):
    """Written whole or not at all (atomic_open): the previous file stays if saving fails or is
    killed, and a full disk ends the run in run_main's line naming ``path``."""
    with naming(path), atomic_open(path) as f:
        try:
            torch.save(ckpt, f)
        except RuntimeError:  # torch's zip writer words a write cut short on a full disk its way
            if shutil.disk_usage(os.path.dirname(path) or ".").free < FULL_BELOW:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path) from None
            raise


# torch.compile's work, kept with the checkpoint: the compiled graphs and their kernels
# (torch.compiler's cache artifacts), behind a SHA-256 of them.
COMPILE_CACHE = "compile-cache.bin"


def save_compile_cache(run_dir, saved):
    """What this process compiled, beside its checkpoint: a resume on a node whose own cache (a
    local temp folder) is empty, a requeue elsewhere on a cluster, loads it
    (resume.load_compile_cache) instead of compiling again. Written only where more graphs were
    compiled (or found in a cache) than the ``saved`` when it was last written; returns their
    number."""
    counts = torch._dynamo.utils.counters["inductor"]
    graphs = counts["fxgraph_cache_miss"] + counts["fxgraph_cache_hit"]
    if graphs == saved:  # the same artifacts: their tens of MB not written again
        return saved
    artifacts = torch.compiler.save_cache_artifacts()  # all of this process's, or None
    if artifacts is not None:
        path = os.path.join(run_dir, COMPILE_CACHE)
        with naming(path), atomic_open(path) as f:
            f.write(hashlib.sha256(artifacts[0]).digest() + artifacts[0])
    return graphs


# Free bytes under which a failed checkpoint write is said to be the full disk's.
FULL_BELOW = 64 * 2**20


@contextlib.contextmanager
def naming(path):
    """An OSError within names ``path`` where the OS named no file (a failed write names none), so
    that run_main's line says which file the run could not write."""
    try:
        yield
    except OSError as e:
        e.filename = e.filename or path
        raise


class RunComplete(Exception):
    """The run to resume has trained every epoch: nothing is left to do (a requeue after its
    end)."""


# ------------------------------------------------------------------------------------------
# the loop's bookkeeping
# ------------------------------------------------------------------------------------------


class DataWait:
    """Seconds the loop waited for its batches. On the CPU, the time blocked in next(). On a GPU,
    where the CPU runs ahead, two CUDA events per step time the gap between one step's end and the
    next one's start; they are read at the logging sync point."""

    def __init__(self, device):
        self.cuda, self.step_end, self.cpu, self.gaps = device.type == "cuda", None, 0.0, []
        self.fetch_start = time.perf_counter()

    def batch_arrived(self):
        if not self.cuda:
            self.cpu += time.perf_counter() - self.fetch_start
        elif self.step_end is not None:
            start = torch.cuda.Event(enable_timing=True)
            start.record()
            self.gaps.append((self.step_end, start))

    def step_done(self):
        if self.cuda:
            self.step_end = torch.cuda.Event(enable_timing=True)
            self.step_end.record()

    def fetching(self):
        self.fetch_start = time.perf_counter()

    def seconds(self):
        """The window's wait, since the last call; after a sync point, when its events have
        happened."""
        wait = sum(a.elapsed_time(b) for a, b in self.gaps) / 1000 if self.gaps else self.cpu
        self.cpu, self.gaps = 0.0, []
        return wait


class StepLog:
    """Everything the training loop does besides the step, so that the loop reads as the step:

        for step, (images, targets) in step_log.epoch(batches, epoch, first_step, loss_sum):
            ...  # forward, backward, optimizer step
            step_log.update(loss, len(targets))
        return step_log.epoch_loss()

    A line every --print-freq steps, and at least every LOG_EVERY seconds, gives the window's loss
    (all processes), lr, img/s, data wait and the ETA of the whole run; those lines are the only
    sync points. A non-finite loss ends the run there. Every --checkpoint-every steps, and at a stop
    signal, ``checkpoints`` saves the step; after a stop signal's save the process exits."""

    def __init__(self, args, world, log, checkpoints, stop, steps, optimizer):
        self.args, self.world, self.log = args, world, log
        self.checkpoints, self.stop = checkpoints, stop
        self.steps, self.optimizer = steps, optimizer
        self.clock, self.done = None, 0  # the first step's time and the steps since, for the ETA

    def epoch(self, batches, epoch, first_step=0, loss_sum=0.0, crop_size=None):
        """(step, batch) of steps ``first_step + 1 .. steps``; ``loss_sum``: this process's sum over
        the steps before ``first_step``; ``crop_size``: the epoch's training crop, shown in its
        lines where it changes from epoch to epoch (--progressive-resize)."""
        device = self.world.device
        self.epoch_no, self.crop_size = epoch, crop_size
        self.loss_sum = torch.full((), loss_sum, device=device)
        self.first_bad = torch.zeros((), dtype=torch.long, device=device)
        self.new_window()
        self.wait = DataWait(device)
        for self.step, batch in enumerate(batches, first_step + 1):
            self.wait.batch_arrived()
            self.step_start = time.perf_counter()
            yield self.step, batch
            self.wait.step_done()
            self.after_step(self.step)
            self.wait.fetching()

    def update(self, loss, images):
        """The step's loss and batch size, kept on the device: no sync."""
        loss = loss.detach()
        self.loss_sum, self.window_loss = self.loss_sum + loss, self.window_loss + loss
        bad = (self.first_bad == 0) & ~torch.isfinite(loss)
        self.first_bad = torch.where(bad, self.step, self.first_bad)
        self.window_images, self.window_steps = self.window_images + images, self.window_steps + 1

    def after_step(self, step):
        if self.clock is None:
            self.first_step_done(step)
        self.done += 1
        overdue = time.perf_counter() - self.last_line >= LOG_EVERY
        # the same answer on every process: a stop signal, and whether a line is overdue
        signum, overdue = self.stop.agree(overdue) if self.stop else (0, overdue)
        if step % self.args.print_freq == 0 or step == self.steps or overdue:
            self.write_line(step)
        every = self.args.checkpoint_every
        if step < self.steps and (signum or every and step % every == 0):
            path = self.checkpoints.save(self.epoch_no, step, self.loss_sum.item())
            if signum:
                self.stop.exit(signum, path, self.epoch_no, step)

    def first_step_done(self, step):
        """The run's first step (a resumed one's too): the ETA counts from here, and from here a
        failure leaves the run folder in place."""
        if self.args.compile:
            self.log_compile(step)
        self.clock = time.perf_counter()
        self.log.training_started()

    def log_compile(self, step):
        """A compiled model compiles in its first step: its seconds are logged as a phase of their
        own and left out of the lines' img/s and ETA."""
        if self.world.device.type == "cuda":
            torch.cuda.synchronize(self.world.device)  # once: the step's kernels have run
        seconds = time.perf_counter() - self.step_start
        epoch, global_step = self.epoch_no, (self.epoch_no - 1) * self.steps + step
        self.log(
            {
                "type": "compile",
                "seconds": seconds,
                "mode": self.args.compile_mode,
                # graphs found compiled in torch's cache: a warm node's, or the run's own
                "cache_hits": torch._dynamo.utils.counters["inductor"]["fxgraph_cache_hit"],
                "epoch": epoch,
                "step": step,
                "global_step": global_step,
            }
        )
        # the window's rate starts after it; its loss keeps the step
        self.window_start, self.window_images = time.perf_counter(), 0
        self.wait.seconds()

    def stoppable(self, batches):
        """Validation's ``batches``, ended by a stop signal as training's steps are: a full pass can
        outlast a cluster's grace period before SIGKILL. The epoch's training is saved (its last
        step's checkpoint: a resume goes on with the next epoch) and the process exits."""
        for batch in batches:
            yield batch
            signum = self.stop.agree()[0] if self.stop else 0
            if signum:
                path = self.checkpoints.save(self.epoch_no, self.steps, self.loss_sum.item())
                self.stop.exit(signum, path, self.epoch_no, self.steps, " in validation")

    def write_line(self, step):
        # a sync point: the window's CUDA events have happened
        totals = [self.window_loss.item(), self.window_images, self.wait.seconds()]
        loss_total, images_total, wait_total = all_reduce_sum(totals, self.world.device)
        check_finite(math.isfinite(loss_total), self.epoch_no, int(self.first_bad) or step, "loss")
        now = time.perf_counter()
        elapsed, size = now - self.window_start, self.world.size
        epoch, steps = self.epoch_no, self.steps
        record = {
            "type": "train",
            "epoch": epoch,
            "step": step,
            "steps": steps,
            "global_step": (epoch - 1) * steps + step,
            "loss": loss_total / (self.window_steps * size),
            "lr": self.optimizer.param_groups[0]["lr"],
            "img_s": images_total / elapsed if images_total else None,  # None: the compile alone
            "data_wait": 100 * wait_total / (elapsed * size),
        }
        if self.crop_size is not None:
            record["train_crop_size"] = self.crop_size
        left = (steps - step) + (self.args.epochs - epoch) * steps  # the whole run's steps to go
        eta = datetime.timedelta(seconds=round((now - self.clock) / max(1, self.done - 1) * left))
        self.log(record, f"{render(record)}  eta {eta}")
        self.new_window()

    def new_window(self):
        """The next log line's window: its loss (on the device), images, steps, start."""
        self.window_loss = torch.zeros((), device=self.world.device)
        self.window_images, self.window_steps = 0, 0
        self.window_start = self.last_line = time.perf_counter()

    def epoch_loss(self):
        """The epoch's mean loss over all processes and steps (a sync point)."""
        (loss_total,) = all_reduce_sum([self.loss_sum.item()], self.world.device)
        check_finite(
            math.isfinite(loss_total), self.epoch_no, int(self.first_bad) or self.steps, "loss"
        )
        return loss_total / (self.steps * self.world.size)


# ------------------------------------------------------------------------------------------
# stopping and exiting
# ------------------------------------------------------------------------------------------


# Seconds the workers of a stopped job wait for every one of them to have the stop signal, and
# between their looks: one their launchers passed on reaches all within it (StopSignals.tell_agent).
SIGNAL_SPREAD, SIGNAL_POLL = 10.0, 0.5
# SIGTERM (SLURM's and Kubernetes' preemption), SIGINT (Ctrl-C), SIGUSR1 (SLURM's warning), and
# SIGHUP (a closed terminal) and SIGUSR2 (a scheduler's or a user's), which launch.py passes on too.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGHUP, signal.SIGUSR2)


class StopSignals:
    """The STOP_SIGNALS stop the run at the next step; a second Ctrl-C at once. ``agree``, called
    by every process at the same points, gives them all the largest signal any caught, over a gloo
    (CPU) group, sent at one step and read at the next: no step waits for it."""

    def __init__(self, world):
        self.signum, self.pending = 0, None
        self.group = dist.new_group(backend="gloo") if world.distributed else None
        for signum in STOP_SIGNALS:
            signal.signal(signum, self.catch)

    def catch(self, signum, frame):
        if signum == self.signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.signum = self.signum or signum

    def agree(self, due=False):
        """(the signal to stop for, or 0; whether a log line is ``due`` on any process), the same
        answer on every process."""
        if self.group is None:
            return self.signum, due
        return self.agree_across(due)

    def agree_across(self, due):
        """agree under torchrun: this step sends this process's signal and due line, and reads
        what every process sent at the step before."""
        agreed = self.pending[1].tolist() if self.pending and self.pending[0].wait() else [0, 0]
        flags = torch.tensor([self.signum, int(due)])
        self.pending = (
            dist.all_reduce(flags, dist.ReduceOp.MAX, group=self.group, async_op=True),
            flags,
        )
        return agreed[0], bool(agreed[1])

    def exit(self, signum, path, epoch, step, where=""):
        """After the stop's checkpoint: one line, torchrun's agent told (tell_agent), and the exit
        status of the signal's end."""
        if path:  # the main process's
            print(
                f"stopped by {signal.Signals(signum).name} at epoch {epoch} step {step}{where}: "
                f"saved {path}; to continue, run the same command with --resume {path}",
                file=sys.stderr,
                flush=True,
            )
        if self.group is not None and "TORCHELASTIC_RUN_ID" in os.environ:
            self.tell_agent(signum)
        sys.exit(128 + signum)

    def tell_agent(self, signum):
        """A stop signal sent to some workers only (``kill`` of one pid) reads to their torchrun
        agents as failed workers, which --max-restarts restarts: the stop undone. So where a
        worker of the job still lacks the signal after SIGNAL_SPREAD seconds, each agent is told
        by its first worker, and stops the job as at a signal of its own: launch.py exits 128 +
        the signal, plain torchrun 1. A signal that every worker has is the job's: its launchers
        passed it on, or its agents restart every worker (a node joining an elastic job), and no
        agent is told again."""
        for other in STOP_SIGNALS:  # the stop is saved: a later signal is only counted
            signal.signal(other, lambda signum, frame: setattr(self, "signum", signum))
        everyone = torch.tensor([0])
        for _ in range(int(SIGNAL_SPREAD / SIGNAL_POLL) + 1):  # as many rounds on every worker
            everyone = torch.tensor([int(self.signum != 0)])
            dist.all_reduce(everyone, dist.ReduceOp.MIN, group=self.group)
            if everyone.item():
                break
            time.sleep(SIGNAL_POLL)
        if not everyone.item() and os.environ["LOCAL_RANK"] == "0":
            # the agent handles the signals listed here (its --signals-to-handle); any other
            # would end it at once, leaving its workers unwatched
            handled = os.environ.get("TORCHELASTIC_SIGNALS_TO_HANDLE", "SIGTERM").split(",")
            name = signal.Signals(signum).name
            os.kill(os.getppid(), signum if name in map(str.strip, handled) else signal.SIGTERM)
        # no worker ends before its agent is told: an ended worker is one to restart
        dist.barrier(group=self.group)


def run_main(main, args):
    """``main(args)``, ended as a training script ends: a run already complete as one line and
    exit status 0, a ``UsageError``, ``DataError`` or ``OSError`` naming a file as one ``error:``
    line and exit status 2, Ctrl-C as one line and 130, anything else as its traceback and 1; a run
    folder of a start that failed before training removed; the process group destroyed."""
    try:
        main(args)
    except RunComplete as e:  # every process finds it so: no collective is waiting
        if not dist.is_initialized() or dist.get_rank() == 0:
            print(e, flush=True)
    except (Exception, KeyboardInterrupt) as e:
        end_failed_run(e)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def end_failed_run(e):
    """run_main's end of a run that raised ``e``, within its ``except`` block."""
    for folder in _unstarted:
        shutil.rmtree(folder, ignore_errors=True)
    if isinstance(e, (UsageError, DataError)):
        status, text = 2, f"error: {e}"
    elif isinstance(e, OSError) and e.filename:  # a file the run could not write or make
        status = 2  # checkpoints and logs are written whole (atomic_open) or appended: none is lost
        text = (
            f"error: {e.filename}: {e.strerror}; free space (or fix permissions) and run the same "
            f"command again (with --resume where the run has saved a checkpoint.pth)"
        )
    elif isinstance(e, KeyboardInterrupt):
        status, text = 130, "interrupted: nothing saved since the last checkpoint"
    else:
        status, text = 1, traceback.format_exc()
    alone = not (dist.is_initialized() and dist.get_world_size() > 1)
    if status == 1 and alone:
        raise  # the exception being handled, with its traceback as it was
    sys.stderr.write(text + "\n")  # one write: torchrun's processes' lines do not mix
    sys.stderr.flush()
    sys.stdout.flush()
    # Other processes may wait for this one in a collective, where NCCL's graceful
    # destroy_process_group() would wait forever: end at once, and torchrun stops the others.
    if not alone:
        os._exit(status)
    sys.exit(status)
