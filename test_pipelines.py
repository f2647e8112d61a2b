"""Tests of pipelines.py on tiny data built in tmp_path. CPU-only DALI everywhere; the GPU tests at
the end run where a CUDA device is visible (see README: they were run on an H200)."""

import json
import os
import re
import shutil
import struct
import tarfile
from collections import Counter

import numpy as np
import pytest
import torch
from nvidia.dali import types
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
        assert sorted(Counter(seen).values()) == [1] * 20 + [4]  # the padding repeats one real sample


def test_two_val_shards_cover_the_dataset_once(solid_folder):
    shards = [one_epoch(ClassifyValPipeline(4, 2, None, str(solid_folder), crop_size=24, shard_id=s,
                                            num_shards=2))[0] for s in range(2)]
    assert not set(shards[0]) & set(shards[1])
    assert sorted(shards[0] + shards[1]) == EVERYTHING
    assert abs(len(shards[0]) - len(shards[1])) <= 1


def test_two_train_shards_run_equal_full_batches_and_cover_the_dataset(solid_folder):
    shards = [batch_sizes_and_identities(ClassifyTrainPipeline(4, 2, None, str(solid_folder), crop_size=24,
                                                               shard_id=s, num_shards=2, seed=5)) for s in range(2)]
    # 10 and 11 samples: both shards are padded to 3 batches of 4, with repeats of their own samples
    assert [sizes for sizes, _ in shards] == [[4, 4, 4], [4, 4, 4]]
    assert not set(shards[0][1]) & set(shards[1][1])
    assert sorted(set(shards[0][1]) | set(shards[1][1])) == EVERYTHING


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
        assert [len(s) for s in seen] == [12, 12]  # 10 and 11 samples, each filled up to 3 batches of 4
        assert not set(seen[0]) & set(seen[1])
        assert sorted(set(seen[0]) | set(seen[1])) == expected_pairs("train")
        orders.append(seen[0])
    assert orders[0] != orders[1] != orders[2]


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


def seg_mask(k):
    """An asymmetric mask of classes 0, 1, 2 that differs per sample: flips and mix-ups show."""
    mask = np.zeros((SEG_H, SEG_W, 1), np.uint8)
    mask[2 + k % 5:12, 3:6 + 2 * k] = 1
    mask[14:20, 25 + k % 7:38] = 2
    return mask


@pytest.fixture
def seg_files(tmp_path):
    imgs, lbls = [], []
    for k in range(SEG_N):
        mask = seg_mask(k)
        # channel 0 encodes the mask, so image/mask alignment can be read back from the image
        image = np.stack([mask[..., 0] * 100, np.full((SEG_H, SEG_W), 10 * k), np.full((SEG_H, SEG_W), 50)], -1)
        (tmp_path / "images").mkdir(exist_ok=True)
        (tmp_path / "masks").mkdir(exist_ok=True)
        imgs.append(str(tmp_path / "images" / f"s{k}.npy"))
        lbls.append(str(tmp_path / "masks" / f"s{k}.npy"))
        np.save(imgs[-1], image.astype(np.uint8))
        np.save(lbls[-1], mask)
    return imgs, lbls


def seg_epoch(loader):
    images, masks = [], []
    for batch in loader:
        images.append(batch[0]["image"])
        masks.append(batch[0]["mask"])
    return torch.cat(images), torch.cat(masks)


def test_segment_val_shapes_and_values(seg_files):
    images, masks = seg_epoch(fetch_dali_loader(*seg_files, batch_size=4, mode="eval", size=(SEG_H, SEG_W)))
    assert images.shape == (SEG_N, 3, SEG_H, SEG_W) and images.dtype == torch.float32
    assert masks.shape == (SEG_N, 1, SEG_H, SEG_W) and masks.dtype == torch.uint8
    for k in range(SEG_N):  # no shuffle: file order
        np.testing.assert_array_equal(masks[k].numpy().transpose(1, 2, 0), seg_mask(k))
        raw = unnormalize(images[k:k + 1])[0]
        np.testing.assert_allclose(raw[..., 1], 10 * k, atol=1e-3)
        np.testing.assert_allclose(raw[..., 0], seg_mask(k)[..., 0] * 100.0, atol=1e-3)


def test_segment_train_flips_keep_image_and_mask_aligned(seg_files):
    aug = dict(NO_AUGMENT, flip_p=0.5)
    loader = fetch_dali_loader(*seg_files, batch_size=3, mode="train", size=(SEG_H, SEG_W), seed=3, **aug)
    flipped = 0
    for _ in range(3):
        images, masks = seg_epoch(loader)
        assert images.shape == (SEG_N, 3, SEG_H, SEG_W)
        raw = unnormalize(images)
        ids = np.rint(raw[:, 0, 0, 1] / 10).astype(int)
        assert sorted(ids.tolist()) == list(range(SEG_N))  # every sample once per epoch
        for k, image, mask in zip(ids, raw, masks.numpy()):
            np.testing.assert_allclose(image[..., 0], mask[0] * 100.0, atol=1e-3)  # aligned
            flipped += not np.array_equal(mask[0], seg_mask(k)[..., 0])
            # a flip moves pixels, never changes what the mask holds
            assert np.array_equal(np.sort(mask.ravel()), np.sort(seg_mask(k).ravel()))
    assert flipped > 0


