"""Train a segmentation model, DALI feeding PyTorch directly.

    python train_segment.py --data demo              # a synthetic nail set, no download
    python train_segment.py --data data/nails --amp bf16 --channels-last   # a prepared root
    python train_segment.py --data data/nails_png    # a PNG root (Images/, Masks/), prepared
    torchrun --nproc_per_node=8 train_segment.py --data data/nails --amp bf16 --channels-last
    python train_segment.py --data data/nails --resume runs/segment/exp1/checkpoint.pth
    python train_segment.py --data data/nails --resume runs/segment/exp1/best.pth --evaluate
    python train_segment.py --predict photos/ --resume runs/segment/exp1/best.pth --output-dir out

DALI reads image and mask in lock-step, resizes both to --size, flips both alike and augments the
image, on the GPU when there is one, else on the CPU. --num-classes 1 is binary (BCE + Dice); 2 or
more use cross-entropy + Dice.

Needs beside it: pipelines.py (the DALI pipelines), data_sources.py (what they read), training.py
(what a run needs around its loop), flags.py and outputs.py; resume.py for --resume and
--evaluate, predict.py, resume.py and data_processing.py for --predict, data_processing.py for PNG
roots and --data demo. Read top to bottom: flags, model and loss, train_one_epoch and evaluate,
main and its phases.
"""

import argparse
import colorsys
import functools
import inspect
import math
import os
import sys
import time

import flags

RUNS_DIR = "runs/segment"
DEMO_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), ".cache", "demo-segment-v1")
# --scale-range: the smallest and largest scale of --size; 4x a 384 crop is 1536 pixels a side
SCALES = (0.1, 4.0)
# --data demo: a small, quick run; flags given on the command line still win.
DEMO_DEFAULTS = dict(
    epochs=6,
    batch_size=8,
    lr_base=2.0,
    size=96,
    unet_width=16,
    print_freq=5,
    lr_warmup_epochs=1,
    lr_scheduler="cosine",
    workers=min(4, os.cpu_count() or 1),
)
# The defaults here that differ from torchvision's segmentation reference's (flags.ANCHORS): the
# flag, ours, then the reference's, as the flags that give it here. A fresh run names them.
ANCHOR_DEFAULTS = (
    ("arch", "--arch unet", "--arch fcn_resnet50, the nearest: fcn_resnet101 is not here"),
    ("batch_size", "-b 32", "-b 8"),
    ("epochs", "--epochs 50", "--epochs 30"),
    ("lr_base", "--lr-base 0.1 per 256 images", "--lr 0.01"),
)
# The smallest --size at which a torchvision model learned the demo's nails (its features are
# 12 x 12 there); below it the trainer says so.
SMALLEST_INPUT = 192
# --aux-loss: the auxiliary classifier's loss weight, torchvision's reference's
AUX_WEIGHT = 0.5
# DeepLabV3-MobileNetV3's many small kernels make a compiled step wait on the host's launches, and
# so on whatever else the host does; CUDA graphs (--compile-mode reduce-overhead) launch a step's
# kernels at once. Its default on one GPU: under DDP torch skips the graphs of a model whose
# BatchNorm updates its statistics (pytorch/pytorch#139207). LRASPP shares the backbone.
LAUNCH_BOUND = ("deeplabv3_mobilenet_v3_large", "lraspp_mobilenet_v3_large")
# The torchvision models with an auxiliary classifier (--aux-loss)
AUX_ARCHS = ("deeplabv3_mobilenet_v3_large", "deeplabv3_resnet50", "fcn_resnet50")
ARCHS = [
    "unet",
    "lraspp_mobilenet_v3_large",
    "deeplabv3_mobilenet_v3_large",
    "deeplabv3_resnet50",
    "fcn_resnet50",
]


