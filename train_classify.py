"""Train an ImageNet-style classifier with DALI feeding PyTorch directly.

    python train_classify.py --data demo                  # a small demo set, no download
    python train_classify.py --data /data/imagenet --amp bf16 --channels-last       # one GPU
    torchrun --nproc_per_node=8 train_classify.py --data /data/imagenet --amp bf16 --channels-last
    python train_classify.py --data demo --dali-device cpu  # DALI CPU-only, as without a GPU
    python train_classify.py --data /data/imagenet --loader synthetic   # the model's own ceiling
    python train_classify.py --data /data/imagenet --resume runs/classify/exp1/checkpoint.pth
    python train_classify.py --data /data/imagenet --resume runs/classify/exp1/best.pth --evaluate
    python train_classify.py --predict photos/ --resume runs/classify/exp1/best.pth --output-dir out

--data (local or s3://) holds train/ and val/: ImageFolder trees, TFRecord files or WebDataset tars
(make_shards.py writes both). DALI decodes and augments on the GPU when there is one; without one,
every operator and the training run on the CPU.

Needs beside it: pipelines.py (the DALI pipelines), data_sources.py (what they read), training.py
(what a run needs around its loop), flags.py and outputs.py; resume.py for --resume and
--evaluate, predict.py and resume.py for --predict, data_processing.py for --data demo. Read top to
bottom: flags, model and loss, train_one_epoch and evaluate, main and its phases.
"""

import csv
import difflib
import functools
import os
import sys
import time

import flags

RUNS_DIR = "runs/classify"
DEMO_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), ".cache", "demo-classify-v2")
# --data demo: a small, quick run; flags given on the command line still win.
# --ra-reps: at most this many copies of an image an epoch (see its flag)
MAX_RA_REPS = 16
DEMO_DEFAULTS = dict(
    arch="resnet18",
    epochs=6,
    batch_size=32,
    lr_base=0.2,
    train_crop_size=64,
    val_crop_size=64,
    val_resize_size=73,
    print_freq=10,
    workers=min(4, os.cpu_count() or 1),
)
# The defaults here that differ from the anchors' (flags.ANCHORS): the flag, ours, then the
# anchor's, torchvision's reference's, DALI's ResNet-50 example's and pytorch/examples' main.py's,
# each as the flags that give it here (None: as ours). A fresh run names its command's anchor's.
ANCHOR_DEFAULTS = (
    ("arch", "--arch resnet50", "--arch resnet18", "--arch resnet18", "--arch resnet18"),
    (
        "lr_scheduler",
        "--lr-scheduler cosine",
        "--lr-scheduler steplr",
        "--lr-scheduler step, the nearest: it decays at epochs 30, 60 and 80",
        "--lr-scheduler step",
    ),
    ("lr_warmup_epochs", "--lr-warmup-epochs 0", None, "--lr-warmup-epochs 5", None),
    (
        "batch_size",
        "-b 256 on a GPU",
        "-b 32",
        None,
        "-b 256 shared by the node's GPUs: here -b is each GPU's",
    ),
    ("lr_base", "--lr-base 0.1 per 256 images", "--lr 0.1", None, "--lr 0.1"),
    ("lr_warmup_method", "--lr-warmup-method linear", "--lr-warmup-method constant", None, None),
)


