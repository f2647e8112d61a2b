"""Train an ImageNet-style classifier with DALI feeding PyTorch directly.

    python train_classify.py --data demo                  # builds a small demo set (no download), trains on it
    python train_classify.py --data /data/imagenet --amp bf16 --channels-last       # train/ and val/ inside
    torchrun --nproc_per_node=8 train_classify.py --data /data/imagenet --amp bf16 --channels-last
    python train_classify.py --data demo --dali-device cpu  # DALI CPU-only (what runs without a GPU)
    python train_classify.py --data /data/imagenet --resume runs/classify/checkpoint.pth --evaluate

On a GPU, DALI decodes JPEGs with nvJPEG (mixed decode) and augments on the GPU, so batches arrive
normalized on the device. Without a GPU every DALI operator runs on the CPU and training does too.
Under torchrun each process reads shard RANK of WORLD_SIZE on GPU LOCAL_RANK. Each epoch logs
val top-1/top-5; metrics.jsonl, checkpoint.pth and best.pth go to --output-dir.
"""

import argparse
import difflib
import os
import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial

import numpy as np
import torch
import torchvision
from PIL import Image, ImageDraw

import training
from pipelines import DEFAULT_HW_DECODER_LOAD, ClassifyTrainPipeline, ClassifyValPipeline, DataError, classify_iterator
from training import UsageError


@torch.no_grad()
def evaluate(model, batches, args, dist):
    """Top-1 and top-5 accuracy in percent over the whole validation set (all shards)."""
    model.eval()
    correct1 = correct5 = count = 0
    for images, labels in batches:
        if images.shape[0] == 0:  # a shard one sample short of the others (see training.train_one_epoch)
            continue
        if args.channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        with training.autocast(args, dist.device):
            logits = model(images)
        top5 = logits.topk(min(5, logits.shape[1]), dim=1).indices
        hits = top5 == labels[:, None]
        correct1 += hits[:, 0].sum()
        correct5 += hits.any(dim=1).sum()
        count += labels.shape[0]
    correct1, correct5, count = training.all_reduce_sum([float(correct1), float(correct5), count], dist)
    return 100 * correct1 / count, 100 * correct5 / count


# ------------------------------------------------------------------------------------------
# data
# ------------------------------------------------------------------------------------------

DEMO_CLASSES = ["circle", "square", "triangle", "ring", "cross", "stripes"]
DEMO_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), ".cache", "demo-classify-v1")