def get_args_parser():
    parser = flags.new_parser("Semantic segmentation on DALI", ANCHOR_DEFAULTS)
    g = parser.add_argument_group("data")
    g.add_argument(
        "--data",
        "--data-path",
        "--data-dir",
        help=flags.demo_help(
            "prepared root (csv_file/; local or s3://), PNG root (Images/, Masks/: prepared into "
            "<root>/npy)",
            DEMO_DEFAULTS,
        ),
    )
    g.add_argument(
        "--num-classes",
        type=flags.at_least_1,
        default=1,
        help="1: binary (BCE + Dice); more: CE + Dice",
    )
    g.add_argument(
        "--size",
        type=flags.number(
            int,
            f"a multiple of 32 (the models down-sample by up to 32), at most {flags.MAX_SIDE}",
            lambda v: 32 <= v <= flags.MAX_SIDE and v % 32 == 0,
        ),
        default=384,
        help="side of the input",
    )
    g.add_argument(
        "--scale-range",
        nargs=2,
        type=flags.number(float, "in [%g, %g]" % SCALES, lambda v: SCALES[0] <= v <= SCALES[1]),
        metavar=("LO", "HI"),
        help="train on random scales, as torchvision's reference (0.5 2.0): image and mask scaled "
        "by s ~ U(LO, HI) of --size, then randomly cropped or padded back to --size",
    )
    flags.add_loader_flags(g)
    g = parser.add_argument_group("loss")
    g.add_argument(
        "--ignore-index",
        type=flags.at_least_0,
        help="mask value of pixels left out of the loss and the metrics (unlabelled pixels and "
        "borders: 255 in VOC, Cityscapes, ADE20K); a PNG root keeps it as it is",
    )
    g.add_argument(
        "--class-weights",
        type=weight_list,
        metavar="W0,W1,...",
        help="weights of the classes in the cross-entropy term, one per class (binary: "
        "background, foreground, each pixel's BCE weighed by its class's)",
    )
    g = parser.add_argument_group("model")
    g.add_argument(
        "--arch",
        "--model",
        default="unet",
        choices=ARCHS,
        help="the compact U-Net of this file, or a torchvision model",
    )
    flags.add_model_flags(g, weights_example="FCN_ResNet50_Weights.DEFAULT; the U-Net has none")
    g.add_argument(
        "--weights-backbone",
        help="a torchvision model's backbone weights, a torchvision weights name "
        "(MobileNet_V3_Large_Weights.IMAGENET1K_V1, ResNet50_Weights.IMAGENET1K_V1), downloaded by "
        "torchvision; the rest starts anew",
    )
    g.add_argument(
        "--aux-loss",
        action="store_true",
        help="DeepLabV3 and FCN: their auxiliary classifier's loss too, weighed 0.5, as "
        "torchvision's reference",
    )
    g.add_argument(
        "--unet-width",
        type=flags.at_least_1,
        default=32,
        help="channels of the U-Net's first level",
    )
    g.add_argument(
        "--tta",
        action="store_true",
        help="--predict: average the probabilities over the image and its horizontal, vertical "
        "and both-ways flips",
    )
    flags.add_optimisation_flags(parser.add_argument_group("optimisation"))
    flags.add_output_flags(parser.add_argument_group("output and checkpoints"), RUNS_DIR)
    # torchvision's reference: no warm-up (the demo's recipe has one)
    parser.set_defaults(epochs=50, batch_size=32, lr_scheduler="poly", lr_warmup_epochs=0)
    return parser


def weight_list(text):
    """--class-weights: positive finite numbers separated by commas."""
    try:
        weights = [float(v) for v in text.split(",")]
    except ValueError:
        weights = [math.nan]
    if not all(math.isfinite(w) and w > 0 for w in weights):
        raise argparse.ArgumentTypeError(
            f"must be positive numbers separated by commas, got {text}"
        )
    return weights


def parse_args(argv=None):
    parser = get_args_parser()
    args = flags.parse(parser, argv, DEMO_DEFAULTS)
    if args.scale_range and args.scale_range[0] > args.scale_range[1]:
        low, high = args.scale_range
        parser.error(f"argument --scale-range: must be LO <= HI, got {low:g} {high:g}")
    classes = max(2, args.num_classes)
    if args.ignore_index is not None and args.ignore_index < classes:
        parser.error(
            f"--ignore-index {args.ignore_index} is a class of --num-classes {args.num_classes} "
            f"(0..{classes - 1}); expected a value no class takes, e.g. 255"
        )
    if args.class_weights and len(args.class_weights) != classes:
        parser.error(
            f"--class-weights has {len(args.class_weights)} values; expected {classes}, one per "
            f"class of --num-classes {args.num_classes}"
            + (" (background, foreground)" if args.num_classes == 1 else "")
        )
    # a checkpoint's --arch is known only once it is read (resume.load), and checked there
    if args.aux_loss and args.arch not in AUX_ARCHS and ("arch" in args.given or not args.resume):
        parser.error(
            f"--aux-loss: --arch {args.arch} has no auxiliary classifier; expected one of "
            f"{', '.join(AUX_ARCHS)}"
        )
    if args.weights_backbone and args.arch == "unet":
        parser.error(
            f"--weights-backbone {args.weights_backbone}: --arch unet has no pretrained backbone; "
            f"expected a torchvision --arch"
        )
    return args


def no_data_folder(data):
    return (
        f"--data {data}: no such directory (expected a prepared root with csv_file/, a PNG root "
        f"with Images/ and Masks/ (not s3://), or --data demo)"
    )


if __name__ == "__main__":
    # --help, a bad flag and a --data that is not there answer here, before torch and DALI take
    # seconds to load
    args = parse_args()
    if args.data not in (None, "demo") and "://" not in args.data and not os.path.isdir(args.data):
        print(f"error: {no_data_folder(args.data)}", file=sys.stderr)
        sys.exit(2)

try:  # torchvision's operators and DALI's plugin load against this torch: one line where they don't
    import nvidia.dali.plugin.pytorch  # noqa: F401
    import torch
    import torch.distributed as dist
    import torchvision
    from torch import nn
    from torchvision.transforms.functional import pil_to_tensor
    from torchvision.utils import draw_segmentation_masks, make_grid
except (ImportError, OSError, RuntimeError) as e:
    flags.broken_install(e)
import numpy as np
from PIL import Image

import training
from data_sources import (
    DataError,
    check_finite_pixels,
    check_segmentation_files,
    check_unchanged,
    data_digest,
    decode_errors_named,
    first_gone,
    isdir,
    load_npy,
    read_split,
    remote,
    scan_masks,
    watch,
)
from outputs import atomic_open
from pipelines import (
    SegmentPredictPipeline,
    SegmentTrainPipeline,
    SegmentValPipeline,
    predict_iterator,
    segment_iterator,
)
from training import RunData, UsageError