def get_args_parser():
    parser = flags.new_parser("Image classification on DALI", ANCHOR_DEFAULTS)
    g = parser.add_argument_group("data")
    g.add_argument(
        "--data",
        "--data-path",
        "--data-dir",
        help=flags.demo_help(
            "folder or s3:// prefix with train/ and val/, each an ImageFolder tree, TFRecord files "
            "or WebDataset tars",
            DEMO_DEFAULTS,
        ),
    )
    g.add_argument(
        "--num-classes",
        type=flags.at_least_1,
        help="classes of shards without a classes.txt (ImageFolder trees count their folders)",
    )
    g.add_argument(
        "--label-offset",
        type=int,
        default=0,
        help="subtracted from every stored label (1 for TensorFlow's ImageNet TFRecords)",
    )
    size = flags.side
    g.add_argument(
        "--train-crop-size", type=size, default=224, help="random-resized crop for training"
    )
    g.add_argument(
        "--val-resize-size", type=size, default=256, help="shorter side before the val crop"
    )
    g.add_argument("--val-crop-size", type=size, default=224, help="centre crop for validation")
    g.add_argument(
        "--crop-size",
        "--img-size",
        type=size,
        help="sets --train-crop-size and --val-crop-size (timm's --img-size; the validation resize "
        "stays --val-resize-size's)",
    )
    g.add_argument(
        "--auto-augment",
        "--aa",
        type=auto_augment_name,
        choices=["ta_wide", "ra", "imagenet"],
        help="torchvision's TrivialAugmentWide, RandAugment or ImageNet AutoAugment policy, after "
        "the crop and flip (in DALI; default: none); timm's --aa rand-m9-... and original are "
        "taken as ra and imagenet, without timm's magnitude noise",
    )
    g.add_argument(
        "--progressive-resize",
        type=size,
        nargs=3,
        metavar=("MIN_RES", "START_EPOCH", "END_EPOCH"),
        help="FFCV's progressive resizing: the training crop grows linearly from MIN_RES at "
        "START_EPOCH to --train-crop-size at END_EPOCH, in steps of 32 (validation keeps its size)",
    )
    g.add_argument(
        "--random-erase",
        "--reprob",
        type=flags.probability,
        default=0.0,
        help="probability of random erasing (in DALI)",
    )
    g.add_argument(
        "--ra-sampler",
        action="store_true",
        help="torchvision's repeated augmentation: each epoch about 1/--ra-reps of the training "
        "images, each --ra-reps times across the processes (ImageFolder trees and file lists)",
    )
    g.add_argument(
        "--ra-reps",
        # RASampler keeps len // 256 * 256 indices an epoch, --ra-reps copies of each: 256 copies
        # would leave an epoch of one or two images; DeiT and torchvision use 3
        type=flags.number(int, f"in [1, {MAX_RA_REPS}]", lambda v: 1 <= v <= MAX_RA_REPS),
        default=3,
        help=f"copies of each image (--ra-sampler), at most {MAX_RA_REPS}",
    )
    flags.add_loader_flags(g)
    g.add_argument(
        "--decoder",
        choices=["mixed", "cpu"],
        default="mixed",
        help="where a GPU run decodes the JPEGs: mixed (the GPU, with its hardware decoder) or cpu "
        "(the -j DALI threads; the GPU then runs only the model and the resize: for models slower "
        "than the CPU's decode, such as ResNet-50 with 8 threads, see results/README.md)",
    )
    g.add_argument(
        "--hw-decoder-load",
        type=flags.probability,
        help="share of JPEGs for the GPU's hardware decoder, with --decoder mixed (default: "
        "pipelines.py's DEFAULT_HW_DECODER_LOAD, or CACHED_HW_DECODER_LOAD with the decoder cache)",
    )
    g.add_argument(
        "--decoder-cache",
        type=flags.cache_mode,
        default="auto",
        metavar="auto|on|off|MB",
        help="keep decoded images in DALI's GPU cache (auto: when this process's share fits in "
        "half the free GPU memory; MB: a cache of that size, holding the images that fit)",
    )
    g = parser.add_argument_group("model")
    g.add_argument(
        "--arch",
        "--model",
        "-a",
        default="resnet50",
        help="any torchvision classification model",
    )
    flags.add_model_flags(
        g, weights_example="ResNet50_Weights.IMAGENET1K_V2, downloaded by torchvision"
    )
    g = parser.add_argument_group("optimisation")
    flags.add_optimisation_flags(g)
    g.add_argument(
        "--label-smoothing",
        "--smoothing",
        type=flags.below_one,
        default=0.0,
        help="cross-entropy label smoothing",
    )
    g.add_argument(
        "--mixup-alpha",
        "--mixup",
        type=flags.non_negative,
        default=0.0,
        help="MixUp alpha (0: off)",
    )
    g.add_argument(
        "--cutmix-alpha",
        "--cutmix",
        type=flags.non_negative,
        default=0.0,
        help="CutMix alpha (0: off)",
    )
    flags.add_output_flags(parser.add_argument_group("output and checkpoints"), RUNS_DIR)
    # -b: 256 a GPU, 32 on the CPU (main)
    parser.set_defaults(epochs=90, batch_size=None, lr_scheduler="cosine", lr_warmup_epochs=0)
    return parser


