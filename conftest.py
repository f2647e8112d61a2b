"""Fixtures and helpers shared by the test files: tiny classification folders (one colour per image,
or random texture), a train/val root and its shards, segmentation .npy pairs, a prepared
segmentation root whose masks name their pairs (the torchrun tests), all built in tmp_path; the
``gpu`` skip marker. pytest finds the fixtures here by itself; the test files import the rest."""

import os

import numpy as np
import pytest
import torch
from PIL import Image

from data_processing import make_csv_file_npy
from make_shards import make_shards
from pipelines import IMAGENET_MEAN, IMAGENET_STD, classify_iterator, fetch_dali_loader

MEAN = np.array(IMAGENET_MEAN, dtype=np.float32)
STD = np.array(IMAGENET_STD, dtype=np.float32)

# Unsorted, mixed-case names with a space: the order must still match torchvision's ImageFolder.
CLASSES = ["zebra", "Apple", "b c"]
PER_CLASS = 7  # 21 images: batch size 4 does not divide it
NO_AUGMENT = dict(flip_p=0.0, noise_p=0.0, blur_p=0.0, brightness_p=0.0, contrast_p=0.0)
gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def solid_colour(cls, i):
    """Every image gets its own colour, so its identity survives any crop, resize and flip."""
    return (40 + 60 * cls, 10 + 20 * i, 128)


@pytest.fixture
def solid_folder(tmp_path):
    root = tmp_path / "solid"
    for c, name in enumerate(CLASSES):
        (root / name).mkdir(parents=True)
        for i in range(PER_CLASS):
            size = (40 + 8 * i, 56 - 4 * c)
            Image.new("RGB", size, solid_colour(c, i)).save(root / name / f"img{i}.png")
    return root