class UNet(nn.Module):
    """A compact U-Net: four 2x down-samplings, skip connections, bilinear up-sampling."""

    def __init__(self, in_channels, num_classes, width=32):
        super().__init__()
        chans = [width, 2 * width, 4 * width, 8 * width, 8 * width]

        def block(cin, cout):
            return nn.Sequential(
                nn.Conv2d(cin, cout, 3, padding=1, bias=False),
                nn.BatchNorm2d(cout),
                nn.ReLU(True),
                nn.Conv2d(cout, cout, 3, padding=1, bias=False),
                nn.BatchNorm2d(cout),
                nn.ReLU(True),
            )

        self.down = nn.ModuleList(
            [block(in_channels, chans[0])] + [block(a, b) for a, b in zip(chans, chans[1:])]
        )
        self.up = nn.ModuleList(
            [block(chans[i] + chans[i + 1], chans[i]) for i in reversed(range(4))]
        )
        self.head = nn.Conv2d(chans[0], num_classes, 1)

    def forward(self, x):
        skips = []
        for i, block in enumerate(self.down):
            x = block(x if i == 0 else nn.functional.max_pool2d(x, 2))
            skips.append(x)
        for block, skip in zip(self.up, reversed(skips[:-1])):
            x = nn.functional.interpolate(
                x, size=skip.shape[-2:], mode="bilinear", align_corners=False
            )
            x = block(torch.cat([skip, x], dim=1))
        return self.head(x)


class TorchvisionSegmentation(nn.Module):
    """A torchvision segmentation model's main output, and in training its auxiliary classifier's
    where it has one (--aux-loss); 1-channel images are repeated to its 3."""

    def __init__(self, arch, num_classes, aux_loss=False, weights_backbone=None):
        super().__init__()
        self.model = torchvision.models.get_model(
            arch,
            weights=None,
            weights_backbone=weights_backbone,
            num_classes=num_classes,
            aux_loss=aux_loss or None,
        )
        if weights_backbone is None:
            # MobileNetV3's BatchNorm follows its batches with momentum 0.01, set for ImageNet's
            # long runs from pretrained statistics: trained from scratch for a few hundred steps,
            # its running statistics stay near their start, and the model in eval mode segments
            # nothing. torch's default, 0.1, follows the training.
            for layer in self.modules():
                if isinstance(layer, nn.modules.batchnorm._BatchNorm) and layer.momentum < 0.1:
                    layer.momentum = 0.1

    def forward(self, x):
        outputs = self.model(x.expand(-1, 3, -1, -1))
        return outputs if self.training and "aux" in outputs else outputs["out"]


def make_model(args, in_channels):
    if args.arch == "unet":
        return UNet(in_channels, args.num_classes, args.unet_width)
    return torchvision_model(args)


def torchvision_model(args):
    """--arch's torchvision model, its backbone's --weights-backbone downloaded by torchvision."""
    try:
        return TorchvisionSegmentation(
            args.arch, args.num_classes, args.aux_loss, args.weights_backbone
        )
    except (ValueError, KeyError, OSError) as e:  # a name torchvision lacks, or no download
        builder = torchvision.models.get_model_builder(args.arch)
        expected = inspect.signature(builder).parameters["weights_backbone"].default
        raise training.weights_refusal(
            "--weights-backbone", args.weights_backbone, e, expected
        ) from None


def dice_ce_loss(logits, masks, num_classes, ignore_index=None, class_weights=None):
    """Cross-entropy (BCE when binary) plus soft Dice over the foreground classes; pixels of
    ``ignore_index`` count in neither. ``class_weights`` (one per class, binary: background and
    foreground) weigh the cross-entropy as torch's: a mean of the pixels' terms weighed by their
    classes' weights."""
    logits = logits.float()
    keep = kept_pixels(masks, ignore_index)
    classes = masks * keep  # ignored pixels as class 0, kept out of every sum below
    if num_classes == 1:
        target, weight = classes.float(), keep.float()
        if class_weights is not None:
            weight = weight * class_weights[classes]
        bce = nn.functional.binary_cross_entropy_with_logits(logits, target, reduction="none")
        ce, probs = (bce * weight).sum() / weight.sum().clamp(min=1), logits.sigmoid()
    else:
        target = nn.functional.one_hot(classes[:, 0], num_classes).permute(0, 3, 1, 2)[:, 1:]
        ignore = -100 if ignore_index is None else ignore_index  # -100: torch's default, none
        ce = nn.functional.cross_entropy(
            logits, masks[:, 0], weight=class_weights, ignore_index=ignore
        )
        probs = logits.softmax(1)[:, 1:]
    target, probs = target * keep, probs * keep
    overlap, total = (probs * target).sum((0, 2, 3)), probs.sum((0, 2, 3)) + target.sum((0, 2, 3))
    dice = (2 * overlap + 1) / (total + 1)
    return ce + 1 - dice.mean()


