"""The flags both trainers take, the argparse types that check their values, and the files a
flag needs beside the trainer (require).

Only the standard library is imported here: the trainers read their flags before torch and DALI
load, so that ``--help`` and a bad flag answer at once. Each trainer adds its own flags (data,
model, loss) and its defaults (``parser.set_defaults``) around these. One setting is made here
because torch reads it as it loads: OpenMP's wait policy (below).
"""

import argparse
import difflib
import importlib.util
import math
import os
import sys

# On the CPU, torch keeps its own threads, a core each, beside DALI's (training.cpu_threads). An
# idle OpenMP thread then sleeps instead of spinning: it gives its core back at once to DALI's
# threads and to other work on the machine, which spinning threads held on a loaded machine.
# OpenMP reads this once, as torch loads: the trainers import this module first.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def number(kind, allowed, ok):
    """An argparse type: a ``kind`` value for which ``ok(value)`` holds, else 'must be
    <allowed>'."""

    def parse(text):
        value = kind(text)  # a ValueError is argparse's "invalid int value: 'x'"
        if not (math.isfinite(value) and ok(value)):
            raise argparse.ArgumentTypeError(f"must be {allowed}, got {text}")
        return value

    parse.__name__ = kind.__name__
    return parse


at_least_1 = number(int, "at least 1", lambda v: v >= 1)
# The largest image side a size flag takes: larger ones would only fail to allocate their batches.
MAX_SIDE = 8192
side = number(int, f"in [1, {MAX_SIDE}]", lambda v: 1 <= v <= MAX_SIDE)
at_least_0 = number(int, "at least 0", lambda v: v >= 0)
positive = number(float, "> 0", lambda v: v > 0)
non_negative = number(float, ">= 0", lambda v: v >= 0)
probability = number(float, "in [0, 1]", lambda v: 0 <= v <= 1)
below_one = number(float, "in [0, 1)", lambda v: 0 <= v < 1)


def cache_mode(text):
    """--decoder-cache: auto, on, off, or the MB of GPU memory it may take (a cache of that size
    holds the images that fit)."""
    if text in ("auto", "on", "off"):
        return text
    try:
        return at_least_1(text)
    except (ValueError, argparse.ArgumentTypeError):
        raise argparse.ArgumentTypeError(
            f"expected auto, on, off or a number of MB (at least 1), got {text!r}"
        ) from None


# torchvision's --lr-scheduler names, in any case as torchvision takes them: each is our schedule of
# the same lr at the start of every epoch.
SCHEDULER_ALIASES = {
    "steplr": "step",
    "cosineannealinglr": "cosine",
    "exponentiallr": "exponential",
}


def scheduler_name(text):
    return SCHEDULER_ALIASES.get(text.lower(), text.lower())


class Parser(argparse.ArgumentParser):
    """argparse's parser, whose refusal is one `error:` line, exit status 2, as every usage error
    is; a flag it does not know is answered with what FOREIGN says of it, else our closest flag.
    Its --help ends with the trainer's defaults that differ from the anchors' (ANCHOR_DEFAULTS)."""

    def parse_known_args(self, args=None, namespace=None):
        self.argv = sys.argv[1:] if args is None else list(args)  # what error() looks at
        return super().parse_known_args(self.argv, namespace)

    def error(self, message):
        self.exit(2, f"error: {unknown_flag(self, self.argv) or message}\n")

    def format_help(self):
        differ = []
        for _, ours, *theirs in self.anchor_defaults:
            named = [f"{ANCHORS[k]}: {flag}" for k, flag in enumerate(theirs) if flag]
            differ.append(f"{ours} ({'; '.join(named)})")
        self.epilog = (
            "Defaults that differ from the anchors', each with the flag that does as the anchor "
            f"does: {', '.join(differ)}."
        )
        return super().format_help()


def new_parser(description, anchor_defaults):
    parser = Parser(
        description=description,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        allow_abbrev=False,  # no flag is taken from a prefix: a typo is an error, not another flag
    )
    parser.anchor_defaults = anchor_defaults  # the trainer's ANCHOR_DEFAULTS: its --help's end
    parser.add_argument(
        "data_dir", nargs="?", metavar="DIR", help="--data, as DALI's and pytorch/examples' give it"
    )
    return parser