def auto_augment_name(text):
    """--auto-augment's policy, or timm's --aa spelling of one: rand-m9[-...] (RandAugment at
    torchvision's magnitude 9, 2 operations), original (AutoAugment's ImageNet policy)."""
    name, *options = text.split("-")
    if name == "rand":  # timm's rand-m9-mstd0.5-inc1: its magnitude m and operations n
        settings = {o[0]: o[1:] for o in options if o[:1] in ("m", "n") and o[1:].isdigit()}
        if settings.get("m") == "9" and settings.get("n", "2") == "2":
            return "ra"
    return {"original": "imagenet"}.get(text, text)


def parse_args(argv=None):
    """The flags, with --data demo's defaults where it is given, and the rules that tie them."""
    parser = get_args_parser()
    args = flags.parse(parser, argv, DEMO_DEFAULTS)
    if args.data == "demo":
        args.data = DEMO_DIR  # locate_data builds it
    if args.crop_size:
        args.train_crop_size = args.val_crop_size = args.crop_size
        args.given.update({k: parser.get_default(k) for k in ("train_crop_size", "val_crop_size")})
    if "ra_reps" in args.given and not args.ra_sampler:
        parser.error(f"--ra-reps {args.ra_reps}: needs --ra-sampler, whose copies it counts")
    if args.progressive_resize:
        check_progressive_resize(parser, args)
    if args.val_resize_size < args.val_crop_size:
        parser.error(
            f"--val-resize-size {args.val_resize_size} is below --val-crop-size "
            f"{args.val_crop_size}: the centre crop must fit in the resized image"
        )
    return args


def check_progressive_resize(parser, args):
    low, start, end = args.progressive_resize
    if start > end:
        parser.error(f"--progressive-resize: START_EPOCH {start} is after END_EPOCH {end}")
    if low > args.train_crop_size:
        parser.error(
            f"--progressive-resize: MIN_RES {low} is above --train-crop-size "
            f"{args.train_crop_size}, the size it grows to"
        )


def lacks_splits(data, isdir=os.path.isdir):
    """The line for a --data without train/ and val/ (``isdir``: data_sources', for s3:// too), or
    None."""
    if all(isdir(os.path.join(data, split)) for split in ("train", "val")):
        return None
    return (
        f"--data {data}: expected subfolders train/ and val/ in it (each an ImageFolder tree, "
        f"TFRecord files or WebDataset tars), or --data demo for the built-in demo set"
    )


if __name__ == "__main__":
    # --help, a bad flag and a folder --data lacks answer here, before torch and DALI take seconds
    # to load
    args = parse_args()
    if (
        args.data not in (None, DEMO_DIR)
        and "://" not in args.data  # s3:// is read, other schemes named: data_sources answers
        and (why := lacks_splits(args.data))
    ):
        print(f"error: {why}", file=sys.stderr)
        sys.exit(2)

try:  # torchvision's operators and DALI's plugin load against this torch: one line where they don't
    import nvidia.dali.plugin.pytorch  # noqa: F401
    import torch
    import torch.distributed as dist
    import torchvision
    from torchvision.transforms import v2
except (ImportError, OSError, RuntimeError) as e:
    flags.broken_install(e)

import training
from data_sources import (
    ClassifyReader,
    data_digest,
    decode_errors_named,
    isdir,
    plan_decoder_cache,
    remote,
    unchanged,
    watch,
)
from pipelines import ClassifyTrainPipeline, ClassifyValPipeline, classify_iterator
from training import RunData, UsageError


def train_crop_size(args, epoch):
    """The training crop's size in ``epoch`` (1 for the first): --train-crop-size, or with
    --progressive-resize FFCV's ramp, rounded to a multiple of 32 between its ends."""
    if not args.progressive_resize:
        return args.train_crop_size
    low, start, end = args.progressive_resize
    if epoch <= start:
        return low
    if epoch >= end:
        return args.train_crop_size
    size = low + (args.train_crop_size - low) * (epoch - start) / (end - start)
    return min(max(int(round(size / 32)) * 32, low), args.train_crop_size)


