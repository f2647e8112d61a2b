"""Tests of pipelines.py on tiny data built in tmp_path. CPU-only DALI everywhere; the GPU tests at
the end run where a CUDA device is visible (see README: they were run on an H200)."""

import functools
import io
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tarfile
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch
from nvidia.dali import ops, types
from nvidia.dali.pipeline import OperatorConcurrency, Pipeline
from nvidia.dali.plugin.pytorch import DALIGenericIterator
from PIL import Image
from torchvision.datasets import ImageFolder

import pipelines
from make_shards import make_shards, write_tar, write_tfrecord
from pipelines import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    ClassifyTrainPipeline,
    ClassifyValPipeline,
    DataError,
    SegmentTrainPipeline,
    SegmentValPipeline,
    classify_iterator,
    fetch_dali_loader,
    find_layout,
    find_undecodable,
    list_image_folder,
    segment_iterator,
    shard_files,
)

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


# ------------------------------------------------------------------------------------------
# classification
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype,torch_dtype,atol", [("float32", torch.float32, 1e-5), ("float16", torch.float16, 2e-3)])
def test_train_solid_colour_gives_exact_normalized_constant(solid_folder, dtype, torch_dtype, atol):
    pipe = ClassifyTrainPipeline(4, 2, None, str(solid_folder), crop_size=32, seed=1, dtype=dtype)
    batch = next(iter(classify_iterator(pipe)))[0]
    images, labels = batch["data"], batch["label"]
    assert images.shape == (4, 3, 32, 32) and images.dtype == torch_dtype and images.device.type == "cpu"
    assert labels.shape == (4, 1) and labels.dtype == torch.int32
    for image, (c, i) in zip(images, identities(images)):
        expected = (np.array(solid_colour(c, i), dtype=np.float32) - MEAN) / STD
        np.testing.assert_allclose(image.float().numpy(), np.broadcast_to(expected[:, None, None], (3, 32, 32)),
                                   atol=atol)


@pytest.mark.parametrize("pipeline", [ClassifyTrainPipeline, ClassifyValPipeline])
def test_hwc_output_is_the_chw_output_in_channels_last_memory(texture_folder, pipeline):
    def first_batch(output_layout):
        pipe = pipeline(4, 2, None, str(texture_folder), crop_size=24, seed=7, output_layout=output_layout)
        return next(iter(classify_iterator(pipe)))[0]["data"]

    chw, hwc = first_batch("CHW"), first_batch("HWC")
    assert chw.shape == (4, 3, 24, 24) and hwc.shape == (4, 24, 24, 3)
    nchw = hwc.permute(0, 3, 1, 2)
    assert nchw.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(nchw, chw)
    with pytest.raises(ValueError, match="output_layout must be 'CHW' or 'HWC'"):
        pipeline(4, 2, None, str(texture_folder), output_layout="NCHW")


def test_labels_are_imagefolder_class_indices(solid_folder):
    class_to_idx = ImageFolder(str(solid_folder)).class_to_idx
    assert class_to_idx == {"Apple": 0, "b c": 1, "zebra": 2}
    pipe = ClassifyTrainPipeline(4, 2, None, str(solid_folder), crop_size=24, seed=3)
    seen, labels = one_epoch(pipe)
    for (c, _), label in zip(seen, labels):
        assert label == class_to_idx[CLASSES[c]]
    assert sorted(set(labels)) == [0, 1, 2]


EVERYTHING = sorted((c, i) for c in range(len(CLASSES)) for i in range(PER_CLASS))


def test_val_epoch_sees_every_file_once(solid_folder):
    pipe = ClassifyValPipeline(4, 2, None, str(solid_folder), crop_size=24)
    for _ in range(2):  # auto_reset: the second epoch is complete too
        seen, _ = one_epoch(pipe)
        assert sorted(seen) == EVERYTHING


def batch_sizes_and_identities(pipe):
    sizes, seen = [], []
    for batch in classify_iterator(pipe):
        sizes.append(batch[0]["data"].shape[0])
        seen += identities(batch[0]["data"])
    return sizes, seen


def test_train_epoch_is_full_batches_of_real_samples(solid_folder):
    pipe = ClassifyTrainPipeline(4, 2, None, str(solid_folder), crop_size=24, seed=5)
    for _ in range(2):
        sizes, seen = batch_sizes_and_identities(pipe)
        assert sizes == [4] * 6  # 21 samples: the last batch is filled up to 4
        assert sorted(set(seen)) == EVERYTHING  # every sample, nothing made up
        assert sorted(Counter(seen).values()) == [1] * 18 + [2] * 3  # the padding: three distinct real samples


def test_two_val_shards_cover_the_dataset_once(solid_folder):
    shards = [one_epoch(ClassifyValPipeline(4, 2, None, str(solid_folder), crop_size=24, shard_id=s,
                                            num_shards=2))[0] for s in range(2)]
    assert not set(shards[0]) & set(shards[1])
    assert sorted(shards[0] + shards[1]) == EVERYTHING
    assert abs(len(shards[0]) - len(shards[1])) <= 1


def test_two_train_shards_run_equal_full_batches_and_cover_the_dataset(solid_folder):
    shards = [batch_sizes_and_identities(ClassifyTrainPipeline(4, 2, None, str(solid_folder), crop_size=24,
                                                               shard_id=s, num_shards=2, seed=5)) for s in range(2)]
    # 21 samples and 3 distinct ones repeated: two shards of 3 batches of 4, as DistributedSampler pads
    assert [sizes for sizes, _ in shards] == [[4, 4, 4], [4, 4, 4]]
    counts = Counter(shards[0][1] + shards[1][1])
    assert sorted(counts) == EVERYTHING and sorted(counts.values()) == [1] * 18 + [2] * 3


def test_same_seed_same_batches_other_seed_different(texture_folder):
    def first_batches(seed):
        it = classify_iterator(ClassifyTrainPipeline(4, 2, None, str(texture_folder), crop_size=32, seed=seed))
        return [next(it)[0]["data"].clone() for _ in range(2)]

    a, b, c = first_batches(11), first_batches(11), first_batches(12)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not all(torch.equal(x, y) for x, y in zip(a, c))


