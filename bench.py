"""Side-by-side benchmark of the DALI pipelines in pipelines.py against torchvision/torch DataLoaders.

One run, on the same files, same batch size, DataLoader workers = threads of the CPU-only DALI pipelines
(the pipelines on the GPU get --gpu-threads, 8 by default, as the trainers' -j):

  1. classification loaders, each delivering normalized float batches where training needs them (the
     GPU when there is one): ``ClassifyTrainPipeline`` with mixed (GPU) decode, the same with the
     decode on the CPU (``dali-cpu-decode-hwc``), the same pipeline CPU-only followed by
     ``.cuda()``, and torchvision ``ImageFolder`` + ``DataLoader`` doing RandomResizedCrop(224),
     flip, ToTensor, Normalize followed by ``.cuda()``; beside them the training pipeline of
     NVIDIA's PyTorch ResNet-50 example, the peer (``nvidia-example``);
  2. segmentation loaders: ``SegmentTrainPipeline`` (GPU and CPU-only) against a torch ``Dataset`` +
     ``DataLoader`` doing the same augmentations on the CPU;
  3. end to end (GPU only): training steps of torchvision ResNets (compiled, as the trainers on a
     GPU; --no-compile: eager) fed by each classification loader,
     beside a synthetic batch already on the GPU (the ceiling), with the share of each step spent
     waiting for data;
  4. with ``--sweep`` (GPU only): the mixed-decode loader over hw_decoder_load x DALI threads;
  5. with ``--against-example`` (GPU only): ours with one of the example's settings at a time.

Without ``--data`` it generates an ImageNet-like set of JPEGs (400-500 px per side, quality 90, cut
from scikit-image's sample photos when scikit-image is installed, procedural otherwise) into
``.cache/bench-jpegs/`` and paired image/mask ``.npy`` files into ``.cache/bench-seg/``, and reuses them
on later runs. Results print as tables and go to ``bench.json``.

    python bench.py                             # full run, every core, batch 256
    python bench.py --workers 16 --sweep        # full run plus the decoder sweep (an H200 with 16 cores)
    python bench.py --data /datasets/imagenet/train --models resnet50
    python bench.py --quick                     # tiny, CPU-sized smoke run (seconds)
    torchrun --nproc_per_node=4 bench.py --ddp  # DDP scaling: 1 GPU vs 4, DALI-fed vs synthetic
    python -m pytest -q test_bench.py           # runs --quick and checks its JSON
"""

import argparse
import gc
import itertools
import json
import math
import multiprocessing
import os
import platform
import random
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from contextlib import contextmanager
from datetime import datetime
from functools import partial

from outputs import atomic_open, file_to_write, progress

SEED = 0
NUM_CLASSES = 16
SIDE_RANGE = (400, 500)  # ImageNet's typical image side, in pixels
JPEG_QUALITY = 90
CROP = 224
SEG_OUTPUT = (384, 384)
# Image headers read for the size statistics: enough for a stable mean, quick even on a full ImageNet.
STATS_SAMPLE = 2000
SWEEP_HW_DECODER_LOADS = (0.0, 0.5, 0.75, 0.9, 1.0)
SWEEP_THREADS = (8, 12, 16)
# Tried one at a time at the grid's best point: deeper prefetch, half-precision output, DALI 2.x's
# executor choices (the dynamic executor is the default) and thread pinning near the GPU.
SWEEP_OPTIONS = (
    ("prefetch_queue_depth", 3),
    ("prefetch_queue_depth", 4),
    ("dtype", "float16"),
    ("exec_dynamic", False),
    ("set_affinity", True),
)
# --against-example: our mixed-decode HWC loader with one setting of NVIDIA's ResNet-50 example at a
# time (its crop's area and aspect ranges, CHW output), or with another knob (a third or all of the
# JPEGs on the hardware decoder, ...).
EXAMPLE_STEPS = (
    ("hw_decoder_load=0.35", dict(hw_decoder_load=0.35)),
    ("hw_decoder_load=1.0", dict(hw_decoder_load=1.0)),
    ("CHW", dict(output_layout="CHW")),
    ("example-crop", dict(random_area=(0.1, 1.0), random_aspect_ratio=(0.8, 1.25))),
    ("threads=16", dict(num_threads=16)),
    ("prefetch=3", dict(prefetch_queue_depth=3)),
    ("exec_dynamic=False", dict(exec_dynamic=False)),
    ("default-stream", dict(default_stream=True)),
)
# scikit-image sample photos shipped inside its wheel (none is downloaded): colour photos first, then
# grayscale ones of textured surfaces, which JPEG finds as hard as foliage or fur.
SKIMAGE_PHOTOS = (
    "astronaut",
    "coffee",
    "chelsea",
    "rocket",
    "hubble_deep_field",
    "immunohistochemistry",
    "retina",
    "stereo_motorcycle",
    "brick",
    "grass",
    "gravel",
    "camera",
    "coins",
    "moon",
)

START = time.perf_counter()