def test_segment_masks_keep_class_values_under_all_augmentations(seg_files):
    aug = dict(flip_p=0.5, noise_p=1.0, blur_p=1.0, brightness_p=1.0, contrast_p=1.0)
    images, masks = seg_epoch(fetch_dali_loader(*seg_files, batch_size=4, mode="train", size=(37, 53), **aug))
    assert images.shape == (SEG_N, 3, 37, 53) and masks.shape == (SEG_N, 1, 37, 53)
    assert masks.dtype == torch.uint8
    assert set(masks.unique().tolist()) == {0, 1, 2}


@pytest.mark.parametrize("augmentation", ["noise_p", "blur_p", "brightness_p", "contrast_p"])
def test_each_photometric_augmentation_changes_image_not_mask(seg_files, augmentation):
    def run(**aug):
        return seg_epoch(fetch_dali_loader(*seg_files, batch_size=SEG_N, mode="train", size=(SEG_H, SEG_W),
                                           seed=9, **aug))

    base_images, base_masks = run(**NO_AUGMENT)
    images, masks = run(**dict(NO_AUGMENT, **{augmentation: 1.0}))
    assert torch.equal(masks, base_masks)
    assert (images - base_images).abs().amax(dim=(1, 2, 3)).min() > 1e-3  # every sample changed
    assert torch.isfinite(images).all()


def test_contrast_stays_within_the_image_range(seg_files):
    base, _ = seg_epoch(fetch_dali_loader(*seg_files, batch_size=SEG_N, mode="train", size=(SEG_H, SEG_W),
                                          **NO_AUGMENT))
    aug = dict(NO_AUGMENT, contrast_p=1.0)
    images, _ = seg_epoch(fetch_dali_loader(*seg_files, batch_size=SEG_N, mode="train", size=(SEG_H, SEG_W), **aug))
    for a, b in zip(base, images):
        assert b.min() >= a.min() - 1e-5 and b.max() <= a.max() + 1e-5


def test_segment_two_shards_cover_the_dataset_once(seg_files):
    seen = []
    for shard in range(2):
        images, _ = seg_epoch(fetch_dali_loader(*seg_files, batch_size=3, mode="train", size=(SEG_H, SEG_W),
                                                shard_id=shard, num_shards=2, **NO_AUGMENT))
        seen.append(np.rint(unnormalize(images)[:, 0, 0, 1] / 10).astype(int).tolist())
    assert not set(seen[0]) & set(seen[1])
    assert sorted(seen[0] + seen[1]) == list(range(SEG_N))


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


def test_unpaired_names(seg_files):
    imgs, lbls = seg_files
    lbls = lbls[1:] + lbls[:1]
    with pytest.raises(DataError, match=f"{imgs[0]} and {lbls[0]} do not pair"):
        SegmentValPipeline(2, 1, None, imgs, lbls)


def test_mask_size_differs_from_image(seg_files):
    imgs, lbls = seg_files
    np.save(lbls[4], np.zeros((SEG_H, SEG_W - 1, 1), np.uint8))
    with pytest.raises(DataError, match=f"{lbls[4]}: mask is {SEG_H}x{SEG_W - 1} but its image"):
        SegmentTrainPipeline(2, 1, None, imgs, lbls)


def test_missing_mask_file(seg_files):
    imgs, lbls = seg_files
    lbls[2] = lbls[2].replace("s2", "gone/s2")
    with pytest.raises(DataError, match=f"{lbls[2]}: no such file"):
        SegmentValPipeline(2, 1, None, imgs, lbls)


def test_mask_without_channel_axis(seg_files):
    imgs, lbls = seg_files
    np.save(lbls[0], np.zeros((SEG_H, SEG_W), np.uint8))
    with pytest.raises(DataError, match=rf"{lbls[0]}: expected a mask of shape \(H, W, 1\)"):
        SegmentValPipeline(2, 1, None, imgs, lbls)


def test_unknown_mode(seg_files):
    with pytest.raises(ValueError, match="mode must be one of"):
        fetch_dali_loader(*seg_files, batch_size=2, mode="test")


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
def test_gpu_and_cpu_segmentation_val_match(seg_files):
    cpu_images, cpu_masks = seg_epoch(fetch_dali_loader(*seg_files, batch_size=4, mode="eval", size=(32, 48)))
    gpu_images, gpu_masks = seg_epoch(fetch_dali_loader(*seg_files, batch_size=4, mode="eval", size=(32, 48),
                                                        device_id=0))
    assert gpu_images.device.type == "cuda"
    assert torch.equal(cpu_masks, gpu_masks.cpu())
    assert (cpu_images - gpu_images.cpu()).abs().max() < 1e-3


@gpu
def test_gpu_segmentation_train_alignment(seg_files):
    loader = fetch_dali_loader(*seg_files, batch_size=4, mode="train", size=(SEG_H, SEG_W), device_id=0,
                               **dict(NO_AUGMENT, flip_p=0.5))
    images, masks = seg_epoch(loader)
    raw = unnormalize(images)
    np.testing.assert_allclose(raw[..., 0], masks[:, 0].cpu().numpy() * 100.0, atol=1e-3)