def test_val_center_crop_lands_in_the_center(tmp_path):
    # 256 x 320 image whose pixels encode their position: R = row, G = column // 2.
    rows, cols = np.meshgrid(np.arange(256), np.arange(320), indexing="ij")
    pixels = np.stack([rows, cols // 2, np.full_like(rows, 77)], axis=-1).astype(np.uint8)
    (tmp_path / "pos" / "only").mkdir(parents=True)
    Image.fromarray(pixels).save(tmp_path / "pos" / "only" / "a.png")
    pipe = ClassifyValPipeline(1, 1, None, str(tmp_path / "pos"), crop_size=224, resize_size=256)
    image = unnormalize(next(iter(classify_iterator(pipe)))[0]["data"])[0]
    assert image.shape == (224, 224, 3)
    # the shorter side is already 256, so no resize: the crop starts at row 16, column 48
    np.testing.assert_allclose(image, pixels[16:240, 48:272].astype(np.float32), atol=0.01)


def test_val_resizes_shorter_side_before_the_crop(solid_folder):
    pipe = ClassifyValPipeline(3, 1, None, str(solid_folder), crop_size=20, resize_size=24)
    images = next(iter(classify_iterator(pipe)))[0]["data"]
    assert images.shape == (3, 3, 20, 20)


def exif_rotated(path, size=(64, 48)):
    """A JPEG, red on its left half and blue on its right, that asks viewers to turn it 90 degrees (EXIF 6)."""
    pixels = np.zeros((size[1], size[0], 3), np.uint8)
    pixels[:, :size[0] // 2, 0] = pixels[:, size[0] // 2:, 2] = 255
    exif = Image.Exif()
    exif[0x0112] = 6
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels).save(path, quality=95, exif=exif)


def test_exif_orientation_is_not_applied_as_in_torchvision(tmp_path):
    """torchvision's PIL loader ignores EXIF orientation; so do the pipelines, so that a photo reaches the model the
    same way whichever loader reads it."""
    exif_rotated(tmp_path / "exif" / "c" / "a.jpg")
    torchvision_image = np.asarray(ImageFolder(str(tmp_path / "exif"))[0][0])
    assert torchvision_image.shape == (48, 64, 3) and torchvision_image[:, :8, 0].mean() > 200  # not turned
    image = unnormalize(next(iter(classify_iterator(ClassifyValPipeline(
        1, 1, None, str(tmp_path / "exif"), crop_size=48, resize_size=48))))[0]["data"])[0]
    assert image[:, :8, 0].mean() > 200 and image[:, -8:, 2].mean() > 200  # red left, blue right: not turned
    train = next(iter(classify_iterator(ClassifyTrainPipeline(1, 1, None, str(tmp_path / "exif"), crop_size=16,
                                                              random_area=(1.0, 1.0), random_aspect_ratio=(4 / 3, 4 / 3),
                                                              seed=0))))[0]["data"]
    columns = unnormalize(train)[0].mean(axis=0)  # flipped or not, one side red and the other blue
    assert {columns[:4, 0].mean() > 200, columns[-4:, 0].mean() > 200} == {True, False}


def photo_like(h, w, seed=0):
    """Smooth colour gradients with grain: what a resize filter's differences show on."""
    y, x = np.mgrid[0:h, 0:w] / max(h, w)
    base = np.stack([128 + 100 * np.sin(6 * x + 2 * y), 128 + 90 * np.cos(5 * y - 3 * x), 60 + 150 * x * y], -1)
    return np.clip(base + np.random.default_rng(seed).normal(0, 12, (h, w, 3)), 0, 255).astype(np.uint8)


FLIPS = [np.array(f, np.float32) for f in ([0, 0], [1, 0], [0, 1], [1, 1])]  # (vertical, horizontal)


@pytest.mark.parametrize("shape", [(449, 450), (300, 200), (97, 150), (60, 500), (224, 224)])
@pytest.mark.parametrize("antialias", [True, False], ids=["classification", "segmentation"])
def test_cpu_resize_by_torch_is_dalis_resize(shape, antialias):
    """CPU-only pipelines resize 8-bit images with torch (resize_with_torch) where the GPU pipelines use DALI's
    Resize: the classification crop antialiased (DALI's INTERP_TRIANGULAR), segmentation images linearly and
    flipped by a backwards region of interest. Torch's result is DALI's up to rounding, flips included; the
    antialiased one is also PIL's bilinear resize, which torchvision's RandomResizedCrop applies to PIL images.
    Shrinking, enlarging, both at once, and neither."""
    image = photo_like(*shape)
    with ThreadPoolExecutor(2) as pool:
        outs = pipelines.resize_with_torch(pool, 2, (224, 224), antialias, [image] * 4, FLIPS)
    assert all(out.dtype == np.uint8 and out.shape == (3, 224, 224) for out in outs)
    outs = [out.transpose(1, 2, 0) for out in outs]

    class DaliResize(Pipeline):
        def __init__(self):
            super().__init__(4, 1, None)
            self.images = ops.ExternalSource(source=lambda: [image] * 4, layout="HWC", batch=True)
            self.flips = ops.ExternalSource(source=lambda: FLIPS, batch=True)
            self.resize = ops.Resize(resize_x=224, resize_y=224, antialias=antialias, roi_relative=True,
                                     interp_type=types.INTERP_TRIANGULAR if antialias else types.INTERP_LINEAR)

        def define_graph(self):
            flips = self.flips()
            return self.resize(self.images(), roi_start=flips, roi_end=1 - flips)

    pipe = DaliResize()
    pipe.build()
    dali = np.array(pipe.run()[0].as_tensor()).astype(int)
    for out, expected in zip(outs, dali):
        diff = np.abs(out.astype(int) - expected)
        assert diff.mean() < 0.25 and np.percentile(diff, 99) <= 1 and diff.max() <= 4
    if antialias:
        pil = np.asarray(Image.fromarray(image).resize((224, 224), Image.BILINEAR)).astype(int)
        assert np.abs(outs[0].astype(int) - pil).max() <= 1


def test_file_list(tmp_path, solid_folder):
    listing = tmp_path / "list.txt"
    listing.write_text("zebra/img0.png 5\nApple/img3.png 9\n")
    pipe = ClassifyValPipeline(2, 1, None, str(solid_folder), crop_size=16, file_list=str(listing))
    batch = next(iter(classify_iterator(pipe)))[0]
    assert batch["label"].squeeze(-1).tolist() == [5, 9]
    assert identities(batch["data"]) == [(0, 0), (1, 3)]


# ------------------------------------------------------------------------------------------
# classification: TFRecord and WebDataset shards, labels, classes by name, random erasing
# ------------------------------------------------------------------------------------------

FORMATS = ["tfrecord", "wds"]
# torchvision's indices of CLASSES, which every split is labelled by
TRAIN_INDEX = {"Apple": 0, "b c": 1, "zebra": 2}
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
                Image.new("RGB", (40 + 8 * i, 56 - 4 * c), solid_colour(c, i)).save(root / split / name / f"img{i}.png")
    return root


def expected_pairs(split):
    """(identity, label) of every image of a split of ``split_root``, labelled by train's classes."""
    names, n = (CLASSES, PER_CLASS) if split == "train" else (VAL_CLASSES, 2)
    return sorted(((CLASSES.index(name), i), TRAIN_INDEX[name]) for name in names for i in range(n))


def to_shards(root, fmt, seed=0, shard_size=8):
    dst = root.parent / f"{fmt}-{seed}"
    make_shards(str(root), str(dst), fmt, shard_size, seed)
    return dst


def epoch_pairs(pipe):
    seen, labels = one_epoch(pipe)
    return sorted(zip(seen, labels))


@pytest.mark.parametrize("num_shards", [1, 2])
@pytest.mark.parametrize("fmt", FORMATS)
def test_shards_give_the_folder_pairs_once_per_epoch(split_root, fmt, num_shards):
    dst = to_shards(split_root, fmt)
    for split in ("train", "val"):
        shards = [epoch_pairs(ClassifyValPipeline(4, 1, None, str(dst / split), crop_size=16, shard_id=s,
                                                  num_shards=num_shards)) for s in range(num_shards)]
        assert sorted(sum(shards, [])) == expected_pairs(split)
        assert not set(shards[0]) & set(shards[-1]) or num_shards == 1
    pipe = ClassifyTrainPipeline(4, 1, None, str(dst / "train"), crop_size=16, shard_id=1, num_shards=num_shards)
    assert pipe.layout == fmt and pipe.classes == sorted(CLASSES) and pipe.num_classes == 3
    assert pipe.num_samples == len(CLASSES) * PER_CLASS  # the whole split, every shard
    assert pipe.files == shard_files(str(dst / "train"), fmt) and len(pipe.files) == 3


@pytest.mark.parametrize("fmt", FORMATS)
def test_two_train_shards_cover_every_sample_each_epoch_as_shard_order_changes(split_root, fmt):
    dst = to_shards(split_root, fmt)
    # per-rank seeds, as a DDP trainer passes them; the shard order each epoch must still agree
    loaders = [classify_iterator(ClassifyTrainPipeline(4, 1, None, str(dst / "train"), crop_size=16, shard_id=s,
                                                       num_shards=2, seed=10 + s)) for s in range(2)]
    orders = []
    for _ in range(3):
        seen = [[pair for b in it for pair in zip(identities(b[0]["data"]), b[0]["label"].squeeze(-1).tolist())]
                for it in loaders]
        assert [len(s) for s in seen] == [12, 12]  # 21 samples and 3 distinct ones repeated: 3 batches of 4 each
        counts = Counter(seen[0] + seen[1])
        assert sorted(counts) == expected_pairs("train") and sorted(counts.values()) == [1] * 18 + [2] * 3
        orders.append(seen[0])
    assert orders[0] != orders[1] != orders[2]


@pytest.mark.parametrize("fmt", ["folder", *FORMATS])
@pytest.mark.parametrize("batch_size,repeated", [(8, 3), (16, 11), (64, 43)])
def test_training_pads_with_distinct_samples_of_the_set(split_root, fmt, batch_size, repeated):
    """21 samples in batches of 8, 16 or 64: 3, 11 or 43 samples more make whole batches; they are distinct real
    samples while the set has enough (as DistributedSampler pads), never copies of one."""
    data = split_root / "train" if fmt == "folder" else to_shards(split_root, fmt) / "train"
    it = classify_iterator(ClassifyTrainPipeline(batch_size, 1, None, str(data), crop_size=8, seed=2))
    assert len(it) == -(-21 // batch_size)
    for _ in range(2):
        seen = [pair for b in it for pair in zip(identities(b[0]["data"]), b[0]["label"].squeeze(-1).tolist())]
        counts = Counter(seen)
        assert len(seen) == 21 + repeated and sorted(counts) == expected_pairs("train")
        assert max(counts.values()) - 1 == -(-repeated // 21)  # as evenly as can be
        assert sum(n - 1 for n in counts.values()) == repeated


class RawRead(ClassifyValPipeline):
    """The reader's output as stored: encoded image bytes and int32 labels."""

    def define_graph(self):
        return self.read()


@pytest.mark.parametrize("fmt", FORMATS)
def test_shards_hold_the_original_file_bytes(split_root, fmt):
    dst = to_shards(split_root, fmt)
    n = len(CLASSES) * PER_CLASS
    pipe = RawRead(n, 1, None, str(dst / "train"))
    pipe.build()
    images, labels = pipe.run()
    assert labels.dtype == types.INT32
    got = sorted((np.array(images[k]).tobytes(), int(np.array(labels[k])[0])) for k in range(n))
    want = sorted((p.read_bytes(), TRAIN_INDEX[p.parent.name]) for p in (split_root / "train").glob("*/*.png"))
    assert got == want


@pytest.mark.parametrize("fmt", FORMATS)
def test_shard_val_images_equal_the_folder_pipelines(tmp_path, texture_folder, fmt):
    (tmp_path / "root").mkdir()
    texture_folder.rename(tmp_path / "root" / "train")
    shutil.copytree(tmp_path / "root" / "train", tmp_path / "root" / "val")
    dst = to_shards(tmp_path / "root", fmt, shard_size=5)

    def outputs(folder):
        pipe = ClassifyValPipeline(5, 1, None, str(folder), crop_size=32, resize_size=40)
        return sorted((b[0]["data"][k].numpy().tobytes(), int(b[0]["label"][k])) for b in classify_iterator(pipe)
                      for k in range(b[0]["data"].shape[0]))

    from_folder = outputs(tmp_path / "root" / "val")
    assert len(from_folder) == 4 * len(CLASSES)
    assert outputs(dst / "val") == from_folder


def write_shard(path, fmt, samples):
    with open(path, "wb") as f:
        if fmt == "tfrecord":
            write_tfrecord(f, samples)
        else:
            write_tar(f, samples, [f"s{k}" for k in range(len(samples))])


@pytest.mark.parametrize("fmt", FORMATS)
def test_label_offset_and_out_of_range_labels(split_root, fmt, tmp_path):
    files, labels, _ = list_image_folder(str(split_root / "train"))
    shard = tmp_path / "offset" / ("train-00000-of-00001" if fmt == "tfrecord" else "train-000000.tar")
    shard.parent.mkdir()
    write_shard(shard, fmt, [(f, label + 1) for f, label in zip(files, labels)])  # stored 1..3, as TF's ImageNet
    with pytest.raises(DataError, match=rf"^{shard}: stored label 3 minus label_offset 0 is outside \[0, 3\)$"):
        ClassifyValPipeline(4, 1, None, str(shard.parent), num_classes=3)
    with pytest.raises(DataError, match=rf"^{shard}: stored label 1 minus label_offset 2 is outside \[0, 3\)$"):
        ClassifyValPipeline(4, 1, None, str(shard.parent), num_classes=3, label_offset=2)
    pipe = ClassifyValPipeline(4, 1, None, str(shard.parent), crop_size=16, num_classes=3, label_offset=1)
    assert pipe.classes is None and pipe.num_classes == 3  # no classes.txt beside this shard
    assert epoch_pairs(pipe) == expected_pairs("train")


def index_files(folder):
    return sorted(p.name for p in folder.iterdir() if ".idx" in p.name)


@pytest.mark.parametrize("fmt", FORMATS)
def test_missing_index_is_built_beside_the_shard(split_root, fmt):
    dst = to_shards(split_root, fmt)
    written = index_files(dst / "train")
    assert len(written) == 6  # make_shards indexed its 3 shards: .idx and .idx.json each
    for name in written:
        (dst / "train" / name).unlink()
    assert epoch_pairs(ClassifyValPipeline(4, 1, None, str(dst / "train"), crop_size=16)) == expected_pairs("train")
    assert index_files(dst / "train") == written


def test_index_builds_print_progress_per_shard(split_root, monkeypatch):
    dst = to_shards(split_root, "wds")
    for name in index_files(dst / "train"):
        (dst / "train" / name).unlink()
    out = io.StringIO()
    monkeypatch.setattr(pipelines, "progress", functools.partial(pipelines.progress, every=0, out=out))
    ClassifyValPipeline(4, 1, None, str(dst / "train"), crop_size=16)
    lines = out.getvalue().splitlines()
    assert [line.split(", ")[0] for line in lines[:3]] == [f"{dst / 'train'}: shards indexed: {k}/3 ({100 * k / 3:.0f} %)"
                                                         for k in (1, 2, 3)]
    assert lines[3].startswith(f"{dst / 'train'}: shards indexed: 3 done in ") and len(lines) == 4


def test_index_of_a_read_only_folder_goes_to_the_cache(split_root, tmp_path, monkeypatch):
    dst = to_shards(split_root, "wds")
    for name in index_files(dst / "val"):
        (dst / "val" / name).unlink()
    # as root every folder is writable, so stand in for a read-only mount
    access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: path != str(dst / "val") and access(path, mode))
    monkeypatch.setattr(pipelines, "INDEX_CACHE", str(tmp_path / "cache"))
    assert epoch_pairs(ClassifyValPipeline(4, 1, None, str(dst / "val"), crop_size=16)) == expected_pairs("val")
    assert index_files(dst / "val") == []
    assert sorted(p.name for p in (tmp_path / "cache").rglob("*.idx*")) == ["val-000000.tar.idx",
                                                                             "val-000000.tar.idx.json"]


@pytest.mark.parametrize("fmt", FORMATS)
def test_index_of_a_rewritten_shard_is_rebuilt(split_root, fmt):
    dst, other = to_shards(split_root, fmt, seed=0), to_shards(split_root, fmt, seed=1)
    for shard in shard_files(str(dst / "train"), fmt):  # same names, other samples in each
        shutil.copyfile(shard.replace(str(dst), str(other)), shard)
    assert epoch_pairs(ClassifyValPipeline(4, 1, None, str(dst / "train"), crop_size=16)) == expected_pairs("train")
    for shard in shard_files(str(dst / "train"), fmt):
        with open(shard + ".idx.json") as f:
            assert json.load(f)["shard"] == {"bytes": os.stat(shard).st_size, "mtime_ns": os.stat(shard).st_mtime_ns}


@pytest.mark.parametrize("fmt", FORMATS)
def test_index_of_a_shard_rewritten_at_the_same_size_and_time_is_rebuilt(split_root, fmt, tmp_path):
    """cp -p and rsync -a keep a shard's modification time: a shard rewritten with the same samples in another order
    (so of the same size) and its old time must not be read through its old index."""
    big = 100  # one shard per split: its size does not depend on the order of its samples
    make_shards(str(split_root), str(tmp_path / "a"), fmt, big, 0)
    make_shards(str(split_root), str(tmp_path / "b"), fmt, big, 1)
    (shard,) = shard_files(str(tmp_path / "a" / "train"), fmt)
    other = shard.replace(str(tmp_path / "a"), str(tmp_path / "b"))
    assert os.path.getsize(shard) == os.path.getsize(other) and open(shard, "rb").read() != open(other, "rb").read()
    stat = os.stat(shard)
    shutil.copyfile(other, shard)
    os.utime(shard, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert os.stat(shard).st_mtime_ns == stat.st_mtime_ns and os.stat(shard).st_size == stat.st_size
    assert epoch_pairs(ClassifyValPipeline(4, 1, None, str(tmp_path / "a" / "train"), crop_size=16)) == \
        expected_pairs("train")
    assert open(shard + ".idx").read() == open(other + ".idx").read()  # the index of what the shard now holds


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_shard_set_that_lost_a_shard_is_refused(split_root, fmt):
    dst = to_shards(split_root, fmt)
    lost = shard_files(str(dst / "train"), fmt)[1]
    os.remove(lost)
    with pytest.raises(DataError, match=f"^{re.escape(lost)}: missing, but {re.escape(str(dst / 'manifest.json'))} "
                                        f"lists it \\(1 of 3 shards missing\\)"):
        ClassifyTrainPipeline(4, 1, None, str(dst / "train"))


def last_index_line(shard):
    with open(shard + ".idx") as f:
        return f.read().split("\n")[-2].split()


@pytest.mark.parametrize("fmt,cut", [("tfrecord", "inside the last record"), ("wds", "inside the last image"),
                                     ("wds", "between two members")])
def test_truncated_shard_is_named(split_root, fmt, cut):
    dst = to_shards(split_root, fmt)
    shard = shard_files(str(dst / "train"), fmt)[0]
    line = last_index_line(shard)
    if fmt == "tfrecord":
        size = int(line[0]) + int(line[1]) // 2
    elif cut == "inside the last image":
        size = int(line[1]) + int(line[2]) // 2
    else:
        size = int(line[5]) + 512  # just after the last member's block: a shorter but well-formed tar body
    os.truncate(shard, size)
    with pytest.raises(DataError, match=f"^{shard}: truncated"):
        ClassifyValPipeline(4, 1, None, str(dst / "train"))


def test_val_folder_labels_follow_train_classes(split_root):
    train = ClassifyTrainPipeline(4, 1, None, str(split_root / "train"), crop_size=16)
    val = ClassifyValPipeline(4, 1, None, str(split_root / "val"), crop_size=16, classes=train.classes)
    assert val.classes == train.classes == ["Apple", "b c", "zebra"] and val.num_classes == 3
    assert epoch_pairs(val) == expected_pairs("val")  # zebra is 2, as in train, not 1 as val alone would say


def test_val_class_unknown_to_train_is_an_error(split_root):
    (split_root / "val" / "okapi").mkdir()
    Image.new("RGB", (8, 8)).save(split_root / "val" / "okapi" / "a.png")
    with pytest.raises(DataError, match=f"^{split_root / 'val' / 'okapi'}: class 'okapi' is not one of the 3 "
                                        f"training classes$"):
        ClassifyValPipeline(4, 1, None, str(split_root / "val"), classes=sorted(CLASSES))


def test_shard_classes_txt_must_match_the_training_classes(split_root):
    dst = to_shards(split_root, "tfrecord")
    assert ClassifyValPipeline(4, 1, None, str(dst / "val"), classes=sorted(CLASSES)).classes == sorted(CLASSES)
    with pytest.raises(DataError, match=f"^{dst / 'val' / 'classes.txt'}: its 3 classes differ from the 3 training"):
        ClassifyValPipeline(4, 1, None, str(dst / "val"), classes=["Apple", "b c", "zebras"])


def test_find_layout(split_root, tmp_path):
    assert find_layout(str(split_root / "train")) == "folder"
    for name, layout in (("train-00000-of-00002", "tfrecord"), ("x.tfrecord", "tfrecord"), ("a.tar", "wds")):
        (tmp_path / name / "split").mkdir(parents=True)
        (tmp_path / name / "split" / name).write_bytes(b"")
        assert find_layout(str(tmp_path / name / "split")) == layout
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "train-00000-of-00002.idx").write_bytes(b"")
    with pytest.raises(DataError, match=f"^{tmp_path / 'empty'}: no class folders, TFRecord files or .tar shards"):
        find_layout(str(tmp_path / "empty"))
    (tmp_path / "a.tar" / "split" / "train-00000-of-00002").write_bytes(b"")
    with pytest.raises(DataError, match=f"^{tmp_path / 'a.tar' / 'split'}: holds tfrecord and wds data"):
        find_layout(str(tmp_path / "a.tar" / "split"))


def test_find_undecodable_names_a_zero_byte_file(solid_folder):
    assert find_undecodable(ClassifyValPipeline(2, 1, None, str(solid_folder))) is None
    (solid_folder / "b c" / "img3.png").write_bytes(b"")
    found = find_undecodable(ClassifyValPipeline(2, 1, None, str(solid_folder)))
    assert found == str(solid_folder / "b c" / "img3.png")


@pytest.mark.parametrize("fmt", FORMATS)
def test_find_undecodable_names_the_sample_in_a_shard(split_root, fmt):
    dst = to_shards(split_root, fmt)
    assert find_undecodable(ClassifyValPipeline(2, 1, None, str(dst / "train"))) is None
    (split_root / "train" / "b c" / "img4.png").write_bytes(b"not a png")
    dst = to_shards(split_root, fmt, seed=1)
    found = find_undecodable(ClassifyValPipeline(2, 1, None, str(dst / "train")))
    shard, sample = re.fullmatch(r"(.+): sample (\S+)", found).groups()
    assert shard in shard_files(str(dst / "train"), fmt)
    if fmt == "wds":
        with tarfile.open(shard) as tar:
            assert tar.extractfile(f"{sample}.png").read() == b"not a png"
    else:  # walk the TFRecord framing (length, CRC, data, CRC) to the named record
        with open(shard, "rb") as f:
            for _ in range(int(sample)):
                f.seek(struct.unpack("<Q", f.read(8))[0] + 8, os.SEEK_CUR)
            assert b"not a png" in f.read(8 + struct.unpack("<Q", f.read(8))[0] + 4)


def test_find_undecodable_names_an_image_that_only_pil_reads(solid_folder, tmp_path):
    """A GIF saved as .jpg, common in scraped sets: PIL opens it, DALI's decoder does not."""
    bad = solid_folder / "b c" / "img2.png"
    Image.new("RGB", (40, 40), (1, 2, 3)).save(bad, format="GIF")
    with Image.open(bad) as image:
        image.load()  # PIL reads it
    assert find_undecodable(ClassifyValPipeline(2, 1, None, str(solid_folder))) == str(bad)
    with pytest.raises(DataError, match=f"^{re.escape(str(bad))}: cannot decode this image"):
        with pipelines.decode_errors_named(pipe := ClassifyValPipeline(2, 1, None, str(solid_folder))):
            for _ in classify_iterator(pipe):
                pass


@pytest.mark.parametrize("p", [1.0, 0.5, 0.0])
def test_random_erase_blanks_one_box_of_torchvisions_size(solid_folder, p):
    pipe = ClassifyTrainPipeline(16, 2, None, str(solid_folder), crop_size=64, seed=4, random_erase=p)
    images = next(iter(classify_iterator(pipe)))[0]["data"].numpy()
    areas = []
    for image in images:
        erased = (image == 0).all(axis=0)  # no solid colour here normalizes to exactly 0 in all channels
        rest = image[:, ~erased]
        assert np.ptp(rest, axis=1).max() < 1e-5  # the rest is the image's unchanged constant colour
        r, g, _ = np.rint(rest[:, 0] * STD + MEAN).astype(int)
        assert (r - 40) % 60 == 0 and (g - 10) % 20 == 0
        if erased.any():
            rows, cols = np.nonzero(erased)
            height, width = np.ptp(rows) + 1, np.ptp(cols) + 1
            assert height * width == erased.sum()  # one axis-aligned box
            areas.append(erased.mean())
    # a box side is rounded to whole pixels: at most 0.5 px * (64 + 64) + 0.25 px^2 of 64^2 off
    assert all(0.02 - 0.016 <= a <= 0.33 + 0.016 for a in areas)
    if p == 1.0:
        assert len(areas) == 16 and 0.1 < np.mean(areas) < 0.25  # area ~ U(0.02, 0.33): mean 0.175
    elif p == 0.5:
        assert 0 < len(areas) < 16
    else:
        assert areas == []


def test_random_erase_in_float16(solid_folder):
    pipe = ClassifyTrainPipeline(8, 2, None, str(solid_folder), crop_size=32, seed=4, dtype="float16", random_erase=1.0)
    images = next(iter(classify_iterator(pipe)))[0]["data"]
    assert images.dtype == torch.float16 and images.shape == (8, 3, 32, 32)
    assert (images == 0).all(dim=1).flatten(1).any(dim=1).all()  # a box in every image


@pytest.mark.parametrize("fmt", ["folder", *FORMATS])
def test_checkpoint_resumes_mid_epoch_with_the_same_batches(split_root, fmt):
    data = split_root / "train" if fmt == "folder" else to_shards(split_root, fmt) / "train"

    def loader(**kwargs):
        return classify_iterator(ClassifyTrainPipeline(4, 1, None, str(data), crop_size=16, seed=3, random_erase=0.5,
                                                       enable_checkpointing=True, **kwargs))

    def rest_and_next_epoch(it):
        return [(b[0]["data"], b[0]["label"]) for epoch in range(2) for b in it]

    it = loader()
    next(it), next(it)
    checkpoint = it.checkpoints()[0]
    expected = rest_and_next_epoch(it)
    resumed = rest_and_next_epoch(loader(checkpoint=checkpoint))
    assert len(expected) == 4 + 6  # 21 samples in batches of 4: 6 a epoch, 2 were taken
    assert all(torch.equal(a, c) and torch.equal(b, d) for (a, b), (c, d) in zip(expected, resumed))
    assert len(resumed) == len(expected)


# ------------------------------------------------------------------------------------------
# segmentation
# ------------------------------------------------------------------------------------------

SEG_H, SEG_W, SEG_N = 24, 40, 10
# fetch_dali_loader reads the shard and device from these when it is not told
DIST_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK")


@pytest.fixture(autouse=True)
def no_dist_env(monkeypatch):
    for name in DIST_ENV:
        monkeypatch.delenv(name, raising=False)


def seg_mask(k):
    """An asymmetric mask of classes 0, 1, 2 that differs per sample: flips and mix-ups show."""
    mask = np.zeros((SEG_H, SEG_W, 1), np.uint8)
    mask[2 + k % 5:12, 3:6 + 2 * k] = 1
    mask[14:20, 25 + k % 7:38] = 2
    return mask


def save_pairs(tmp_path, images, masks, names=None):
    """Writes images[i] and masks[i] as .npy files (named by ``names``: (image, mask) pairs); their paths."""
    imgs, lbls = [], []
    for k, (image, mask) in enumerate(zip(images, masks)):
        image_name, mask_name = names[k] if names else (f"images/s{k}.npy", f"masks/s{k}.npy")
        for path, array, paths in ((tmp_path / image_name, image, imgs), (tmp_path / mask_name, mask, lbls)):
            path.parent.mkdir(parents=True, exist_ok=True)
            np.save(path, array)
            paths.append(str(path))
    return imgs, lbls


def seg_image(k):
    # channel 0 encodes the mask and channel 1 the sample, so alignment and identity read back from the image
    mask = seg_mask(k)[..., 0]
    return np.stack([mask * 100, np.full_like(mask, 10 * k), np.full_like(mask, 50)], -1).astype(np.uint8)


@pytest.fixture
def seg_files(tmp_path):
    return save_pairs(tmp_path, [seg_image(k) for k in range(SEG_N)], [seg_mask(k) for k in range(SEG_N)])


def seg_pipe(imgs, lbls, batch_size, mode, device_id=None, **kwargs):
    """fetch_dali_loader on the CPU unless told otherwise (by default it takes a GPU where PyTorch sees one)."""
    return fetch_dali_loader(imgs, lbls, batch_size=batch_size, mode=mode, device_id=device_id, **kwargs)


def seg_loader(imgs, lbls, batch_size, mode, **kwargs):
    return segment_iterator(seg_pipe(imgs, lbls, batch_size, mode, **kwargs))


def seg_epoch(loader):
    images, masks = [], []
    for batch in loader:
        images.append(batch[0]["image"])
        masks.append(batch[0]["mask"])
    return torch.cat(images), torch.cat(masks)


def sample_ids(images):
    """Which seg_image each normalized image of a batch is."""
    return np.rint(unnormalize(images)[:, 0, 0, 1] / 10).astype(int).tolist()


def test_segment_val_shapes_and_values(seg_files):
    pipe = seg_pipe(*seg_files, batch_size=4, mode="eval", size=(SEG_H, SEG_W))
    assert pipe.channels == 3
    loader = segment_iterator(pipe)
    images, masks = seg_epoch(loader)
    assert len(loader) == 3  # 4 + 4 + 2: the last batch partial
    assert images.shape == (SEG_N, 3, SEG_H, SEG_W) and images.dtype == torch.float32
    assert masks.shape == (SEG_N, 1, SEG_H, SEG_W) and masks.dtype == torch.uint8
    for k in range(SEG_N):  # no shuffle: file order
        np.testing.assert_array_equal(masks[k].numpy().transpose(1, 2, 0), seg_mask(k))
        raw = unnormalize(images[k:k + 1])[0]
        np.testing.assert_allclose(raw[..., 1], 10 * k, atol=1e-3)
        np.testing.assert_allclose(raw[..., 0], seg_mask(k)[..., 0] * 100.0, atol=1e-3)


def test_segment_train_flips_keep_image_and_mask_aligned(seg_files):
    aug = dict(NO_AUGMENT, flip_p=0.5)
    loader = seg_loader(*seg_files, batch_size=5, mode="train", size=(SEG_H, SEG_W), seed=3, **aug)
    flips = set()
    for _ in range(3):
        images, masks = seg_epoch(loader)
        assert images.shape == (SEG_N, 3, SEG_H, SEG_W)
        raw = unnormalize(images)
        ids = sample_ids(images)
        assert sorted(ids) == list(range(SEG_N))  # 5 divides 10: every sample once, no filling
        for k, image, mask in zip(ids, raw, masks.numpy()):
            np.testing.assert_allclose(image[..., 0], mask[0] * 100.0, atol=1e-3)  # aligned
            expected = seg_mask(k)[..., 0]
            flip = next(f for f in [(1, 1), (-1, 1), (1, -1), (-1, -1)]
                        if np.array_equal(mask[0], expected[::f[0], ::f[1]]))
            flips.add(flip)
    assert len(flips) == 4  # none, vertical, horizontal, both


def test_segment_masks_keep_class_values_under_all_augmentations(seg_files):
    aug = dict(flip_p=0.5, noise_p=1.0, blur_p=1.0, brightness_p=1.0, contrast_p=1.0)
    images, masks = seg_epoch(seg_loader(*seg_files, batch_size=5, mode="train", size=(37, 53), **aug))
    assert images.shape == (SEG_N, 3, 37, 53) and masks.shape == (SEG_N, 1, 37, 53)
    assert masks.dtype == torch.uint8
    assert set(masks.unique().tolist()) == {0, 1, 2}
    assert torch.isfinite(images).all()


@pytest.mark.parametrize("augmentation", ["noise_p", "blur_p", "brightness_p", "contrast_p"])
def test_each_photometric_augmentation_changes_image_not_mask(seg_files, augmentation):
    def run(**aug):
        return seg_epoch(seg_loader(*seg_files, batch_size=SEG_N, mode="train", size=(SEG_H, SEG_W), seed=9, **aug))

    base_images, base_masks = run(**NO_AUGMENT)
    images, masks = run(**dict(NO_AUGMENT, **{augmentation: 1.0}))
    assert torch.equal(masks, base_masks)
    assert (images - base_images).abs().amax(dim=(1, 2, 3)).min() > 1e-3  # every sample changed
    assert torch.isfinite(images).all()


def test_augmentations_touch_only_the_samples_that_draw_them(seg_files):
    # p=0.5 over 40 samples: some drawn, some not; an undrawn sample is exactly the unaugmented one
    imgs, lbls = [p * 4 for p in seg_files]
    base, _ = seg_epoch(seg_loader(imgs, lbls, batch_size=40, mode="train", size=(SEG_H, SEG_W), seed=4,
                                   **NO_AUGMENT))
    for augmentation in ("noise_p", "blur_p", "brightness_p", "contrast_p"):
        images, _ = seg_epoch(seg_loader(imgs, lbls, batch_size=40, mode="train", size=(SEG_H, SEG_W), seed=4,
                                         **dict(NO_AUGMENT, **{augmentation: 0.5})))
        changed = (images - base).abs().amax(dim=(1, 2, 3)) > 1e-3
        assert 0 < changed.sum() < 40, augmentation
        assert torch.equal(images[~changed], base[~changed])


@pytest.mark.parametrize("device_id", [None, pytest.param(0, marks=gpu)])
def test_noise_is_gaussian_with_the_drawn_stddev_and_set_by_the_seed(seg_files, device_id):
    # noise_std (0.25, 0.2501): every drawn sample gets N(0, ~0.25**2) noise per element, a fresh draw per sample
    def run(num_threads=4, **aug):
        loader = seg_loader(*seg_files, batch_size=SEG_N, mode="train", size=(160, 160), seed=6, device_id=device_id,
                            num_threads=num_threads, **dict(NO_AUGMENT, **aug))
        return seg_epoch(loader)[0].cpu()

    noisy = run(noise_p=1.0, noise_std=(0.25, 0.2501))
    noise = (noisy - run()).flatten(1).double()  # the reader's shuffle follows its seed: the same order
    assert noise.shape == (SEG_N, 3 * 160 * 160)  # more than one of the CPU pipeline's chunks of 2**16 elements
    assert noise.mean(1).abs().max() < 0.015
    assert ((noise.std(1) - 0.25).abs() < 0.01).all()
    assert abs((noise.abs() < 0.25).double().mean().item() - 0.6827) < 0.01  # one standard deviation
    assert abs((noise.abs() < 0.5).double().mean().item() - 0.9545) < 0.005  # two
    correlation = torch.corrcoef(noise)
    assert (correlation - torch.eye(SEG_N)).abs().max() < 0.03  # independent across samples
    tail = noise.shape[1] - 2 ** 16
    within = torch.corrcoef(torch.stack([noise[:, :tail].flatten(), noise[:, 2 ** 16:].flatten()]))[0, 1]
    assert abs(within) < 0.03  # and within a sample
    assert torch.equal(run(noise_p=1.0, noise_std=(0.25, 0.2501)), noisy)  # the same seed, the same noise
    assert torch.equal(run(num_threads=1, noise_p=1.0, noise_std=(0.25, 0.2501)), noisy)  # on any number of threads


def test_contrast_stays_within_the_image_range(seg_files):
    base, _ = seg_epoch(seg_loader(*seg_files, batch_size=SEG_N, mode="train", size=(SEG_H, SEG_W), **NO_AUGMENT))
    aug = dict(NO_AUGMENT, contrast_p=1.0)
    images, _ = seg_epoch(seg_loader(*seg_files, batch_size=SEG_N, mode="train", size=(SEG_H, SEG_W), **aug))
    for a, b in zip(base, images):
        assert b.min() >= a.min() - 1e-5 and b.max() <= a.max() + 1e-5


def test_segment_val_shards_cover_the_dataset_once(seg_files):
    seen = [sample_ids(seg_epoch(seg_loader(*seg_files, batch_size=3, mode="eval", size=(SEG_H, SEG_W),
                                            shard_id=shard, num_shards=2))[0]) for shard in range(2)]
    assert seen == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]


def test_train_epoch_over_uneven_shards_runs_equal_full_batches_of_real_samples(seg_files):
    imgs, lbls = seg_files[0][:9], seg_files[1][:9]  # 9 samples over 2 shards, batch 2: 3 distinct ones repeated
    loaders = [seg_loader(imgs, lbls, batch_size=2, mode="train", size=(SEG_H, SEG_W), shard_id=shard,
                          num_shards=2, seed=5, **NO_AUGMENT) for shard in range(2)]
    for epoch in range(2):
        shards = []
        for loader in loaders:
            batches = list(loader)
            assert len(batches) == len(loader) == 3  # 12 samples: 6 a shard
            ids = []
            for batch in batches:
                images, masks = batch[0]["image"], batch[0]["mask"]
                assert images.shape == (2, 3, SEG_H, SEG_W)  # full, padded or not
                for k, mask in zip(sample_ids(images), masks.numpy()):
                    np.testing.assert_array_equal(mask.transpose(1, 2, 0), seg_mask(k))  # aligned, real
                    ids.append(k)
            shards.append(ids)
        counts = Counter(shards[0] + shards[1])
        assert sorted(counts) == list(range(9))  # every sample this epoch
        assert sorted(counts.values()) == [1] * 6 + [2] * 3  # and three distinct ones twice, nothing else


def test_pairs_by_position_whatever_the_names(tmp_path):
    names = [("img_0.npy", "mask_0.npy"), ("x.npy", "x_mask.npy"), ("scans/a.npy", "labels/zz.npy")]
    imgs, lbls = save_pairs(tmp_path, [seg_image(k) for k in range(3)], [seg_mask(k) for k in range(3)], names)
    images, masks = seg_epoch(seg_loader(imgs, lbls, batch_size=3, mode="eval", size=(SEG_H, SEG_W)))
    assert sample_ids(images) == [0, 1, 2]
    for k in range(3):
        np.testing.assert_array_equal(masks[k].numpy().transpose(1, 2, 0), seg_mask(k))


def per_image(image):
    """(H, W, C) -> (C, H, W), each channel standardized by its own mean and standard deviation."""
    image = image.astype(np.float64).reshape(image.shape[0], image.shape[1], -1)
    std = image.std(axis=(0, 1))
    return ((image - image.mean(axis=(0, 1))) / np.where(std > 0, std, 1)).transpose(2, 0, 1)


IMAGE_KINDS = [((), np.uint8), ((1,), np.uint8), ((), np.uint16), ((3,), np.uint16), ((1,), np.float32),
               ((3,), np.float32)]


@pytest.mark.parametrize("channels,dtype", IMAGE_KINDS, ids=lambda v: str(v))
def test_image_kinds_are_normalized_per_image(tmp_path, channels, dtype):
    rng = np.random.default_rng(0)
    top = {np.uint8: 255, np.uint16: 4000, np.float32: 1}[dtype]
    images = [(rng.random((SEG_H, SEG_W, *channels)) * top).astype(dtype) for _ in range(3)]
    images[2][:] = images[2].flat[0]  # a constant image normalizes to 0, not NaN
    imgs, lbls = save_pairs(tmp_path, images, [seg_mask(k) for k in range(3)])
    pipe = seg_pipe(imgs, lbls, batch_size=3, mode="eval", size=(SEG_H, SEG_W))
    c = channels[0] if channels else 1
    assert pipe.channels == c
    out, masks = seg_epoch(segment_iterator(pipe))
    assert out.shape == (3, c, SEG_H, SEG_W) and out.dtype == torch.float32
    for image, result in zip(images, out.numpy()):
        np.testing.assert_allclose(result, per_image(image), atol=1e-4)
    np.testing.assert_allclose(out[:2].mean(dim=(2, 3)), 0, atol=1e-5)
    np.testing.assert_allclose(out[:2].std(dim=(2, 3), correction=0), 1, atol=1e-4)
    assert torch.equal(out[2], torch.zeros_like(out[2]))


def test_per_image_normalization_numbers(tmp_path):
    image = np.array([[0, 100], [200, 300]], np.uint16)  # mean 150, std sqrt(12500)
    imgs, lbls = save_pairs(tmp_path, [image], [np.zeros((2, 2), np.uint8)])
    out, _ = seg_epoch(seg_loader(imgs, lbls, batch_size=1, mode="eval", size=(2, 2)))
    np.testing.assert_allclose(out[0, 0].numpy(), (image.astype(float) - 150) / np.sqrt(12500), atol=1e-6)


def test_given_mean_and_std_replace_the_default(tmp_path, seg_files):
    imgs, lbls = save_pairs(tmp_path, [np.array([[1000, 1010], [1020, 990]], np.uint16)], [np.zeros((2, 2), np.uint8)],
                            [("u16/image.npy", "u16/mask.npy")])
    out, _ = seg_epoch(seg_loader(imgs, lbls, batch_size=1, mode="eval", size=(2, 2), mean=1000, std=10))
    np.testing.assert_allclose(out[0, 0].numpy(), [[0, 1], [2, -1]], atol=1e-6)
    rgb, _ = seg_epoch(seg_loader(*seg_files, batch_size=SEG_N, mode="eval", size=(SEG_H, SEG_W),
                                  mean=[0, 0, 50], std=[1, 10, 2]))  # 8-bit RGB too
    np.testing.assert_allclose(rgb[:, 1].amax(dim=(1, 2)).numpy(), list(range(SEG_N)), atol=1e-6)
    np.testing.assert_allclose(rgb[:, 2].numpy(), 0, atol=1e-6)


# what each stored mask type is handed out as, and class values it must keep exactly
MASK_KINDS = [(np.uint8, torch.uint8, [0, 1, 255]), (np.bool_, torch.uint8, [0, 1]),
              (np.int8, torch.int32, [-1, 0, 3]), (np.int16, torch.int32, [-1, 0, 300]),
              (np.uint16, torch.int32, [0, 3, 65535]), (np.int32, torch.int32, [0, 1, 2, 3]),
              (np.int64, torch.int32, [-1, 0, 1, 2, 3]), (np.uint32, torch.int32, [0, 2, 70000])]


@pytest.mark.parametrize("stored,handed_out,classes", MASK_KINDS, ids=lambda v: str(v))
@pytest.mark.parametrize("shape", [(SEG_H, SEG_W), (SEG_H, SEG_W, 1)], ids=["HW", "HW1"])
def test_mask_kinds_keep_their_class_values(tmp_path, stored, handed_out, classes, shape):
    rng = np.random.default_rng(1)
    masks = [np.array(classes)[rng.integers(0, len(classes), shape)].astype(stored) for _ in range(2)]
    imgs, lbls = save_pairs(tmp_path, [seg_image(k) for k in range(2)], masks)
    for mode, scale in (("eval", 1), ("train", 2)):
        aug = NO_AUGMENT if mode == "train" else {}
        images, out = seg_epoch(seg_loader(imgs, lbls, batch_size=2, mode=mode, size=(scale * SEG_H, scale * SEG_W),
                                           **aug))
        assert out.dtype == handed_out and out.shape == (2, 1, scale * SEG_H, scale * SEG_W)
        for k, result in zip(sample_ids(images), out.numpy()):
            # nearest neighbour at 2x: each pixel becomes 2 x 2
            expected = masks[k].reshape(SEG_H, SEG_W).astype(np.int64).repeat(scale, 0).repeat(scale, 1)
            np.testing.assert_array_equal(result[0], expected)


def test_writeup_client_code_runs_unchanged(seg_files):
    kwargs = {"dim": 2, "seed": 42, "gpus": 1, "overlap": 0.5, "benchmark": False, "num_workers": 4,
              "oversampling": 0.4, "test_batches": 0, "train_batches": 0, "load_to_gpu": True}
    train = fetch_dali_loader(imgs=seg_files[0], lbls=seg_files[1], batch_size=5, mode="train", **kwargs)
    valid = fetch_dali_loader(imgs=seg_files[0], lbls=seg_files[1], batch_size=4, mode="eval", **kwargs)
    assert isinstance(train, SegmentTrainPipeline) and isinstance(valid, SegmentValPipeline)
    assert train.num_threads == 4 and train.device_id == (0 if torch.cuda.is_available() else None)

    class LightningWrapper(DALIGenericIterator):
        def __next__(self):
            return super().__next__()[0]

    # The wrapper keeps DALIGenericIterator's default policy (FILL): full batches, the last one of the
    # validation epoch (4 + 4 + 2) padded with repeats. segment_iterator counts validation samples once.
    for pipe, batch_size, batches in ((train, 5, 2), (valid, 4, 3)):
        loader = LightningWrapper(pipe, auto_reset=True, reader_name="ReaderX", output_map=["image", "label"],
                                  dynamic_shape=False)
        for epoch in range(2):
            out = list(loader)
            assert len(out) == batches and all(set(batch) == {"image", "label"} for batch in out)
            assert all(batch["image"].shape[1:] == (3, 384, 384) and batch["image"].shape[0] == batch_size
                       and batch["label"].shape[1:] == (1, 384, 384) for batch in out)


def test_unknown_keyword_is_refused_with_the_accepted_ones(seg_files):
    with pytest.raises(ValueError, match="unknown keyword argument.* patch_size; it accepts device_id, "
                                         "num_threads.*flip_p.*num_workers, gpus, and ignores dim, overlap"):
        fetch_dali_loader(*seg_files, batch_size=2, mode="train", patch_size=[64, 64])


def test_augmentation_settings_are_ignored_by_eval(seg_files):
    plain, _ = seg_epoch(seg_loader(*seg_files, batch_size=SEG_N, mode="eval", size=(SEG_H, SEG_W)))
    given, _ = seg_epoch(seg_loader(*seg_files, batch_size=SEG_N, mode="eval", size=(SEG_H, SEG_W), noise_p=1.0,
                                    flip_p=1.0, contrast_p=1.0))
    assert torch.equal(given, plain)


@pytest.mark.parametrize("env,kwargs,expected", [
    ({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}, {}, [5, 6, 7, 8, 9]),  # torchrun
    ({"RANK": "1", "WORLD_SIZE": "2"}, {"shard_id": 0}, [0, 1, 2, 3, 4]),  # explicit wins
    ({"RANK": "0", "WORLD_SIZE": "1"}, {"gpus": 2}, list(range(SEG_N))),  # torchrun's count wins over gpus
    ({"LOCAL_RANK": "1"}, {"gpus": 2}, [5, 6, 7, 8, 9]),  # the write-up: shard LOCAL_RANK of gpus
    ({}, {}, list(range(SEG_N))),
])
def test_shard_from_the_environment(seg_files, monkeypatch, env, kwargs, expected):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # LOCAL_RANK 1 names no GPU here
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    pipe = fetch_dali_loader(*seg_files, batch_size=5, mode="eval", size=(SEG_H, SEG_W), **kwargs)
    assert pipe.device_id is None
    assert sample_ids(seg_epoch(segment_iterator(pipe))[0]) == expected


def test_shard_out_of_range(seg_files, monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "1")
    with pytest.raises(ValueError, match="shard_id 1 is out of range for num_shards 1"):
        fetch_dali_loader(*seg_files, batch_size=2, mode="train", gpus=1)


def test_checkpoint_resumes_the_train_pipeline(seg_files):
    kwargs = dict(batch_size=3, mode="train", size=(SEG_H, SEG_W), seed=7, enable_checkpointing=True,
                  noise_p=0.5, blur_p=0.5)
    loader = seg_loader(*seg_files, **kwargs)
    next(loader)
    checkpoint = loader.checkpoints()[0]
    expected = next(loader)[0]
    resumed = next(seg_loader(*seg_files, checkpoint=checkpoint, **kwargs))[0]
    assert torch.equal(resumed["image"], expected["image"]) and torch.equal(resumed["mask"], expected["mask"])


def test_cpu_only_pipelines_ask_to_run_operators_at_once(solid_folder, seg_files):
    """What makes DALI_USE_NEW_THREAD_POOL=1 count (README): CPU-only pipelines ask DALI for full operator
    concurrency, unless told otherwise; pipelines on a GPU keep DALI's default (None). Building is not needed."""
    for device_id, expected in ((None, OperatorConcurrency.FULL), (0, None)):
        assert ClassifyTrainPipeline(4, 1, device_id, str(solid_folder))._concurrency == expected
        assert ClassifyValPipeline(4, 1, device_id, str(solid_folder))._concurrency == expected
        assert SegmentTrainPipeline(4, 1, device_id, *seg_files)._concurrency == expected
    told = SegmentValPipeline(4, 1, None, *seg_files, concurrency=OperatorConcurrency.BACKEND)
    assert told._concurrency == OperatorConcurrency.BACKEND


@pytest.mark.skipif(os.environ.get("DALI_USE_NEW_THREAD_POOL") == "1", reason="this run is the one it starts")
def test_cpu_pipelines_pass_these_tests_with_operators_running_at_once():
    """README's DALI_USE_NEW_THREAD_POOL=1 lets a CPU-only pipeline run independent operators, and successive
    iterations, at once. Every CPU test of this file (labels, epochs, alignment, augmentations, checkpoints, bad
    input) runs again in a process started with it; DALI's notice in the output shows that it took effect."""
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", __file__,
                          "-k", "not gpu and not operators_running_at_once"],
                         env={**os.environ, "DALI_USE_NEW_THREAD_POOL": "1"}, capture_output=True, text=True,
                         cwd=os.path.dirname(os.path.abspath(__file__)))
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert "Forced use of NewThreadPool" in run.stdout + run.stderr
    assert re.search(r"\b1\d\d passed", run.stdout), run.stdout[-500:]