def check_arch(args):
    """--arch names a torchvision classification model, else one line with the close names."""
    names = torchvision.models.list_models(module=torchvision.models)
    if args.arch not in names:
        close = difflib.get_close_matches(args.arch, names, n=5, cutoff=0.5)
        hint = (
            f"close names: {', '.join(close)}" if close else "see torchvision.models.list_models()"
        )
        raise UsageError(f"--arch {args.arch}: not a torchvision classification model; {hint}")


def make_model(args, num_classes):
    check_arch(args)
    return torchvision.models.get_model(args.arch, weights=None, num_classes=num_classes)


def get_mixup_cutmix(args, num_classes):
    """--mixup-alpha, --cutmix-alpha: torchvision's MixUp and/or CutMix on the batch (one of the
    two, at random, when both are on)."""
    alphas = ((v2.MixUp, args.mixup_alpha), (v2.CutMix, args.cutmix_alpha))
    transforms = [t(alpha=alpha, num_classes=num_classes) for t, alpha in alphas if alpha > 0]
    return v2.RandomChoice(transforms) if len(transforms) > 1 else transforms[0]


def train_one_epoch(model, criterion, state, steps, step_log, epoch, args, mixup_cutmix=None):
    """One epoch over ``steps``, (step number, (images, targets)) pairs from ``step_log.epoch``,
    which does the rest (log lines, checkpoints, stop signals). Returns the epoch's mean loss."""
    optimizer, scheduler, scaler = state["optimizer"], state["scheduler"], state["scaler"]
    model_ema = state["model_ema"]
    model.train()
    for step, (images, targets) in steps:  # channels_last already where asked (batches_on_device)
        if mixup_cutmix is not None:
            images, targets = mixup_cutmix(images, targets)  # soft targets: class probabilities
        with training.autocast(args, images.device):
            loss = criterion(model(images), targets)
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        if args.clip_grad_norm:
            scaler.unscale_(optimizer)  # clip the true gradients, not fp16's scaled ones
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip_grad_norm)
        scaler.step(optimizer)
        scaler.update()
        scheduler.step()
        if model_ema is not None:
            training.update_ema(model_ema, model, step, epoch, args)
        step_log.update(loss, len(targets))
    return step_log.epoch_loss()


@torch.no_grad()
def evaluate(model, batches, args, device):
    """Top-1 and top-5 accuracy in percent over the whole validation set (all shards)."""
    model.eval()
    correct1 = correct5 = count = 0
    for images, labels in batches:
        if images.shape[0] == 0:  # a shard one sample short of the others ends on an empty batch
            continue
        with training.autocast(args, device):
            logits = model(images)
        hits = logits.topk(min(5, logits.shape[1]), dim=1).indices == labels[:, None]
        correct1, correct5 = correct1 + hits[:, 0].sum(), correct5 + hits.any(dim=1).sum()
        count += len(labels)
    correct1, correct5, count = training.all_reduce_sum(
        [float(correct1), float(correct5), count], device
    )
    return {"val_top1": 100 * correct1 / count, "val_top5": 100 * correct5 / count}


def validate(state, data, args, world, step_log):
    """The epoch's validation record, of the model and its EMA."""
    model, model_ema = state["model"], state["model_ema"]
    batches = step_log.stoppable(val_batches(data, world))
    metrics = evaluate(model, batches, args, world.device)
    if model_ema is not None:
        batches = step_log.stoppable(val_batches(data, world))
        ema_metrics = evaluate(model_ema, batches, args, world.device)
        metrics.update({f"ema_{k}": v for k, v in ema_metrics.items()})
    return metrics