# Flags of the projects a command is often brought from (torchvision's references, timm's train.py,
# DALI's ResNet-50 example, pytorch/examples' imagenet main.py) that name no feature here, or one
# under another shape: what to write. NOT_HERE answers the rest of their flags, by kind.
FOREIGN = {
    "--drop-path": "timm's stochastic depth: not here (torchvision's models set their own); "
    "leave it out",
    "--drop": "timm's dropout rate: not here (torchvision's models set their own); leave it out",
    "--pretrained": "timm's and DALI's example's: here --weights NAME, a torchvision weights name "
    "such as ResNet50_Weights.IMAGENET1K_V2",
    "--torchcompile": "timm's: here --compile (the default on a GPU) and --compile-mode",
    "--torchcompile-mode": "timm's: here --compile-mode",
    "--input-size": "timm's C H W: here --crop-size SIZE (3 channels)",
    "--crop-pct": "timm's: here --val-resize-size, the crop's size / crop-pct",
    "--interpolation": "not here: resizes are bilinear (antialiased), as torchvision's reference's",
    "--train-interpolation": "timm's: not here; resizes are bilinear (antialiased), as "
    "torchvision's reference's",
    "--mixup-prob": "timm's: here every batch is mixed (--mixup-alpha, --cutmix-alpha)",
    "--mixup-switch-prob": "timm's: here mixup and cutmix take half of the batches each",
    "--color-jitter": "not here: the augmentations are --auto-augment's and --random-erase",
    "--remode": "timm's random-erase fill: not here; --random-erase fills the box with 0 after "
    "normalization (timm's const, torchvision's); leave it out",
    "--recount": "timm's random-erase count: not here; --random-erase erases one box; leave it out",
    "--resplit": "timm's, for --aug-splits: not here; leave it out",
    "--aug-splits": "timm's augmentation splits (AugMix): not here; leave it out",
    "--jsd-loss": "timm's, for --aug-splits: not here; the loss is cross-entropy; leave it out",
    "--jsd": "timm's, for --aug-splits: not here; the loss is cross-entropy; leave it out",
    "--split-bn": "timm's, for --aug-splits: not here; leave it out",
    "--aug-repeats": "timm's repeated augmentation: here --ra-sampler --ra-reps N",
    "--dist-bn": "timm's: here --sync-bn",
    "--dr": "timm's --decay-rate: here --lr-gamma (or --decay-rate)",
    "--tta": "timm's test-time augmentation: not here (train_segment.py --predict has --tta)",
    "--experiment": "timm's: here --output-dir",
    "--checkpoint-hist": "not here: a run keeps checkpoint.pth and best.pth",
    "--recovery-interval": "timm's: here --checkpoint-every N (steps)",
    "--initial-checkpoint": "timm's: here --weights FILE",
    "--pretrained-path": "timm's: here --weights FILE",
    "--no-resume-opt": "timm's: here --weights CHECKPOINT starts anew from its weights alone",
    "-vb": "timm's validation batch: here -b serves training and validation",
    "--validation-batch-size": "timm's: here -b serves training and validation",
    "--amp-dtype": "timm's: here --amp bf16 or --amp fp16",
    "--amp-impl": "timm's: here --amp is torch's autocast",
    "--bias-weight-decay": "torchvision's: here --norm-weight-decay sets the decay of norm layers "
    "and biases together",
    "--start-epoch": "torchvision's: here a --resume checkpoint knows its epoch and step",
    "--dataset": "torchvision's and timm's dataset name: here --data DIR names the data, laid out "
    "as README.md's Your data says; leave it out",
    "-d": "timm's --dataset: here --data DIR names the data; leave it out",
    "--fp16-mode": "DALI's example's: here --amp fp16 (with torch's dynamic loss scaling)",
    "--static-loss-scale": "DALI's example's: here --amp fp16 scales the loss dynamically",
    "--loss-scale": "DALI's example's: here --amp fp16 scales the loss dynamically",
    "--dynamic-loss-scale": "DALI's example's: here --amp fp16 scales the loss dynamically",
    "--opt-level": "DALI's example's apex level: here --amp bf16 or --amp fp16",
    "--apex": "torchvision's: here --amp bf16 or --amp fp16",
    "--sync_bn": "DALI's example's: here --sync-bn",
    "--prof": "DALI's example's: not here; bench.py measures the loaders",
    "--disable_dali": "DALI's example's: here every run reads with DALI (--loader synthetic "
    "for the model's own rate)",
    "--data_loader": "DALI's example's: here every run reads with DALI (--loader synthetic "
    "for the model's own rate)",
    "--dummy": "pytorch/examples' fake data: here --loader synthetic",
    "-t": "DALI's example's test mode: here --epochs 1 (--loader synthetic: no decoding)",
    "--test": "DALI's example's test mode: here --epochs 1 (--loader synthetic: no decoding)",
    "--no-accel": "pytorch/examples': here --device cpu",
    "--world-size": "torchvision's: here torchrun's --nproc_per_node and --nnodes",
    "--local-rank": "torchrun sets LOCAL_RANK for each process: leave it out",
    "--local_rank": "torchrun sets LOCAL_RANK for each process: leave it out",
}
NOT_HERE = {
    "its processes are torchrun's here (torchrun --nproc_per_node N train script); leave it out": (
        "--rank --gpu --dist-backend --multiprocessing-distributed --no-ddp-bb --synchronize-step"
    ),
    "a setting of its data loader: DALI reads --data here (README.md: Your data); leave it out": (
        "--train-split --val-split --train-num-samples --val-num-samples --dataset-download "
        "--class-map --input-img-mode --input-key --target-key --dataset-trust-remote-code "
        "--cache-dataset --backend --use-v2 --pin-mem --no-prefetcher --worker-seeding "
        "--use-multi-epochs-loader --mean --std"
    ),
    "a setting of the model: torchvision's models set their own here; leave it out": (
        "--drop-connect --drop-block --bn-momentum --bn-eps --gp --in-chans --model-kwargs "
        "--head-init-scale --head-init-bias --grad-checkpointing --fast-norm --fuser --torchscript "
        "--model-dtype --transformer-embedding-decay --keep-batchnorm-fp32"
    ),
    "an optimizer or schedule setting that is not here (--help: optimisation); leave it out": (
        "--opt-eps --opt-betas --opt-kwargs --clip-mode --layer-decay --layer-decay-min-scale "
        "--layer-decay-no-opt-scale --sched-on-updates --lr-noise --lr-noise-pct --lr-noise-std "
        "--lr-cycle-mul --lr-cycle-decay --lr-cycle-limit --lr-k-decay --epoch-repeats "
        "--decay-milestones --warmup-prefix --cooldown-epochs --patience-epochs "
        "--grad-accum-steps --apex-opt-level"
    ),
    "an augmentation or loss that is not here (--help: data); leave it out": (
        "--no-aug --train-crop-mode --scale --ratio --hflip --vflip --color-jitter-prob "
        "--grayscale-prob --gaussian-blur-prob --cutmix-minmax --mixup-mode --mixup-off-epoch "
        "--bce-loss --bce-sum --bce-target-thresh --bce-pos-weight --ra-magnitude "
        "--augmix-severity"
    ),
    "timm's EMA setting: here the EMA is torchvision's (--model-ema-steps, --model-ema-decay); "
    "leave it out": "--model-ema-force-cpu --model-ema-warmup",
    "a log or output of another tool: here the run folder holds metrics.jsonl (--tensorboard); "
    "leave it out": (
        "--save-images --eval-metric --log-wandb --wandb-project --wandb-tags --wandb-resume-id "
        "-c --config"
    ),
}