# ------------------------------------------------------------------------------------------
# bad input
# ------------------------------------------------------------------------------------------


def test_missing_data_dir(tmp_path):
    with pytest.raises(DataError, match=str(tmp_path / "nope")):
        ClassifyTrainPipeline(2, 1, None, str(tmp_path / "nope"))


def test_no_class_folders(tmp_path):
    (tmp_path / "flat").mkdir()
    Image.new("RGB", (8, 8)).save(tmp_path / "flat" / "a.png")
    with pytest.raises(DataError, match=f"{tmp_path / 'flat'}: no class folders"):
        ClassifyValPipeline(2, 1, None, str(tmp_path / "flat"))


def test_class_folder_without_images(tmp_path, solid_folder):
    (solid_folder / "empty").mkdir()
    (solid_folder / "empty" / "notes.txt").write_text("not an image")
    with pytest.raises(DataError, match=f"{solid_folder / 'empty'}: no images"):
        ClassifyTrainPipeline(2, 1, None, str(solid_folder))


def test_missing_file_list(tmp_path, solid_folder):
    with pytest.raises(DataError, match=str(tmp_path / "list.txt")):
        ClassifyTrainPipeline(2, 1, None, str(solid_folder), file_list=str(tmp_path / "list.txt"))


def test_image_and_mask_lists_of_different_length(seg_files):
    imgs, lbls = seg_files
    with pytest.raises(DataError, match=f"got {SEG_N} images but {SEG_N - 1} masks.*{imgs[0]}"):
        fetch_dali_loader(imgs, lbls[:-1], batch_size=2, mode="train")