def main(args):
    world = training.setup(args)  # torchrun's ranks; this process's device
    if args.batch_size is None:  # torchvision's: ImageNet's 256 a GPU; 32 a CPU holds
        args.batch_size = 256 if world.device.type == "cuda" else 32
    if args.predict:  # the trained model on new images: no --data, no run folder
        return predict(args, world)
    # its run's flags; --evaluate's and --resume auto's rules (resume.py: a fresh run needs none)
    ckpt = load_checkpoint(args, world) if args.resume or args.evaluate else None
    check_arch(args)  # before the run folder is made, or the demo set built
    locate_data(args, world)  # builds the demo set, or checks --data
    log = training.open_run(args, world, RUNS_DIR)  # the run folder, locked, and its log
    data, cache = build_loaders(args, world, ckpt, log)  # DALI pipelines over this process's shard
    if world.distributed:  # one run on every node: the same flags and data
        training.check_one_run(args, world, data)
    torch.manual_seed(args.seed)  # the model's first weights
    model, state = training.prepare_model(
        make_model(args, len(data.classes)), args, world, data.steps, log
    )
    criterion = torch.nn.CrossEntropyLoss(label_smoothing=args.label_smoothing)
    mixup_cutmix = None
    if args.mixup_alpha or args.cutmix_alpha:
        mixup_cutmix = get_mixup_cutmix(args, len(data.classes))
    # a new run's first step, or its checkpoint's next
    start = restore(ckpt, args, world, state, data, log) if ckpt else training.Start()
    log.begin()  # every check has passed: from here the run folder changes
    if args.evaluate:
        return score(state, data, args, world, log)

    checkpoints = training.Checkpoints(
        log, state, data, args, world, start.best, decoder_cache=cache
    )
    stop = training.StopSignals(world)  # from here SIGTERM, SIGUSR1 and the others stop the run
    step_log = training.StepLog(args, world, log, checkpoints, stop, data.steps, state["optimizer"])
    first_step, loss_sum = start.step, start.loss_sum
    for epoch in range(start.epoch, args.epochs + 1):
        begun = time.perf_counter()
        # The first epoch reads validation too, a batch a step: a bad file shows at once, yet
        # step 1 waits for none.
        val_beside = val_batches(data, world) if epoch == start.epoch else ()
        batches = training.alongside(
            train_batches(args, world, data, epoch, first_step), val_beside
        )
        crop = train_crop_size(args, epoch) if args.progressive_resize else None
        steps = step_log.epoch(batches, epoch, first_step, loss_sum, crop_size=crop)
        train_loss = train_one_epoch(
            model, criterion, state, steps, step_log, epoch, args, mixup_cutmix
        )
        first_step, loss_sum = 0, 0.0
        if world.distributed:
            training.sync_buffers(state["model"], state["model_ema"])
        with unchanged(data.watched):  # a file replaced under the run: stop before it is saved
            metrics = validate(state, data, args, world, step_log)
        if crop:
            metrics["train_crop_size"] = crop
        path = checkpoints.save(epoch, data.steps, score=metrics["val_top1"])
        log.epoch_end(epoch, data.steps, train_loss, metrics, time.perf_counter() - begun)
        if signum := stop.agree()[0]:  # a signal during the epoch's last validation batches
            stop.exit(signum, path, epoch, data.steps)
    log.close("val_top1", checkpoints.best)


def load_checkpoint(args, world):
    """--resume's or --evaluate's checkpoint (resume.load), or None for a fresh --resume auto."""
    flags.require("--resume" if args.resume else "--evaluate", "resume")
    import resume

    return resume.load(args, world)


def restore(ckpt, args, world, state, data, log):
    """Where a checkpoint's run goes on (resume.restore), ``state`` loaded from it."""
    import resume

    build = functools.partial(train_loader, cache=ckpt.get("decoder_cache"))
    return resume.restore(ckpt, args, world, state, data, log, build)


def score(state, data, args, world, log):
    """--evaluate: the checkpoint's model (with --model-ema, its EMA) on the validation set."""
    ema = state["model_ema"]
    scored = ema if ema is not None else state["model"]
    metrics = evaluate(scored, val_batches(data, world), args, world.device)
    log({"type": "eval", **metrics, "ema": ema is not None})


# ------------------------------------------------------------------------------------------
# --predict: the trained model on new images
# ------------------------------------------------------------------------------------------


