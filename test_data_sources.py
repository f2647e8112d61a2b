"""Tests of data_sources.py, what the pipelines read, on tiny data built in tmp_path, mostly through the pipelines
that read it: ImageFolder labels, file lists and classes by name, TFRecord and WebDataset shards (their indexes,
manifests, classes.txt, stored labels, truncation), the padding of training sets, undecodable images, progress
lines, the decoder cache plan, and the DataError that bad folders and segmentation .npy files raise, naming the
file. CPU-only DALI."""

import functools
import io
import json
import math
import os
import re
import shutil
import struct
import sys
import tarfile
import threading
import time
from collections import Counter
from types import SimpleNamespace

import numpy as np
import pytest
from nvidia.dali import types
from PIL import Image
from torchvision.datasets import ImageFolder

import data_sources
import outputs
import pipelines
from conftest import (
    CLASSES,
    FORMATS,
    PER_CLASS,
    SEG_H,
    SEG_N,
    SEG_W,
    VAL_CLASSES,
    first_batches,
    identities,
    one_epoch,
    same_batches,
    save_pairs,
    seg_mask,
    solid_colour,
    to_shards,
    unnormalize,
)
from data_sources import (
    ClassifyReader,
    DataError,
    check_finite_pixels,
    check_segmentation_files,
    find_layout,
    find_undecodable,
    list_image_folder,
    shard_files,
)
from make_shards import make_shards, write_tar, write_tfrecord
from pipelines import (
    ClassifyTrainPipeline,
    ClassifyValPipeline,
    SegmentPredictPipeline,
    classify_iterator,
)

pytestmark = pytest.mark.usefixtures("no_dist_env")


# ------------------------------------------------------------------------------------------
# classification: ImageFolder labels and file lists
# ------------------------------------------------------------------------------------------


def test_labels_are_imagefolder_class_indices(solid_folder):
    class_to_idx = ImageFolder(str(solid_folder)).class_to_idx
    assert class_to_idx == {"Apple": 0, "b c": 1, "zebra": 2}
    pipe = ClassifyTrainPipeline(4, 2, None, str(solid_folder), crop_size=24, seed=3)
    seen, labels = one_epoch(pipe)
    for (c, _), label in zip(seen, labels):
        assert label == class_to_idx[CLASSES[c]]
    assert sorted(set(labels)) == [0, 1, 2]


def test_file_list(tmp_path, solid_folder):
    listing = tmp_path / "list.txt"
    listing.write_text("zebra/img0.png 5\nApple/img3.png 9\n")
    pipe = ClassifyValPipeline(2, 1, None, str(solid_folder), crop_size=16, file_list=str(listing))
    batch = next(iter(classify_iterator(pipe)))[0]
    assert batch["label"].squeeze(-1).tolist() == [5, 9]
    assert identities(batch["data"]) == [(0, 0), (1, 3)]


# ------------------------------------------------------------------------------------------
# classification: TFRecord and WebDataset shards, padding, labels, classes by name, undecodable images
# ------------------------------------------------------------------------------------------


# torchvision's indices of CLASSES, which every split is labelled by
TRAIN_INDEX = {"Apple": 0, "b c": 1, "zebra": 2}


def expected_pairs(split):
    """(identity, label) of every image of a split of ``split_root``, labelled by train's classes."""
    names, n = (CLASSES, PER_CLASS) if split == "train" else (VAL_CLASSES, 2)
    return sorted(((CLASSES.index(name), i), TRAIN_INDEX[name]) for name in names for i in range(n))


def epoch_pairs(pipe):
    seen, labels = one_epoch(pipe)
    return sorted(zip(seen, labels))


@pytest.mark.parametrize("num_shards", [1, 2])
@pytest.mark.parametrize("fmt", FORMATS)
def test_shards_give_the_folder_pairs_once_per_epoch(split_root, fmt, num_shards):
    dst = to_shards(split_root, fmt)
    for split in ("train", "val"):
        shards = [
            epoch_pairs(
                ClassifyValPipeline(
                    4, 1, None, str(dst / split), crop_size=16, shard_id=s, num_shards=num_shards
                )
            )
            for s in range(num_shards)
        ]
        assert sorted(sum(shards, [])) == expected_pairs(split)
        assert not set(shards[0]) & set(shards[-1]) or num_shards == 1
    pipe = ClassifyTrainPipeline(
        4, 1, None, str(dst / "train"), crop_size=16, shard_id=1, num_shards=num_shards
    )
    assert pipe.layout == fmt and pipe.classes == sorted(CLASSES) and pipe.num_classes == 3
    assert pipe.num_samples == len(CLASSES) * PER_CLASS  # the whole split, every shard
    assert pipe.files == shard_files(str(dst / "train"), fmt) and len(pipe.files) == 3


@pytest.mark.parametrize("fmt", FORMATS)
def test_two_train_shards_cover_every_sample_each_epoch_as_shard_order_changes(split_root, fmt):
    dst = to_shards(split_root, fmt)
    # per-rank seeds, as a DDP trainer passes them; the shard order each epoch must still agree
    loaders = [
        classify_iterator(
            ClassifyTrainPipeline(
                4, 1, None, str(dst / "train"), crop_size=16, shard_id=s, num_shards=2, seed=10 + s
            )
        )
        for s in range(2)
    ]
    orders = []
    for _ in range(3):
        seen = [
            [
                pair
                for b in it
                for pair in zip(identities(b[0]["data"]), b[0]["label"].squeeze(-1).tolist())
            ]
            for it in loaders
        ]
        assert [len(s) for s in seen] == [
            12,
            12,
        ]  # 21 samples and 3 distinct ones repeated: 3 batches of 4 each
        counts = Counter(seen[0] + seen[1])
        assert (
            sorted(counts) == expected_pairs("train")
            and sorted(counts.values()) == [1] * 18 + [2] * 3
        )
        orders.append(seen[0])
    assert orders[0] != orders[1] != orders[2]