def test_empty_image_list():
    with pytest.raises(DataError, match="empty list of images"):
        fetch_dali_loader([], [], batch_size=2, mode="eval")


def test_no_masks(seg_files):
    with pytest.raises(DataError, match=f"got {SEG_N} images but 0 masks"):
        fetch_dali_loader(seg_files[0], None, batch_size=2, mode="test")


def test_mask_size_differs_from_image(seg_files):
    imgs, lbls = seg_files
    np.save(lbls[4], np.zeros((SEG_H, SEG_W - 1, 1), np.uint8))
    with pytest.raises(DataError, match=f"{lbls[4]}: mask is {SEG_H}x{SEG_W - 1} but its image {imgs[4]} is "
                                        f"{SEG_H}x{SEG_W}"):
        SegmentTrainPipeline(2, 1, None, imgs, lbls)


def test_missing_mask_file(seg_files):
    imgs, lbls = seg_files
    lbls[2] = lbls[2].replace("s2", "gone/s2")
    with pytest.raises(DataError, match=f"{lbls[2]}: no such file"):
        SegmentValPipeline(2, 1, None, imgs, lbls)


def test_truncated_npy(seg_files):
    imgs, lbls = seg_files
    with open(lbls[3], "r+b") as f:
        f.truncate(os.path.getsize(lbls[3]) - 1)
    with pytest.raises(DataError, match=rf"{lbls[3]}: truncated: 1087 bytes, but its header "
                                        rf"\(\({SEG_H}, {SEG_W}, 1\) uint8\) needs 1088"):
        SegmentValPipeline(2, 1, None, imgs, lbls)


