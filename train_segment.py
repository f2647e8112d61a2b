"""Train a segmentation model with DALI feeding PyTorch directly: image + mask .npy pairs in lock-step.

    python train_segment.py --data demo                    # builds a synthetic nail set (no download), trains on it
    python train_segment.py --data data/nails_png          # a PNG root (Images/, Masks/): prepared into data/nails_png/npy
    python train_segment.py --data data/nails --amp bf16 --channels-last    # a prepared root (csv_file/ inside)
    torchrun --nproc_per_node=8 train_segment.py --data data/nails --amp bf16 --channels-last
    python train_segment.py --data data/nails --resume runs/segment/checkpoint.pth --evaluate

DALI reads each image and its mask with two readers that share seed, shuffle and sharding, resizes
the image linearly and the mask with nearest neighbour to --size, flips both alike and applies
noise, blur, brightness and contrast to the image only: on the GPU when there is one, else on the
CPU. --num-classes 1 is binary (BCE + Dice); 2 or more use cross-entropy + Dice. Each epoch logs
val Dice and IoU per class and their mean and writes a PNG of predictions beside metrics.jsonl,
checkpoint.pth and best.pth in --output-dir.
"""

import argparse
import os
import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial

import numpy as np
import torch
import torchvision
from torch import nn
from torchvision.utils import draw_segmentation_masks, make_grid, save_image

import training
from data_processing import make_demo_pngs, prepare, read_split
from pipelines import IMAGENET_MEAN, IMAGENET_STD, DataError, fetch_dali_loader
from training import UsageError


class DiceCELoss(nn.Module):
    """Cross-entropy (BCE when binary) plus soft Dice over the foreground classes."""

    def __init__(self, num_classes):
        super().__init__()
        self.num_classes = num_classes

    def forward(self, logits, masks):
        logits = logits.float()
        if self.num_classes == 1:
            target = masks.float()
            ce = nn.functional.binary_cross_entropy_with_logits(logits, target)
            probs = logits.sigmoid()
        else:
            target = nn.functional.one_hot(masks[:, 0].long(), self.num_classes).permute(0, 3, 1, 2).float()
            ce = nn.functional.cross_entropy(logits, masks[:, 0].long())
            probs, target = logits.softmax(1)[:, 1:], target[:, 1:]
        dims = (0, 2, 3)
        dice = (2 * (probs * target).sum(dims) + 1) / (probs.sum(dims) + target.sum(dims) + 1)
        return ce + 1 - dice.mean()


def predict(logits, num_classes):
    """Class index per pixel, (B, H, W)."""
    return (logits[:, 0] > 0).long() if num_classes == 1 else logits.argmax(1)


@torch.no_grad()
def evaluate(model, batches, args, dist):
    """Dice and IoU in percent per class and their mean, over the whole validation set (all shards).

    Counts are summed over every pixel of the set before dividing. Binary runs report the
    foreground class; others report every class. Also returns the first batch's images, masks and
    predictions for the overlay.
    """
    model.eval()
    classes = [1] if args.num_classes == 1 else list(range(args.num_classes))
    stats = torch.zeros(len(classes), 3, dtype=torch.float64, device=dist.device)  # intersection, pred, target
    first = None
    for images, masks in batches:
        if images.shape[0] == 0:  # a shard one sample short of the others (see training.train_one_epoch)
            continue
        if args.channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        with training.autocast(args, dist.device):
            logits = model(images)
        pred, target = predict(logits, args.num_classes), masks[:, 0].long()
        for row, c in enumerate(classes):
            p, t = pred == c, target == c
            stats[row] += torch.stack([(p & t).sum(), p.sum(), t.sum()]).double()
        if first is None:
            first = (images[:4].float(), target[:4], pred[:4])
    inter, npred, ntarget = torch.tensor(training.all_reduce_sum(stats.flatten().tolist(), dist),
                                         dtype=torch.float64).view(-1, 3).T
    dice = (100 * 2 * inter / (npred + ntarget).clamp(min=1)).tolist()
    iou = (100 * inter / (npred + ntarget - inter).clamp(min=1)).tolist()
    metrics = {"val_dice": sum(dice) / len(dice), "val_iou": sum(iou) / len(iou),
               "val_dice_per_class": dict(zip(map(str, classes), dice)),
               "val_iou_per_class": dict(zip(map(str, classes), iou))}
    return metrics, first