def log_coarse_features(args, log):
    """One line where a torchvision model's features, at 1/16 of --size, are a few pixels: small
    objects such as the demo's nails need a larger --size to be learned."""
    side = args.size // 16
    log(
        {"type": "note", "size": args.size},
        f"--arch {args.arch}: segments from features at 1/16 of --size {args.size} ({side} x "
        f"{side}); small objects, as the demo's nails, need --size {SMALLEST_INPUT} or more",
    )


def make_criterion(args, device):
    """dice_ce_loss as the flags set it; with --aux-loss, on the main output plus AUX_WEIGHT x on
    the auxiliary classifier's."""
    weights = torch.tensor(args.class_weights, device=device) if args.class_weights else None
    loss = functools.partial(
        dice_ce_loss,
        num_classes=args.num_classes,
        ignore_index=args.ignore_index,
        class_weights=weights,
    )
    return with_aux(loss) if args.aux_loss else loss


def with_aux(loss):
    """--aux-loss: ``loss`` on the main output plus AUX_WEIGHT x on the auxiliary classifier's."""

    def main_and_aux(outputs, masks):
        return loss(outputs["out"], masks) + AUX_WEIGHT * loss(outputs["aux"], masks)

    return main_and_aux


def kept_pixels(masks, ignore_index):
    """Where ``masks`` hold a class: everywhere but the pixels of ``ignore_index``."""
    if ignore_index is None:
        return torch.ones_like(masks, dtype=torch.bool)
    return masks != ignore_index


def train_one_epoch(model, criterion, state, steps, step_log, epoch, args):
    """One epoch over ``steps``, (step number, (images, masks)) pairs from ``step_log.epoch``, which
    does the rest (log lines, checkpoints, stop signals). Returns the epoch's mean loss."""
    optimizer, scheduler, scaler = state["optimizer"], state["scheduler"], state["scaler"]
    model_ema = state["model_ema"]
    model.train()
    for step, (images, masks) in steps:
        if args.channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        with training.autocast(args, images.device):
            loss = criterion(model(images), masks)
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
        step_log.update(loss, len(masks))
    return step_log.epoch_loss()


@torch.no_grad()
def evaluate(model, batches, args, device):
    """Dice and IoU in percent per class, their mean over the foreground classes and the
    background's apart, from the pixel counts of the whole validation set (all shards), each mask
    scored at its own size; also the first batch's images, masks and predictions at the training
    size, for the overlay."""
    model.eval()
    n = max(2, args.num_classes)
    confusion = torch.zeros(n * n, dtype=torch.float64, device=device)  # (true, predicted) class
    first = None
    for images, masks, own_masks, own_sizes in batches:
        if images.shape[0] == 0:  # a shard one sample short of the others ends on an empty batch
            continue
        if args.channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        with training.autocast(args, device):
            logits = model(images).float()
        confusion += count_at_own_size(logits, own_masks, own_sizes.tolist(), args)
        if first is None:
            pred = classes_of(logits[:4], args.num_classes)
            first = (images[:4].float(), masks[:4, 0], pred)
    confusion = torch.tensor(
        training.all_reduce_sum(confusion.tolist(), device), dtype=torch.float64
    )
    return scores(confusion.view(n, n), args.num_classes), first


def classes_of(logits, num_classes):
    """(B, H, W) classes of (B, C, H, W) scores."""
    return (logits[:, 0] > 0).long() if num_classes == 1 else logits.argmax(1)


def count_at_own_size(logits, own_masks, own_sizes, args):
    """The confusion counts (true * classes + predicted) of a batch, each mask at its own size, as
    the field reports them: its scores resized (bilinear) to the mask's height and width, as a
    prediction is used; pixels of --ignore-index left out."""
    n = max(2, args.num_classes)
    counts = torch.zeros(n * n, dtype=torch.float64, device=logits.device)
    for scores_, own, (height, width, _) in zip(logits, own_masks, own_sizes):
        scores_ = nn.functional.interpolate(
            scores_[None], size=(height, width), mode="bilinear", align_corners=False
        )
        target = own[0, :height, :width].long()  # the rest is the batch's padding
        counted = target * n + classes_of(scores_, args.num_classes)[0]
        counts += torch.bincount(counted[kept_pixels(target, args.ignore_index)], minlength=n * n)
    return counts


def scores(confusion, num_classes):
    """The metrics of an (true, predicted) ``confusion`` matrix of pixel counts."""
    inter, npred, ntarget = confusion.diag(), confusion.sum(0), confusion.sum(1)
    dice = 200 * inter / (npred + ntarget).clamp(min=1)
    iou = 100 * inter / (npred + ntarget - inter).clamp(min=1)
    classes = [1] if num_classes == 1 else list(range(len(dice)))  # binary: the foreground only
    return {
        # the foreground classes' mean: background, most pixels and easy, would flatter it
        "val_dice": dice[1:].mean().item(),
        "val_iou": iou[1:].mean().item(),
        "val_dice_bg": dice[0].item(),
        "val_iou_bg": iou[0].item(),
        "val_dice_per_class": {str(k): dice[k].item() for k in classes},
        "val_iou_per_class": {str(k): iou[k].item() for k in classes},
    }