def unknown_flag(parser, argv):
    """The answer to the first flag of ``argv`` that ``parser`` does not know: what FOREIGN or
    NOT_HERE says of it, else the closest flag of ours; None where it knows them all. Asked only
    once argparse refuses the command line (an unknown flag's value may have been taken for the
    data folder)."""
    known = parser._option_string_actions
    for k, token in enumerate(argv):
        flag = token.split("=", 1)[0]
        if not flag.startswith("-") or flag in known or flag in ("-", "--") or is_number(flag):
            continue
        if not flag.startswith("--") and flag[:2] in known:  # a short flag with its value: -b32
            continue
        if flag[1:2].isdigit() and k and argv[k - 1] in known:  # a value such as -1,2
            return (
                f"{argv[k - 1]} {token}: a value that starts with '-' is read as a flag; write "
                f"{argv[k - 1]}={token}"
            )
        if flag in FOREIGN:
            return f"{flag}: {FOREIGN[flag]}"
        for answer, flags in NOT_HERE.items():
            if flag in flags.split():
                return f"{flag}: {answer}"
        close = difflib.get_close_matches(flag, list(known), n=1, cutoff=0.6)
        hint = f"did you mean {close[0]}?" if close else "see --help"
        return f"unrecognized argument {flag}: {hint}"
    return None