def usable_cpus():
    """CPUs this process may run on: os.cpu_count() unless a container or taskset pins it to fewer."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def log(message):
    print(f"[{time.perf_counter() - START:6.1f}s] {message}", flush=True)


# ------------------------------------------------------------------------------------------
# command line
# ------------------------------------------------------------------------------------------


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--data",
        metavar="DIR",
        help="ImageFolder tree <dir>/<class>/<image> to read (default: generate an ImageNet-like "
        "JPEG set under --cache-dir)",
    )
    p.add_argument(
        "--cache-dir",
        metavar="DIR",
        default=".cache",
        help="where generated sets live, in bench-jpegs/ and bench-seg/ (default: .cache)",
    )
    p.add_argument(
        "--num-images", metavar="N", type=int, help="JPEGs to generate (default: 8192; --quick: 64)"
    )
    p.add_argument(
        "--seg-samples",
        metavar="N",
        type=int,
        help="image/mask .npy pairs to generate, 512x512 (default: 256; --quick: 16 of 128x128)",
    )
    p.add_argument(
        "--batch-size",
        metavar="N",
        type=int,
        help="classification batch size (default: 256; --quick: 16)",
    )
    p.add_argument(
        "--seg-batch-size",
        metavar="N",
        type=int,
        help="segmentation batch size (default: 32; --quick: 4)",
    )
    p.add_argument(
        "--workers",
        metavar="N",
        type=int,
        help="DataLoader workers = DALI threads = generator processes (default: the CPUs this "
        "process may run on, os.cpu_count() unless it is pinned)",
    )
    p.add_argument(
        "--gpu-threads",
        metavar="N",
        type=int,
        help="DALI threads of the pipelines that run on the GPU (mixed decode, GPU segmentation, the "
        "end-to-end section) (default: the smaller of 8 and --workers, the trainers' default -j; "
        "on the H200 16 threads delivered less than 8: README)",
    )
    p.add_argument(
        "--warmup",
        metavar="N",
        type=int,
        help="batches (or training steps) run before timing (default: workers + 4, so the "
        "DataLoader's first burst, one batch from every worker at once, is not timed; "
        "--quick: 2)",
    )
    p.add_argument(
        "--iters",
        metavar="N",
        type=int,
        help="batches (or training steps) timed (default: 50; --quick: 4)",
    )
    p.add_argument(
        "--max-seconds",
        metavar="S",
        type=float,
        default=15.0,
        help="stop timing a loader earlier once this many seconds are spent (default: 15)",
    )
    p.add_argument(
        "--models",
        metavar="LIST",
        default="resnet50,resnet18",
        help="torchvision models for the end-to-end section, comma-separated "
        "(default: resnet50,resnet18)",
    )
    p.add_argument(
        "--only",
        metavar="LIST",
        help="only the classification loaders whose names contain one of these comma-separated words "
        "(and the end-to-end rows they feed); skips the decoder and segmentation sections",
    )
    p.add_argument(
        "--auto-augment",
        choices=["ta_wide", "ra", "imagenet"],  # pipelines.AUTO_AUGMENT's names, as the trainer's
        help="also the mixed-decode (uncached and cached), CPU-only DALI and DataLoader loaders "
        "with this policy after the crop and flip (DALI's auto_aug; torchvision's transform)",
    )
    p.add_argument(
        "--against-example",
        action="store_true",
        help="also NVIDIA's example pipeline on 16 threads and ours with one of its settings (or "
        f"another knob) at a time: {', '.join(name for name, _ in EXAMPLE_STEPS)} (GPU only)",
    )
    p.add_argument(
        "--hw-decoder-load",
        metavar="F",
        type=float,
        help="share of JPEG decoding on the GPU's hardware decoder, for the mixed-decode "
        "pipelines (default: pipelines.py's DEFAULT_HW_DECODER_LOAD, with the decoder cache its "
        "CACHED_HW_DECODER_LOAD)",
    )
    p.add_argument(
        "--compile",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="torch.compile the models of the end-to-end and --ddp rows, as the trainers do on a "
        "GPU: the ceiling is the compiled model's rate; --startup's run compiles in its first step "
        "(default: on; --no-compile: eager)",
    )
    p.add_argument(
        "--prefetch-queue-depth",
        metavar="N",
        type=int,
        default=2,
        help="batches each DALI pipeline prepares ahead (default: 2)",
    )
    p.add_argument(
        "--sweep",
        action="store_true",
        help=f"also time the mixed-decode loader for hw_decoder_load in {SWEEP_HW_DECODER_LOADS} "
        f"x threads in {SWEEP_THREADS} (GPU only; about a minute)",
    )
    p.add_argument(
        "--json",
        metavar="PATH",
        type=file_to_write,
        default="bench.json",
        help="where to write the results (default: bench.json)",
    )
    p.add_argument(
        "--ddp",
        action="store_true",
        help="under torchrun: training img/s on 1 GPU and on all of them, DALI-fed and synthetic, and the "
        "scaling (GPU only; workers default to this process's share of the CPUs)",
    )
    p.add_argument(
        "--seg-startup",
        metavar="N",
        type=int,
        help="only time building a segmentation pipeline over N pairs of tiny .npy files (written once "
        "under --cache-dir) with a warm page cache: the header checks, the pipeline, its first batch",
    )
    p.add_argument(
        "--startup",
        metavar="N",
        type=int,
        help="only time train_classify.py from the command to its first training step (and its peak "
        "memory) on an ImageFolder tree of N training images in 1000 classes and N / 25.6 val images "
        "(ImageNet: 1281167), made once under --cache-dir of hardlinks to the JPEG set (--num-images "
        "of them): a fresh run, the same resumed, a new run over the checked data; first of "
        "--models, --batch-size, --workers DALI threads",
    )
    p.add_argument(
        "--startup-runs",
        metavar="N",
        type=int,
        default=3,
        help="times --startup runs each of its three starts (default: 3: the median, and the spread)",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="smoke test: 64 JPEGs, 16 pairs of 128x128 .npy, a few small batches; seconds on 2 CPU "
        "cores (with a GPU it runs the GPU sections too, as small)",
    )
    args = p.parse_args(argv)

    quick = args.quick
    defaults = dict(
        num_images=64 if quick else 8192,
        seg_samples=16 if quick else 256,
        batch_size=16 if quick else 256,
        seg_batch_size=4 if quick else 32,
        workers=max(1, usable_cpus() // int(os.environ.get("WORLD_SIZE", 1))),
        iters=4 if quick else 50,
    )
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.gpu_threads is None:
        args.gpu_threads = min(8, args.workers)
    if args.warmup is None:
        args.warmup = 2 if quick else args.workers + 4
    args.seg_side = 128 if quick else 512
    for name in (
        "num_images",
        "seg_samples",
        "batch_size",
        "seg_batch_size",
        "workers",
        "gpu_threads",
        "iters",
    ):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    import torchvision  # here, after --help has answered: it loads torch

    for model in args.models.split(","):
        if model not in torchvision.models.list_models():
            p.error(f"--models: torchvision has no model {model!r}")
    return args


if __name__ == "__main__":
    parse_args()  # --help and a bad flag answer here, before torch and DALI take seconds to load

import numpy as np
import nvidia.dali
import torch
import torch.distributed as dist
import torch.nn.functional as F
import torchvision
import torchvision.transforms as T
import torchvision.transforms.functional as TF
from nvidia.dali import fn, ops, types
from nvidia.dali.pipeline import Pipeline, pipeline_def
from nvidia.dali.plugin.pytorch import DALIClassificationIterator, LastBatchPolicy
from PIL import Image, ImageDraw, ImageEnhance
from torch.utils.data import DataLoader, Dataset, RandomSampler
from torchvision.datasets import ImageFolder

from data_sources import check_segmentation_files, decoded_size, list_image_folder
from make_shards import make_shards
from pipelines import (
    CACHED_HW_DECODER_LOAD,
    DEFAULT_HW_DECODER_LOAD,
    IMAGENET_MEAN,
    IMAGENET_STD,
    ClassifyTrainPipeline,
    ClassifyValPipeline,
    classify_iterator,
    fetch_dali_loader,
    segment_iterator,
)

# ------------------------------------------------------------------------------------------
# generated data
# ------------------------------------------------------------------------------------------


def fractal_noise(rng, h, w, octaves, falloff):
    """Upsampled random grids from coarse to fine, each weaker by ``falloff``: natural images' 1/f look."""
    field = np.zeros((h, w), np.float32)
    for octave in range(octaves):
        cells = 3 * 2**octave
        grid = Image.fromarray(rng.standard_normal((cells, cells), dtype=np.float32))
        field += falloff**octave * np.asarray(grid.resize((w, h), Image.BICUBIC))
    return field / field.std()


def procedural_image(rng, h, w):
    """A photo-like RGB image: shaded smooth structure, hard-edged objects, textured regions.

    JPEG decode time follows how much detail survives quantization, so the image needs what photos
    have: most energy at coarse scales, sharp edges, and patches of fine texture next to smooth ones.
    """
    ys, xs = np.ogrid[0:h, 0:w]
    angle = rng.uniform(0, 2 * np.pi)
    lighting = rng.uniform(-50, 50) * (np.cos(angle) * xs / w + np.sin(angle) * ys / h)
    luma = 120 + 40 * fractal_noise(rng, h, w, 6, rng.uniform(0.45, 0.65)) + lighting
    # Colour varies more slowly and less than brightness in photos, which JPEG's chroma subsampling
    # relies on.
    cb = rng.uniform(-25, 25) + rng.uniform(5, 20) * fractal_noise(rng, h, w, 3, 0.5)
    cr = rng.uniform(-25, 25) + rng.uniform(5, 20) * fractal_noise(rng, h, w, 3, 0.5)
    rgb = np.dstack([luma + 1.402 * cr, luma - 0.344 * cb - 0.714 * cr, luma + 1.772 * cb])
    image = Image.fromarray(np.clip(rgb, 0, 255).astype(np.uint8))

    draw = ImageDraw.Draw(image, "RGBA")
    palette = np.asarray(image)
    for _ in range(rng.integers(20, 60)):
        x0, y0 = rng.uniform(-0.2, 1.0) * w, rng.uniform(-0.2, 1.0) * h
        x1, y1 = x0 + rng.uniform(0.02, 0.4) * w, y0 + rng.uniform(0.02, 0.4) * h
        # Objects take colours near the scene's own, as under one light, rather than arbitrary ones.
        near = palette[rng.integers(h), rng.integers(w)].astype(int) + rng.integers(-70, 71, 3)
        fill = tuple(int(v) for v in np.clip(near, 0, 255)) + (int(rng.integers(90, 256)),)
        shape = rng.integers(3)
        if shape == 0:
            draw.ellipse([x0, y0, x1, y1], fill=fill)
        elif shape == 1:
            draw.rectangle([x0, y0, x1, y1], fill=fill)
        else:
            draw.polygon(
                [(rng.uniform(x0, x1), rng.uniform(y0, y1)) for _ in range(rng.integers(3, 7))],
                fill=fill,
            )

    # Fine texture (foliage, fabric, fur) in some regions only.
    detail = Image.fromarray(rng.standard_normal((h * 2 // 3, w * 2 // 3), dtype=np.float32))
    detail = np.asarray(detail.resize((w, h), Image.BICUBIC))
    where = np.clip(0.3 + 0.7 * fractal_noise(rng, h, w, 3, 0.5), 0, 1.5)
    pixels = np.asarray(image, np.float32) + (rng.uniform(20, 50) * detail * where)[..., None]
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))


def photo_image(rng, photos, h, w):
    """A random crop of one of ``photos``, scaled to h x w, maybe flipped, colour-jittered."""
    photo = photos[rng.integers(len(photos))]
    ph, pw = photo.shape[:2]
    aspect = w / h * rng.uniform(0.8, 1.25)
    area = rng.uniform(0.3, 1.0) * ph * pw
    ch = min(ph, round(math.sqrt(area / aspect)))
    cw = min(pw, round(ch * aspect))
    y, x = rng.integers(0, ph - ch + 1), rng.integers(0, pw - cw + 1)
    image = Image.fromarray(photo[y : y + ch, x : x + cw]).resize((w, h), Image.BICUBIC)
    if rng.random() < 0.5:
        image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    for enhance, low, high in (
        (ImageEnhance.Brightness, 0.7, 1.3),
        (ImageEnhance.Contrast, 0.7, 1.3),
        (ImageEnhance.Color, 0.5, 1.5),
    ):
        image = enhance(image).enhance(rng.uniform(low, high))
    # A channel shuffle stands in for a hue shift, so a dozen photos give many different colourings;
    # grain puts back the sensor noise of a camera's photo that the clean, often upscaled crops lack.
    grain = rng.uniform(1, 4) * rng.standard_normal((h, w, 1), dtype=np.float32)
    pixels = np.asarray(image, np.float32)[..., rng.permutation(3)] + grain
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))