def validate(state, data, args, world, step_log):
    """(the epoch's validation record, of the model and its EMA; the first batch, for the
    overlay)."""
    model, model_ema = state["model"], state["model_ema"]
    batches = step_log.stoppable(val_batches(data, world))
    metrics, first = evaluate(model, batches, args, world.device)
    if model_ema is not None:
        batches = step_log.stoppable(val_batches(data, world))
        ema_metrics, _ = evaluate(model_ema, batches, args, world.device)
        metrics.update({f"ema_{k}": v for k, v in ema_metrics.items()})
    return metrics, first


def main(args):
    graphs = "reduce-overhead" if args.arch in LAUNCH_BOUND else "default"
    world = training.setup(args, gpu_compile_mode=graphs)  # torchrun's ranks; this process's device
    if args.predict:  # the trained model on new images: no --data, no run folder
        return predict(args, world)
    # its run's flags; --evaluate's and --resume auto's rules (resume.py: a fresh run needs none)
    ckpt = load_checkpoint(args, world) if args.resume or args.evaluate else None
    root = locate_data(args, world)  # builds the demo set or prepares a PNG root, or checks --data
    log = training.open_run(args, world, RUNS_DIR)  # the run folder, locked, and its log
    data = build_loaders(args, world, root, ckpt, log)  # DALI pipelines over this process's shard
    if world.distributed:  # one run on every node: the same flags and data
        training.check_one_run(args, world, data)
    channels = data.train_pipe.channels
    torch.manual_seed(args.seed)  # the model's first weights
    model, state = training.prepare_model(make_model(args, channels), args, world, data.steps, log)
    criterion = make_criterion(args, world.device)  # dice_ce_loss as the flags set it
    if args.arch != "unet" and args.size < SMALLEST_INPUT:
        log_coarse_features(args, log)
    # a new run's first step, or its checkpoint's next
    start = restore(ckpt, args, world, state, data, log, root) if ckpt else training.Start()
    log.begin()  # every check has passed: from here the run folder changes
    if args.evaluate:
        return score(state, data, args, world, log)

    checkpoints = training.Checkpoints(log, state, data, args, world, start.best, channels=channels)
    stop = training.StopSignals(world)  # from here SIGTERM, SIGUSR1 and the others stop the run
    step_log = training.StepLog(args, world, log, checkpoints, stop, data.steps, state["optimizer"])
    first_step, loss_sum = start.step, start.loss_sum
    for epoch in range(start.epoch, args.epochs + 1):
        begun = time.perf_counter()
        # The first epoch reads validation too, a batch a step: a bad file shows at once, yet
        # step 1 waits for none.
        val_beside = val_batches(data, world) if epoch == start.epoch else ()
        batches = training.alongside(train_batches(args, world, data, first_step), val_beside)
        steps = step_log.epoch(batches, epoch, first_step, loss_sum)
        train_loss = train_one_epoch(model, criterion, state, steps, step_log, epoch, args)
        first_step, loss_sum = 0, 0.0
        if world.distributed:
            training.sync_buffers(state["model"], state["model_ema"])
        metrics, first = validate(state, data, args, world, step_log)
        if data.watched:  # an s3:// object replaced under the run: stop before the epoch is saved
            check_unchanged(data.watched)
        path = checkpoints.save(epoch, data.steps, score=metrics["val_dice"])
        if world.main:
            save_overlay(
                os.path.join(log.dir, f"val_epoch{epoch:03d}.png"), *first, args.num_classes
            )
        log.epoch_end(epoch, data.steps, train_loss, metrics, time.perf_counter() - begun)
        if signum := stop.agree()[0]:  # a signal during the epoch's last validation batches
            stop.exit(signum, path, epoch, data.steps)
    log.close("val_dice", checkpoints.best)


def load_checkpoint(args, world):
    """--resume's or --evaluate's checkpoint (resume.load), or None for a fresh --resume auto."""
    flags.require("--resume" if args.resume else "--evaluate", "resume")
    import resume

    return resume.load(args, world)


def restore(ckpt, args, world, state, data, log, root):
    """Where a checkpoint's run goes on (resume.restore), ``state`` loaded from it."""
    import resume

    build = functools.partial(train_loader, root=root)
    return resume.restore(ckpt, args, world, state, data, log, build)


def score(state, data, args, world, log):
    """--evaluate: the checkpoint's model (with --model-ema, its EMA) on the validation set."""
    ema = state["model_ema"]
    scored = ema if ema is not None else state["model"]
    metrics, _ = evaluate(scored, val_batches(data, world), args, world.device)
    log({"type": "eval", **metrics, "ema": ema is not None})


def save_overlay(path, images, masks, preds, num_classes):
    """A PNG of a validation batch: a row per image (any normalization, 1 or 3 channels), in three
    columns: the image, its ground truth ``masks`` drawn on it, its predictions ``preds`` drawn on
    it ((B, H, W) class indices); each foreground class in its colour of class_colors, the same in
    both (README.md says which), the background bare."""
    # Each image stretched to 0..255 on its own: right for any normalization and channel count.
    low, high = images.amin(dim=(1, 2, 3), keepdim=True), images.amax(dim=(1, 2, 3), keepdim=True)
    images = (255 * (images - low) / (high - low).clamp(min=1e-6)).to(torch.uint8)
    images = images.expand(-1, 3, -1, -1).cpu()
    shown = torch.arange(1, max(2, num_classes))[:, None, None]  # the foreground classes
    colors = class_colors(num_classes)[1:]
    tiles = []
    for image, mask, pred in zip(images, masks.cpu(), preds.cpu()):
        tiles.append(image)
        for labels in (mask, pred):
            tiles.append(
                draw_segmentation_masks(image, labels[None] == shown, alpha=0.45, colors=colors)
            )
    grid = make_grid(tiles, nrow=3, padding=4).permute(1, 2, 0).numpy()
    with atomic_open(path) as f:
        Image.fromarray(grid).save(f, format="png")