def is_number(text):
    try:
        float(text)
    except ValueError:
        return False
    return True


def demo_help(what, defaults):
    """--data's help: ``what``, and the defaults that --data demo changes."""
    changed = ", ".join(f"--{k.replace('_', '-')} {v}" for k, v in defaults.items())
    return f"{what}; or 'demo' for a built-in synthetic set (demo also sets: {changed})"


def add_loader_flags(group):
    group.add_argument(
        "-j", "--workers", type=at_least_1, default=min(8, os.cpu_count() or 1), help="DALI threads"
    )
    group.add_argument(
        "--dali-device",
        choices=["gpu", "cpu"],
        help="where DALI runs (default: gpu where the model is on CUDA)",
    )
    group.add_argument(
        "--dali_cpu",
        action="store_const",
        const="cpu",
        dest="dali_device",
        help="DALI's ResNet-50 example's name for --dali-device cpu",
    )
    group.add_argument(
        "--loader",
        choices=["dali", "synthetic"],
        default="dali",
        help="synthetic: train on one random batch already on the device (the speed ceiling; "
        "validation still reads --data)",
    )


def add_model_flags(group, weights_example):
    group.add_argument(
        "--weights",
        help=f"start from these weights: a torchvision weights name ({weights_example}) or a file "
        "(a state dict, a checkpoint of this script, Lightning's or timm's); tensors of another "
        "shape (a head for other classes) start anew",
    )
    group.add_argument(
        "--sync-bn",
        action="store_true",
        help="SyncBatchNorm across processes under torchrun (CUDA only)",
    )
    group.add_argument(
        "--model-ema",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="an EMA of the weights, validated and saved beside them; --evaluate scores a run's "
        "EMA where it kept one (--no-model-ema: its raw model)",
    )
    group.add_argument(
        "--model-ema-steps", type=at_least_1, default=32, help="steps between EMA updates"
    )
    group.add_argument(
        "--model-ema-decay",
        type=number(float, "in (0, 1)", lambda v: 0 < v < 1),
        default=0.99998,
        help="EMA decay for a 1024-image reference, as torchvision's (not timm's per-step decay)",
    )