def test_float_images_with_nan_or_inf_are_refused(tmp_path):
    images = [np.full((SEG_H, SEG_W), 0.5, np.float32) for _ in range(4)]
    images[2][3, 4] = np.nan
    imgs, lbls = save_pairs(tmp_path, images, [seg_mask(k) for k in range(4)])
    with pytest.raises(DataError, match=f"^{re.escape(imgs[2])}: holds NaN or infinite pixels"):
        seg_pipe(imgs, lbls, batch_size=2, mode="train")
    images[2][3, 4] = np.inf
    np.save(imgs[2], images[2])
    with pytest.raises(DataError, match=f"^{re.escape(imgs[2])}: holds NaN or infinite pixels"):
        seg_pipe(imgs, lbls, batch_size=2, mode="eval")


def test_not_an_npy_file(seg_files):
    imgs, lbls = seg_files
    with open(imgs[5], "w") as f:
        f.write("P6 40 24 255\n")
    with pytest.raises(DataError, match=f"{imgs[5]}: not a .npy array"):
        fetch_dali_loader(imgs, lbls, batch_size=2, mode="eval")


@pytest.mark.parametrize("what,array,found", [
    ("image", np.zeros((SEG_H, SEG_W, 4), np.uint8), rf"\({SEG_H}, {SEG_W}, 4\) uint8"),
    ("image", np.zeros((SEG_H, SEG_W, 3), np.float64), rf"\({SEG_H}, {SEG_W}, 3\) float64"),
    ("image", np.zeros((SEG_H, SEG_W, 3), ">u2"), rf"\({SEG_H}, {SEG_W}, 3\) >u2"),
    ("image", np.zeros((1, SEG_H, SEG_W, 3), np.uint8), rf"\(1, {SEG_H}, {SEG_W}, 3\) uint8"),
    ("mask", np.zeros((SEG_H, SEG_W, 2), np.uint8), rf"\({SEG_H}, {SEG_W}, 2\) uint8"),
    ("mask", np.zeros((SEG_H, SEG_W), np.float32), rf"\({SEG_H}, {SEG_W}\) float32"),
])
def test_wrong_shape_or_dtype_names_the_file(seg_files, what, array, found):
    imgs, lbls = seg_files
    path = (imgs if what == "image" else lbls)[6]
    np.save(path, array)
    expected = ("an image of shape (H, W), (H, W, 1) or (H, W, 3) of uint8, uint16, float32" if what == "image"
                else "a mask of shape (H, W) or (H, W, 1) of integer class indices")
    with pytest.raises(DataError, match=f"{path}: expected {re.escape(expected)}, got {found}$"):
        fetch_dali_loader(imgs, lbls, batch_size=2, mode="train")