@pytest.mark.parametrize("fmt", ["folder", *FORMATS])
@pytest.mark.parametrize("batch_size,repeated", [(8, 3), (16, 11), (64, 43)])
def test_training_pads_with_distinct_samples_of_the_set(split_root, fmt, batch_size, repeated):
    """21 samples in batches of 8, 16 or 64: 3, 11 or 43 samples more make whole batches; they are distinct real
    samples while the set has enough (as DistributedSampler pads), never copies of one."""
    data = split_root / "train" if fmt == "folder" else to_shards(split_root, fmt) / "train"
    it = classify_iterator(
        ClassifyTrainPipeline(batch_size, 1, None, str(data), crop_size=8, seed=2)
    )
    assert len(it) == -(-21 // batch_size)
    for _ in range(2):
        seen = [
            pair
            for b in it
            for pair in zip(identities(b[0]["data"]), b[0]["label"].squeeze(-1).tolist())
        ]
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
    want = sorted(
        (p.read_bytes(), TRAIN_INDEX[p.parent.name]) for p in (split_root / "train").glob("*/*.png")
    )
    assert got == want


@pytest.mark.parametrize("fmt", FORMATS)
def test_shard_val_images_equal_the_folder_pipelines(tmp_path, texture_folder, fmt):
    (tmp_path / "root").mkdir()
    texture_folder.rename(tmp_path / "root" / "train")
    shutil.copytree(tmp_path / "root" / "train", tmp_path / "root" / "val")
    dst = to_shards(tmp_path / "root", fmt, shard_size=5)

    def outputs(folder):
        pipe = ClassifyValPipeline(5, 1, None, str(folder), crop_size=32, resize_size=40)
        return sorted(
            (b[0]["data"][k].numpy().tobytes(), int(b[0]["label"][k]))
            for b in classify_iterator(pipe)
            for k in range(b[0]["data"].shape[0])
        )

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
    shard = (
        tmp_path / "offset" / ("train-00000-of-00001" if fmt == "tfrecord" else "train-000000.tar")
    )
    shard.parent.mkdir()
    write_shard(
        shard, fmt, [(f, label + 1) for f, label in zip(files, labels)]
    )  # stored 1..3, as TF's ImageNet
    with pytest.raises(
        DataError, match=rf"^{shard}: stored label 3 minus label_offset 0 is outside \[0, 3\)$"
    ):
        ClassifyValPipeline(4, 1, None, str(shard.parent), num_classes=3)
    with pytest.raises(
        DataError, match=rf"^{shard}: stored label 1 minus label_offset 2 is outside \[0, 3\)$"
    ):
        ClassifyValPipeline(4, 1, None, str(shard.parent), num_classes=3, label_offset=2)
    pipe = ClassifyValPipeline(
        4, 1, None, str(shard.parent), crop_size=16, num_classes=3, label_offset=1
    )
    assert pipe.classes is None and pipe.num_classes == 3  # no classes.txt beside this shard
    assert epoch_pairs(pipe) == expected_pairs("train")


@pytest.mark.parametrize("key", ["s 1", "s\n1", "dir\tx/s1", "s\u20281"])
def test_a_tar_member_name_dalis_index_cannot_hold_is_named(split_root, tmp_path, key):
    files, labels, _ = list_image_folder(str(split_root / "train"))
    shard = tmp_path / "spaces" / "train-000000.tar"
    shard.parent.mkdir()
    with open(shard, "wb") as f:
        write_tar(f, list(zip(files, labels))[:3], ["s0", key, "s2"])
    with pytest.raises(
        DataError,
        match=f"^{re.escape(str(shard))}: member {re.escape(repr(key + '.png'))} has a space or "
        "line break in its name, which DALI's index of a tar cannot hold; rename it$",
    ):
        ClassifyValPipeline(4, 1, None, str(shard.parent), num_classes=3)


def index_files(folder):
    return sorted(p.name for p in folder.iterdir() if ".idx" in p.name)


@pytest.mark.parametrize("fmt", FORMATS)
def test_missing_index_is_built_beside_the_shard(split_root, fmt):
    dst = to_shards(split_root, fmt)
    written = index_files(dst / "train")
    assert len(written) == 6  # make_shards indexed its 3 shards: .idx and .idx.json each
    for name in written:
        (dst / "train" / name).unlink()
    assert epoch_pairs(
        ClassifyValPipeline(4, 1, None, str(dst / "train"), crop_size=16)
    ) == expected_pairs("train")
    assert index_files(dst / "train") == written


@pytest.mark.parametrize("fmt", FORMATS)
def test_an_index_of_older_checks_is_built_again(split_root, fmt, monkeypatch):
    """An index whose summary records other checks (or none: written before they were counted)
    vouches for samples today's checks have not seen (a text member, a JPEG cut short): its shard
    is scanned again, and the index of the same shard is the same."""
    dst = to_shards(split_root, fmt)
    (shard, *_) = shard_files(str(dst / "train"), fmt)
    with open(shard + ".idx.json") as f:
        summary = json.load(f)
    assert summary["checks"] == data_sources.CHECKS
    index = open(shard + ".idx").read()
    scanned, scan = [], data_sources._scan_shard
    monkeypatch.setattr(data_sources, "_scan_shard", lambda *a: scanned.append(a[0]) or scan(*a))
    assert data_sources.shard_index(shard, fmt)[1] == summary and scanned == []
    for older in ({k: v for k, v in summary.items() if k != "checks"}, dict(summary, checks=1)):
        with open(shard + ".idx.json", "w") as f:
            json.dump(older, f)
        assert data_sources.shard_index(shard, fmt)[1] == summary and scanned.pop() == shard
        assert open(shard + ".idx").read() == index


def test_index_builds_print_progress_per_shard(split_root, monkeypatch):
    dst = to_shards(split_root, "wds")
    for name in index_files(dst / "train"):
        (dst / "train" / name).unlink()
    out = io.StringIO()
    monkeypatch.setattr(
        data_sources, "progress", functools.partial(outputs.progress, every=0, out=out)
    )
    ClassifyValPipeline(4, 1, None, str(dst / "train"), crop_size=16)
    lines = out.getvalue().splitlines()
    assert [line.split(", ")[0] for line in lines[:3]] == [
        f"{dst / 'train'}: shards indexed: {k}/3 ({100 * k / 3:.0f} %)" for k in (1, 2, 3)
    ]
    assert lines[3].startswith(f"{dst / 'train'}: shards indexed: 3 done in ") and len(lines) == 4


def test_index_of_a_read_only_folder_goes_to_the_cache(split_root, tmp_path, monkeypatch):
    dst = to_shards(split_root, "wds")
    for name in index_files(dst / "val"):
        (dst / "val" / name).unlink()
    # as root every folder is writable, so stand in for a read-only mount
    access = os.access
    monkeypatch.setattr(
        os, "access", lambda path, mode: path != str(dst / "val") and access(path, mode)
    )
    monkeypatch.setattr(data_sources, "INDEX_CACHE", str(tmp_path / "cache"))
    assert epoch_pairs(
        ClassifyValPipeline(4, 1, None, str(dst / "val"), crop_size=16)
    ) == expected_pairs("val")
    assert index_files(dst / "val") == []
    assert sorted(p.name for p in (tmp_path / "cache").rglob("*.idx*")) == [
        "val-000000.tar.idx",
        "val-000000.tar.idx.json",
    ]


@pytest.mark.parametrize("fmt", FORMATS)
def test_index_of_a_rewritten_shard_is_rebuilt(split_root, fmt):
    dst, other = to_shards(split_root, fmt, seed=0), to_shards(split_root, fmt, seed=1)
    for shard in shard_files(str(dst / "train"), fmt):  # same names, other samples in each
        shutil.copyfile(shard.replace(str(dst), str(other)), shard)
    assert epoch_pairs(
        ClassifyValPipeline(4, 1, None, str(dst / "train"), crop_size=16)
    ) == expected_pairs("train")
    for shard in shard_files(str(dst / "train"), fmt):
        with open(shard + ".idx.json") as f:
            assert json.load(f)["shard"] == {
                "bytes": os.stat(shard).st_size,
                "mtime_ns": os.stat(shard).st_mtime_ns,
            }


@pytest.mark.parametrize("fmt", FORMATS)
def test_index_of_a_shard_rewritten_at_the_same_size_and_time_is_rebuilt(split_root, fmt, tmp_path):
    """cp -p and rsync -a keep a shard's modification time: a shard rewritten with the same samples in another order
    (so of the same size) and its old time must not be read through its old index."""
    big = 100  # one shard per split: its size does not depend on the order of its samples
    make_shards(str(split_root), str(tmp_path / "a"), fmt, big, 0)
    make_shards(str(split_root), str(tmp_path / "b"), fmt, big, 1)
    (shard,) = shard_files(str(tmp_path / "a" / "train"), fmt)
    other = shard.replace(str(tmp_path / "a"), str(tmp_path / "b"))
    assert (
        os.path.getsize(shard) == os.path.getsize(other)
        and open(shard, "rb").read() != open(other, "rb").read()
    )
    stat = os.stat(shard)
    shutil.copyfile(other, shard)
    os.utime(shard, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert os.stat(shard).st_mtime_ns == stat.st_mtime_ns and os.stat(shard).st_size == stat.st_size
    assert epoch_pairs(
        ClassifyValPipeline(4, 1, None, str(tmp_path / "a" / "train"), crop_size=16)
    ) == expected_pairs("train")
    assert (
        open(shard + ".idx").read() == open(other + ".idx").read()
    )  # the index of what the shard now holds


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_shard_set_that_lost_a_shard_is_refused(split_root, fmt):
    dst = to_shards(split_root, fmt)
    lost = shard_files(str(dst / "train"), fmt)[1]
    os.remove(lost)
    with pytest.raises(
        DataError,
        match=f"^{re.escape(lost)}: missing, but {re.escape(str(dst / 'manifest.json'))} "
        f"lists it \\(1 of 3 shards missing\\)",
    ):
        ClassifyTrainPipeline(4, 1, None, str(dst / "train"))


@pytest.mark.parametrize(
    "content",
    [b"{not json", b"[]", b'{"splits": []}', b'{"splits": {"train": {"shard": []}}}', b"\x80\x81"]
    + [b'{"splits": {"train": {"shards": [1, 2]}}}'],
)
def test_a_malformed_manifest_is_refused_and_an_absent_one_is_fine(split_root, content):
    dst = to_shards(split_root, "wds")
    manifest = dst / "manifest.json"
    manifest.write_bytes(content)
    with pytest.raises(
        DataError,
        match=f"^{re.escape(str(manifest))}: expected the JSON manifest make_shards.py writes "
        + re.escape('({"splits": {"train": {"shards": [shard file names]}}})'),
    ):
        ClassifyTrainPipeline(4, 1, None, str(dst / "train"))
    manifest.unlink()  # sets written by other tools have none
    assert ClassifyTrainPipeline(4, 1, None, str(dst / "train")).num_samples == 3 * PER_CLASS


def test_an_unreadable_manifest_is_named(split_root):
    dst = to_shards(split_root, "tfrecord")
    (dst / "manifest.json").unlink()
    (dst / "manifest.json").mkdir()
    with pytest.raises(
        DataError,
        match=f"^{re.escape(str(dst / 'manifest.json'))}: cannot be read \\(Is a directory\\)$",
    ):
        ClassifyTrainPipeline(4, 1, None, str(dst / "train"))


def last_index_line(shard):
    with open(shard + ".idx") as f:
        return f.read().split("\n")[-2].split()


@pytest.mark.parametrize(
    "fmt,cut",
    [
        ("tfrecord", "inside the last record"),
        ("wds", "inside the last image"),
        ("wds", "between two members"),
    ],
)
def test_truncated_shard_is_named(split_root, fmt, cut):
    dst = to_shards(split_root, fmt)
    shard = shard_files(str(dst / "train"), fmt)[0]
    line = last_index_line(shard)
    if fmt == "tfrecord":
        size = int(line[0]) + int(line[1]) // 2
    elif cut == "inside the last image":
        size = int(line[1]) + int(line[2]) // 2
    else:
        size = (
            int(line[5]) + 512
        )  # just after the last member's block: a shorter but well-formed tar body
    os.truncate(shard, size)
    with pytest.raises(DataError, match=f"^{shard}: truncated"):
        ClassifyValPipeline(4, 1, None, str(dst / "train"))


def test_val_folder_labels_follow_train_classes(split_root):
    train = ClassifyTrainPipeline(4, 1, None, str(split_root / "train"), crop_size=16)
    val = ClassifyValPipeline(
        4, 1, None, str(split_root / "val"), crop_size=16, classes=train.classes
    )
    assert val.classes == train.classes == ["Apple", "b c", "zebra"] and val.num_classes == 3
    assert epoch_pairs(val) == expected_pairs(
        "val"
    )  # zebra is 2, as in train, not 1 as val alone would say


def test_a_tree_read_alone_is_read_as_the_trainers_checked_one(split_root):
    """pipelines.py alone lists an ImageFolder tree itself (ImageFolderReader), unchecked; the
    trainers pass data_sources' ClassifyReader, which checks it first: the same files, labels and
    batches, training (padded, shuffled, sharded) and validation (train's class indices)."""
    train = split_root / "train"
    (train / "zebra" / "deeper").mkdir()
    Image.new("RGB", (9, 9), solid_colour(0, 9)).save(train / "zebra" / "deeper" / "x.PNG")
    (train / "Apple" / "notes.txt").write_text("not an image, left out by both")
    for pipeline, data, kwargs in (
        (ClassifyTrainPipeline, train, dict(shard_id=1, num_shards=2)),
        (ClassifyValPipeline, split_root / "val", dict(classes=["Apple", "b c", "zebra"])),
    ):
        pipes = [
            pipeline(4, 1, None, str(data), crop_size=16, seed=3, **kwargs, **reader)
            for reader in ({}, dict(reader=ClassifyReader))
        ]
        alone, checked = pipes
        assert type(alone.read).__name__ == "ImageFolderReader"
        assert (alone.files, alone.classes, alone.num_classes, alone.num_samples) == (
            checked.files,
            checked.classes,
            checked.num_classes,
            checked.num_samples,
        )
        assert alone.num_samples == (3 * PER_CLASS + 1 if pipeline is ClassifyTrainPipeline else 4)
        batches = [first_batches(classify_iterator(pipe), 8) for pipe in pipes]
        assert same_batches(*batches)
    # the two lists of ImageFolder's extensions, one in each file so that either reads alone
    assert pipelines.IMG_EXTENSIONS == data_sources.IMG_EXTENSIONS


def test_val_class_unknown_to_train_is_an_error(split_root):
    (split_root / "val" / "okapi").mkdir()
    Image.new("RGB", (8, 8)).save(split_root / "val" / "okapi" / "a.png")
    with pytest.raises(
        DataError,
        match=f"^{split_root / 'val' / 'okapi'}: class 'okapi' is not one of the 3 "
        f"training classes$",
    ):
        ClassifyValPipeline(
            4, 1, None, str(split_root / "val"), classes=sorted(CLASSES), reader=ClassifyReader
        )


def test_shard_classes_txt_must_match_the_training_classes(split_root):
    dst = to_shards(split_root, "tfrecord")
    assert ClassifyValPipeline(
        4, 1, None, str(dst / "val"), classes=sorted(CLASSES)
    ).classes == sorted(CLASSES)
    with pytest.raises(
        DataError, match=f"^{dst / 'val' / 'classes.txt'}: its 3 classes differ from the 3 training"
    ):
        ClassifyValPipeline(4, 1, None, str(dst / "val"), classes=["Apple", "b c", "zebras"])


def test_class_names_with_spaces_round_trip_through_classes_txt(tmp_path):
    names = [" ", "  two", "a  b", "lead", "trail ", "\tTab"]
    for split in ("train", "val"):
        for c, name in enumerate(names):
            (tmp_path / "root" / split / name).mkdir(parents=True)
            Image.new("RGB", (8, 8), (40 * c, 0, 0)).save(
                tmp_path / "root" / split / name / "0.png"
            )
    dst = to_shards(tmp_path / "root", "wds")
    assert data_sources.read_classes_txt(str(dst / "train")) == sorted(names)
    assert ClassifyValPipeline(4, 1, None, str(dst / "val")).classes == sorted(names)


def test_a_classes_txt_shorter_than_the_stored_labels_is_refused(split_root):
    dst = to_shards(split_root, "tfrecord")
    (dst / "train" / "classes.txt").write_text("Apple\nb c\n")
    with pytest.raises(
        DataError, match=r": stored label 2 minus label_offset 0 is outside \[0, 2\)$"
    ):
        ClassifyTrainPipeline(4, 1, None, str(dst / "train"))


@pytest.mark.parametrize(
    "content,why",
    [
        (b"\xff\xfe\x00\x81junk", "not UTF-8 text"),
        (b"", "no class names in it"),
        (b"\n\n", "no class names in it"),
    ],
)
def test_a_classes_txt_that_is_not_a_list_of_names_is_refused(split_root, content, why):
    dst = to_shards(split_root, "tfrecord")
    path = dst / "train" / "classes.txt"
    path.write_bytes(content)
    with pytest.raises(
        DataError,
        match=f"^{re.escape(str(path))}: {why}.*; expected UTF-8 text, one class name a line",
    ):
        ClassifyTrainPipeline(4, 1, None, str(dst / "train"))


def test_find_layout(split_root, tmp_path):
    assert find_layout(str(split_root / "train")) == "folder"
    for name, layout in (
        ("train-00000-of-00002", "tfrecord"),
        ("x.tfrecord", "tfrecord"),
        ("a.tar", "wds"),
    ):
        (tmp_path / name / "split").mkdir(parents=True)
        (tmp_path / name / "split" / name).write_bytes(b"")
        assert find_layout(str(tmp_path / name / "split")) == layout
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "train-00000-of-00002.idx").write_bytes(b"")
    with pytest.raises(
        DataError, match=f"^{tmp_path / 'empty'}: no class folders, TFRecord files or .tar shards"
    ):
        find_layout(str(tmp_path / "empty"))
    (tmp_path / "a.tar" / "split" / "train-00000-of-00002").write_bytes(b"")
    with pytest.raises(
        DataError, match=f"^{tmp_path / 'a.tar' / 'split'}: holds tfrecord and wds data"
    ):
        find_layout(str(tmp_path / "a.tar" / "split"))


def gif_bytes():
    out = io.BytesIO()
    Image.new("RGB", (40, 40), (1, 2, 3)).save(out, format="GIF")
    return out.getvalue()


NOT_IMAGES = {
    "text": b"just some notes, 200 bytes of them\n" * 6,
    "gif": gif_bytes(),
    "pdf": b"%PDF-1.4\n1 0 obj << /Type /Catalog >> endobj\n" * 4,
    "random": bytes(np.random.default_rng(0).integers(0, 256, 200, dtype=np.uint8)),
    "empty": b"",
}


def not_an_image(path, content):
    first = f"its first bytes are {content[:8]!r}" if content else "it is empty"
    return (
        f"{path}: cannot decode this image: not an image file ({first}, not those of a JPEG, PNG, "
        "BMP, PPM/PGM, TIFF, WebP or JPEG 2000 file); remove or replace it"
    )


@pytest.mark.parametrize("kind", NOT_IMAGES)
def test_a_file_that_is_not_an_image_is_named_before_dali_decodes_it(texture_folder, kind):
    """DALI 2.4 could kill the process (SIGSEGV) when such a file failed to decode in the first
    batch of 32 or more, before the file could be named: data_sources' reader (the trainers')
    refuses it when it lists the files, whatever the batch, and so do file lists and --predict."""
    bad = texture_folder / "b c" / "bad.jpg"
    bad.write_bytes(NOT_IMAGES[kind])
    expected = f"^{re.escape(not_an_image(bad, NOT_IMAGES[kind]))}$"
    with pytest.raises(DataError, match=expected):
        ClassifyTrainPipeline(32, 1, None, str(texture_folder), crop_size=32, reader=ClassifyReader)
    with pytest.raises(DataError, match=expected):
        ClassifyValPipeline(32, 1, None, str(texture_folder), reader=ClassifyReader)
    listed = texture_folder.parent / "list.txt"  # a DALI file list
    listed.write_text("zebra/t0.jpg 0\nb c/bad.jpg 2\n")
    with pytest.raises(DataError, match=expected):
        ClassifyValPipeline(32, 1, None, str(texture_folder), file_list=str(listed))
    with pytest.raises(DataError, match=expected):  # --predict's pipelines, which take a list
        SegmentPredictPipeline(32, 1, None, str(texture_folder), [str(bad)])


def test_a_long_header_check_says_so_in_one_line_first(solid_folder, monkeypatch, capsys):
    files = sorted(str(f) for f in solid_folder.rglob("*.png"))  # 21 images
    data_sources.check_image_heads(files, str(solid_folder))
    assert capsys.readouterr() == ("", "")  # a check of fewer than LONG_CHECK images: no line
    monkeypatch.setattr(data_sources, "LONG_CHECK", len(files))
    data_sources.check_image_heads(files, str(solid_folder))
    assert capsys.readouterr() == ("", f"{solid_folder}: checking 21 images' first bytes\n")


@pytest.mark.parametrize("slow", ["never", "always", "one pause"])
def test_the_check_reads_in_threads_only_where_reads_are_slow(tmp_path, monkeypatch, slow):
    """Files read faster than SLOW_HEAD each are read by the calling thread alone (threads would
    only wait for the GIL); after two chunks in a row read slower, the rest are read in threads,
    not after one pause alone. The verdicts are the same: the first bad file, in order, named."""
    monkeypatch.setattr(data_sources, "HEAD_CACHE", str(tmp_path / "cache"))
    # a chunk of 1,024 files is slow past 1 s (one pause), at once (always) or never
    monkeypatch.setattr(data_sources, "SLOW_HEAD", dict(never=10.0, always=0.0).get(slow, 1e-3))
    buf = io.BytesIO()
    Image.new("RGB", (8, 8), (200, 10, 10)).save(buf, format="JPEG")
    (tmp_path / "c").mkdir()
    files = [str(tmp_path / "c" / f"{k:04d}.jpg") for k in range(2500)]
    for f in files:
        with open(f, "wb") as out:
            out.write(buf.getvalue())
    for k in (2100, 2300):
        with open(files[k], "wb") as out:
            out.write(b"not an image")
    threads, head = [], data_sources._head

    def spied(path):
        if slow == "one pause" and path == files[0]:
            time.sleep(1.5)
        threads.append(threading.get_ident())
        return head(path)

    monkeypatch.setattr(data_sources, "_head", spied)
    with pytest.raises(DataError, match=f"^{re.escape(files[2100])}: cannot decode this image"):
        data_sources.check_image_heads(files, str(tmp_path))
    main = threading.get_ident()
    assert threads[:2048] == [main] * 2048  # the first two chunks, always here
    assert (main not in threads[2048:]) if slow == "always" else set(threads) == {main}


def killed(*args):
    os._exit(9)


def test_many_files_are_stamped_by_several_processes_in_order(tmp_path, monkeypatch):
    """A start's stat of many files (file_stamps, which tells a file changed since its check) is
    shared among forked processes, a core each: every file's row where it was, a file gone (-1,
    -1); fewer than STAT_SHARE files a process are stamped here alone."""
    files = []
    for k in range(9):
        files.append(str(tmp_path / f"{k}.jpg"))
        (tmp_path / f"{k}.jpg").write_bytes(b"x" * k)
    files.insert(5, str(tmp_path / "gone.jpg"))
    rows = [(k, os.stat(files[k + (k >= 5)]).st_mtime_ns) for k in range(9)]
    expected = np.array(rows[:5] + [(-1, -1)] + rows[5:], np.int64)
    assert data_sources.file_stamps(files).tolist() == expected.tolist()  # 10 files: here alone
    monkeypatch.setattr(data_sources, "STAT_SHARE", 3)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})  # any machine: 3 parts
    assert data_sources.file_stamps(files).tolist() == expected.tolist()
    with monkeypatch.context() as m:  # a process killed (out of memory): stamped here instead
        m.setattr(data_sources, "_stamps_between", killed)
        assert data_sources.file_stamps(files).tolist() == expected.tolist()
    # which process stamped each file: not this one; each third of the list, one process
    stat = data_sources._stat
    monkeypatch.setattr(data_sources, "_stat", lambda path: (stat(path)[0], os.getpid()))
    pids = data_sources.file_stamps(files)[:, 1].tolist()
    assert os.getpid() not in pids
    assert [len(set(pids[a:b])) for a, b in [(0, 3), (3, 6), (6, 10)]] == [1, 1, 1]