def load_photos():
    """scikit-image's sample photos as (H, W, 3) uint8 arrays; none without scikit-image."""
    try:
        from skimage import data
    except ImportError:
        return []
    photos = []
    for name in SKIMAGE_PHOTOS:
        try:
            photo = getattr(data, name)()
        except (
            Exception
        ) as e:  # a scikit-image that does not bundle this one would try to download it
            log(f"skipping skimage.data.{name}: {type(e).__name__}: {e}")
            continue
        photo = photo[0] if name == "stereo_motorcycle" else photo  # (left, right, disparity)
        photos.append(
            np.ascontiguousarray(np.dstack([photo] * 3) if photo.ndim == 2 else photo[..., :3])
        )
    return photos


_photos = []


def _init_generator(photos):
    global _photos
    _photos = photos


def jpeg_path(root, i):
    return os.path.join(root, f"class{i % NUM_CLASSES:02d}", f"{i:06d}.jpg")


def write_jpeg(root, i):
    rng = np.random.default_rng([SEED, i])
    h, w = rng.integers(SIDE_RANGE[0], SIDE_RANGE[1] + 1, size=2)
    image = photo_image(rng, _photos, h, w) if _photos else procedural_image(rng, h, w)
    with atomic_open(jpeg_path(root, i)) as f:
        image.save(f, format="JPEG", quality=JPEG_QUALITY)


def seg_paths(root, i):
    # the layout data_processing.make_csv_file_npy reads, so train_segment.py can use the set too
    return os.path.join(root, "Images", "1", f"{i:06d}.npy"), os.path.join(
        root, "Masks", "1", f"{i:06d}.npy"
    )


def write_seg_pair(root, side, i):
    """A textured image with a few elliptical objects (class 1) that stand out from the background."""
    rng = np.random.default_rng([SEED, 1, i])
    mask = Image.new("L", (side, side), 0)
    draw = ImageDraw.Draw(mask)
    for _ in range(rng.integers(1, 5)):
        cx, cy = rng.uniform(0, side, size=2)
        rx, ry = rng.uniform(0.05, 0.25, size=2) * side
        draw.ellipse([cx - rx, cy - ry, cx + rx, cy + ry], fill=1)
    mask = np.asarray(mask)[..., None]
    background = np.asarray(procedural_image(rng, side, side), np.float32)
    objects = 0.5 * background + rng.uniform(40, 120, size=3)
    image = np.where(mask == 1, objects, background).clip(0, 255).astype(np.uint8)
    image_path, mask_path = seg_paths(root, i)
    with atomic_open(image_path) as f:
        np.save(f, image)
    with atomic_open(mask_path) as f:
        np.save(f, mask)


def generate(root, what, count, paths, write, workers, photos=()):
    """Write the files of ``root`` that are missing, in parallel; the manifest marks the set complete."""
    manifest = os.path.join(root, "complete.json")
    if os.path.exists(manifest):
        return
    todo = [i for i in range(count) if not all(os.path.exists(p) for p in paths(i))]
    for directory in {os.path.dirname(p) for i in range(min(count, NUM_CLASSES)) for p in paths(i)}:
        os.makedirs(directory, exist_ok=True)
    log(f"generating {len(todo)} {what} in {root} with {workers} processes")
    # fork: the workers inherit the imported modules instead of importing torch and DALI again.
    with multiprocessing.get_context("fork").Pool(
        workers, _init_generator, (list(photos),)
    ) as pool:
        step = math.ceil(len(todo) / 10)
        for done, _ in enumerate(pool.imap_unordered(write, todo, chunksize=8), 1):
            if done % step == 0 or done == len(todo):
                log(f"  {done}/{len(todo)} {what}")
    with atomic_open(manifest, "w") as f:
        json.dump({"count": count, "seed": SEED}, f)


def jpeg_set(args):
    """(ImageFolder root, where its content comes from), generating the set if needed."""
    if args.data:
        return args.data, "given"
    photos = load_photos()
    source = "skimage-photos" if photos else "procedural"
    root = os.path.join(args.cache_dir, "bench-jpegs", f"n{args.num_images}-{source}")
    generate(
        root,
        "JPEGs",
        args.num_images,
        lambda i: [jpeg_path(root, i)],
        partial(write_jpeg, root),
        args.workers,
        photos,
    )
    return root, source


def shard_sets(args):
    """{"tfrecord": dir, "wds": dir}: the JPEG set written by make_shards.py in both formats (its train split)."""
    src = os.path.join(
        args.cache_dir, "bench-shards", os.path.basename(os.path.normpath(args.data_dir))
    )
    out = {}
    for fmt in ("tfrecord", "wds"):
        dst = f"{src}-{fmt}"
        if not os.path.exists(os.path.join(dst, "manifest.json")):
            os.makedirs(src, exist_ok=True)
            for split in (
                "train",
                "val",
            ):  # make_shards reads train/ and val/: both are the JPEG set
                if not os.path.lexists(os.path.join(src, split)):
                    os.symlink(os.path.abspath(args.data_dir), os.path.join(src, split))
            log(f"writing the JPEGs as {fmt} shards into {dst}")
            make_shards(
                src, dst, fmt, shard_size=1024, seed=SEED, workers=args.workers, overwrite=True
            )  # bench's own cache
        out[fmt] = os.path.join(dst, "train")
    return out


def seg_set(args):
    root = os.path.join(args.cache_dir, "bench-seg", f"n{args.seg_samples}-{args.seg_side}px")
    generate(
        root,
        "image/mask pairs",
        args.seg_samples,
        partial(seg_paths, root),
        partial(write_seg_pair, root, args.seg_side),
        args.workers,
    )
    pairs = [seg_paths(root, i) for i in range(args.seg_samples)]
    return [image for image, _ in pairs], [mask for _, mask in pairs]


def jpeg_stats(root, source):
    files, _, classes = list_image_folder(root)
    sample = (
        files if len(files) <= STATS_SAMPLE else random.Random(SEED).sample(files, STATS_SAMPLE)
    )
    sizes = []
    for path in sample:
        with Image.open(path) as image:  # reads the header only
            sizes.append(image.size)
    widths, heights = np.array(sizes, dtype=np.float64).T
    return dict(
        path=root,
        source=source,
        images=len(files),
        classes=len(classes),
        stats_from=len(sample),
        mean_height=round(heights.mean(), 1),
        mean_width=round(widths.mean(), 1),
        mean_pixels=round((heights * widths).mean()),
        mean_kib=round(np.mean([os.path.getsize(p) for p in sample]) / 1024, 1),
    )


def seg_stats(imgs, lbls):
    height, width, _ = np.load(imgs[0], mmap_mode="r").shape
    return dict(
        path=os.path.dirname(os.path.dirname(imgs[0])),
        samples=len(imgs),
        height=height,
        width=width,
        mean_pixels=height * width,
        mean_kib=round(np.mean([os.path.getsize(p) for p in imgs]) / 1024, 1),
        mask_mean_kib=round(np.mean([os.path.getsize(p) for p in lbls]) / 1024, 1),
    )


# ------------------------------------------------------------------------------------------
# loaders: each is a context manager yielding an endless iterator of (images, targets) batches
# already on args.device; leaving the context frees the loader's threads, processes and memory
# ------------------------------------------------------------------------------------------


def batches_on(device, loader, unpack):
    while True:  # a DALI iterator ends every epoch and resets itself; carry on into the next one
        for batch in loader:
            images, targets = unpack(batch)
            yield images.to(device, non_blocking=True), targets.to(device, non_blocking=True)


@contextmanager
def endless(loader, device, unpack):
    batches = batches_on(device, loader, unpack)
    del loader  # the generator's frame now holds the only reference
    try:
        yield batches
    finally:
        # Closing the generator drops the loader; collecting then ends DALI's threads or the DataLoader's
        # worker processes before the next loader starts competing with them for the CPUs.
        batches.close()
        gc.collect()