def add_optimisation_flags(g):
    """The optimisation flags; ``--epochs``, ``-b``, ``--lr-scheduler`` and ``--lr-warmup-epochs``
    get their defaults from the trainer."""
    g.add_argument("--epochs", type=at_least_1, help="epochs to train")
    g.add_argument(
        "-b",
        "--batch-size",
        type=at_least_1,
        help="images per process (per GPU); as torchvision's references, 32 where the trainer "
        "sets none (train_classify.py: 256 on a GPU)",
    )
    g.add_argument("--opt", choices=["sgd", "adamw"], default="sgd", help="optimizer")
    g.add_argument(
        "--lr",
        "--learning-rate",
        type=positive,
        help="the learning rate itself, as torchvision's and timm's (DALI's example scales its "
        "--lr as --lr-base does); without it, --lr-base's",
    )
    g.add_argument(
        "--lr-base",
        type=positive,
        default=0.1,
        help="the learning rate per --lr-base-size images, scaled to the global batch as timm's "
        "(--lr-base-scale); used where --lr is not given (--lr wins, as in timm)",
    )
    g.add_argument(
        "--lr-base-size", type=at_least_1, default=256, help="the batch size --lr-base is for"
    )
    g.add_argument(
        "--lr-base-scale",
        choices=["linear", "sqrt"],
        help="lr = lr_base x (global batch / lr_base_size), or its square root (default: as timm's, "
        "sqrt for adamw, linear for sgd)",
    )
    g.add_argument("--momentum", type=below_one, default=0.9, help="SGD momentum")
    g.add_argument(
        "--wd", "--weight-decay", type=non_negative, default=1e-4, dest="wd", help="weight decay"
    )
    g.add_argument(
        "--norm-weight-decay",
        type=non_negative,
        help="weight decay of norm layers and biases (default: --wd)",
    )
    g.add_argument(
        "--clip-grad-norm",
        "--clip-grad",
        type=non_negative,
        default=0.0,
        help="clip the gradients' total norm (0: off)",
    )
    g.add_argument(
        "--lr-scheduler",
        "--sched",
        type=scheduler_name,
        choices=["cosine", "step", "poly", "exponential"],
        help="decay after warm-up, stepped every iteration (exponential: x --lr-gamma at each "
        "epoch's start, as torchvision's stepped per epoch); torchvision's names steplr, "
        "cosineannealinglr and exponentiallr are step, cosine and exponential; timm's --sched",
    )
    g.add_argument(
        "--lr-warmup-epochs",
        "--warmup-epochs",
        type=non_negative,
        help="warm-up epochs; the schedule starts after them, as torchvision's (timm's "
        "--warmup-epochs overlaps its schedule's first epochs)",
    )
    g.add_argument(
        "--lr-warmup-method", choices=["linear", "constant"], default="linear", help="warm-up shape"
    )
    g.add_argument(
        "--lr-warmup-decay",
        type=non_negative,
        default=0.01,
        help="warm-up starts at this share of the lr",
    )
    g.add_argument(
        "--warmup-lr",
        type=positive,
        help="timm's: the rate the warm-up starts at, in place of --lr-warmup-decay's share",
    )
    g.add_argument(
        "--lr-step-size",
        "--decay-epochs",
        type=at_least_1,
        default=30,
        help="step schedule: epochs between decays (timm's --decay-epochs)",
    )
    g.add_argument(
        "--lr-gamma",
        "--decay-rate",
        type=non_negative,
        default=0.1,
        help="step and exponential schedules: factor per decay",
    )
    g.add_argument(
        "--lr-min",
        "--min-lr",
        type=non_negative,
        default=0.0,
        help="cosine schedule: the final lr, a rate itself as --lr is (not scaled by the batch)",
    )
    g.add_argument(
        "--amp",
        nargs="?",
        const="default",
        choices=["bf16", "fp16", "none", "default"],
        default="none",
        help="mixed precision (autocast); bare --amp: torch's default for the device "
        "(fp16 CUDA, bf16 CPU)",
    )
    g.add_argument("--channels-last", action="store_true", help="channels_last memory format")
    g.add_argument(
        "--compile",
        action=argparse.BooleanOptionalAction,
        help="torch.compile the training model (default: on where the model is on CUDA; off on the "
        "CPU, so that CPU runs and the demo start at once)",
    )
    g.add_argument(
        "--compile-mode",
        choices=["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"],
        help="torch.compile's mode: reduce-overhead adds CUDA graphs, max-autotune searches "
        "kernels (and adds CUDA graphs) for a longer compile; a mode given compiles the model on "
        "the CPU too (default: default; on one GPU, reduce-overhead for the models in "
        "train_segment.py's LAUNCH_BOUND)",
    )
    g.add_argument(
        "--seed", type=int, default=0, help="seed of model init and of every random augmentation"
    )
    g.add_argument(
        "--device",
        choices=["cuda", "cpu"],
        help="where the model runs (default: cuda if available); cpu also puts DALI on the CPU",
    )
    g.add_argument(
        "--use-deterministic-algorithms",
        "--deterministic",
        action="store_true",
        help="torch's deterministic kernels only (an error where an op has none), cuDNN's "
        "benchmark off",
    )
    g.add_argument(
        "--dist-url",
        default="env://",
        help="torchvision's flag, taken for its default: processes always join through torchrun's "
        "env:// rendezvous",
    )


def add_output_flags(g, runs_dir):
    g.add_argument(
        "--output-dir",
        "--output",
        help=f"the run's folder (default: a new {runs_dir}/expN, or --resume's folder); with "
        "--predict, where the predictions go (required)",
    )
    g.add_argument(
        "--overwrite",
        action="store_true",
        help="replace a previous run's checkpoints in --output-dir, or --predict's outputs",
    )
    g.add_argument(
        "--resume",
        default="",
        help="checkpoint to continue from, at its exact step; 'auto' (with --output-dir): that "
        "folder's checkpoint, or a fresh start where it holds none, so that a requeued or "
        "restarted job continues with the command it was started with",
    )
    g.add_argument(
        "--checkpoint-every",
        type=at_least_0,
        default=0,
        help="also save every N steps (0: per epoch)",
    )
    g.add_argument(
        "--evaluate",
        "-e",
        "--test-only",
        action="store_true",
        help="only validate the --resume model (with --model-ema, its EMA)",
    )
    g.add_argument(
        "--predict",
        metavar="DIR",
        help="only predict: every PNG or JPEG under DIR, with the model of --resume CHECKPOINT "
        "(or --weights FILE), into --output-dir; no --data needed",
    )
    g.add_argument(
        "--print-freq",
        "-p",
        "--log-interval",
        type=at_least_1,
        default=50,
        help="log a line every N steps (and at least every 30 s)",
    )
    g.add_argument(
        "--tensorboard",
        action="store_true",
        help="also write the logged scalars for TensorBoard into the run folder "
        "(needs the tensorboard package)",
    )


