"""The flags both trainers take, the argparse types that check their values, and the files a
flag needs beside the trainer (require).

Only the standard library is imported here: the trainers read their flags before torch and DALI
load, so that ``--help`` and a bad flag answer at once. Each trainer adds its own flags (data,
model, loss) and its defaults (``parser.set_defaults``) around these.
"""

import argparse
import difflib
import importlib.util
import math
import os
import sys


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
    is; a flag it does not know is answered with what FOREIGN says of it, else our closest flag."""

    def parse_known_args(self, args=None, namespace=None):
        self.argv = sys.argv[1:] if args is None else list(args)  # what error() looks at
        return super().parse_known_args(self.argv, namespace)

    def error(self, message):
        self.exit(2, f"error: {unknown_flag(self, self.argv) or message}\n")


def new_parser(description):
    parser = Parser(
        description=description,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        allow_abbrev=False,  # no flag is taken from a prefix: a typo is an error, not another flag
    )
    parser.add_argument(
        "data_dir", nargs="?", metavar="DIR", help="DALI's ResNet-50 example's place for --data"
    )
    return parser


# Flags of the projects a command is often brought from (torchvision's references, timm's train.py,
# DALI's ResNet-50 example) that name no feature here, or one under another shape: what to write.
FOREIGN = {
    "--drop-path": "timm's stochastic depth: not here (torchvision's models set their own); "
    "leave it out",
    "--drop": "timm's dropout rate: not here (torchvision's models set their own); leave it out",
    "--pretrained": "timm's and DALI's example's: here --weights NAME, a torchvision weights name "
    "such as ResNet50_Weights.IMAGENET1K_V2",
    "--torchcompile": "timm's: here --compile (the default on a GPU) and --compile-mode",
    "--input-size": "timm's C H W: here --crop-size SIZE (3 channels)",
    "--crop-pct": "timm's: here --val-resize-size, the crop's size / crop-pct",
    "--interpolation": "not here: resizes are bilinear (antialiased), as torchvision's reference's",
    "--mixup-prob": "timm's: here every batch is mixed (--mixup-alpha, --cutmix-alpha)",
    "--mixup-switch-prob": "timm's: here mixup and cutmix take half of the batches each",
    "--color-jitter": "not here: the augmentations are --auto-augment's and --random-erase",
    "--dist-bn": "timm's: here --sync-bn",
    "--experiment": "timm's: here --output-dir",
    "--checkpoint-hist": "not here: a run keeps checkpoint.pth and best.pth",
    "--start-epoch": "torchvision's: here a --resume checkpoint knows its epoch and step",
    "--fp16-mode": "DALI's example's: here --amp fp16 (with torch's dynamic loss scaling)",
    "--static-loss-scale": "DALI's example's: here --amp fp16 scales the loss dynamically",
    "--prof": "DALI's example's: not here; bench.py measures the loaders",
    "--disable_dali": "DALI's example's: here every run reads with DALI (--loader synthetic "
    "for the model's own rate)",
    "--world-size": "torchvision's: here torchrun's --nproc_per_node and --nnodes",
    "--local-rank": "torchrun sets LOCAL_RANK for each process: leave it out",
    "--local_rank": "torchrun sets LOCAL_RANK for each process: leave it out",
}


def unknown_flag(parser, argv):
    """The answer to the first flag of ``argv`` that ``parser`` does not know: what FOREIGN says of
    it, else the closest flag of ours; None where it knows them all. Asked only once argparse
    refuses the command line (an unknown flag's value may have been taken for the data folder)."""
    known = parser._option_string_actions
    for token in argv:
        flag = token.split("=", 1)[0]
        if not flag.startswith("-") or flag in known or flag in ("-", "--") or is_number(flag):
            continue
        if not flag.startswith("--") and flag[:2] in known:  # a short flag with its value: -b32
            continue
        if flag in FOREIGN:
            return f"{flag}: {FOREIGN[flag]}"
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
        action="store_true",
        help="an EMA of the weights, validated and saved beside them",
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
    rate = g.add_mutually_exclusive_group()
    rate.add_argument(
        "--lr",
        type=positive,
        help="the learning rate itself, as torchvision's; without it, --lr-base's",
    )
    rate.add_argument(
        "--lr-base",
        type=positive,
        default=0.1,
        help="the learning rate per --lr-base-size images, scaled to the global batch as timm's "
        "(--lr-base-scale); used where --lr is not given",
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
        {"dali_device": "gpu", "device": "cpu"},
        "--dali-device gpu puts the batches on the GPU; --device cpu needs them on the CPU",
    ),
)


def parse(parser, argv, demo_defaults):
    """The flags, with --data demo's defaults where it is given; ``args.given``: the flags the
    command line sets, each with the default it replaces (a resume takes the others from its
    checkpoint). EXCLUSIVE's pairs are refused here; the rules of --resume, --evaluate and
    --predict where those are handled (resume.load, predict.checkpoint_to_predict)."""
    args = parser.parse_args(argv)
    if args.data == "demo" or args.data_dir == "demo":
        parser.set_defaults(**demo_defaults)
        args = parser.parse_args(argv)
    # A namespace that already holds every flag takes no default: what it gets was given.
    unset = argparse.Namespace(**{a.dest: None for a in parser._actions})
    given = sorted(k for k, v in vars(parser.parse_args(argv, unset)).items() if v is not None)
    args.given = {k: parser.get_default(k) for k in given}
    for clash, message in EXCLUSIVE:
        if all(k in args.given and (v is None or getattr(args, k) == v) for k, v in clash.items()):
            parser.error(message.format(**vars(args)))
    if "lr" in args.given or "dist_url" in args.given:
        note_other_meanings(args, parser.argv)
    if args.data_dir is not None:  # DALI's example's positional folder
        args.data, args.given["data"] = args.data_dir, None
    del args.data_dir
    args.given.pop("data_dir", None)
    if args.data is None and not args.predict:
        parser.error("the following arguments are required: --data/--data-path")
    if (args.batch_size or 2) < 2 and not (args.evaluate or args.predict):
        parser.error(
            "--batch-size must be at least 2 for training (BatchNorm needs more than one sample)"
        )
    # One of the two says the rate, the other is None: a checkpoint's args say which it was.
    if "lr" in args.given:
        args.lr_base = None
    args.demo = args.data == "demo"  # the log says which settings are the demo's
    return args


def note_other_meanings(args, argv):
    """A line, on the main process, where --lr or --dist-url means here other than in the command
    it was brought from (DALI's ResNet-50 example, torchvision's reference)."""
    if os.environ.get("RANK", "0") != "0":
        return
    dali_example = args.data_dir is not None or {"-a", "--dali_cpu"} & set(argv)
    if dali_example and "lr" in args.given:
        print(
            f"note: --lr {args.lr} is the learning rate itself, as torchvision's; DALI's ResNet-50 "
            f"example scales its --lr by the global batch / 256, as --lr-base does here",
            file=sys.stderr,
            flush=True,
        )
    if args.dist_url != "env://":
        print(
            f"note: --dist-url {args.dist_url} is not used: the processes join through torchrun's "
            f"rendezvous (env://)",
            file=sys.stderr,
            flush=True,
        )


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