def save_overlay(path, images, masks, preds, num_classes):
    """A grid with one row per image: ground truth drawn on it, then the prediction."""
    mean = torch.tensor(IMAGENET_MEAN, device=images.device)[:, None, None]
    std = torch.tensor(IMAGENET_STD, device=images.device)[:, None, None]
    images = (images * std + mean).clamp(0, 255).to(torch.uint8).cpu()
    classes = torch.arange(1, max(2, num_classes))[:, None, None]  # foreground classes; background stays bare
    palette = ["#00ff00", "#ff00ff", "#00ffff", "#ffff00", "#ff8000", "#0080ff"]
    colors = [palette[i % len(palette)] for i in range(len(classes))]
    tiles = []
    for image, mask, pred in zip(images, masks.cpu(), preds.cpu()):
        for labels in (mask, pred):
            tiles.append(draw_segmentation_masks(image, labels[None] == classes, alpha=0.45, colors=colors))
    tmp = f"{path}.tmp-{os.getpid()}.png"
    save_image(make_grid(tiles, nrow=2, padding=4).float() / 255, tmp)
    os.replace(tmp, path)


# ------------------------------------------------------------------------------------------
# data
# ------------------------------------------------------------------------------------------

DEMO_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), ".cache", "demo-segment-v1")


def check_mask_values(lbls, num_classes, workers):
    """Every mask's largest value is a class index below --num-classes (at most 1 when binary)."""
    limit = max(1, num_classes - 1)

    def largest(path):
        return int(np.load(path, mmap_mode="r").max())

    with ThreadPoolExecutor(workers) as pool:
        for path, value in zip(lbls, pool.map(largest, lbls)):
            if value > limit:
                expected = "0 or 1 (binary, --num-classes 1)" if num_classes == 1 else f"below --num-classes {num_classes}"
                raise DataError(f"{path}: mask holds class {value}; expected values {expected}")


def segment_batches(loader, device):
    for batch in loader:
        yield batch[0]["image"].to(device, non_blocking=True), batch[0]["mask"].to(device, non_blocking=True)


def dali_loaders(args, dist, device_id):
    splits = {split: read_split(args.data, split) for split in ("train", "valid")}
    for imgs, lbls in splits.values():
        check_mask_values(lbls, args.num_classes, args.workers)
    common = dict(num_threads=args.workers, device_id=device_id, size=(args.size, args.size), shard_id=dist.rank,
                  num_shards=dist.world_size, seed=args.seed + dist.rank)
    train_loader = fetch_dali_loader(*splits["train"], args.batch_size, "train", **common)
    val_loader = fetch_dali_loader(*splits["valid"], args.batch_size, "eval", **common)
    return (lambda: segment_batches(train_loader, dist.device), len(train_loader),
            lambda: segment_batches(val_loader, dist.device))


class UNet(nn.Module):
    """A compact U-Net: four 2x down-samplings, skip connections, bilinear up-sampling."""

    def __init__(self, num_classes, width=32):
        super().__init__()
        chans = [width, 2 * width, 4 * width, 8 * width, 8 * width]

        def block(cin, cout):
            return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(True),
                                 nn.Conv2d(cout, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(True))

        self.down = nn.ModuleList([block(3, chans[0])] + [block(a, b) for a, b in zip(chans, chans[1:])])
        self.up = nn.ModuleList([block(chans[i] + chans[i + 1], chans[i]) for i in reversed(range(4))])
        self.head = nn.Conv2d(chans[0], num_classes, 1)

    def forward(self, x):
        skips = []
        for i, block in enumerate(self.down):
            x = block(x if i == 0 else nn.functional.max_pool2d(x, 2))
            skips.append(x)
        skips.pop()
        for block in self.up:
            skip = skips.pop()
            x = nn.functional.interpolate(x, size=skip.shape[-2:], mode="bilinear", align_corners=False)
            x = block(torch.cat([skip, x], dim=1))
        return self.head(x)


class TorchvisionSegmentation(nn.Module):
    """A torchvision segmentation model returning its main output as a tensor."""

    def __init__(self, arch, num_classes):
        super().__init__()
        self.model = torchvision.models.get_model(arch, weights=None, weights_backbone=None, num_classes=num_classes)

    def forward(self, x):
        return self.model(x)["out"]


ARCHS = ["unet", "lraspp_mobilenet_v3_large", "deeplabv3_mobilenet_v3_large", "deeplabv3_resnet50", "fcn_resnet50"]


def make_model(args):
    if args.arch == "unet":
        return UNet(args.num_classes, args.unet_width)
    return TorchvisionSegmentation(args.arch, args.num_classes)


# ------------------------------------------------------------------------------------------
# main
# ------------------------------------------------------------------------------------------