def dali_threads(args, device_id):
    """DALI threads of a pipeline: --workers for a CPU-only one, --gpu-threads for one on the GPU."""
    return args.workers if device_id is None else args.gpu_threads


def dali_classify(args, device_id, layout="folder", **pipeline_kwargs):
    """``ClassifyTrainPipeline`` over the JPEGs, or over the same JPEGs in TFRecord or WebDataset shards;
    ``output_layout="HWC"`` batches become channels_last NCHW tensors, as the trainer makes them. With a
    ``decoder_cache``, its first epoch (which fills the cache) runs first and goes to ``args.cache_fills``: what
    the timing measures is the epochs after it."""
    data_dir = args.data_dir if layout == "folder" else args.shards[layout]
    free = torch.cuda.mem_get_info()[0] if pipeline_kwargs.get("decoder_cache") else None
    settings = dict(
        num_threads=dali_threads(args, device_id),
        hw_decoder_load=args.hw_decoder_load,
        prefetch_queue_depth=args.prefetch_queue_depth,
    )
    pipe = ClassifyTrainPipeline(
        args.batch_size,
        device_id=device_id,
        data_dir=data_dir,
        seed=SEED,
        **{**settings, **pipeline_kwargs},
    )
    hwc = pipeline_kwargs.get("output_layout") == "HWC"
    loader = classify_iterator(pipe)
    if free is not None:
        start = time.perf_counter()
        for _ in loader:
            pass
        torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        fill = dict(
            cache_mb=pipeline_kwargs["decoder_cache"],
            first_epoch_s=round(seconds, 2),
            first_epoch_img_per_s=round(pipe.num_samples / seconds, 1),
            dali_gpu_gb=round((free - torch.cuda.mem_get_info()[0]) / 1e9, 2),
        )
        args.cache_fills.append(fill)
        log(
            f"  decoder cache of {fill['cache_mb']} MB filled in {seconds:.1f} s ({fill['first_epoch_img_per_s']} "
            f"img/s); DALI holds {fill['dali_gpu_gb']} GB of GPU memory"
        )
    return endless(
        loader,
        args.device,
        lambda b: (
            b[0]["data"].permute(0, 3, 1, 2) if hwc else b[0]["data"],
            b[0]["label"].squeeze(-1).long(),
        ),
    )


@pipeline_def
def example_pipeline(data_dir, crop, dali_cpu):
    """The training pipeline of NVIDIA's PyTorch ResNet-50 example (DALI's
    docs/examples/use_cases/pytorch/resnet50/main.py), as it is written there: the peer to beat."""
    images, labels = fn.readers.file(
        file_root=data_dir, random_shuffle=True, pad_last_batch=True, name="Reader"
    )
    images = fn.decoders.image_random_crop(
        images,
        device="cpu" if dali_cpu else "mixed",
        output_type=types.RGB,
        device_memory_padding=0 if dali_cpu else 211025920,
        host_memory_padding=0 if dali_cpu else 140544512,
        random_aspect_ratio=[0.8, 1.25],
        random_area=[0.1, 1.0],
        num_attempts=100,
    )
    images = fn.resize(
        images,
        device="cpu" if dali_cpu else "gpu",
        resize_x=crop,
        resize_y=crop,
        interp_type=types.INTERP_TRIANGULAR,
    )
    images = fn.crop_mirror_normalize(
        images if dali_cpu else images.gpu(),
        dtype=types.FLOAT,
        output_layout="CHW",
        crop=(crop, crop),
        mean=list(IMAGENET_MEAN),
        std=list(IMAGENET_STD),
        mirror=fn.random.coin_flip(probability=0.5),
    )
    return images, labels if dali_cpu else labels.gpu()


def nvidia_example(args, device_id, num_threads=None):
    """NVIDIA's example pipeline and its iterator, on ``num_threads`` DALI threads (default: as
    ours)."""
    pipe = example_pipeline(
        batch_size=args.batch_size,
        num_threads=num_threads or dali_threads(args, device_id),
        device_id=device_id,
        seed=SEED,
        data_dir=args.data_dir,
        crop=CROP,
        dali_cpu=device_id is None,
    )
    pipe.build()
    loader = DALIClassificationIterator(
        pipe, reader_name="Reader", last_batch_policy=LastBatchPolicy.PARTIAL, auto_reset=True
    )
    return endless(loader, args.device, lambda b: (b[0]["data"], b[0]["label"].squeeze(-1).long()))


@contextmanager
def on_default_stream(make_loader, args):
    """``make_loader``'s batches, the training steps that take them on the default stream rather
    than the high-priority one of the end-to-end section."""
    stream = torch.cuda.current_stream()
    torch.cuda.set_stream(torch.cuda.default_stream())
    try:
        with make_loader(args) as batches:
            yield batches
    finally:
        torch.cuda.set_stream(stream)


def example_steps():
    """(name, loader) rows of --against-example: the example with 16 threads, and ours with one
    change at a time (EXAMPLE_STEPS)."""
    rows = [("nvidia-example threads=16", partial(nvidia_example, device_id=0, num_threads=16))]
    for name, change in EXAMPLE_STEPS:
        change = dict(change)
        ours = partial(dali_classify, device_id=0, output_layout="HWC")
        if change.pop("default_stream", False):
            rows.append((f"dali-mixed-hwc {name}", partial(on_default_stream, ours)))
        else:
            rows.append((f"dali-mixed-hwc {name}", partial(ours, **change)))
    return rows


class DecodePipeline(Pipeline):
    """The decoder's own ceiling: read and decode with mixed decode at ``hw_decoder_load``, nothing after.

    ``crop=True`` decodes only the train pipeline's random-resized-crop window (ROI decode), as
    ``ClassifyTrainPipeline`` does before its resize and normalize.
    """

    def __init__(self, batch_size, num_threads, data_dir, hw_decoder_load, crop):
        super().__init__(batch_size, num_threads, 0, seed=SEED)
        files, labels, _ = list_image_folder(data_dir)
        self.reader = ops.readers.File(
            files=files, labels=labels, random_shuffle=True, name="Reader"
        )
        self.decode = (ops.decoders.ImageRandomCrop if crop else ops.decoders.Image)(
            device="mixed", output_type=types.RGB, hw_decoder_load=hw_decoder_load
        )

    def define_graph(self):
        jpegs, _ = self.reader()
        return self.decode(jpegs)


def time_decoder(name, args, load, crop):
    """Images per second out of ``DecodePipeline``: ``Pipeline.run`` returns each batch decoded on the GPU."""
    pipe = DecodePipeline(args.batch_size, args.gpu_threads, args.data_dir, load, crop)
    pipe.build()
    for _ in range(args.warmup):
        pipe.run()
    torch.cuda.synchronize()
    start = time.perf_counter()
    batches = 0
    while batches < args.iters and time.perf_counter() - start < args.max_seconds:
        pipe.run()
        batches += 1
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    del pipe
    gc.collect()
    row = dict(
        loader=name,
        img_per_s=round(batches * args.batch_size / seconds, 1),
        batches=batches,
        images=batches * args.batch_size,
        seconds=round(seconds, 3),
    )
    log(f"  {name:<20} {row['img_per_s']:>9.1f} img/s  ({batches} batches in {seconds:.2f} s)")
    return row


def dataloader(dataset, batch_size, args):
    # One endless epoch: a DataLoader epoch ends with its workers idling while the last batches finish,
    # a stall that a 1.28M-image epoch hides and a benchmark-sized one does not (DALI's readers simply
    # wrap around). The other settings are a training script's: pinned batches for an asynchronous copy
    # to the GPU, workers kept across epochs, two batches in flight per worker.
    sampler = RandomSampler(dataset, num_samples=sys.maxsize)
    return DataLoader(
        dataset,
        batch_size,
        sampler=sampler,
        num_workers=args.workers,
        pin_memory=args.gpu,
        persistent_workers=True,
        prefetch_factor=2,
        drop_last=True,
    )


# --auto-augment's policies, as torchvision's classification reference builds them
TORCHVISION_AUTO_AUGMENT = {
    "ta_wide": T.TrivialAugmentWide,
    "ra": T.RandAugment,
    "imagenet": partial(T.AutoAugment, T.AutoAugmentPolicy.IMAGENET),
}


def torchvision_classify(args, auto_augment=None):
    policy = (
        [TORCHVISION_AUTO_AUGMENT[auto_augment](interpolation=T.InterpolationMode.BILINEAR)]
        if auto_augment
        else []
    )
    transform = T.Compose(
        [
            T.RandomResizedCrop(CROP),
            T.RandomHorizontalFlip(),
            *policy,
            T.ToTensor(),
            T.Normalize([m / 255 for m in IMAGENET_MEAN], [s / 255 for s in IMAGENET_STD]),
        ]
    )
    return endless(
        dataloader(ImageFolder(args.data_dir, transform), args.batch_size, args), args.device, tuple
    )