@pytest.mark.parametrize("what,array", [("image", np.zeros((SEG_H, SEG_W, 3), np.uint16)),
                                        ("image", np.zeros((SEG_H, SEG_W), np.uint8)),
                                        ("mask", np.zeros((SEG_H, SEG_W), np.uint8)),
                                        ("mask", np.zeros((SEG_H, SEG_W, 1), np.int64))])
def test_a_set_shares_one_kind_of_image_and_of_mask(seg_files, what, array):
    imgs, lbls = seg_files
    paths = imgs if what == "image" else lbls
    np.save(paths[7], array)
    first = f"{SEG_H}, {SEG_W}, 3\\) uint8" if what == "image" else f"{SEG_H}, {SEG_W}, 1\\) uint8"
    with pytest.raises(DataError, match=f"{paths[7]}: {what} of shape .* but the set's first {what} {paths[0]} "
                                        f"is \\({first}"):
        fetch_dali_loader(imgs, lbls, batch_size=2, mode="eval")


def test_mean_without_std(seg_files):
    with pytest.raises(ValueError, match="give both mean and std, or neither"):
        fetch_dali_loader(*seg_files, batch_size=2, mode="eval", mean=[0.5, 0.5, 0.5])


def test_mean_of_the_wrong_length(seg_files):
    with pytest.raises(ValueError, match=r"mean and std need 1 or 3 values each .* got mean=\[0.0, 0.0\]"):
        fetch_dali_loader(*seg_files, batch_size=2, mode="eval", mean=[0, 0], std=[1, 1])