@torch.no_grad()
def predict(args, world):
    """--predict DIR: --output-dir/predictions.csv, a row per PNG or JPEG under DIR: its path in
    DIR, then its top-5 classes (the checkpoint's names), each with its probability, most likely
    first; the images transformed as validation's. Under torchrun each process predicts its share
    and the main one writes the file."""
    flags.require("--predict", "predict", "resume")  # only --predict needs them: imported here
    from predict import (
        checkpoint_to_predict,
        images_to_predict,
        load_to_predict,
        refuse_overwrite,
        written,
    )

    ckpt = checkpoint_to_predict(args, world)
    files = images_to_predict(args, world, writes_images=False)  # a CSV file, no image
    path = os.path.join(args.output_dir, "predictions.csv")
    refuse_overwrite(args, [(path, args.predict)])
    classes = ckpt.get("classes") or [str(k) for k in range(args.num_classes or 1000)]
    model = load_to_predict(make_model(args, len(classes)), ckpt, args, world)
    pipe = ClassifyValPipeline(  # a list of files: each labelled by its position in it
        args.batch_size,
        args.workers,
        world.local_rank if args.dali_device == "gpu" else None,
        args.predict,
        file_list=files,
        crop_size=args.val_crop_size,
        resize_size=args.val_resize_size,
        shard_id=world.rank,
        num_shards=world.size,
        decoder=args.decoder,
        hw_decoder_load=args.hw_decoder_load,
    )
    rows, top_k = [], min(5, len(classes))
    with decode_errors_named(pipe):  # a file DALI cannot decode: one line naming it
        for batch in classify_iterator(pipe):
            with training.autocast(args, world.device):
                logits = model(batch[0]["data"].to(world.device))
            top = logits.float().softmax(1).topk(top_k)
            for k, probs, indexes in zip(batch[0]["label"].flatten(), top.values, top.indices):
                row = [os.path.relpath(files[k], args.predict)]
                for p, i in zip(probs.tolist(), indexes.tolist()):
                    row += [classes[i], f"{p:.6f}"]
                rows.append(row)
    shares = [rows]
    if world.distributed:
        shares = [None] * world.size if world.main else None
        dist.gather_object(rows, shares, dst=0)
    if world.main:
        with written(path, "w") as f:
            writer = csv.writer(f, lineterminator="\n")
            writer.writerow(
                ["path"] + [f"{c}{n}" for n in range(1, top_k + 1) for c in ("class", "prob")]
            )
            writer.writerows(sorted(row for share in shares for row in share))
        print(f"--predict: {len(files)} images of {args.predict} into {path}")


# ------------------------------------------------------------------------------------------
# main's phases: the data
# ------------------------------------------------------------------------------------------


def locate_data(args, world):
    """--data demo is built, once per node; any --data must hold train/ and val/."""
    if args.data == DEMO_DIR:
        build_demo(world)
    elif why := lacks_splits(args.data, isdir):
        raise UsageError(why)


def build_demo(world):
    """The demo set in DEMO_DIR, built by one process per node while the others wait."""
    flags.require("--data demo", "data_processing")
    from data_processing import make_demo_images  # only the demo needs it

    if world.local_rank == 0:
        make_demo_images(DEMO_DIR)
    if world.distributed:
        dist.barrier()


def make_pipelines(args, world, dali_state=None, cache=None, first_epoch=1):
    """(train, val) pipelines and the class names, over shard RANK of WORLD_SIZE, on GPU LOCAL_RANK
    or all on the CPU; ``cache``: MB of DALI's decoder cache, one for both (see plan_decoder_cache);
    ``dali_state`` and ``first_epoch``: the training pipeline's (see resume.pipeline_state)."""
    train = make_train_pipeline(args, world, dali_state, cache, first_epoch)
    if train.num_classes is None:
        raise UsageError(
            f"--data {args.data}: the number of classes is unknown (no classes.txt beside the "
            f"shards); pass --num-classes"
        )
    # names, which the checkpoints compare
    classes = train.classes or [str(k) for k in range(train.num_classes)]
    val = ClassifyValPipeline(
        args.batch_size,
        data_dir=os.path.join(args.data, "val"),
        classes=classes,
        crop_size=args.val_crop_size,
        resize_size=args.val_resize_size,
        **pipeline_settings(args, world, cache),
    )
    return train, val, classes