@contextmanager
def synthetic_classify(args):
    """The ceiling: one random batch, already on the GPU, fed again and again."""
    images = torch.randn(args.batch_size, 3, CROP, CROP, device=args.device).contiguous(
        memory_format=torch.channels_last
    )
    labels = torch.randint(0, 1000, (args.batch_size,), device=args.device)
    yield itertools.repeat((images, labels))


def dali_segment(args, device_id):
    pipe = fetch_dali_loader(
        args.seg_imgs,
        args.seg_lbls,
        args.seg_batch_size,
        "train",
        device_id=device_id,
        num_threads=dali_threads(args, device_id),
        size=SEG_OUTPUT,
        seed=SEED,
        prefetch_queue_depth=args.prefetch_queue_depth,
    )
    return endless(segment_iterator(pipe), args.device, lambda b: (b[0]["image"], b[0]["mask"]))


def uniform(low, high):
    return low + (high - low) * float(torch.rand(()))


class SegmentDataset(Dataset):
    """SegmentTrainPipeline's resize and augmentations, with torch on the CPU, one sample at a time."""

    mean = torch.tensor(IMAGENET_MEAN).view(3, 1, 1)
    std = torch.tensor(IMAGENET_STD).view(3, 1, 1)

    def __init__(self, imgs, lbls):
        self.imgs, self.lbls = imgs, lbls

    def __len__(self):
        return len(self.imgs)

    def __getitem__(self, i):
        image = torch.from_numpy(np.load(self.imgs[i])).permute(2, 0, 1).float()
        mask = torch.from_numpy(np.load(self.lbls[i])).permute(2, 0, 1)
        image = F.interpolate(image[None], size=SEG_OUTPUT, mode="bilinear", align_corners=False)[0]
        # nearest-exact samples pixel centres like DALI's INTERP_NN, and keeps the mask's class values.
        mask = F.interpolate(mask[None], size=SEG_OUTPUT, mode="nearest-exact")[0]
        for dim in (-1, -2):  # horizontal, vertical: drawn once, applied to both
            if torch.rand(()) < 0.5:
                image, mask = image.flip(dim), mask.flip(dim)
        image = (image - self.mean) / self.std
        if torch.rand(()) < 0.15:
            image = image + torch.randn_like(image) * uniform(0.0, 0.33)
        if torch.rand(()) < 0.15:
            sigma = uniform(0.5, 1.5)
            size = 2 * math.ceil(3 * sigma) + 1  # DALI GaussianBlur's window for this sigma
            image = TF.gaussian_blur(image, [size, size], [sigma, sigma])
        if torch.rand(()) < 0.15:
            image = image * uniform(0.7, 1.3)
        if torch.rand(()) < 0.13:
            image = (image * uniform(0.9, 1.1)).clamp(image.min(), image.max())
        return image, mask


def torch_segment(args):
    dataset = SegmentDataset(args.seg_imgs, args.seg_lbls)
    return endless(dataloader(dataset, args.seg_batch_size, args), args.device, tuple)


# ------------------------------------------------------------------------------------------
# measurements
# ------------------------------------------------------------------------------------------


def sync(args):
    if args.gpu:
        torch.cuda.synchronize()


def time_loader(name, make_loader, args):
    """Images per second delivered to args.device by a fresh loader, after warm-up."""
    started = time.perf_counter()
    with make_loader(args) as batches:
        for _ in range(args.warmup):
            next(batches)
        sync(args)
        start = time.perf_counter()
        images = batches_timed = 0
        while batches_timed < args.iters and time.perf_counter() - start < args.max_seconds:
            images += next(batches)[0].shape[0]
            batches_timed += 1
        sync(args)
        seconds = time.perf_counter() - start
    # startup_s: building the loader plus warm-up, what every training run pays before its first step.
    row = dict(
        loader=name,
        img_per_s=round(images / seconds, 1),
        batches=batches_timed,
        images=images,
        seconds=round(seconds, 3),
        startup_s=round(start - started, 2),
    )
    log(
        f"  {name:<20} {row['img_per_s']:>9.1f} img/s  ({batches_timed} batches in {seconds:.2f} s)"
    )
    return row


def time_training(model_name, model, optimizer, name, make_loader, args):
    """Training images per second with batches from a fresh loader, and the share of it the GPU sat waiting.

    The loop runs as the trainers' does: no synchronize per step, so the CPU fetches and launches the next
    step while the GPU runs this one. Data wait is the GPU's idle time between the end of one step and the
    start of the next, from two CUDA events per step (what the trainers log as data-wait).
    """
    criterion = torch.nn.CrossEntropyLoss()
    with make_loader(args) as batches:
        gaps, step_end, steps = [], None, 0
        for step in itertools.count():
            if step == args.warmup:
                torch.cuda.synchronize()
                start, gaps, step_end = time.perf_counter(), [], None
            images, labels = next(batches)
            if step_end is not None:
                fed = torch.cuda.Event(enable_timing=True)
                fed.record()
                gaps.append((step_end, fed))
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = criterion(
                    model(images.contiguous(memory_format=torch.channels_last)), labels
                )
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            step_end = torch.cuda.Event(enable_timing=True)
            step_end.record()
            if step >= args.warmup:
                steps += 1
                # the clock is read without a sync: the CPU is at most a few steps ahead of the GPU
                if steps == args.iters or time.perf_counter() - start >= args.max_seconds:
                    break
        torch.cuda.synchronize()
        total = time.perf_counter() - start
        waiting = sum(a.elapsed_time(b) for a, b in gaps) / 1000
    images_seen = steps * args.batch_size
    row = dict(
        model=model_name,
        loader=name,
        img_per_s=round(images_seen / total, 1),
        data_wait_pct=round(100 * waiting / total, 1),
        steps=steps,
        seconds=round(total, 3),
    )
    log(
        f"  {model_name:<9} {name:<20} {row['img_per_s']:>9.1f} img/s  data wait {row['data_wait_pct']:5.1f} %"
    )
    return row


def seg_startup(args):
    """Seconds from a list of N image/mask pairs to the first batch, the cost every run pays at start-up."""
    root = os.path.join(args.cache_dir, "bench-seg-startup", str(args.seg_startup))
    imgs = [os.path.join(root, "Images", f"{i:07d}.npy") for i in range(args.seg_startup)]
    lbls = [os.path.join(root, "Masks", f"{i:07d}.npy") for i in range(args.seg_startup)]
    if not os.path.exists(os.path.join(root, "complete.json")):
        log(f"writing {args.seg_startup} pairs of 16 x 16 .npy files into {root}")
        for folder in ("Images", "Masks"):
            os.makedirs(os.path.join(root, folder), exist_ok=True)
        image, mask = np.zeros((16, 16, 3), np.uint8), np.zeros((16, 16), np.uint8)
        for image_path, mask_path in zip(imgs, lbls):
            np.save(image_path, image)
            np.save(mask_path, mask)
        with atomic_open(os.path.join(root, "complete.json"), "w") as f:
            json.dump({"count": args.seg_startup}, f)
    for attempt in ("first (page cache warming)", "warm"):
        start = time.perf_counter()
        check_segmentation_files(imgs, lbls)
        checked = time.perf_counter()
        pipe = fetch_dali_loader(
            imgs, lbls, 32, "train", device_id=None, num_threads=args.workers, size=(16, 16)
        )
        built = time.perf_counter()
        next(iter(segment_iterator(pipe)))
        log(
            f"{args.seg_startup} pairs, {attempt}: header check {checked - start:.2f} s, pipeline (the first pair's headers) "
            f"{built - checked:.2f} s, DALI build + first batch {time.perf_counter() - built:.2f} s"
        )
        del pipe


def startup_tree(args):
    """An ImageNet-shaped ImageFolder root of hardlinks to the JPEG set: --startup train images, 1000 classes."""
    sources = [jpeg_path(args.data_dir, i) for i in range(args.num_images)]
    counts = {"train": args.startup, "val": max(1000, round(args.startup * 50000 / 1281167))}
    root = os.path.join(args.cache_dir, "bench-startup", f"n{args.startup}-from-{args.num_images}")
    if not os.path.exists(os.path.join(root, "complete.json")):
        for split, n in counts.items():
            for c in range(1000):
                os.makedirs(os.path.join(root, split, f"n{c:08d}"), exist_ok=True)
            for i in progress(range(n), n, f"{root}: {split} links made"):
                link = os.path.join(root, split, f"n{i % 1000:08d}", f"{split}_{i:08d}.JPEG")
                if not os.path.exists(link):
                    os.link(sources[i % len(sources)], link)
        with atomic_open(os.path.join(root, "complete.json"), "w") as f:
            json.dump(counts, f)
    return root, counts