# Flags that exclude each other: each pair with the value that clashes (None: any value given),
# and the line that refuses it, formatted with the flags' values.
EXCLUSIVE = (
    ({"data_dir": None, "data": None}, "{data_dir}: a data folder besides --data {data}; pass one"),
    (
        {"lr": None, "lr_base_size": None},
        "--lr-base-size {lr_base_size}: sets the batch of --lr-base; --lr {lr} is the learning "
        "rate itself, for any batch",
    ),
    (
        {"warmup_lr": None, "lr_warmup_decay": None},
        "--warmup-lr {warmup_lr}: sets where the warm-up starts, as --lr-warmup-decay "
        "{lr_warmup_decay} does; pass one of the two",
    ),
    (
        {"compile_mode": None, "compile": False},
        "--compile-mode {compile_mode}: sets how the model is compiled, and --no-compile turns "
        "compiling off; pass one of the two",
    ),
    (
        {"crop_size": None, "train_crop_size": None},
        "--crop-size {crop_size} sets --train-crop-size and --val-crop-size; --train-crop-size "
        "{train_crop_size} too: pass one of the two",
    ),
    (
        {"crop_size": None, "val_crop_size": None},
        "--crop-size {crop_size} sets --train-crop-size and --val-crop-size; --val-crop-size "
        "{val_crop_size} too: pass one of the two",
    ),
    (
        {"dali_device": "gpu", "device": "cpu"},
        "--dali-device gpu puts the batches on the GPU; --device cpu needs them on the CPU",
    ),
)
# Flags that act only beside another flag's value: each with that flag, the values that let it act
# (None: any but 0, off or unset) and why it has no effect without them. A fresh run given one
# without them says so in a line (note_defaults).
ACTS_WITH = {
    "warmup_lr": ("lr_warmup_epochs", None, "the run has no warm-up (--lr-warmup-epochs)"),
    "lr_warmup_method": ("lr_warmup_epochs", None, "the run has no warm-up (--lr-warmup-epochs)"),
    "lr_warmup_decay": ("lr_warmup_epochs", None, "the run has no warm-up (--lr-warmup-epochs)"),
    "lr_step_size": ("lr_scheduler", ("step",), "only --lr-scheduler step takes it"),
    "lr_gamma": (
        "lr_scheduler",
        ("step", "exponential"),
        "only --lr-scheduler step and exponential take it",
    ),
    "lr_min": ("lr_scheduler", ("cosine",), "only --lr-scheduler cosine takes it"),
    "model_ema_steps": ("model_ema", None, "only --model-ema takes it"),
    "model_ema_decay": ("model_ema", None, "only --model-ema takes it"),
    "momentum": ("opt", ("sgd",), "only --opt sgd takes it"),
    "lr_base": ("lr", (None,), "--lr is the rate itself and wins, as in timm"),
    "lr_base_scale": ("lr", (None,), "--lr is the rate itself and wins, as in timm"),
    "unet_width": ("arch", ("unet",), "only --arch unet takes it"),
    "tta": ("predict", None, "only --predict takes it"),
    "hw_decoder_load": ("decoder", ("mixed",), "only --decoder mixed takes it"),
}
# The anchors whose defaults a trainer's ANCHOR_DEFAULTS compares with ours, in its columns' order.
ANCHORS = ("torchvision's reference", "DALI's ResNet-50 example", "pytorch/examples' main.py")