# ------------------------------------------------------------------------------------------
# --predict: the trained model on new images
# ------------------------------------------------------------------------------------------


@torch.no_grad()
def predict(args, world):
    """--predict DIR: every PNG or JPEG under DIR segmented at its own size, written as a palette
    PNG of class indices in --output-dir (DIR's subfolders mirrored, x.jpg as x.png), and the image
    beside it with the classes drawn over it under --output-dir/overlays/. Under torchrun each
    process predicts its share of the images."""
    # only --predict needs these (data_processing.py: save_prediction's 16-bit PNGs): imported here
    flags.require("--predict", "predict", "resume", "data_processing")
    from predict import (
        checkpoint_to_predict,
        images_to_predict,
        load_to_predict,
        mark_outputs,
        refuse_overwrite,
    )

    ckpt = checkpoint_to_predict(args, world)
    files = images_to_predict(args, world)
    masks, overlays = prediction_paths(args, files, ""), prediction_paths(args, files, "overlays")
    refuse_overwrite(args, zip(masks + overlays, files + files))
    channels = trained_channels(ckpt)
    model = load_to_predict(make_model(args, channels), ckpt, args, world)
    pipe = SegmentPredictPipeline(
        args.batch_size,
        args.workers,
        world.local_rank if args.dali_device == "gpu" else None,
        args.predict,
        files,
        size=args.size,
        channels=channels,
        shard_id=world.rank,
        num_shards=world.size,
    )
    colors = class_colors(args.num_classes)
    threshold = 0.5 if args.tta else 0.0  # binary: on a probability, or on a logit
    with decode_errors_named(pipe):  # a file DALI cannot decode: one line naming it
        for batch in predict_iterator(pipe):
            images = batch[0]["image"].to(world.device)
            with training.autocast(args, world.device):
                scores = predicted_scores(model, images, args).float()
            for score, shape, k in zip(scores, batch[0]["shape"], batch[0]["index"].flatten()):
                # bilinear, as the U-Net up-samples: each image's own (height, width)
                score = nn.functional.interpolate(
                    score[None], size=shape[:2].tolist(), mode="bilinear"
                )
                pred = score[0].argmax(0) if args.num_classes > 1 else score[0, 0] > threshold
                save_prediction(masks[k], overlays[k], files[k], pred.to(torch.uint8), colors)
            if world.main:
                mark_outputs(args.output_dir)
    if world.main:
        print(f"--predict: {len(files)} images of {args.predict} into {args.output_dir}")


def predicted_scores(model, images, args):
    """The model's logits; with --tta the mean of its probabilities (softmax, sigmoid when binary)
    over the images and their horizontal, vertical and both-ways flips, each flipped back: with
    both-ways (as nnU-Net's mirroring) a flipped image gets exactly the flipped prediction."""
    if not args.tta:
        return model(images)
    probabilities = (
        torch.sigmoid if args.num_classes == 1 else functools.partial(torch.softmax, dim=1)
    )
    flips = ([], [3], [2], [2, 3])  # none, horizontal, vertical, both
    return sum(probabilities(model(images.flip(d)).float()).flip(d) for d in flips) / len(flips)


def trained_channels(ckpt):
    """The image channels the model trained on: its checkpoint says; an older checkpoint's U-Net
    its first convolution; a torchvision model takes 3."""
    first = ckpt["model"].get("down.0.0.weight")
    return ckpt.get("channels") or (first.shape[1] if first is not None else 3)


def prediction_paths(args, files, folder):
    """For each of ``files`` under --predict DIR, --output-dir/``folder``/<its path in DIR>.png."""
    return [
        os.path.join(
            args.output_dir, folder, os.path.splitext(os.path.relpath(f, args.predict))[0] + ".png"
        )
        for f in files
    ]


def class_colors(num_classes):
    """An RGB colour per class: black for the background (0), the foreground classes evenly apart
    in hue, from green (save_overlay's and --predict's)."""
    classes = max(2, num_classes) - 1
    hues = [(1 / 3 + k / classes) % 1 for k in range(classes)]
    return [(0, 0, 0)] + [tuple(round(255 * c) for c in colorsys.hsv_to_rgb(h, 1, 1)) for h in hues]