def lines_to_first_step(cmd, env, stop=False):
    """(seconds, line) for each line ``cmd`` prints until its first training step's, which ends it
    (killed); with ``stop``, a SIGTERM then, as a cluster's requeue sends, and its lines until it has
    saved its checkpoint and exited (not timed)."""
    start = time.perf_counter()
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        bufsize=1,
        cwd=os.path.dirname(os.path.abspath(__file__)),
        env=env,
    )
    phases = []
    for line in proc.stdout:
        phases.append((round(time.perf_counter() - start, 2), line.rstrip()))
        log(f"  {phases[-1][0]:7.2f} s  {line.rstrip()}")
        if line.startswith("train: epoch 1 "):
            break
    if stop:
        proc.terminate()
        for line in proc.stdout:
            log(f"  (stopping)  {line.rstrip()}")
    proc.kill()
    proc.wait()
    if not phases or not phases[-1][1].startswith("train: epoch 1 "):
        sys.exit(
            f"error: train_classify.py ended before its first step: {phases[-1][1] if phases else ''}"
        )
    return phases


def startup(args):
    """Seconds from ``python train_classify.py`` to its first training step, --startup-runs times
    each: a fresh run (no header check kept: every image's first bytes read), that run resumed
    (``--resume auto`` after a SIGTERM at its first step, as a requeue), and a new run over the data
    the first checked; the median and spread of each, the time to each of their log lines, the peak
    memory, and the imports alone timed apart."""
    args.data_dir, _ = jpeg_set(args)
    root, counts = startup_tree(args)
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, "-c", "import torch, torchvision, nvidia.dali, pipelines"], check=True
    )
    imports = time.perf_counter() - start
    cmd = [sys.executable, "train_classify.py", "--data", root, "--arch", args.models.split(",")[0]]
    cmd += [
        "-b",
        str(args.batch_size),
        "-j",
        str(args.workers),
        "--epochs",
        "1",
        "--print-freq",
        "1",
    ]
    cmd += [] if args.gpu else ["--dali-device", "cpu"]
    cmd += [] if args.compile else ["--no-compile"]  # a GPU run compiles in its first step
    log(
        f"startup: {' '.join(cmd)} ({counts['train']} train and {counts['val']} val images; imports "
        f"alone {imports:.1f} s)"
    )
    starts = ("fresh", "resume", "new_run")
    runs = []
    for _ in range(args.startup_runs):
        # the load average before each start: other work on the machine slows them
        run = dict(load=[])
        with tempfile.TemporaryDirectory() as tmp:
            # the header check's cache (data_sources.HEAD_CACHE) of this round alone
            env = dict(os.environ, XDG_CACHE_HOME=os.path.join(tmp, "cache"))
            out = ["--output-dir", os.path.join(tmp, "run")]
            flags = (out, out + ["--resume", "auto"], ["--output-dir", os.path.join(tmp, "new")])
            for name, more in zip(starts, flags):
                run["load"].append(os.getloadavg()[0])
                log(f"{name} (load average {run['load'][-1]:.2f})")
                run[name] = lines_to_first_step(cmd + more, env, stop=name == "fresh")
        runs.append(run)
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20  # KiB on Linux
    first_steps = {k: [run[k][-1][0] for run in runs] for k in starts}
    report = dict(
        meta=meta(args),
        startup=dict(
            command=cmd[1:],
            train_images=counts["train"],
            val_images=counts["val"],
            imports_s=round(imports, 2),
            first_step_s={
                k: dict(median=statistics.median(v), runs=v) for k, v in first_steps.items()
            },
            runs=runs,
            peak_memory_gb=round(peak, 2),
        ),
    )
    for k, v in first_steps.items():
        log(f"{k}: first training step after {statistics.median(v):.1f} s (median; runs {v})")
    log(f"peak memory {peak:.2f} GB")
    save(report, args.json)


def ddp_bench(args):
    """``torchrun --nproc_per_node=N bench.py --ddp``: training img/s of each model on one GPU and on N GPUs
    (DDP), fed by DALI (each process its own shard, its own share of the CPU cores) and by a synthetic
    batch; rank 0 prints the table with DALI / synthetic and the scaling img/s(N) / (N x img/s(1))."""
    rank, local_rank, world = (
        int(os.environ["RANK"]),
        int(os.environ["LOCAL_RANK"]),
        int(os.environ["WORLD_SIZE"]),
    )
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
    try:
        torch.backends.cudnn.benchmark = True
        torch.cuda.set_stream(
            torch.cuda.Stream(priority=-1)
        )  # as the trainers: DALI's kernels fill the gaps
        if rank == 0:
            args.data_dir, _ = jpeg_set(args)
        dist.barrier()
        args.data_dir, _ = jpeg_set(args)  # made by rank 0; the others only find it
        rows = ddp_rows(args, rank, local_rank, world)
        if rank == 0:
            ddp_report(rows, args, world)
    except (Exception, KeyboardInterrupt):
        if (
            world > 1
        ):  # as in the trainers: the others may wait in a collective, and a graceful exit with them
            traceback.print_exc()
            sys.stderr.flush()
            os._exit(1)
        raise
    finally:
        dist.destroy_process_group()


def ddp_rows(args, rank, local_rank, world):
    """Rows of each model on one GPU and on ``world``, synthetic and DALI-fed; a process outside a
    measurement waits for the ones in it."""
    rows = []
    for model_name in args.models.split(","):
        for gpus in sorted({1, world}):
            for name, make in (
                ("synthetic", synthetic_classify),
                (
                    "dali-mixed",
                    partial(dali_classify, device_id=local_rank, shard_id=rank, num_shards=gpus),
                ),
            ):
                if rank >= gpus:  # not in this measurement: wait for the ones that are
                    dist.barrier()
                    continue
                model = getattr(torchvision.models, model_name)(
                    weights=None, num_classes=1000
                ).cuda()
                model = model.to(memory_format=torch.channels_last)
                optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
                if gpus > 1:  # all the processes: the default group
                    model = torch.nn.parallel.DistributedDataParallel(
                        model, device_ids=[local_rank]
                    )
                model = torch.compile(model) if args.compile else model
                row = time_training(model_name, model, optimizer, name, make, args)
                if gpus > 1:  # every process trained its own share: the job's rate is their sum
                    total = torch.tensor([row["img_per_s"], row["data_wait_pct"]], device="cuda")
                    dist.all_reduce(total)
                    row["img_per_s"], row["data_wait_pct"] = (
                        round(total[0].item(), 1),
                        round(total[1].item() / gpus, 1),
                    )
                rows.append(dict(row, gpus=gpus))
                del model, optimizer
                torch.cuda.empty_cache()
                dist.barrier()
    return rows


def ddp_report(rows, args, world):
    """Rank 0's table: each row's share of the synthetic rate and its scaling over one GPU."""
    for row in rows:
        same = {
            r["loader"]: r["img_per_s"]
            for r in rows
            if r["model"] == row["model"] and r["gpus"] == row["gpus"]
        }
        one = next(
            r["img_per_s"]
            for r in rows
            if r["model"] == row["model"] and r["gpus"] == 1 and r["loader"] == row["loader"]
        )
        row["vs_synthetic"] = round(row["img_per_s"] / same["synthetic"], 3)
        row["scaling"] = round(row["img_per_s"] / (row["gpus"] * one), 3)
    print(
        "\n".join(
            table(
                f"DDP: training img/s on 1 and {world} GPUs (bf16, channels_last, SGD, batch "
                f"{args.batch_size} per GPU, {args.gpu_threads} DALI threads per process)",
                rows,
                [
                    ("model", "model", ""),
                    ("GPUs", "gpus", "d"),
                    ("loader", "loader", ""),
                    ("img/s", "img_per_s", ",.1f"),
                    ("vs synthetic", "vs_synthetic", ".3f"),
                    ("scaling", "scaling", ".3f"),
                    ("data wait %", "data_wait_pct", ".1f"),
                ],
            )
        ),
        flush=True,
    )
    save(dict(meta=meta(args), ddp=rows), args.json)


def guarded(row, measure, *args):
    """``measure(*args)``, or ``row`` with the error: one broken loader costs its row, not the whole run."""
    try:
        return measure(*args)
    except Exception as e:
        traceback.print_exc()
        log(f"  FAILED {' '.join(row.values())}: {type(e).__name__}: {e}")
        return dict(row, img_per_s=None, error=f"{type(e).__name__}: {e}")