def parse(parser, argv, demo_defaults):
    """The flags, with --data demo's defaults where it is given; ``args.given``: the flags the
    command line sets, each with the default it replaces (a resume takes the others from its
    checkpoint). A flag given two values under two names and EXCLUSIVE's pairs are refused here;
    the rules of --resume, --evaluate and --predict where those are handled (resume.load,
    predict.checkpoint_to_predict). The main process says what the command may not expect."""
    args = parser.parse_args(argv)
    demo = args.data == "demo" or args.data_dir == "demo"
    if demo:  # the trainer's own defaults, which the demo's line names
        elsewhere = {k: parser.get_default(k) for k in demo_defaults}
        parser.set_defaults(**demo_defaults)
        args = parser.parse_args(argv)
    # A namespace that already holds every flag takes no default: what it gets was given.
    unset = argparse.Namespace(**{a.dest: None for a in parser._actions})
    given = sorted(k for k, v in vars(parser.parse_args(argv, unset)).items() if v is not None)
    args.given = {k: parser.get_default(k) for k in given}
    known = parser._option_string_actions
    options = {token.split("=", 1)[0] for token in parser.argv} & known.keys()
    if len({known[option].dest for option in options}) < len(options):  # one flag, two names
        refuse_two_values(parser, options)
    for clash, message in EXCLUSIVE:
        if all(k in args.given and (v is None or getattr(args, k) == v) for k, v in clash.items()):
            parser.error(message.format(**vars(args)))
    main_process = os.environ.get("RANK", "0") == "0"
    # DALI's example and pytorch/examples' main.py, by their form: their positional folder, -a
    anchors = anchors_of(parser, positional=args.data_dir is not None)
    if main_process and ("lr" in args.given or "dist_url" in args.given):
        note_command(args, anchors)
    if args.data_dir is not None:
        args.data, args.given["data"] = args.data_dir, None
    del args.data_dir
    args.given.pop("data_dir", None)
    if args.data is None and not args.predict:
        parser.error("the following arguments are required: --data/--data-path")
    if (args.batch_size or 2) < 2 and not (args.evaluate or args.predict):
        parser.error(
            "--batch-size must be at least 2 for training (BatchNorm needs more than one sample)"
        )
    if main_process and not (args.resume or args.evaluate or args.predict):  # a fresh run
        note_defaults(args, anchors, parser.anchor_defaults, elsewhere if demo else {})
    # One of the two says the rate, the other is None: a checkpoint's args say which it was.
    if "lr" in args.given:
        args.lr_base = None
    args.demo = args.data == "demo"  # the log says which settings are the demo's
    return args


def refuse_two_values(parser, options):
    """One meaning per command line: a flag given under two of its names, the command line's
    ``options`` (an alias beside its flag, --dali_cpu beside --dali-device), is refused where the
    two give it two values."""
    dests = [parser._option_string_actions[option].dest for option in options]
    for dest in {dest for dest in dests if dests.count(dest) > 1}:
        given = values_given(parser, dest)
        if len(set(given.values())) > 1:
            parser.error(f"{' and '.join(given)} give one flag two values; pass one of them")


def values_given(parser, dest):
    """{the option as the command line gives it, with its value: the value as parsed} for each of
    the command line's options that set ``dest``."""
    argv, known, given = parser.argv, parser._option_string_actions, {}
    for i, token in enumerate(argv):
        option, equals, text = token.partition("=")
        action = known.get(option)
        if action is None or action.dest != dest:
            continue
        count = 1 if action.nargs is None else action.nargs  # the flags with aliases take 0 or 1
        strings = [text] if equals else argv[i + 1 : i + 1 + count]
        parsed = argparse.Namespace()
        action(parser, parsed, parser._get_values(action, strings), option)
        given[" ".join([option, *strings])] = repr(getattr(parsed, dest))
    return given


def anchors_of(parser, positional):
    """The trainer's ANCHORS that the command line's form names: DALI's (--dali_cpu); it or
    pytorch/examples' (-a, or a ``positional`` folder without timm's --model); else torchvision's."""
    argv, several = parser.argv, len(parser.anchor_defaults[0]) > 3
    if several and "--dali_cpu" in argv:
        return (1,)
    if several and ("-a" in argv or (positional and "--model" not in argv)):
        return (1, 2)
    return (0,)


def note_command(args, anchors):
    """A line where --lr or --dist-url means here other than in the command's ``anchors``:
    DALI's ResNet-50 example scales its --lr, pytorch/examples' main.py does not (both have its
    form); torchvision's --dist-url is not used."""
    if "lr" in args.given and anchors != (0,):
        also = "" if anchors == (1,) else ", as in pytorch/examples' main.py"
        note(
            f"--lr {args.lr:g} is the learning rate itself here{also}; DALI's ResNet-50 example "
            f"scales its --lr by the global batch / 256: for that rate, write --lr-base {args.lr:g}"
        )
    if args.dist_url != "env://":
        note(
            f"--dist-url {args.dist_url} is not used: the processes join through torchrun's "
            f"rendezvous (env://)"
        )