@pytest.fixture
def texture_folder(tmp_path):
    root = tmp_path / "texture"
    rng = np.random.default_rng(0)
    for name in CLASSES:
        (root / name).mkdir(parents=True)
        for i in range(4):
            pixels = rng.integers(0, 256, size=(48, 64, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / name / f"t{i}.jpg", quality=90)
    return root


def unnormalize(images):
    """(B, 3, H, W) normalized tensor -> (B, H, W, 3) float array on the 0..255 scale."""
    return images.float().cpu().numpy().transpose(0, 2, 3, 1) * STD + MEAN


def identities(images):
    """(class, index) of each image of a batch of solid-colour images."""
    colours = np.rint(unnormalize(images).mean(axis=(1, 2))).astype(int)
    return [((r - 40) // 60, (g - 10) // 20) for r, g, _ in colours]


def one_epoch(pipe):
    seen, labels = [], []
    for batch in classify_iterator(pipe):
        seen += identities(batch[0]["data"])
        labels += batch[0]["label"].squeeze(-1).tolist()
    return seen, labels


def first_batches(it, n):
    """The next ``n`` batches of a classification iterator, across epochs, on the CPU."""
    out = []
    while len(out) < n:
        for batch in it:
            out.append((batch[0]["data"].cpu(), batch[0]["label"].cpu()))
            if len(out) == n:
                break
    return out


def same_batches(a, b):
    return len(a) == len(b) and all(
        torch.equal(x, z) and torch.equal(y, w) for (x, y), (z, w) in zip(a, b)
    )


# ------------------------------------------------------------------------------------------
# classification: an ImageFolder train/val root and its TFRecord or WebDataset shards
# ------------------------------------------------------------------------------------------


FORMATS = ["tfrecord", "wds"]
VAL_CLASSES = ["zebra", "b c"]


@pytest.fixture
def split_root(tmp_path):
    """An ImageFolder root: train/ with every class of CLASSES, val/ with two of them; solid-colour PNGs."""
    root = tmp_path / "folder"
    for split, names, n in (("train", CLASSES, PER_CLASS), ("val", VAL_CLASSES, 2)):
        for name in names:
            c = CLASSES.index(name)
            (root / split / name).mkdir(parents=True)
            for i in range(n):
                Image.new("RGB", (40 + 8 * i, 56 - 4 * c), solid_colour(c, i)).save(
                    root / split / name / f"img{i}.png"
                )
    return root


def to_shards(root, fmt, seed=0, shard_size=8):
    dst = root.parent / f"{fmt}-{seed}"
    make_shards(str(root), str(dst), fmt, shard_size, seed)
    return dst


# ------------------------------------------------------------------------------------------
# segmentation
# ------------------------------------------------------------------------------------------


SEG_H, SEG_W, SEG_N = 24, 40, 10
# fetch_dali_loader reads the shard and device from these when it is not told
DIST_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK")


@pytest.fixture
def no_dist_env(monkeypatch):
    """Used by every test of test_pipelines.py and test_data_sources.py (their pytestmark)."""
    for name in DIST_ENV:
        monkeypatch.delenv(name, raising=False)


def seg_mask(k):
    """An asymmetric mask of classes 0, 1, 2 that differs per sample: flips and mix-ups show."""
    mask = np.zeros((SEG_H, SEG_W, 1), np.uint8)
    mask[2 + k % 5 : 12, 3 : 6 + 2 * k] = 1
    mask[14:20, 25 + k % 7 : 38] = 2
    return mask


def save_pairs(tmp_path, images, masks, names=None):
    """Writes images[i] and masks[i] as .npy files (named by ``names``: (image, mask) pairs); their paths."""
    imgs, lbls = [], []
    for k, (image, mask) in enumerate(zip(images, masks)):
        image_name, mask_name = names[k] if names else (f"images/s{k}.npy", f"masks/s{k}.npy")
        for path, array, paths in (
            (tmp_path / image_name, image, imgs),
            (tmp_path / mask_name, mask, lbls),
        ):
            path.parent.mkdir(parents=True, exist_ok=True)
            np.save(path, array)
            paths.append(str(path))
    return imgs, lbls


def seg_image(k):
    # channel 0 encodes the mask and channel 1 the sample, so alignment and identity read back from the image
    mask = seg_mask(k)[..., 0]
    return np.stack([mask * 100, np.full_like(mask, 10 * k), np.full_like(mask, 50)], -1).astype(
        np.uint8
    )


def id_coded_root(root, count, valid_fraction, grey_step):
    """A prepared segmentation root of ``count`` 32 x 32 pairs and its split (csv_file/): pair k's
    mask holds k + 1 foreground pixels, its id as a trainer's Dice and loss see it, and its image
    the grey level ``grey_step`` x k. Returns each split's ids in the split's order:
    {"train": [...], "valid": [...]}."""
    for k in range(count):
        for kind in ("Images", "Masks"):
            os.makedirs(root / kind / "1", exist_ok=True)
        mask = np.zeros((32 * 32, 1), np.uint8)
        mask[: k + 1] = 1
        np.save(root / "Masks" / "1" / f"{k}.npy", mask.reshape(32, 32, 1))
        np.save(root / "Images" / "1" / f"{k}.npy", np.full((32, 32, 3), grey_step * k, np.uint8))
    make_csv_file_npy(str(root), valid_fraction=valid_fraction, seed=0)
    ids = {}
    for split in ("train", "valid"):
        rows = (root / "csv_file" / f"{split}.csv").read_text().splitlines()[1:]
        ids[split] = [int(row.split(",")[2].split("/")[-1][:-4]) + 1 for row in rows]
    return ids


@pytest.fixture
def seg_files(tmp_path):
    return save_pairs(
        tmp_path, [seg_image(k) for k in range(SEG_N)], [seg_mask(k) for k in range(SEG_N)]
    )


def seg_pipe(imgs, lbls, batch_size, mode, device_id=None, **kwargs):
    """fetch_dali_loader on the CPU unless told otherwise (by default it takes a GPU where PyTorch sees one)."""
    return fetch_dali_loader(
        imgs, lbls, batch_size=batch_size, mode=mode, device_id=device_id, **kwargs
    )


# Deletes the file named by argv[1] as the first checkpoint is saved: at the end of epoch 1.
DELETE_AT_FIRST_SAVE = """
import os, runpy, sys, torch
gone, sys.argv = sys.argv[1], sys.argv[2:]
sys.path.insert(0, os.path.dirname(sys.argv[0]))
save = torch.save
def save_then_delete(*args, **kwargs):
    save(*args, **kwargs)
    if os.path.exists(gone):
        os.remove(gone)
torch.save = save_then_delete
runpy.run_path(sys.argv[0], run_name="__main__")
"""