def with_ratios(rows, group=None):
    """Adds each row's img/s relative to the DataLoader's (the DataLoader's of the same ``group``, e.g. model)."""
    for row in rows:
        base = next(
            (
                r["img_per_s"]
                for r in rows
                if r["loader"] == "dataloader" and (group is None or r[group] == row[group])
            ),
            None,
        )
        row["vs_dataloader"] = (
            round(row["img_per_s"] / base, 2) if row["img_per_s"] and base else None
        )
    return rows


# ------------------------------------------------------------------------------------------
# report
# ------------------------------------------------------------------------------------------


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            return next(
                line.split(":", 1)[1].strip() for line in f if line.startswith("model name")
            )
    except (OSError, StopIteration):
        return platform.processor() or "unknown"


def meta(args):
    return dict(
        date=datetime.now().astimezone().isoformat(timespec="seconds"),
        command=shlex.join(sys.orig_argv),
        gpu=torch.cuda.get_device_name(0) if args.gpu else None,
        cpu_count=os.cpu_count(),
        cpus_usable=usable_cpus(),
        cpu_model=cpu_model(),
        versions=dict(
            python=platform.python_version(),
            dali=nvidia.dali.__version__,
            torch=torch.__version__,
            torchvision=torchvision.__version__,
        ),
        settings=dict(
            batch_size=args.batch_size,
            seg_batch_size=args.seg_batch_size,
            workers=args.workers,
            gpu_threads=args.gpu_threads,
            warmup=args.warmup,
            iters=args.iters,
            max_seconds=args.max_seconds,
            hw_decoder_load=args.hw_decoder_load,
            prefetch_queue_depth=args.prefetch_queue_depth,
            models=args.models,
            compile=args.compile,
            quick=args.quick,
            # CPU-only pipelines run independent operators at once only with it (pipelines.cpu_concurrency)
            dali_new_thread_pool=os.environ.get("DALI_USE_NEW_THREAD_POOL") == "1",
        ),
    )


def header_lines(report):
    m, d, s = report["meta"], report["dataset"], report["segmentation_dataset"]
    v, cfg = m["versions"], m["settings"]
    load = cfg["hw_decoder_load"]
    if load is None:
        load = f"{DEFAULT_HW_DECODER_LOAD} (with the decoder cache {CACHED_HW_DECODER_LOAD})"
    return [
        f"date      {m['date']}",
        f"command   {m['command']}",
        f"hardware  GPU: {m['gpu'] or 'none'} | CPU: {m['cpu_count']} cores ({m['cpus_usable']} usable), "
        f"{m['cpu_model']}",
        f"versions  python {v['python']} | DALI {v['dali']} | torch {v['torch']} | torchvision {v['torchvision']}",
        f"settings  batch {cfg['batch_size']} (segmentation {cfg['seg_batch_size']}) | workers = CPU-only DALI "
        f"threads {cfg['workers']} | GPU DALI threads {cfg['gpu_threads']} | warmup {cfg['warmup']} + up to "
        f"{cfg['iters']} timed batches or {cfg['max_seconds']:g} s | hw_decoder_load {load} | "
        f"prefetch {cfg['prefetch_queue_depth']} | DALI_USE_NEW_THREAD_POOL "
        f"{'1' if cfg['dali_new_thread_pool'] else 'unset'}",
        f"images    {d['images']} JPEGs in {d['classes']} classes ({d['source']}, {d['path']}): mean "
        f"{d['mean_height']:.0f} x {d['mean_width']:.0f} px = {d['mean_pixels']:,} px, mean {d['mean_kib']} KiB",
        f"seg       {s['samples']} image/mask .npy pairs ({s['path']}): {s['height']} x {s['width']} px "
        f"= {s['mean_pixels']:,} px, mean {s['mean_kib']} KiB per image",
    ]


def table(title, rows, columns):
    """``columns``: (heading, key, format) triples; text (format "") aligns left, numbers right, and a
    missing value prints as '-'."""
    cells = [[heading for heading, _, _ in columns]]
    cells += [
        [format(row[key], fmt) if row.get(key) is not None else "-" for _, key, fmt in columns]
        for row in rows
    ]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    lines = ["", title]
    for line in cells:
        lines.append(
            "  ".join(
                cell.ljust(width) if fmt == "" else cell.rjust(width)
                for cell, width, (_, _, fmt) in zip(line, widths, columns)
            )
        )
    lines += [
        f"FAILED {row.get('model', '')} {row['loader']}: {row['error']}"
        for row in rows
        if "error" in row
    ]
    return lines


LOADER_COLUMNS = [
    ("loader", "loader", ""),
    ("img/s", "img_per_s", ",.1f"),
    ("vs DataLoader", "vs_dataloader", ".2f"),
    ("data wait %", "data_wait_pct", ".1f"),
    ("startup s", "startup_s", ".1f"),
]


def report_lines(report):
    lines = header_lines(report)
    batch, where = (
        report["meta"]["settings"]["batch_size"],
        "GPU" if report["meta"]["gpu"] else "CPU",
    )
    if report["decoder"]:
        lines += table(
            "decoder ceiling: mixed decode alone (no resize, no normalize), images decoded on the GPU",
            report["decoder"],
            LOADER_COLUMNS[:2],
        )
    lines += table(
        f"classification loaders: batches of {batch} x 3 x {CROP} x {CROP} float32 delivered to the {where}",
        report["classification"],
        LOADER_COLUMNS,
    )
    lines += table(
        f"segmentation loaders: samples/s, 3 x {SEG_OUTPUT[0]} x {SEG_OUTPUT[1]} image + mask",
        report["segmentation"],
        LOADER_COLUMNS,
    )
    if report["end_to_end"]:
        how = "compiled" if report["meta"]["settings"].get("compile") else "eager"
        lines += table(
            f"end to end: training img/s ({how}, bf16, channels_last, SGD) and the share of each "
            "step spent waiting for data",
            report["end_to_end"],
            [("model", "model", "")] + LOADER_COLUMNS[:4],
        )
    if report["cache"]:
        lines += table(
            "decoder cache: the first epoch, which fills it, and the GPU memory DALI holds then",
            report["cache"],
            [
                ("cache MB", "cache_mb", "d"),
                ("first epoch s", "first_epoch_s", ".2f"),
                ("img/s", "first_epoch_img_per_s", ",.1f"),
                ("DALI GB", "dali_gpu_gb", ".2f"),
            ],
        )
    if report["sweep"]:
        lines += table(
            "sweep: mixed-decode loader",
            report["sweep"],
            [
                ("setting", "loader", ""),
                ("threads", "threads", "d"),
                ("hw_decoder_load", "hw_decoder_load", ".2f"),
                ("img/s", "img_per_s", ",.1f"),
            ],
        )
    lines += [f"skipped   {section}: {why}" for section, why in report["skipped"].items()]
    return lines


def save(report, path):
    with atomic_open(path, "w") as f:
        json.dump(report, f, indent=2)


# ------------------------------------------------------------------------------------------