def note_defaults(args, anchors, anchor_defaults, elsewhere):
    """A fresh run's line for each of its ``anchors``: the defaults in ``anchor_defaults`` that the
    command leaves to the trainer and that differ from the anchor's, each with the flag that does
    as the anchor does; then the lines of note_settings, where they apply."""
    for k in anchors:
        differ = [
            f"{ours} (its: {row[k]})"
            for dest, ours, *row in anchor_defaults
            if row[k] and dest not in args.given and dest not in elsewhere and acts(args, dest)
        ]
        if differ:
            note(f"defaults that differ from {ANCHORS[k]}: {', '.join(differ)}")
    if elsewhere or args.epochs <= args.lr_warmup_epochs or ACTS_WITH.keys() & args.given:
        note_settings(args, elsewhere)


def note_settings(args, elsewhere):
    """The lines of --data demo's settings that differ from the trainer's own (``elsewhere``: a
    default the device sets, as -b's, left out), of a warm-up as long as the run, and of each given
    flag that has no effect (ACTS_WITH)."""
    demo = [
        f"{flag_text(k, v)} (else {elsewhere[k]})"
        for k, v in vars(args).items()
        if k not in args.given and elsewhere.get(k, v) not in (v, None) and acts(args, k)
    ]
    if demo:
        note(f"--data demo's own settings: {', '.join(demo)}")
    if args.epochs <= args.lr_warmup_epochs:
        ema = "; --model-ema copies the weights at each update" if args.model_ema else ""
        note(
            f"--lr-warmup-epochs {args.lr_warmup_epochs:g} lasts the whole run (--epochs "
            f"{args.epochs}): the rate never reaches its peak and --lr-scheduler "
            f"{args.lr_scheduler} never starts{ema}"
        )
    for dest in args.given:
        if not acts(args, dest):
            note(f"{flag_text(dest, getattr(args, dest))} has no effect: {ACTS_WITH[dest][2]}")


def acts(args, dest):
    """Whether flag ``dest`` acts, as ACTS_WITH says, given the others."""
    if dest not in ACTS_WITH:
        return True
    other, values, _ = ACTS_WITH[dest]
    value = getattr(args, other)
    return value in values if values else bool(value)


def flag_text(dest, value):
    """A flag as a command line gives it, a float as Python writes it shortest."""
    flag = f"--{dest.replace('_', '-')}"
    if value is True:
        return flag
    return f"{flag} {value:g}" if isinstance(value, float) else f"{flag} {value}"


def note(line):
    print(f"note: {line}", flush=True)


def broken_install(error):
    """One line where torch, torchvision or DALI cannot be imported, or not together (a CUDA
    torchvision beside a CPU torch cannot load its operators): the versions installed, the error,
    and how to install a matching set."""
    from importlib import metadata

    names = ("torch", "torchvision", "nvidia-dali")
    installed = [
        f"{d.metadata['Name']} {d.version}"
        for d in metadata.distributions()
        if d.metadata["Name"] in names[:2] or d.metadata["Name"].startswith(names[2])
    ]
    why = (str(error).strip().splitlines() or [type(error).__name__])[0]
    print(
        f"error: torch, torchvision and DALI do not load together ({why}); installed: "
        f"{', '.join(sorted(installed)) or 'none of them'}; install torch and torchvision from one "
        f"index (pip install torch torchvision --index-url https://download.pytorch.org/whl/cpu, "
        f"or .../whl/cu128 for CUDA 12.8) and DALI for that CUDA: pip install -r requirements.txt",
        file=sys.stderr,
        flush=True,
    )
    sys.exit(2)


def require(feature, *modules):
    """Where ``feature`` (a flag) needs ``modules`` and one is not beside the trainer, one line
    that names the files to copy: a fresh run imports none of resume.py, predict.py and
    data_processing.py, so that a trainer copied without them trains."""
    missing = [f"{name}.py" for name in modules if importlib.util.find_spec(name) is None]
    if missing:
        script = os.path.basename(sys.argv[0])
        print(
            f"error: {feature} needs {', '.join(missing)} beside {script} "
            f"(README.md: What to copy)",
            file=sys.stderr,
            flush=True,
        )
        sys.exit(2)