def _demo_image(k, rng):
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

    def polygon(n, radius=r, phase=angle):
        return [(cx + radius * np.cos(phase + 2 * np.pi * i / n), cy + radius * np.sin(phase + 2 * np.pi * i / n))
                for i in range(n)]

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

    Built in a temporary folder and renamed into place, so an interrupted build is never used.
    """
    if os.path.isdir(root):
        return root
    tmp = f"{root}.tmp-{os.getpid()}"
    for s, (split, count) in enumerate((("train", train_per_class), ("val", val_per_class))):
        for k, name in enumerate(DEMO_CLASSES):
            os.makedirs(os.path.join(tmp, split, name))
            for i in range(count):
                rng = np.random.default_rng([seed, s, k, i])
                _demo_image(k, rng).save(os.path.join(tmp, split, name, f"{i:04d}.jpg"), quality=90)
    os.rename(tmp, root)
    return root


def find_undecodable(files):
    """The first file that PIL cannot fully decode, or None; searched in parallel."""
    def broken(path):
        try:
            with Image.open(path) as im:
                im.load()
            return None
        except Exception:
            return path

    with ThreadPoolExecutor(min(16, os.cpu_count() or 1)) as pool:
        return next((p for p in pool.map(broken, files) if p is not None), None)


def dali_batches(loader, device, files):
    """(images, labels) on ``device``; a file DALI cannot decode ends the run naming that file."""
    try:
        for batch in loader:
            yield (batch[0]["data"].to(device, non_blocking=True),
                   batch[0]["label"].squeeze(-1).long().to(device, non_blocking=True))
    except RuntimeError as e:
        if "decoders" not in str(e):
            raise
        culprit = find_undecodable(files)
        where = f"{culprit}: cannot decode this image" if culprit else "an image could not be decoded"
        raise DataError(f"{where} (DALI: {str(e).splitlines()[-1].strip()}); remove or replace it") from None


def torch_batches(loader, device):
    for images, labels in loader:
        yield images.to(device, non_blocking=True), labels.to(device, non_blocking=True)


def check_data(data):
    for split in ("train", "val"):
        if not os.path.isdir(os.path.join(data, split)):
            raise UsageError(f"--data {data}: expected ImageFolder subfolders train/ and val/ in it "
                             f"(or --data demo for the built-in demo set)")


def dali_loaders(args, dist, device_id):
    common = dict(num_threads=args.workers, device_id=device_id, crop_size=args.crop_size, shard_id=dist.rank,
                  num_shards=dist.world_size, seed=args.seed + dist.rank, hw_decoder_load=args.hw_decoder_load)
    train = ClassifyTrainPipeline(args.batch_size, data_dir=os.path.join(args.data, "train"), **common)
    val = ClassifyValPipeline(args.batch_size, data_dir=os.path.join(args.data, "val"),
                              resize_size=args.val_resize_size, **common)
    train_loader, val_loader = classify_iterator(train), classify_iterator(val)
    return (lambda: dali_batches(train_loader, dist.device, train.files), len(train_loader),
            lambda: dali_batches(val_loader, dist.device, val.files), train.classes)


def torch_loaders(args, dist):
    """torchvision ImageFolder + DataLoader with the transforms DALI applies, for A/B comparison."""
    from torchvision import transforms as T
    normalize = T.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])
    train = torchvision.datasets.ImageFolder(os.path.join(args.data, "train"), T.Compose([
        T.RandomResizedCrop(args.crop_size), T.RandomHorizontalFlip(), T.ToTensor(), normalize]))
    val = torchvision.datasets.ImageFolder(os.path.join(args.data, "val"), T.Compose([
        T.Resize(args.val_resize_size), T.CenterCrop(args.crop_size), T.ToTensor(), normalize]))
    sampler = torch.utils.data.distributed.DistributedSampler(
        train, dist.world_size, dist.rank, seed=args.seed) if dist.world_size > 1 else None
    # every rank validates its own slice exactly once (no padding duplicates)
    val = torch.utils.data.Subset(val, range(dist.rank, len(val), dist.world_size))
    kwargs = dict(batch_size=args.batch_size, num_workers=args.workers, pin_memory=dist.device.type == "cuda",
                  persistent_workers=True)
    train_loader = torch.utils.data.DataLoader(train, shuffle=sampler is None, sampler=sampler, **kwargs)
    val_loader = torch.utils.data.DataLoader(val, **kwargs)
    epoch = [0]

    def train_epoch():
        if sampler is not None:
            sampler.set_epoch(epoch[0])
        epoch[0] += 1
        return torch_batches(train_loader, dist.device)

    return train_epoch, len(train_loader), lambda: torch_batches(val_loader, dist.device), train.classes


def make_model(args, num_classes):
    names = torchvision.models.list_models(module=torchvision.models)
    if args.arch not in names:
        close = difflib.get_close_matches(args.arch, names, n=5, cutoff=0.5)
        hint = f"; close names: {', '.join(close)}" if close else "; see torchvision.models.list_models()"
        raise UsageError(f"--arch {args.arch}: not a torchvision classification model{hint}")
    return torchvision.models.get_model(args.arch, weights=None, num_classes=num_classes)


# ------------------------------------------------------------------------------------------
# main
# ------------------------------------------------------------------------------------------


def main(args):
    training.check_args(args)
    dist = training.init_distributed()
    device_id = training.dali_device_id(args, dist)
    if args.data == "demo":
        with training.main_process_first(dist):
            args.data = make_demo_images(DEMO_DIR)
    check_data(args.data)
    torch.manual_seed(args.seed)
    log = training.Log(args.output_dir, dist)

    if args.loader == "torch":
        train_batches, steps, val_batches, classes = torch_loaders(args, dist)
    else:
        train_batches, steps, val_batches, classes = dali_loaders(args, dist, device_id)
    if args.loader == "synthetic":
        batch = (torch.randn(args.batch_size, 3, args.crop_size, args.crop_size, device=dist.device),
                 torch.randint(0, len(classes), (args.batch_size,), device=dist.device))
        train_batches = partial(training.synthetic_batches, batch, steps)
    model, model_without_ddp = training.prepare_model(make_model(args, len(classes)), args, dist)
    criterion = torch.nn.CrossEntropyLoss(label_smoothing=args.label_smoothing)
    optimizer, scheduler, lr = training.make_optimizer(model, args, dist, steps)
    scaler = training.make_scaler(args, dist.device)
    start_epoch, best = training.resume(args, model_without_ddp, optimizer, scheduler, scaler)
    log.info(f"{args.arch} on {len(classes)} classes from {args.data}; " + training.describe(args, dist, steps, lr))

    if args.evaluate:
        top1, top5 = evaluate(model_without_ddp, val_batches(), args, dist)
        log.write({"type": "eval", "val_top1": top1, "val_top5": top5}, f"Test: Acc@1 {top1:.3f} Acc@5 {top5:.3f}")
        return
    # Validation runs the unwrapped model: its forward passes need no collective, so shards may differ.
    for epoch in range(start_epoch, args.epochs + 1):
        start = time.perf_counter()
        train_loss = training.train_one_epoch(model, criterion, optimizer, scheduler, scaler, train_batches(), steps,
                                              epoch, args, dist, log)
        top1, top5 = evaluate(model_without_ddp, val_batches(), args, dist)
        epoch_time = time.perf_counter() - start
        is_best, best = top1 > best, max(top1, best)
        if dist.is_main:
            training.save_checkpoint(args.output_dir, model_without_ddp, optimizer, scheduler, scaler, epoch, args,
                                     best, is_best, {"classes": classes})
        log.write({"type": "epoch", "epoch": epoch, "train_loss": train_loss, "val_top1": top1, "val_top5": top5,
                   "epoch_time": epoch_time},
                  f"Epoch {epoch}: val Acc@1 {top1:.3f} Acc@5 {top5:.3f}  train loss {train_loss:.4f}  "
                  f"time {epoch_time:.1f}s")


DEMO_DEFAULTS = dict(arch="resnet18", epochs=6, batch_size=32, lr=0.2, crop_size=64, val_resize_size=73,
                     print_freq=10, output_dir="runs/classify-demo", workers=min(4, os.cpu_count() or 1))


def get_args_parser(add_help=True):
    parser = argparse.ArgumentParser(description="Image classification on DALI", add_help=add_help,
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    g = parser.add_argument_group("data and model")
    g.add_argument("--data", required=True,
                   help="ImageFolder root with train/ and val/ subfolders, or 'demo' for a built-in synthetic set "
                        "(demo also changes the defaults to: " +
                        ", ".join(f"--{k.replace('_', '-')} {v}" for k, v in DEMO_DEFAULTS.items()) + ")")
    g.add_argument("--arch", default="resnet50", help="any torchvision classification model")
    g.add_argument("--crop-size", type=int, default=224, help="training and validation crop")
    g.add_argument("--val-resize-size", type=int, default=256, help="shorter side before the validation crop")
    g.add_argument("--label-smoothing", type=float, default=0.0, help="cross-entropy label smoothing")
    g.add_argument("--loader", choices=["dali", "torch", "synthetic"], default="dali",
                   help="dali; torch: torchvision ImageFolder + DataLoader with the same transforms (for A/B); "
                        "synthetic: one random batch already on the device trains every step (the speed ceiling; "
                        "validation still reads --data with DALI)")
    g.add_argument("--hw-decoder-load", type=float, default=DEFAULT_HW_DECODER_LOAD,
                   help="share of JPEG decoding on the GPU's hardware decoder (mixed decode only)")
    training.add_training_args(parser, dict(epochs=90, batch_size=256, lr=0.1, output_dir="runs/classify",
                                            lr_warmup_epochs=0))
    return parser


if __name__ == "__main__":
    training.run(main, training.parser_with_demo_defaults(get_args_parser, DEMO_DEFAULTS))