def test_unknown_mode(seg_files):
    with pytest.raises(ValueError, match="mode must be one of train, eval, test, got 'predict'"):
        fetch_dali_loader(*seg_files, batch_size=2, mode="predict")


# ------------------------------------------------------------------------------------------
# GPU
# ------------------------------------------------------------------------------------------


@gpu
def test_gpu_mixed_decode_train(texture_folder):
    pipe = ClassifyTrainPipeline(4, 2, 0, str(texture_folder), crop_size=32, seed=1, dtype="float16")
    seen = 0
    for batch in classify_iterator(pipe):
        images = batch[0]["data"]
        assert images.device.type == "cuda" and images.dtype == torch.float16 and images.shape[1:] == (3, 32, 32)
        seen += images.shape[0]
    assert seen == 4 * len(CLASSES)



@gpu
@pytest.mark.parametrize("fmt", FORMATS)
def test_gpu_shards_train_with_random_erase(split_root, fmt):
    pipe = ClassifyTrainPipeline(4, 2, 0, str(to_shards(split_root, fmt) / "train"), crop_size=32, seed=1,
                                 dtype="float16", random_erase=1.0)
    labels = []
    for batch in classify_iterator(pipe):
        images = batch[0]["data"]
        assert images.device.type == "cuda" and images.dtype == torch.float16 and images.shape == (4, 3, 32, 32)
        assert (images == 0).all(dim=1).flatten(1).any(dim=1).all()  # every image has an erased box
        labels += batch[0]["label"].squeeze(-1).tolist()
    assert len(labels) == 24 and set(labels) == {0, 1, 2}

LEVEL = 1 / min(IMAGENET_STD)  # one 8-bit step, in normalized units


def smooth_picture(rng, h, w):
    """Photo-like content: smooth colour gradients and a few soft-edged shapes."""
    yy, xx = np.mgrid[0:h, 0:w] / max(h, w)
    picture = rng.uniform(40, 200, 3) + xx[..., None] * rng.uniform(-80, 80, 3) + yy[..., None] * rng.uniform(-80, 80, 3)
    for _ in range(3):
        cy, cx, r = rng.uniform(0, 1, 3) * (h, w, min(h, w) / 2)
        inside = ((np.mgrid[0:h, 0:w][0] - cy) ** 2 + (np.mgrid[0:h, 0:w][1] - cx) ** 2) < r ** 2
        picture[inside] = 0.5 * picture[inside] + 0.5 * rng.uniform(0, 255, 3)
    return Image.fromarray(np.clip(picture, 0, 255).astype(np.uint8))


def gpu_cpu_val_difference(folder):
    out = {}
    for device_id in (None, 0):
        pipe = ClassifyValPipeline(12, 2, device_id, str(folder), crop_size=40, resize_size=44)
        batch = next(iter(classify_iterator(pipe)))[0]
        out[device_id] = (batch["data"].cpu(), batch["label"].cpu())
    assert torch.equal(out[None][1], out[0][1])
    diff = (out[None][0] - out[0][0]).abs() / LEVEL
    print(f"GPU vs CPU, {folder.name}: mean {diff.mean():.3f}, max {diff.max():.3f} 8-bit levels")
    return diff


@gpu
def test_gpu_and_cpu_val_outputs_match_on_png(tmp_path):
    # PNG decodes identically on both; resizing and normalizing may differ by rounding only.
    rng = np.random.default_rng(1)
    for c in range(3):
        (tmp_path / "png" / f"c{c}").mkdir(parents=True)
        for i in range(4):
            smooth_picture(rng, 60 + 7 * i, 80 - 5 * i).save(tmp_path / "png" / f"c{c}" / f"{i}.png")
    diff = gpu_cpu_val_difference(tmp_path / "png")
    assert diff.mean() < 0.1 and diff.max() <= 2


@gpu
def test_gpu_and_cpu_val_outputs_match_on_jpeg(tmp_path):
    # nvJPEG and libjpeg-turbo upsample chroma and round the IDCT differently: close on average,
    # a few levels apart at sharp colour edges. A swapped channel, wrong normalisation or a shifted
    # crop would be tens of levels off on average.
    rng = np.random.default_rng(2)
    for c in range(3):
        (tmp_path / "jpeg" / f"c{c}").mkdir(parents=True)
        for i in range(4):
            smooth_picture(rng, 60 + 7 * i, 80 - 5 * i).save(tmp_path / "jpeg" / f"c{c}" / f"{i}.jpg", quality=90)
    diff = gpu_cpu_val_difference(tmp_path / "jpeg")
    assert diff.mean() < 1 and diff.max() < 32