def main(args):
    training.check_args(args)
    if args.num_classes < 1:
        raise UsageError(f"--num-classes must be at least 1 (1 = binary), got {args.num_classes}")
    if args.size % 32:
        raise UsageError(f"--size must be a multiple of 32 (the models down-sample by up to 32), got {args.size}")
    dist = training.init_distributed()
    device_id = training.dali_device_id(args, dist)
    with training.main_process_first(dist):
        if args.data == "demo":
            make_demo_pngs(DEMO_DIR)
            args.data = DEMO_DIR
        if not os.path.isdir(args.data):
            raise UsageError(f"--data {args.data}: no such directory (expected a prepared root with csv_file/, "
                             f"a PNG root with Images/ and Masks/, or --data demo)")
        args.data = prepare(args.data)
    torch.manual_seed(args.seed)
    log = training.Log(args.output_dir, dist)

    train_batches, steps, val_batches = dali_loaders(args, dist, device_id)
    if args.loader == "synthetic":
        batch = (torch.randn(args.batch_size, 3, args.size, args.size, device=dist.device),
                 torch.randint(0, max(2, args.num_classes), (args.batch_size, 1, args.size, args.size),
                               dtype=torch.uint8, device=dist.device))
        train_batches = partial(training.synthetic_batches, batch, steps)
    model, model_without_ddp = training.prepare_model(make_model(args), args, dist)
    criterion = DiceCELoss(args.num_classes)
    optimizer, scheduler, lr = training.make_optimizer(model, args, dist, steps)
    scaler = training.make_scaler(args, dist.device)
    start_epoch, best = training.resume(args, model_without_ddp, optimizer, scheduler, scaler)
    log.info(f"{args.arch} for {args.num_classes} classes from {args.data}; " + training.describe(args, dist, steps, lr))

    if args.evaluate:
        metrics, first = evaluate(model_without_ddp, val_batches(), args, dist)
        log.write({"type": "eval", **metrics}, f"Test: Dice {metrics['val_dice']:.3f} IoU {metrics['val_iou']:.3f}")
        return
    # Validation runs the unwrapped model: its forward passes need no collective, so shards may differ.
    for epoch in range(start_epoch, args.epochs + 1):
        start = time.perf_counter()
        train_loss = training.train_one_epoch(model, criterion, optimizer, scheduler, scaler, train_batches(), steps,
                                              epoch, args, dist, log)
        metrics, first = evaluate(model_without_ddp, val_batches(), args, dist)
        epoch_time = time.perf_counter() - start
        is_best, best = metrics["val_dice"] > best, max(metrics["val_dice"], best)
        if dist.is_main:
            training.save_checkpoint(args.output_dir, model_without_ddp, optimizer, scheduler, scaler, epoch, args,
                                     best, is_best, {})
            save_overlay(os.path.join(args.output_dir, f"val_epoch{epoch:03d}.png"), *first, args.num_classes)
        log.write({"type": "epoch", "epoch": epoch, "train_loss": train_loss, **metrics, "epoch_time": epoch_time},
                  f"Epoch {epoch}: val Dice {metrics['val_dice']:.3f} IoU {metrics['val_iou']:.3f}  "
                  f"train loss {train_loss:.4f}  time {epoch_time:.1f}s")


DEMO_DEFAULTS = dict(epochs=6, batch_size=8, lr=2.0, size=96, unet_width=16, print_freq=5, output_dir="runs/segment-demo",
                     workers=min(4, os.cpu_count() or 1))


def get_args_parser(add_help=True):
    parser = argparse.ArgumentParser(description="Semantic segmentation on DALI", add_help=add_help,
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    g = parser.add_argument_group("data and model")
    g.add_argument("--data", required=True,
                   help="prepared root (csv_file/train.csv, valid.csv), PNG root (Images/, Masks/: prepared into "
                        "<root>/npy on first use), or 'demo' for a built-in synthetic set (demo also changes the "
                        "defaults to: " + ", ".join(f"--{k.replace('_', '-')} {v}" for k, v in DEMO_DEFAULTS.items())
                        + ")")
    g.add_argument("--arch", default="unet", choices=ARCHS, help="the compact U-Net of this file, or a torchvision model")
    g.add_argument("--unet-width", type=int, default=32, help="channels of the U-Net's first level (doubling below)")
    g.add_argument("--num-classes", type=int, default=1, help="1 = binary (BCE + Dice); 2 or more: cross-entropy + Dice")
    g.add_argument("--size", type=int, default=384, help="side of the square training and validation input")
    g.add_argument("--loader", choices=["dali", "synthetic"], default="dali",
                   help="dali; synthetic: one random batch already on the device trains every step (the speed "
                        "ceiling; validation still reads --data with DALI)")
    training.add_training_args(parser, dict(epochs=50, batch_size=32, lr=0.1, output_dir="runs/segment",
                                            lr_warmup_epochs=1))
    return parser


if __name__ == "__main__":
    training.run(main, training.parser_with_demo_defaults(get_args_parser, DEMO_DEFAULTS))