def noise_jpeg(path, **save):
    pixels = np.random.default_rng(2).integers(0, 256, (64, 64, 3), np.uint8)
    Image.fromarray(pixels).save(path, quality=95, **save)
    return path.read_bytes()


def segment_before_scan(data, text, marker=b"\xfe"):
    """``data``, a JPEG, with a segment (a comment, or an APP1 as EXIF's, whose header PIL
    judges) holding ``text`` just before its scan."""
    at = data.index(b"\xff\xda")
    return data[:at] + b"\xff" + marker + struct.pack(">H", len(text) + 2) + text + data[at:]


JPEG_ENDS = {  # name: (the file's bytes from a whole JPEG's, whether it is cut short)
    "whole": (lambda d: d, False),
    "cut to a third": (lambda d: d[: len(d) // 3], True),
    "cut before its end marker": (lambda d: d[:-2], True),
    "a trailer after its end": (lambda d: d + bytes(range(256)) * 400, False),
    "zeros after its end": (lambda d: d + bytes(100), False),
}
# an end marker before the scan (a thumbnail's, in a segment) is not the image's end
for _marker, _where in ((b"\xfe", "a comment"), (b"\xe1", "an APP1")):
    _with = functools.partial(segment_before_scan, text=b"\xff\xd8 thumb \xff\xd9", marker=_marker)
    JPEG_ENDS[f"a thumbnail's end marker in {_where}, the image cut"] = (
        lambda d, w=_with: w(d)[: d.index(b"\xff\xda") + 40],
        True,
    )
    JPEG_ENDS[f"a thumbnail's end marker in {_where}, the image whole"] = (_with, False)


@pytest.mark.parametrize("progressive", [False, True])
@pytest.mark.parametrize("case", JPEG_ENDS)
def test_a_jpeg_cut_short_is_named_and_a_whole_one_passes(tmp_path, monkeypatch, case, progressive):
    """A JPEG whose bytes stop before its end marker (a copy or download stopped): PIL's header
    parse passes it and nvJPEG and DALI's CPU decoder decode it without a word, the rest grey; the
    check names it. Bytes after the end marker (a camera's trailer) are no fault."""
    monkeypatch.setattr(data_sources, "HEAD_CACHE", str(tmp_path / "cache"))
    edit, cut = JPEG_ENDS[case]
    (tmp_path / "c").mkdir()
    path = tmp_path / "c" / "photo.jpg"
    path.write_bytes(edit(noise_jpeg(path, progressive=progressive)))
    with Image.open(path) as image:
        assert image.size == (64, 64)  # PIL opens every one of them
    if cut:
        with pytest.raises(
            DataError,
            match=f"^{re.escape(str(path))}: cannot decode this image: its bytes stop before the "
            "JPEG's end \\(cut short;",
        ):
            data_sources.check_image_heads([str(path)], str(tmp_path))
    else:
        found = data_sources.check_image_heads([str(path)], str(tmp_path))
        assert found.tolist() == [[path.stat().st_size, path.stat().st_mtime_ns]]


def test_every_image_type_that_dali_decodes_passes_the_check(tmp_path):
    root = tmp_path / "kinds"
    rng = np.random.default_rng(0)
    formats = {"jpg": "JPEG", "png": "PNG", "bmp": "BMP", "ppm": "PPM", "tif": "TIFF"}
    formats.update({"webp": "WEBP", "pgm": "PPM"})  # PIL writes PGM with its PPM writer
    for k, (ext, fmt) in enumerate(formats.items()):
        (root / f"c{k}").mkdir(parents=True)
        pixels = rng.integers(0, 256, (24, 32, 3), dtype=np.uint8)
        image = Image.fromarray(pixels[..., 0] if ext == "pgm" else pixels)
        image.save(root / f"c{k}" / f"0.{ext}", format=fmt)
    pipe = ClassifyValPipeline(len(formats), 1, None, str(root), crop_size=16, resize_size=16)
    _, labels = one_epoch(pipe)  # DALI decodes every one of them
    assert sorted(labels) == list(range(len(formats)))


@pytest.fixture
def heads_read(texture_folder, tmp_path, monkeypatch):
    """The header check's cache in tmp_path, texture_folder's images last changed an hour ago (a
    file changed within RACY_SECONDS is checked again), and the files each check reads, counted."""
    monkeypatch.setattr(data_sources, "HEAD_CACHE", str(tmp_path / "cache"))
    for image in texture_folder.rglob("*.jpg"):
        os.utime(image, (time.time() - 3600,) * 2)
    read, head = [], data_sources._head
    monkeypatch.setattr(data_sources, "_head", lambda path: read.append(path) or head(path))
    return read


def build_val(folder):
    """The trainers' validation pipeline (their reader checks the tree), as a start builds it."""
    return ClassifyValPipeline(
        2, 1, None, str(folder), crop_size=16, resize_size=16, reader=ClassifyReader
    )


@pytest.mark.parametrize("edit", ["cut short", "text", "same size", "touched", "gone"])
def test_a_local_image_changed_under_the_run_is_named(texture_folder, heads_read, edit):
    """What the trainers look for at each epoch's end: a file whose size or modification time is
    not the one its check found (DALI would read the new bytes without a word, or die on them)."""
    pipe = build_val(texture_folder)
    watched = [data_sources.watch(str(texture_folder), pipe.files, pipe.read.stamps)]
    assert pipe.read.stamps.shape == (12, 2) and pipe.read.sizes == pipe.read.stamps[:, 0].tolist()
    data_sources.check_unchanged(watched)  # nothing changed: no error
    bad = texture_folder / "zebra" / "t2.jpg"
    data = bad.read_bytes()
    if edit == "gone":
        bad.unlink()
    elif edit == "touched":
        os.utime(bad)
    else:
        bad.write_bytes(
            {"cut short": data[:100], "text": b"notes " * 100, "same size": data[::-1]}[edit]
        )
    assert str(bad) in pipe.files
    with pytest.raises(
        DataError,
        match=f"^{re.escape(str(bad))}: changed or gone since this run listed it \\(another size "
        "or modification time\\); the data must stay as listed for the whole run$",
    ):
        data_sources.check_unchanged(watched)


def test_a_second_start_over_unchanged_images_reads_none_of_them(texture_folder, heads_read):
    """The check read every image's first bytes at every start (a resume of an ImageNet run
    waited as long as its first start): what it found is kept with each file's size and time."""
    pipe = build_val(texture_folder)
    assert sorted(heads_read) == sorted(pipe.files) and len(pipe.files) == 12
    heads_read.clear()
    again = build_val(texture_folder)  # another process, as a resume: the cache on disk
    assert heads_read == [] and again.files == pipe.files
    assert again.read.sizes == [os.path.getsize(f) for f in pipe.files]
    assert data_sources.data_digest(str(texture_folder), pipe.files, again.read.sizes) == (
        data_sources.data_digest(str(texture_folder), pipe.files)
    )


@pytest.mark.parametrize("edit", ["other bytes", "same size"])
def test_an_image_changed_since_the_last_start_is_checked_again(texture_folder, heads_read, edit):
    build_val(texture_folder)
    bad = texture_folder / "b c" / "t2.jpg"
    size = bad.stat().st_size
    text = b"notes " * size if edit == "other bytes" else b"n" * size  # a text file named .jpg
    bad.write_bytes(text[:size] if edit == "same size" else text)
    added = texture_folder / "zebra" / "new.jpg"
    shutil.copy(texture_folder / "zebra" / "t0.jpg", added)
    (texture_folder / "zebra" / "t1.jpg").unlink()
    heads_read.clear()
    with pytest.raises(DataError, match=f"^{re.escape(str(bad))}: cannot decode this image: not"):
        build_val(texture_folder)
    assert sorted(heads_read) == sorted([str(bad), str(added)])


@pytest.mark.parametrize("damage", ["flipped byte", "cut short", "empty", "not a zip"])
def test_a_damaged_cache_is_ignored_and_every_image_checked_again(
    texture_folder, heads_read, tmp_path, damage
):
    build_val(texture_folder)
    (cache,) = (tmp_path / "cache").iterdir()
    data = cache.read_bytes()
    data = {
        "flipped byte": data[: len(data) // 2] + bytes([data[len(data) // 2] ^ 1]),
        "cut short": data[: len(data) // 2],
        "empty": b"",
        "not a zip": b"PK" + b"x" * 100,
    }[damage] + (data[len(data) // 2 + 1 :] if damage == "flipped byte" else b"")
    cache.write_bytes(data)
    heads_read.clear()
    build_val(texture_folder)
    assert len(heads_read) == 12
    heads_read.clear()
    build_val(texture_folder)  # written again, whole
    assert heads_read == []


def test_the_cache_is_written_whole_or_not_at_all(
    texture_folder, heads_read, tmp_path, monkeypatch
):
    """A writer killed halfway leaves the cache as it was, and no half file behind any name."""
    build_val(texture_folder)
    (cache,) = (tmp_path / "cache").iterdir()
    before = cache.read_bytes()
    os.utime(texture_folder / "zebra" / "t0.jpg", (time.time() - 7200,) * 2)  # to check again

    def killed(f, **arrays):
        f.write(b"PK\x03\x04 half a zip")
        raise KeyboardInterrupt

    monkeypatch.setattr(data_sources.np, "savez", killed)
    with pytest.raises(KeyboardInterrupt):
        build_val(texture_folder)
    assert os.listdir(tmp_path / "cache") == [cache.name] and cache.read_bytes() == before


def test_a_cache_that_cannot_be_written_is_one_line_and_the_check_passes(
    texture_folder, heads_read, tmp_path, monkeypatch, capsys
):
    (tmp_path / "file").write_text("")
    monkeypatch.setattr(data_sources, "HEAD_CACHE", str(tmp_path / "file" / "cache"))
    assert len(build_val(texture_folder).files) == 12
    (line,) = capsys.readouterr().err.splitlines()
    assert re.fullmatch(
        rf"{tmp_path / 'file' / 'cache'}/v2-[0-9a-f]{{32}}\.npz: not written \(Not a directory\); "
        "the next start checks again",
        line,
    )


def test_images_changed_just_before_their_check_are_checked_again(texture_folder, heads_read):
    """A file system's clock ticks coarsely: a file rewritten within the tick of its check would
    keep its time, so one changed within RACY_SECONDS before its check is not kept."""
    for image in texture_folder.rglob("*.jpg"):
        os.utime(image)  # changed now
    build_val(texture_folder)
    heads_read.clear()
    build_val(texture_folder)
    assert len(heads_read) == 12


def jpeg_variants():
    pixels = np.random.default_rng(0).integers(0, 256, (40, 56, 3), np.uint8)
    exif = Image.Exif()
    exif[0x0110] = "camera"
    found = []
    for mode, options in [
        ("RGB", {}),
        ("RGB", {"progressive": True, "optimize": True}),
        ("L", {"comment": b"hello", "dpi": (300, 300)}),
        ("CMYK", {}),
        ("RGB", {"exif": exif.tobytes(), "icc_profile": b"x" * 300}),
    ]:
        out = io.BytesIO()
        Image.fromarray(pixels).convert(mode).save(out, format="JPEG", **options)
        found.append(out.getvalue())
    return found


def test_a_jpeg_header_judged_whole_without_pil_is_one_pil_opens():
    """plain_jpeg_header spares PIL's parser for most JPEGs: it must never pass a header that PIL
    (broken_header) refuses. Every cut and thousands of changed bytes of several kinds of JPEG."""
    rng = np.random.default_rng(1)
    judged = 0
    for jpeg in jpeg_variants():
        cases = [jpeg[:cut] for cut in range(0, 700, 3)]
        for _ in range(600):
            data = bytearray(jpeg)
            data[rng.integers(2, 600)] = rng.integers(0, 256)
            cases.append(bytes(data))
        for data in cases:
            if data_sources.plain_jpeg_header(data[: data_sources.HEAD_BYTES]):
                judged += 1
                assert data_sources.broken_header(io.BytesIO(data)) is None, data[:64]
    assert judged > 2000  # most changed bytes lie in the pixels' tables, which PIL reads whole


def test_decoder_cache_plan_names_a_file_pil_cannot_read(solid_folder):
    pipe = ClassifyValPipeline(2, 1, None, str(solid_folder))
    bad = solid_folder / "b c" / "img3.png"
    bad.write_bytes(b"\x89PNG\r\n\x1a\n broken")  # a PNG's signature, then nothing of one
    with pytest.raises(
        DataError,
        match=f"^{re.escape(str(bad))}: cannot decode this image \\(PIL does not know it as an "
        "image\\); remove or replace it$",
    ):
        data_sources.decoded_size(pipe)


def test_find_undecodable_names_a_zero_byte_file(solid_folder):
    assert find_undecodable(pipe := ClassifyValPipeline(2, 1, None, str(solid_folder))) is None
    # emptied after the pipeline listed it: the listing itself refuses a file that is no image
    (solid_folder / "b c" / "img3.png").write_bytes(b"")
    found = find_undecodable(pipe)
    assert found == str(solid_folder / "b c" / "img3.png")


@pytest.mark.parametrize("fmt", FORMATS)
def test_find_undecodable_names_the_sample_in_a_shard(split_root, fmt, monkeypatch):
    dst = to_shards(split_root, fmt)
    assert find_undecodable(ClassifyValPipeline(2, 1, None, str(dst / "train"))) is None
    (split_root / "train" / "b c" / "img4.png").write_bytes(b"not a png")
    # shards written by another tool, which let a file that is no image in (make_shards.py doesn't)
    monkeypatch.setattr(sys.modules["make_shards"], "check_image_heads", lambda *_: None)
    monkeypatch.setattr(data_sources, "check_sample", lambda *_: None)  # and no index's scan
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
    # written after the pipeline listed it: the listing itself refuses a file that is no image
    pipe = ClassifyValPipeline(2, 1, None, str(solid_folder))
    Image.new("RGB", (40, 40), (1, 2, 3)).save(bad, format="GIF")
    with Image.open(bad) as image:
        image.load()  # PIL reads it
    assert find_undecodable(pipe) == str(bad)
    with pytest.raises(DataError, match=f"^{re.escape(str(bad))}: cannot decode this image"):
        with data_sources.decode_errors_named(pipe):
            for _ in classify_iterator(pipe):
                pass


# ------------------------------------------------------------------------------------------
# progress lines and the decoder cache plan
# ------------------------------------------------------------------------------------------


def test_progress_prints_count_rate_and_eta_only_for_long_jobs(monkeypatch):
    """A job done within the first interval prints nothing; a longer one prints one line per interval with its
    count of the total, rate and ETA, and a last line with its total time."""
    clock = iter(
        range(0, 1000, 2)
    )  # every reading of the clock is 2 s after the last: an item takes 2 s
    monkeypatch.setattr(outputs.time, "perf_counter", lambda: next(clock))
    out = io.StringIO()
    assert list(outputs.progress(range(7), 7, "indexing shards", every=5, out=out)) == list(
        range(7)
    )
    assert out.getvalue().splitlines() == [
        "indexing shards: 3/7 (43 %), 0.5/s, eta 8 s",
        "indexing shards: 6/7 (86 %), 0.5/s, eta 2 s",
        "indexing shards: 7 done in 16 s",
    ]
    quiet = io.StringIO()
    assert (
        list(outputs.progress(range(2), 2, "quick", every=5, out=quiet)) == [0, 1]
        and quiet.getvalue() == ""
    )


def test_cpu_pipelines_ignore_the_decoder_cache(texture_folder):
    plain, told = (
        first_batches(
            classify_iterator(
                ClassifyTrainPipeline(
                    2, 2, None, str(texture_folder), crop_size=24, seed=3, **kwargs
                )
            ),
            8,
        )
        for kwargs in ({}, {"decoder_cache": 64})
    )
    assert same_batches(plain, told)
    # however much GPU memory is said to be free (the trainer passes torch.cuda.mem_get_info's);
    # asked for, it says so in one line, auto says nothing
    on_cpu = [ClassifyValPipeline(2, 1, None, str(texture_folder))]
    assert data_sources.plan_decoder_cache("on", on_cpu, 80 * 1024) == (
        None,
        "decoder cache off (on): DALI runs on the CPU, and its cache holds only what its GPU "
        "decoder decodes",
    )
    assert data_sources.plan_decoder_cache("auto", on_cpu, 80 * 1024) == (None, None)


def test_the_decoder_cache_plan_holds_what_fits(texture_folder):
    val = ClassifyValPipeline(2, 1, None, str(texture_folder))
    # the plan of a pipeline on a GPU: what it reads is the same
    on_gpu = SimpleNamespace(**{k: getattr(val, k) for k in ("read", "files", "layout")})
    on_gpu.device_id, on_gpu.num_samples, on_gpu.num_shards = 0, val.num_samples, 1
    on_gpu.decoder_device = "mixed"
    need = 1.1 * data_sources.decoded_size(val)
    whole = math.ceil(need)
    plan = functools.partial(data_sources.plan_decoder_cache, pipes=[on_gpu])
    gb = f"{need / 1024:.1f} GB decoded, and {4 * need / 1024:.1f} GB of GPU memory are free"
    assert plan("auto", free_mb=4 * need) == (
        whole,
        f"decoder cache on (auto): this process's images take about {gb}",
    )
    assert plan("on", free_mb=4 * need) == (
        whole,
        f"decoder cache on (on): this process's images take about {gb}",
    )
    # auto: off when they do not fit in half the free memory; on: whatever is free
    assert plan("auto", free_mb=2 * need)[0] is None and plan("on", free_mb=1)[0] == whole
    assert plan("off", free_mb=4 * need) == (None, None)
    # a size: the images that fit, and no more than all of them
    half, line = plan(need / 2, free_mb=4 * need)
    assert half == math.ceil(need / 2) and line.startswith(
        f"decoder cache on, about 50% ({need / 2})"
    )
    assert plan(10**6, free_mb=1)[0] == whole


def test_the_decoder_cache_is_off_with_the_cpu_decoder(texture_folder):
    # set up for device 0, not built: no GPU needed
    pipe = ClassifyTrainPipeline(2, 1, 0, str(texture_folder), decoder="cpu")
    why = "not with --decoder cpu: DALI caches what its GPU decoder decodes"
    assert data_sources.plan_decoder_cache("auto", [pipe], 80 * 1024) == (
        None,
        f"decoder cache off (auto): {why}",
    )
    with pytest.raises(DataError, match=re.escape(f"--decoder-cache on: {why}; pass auto or off")):
        data_sources.plan_decoder_cache("on", [pipe], 80 * 1024)


# ------------------------------------------------------------------------------------------
# bad input
# ------------------------------------------------------------------------------------------


def test_missing_data_dir(tmp_path):
    with pytest.raises(DataError, match=str(tmp_path / "nope")):
        ClassifyTrainPipeline(2, 1, None, str(tmp_path / "nope"))


@pytest.mark.parametrize("scheme", ["gs", "http", "https", "file"])
def test_urls_other_than_s3_are_refused_as_such(scheme):
    url = f"{scheme}://bkt/set"
    why = f"{scheme}:// URLs are not read; expected a local path or an s3:// URL$"
    with pytest.raises(DataError, match=f"^{url}/train: {why}"):
        ClassifyTrainPipeline(2, 1, None, f"{url}/train")
    with pytest.raises(DataError, match=f"^{url}/csv_file/valid.csv: {why}"):
        data_sources.read_split(url, "valid")


def test_no_class_folders(tmp_path):
    (tmp_path / "flat").mkdir()
    Image.new("RGB", (8, 8)).save(tmp_path / "flat" / "a.png")
    with pytest.raises(DataError, match=f"{tmp_path / 'flat'}: no class folders"):
        ClassifyValPipeline(2, 1, None, str(tmp_path / "flat"))


def test_class_folder_without_images(tmp_path, solid_folder):
    (solid_folder / "empty").mkdir()
    (solid_folder / "empty" / "notes.txt").write_text("not an image")
    with pytest.raises(DataError, match=f"{solid_folder / 'empty'}: no images"):
        ClassifyTrainPipeline(2, 1, None, str(solid_folder), reader=ClassifyReader)


def test_symlinked_folders_are_followed_and_a_symlink_loop_is_refused(tmp_path, solid_folder):
    (tmp_path / "extra").mkdir()
    for i in range(2):
        Image.new("RGB", (8, 8)).save(tmp_path / "extra" / f"x{i}.png")
    (solid_folder / "Apple" / "more").symlink_to(tmp_path / "extra")
    (solid_folder / "zebra" / "same").symlink_to(tmp_path / "extra")  # a folder linked twice
    _, labels, _ = list_image_folder(str(solid_folder))
    assert Counter(labels) == {0: PER_CLASS + 2, 1: PER_CLASS, 2: PER_CLASS + 2}
    (solid_folder / "b c" / "loop").symlink_to("..")
    with pytest.raises(
        DataError,
        match=f"^{re.escape(str(solid_folder / 'b c' / 'loop'))}: a symlink loop \\(it leads back "
        f"to {re.escape(str(solid_folder / 'b c'))}, whose images would count again and again\\); "
        "remove the link$",
    ):
        ClassifyTrainPipeline(2, 1, None, str(solid_folder), reader=ClassifyReader)


def test_a_class_folder_that_cannot_be_listed_is_named(solid_folder, monkeypatch):
    """Not taken as a class without images: os.walk leaves out what it cannot list. (Root reads any
    folder, so the permission error is os.scandir's, made to fail here.)"""
    scandir, denied = os.scandir, str(solid_folder / "zebra")

    def scandir_but(path="."):
        if str(path) == denied:
            raise PermissionError(13, "Permission denied", str(path))
        return scandir(path)

    monkeypatch.setattr(os, "scandir", scandir_but)
    with pytest.raises(
        DataError, match=f"^{re.escape(denied)}: cannot be listed \\(Permission denied\\); fix its "
    ):
        list_image_folder(str(solid_folder))


def test_missing_file_list(tmp_path, solid_folder):
    with pytest.raises(DataError, match=str(tmp_path / "list.txt")):
        ClassifyTrainPipeline(2, 1, None, str(solid_folder), file_list=str(tmp_path / "list.txt"))


def test_image_and_mask_lists_of_different_length(seg_files):
    imgs, lbls = seg_files
    with pytest.raises(DataError, match=f"got {SEG_N} images but {SEG_N - 1} masks.*{imgs[0]}"):
        check_segmentation_files(imgs, lbls[:-1])


def test_empty_image_list():
    with pytest.raises(DataError, match="empty list of images"):
        check_segmentation_files([], [])


def test_no_masks(seg_files):
    with pytest.raises(DataError, match=f"got {SEG_N} images but 0 masks"):
        check_segmentation_files(seg_files[0], None)


def test_mask_size_differs_from_image(seg_files):
    imgs, lbls = seg_files
    np.save(lbls[4], np.zeros((SEG_H, SEG_W - 1, 1), np.uint8))
    with pytest.raises(
        DataError,
        match=f"{lbls[4]}: mask is {SEG_H}x{SEG_W - 1} but its image {imgs[4]} is {SEG_H}x{SEG_W}",
    ):
        check_segmentation_files(imgs, lbls)


def test_missing_mask_file(seg_files):
    imgs, lbls = seg_files
    lbls[2] = lbls[2].replace("s2", "gone/s2")
    with pytest.raises(DataError, match=f"{lbls[2]}: no such file"):
        check_segmentation_files(imgs, lbls)


def test_truncated_npy(seg_files):
    imgs, lbls = seg_files
    with open(lbls[3], "r+b") as f:
        f.truncate(os.path.getsize(lbls[3]) - 1)
    with pytest.raises(
        DataError,
        match=rf"{lbls[3]}: truncated: 1087 bytes, but its header "
        rf"\(\({SEG_H}, {SEG_W}, 1\) uint8\) needs 1088",
    ):
        check_segmentation_files(imgs, lbls)


def test_float_images_with_nan_or_inf_are_refused(tmp_path):
    images = [np.full((SEG_H, SEG_W), 0.5, np.float32) for _ in range(4)]
    images[2][3, 4] = np.nan
    imgs, _ = save_pairs(tmp_path, images, [seg_mask(k) for k in range(4)])
    with pytest.raises(DataError, match=f"^{re.escape(imgs[2])}: holds NaN or infinite pixels"):
        check_finite_pixels(imgs)
    images[2][3, 4] = np.inf
    np.save(imgs[2], images[2])
    with pytest.raises(DataError, match=f"^{re.escape(imgs[2])}: holds NaN or infinite pixels"):
        check_finite_pixels(imgs, threads=2)
    images[2][3, 4] = 0.5
    np.save(imgs[2], images[2])
    check_finite_pixels(imgs)


def test_npy_headers_are_parsed_one_thread_at_a_time(tmp_path, monkeypatch):
    # Python 3.11's parser fails now and then when two threads parse at once; the checks read the
    # float images on 8 threads
    import ast

    parse, inside, most, calls = ast.literal_eval, [0], [0], [0]

    def slow_parse(text):
        calls[0] += 1
        inside[0] += 1
        most[0] = max(most[0], inside[0])
        time.sleep(0.01)
        inside[0] -= 1
        return parse(text)

    monkeypatch.setattr(ast, "literal_eval", slow_parse)
    images = [np.full((SEG_H, SEG_W), k / 8, np.float32) for k in range(8)]
    imgs, lbls = save_pairs(tmp_path, images, [seg_mask(k) for k in range(8)])
    check_segmentation_files(imgs, lbls)  # every header
    check_finite_pixels(imgs)  # reads every image
    assert calls[0] >= 8 and most == [1]


def test_not_an_npy_file(seg_files):
    # from its header, before DALI reads it: no batch of DALI's holds it (see IMAGE_MAGIC)
    imgs, lbls = seg_files
    with open(imgs[5], "w") as f:
        f.write("P6 40 24 255\n")
    with pytest.raises(DataError, match=f"{imgs[5]}: not a .npy array"):
        check_segmentation_files(imgs, lbls)


def test_a_pickled_npy_is_refused_as_such(seg_files):
    imgs, lbls = seg_files
    np.save(lbls[5], np.full((SEG_H, SEG_W), None, object), allow_pickle=True)
    with pytest.raises(
        DataError,
        match=f"^{re.escape(lbls[5])}: holds pickled Python objects \\(dtype object\\); "
        "expected a plain numeric array$",
    ):
        check_segmentation_files(imgs, lbls)


@pytest.mark.parametrize(
    "what,array,found",
    [
        ("image", np.zeros((SEG_H, SEG_W, 4), np.uint8), rf"\({SEG_H}, {SEG_W}, 4\) uint8"),
        ("image", np.zeros((SEG_H, SEG_W, 3), np.float64), rf"\({SEG_H}, {SEG_W}, 3\) float64"),
        ("image", np.zeros((SEG_H, SEG_W, 3), ">u2"), rf"\({SEG_H}, {SEG_W}, 3\) >u2"),
        ("image", np.zeros((1, SEG_H, SEG_W, 3), np.uint8), rf"\(1, {SEG_H}, {SEG_W}, 3\) uint8"),
        ("mask", np.zeros((SEG_H, SEG_W, 2), np.uint8), rf"\({SEG_H}, {SEG_W}, 2\) uint8"),
        ("mask", np.zeros((SEG_H, SEG_W), np.float32), rf"\({SEG_H}, {SEG_W}\) float32"),
    ],
)
def test_wrong_shape_or_dtype_names_the_file(seg_files, what, array, found):
    imgs, lbls = seg_files
    path = (imgs if what == "image" else lbls)[6]
    np.save(path, array)
    expected = (
        "an image of shape (H, W), (H, W, 1) or (H, W, 3) of uint8, uint16, float32"
        if what == "image"
        else "a mask of shape (H, W) or (H, W, 1) of integer class indices"
    )
    with pytest.raises(DataError, match=f"{path}: expected {re.escape(expected)}, got {found}$"):
        check_segmentation_files(imgs, lbls)


@pytest.mark.parametrize(
    "what,array",
    [
        ("image", np.zeros((SEG_H, SEG_W, 3), np.uint16)),
        ("image", np.zeros((SEG_H, SEG_W), np.uint8)),
        ("mask", np.zeros((SEG_H, SEG_W), np.uint8)),
        ("mask", np.zeros((SEG_H, SEG_W, 1), np.int64)),
    ],
)
def test_a_set_shares_one_kind_of_image_and_of_mask(seg_files, what, array):
    imgs, lbls = seg_files
    paths = imgs if what == "image" else lbls
    np.save(paths[7], array)
    first = f"{SEG_H}, {SEG_W}, 3\\) uint8" if what == "image" else f"{SEG_H}, {SEG_W}, 1\\) uint8"
    with pytest.raises(
        DataError,
        match=f"{paths[7]}: {what} of shape .* but the set's first {what} {paths[0]} is \\({first}",
    ):
        check_segmentation_files(imgs, lbls)


# ------------------------------------------------------------------------------------------
# classification: --ra-sampler, torchvision's repeated augmentation
# ------------------------------------------------------------------------------------------

RA_IMAGES = 300  # over 256: RASampler keeps len // 256 * 256 samples an epoch


def ra_colour(i):
    return (i % 250, 40 + 50 * (i // 250), 9)


@pytest.fixture(scope="module")
def ra_folder(tmp_path_factory):
    """300 small solid images; image i, in class folder i // 100, is the set's i-th in ImageFolder
    order and says i in its colour."""
    root = tmp_path_factory.mktemp("ra")
    for i in range(RA_IMAGES):
        (root / f"c{i // 100}").mkdir(exist_ok=True)
        Image.new("RGB", (12, 10), ra_colour(i)).save(root / f"c{i // 100}" / f"{i:03d}.png")
    return root


def ra_ids(images):
    colours = np.rint(unnormalize(images).mean(axis=(1, 2))).astype(int)
    return [int(r + 250 * ((g - 40) // 50)) for r, g, _ in colours]


def rasampler(n, reps, rank, world, seed, epoch):
    """torchvision's references/classification/sampler.py RASampler, set_epoch(epoch), untruncated
    (its __iter__ keeps the first ``n // 256 * 256 // world``)."""
    import torch

    g = torch.Generator()
    g.manual_seed(seed + epoch)
    indices = torch.randperm(n, generator=g).tolist()
    indices = [ele for ele in indices for i in range(reps)]
    total_size = math.ceil(n * reps / world) * world
    indices += indices[: (total_size - len(indices))]
    return indices[rank:total_size:world]


def ra_loader(folder, shard_id, batch_size=48, reps=4, ra_seed=7, **kwargs):
    return classify_iterator(
        ClassifyTrainPipeline(
            batch_size,
            1,
            None,
            str(folder),
            crop_size=8,
            shard_id=shard_id,
            num_shards=2,
            seed=5 + shard_id,
            ra_reps=reps,
            ra_seed=ra_seed,
            **kwargs,
        )
    )


def ra_epochs(loaders, epochs):
    """[epoch][rank] (ids, labels) read."""
    out = []
    for _ in range(epochs):
        out.append([])
        for it in loaders:
            ids, labels = [], []
            for b in it:
                ids += ra_ids(b[0]["data"])
                labels += b[0]["label"].squeeze(-1).tolist()
            out[-1].append((ids, labels))
    return out


def test_ra_sampler_reads_torchvisions_rasampler_order_over_two_shards(ra_folder):
    loaders = [ra_loader(ra_folder, s) for s in range(2)]
    selected = RA_IMAGES // 256 * 256 // 2  # 128 a rank: 3 batches of 48, the last filled up
    assert [len(it) for it in loaders] == [3, 3]
    epochs = ra_epochs(loaders, 2)
    for epoch, ranks in enumerate(epochs):
        for rank, (ids, labels) in enumerate(ranks):
            assert len(ids) == 3 * 48 and labels == [i // 100 for i in ids]
            assert ids == rasampler(RA_IMAGES, 4, rank, 2, 7, epoch)[: 3 * 48]
        counts = Counter(ranks[0][0][:selected] + ranks[1][0][:selected])
        # 256 samples: 64 images, each 4 times across the two ranks, 2 on each
        assert len(counts) == 64 and set(counts.values()) == {4}
        assert all(Counter(ranks[r][0][:selected])[i] == 2 for i in counts for r in (0, 1))
    assert set(epochs[0][0][0]) != set(epochs[1][0][0])  # another selection and order
    again = ra_epochs([ra_loader(ra_folder, s) for s in range(2)], 2)
    assert again == epochs
    other = ra_epochs([ra_loader(ra_folder, s, ra_seed=8) for s in range(2)], 1)
    assert set(other[0][0][0]) != set(epochs[0][0][0])


def test_ra_sampler_with_three_copies_keeps_256_samples_an_epoch(ra_folder):
    """3 copies: 85 images thrice and the cut one's first copy, as RASampler truncates."""
    (ranks,) = ra_epochs([ra_loader(ra_folder, s, batch_size=32, reps=3) for s in range(2)], 1)
    assert [len(ids) for ids, _ in ranks] == [128, 128]
    assert sorted(Counter(Counter(ranks[0][0] + ranks[1][0]).values()).items()) == [(1, 1), (3, 85)]


def test_ra_sampler_resumes_mid_epoch_with_the_same_batches(ra_folder):
    def loader(**kwargs):
        return ra_loader(ra_folder, 1, random_erase=0.5, enable_checkpointing=True, **kwargs)

    it = loader()
    first_batches(it, 2)
    checkpoint = it.checkpoints()[0]
    expected = first_batches(it, 5)  # the epoch's last batch, then the next epoch's and more
    assert same_batches(expected, first_batches(loader(checkpoint=checkpoint), 5))
    assert same_batches(expected, first_batches(loader(), 7)[2:])


def test_ra_sampler_refuses_shards_and_sets_under_256(split_root, fmt="tfrecord"):
    with pytest.raises(DataError, match="--ra-sampler reads ImageFolder trees and file lists"):
        ClassifyTrainPipeline(4, 1, None, str(to_shards(split_root, fmt) / "train"), ra_reps=3)
    with pytest.raises(DataError, match="--ra-sampler: 21 training samples leave no batch"):
        ClassifyTrainPipeline(4, 1, None, str(split_root / "train"), ra_reps=3)


def test_a_byte_changed_in_a_tfrecord_and_a_shard_that_cannot_be_read_are_one_line(split_root):
    """A flipped byte in a record's image trained unnoticed: its checksum names the record now,
    as the shard is indexed again (its bytes changed). A shard that is a link to nothing was a
    traceback."""
    dst = to_shards(split_root, "tfrecord")
    shard = shard_files(str(dst / "train"), "tfrecord")[0]
    start, length = (int(v) for v in last_index_line(shard))
    with open(shard, "r+b") as f:  # a byte inside the last record's image
        f.seek(start + length // 2)
        byte = f.read(1)
        f.seek(start + length // 2)
        f.write(bytes([byte[0] ^ 0x10]))
    os.utime(shard, ns=(1, 1))  # as a copy would leave it: another time, so it is indexed again
    records = int(json.loads(open(shard + ".idx.json").read())["samples"])
    with pytest.raises(
        DataError, match=rf"^{shard}: record {records - 1} at byte {start} fails its checksum"
    ):
        ClassifyValPipeline(4, 1, None, str(dst / "train"))
    os.remove(shard)
    os.symlink(str(dst / "gone.tfrecord"), shard)
    with pytest.raises(DataError, match=rf"^{shard}: cannot be read \(No such file or directory\)"):
        ClassifyValPipeline(4, 1, None, str(dst / "train"))


def cut_jpeg(path):
    """A JPEG of noise (its scan runs to its end) cut to a third of its bytes, as a stopped copy
    leaves it: PIL opens it (the header is whole) and says "image file is truncated" on load."""
    pixels = np.random.default_rng(1).integers(0, 256, (64, 64, 3), np.uint8)
    Image.fromarray(pixels).save(path, quality=95)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 3])
    with Image.open(path) as image:
        with pytest.raises(OSError, match="image file is truncated"):
            image.load()
    return path


BAD_SAMPLES = {
    # random bytes after FF D8 FF E0: DALI 2.4's parser killed the process (SIGSEGV)
    "broken header": (
        lambda p: p.write_bytes(
            b"\xff\xd8\xff\xe0"
            + np.random.default_rng(0).integers(0, 256, 3000, np.uint8).tobytes()
        ),
        "cannot decode this image: its header is broken",
    ),
    # another tool's shards let any file in: DALI's decoder killed the process (SIGSEGV)
    "text": (
        lambda p: p.write_bytes(b"a caption, not an image\n" * 40),
        "cannot decode this image: not an image file \\(its first bytes are b'a captio'",
    ),
    # decoded without a word, the rest of the image grey, on the GPU and the CPU
    "cut short": (cut_jpeg, "cannot decode this image: its bytes stop before the JPEG's end"),
}


@pytest.mark.parametrize("bad_kind", BAD_SAMPLES)
@pytest.mark.parametrize("fmt", FORMATS)
def test_a_sample_dali_cannot_decode_whole_is_named_in_a_shard(tmp_path, fmt, bad_kind):
    """Shards written by another tool (not make_shards.py, which checks each file): the index's
    scan, before DALI reads a sample, names the shard and the sample and says what it holds."""
    good = tmp_path / "good.png"
    Image.new("RGB", (20, 20), (10, 90, 160)).save(good)
    write_bad, why = BAD_SAMPLES[bad_kind]
    bad = tmp_path / "bad.jpg"
    write_bad(bad)
    name = "train-00000-of-00001" if fmt == "tfrecord" else "train-000000.tar"
    (tmp_path / "train").mkdir()
    write_shard(tmp_path / "train" / name, fmt, [(str(good), 0), (str(bad), 1), (str(good), 0)])
    which = "record 1" if fmt == "tfrecord" else "sample s1"
    with pytest.raises(DataError, match=rf"^{tmp_path / 'train' / name}: {which}: {why}"):
        ClassifyTrainPipeline(32, 1, None, str(tmp_path / "train"), crop_size=16, num_classes=2)