@gpu
@pytest.mark.parametrize("kind", ["rgb8", "uint16-grey-int64-mask"])
def test_gpu_and_cpu_segmentation_val_match(tmp_path, seg_files, kind):
    if kind == "rgb8":
        imgs, lbls = seg_files
    else:
        rng = np.random.default_rng(2)
        images = [(rng.random((SEG_H, SEG_W)) * 4000).astype(np.uint16) for _ in range(4)]
        masks = [rng.integers(-1, 4, (SEG_H, SEG_W)).astype(np.int64) for _ in range(4)]
        imgs, lbls = save_pairs(tmp_path, images, masks, [(f"g/i{k}.npy", f"g/m{k}.npy") for k in range(4)])
    cpu_images, cpu_masks = seg_epoch(seg_loader(imgs, lbls, batch_size=4, mode="eval", size=(32, 48)))
    gpu_images, gpu_masks = seg_epoch(seg_loader(imgs, lbls, batch_size=4, mode="eval", size=(32, 48), device_id=0))
    assert gpu_images.device.type == "cuda" and gpu_masks.dtype == cpu_masks.dtype
    assert torch.equal(cpu_masks, gpu_masks.cpu())
    diff = (cpu_images - gpu_images.cpu()).abs()
    if kind == "rgb8":
        # The CPU pipeline resizes 8-bit images with torch and keeps them 8-bit (rounded), the GPU one with DALI's
        # Resize in float: a level of the input apart at most, a quarter of one on average (rounding's own share).
        levels = diff * torch.tensor(pipelines.IMAGENET_STD).view(1, 3, 1, 1)
        assert levels.max() <= 1.001 and levels.mean() < 0.4
    else:
        # both resized by DALI, rounding differently: about 1 / 1150 for a 0..4000 uint16 image normalized by its std
        assert diff.max() < 3e-3


@gpu
def test_gpu_segmentation_train_alignment(seg_files):
    loader = seg_loader(*seg_files, batch_size=5, mode="train", size=(SEG_H, SEG_W), device_id=0,
                        **dict(NO_AUGMENT, flip_p=0.5))
    images, masks = seg_epoch(loader)
    assert sorted(sample_ids(images)) == list(range(SEG_N))
    raw = unnormalize(images)
    np.testing.assert_allclose(raw[..., 0], masks[:, 0].cpu().numpy() * 100.0, atol=1e-3)


@gpu
def test_gpu_augmentations_touch_only_the_samples_that_draw_them(seg_files):
    imgs, lbls = [p * 4 for p in seg_files]
    kwargs = dict(batch_size=40, mode="train", size=(SEG_H, SEG_W), device_id=0, seed=4)
    base, base_masks = seg_epoch(seg_loader(imgs, lbls, **kwargs, **NO_AUGMENT))
    for augmentation in ("noise_p", "blur_p", "brightness_p", "contrast_p"):
        images, masks = seg_epoch(seg_loader(imgs, lbls, **kwargs, **dict(NO_AUGMENT, **{augmentation: 0.5})))
        changed = (images - base).abs().amax(dim=(1, 2, 3)) > 1e-3
        assert 0 < changed.sum() < 40, augmentation
        assert torch.equal(images[~changed], base[~changed]) and torch.equal(masks, base_masks)


def test_progress_prints_count_rate_and_eta_only_for_long_jobs(monkeypatch):
    """A job done within the first interval prints nothing; a longer one prints one line per interval with its
    count of the total, rate and ETA, and a last line with its total time."""
    clock = iter(range(0, 1000, 2))  # every reading of the clock is 2 s after the last: an item takes 2 s
    monkeypatch.setattr(pipelines.time, "perf_counter", lambda: next(clock))
    out = io.StringIO()
    assert list(pipelines.progress(range(7), 7, "indexing shards", every=5, out=out)) == list(range(7))
    assert out.getvalue().splitlines() == ["indexing shards: 3/7 (43 %), 0.5/s, eta 8 s",
                                           "indexing shards: 6/7 (86 %), 0.5/s, eta 2 s",
                                           "indexing shards: 7 done in 16 s"]
    quiet = io.StringIO()
    assert list(pipelines.progress(range(2), 2, "quick", every=5, out=quiet)) == [0, 1] and quiet.getvalue() == ""


@gpu
def test_gpu_and_cpu_leave_exif_orientation_alone(tmp_path):
    exif_rotated(tmp_path / "exif" / "c" / "a.jpg")
    cpu, gpu_ = (unnormalize(next(iter(classify_iterator(ClassifyValPipeline(
        1, 1, device_id, str(tmp_path / "exif"), crop_size=48, resize_size=48))))[0]["data"])[0] for device_id in (None, 0))
    assert cpu.shape == gpu_.shape == (48, 48, 3) and np.abs(cpu - gpu_).mean() < 2
    assert gpu_[:, :8, 0].mean() > 200 and gpu_[:, -8:, 2].mean() > 200  # red left, blue right: not turned


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
    return len(a) == len(b) and all(torch.equal(x, z) and torch.equal(y, w) for (x, y), (z, w) in zip(a, b))


def test_cpu_pipelines_ignore_the_decoder_cache(texture_folder):
    plain, told = (first_batches(classify_iterator(ClassifyTrainPipeline(2, 2, None, str(texture_folder), crop_size=24,
                                                                         seed=3, **kwargs)), 8)
                   for kwargs in ({}, {"decoder_cache": 64}))
    assert same_batches(plain, told)
    assert pipelines.plan_decoder_cache("on", [ClassifyValPipeline(2, 1, None, str(texture_folder))]) == (None, None)


@gpu
def test_gpu_decoder_cache_gives_the_batches_of_the_same_pipeline_without_it(texture_folder):
    """Whole images decoded into DALI's GPU cache, then cropped on the GPU: over 2.5 epochs (the first fills the
    cache, the next find every image there) the batches are bit for bit those of the same pipeline with no cache."""
    def batches(cache):  # 12 images in batches of 2: 6 a epoch
        return first_batches(classify_iterator(ClassifyTrainPipeline(2, 2, 0, str(texture_folder), crop_size=24,
                                                                     seed=3, decoder_cache=cache)), 15)

    plain, cached = batches(0), batches(64)
    assert plain[0][0].shape == (2, 3, 24, 24) and same_batches(plain, cached)
    assert not same_batches(plain, first_batches(classify_iterator(ClassifyTrainPipeline(  # the crop-decode path
        2, 2, 0, str(texture_folder), crop_size=24, seed=3)), 15))


@gpu
def test_gpu_decoder_cache_resumes_from_a_checkpoint_with_the_same_batches(texture_folder):
    def loader(**kwargs):
        return classify_iterator(ClassifyTrainPipeline(2, 2, 0, str(texture_folder), crop_size=24, seed=5,
                                                       decoder_cache=64, enable_checkpointing=True, **kwargs))

    it = loader()
    first_batches(it, 8)  # into the second epoch: the cache holds every image
    checkpoint = it.checkpoints()[0]
    assert same_batches(first_batches(it, 7), first_batches(loader(checkpoint=checkpoint), 7))


@gpu
def test_gpu_cached_validation_sees_every_sample_once_per_epoch_on_two_shards(solid_folder):
    loaders = [classify_iterator(ClassifyValPipeline(4, 1, 0, str(solid_folder), crop_size=24, shard_id=s,
                                                     num_shards=2, decoder_cache=64)) for s in range(2)]
    for _ in range(3):  # the first epoch fills the caches; each shard keeps its own samples
        seen = [sample for it in loaders for batch in it for sample in identities(batch[0]["data"])]
        assert sorted(seen) == EVERYTHING


def test_overlay_shows_image_truth_and_prediction_in_class_colours_with_titles_and_legend(tmp_path):
    images = torch.stack([torch.linspace(-1, 1, 32 * 32).view(1, 32, 32).expand(3, -1, -1)] * 2)  # two ramps
    masks, preds = torch.zeros(2, 32, 32, dtype=torch.long), torch.zeros(2, 32, 32, dtype=torch.long)
    masks[:, :16], preds[:, :, 16:] = 1, 2  # truth: class 1 on top; prediction: class 2 on the right
    pipelines.save_overlay(str(tmp_path / "o.png"), images, masks, preds, num_classes=3)
    with Image.open(tmp_path / "o.png") as im:
        canvas = np.asarray(im.convert("RGB")).astype(int)
    # 3 columns of 32 px and 4 px padding; a 16 px title line; 2 rows; a legend of two lines (it needs more width)
    assert canvas.shape == (16 + 2 * 36 + 4 + 2 * 16, 3 * 36 + 4, 3)
    tile = lambda row, col: canvas[16 + 4 + 36 * row:16 + 36 + 36 * row, 4 + 36 * col:36 + 36 * col]
    plain = np.asarray(255 * (images[0, 0] + 1) / 2).astype(np.uint8).astype(int)  # each image stretched to 0..255
    green, magenta = np.array([0, 255, 0]), np.array([255, 0, 255])  # class 1, class 2: the same in both columns
    for row in (0, 1):
        assert np.abs(tile(row, 0) - plain[..., None]).max() <= 1  # the image, bare
        truth, pred = tile(row, 1), tile(row, 2)
        assert np.abs(truth[:16] - (0.55 * plain[:16, :, None] + 0.45 * green)).max() <= 1.5
        assert np.abs(truth[16:] - plain[16:, :, None]).max() <= 1  # background stays bare
        assert np.abs(pred[:, 16:] - (0.55 * plain[:, 16:, None] + 0.45 * magenta)).max() <= 1.5
        assert np.abs(pred[:, :16] - plain[:, :16, None]).max() <= 1
    for col in range(3):  # a title over each column: white text on black
        assert (canvas[2:14, 4 + 36 * col:36 + 36 * col] > 200).all(axis=-1).sum() >= 10
    legend = 16 + 2 * 36 + 4
    assert (canvas[legend + 5, 6] == green).all() and (canvas[legend + 16 + 5, 6] == magenta).all()