def save_prediction(mask_path, overlay_path, source, pred, colors):
    """``pred`` (H, W) class indices as a palette PNG, and beside ``source``'s image (8-bit RGB, as
    DALI decodes it) that image with the foreground classes drawn over it."""
    from data_processing import eight_bits  # a 16-bit PNG as DALI's decoder reads it
    from predict import written

    mask = Image.fromarray(pred.cpu().numpy())
    mask.putpalette([value for color in colors for value in color])  # "L" becomes "P"
    with Image.open(source) as im:
        image = pil_to_tensor(eight_bits(im).convert("RGB"))
    shown = torch.arange(1, len(colors))[:, None, None]
    drawn = draw_segmentation_masks(image, pred.cpu() == shown, alpha=0.45, colors=colors[1:])
    overlay = Image.fromarray(torch.cat([image, drawn], dim=2).permute(1, 2, 0).numpy())
    for path, picture in ((mask_path, mask), (overlay_path, overlay)):
        with written(path) as f:
            picture.save(f, format="png")


# ------------------------------------------------------------------------------------------
# main's phases: the data
# ------------------------------------------------------------------------------------------


def locate_data(args, world):
    """The prepared root (csv_file/ inside) of --data, or the demo set's or a PNG root's, prepared
    first (prepare_data)."""
    local = not remote(args.data)  # a URL of another scheme: refused here, named
    if args.data != "demo" and isdir(os.path.join(args.data, "csv_file")):
        return args.data
    return prepare_data(args, world, local)


def prepare_data(args, world, local):
    """--data demo or a ``local`` PNG root (Images/, Masks/) prepared as .npy pairs and split CSVs,
    once per node (an s3:// prefix holds a prepared root: data_processing writes locally); any
    other --data is refused."""
    if args.data != "demo" and not (local and os.path.isdir(args.data)):
        raise UsageError(no_data_folder(args.data))
    flags.require(f"--data {args.data}", "data_processing")
    from data_processing import prepare  # needed only to build or convert a PNG set

    root = DEMO_DIR if args.data == "demo" else args.data
    if world.local_rank == 0:  # one process per node prepares the data, the others wait
        prepared = prepare(root, demo=root == DEMO_DIR, ignore_index=args.ignore_index)
    if world.distributed:
        dist.barrier()
        prepared = prepare(root, ignore_index=args.ignore_index)  # finds what the first made
    return prepared


def build_loaders(args, world, root, ckpt, log):
    """The pipelines (shard RANK of WORLD_SIZE, on GPU LOCAL_RANK or the CPU) over the prepared
    ``root``, their iterators, and what the run knows of its data (training.RunData); checks the
    files first, and the masks' values."""
    if ckpt:  # a checkpoint's run: main imported resume.py for it
        import resume

    dali_state, first_epoch = resume.pipeline_state(ckpt, args, world) if ckpt else (None, 1)
    splits = {split: read_split(root, split) for split in ("train", "valid")}
    (train_imgs, train_lbls), (val_imgs, val_lbls) = splits["train"], splits["valid"]
    check_files(args, world, splits)
    if args.ignore_index is not None:
        check_ignore_index(args, root, train_imgs, train_lbls)
    train_pipe = train_pipeline(args, world, dali_state, first_epoch, train_imgs, train_lbls)
    # Also the masks as read, to score each at its own size.
    val_pipe = SegmentValPipeline(
        args.batch_size,
        imgs=val_imgs,
        lbls=val_lbls,
        own_size_masks=True,
        **pipeline_settings(args, world),
    )
    check_mask_values(args, world, root, splits)
    train_loader = segment_iterator(train_pipe)
    log(
        {
            "type": "start",
            "output_dir": log.dir,
            "data": root,
            "train_samples": len(train_imgs),
            "val_samples": len(val_imgs),
            "channels": train_pipe.channels,
        }
    )
    # what the run reads, for the checkpoints the main process writes; scoring one needs none
    on_main = world.main and not args.evaluate
    return RunData(
        train_pipe,
        val_pipe,
        train_loader,
        segment_iterator(val_pipe),
        steps=len(train_loader),  # the same on every process: every shard runs as many full batches
        classes=[str(k) for k in range(args.num_classes)],
        num_samples=len(train_imgs),
        digest=data_digest(root, train_pipe.files),  # every process's: check_one_run compares them
        watched=[watch(root, train_pipe.files + val_pipe.files)]
        if on_main and remote(root)
        else [],
        first_epoch=first_epoch,
    )


def pipeline_settings(args, world, first_epoch=1):
    """What the training and validation pipelines share: shard RANK of WORLD_SIZE, on GPU
    LOCAL_RANK or the CPU; ``first_epoch``: the training pipeline's (its seed, see
    training.pipeline_seed)."""
    return dict(
        num_threads=args.workers,
        device_id=world.local_rank if args.dali_device == "gpu" else None,
        size=(args.size, args.size),
        shard_id=world.rank,
        num_shards=world.size,
        seed=training.pipeline_seed(args, world, first_epoch),
    )


def train_pipeline(args, world, dali_state, first_epoch, imgs, lbls):
    """The training pipeline, restored from ``dali_state`` (each process's, or None), starting
    with ``first_epoch`` (see resume.pipeline_state)."""
    return SegmentTrainPipeline(
        args.batch_size,
        imgs=imgs,
        lbls=lbls,
        # Checkpointing (reader position, random states) costs nothing until asked.
        enable_checkpointing=True,
        checkpoint=dali_state[world.rank] if dali_state else None,
        scale_range=args.scale_range,
        # padding is left out of the loss where there is a class to ignore, else background
        mask_pad=0 if args.ignore_index is None else args.ignore_index,
        **pipeline_settings(args, world, first_epoch),
    )