def pipeline_settings(args, world, cache, first_epoch=1):
    """What the training and validation pipelines share; ``first_epoch``: the training pipeline's
    (its seed, see training.pipeline_seed). data_sources' reader checks the data first."""
    return dict(
        reader=ClassifyReader,
        num_threads=args.workers,
        device_id=world.local_rank if args.dali_device == "gpu" else None,
        shard_id=world.rank,
        num_shards=world.size,
        seed=training.pipeline_seed(args, world, first_epoch),
        decoder=args.decoder,
        hw_decoder_load=args.hw_decoder_load,
        label_offset=args.label_offset,
        num_classes=args.num_classes,
        output_layout="HWC" if args.channels_last else "CHW",  # HWC is channels_last: no transpose
        decoder_cache=cache,
    )


def make_train_pipeline(args, world, dali_state=None, cache=None, first_epoch=1):
    """The training pipeline of make_pipelines."""

    # Checkpointing the train pipeline (reader position, random states) costs nothing until asked.
    # With --progressive-resize it asks each epoch's crop size by the epoch's index, 0 for its
    # first epoch.
    def epoch_size(index):
        return train_crop_size(args, index + first_epoch)

    return ClassifyTrainPipeline(
        args.batch_size,
        data_dir=os.path.join(args.data, "train"),
        crop_size=args.train_crop_size,
        auto_augment=args.auto_augment,
        crop_sizes=epoch_size if args.progressive_resize else None,
        random_erase=args.random_erase,
        ra_reps=args.ra_reps if args.ra_sampler else 0,
        ra_seed=args.seed + first_epoch - 1,  # one order for every process, each epoch its own
        enable_checkpointing=True,
        checkpoint=dali_state[world.rank] if dali_state else None,
        **pipeline_settings(args, world, cache, first_epoch),
    )


def build_loaders(args, world, ckpt, log):
    """The pipelines and iterators over this process's shards and what the run knows of its data
    (training.RunData); the MB of the decoder cache, or None."""
    if ckpt:  # a checkpoint's run: main imported resume.py for it
        import resume
    dali_state, first_epoch = resume.pipeline_state(ckpt, args, world) if ckpt else (None, 1)
    if world.distributed and world.local_rank > 0:
        dist.barrier()  # local rank 0 indexes the node's new shards; the others then find them made
    train_pipe, val_pipe, classes = make_pipelines(args, world, dali_state, None, first_epoch)
    if world.distributed and world.local_rank == 0:
        dist.barrier()
    if ckpt and not args.evaluate and ckpt.get("dali"):  # its pipelines are restored: its cache
        cache = resume.decoder_cache(ckpt, args, log)
    elif args.dali_device == "gpu" or args.decoder_cache != "auto":
        cache = plan_cache(args, world, train_pipe, val_pipe, log)
    else:  # DALI on the CPU has no cache; planned only to say so where it is asked for
        cache = None
    if cache:  # again, decoding whole images into the cache (DALI builds nothing until iterated)
        train_pipe, val_pipe, classes = make_pipelines(args, world, dali_state, cache, first_epoch)
    # what the run reads, for the checkpoints the main process writes; scoring one needs none
    on_main = world.main and not args.evaluate
    pipes = (train_pipe, val_pipe) if on_main else ()
    with decode_errors_named(train_pipe):  # the iterators decode their first batches right away
        train_loader = classify_iterator(train_pipe)
    with decode_errors_named(val_pipe):
        val_loader = classify_iterator(val_pipe)
    log_data(args, log, train_pipe, val_pipe, classes)
    if args.progressive_resize:
        log_unfinished_ramp(args, log)
    data = RunData(
        train_pipe,
        val_pipe,
        train_loader,
        val_loader,
        steps=len(train_loader),  # the same on every process: every shard runs as many full batches
        classes=classes,
        num_samples=train_pipe.num_samples,
        # every process's: check_one_run compares them
        digest=data_digest(train_pipe.read.data_dir, train_pipe.files, train_pipe.read.sizes),
        watched=[
            watch(p.read.data_dir, p.files, p.read.stamps)
            for p in pipes
            if remote(p.read.data_dir) or p.read.stamps is not None
        ],
        first_epoch=first_epoch,
    )
    return data, cache