def classification_loaders(args):
    """(name, loader) rows of the classification section, --auto-augment's and --only's choices
    applied: on a GPU, mixed decode (output forms, the decoder cache, the peer) and the CPU's decode;
    the shard layouts; CPU-only DALI, the peer on the CPU, and the DataLoader."""
    device_id = 0 if args.gpu else None
    shards = [
        (
            f"{'dali-mixed' if args.gpu else 'dali-cpu'}-{fmt}",
            partial(dali_classify, device_id=device_id, layout=fmt),
        )
        for fmt in ("tfrecord", "wds")
    ]
    # The decoder cache: whole images decoded once into a cache that holds them all, half or a tenth.
    cache_mb = math.ceil(1.1 * decoded_size(ClassifyValPipeline(1, 1, None, args.data_dir)))
    loaders = (
        [
            ("dali-mixed", partial(dali_classify, device_id=0)),
            ("dali-mixed-hwc", partial(dali_classify, device_id=0, output_layout="HWC")),
            (
                "dali-mixed-hwc-fp16",
                partial(dali_classify, device_id=0, output_layout="HWC", dtype="float16"),
            ),
            (
                "dali-cpu-decode-hwc",
                partial(dali_classify, device_id=0, output_layout="HWC", decoder="cpu"),
            ),
            (
                "dali-mixed-full",
                partial(dali_classify, device_id=0, output_layout="HWC", decoder_cache=0),
            ),
        ]
        + [
            (
                f"dali-mixed-{name}",
                partial(dali_classify, device_id=0, output_layout="HWC", decoder_cache=mb),
            )
            for name, mb in (
                ("cached", cache_mb),
                ("half-cache", cache_mb // 2),
                ("tenth-cache", cache_mb // 10),
            )
        ]
        if args.gpu
        else []
    )
    loaders += [("nvidia-example", partial(nvidia_example, device_id=0))] if args.gpu else []
    loaders += example_steps() if args.gpu and args.against_example else []
    loaders += shards + [
        ("dali-cpu", partial(dali_classify, device_id=None)),
        ("nvidia-example-cpu", partial(nvidia_example, device_id=None)),
        ("dataloader", torchvision_classify),
    ]
    if args.auto_augment:  # each loader of these with the policy too, beside it without
        policy = dict(auto_augment=args.auto_augment)
        loaders += [
            (f"{name}-{args.auto_augment}", partial(make, **policy))
            for name, make in loaders
            if name in ("dali-mixed-hwc", "dali-mixed-cached", "dali-cpu", "dataloader")
        ]
    return chosen(loaders, args.only) if args.only else loaders


def chosen(loaders, only):
    """The (name, loader) rows that --only's comma-separated words name a part of; a word that
    names none is refused in one line, with the names."""
    words = only.split(",")
    if unmatched := [w for w in words if not any(w in name for name, _ in loaders)]:
        names = ", ".join(name for name, _ in loaders)
        print(
            f"error: --only {only}: {', '.join(unmatched)} names none of {names}", file=sys.stderr
        )
        sys.exit(2)
    return [(name, make) for name, make in loaders if any(w in name for w in words)]


def end_to_end(args, loaders, report):
    """Training steps of each of --models fed by the synthetic batch, then by each GPU loader."""
    log("end to end")
    torch.backends.cudnn.benchmark = True
    # as in training.py: training kernels first, DALI's kernels fill the gaps
    torch.cuda.set_stream(torch.cuda.Stream(priority=-1))
    for model_name in args.models.split(","):
        model = getattr(torchvision.models, model_name)(weights=None, num_classes=1000)
        model = model.cuda().to(memory_format=torch.channels_last)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        # compiled in the first warm-up step
        model = torch.compile(model) if args.compile else model
        # the GPU loaders only: CPU-only DALI and the DataLoader fall far short of these models (README)
        for name, make in [("synthetic", synthetic_classify)] + [
            loader
            for loader in loaders
            if loader[0].startswith(("dali-mixed", "dali-cpu-decode", "nvidia-example"))
            and not loader[0].endswith("-cpu")
        ]:
            report["end_to_end"].append(
                guarded(
                    dict(model=model_name, loader=name),
                    time_training,
                    model_name,
                    model,
                    optimizer,
                    name,
                    make,
                    args,
                )
            )
        del model, optimizer
        torch.cuda.empty_cache()
        with_ratios(report["end_to_end"], group="model")
        save(report, args.json)


def sweep(args, report):
    """--sweep: the mixed-decode loader over DALI threads x hw_decoder_load, then the other knobs
    one at a time at the grid's best point."""
    log("sweep: mixed-decode loader")
    for threads, load in itertools.product(SWEEP_THREADS, SWEEP_HW_DECODER_LOADS):
        swept = argparse.Namespace(
            **{**vars(args), "gpu_threads": threads, "hw_decoder_load": load}
        )
        name = f"{threads}t/{load:.2f}"
        row = guarded(
            dict(loader=name), time_loader, name, partial(dali_classify, device_id=0), swept
        )
        report["sweep"].append(dict(threads=threads, hw_decoder_load=load, **row))
        save(report, args.json)
    # The other knobs, one at a time, at the best threads x hw_decoder_load of the grid.
    best = max((r for r in report["sweep"] if r.get("img_per_s")), key=lambda r: r["img_per_s"])
    tuned = argparse.Namespace(
        **{
            **vars(args),
            "gpu_threads": best["threads"],
            "hw_decoder_load": best["hw_decoder_load"],
        }
    )
    for option, value in SWEEP_OPTIONS:
        name = f"{best['loader']} {option}={value}"
        variant = argparse.Namespace(**vars(tuned))
        kwargs = {}
        if option == "prefetch_queue_depth":
            variant.prefetch_queue_depth = value
        else:
            kwargs[option] = value
        row = guarded(
            dict(loader=name),
            time_loader,
            name,
            partial(dali_classify, device_id=0, **kwargs),
            variant,
        )
        report["sweep"].append(
            dict(
                threads=best["threads"],
                hw_decoder_load=best["hw_decoder_load"],
                **{option: value},
                **row,
            )
        )
        save(report, args.json)


def main():
    args = parse_args()
    if args.seg_startup:
        return seg_startup(args)
    if args.startup:
        args.gpu = torch.cuda.is_available()
        return startup(args)
    if args.ddp:
        if not torch.cuda.is_available() or "RANK" not in os.environ:
            sys.exit(
                "error: --ddp: run it under torchrun on a machine with CUDA GPUs, e.g. "
                "torchrun --nproc_per_node=2 bench.py --ddp"
            )
        args.gpu, args.device = True, "cuda"
        return ddp_bench(args)
    side_by_side(args)


def decoder_ceiling(args, report):
    """The mixed decoder alone, whole images and crops: what no loader on this GPU can pass."""
    load = DEFAULT_HW_DECODER_LOAD if args.hw_decoder_load is None else args.hw_decoder_load
    log(f"decoder ceiling: mixed decode alone, hw_decoder_load {load}")
    report["decoder"] = [
        guarded(dict(loader=name), time_decoder, name, args, load, crop)
        for name, crop in (("decode", False), ("crop-decode", True))
    ]
    save(report, args.json)


def segmentation_rows(args, report):
    """The segmentation section: DALI on the GPU (where there is one) and on the CPU, and the
    DataLoader; none under --only, which picks classification loaders."""
    loaders = [("dali-gpu", partial(dali_segment, device_id=0))] if args.gpu else []
    loaders += [("dali-cpu", partial(dali_segment, device_id=None)), ("dataloader", torch_segment)]
    loaders = [] if args.only else loaders
    report["segmentation"] = with_ratios(
        [guarded(dict(loader=name), time_loader, name, make, args) for name, make in loaders]
    )
    save(report, args.json)


def side_by_side(args):
    """The default run: each section's loaders on the same files, one after another, into
    --json."""
    # Beyond the flags, args carries what every loader needs: where batches go and which files to read.
    args.gpu = torch.cuda.is_available()
    args.device = "cuda" if args.gpu else "cpu"
    report = dict(
        meta=meta(args),
        dataset=None,
        segmentation_dataset=None,
        decoder=[],
        classification=[],
        segmentation=[],
        end_to_end=[],
        sweep=[],
        cache=[],
        skipped={},
    )
    log(
        f"bench.py on {report['meta']['gpu'] or 'CPU only'}, {args.workers} workers: {report['meta']['command']}"
    )

    args.data_dir, source = jpeg_set(args)
    report["dataset"] = jpeg_stats(args.data_dir, source)
    args.seg_imgs, args.seg_lbls = seg_set(args)
    report["segmentation_dataset"] = seg_stats(args.seg_imgs, args.seg_lbls)
    for line in header_lines(report)[-2:]:
        log(line)

    if args.gpu and not args.only:
        decoder_ceiling(args, report)
    else:
        report["skipped"]["decoder"] = "--only" if args.only else "no CUDA device"

    args.shards = shard_sets(args)
    log("classification loaders")
    args.cache_fills = report["cache"]
    loaders = classification_loaders(args)
    report["classification"] = with_ratios(
        [guarded(dict(loader=name), time_loader, name, make, args) for name, make in loaders]
    )
    save(report, args.json)

    log("segmentation loaders")
    segmentation_rows(args, report)

    if args.gpu:
        end_to_end(args, loaders, report)
    else:
        report["skipped"]["end_to_end"] = "no CUDA device"

    if args.sweep and args.gpu:
        sweep(args, report)
    elif args.sweep:
        report["skipped"]["sweep"] = "no CUDA device"
    finish(report, args)


def finish(report, args):
    """The report saved and printed; exits non-zero when a measurement failed."""
    save(report, args.json)
    print("\n".join(report_lines(report)), flush=True)
    log(f"results written to {args.json}")
    failed = [
        row
        for section in ("decoder", "classification", "segmentation", "end_to_end", "sweep")
        for row in report[section]
        if "error" in row
    ]
    if failed:
        sys.exit(
            f"{len(failed)} measurement(s) failed: see FAILED above and 'error' in {args.json}"
        )


if __name__ == "__main__":
    main()