def train_loader(args, world, dali_states, first_epoch, root):
    """A training iterator of a checkpoint's run, as it was built, for resume.RestOfEpoch."""
    imgs, lbls = read_split(root, "train")
    return segment_iterator(train_pipeline(args, world, dali_states, first_epoch, imgs, lbls))


def check_files(args, world, splits):
    """Each split's files as DALI must find them, from their headers (check_segmentation_files),
    and this process's share of float images free of NaN and infinity: DALI reads them unchecked."""
    for imgs, lbls in splits.values():
        (_, image_dtype), _ = check_segmentation_files(imgs, lbls)
        if image_dtype.kind == "f":
            check_finite_pixels(imgs[world.rank :: world.size], args.workers)


def check_mask_values(args, world, root, splits):
    """Each process reads its share of the masks: a class index beyond the model's is an error
    (--ignore-index's value aside), and so are training masks that hold no class but the
    background: nothing to learn (with --ignore-index 255 on binary masks of 0 and 255, say)."""
    largest = max(1, args.num_classes - 1)
    for split, (_, lbls) in splits.items():
        mine = lbls[world.rank :: world.size]
        found, foreground = scan_masks(mine, largest, args.workers, args.ignore_index)
        if found:
            raise class_beyond_model(args, *found)
        if split == "train":
            (learned,) = training.all_reduce_sum([foreground], world.device)
    if not learned:
        raise nothing_to_learn(args, root)


def class_beyond_model(args, path, value):
    """check_mask_values' error for a mask at ``path`` whose largest class, ``value``, is beyond
    the model's: every such value is named (a PNG mask of 0, 128 and 255 is no binary one, and its
    128 is the cause)."""
    kept = max(1, args.num_classes - 1)
    beyond = [int(v) for v in np.unique(load_npy(path)) if kept < v != args.ignore_index]
    expected = f"below --num-classes {args.num_classes}"
    if args.num_classes == 1:
        expected = "0 or 1 (binary, --num-classes 1; a PNG root reads 255 as 1)"
    if len(beyond) > 1:
        shown = ", ".join(map(str, beyond[:8])) + (", ..." if len(beyond) > 8 else "")
        return DataError(f"{path}: mask holds classes {shown}; expected values {expected}")
    return DataError(
        f"{path}: mask holds class {value}; expected values {expected}, or --ignore-index "
        f"{value} if that value marks pixels to leave out"
    )


def nothing_to_learn(args, root):
    """check_mask_values' error for training masks that hold only the background."""
    if args.ignore_index is None:
        return DataError(
            f"{root}: no training mask holds a class above the background (0): nothing to learn"
        )
    return DataError(
        f"{root}: no training mask holds a class above the background once --ignore-index "
        f"{args.ignore_index} is left out: nothing to learn; for binary masks of 0 and "
        f"{args.ignore_index}, pass no --ignore-index (a PNG root then reads {args.ignore_index} "
        f"as class 1; .npy masks need 0 and 1)"
    )


def check_ignore_index(args, root, imgs, lbls):
    """--ignore-index fills the masks where a training crop pads them: a value their type holds
    (DALI hands out uint8 masks as they are, the others as int32)."""
    _, (_, dtype) = check_segmentation_files(imgs, lbls)  # (shape, dtype), from the headers
    highest = 255 if dtype.name in ("uint8", "bool") else 2**31 - 1
    if args.ignore_index > highest:
        raise UsageError(
            f"--ignore-index {args.ignore_index}: the masks of {root} are {dtype}, "
            f"which hold values up to {highest}; expected a value in "
            f"[{max(2, args.num_classes)}, {highest}] (no class takes it)"
        )


def train_batches(args, world, data, first_step):
    """The rest of the epoch's training batches: DALI's, or --loader synthetic's."""
    if args.loader == "dali":
        return batches_on_device(data.train_source(), data.train_pipe.files, world.device)
    return synthetic_batches(args, world, data, first_step)


def synthetic_batches(args, world, data, first_step):
    """--loader synthetic: one random batch already on the device, every step (the ceiling for
    any loader)."""
    shape = (args.batch_size, data.train_pipe.channels, args.size, args.size)
    images = torch.randn(shape, device=world.device)
    classes = max(2, args.num_classes)
    masks = torch.randint(
        0, classes, (args.batch_size, 1, args.size, args.size), device=world.device
    )
    return [(images, masks)] * (data.steps - first_step)


def val_batches(data, world):
    """Every validation batch of this process's shard, on its device, with the masks as read."""
    return batches_on_device(data.val_loader, data.val_pipe.files, world.device)


def batches_on_device(loader, files, device):
    """(images, masks) of each batch on ``device``; a validation loader's with its own-size masks
    and their sizes after them. DALI's error over one of ``files`` deleted under the run becomes
    one line naming it."""
    try:
        for batch in loader:
            images, masks, *own = (t.to(device, non_blocking=True) for t in batch[0].values())
            yield images, masks.long(), *own
    except RuntimeError:
        if gone := first_gone(files):
            raise DataError(f"{gone}: gone since this run listed it") from None
        raise


if __name__ == "__main__":
    training.run_main(main, args)  # a UsageError or DataError: one `error:` line, exit 2