def plan_cache(args, world, train_pipe, val_pipe, log):
    """The MB of the decoder cache that --decoder-cache asks for (see plan_decoder_cache)."""
    free_mb = torch.cuda.mem_get_info(world.device)[0] / 2**20 if world.device.type == "cuda" else 0
    cache, why = plan_decoder_cache(args.decoder_cache, (train_pipe, val_pipe), free_mb)
    if why:
        log({"type": "decoder_cache", "mb": cache}, why)
    return cache


def train_loader(args, world, dali_states, first_epoch, cache):
    """A training iterator of a checkpoint's run, as it was built, for resume.RestOfEpoch."""
    pipe = make_train_pipeline(args, world, dali_states, cache, first_epoch)
    with decode_errors_named(pipe):
        return classify_iterator(pipe)


def train_batches(args, world, data, epoch, first_step):
    """The rest of ``epoch``'s training batches: DALI's, or --loader synthetic's."""
    if args.loader == "dali":
        return batches_on_device(data.train_source(), data.train_pipe, world.device)
    return synthetic_batches(args, world, data, epoch, first_step)


def synthetic_batches(args, world, data, epoch, first_step):
    """--loader synthetic: one random batch of the epoch's crop size already on the device, every
    step (the ceiling for any loader)."""
    size = train_crop_size(args, epoch)
    images = torch.randn(args.batch_size, 3, size, size, device=world.device)
    if args.channels_last:
        images = images.contiguous(memory_format=torch.channels_last)
    labels = torch.randint(0, len(data.classes), (args.batch_size,), device=world.device)
    return [(images, labels)] * (data.steps - first_step)


def val_batches(data, world):
    """Every validation batch of this process's shard, on its device."""
    return batches_on_device(data.val_loader, data.val_pipe, world.device)


def batches_on_device(loader, pipe, device):
    """A DALI iterator's (images, labels) on ``device``; HWC batches become NCHW tensors in
    channels_last memory, with no copy."""
    with decode_errors_named(pipe):
        for batch in loader:
            images, labels = batch[0]["data"], batch[0]["label"].squeeze(-1).long()
            if pipe.output_layout == "HWC":
                images = images.permute(0, 3, 1, 2)
            yield images.to(device, non_blocking=True), labels.to(device, non_blocking=True)


def log_unfinished_ramp(args, log):
    """One line where --progressive-resize's ramp ends after the run's last epoch: the training
    crop never grows to --train-crop-size."""
    last = train_crop_size(args, args.epochs)
    if args.evaluate or last == args.train_crop_size:
        return
    log(
        {"type": "progressive_resize", "last_crop_size": last},
        f"--progressive-resize: its ramp ends at epoch {args.progressive_resize[2]}, after this "
        f"run's last ({args.epochs}): the training crop grows to {last}, not to "
        f"--train-crop-size {args.train_crop_size}",
    )


def log_data(args, log, train_pipe, val_pipe, classes):
    """The run's first record: its folder, the data's layout and counts (--ra-sampler's too); its
    line says how many classes val lacks."""
    ra = train_pipe.read.ra
    record = {
        "type": "start",
        "output_dir": log.dir,
        "data": args.data,
        "layout": train_pipe.layout,
        "train_samples": train_pipe.num_samples,
        "val_samples": val_pipe.num_samples,
        "classes": train_pipe.num_classes,
    }
    if ra:
        record.update(ra_reps=ra.reps, ra_samples=ra.selected, steps_per_epoch=ra.steps)
    missing = 0
    if val_pipe.layout == "folder":  # each file's class folder: a slice, where relpath is slow
        cut = len(os.path.join(args.data, "val", ""))
        missing = len(set(classes) - {f[cut:].split("/", 1)[0] for f in val_pipe.files})
    lacking = f"  ({missing} of the classes have no val samples)" if missing else ""
    log(record, training.render(record) + lacking)


if __name__ == "__main__":
    training.run_main(main, args)  # a UsageError or DataError: one `error:` line, exit 2
