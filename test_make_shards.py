"""Tests of make_shards.py on tiny ImageFolder roots built in tmp_path. The shards are read back
here with independent readers (struct for TFRecord framing, tarfile for WebDataset); that DALI's
readers give the same (image, label) pairs is tested in test_pipelines.py."""

import errno
import fcntl
import functools
import io
import json
import os
import signal
import struct
import subprocess
import sys
import tarfile

import google_crc32c
import numpy as np
import pytest
from PIL import Image

import make_shards as make_shards_module
import outputs
from make_shards import main, make_shards

HERE = os.path.dirname(os.path.abspath(__file__))
TRAIN = {
    "Apple": 4,
    "b c": 5,
    "zebra": 3,
}  # class -> images; sorted as torchvision sorts: Apple 0, b c 1, zebra 2
VAL = {"zebra": 2, "Apple": 1}  # a subset: labelled by train's indices


def image_folder(root, blue=99):
    """An ImageFolder root of TRAIN and VAL's classes: small solid-colour PNGs (``blue`` tells two sets apart)."""
    for split, counts in (("train", TRAIN), ("val", VAL)):
        for c, (name, n) in enumerate(counts.items()):
            (root / split / name).mkdir(parents=True)
            for i in range(n):
                Image.new("RGB", (8 + i, 6 + c), (30 * c, 20 * i, blue)).save(
                    root / split / name / f"{i}.png"
                )
    return root


@pytest.fixture
def src(tmp_path):
    return image_folder(tmp_path / "src")


def source_pairs(src, split):
    """(file bytes, train's class index) of every image of a split."""
    index = {name: i for i, name in enumerate(sorted(TRAIN))}
    return sorted((p.read_bytes(), index[p.parent.name]) for p in (src / split).glob("*/*.png"))


def masked_crc(data):
    # TensorFlow's record checksum, from its spec: CRC-32C rotated right by 15 bits plus 0xa282ead8
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def tfrecord_payloads(path):
    """Each record's serialized Example, with both checksums checked."""
    payloads = []
    with open(path, "rb") as f:
        while header := f.read(12):
            length, length_crc = struct.unpack("<QI", header)
            assert length_crc == masked_crc(header[:8])
            data, (data_crc,) = f.read(length), struct.unpack("<I", f.read(4))
            assert data_crc == masked_crc(data)
            payloads.append(data)
    return payloads


def tar_pairs(path):
    """(image bytes, label) of each <key>.png + <key>.cls sample, checking WebDataset's layout."""
    with tarfile.open(path) as tar:
        members = tar.getmembers()
        names = [m.name for m in members]
        assert [n.rsplit(".", 1)[1] for n in names] == ["png", "cls"] * (len(names) // 2)
        assert [n.rsplit(".", 1)[0] for n in names[::2]] == [
            n.rsplit(".", 1)[0] for n in names[1::2]
        ]
        return [
            (tar.extractfile(image).read(), int(tar.extractfile(cls).read().decode("ascii")))
            for image, cls in zip(members[::2], members[1::2])
        ]


def tree(root):
    """{relative path: bytes} of every file under root, and its folders (as None)."""
    return {
        p.relative_to(root): None if p.is_dir() else p.read_bytes() for p in sorted(root.rglob("*"))
    }


def shards_of(folder):
    return sorted(p for p in folder.iterdir() if not p.name.endswith((".idx", ".idx.json", ".txt")))


def test_tfrecord_names_checksums_and_contents(src, tmp_path):
    manifest = make_shards(str(src), str(tmp_path / "dst"), "tfrecord", shard_size=5, seed=0)
    dst = tmp_path / "dst"
    assert [p.name for p in shards_of(dst / "train")] == [
        f"train-0000{k}-of-00003" for k in range(3)
    ]
    assert [p.name for p in shards_of(dst / "val")] == ["val-00000-of-00001"]
    for split in ("train", "val"):
        payloads = [d for shard in shards_of(dst / split) for d in tfrecord_payloads(shard)]
        pairs = source_pairs(src, split)
        assert len(payloads) == len(pairs) == manifest["splits"][split]["samples"]
        # every original file's bytes, unchanged, in exactly one record
        for image, _ in pairs:
            assert sum(image in d for d in payloads) == 1
        assert (dst / split / "classes.txt").read_text() == "Apple\nb c\nzebra\n"
    assert json.loads((dst / "manifest.json").read_text())["classes"] == ["Apple", "b c", "zebra"]


def test_wds_tars_follow_webdatasets_layout(src, tmp_path):
    # a symlinked image goes into the tar as the image
    (tmp_path / "elsewhere.png").write_bytes((src / "train" / "b c" / "0.png").read_bytes())
    (src / "train" / "b c" / "0.png").unlink()
    (src / "train" / "b c" / "0.png").symlink_to(tmp_path / "elsewhere.png")
    make_shards(str(src), str(tmp_path / "dst"), "wds", shard_size=5, seed=0)
    dst = tmp_path / "dst"
    assert [p.name for p in shards_of(dst / "train")] == [
        "train-000000.tar",
        "train-000001.tar",
        "train-000002.tar",
    ]
    for split in ("train", "val"):
        assert sorted(
            pair for shard in shards_of(dst / split) for pair in tar_pairs(shard)
        ) == source_pairs(src, split)
    labels = [label for shard in shards_of(dst / "train") for _, label in tar_pairs(shard)]
    assert labels != sorted(labels)  # shuffled across classes at write time
    assert sorted(label for _, label in tar_pairs(dst / "val" / "val-000000.tar")) == [
        0,
        2,
        2,
    ]  # train's indices


def test_same_seed_same_shards_other_seed_other_order(src, tmp_path):
    def shard_bytes(dst, seed):
        make_shards(str(src), str(tmp_path / dst), "wds", shard_size=5, seed=seed)
        return [tar_pairs(p) for p in shards_of(tmp_path / dst / "train")]

    a, b, c = shard_bytes("a", 0), shard_bytes("b", 0), shard_bytes("c", 1)
    assert a == b and a != c


@pytest.mark.parametrize("fmt", ["tfrecord", "wds"])
def test_the_bytes_do_not_depend_on_the_number_of_workers(src, tmp_path, fmt):
    def written(dst, workers):
        # max_size 6 re-encodes train's images of classes b c and zebra (shorter side 7 and 8), copies Apple's (6)
        make_shards(
            str(src), str(tmp_path / dst), fmt, shard_size=2, seed=3, max_size=6, workers=workers
        )
        # not the .idx.json summaries: they record their shard's modification time
        return {
            p.relative_to(tmp_path / dst): p.read_bytes()
            for p in (tmp_path / dst).rglob("*")
            if p.is_file() and not p.name.endswith(".idx.json")
        }

    one, two = written("one", 1), written("two", 2)
    assert len(one) == 3 + (2 * 6 + 1) + (
        2 * 2 + 1
    )  # claim, manifest, .lock; train's and val's shards, indexes, classes
    assert any(b"JFIF" in data for data in one.values()) and any(
        b"\x89PNG" in data for data in one.values()
    )
    assert one == two


def gradient(w, h):
    """An RGB image that is not the same upside down, mirrored or with its channels swapped."""
    ys, xs = np.mgrid[0:h, 0:w]
    return Image.fromarray(
        np.dstack([xs * 255 // w, ys * 255 // h, (xs + ys) * 127 // (w + h)]).astype(np.uint8)
    )


def test_max_size_re_encodes_larger_images_and_copies_the_rest(tmp_path):
    src = tmp_path / "src"
    for split in ("train", "val"):
        (src / split / "a").mkdir(parents=True)
    sizes = {
        "wide.png": (45, 30),
        "tall.png": (30, 47),
        "at_cap.png": (24, 60),
        "small.jpg": (20, 16),
    }
    for name, size in sizes.items():
        gradient(*size).save(src / "train" / "a" / name)
    gradient(8, 8).save(src / "val" / "a" / "0.png")

    def written(dst, *flags):
        """{source file name: (extension, bytes)} of the images in the one train shard."""
        main([str(src), str(tmp_path / dst), "--format", "wds", "--shard-size", "10", *flags])
        with tarfile.open(tmp_path / dst / "train" / "train-000000.tar") as tar:
            images = [m for m in tar.getmembers() if not m.name.endswith(".cls")]
            # a key is the image's index in SRC's order, which sorts by name
            return {
                sorted(sizes)[int(m.name.split(".")[0])]: (
                    m.name.split(".")[1],
                    tar.extractfile(m).read(),
                )
                for m in images
            }

    def original(name):
        return (src / "train" / "a" / name).read_bytes()

    capped = written("capped", "--max-size", "24")
    assert {n: ext for n, (ext, _) in capped.items()} == {
        "wide.png": "jpg",
        "tall.png": "jpg",
        "at_cap.png": "png",
        "small.jpg": "jpg",
    }
    for name, size in (("wide.png", (36, 24)), ("tall.png", (24, 38))):  # 30 x 47 -> 24 x 37.6
        image = Image.open(io.BytesIO(capped[name][1]))
        assert image.format == "JPEG" and image.size == size and image.mode == "RGB"
        reference = np.asarray(
            Image.open(src / "train" / "a" / name).resize(size, Image.Resampling.LANCZOS), float
        )
        assert (
            np.abs(np.asarray(image, float) - reference).mean() < 4
        )  # the same picture, up to JPEG's loss
    assert capped["at_cap.png"][1] == original("at_cap.png") and capped["small.jpg"][1] == original(
        "small.jpg"
    )
    manifest = json.loads((tmp_path / "capped" / "manifest.json").read_text())
    assert (manifest["max_size"], manifest["quality"]) == (24, 90)

    lower = written("lower", "--max-size", "24", "--quality", "40")
    assert (
        len(lower["wide.png"][1]) < len(capped["wide.png"][1])
        and lower["at_cap.png"] == capped["at_cap.png"]
    )
    assert json.loads((tmp_path / "lower" / "manifest.json").read_text())["quality"] == 40
    uncapped = written("uncapped")
    assert all(uncapped[n] == (n.split(".")[1], original(n)) for n in sizes)
    assert json.loads((tmp_path / "uncapped" / "manifest.json").read_text())["max_size"] is None


def test_max_size_scales_a_16_bit_png_to_8_bits_as_dalis_decoder_does(tmp_path):
    src = tmp_path / "src"
    # DALI's CPU decoder reads a 16-bit PNG as round(x / 257): 4 and 233 (x >> 8 would give 3, 234)
    values = {"dark.png": (1000, 4), "light.png": (60000, 233)}
    for split in ("train", "val"):
        (src / split / "a").mkdir(parents=True)
    for name, (value, _) in values.items():
        Image.fromarray(np.full((20, 24), value, np.uint16)).save(src / "train" / "a" / name)
        assert Image.open(src / "train" / "a" / name).mode == "I;16"
    gradient(8, 8).save(src / "val" / "a" / "0.png")
    main([str(src), str(tmp_path / "dst"), "--format", "wds", "--max-size", "10"])
    with tarfile.open(tmp_path / "dst" / "train" / "train-000000.tar") as tar:
        pixels = {
            sorted(values)[int(m.name[:8])]: np.asarray(Image.open(tar.extractfile(m)))
            for m in tar.getmembers()
            if m.name.endswith(".jpg")
        }
    assert {n: (p.shape, np.unique(p).tolist()) for n, p in pixels.items()} == {
        n: ((10, 12, 3), [v]) for n, (_, v) in values.items()
    }


def test_progress_lines_count_the_images_written(src, tmp_path, monkeypatch):
    out = io.StringIO()
    monkeypatch.setattr(
        make_shards_module, "progress", functools.partial(outputs.progress, out=out)
    )
    make_shards(str(src), str(tmp_path / "quick"), "wds", shard_size=5, seed=0)
    assert out.getvalue() == ""  # a job of a second prints no progress
    monkeypatch.setattr(
        make_shards_module, "progress", functools.partial(outputs.progress, every=0, out=out)
    )
    make_shards(str(src), str(tmp_path / "dst"), "wds", shard_size=5, seed=0)
    lines = out.getvalue().splitlines()
    for split, total in (("train", 12), ("val", 3)):
        what = f"{tmp_path / 'dst' / split}: images written: "
        mine = [line[len(what) :] for line in lines if line.startswith(what)]
        assert [line.split(" ")[0] for line in mine[:-1]] == [
            f"{k}/{total}" for k in range(1, total + 1)
        ]
        assert mine[-1].startswith(f"{total} done in ")


SPY = """
import os, signal, sys
sys.path.insert(0, {here!r})
import make_shards
calls = []
def write_then_die(real):
    def write(f, *args):
        calls.append(1)
        if len(calls) == 2:  # in the middle of this process's second shard
            f.write(b"half a shard")
            f.flush()
            os.killpg(os.getpgrp(), signal.SIGKILL)  # the whole job, workers and all, as a scheduler kills it
        return real(f, *args)
    return write
make_shards.write_tfrecord = write_then_die(make_shards.write_tfrecord)
make_shards.write_tar = write_then_die(make_shards.write_tar)
make_shards.main()
"""


def kill_midway(tmp_path, *args):
    """Runs make_shards.py with ``args`` in a process group of its own, killed as a worker writes its second shard."""
    (tmp_path / "spy.py").write_text(SPY.format(here=HERE))
    killed = subprocess.run(
        [sys.executable, str(tmp_path / "spy.py"), *map(str, args)],
        capture_output=True,
        timeout=300,
        start_new_session=True,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr.decode()


def train_shards(fmt, count):
    return [
        f"train-{k:05d}-of-{count:05d}" if fmt == "tfrecord" else f"train-{k:06d}.tar"
        for k in range(count)
    ]


def inodes(folder, names):
    """(inode, mtime) of each of ``names`` that exists in ``folder``: a file written again gets a new inode."""
    return {
        n: (os.stat(folder / n).st_ino, os.stat(folder / n).st_mtime_ns)
        for n in names
        if (folder / n).exists()
    }


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("fmt", ["tfrecord", "wds"])
def test_rerun_after_a_kill_keeps_complete_shards_and_writes_the_rest(src, tmp_path, fmt, workers):
    dst = tmp_path / "dst"
    make_shards(
        str(src), str(dst), fmt, shard_size=2, seed=0
    )  # an earlier set of other settings and names
    args = [src, dst, "--format", fmt, "--shard-size", "5", "--workers", workers]
    kill_midway(tmp_path, *args, "--overwrite")
    left = os.listdir(dst / "train")
    assert not (dst / "manifest.json").exists() and any(n.endswith(".partial") for n in left)
    shards = train_shards(fmt, 3)
    complete = inodes(dst / "train", shards)
    assert 1 <= len(complete) <= workers  # each worker had finished one shard

    main([str(a) for a in args])  # the same settings: no --overwrite needed
    assert sorted(os.listdir(dst / "train")) == sorted(
        ["classes.txt"] + shards + [s + ".idx" for s in shards] + [s + ".idx.json" for s in shards]
    )
    assert inodes(dst / "train", complete) == complete  # not written again
    assert json.loads((dst / "manifest.json").read_text())["splits"]["train"] == {
        "samples": 12,
        "shards": shards,
    }
    if fmt == "tfrecord":
        payloads = [d for s in shards for d in tfrecord_payloads(dst / "train" / s)]
        assert len(payloads) == 12 and all(
            sum(i in d for d in payloads) == 1 for i, _ in source_pairs(src, "train")
        )
    else:
        assert sorted(p for s in shards for p in tar_pairs(dst / "train" / s)) == source_pairs(
            src, "train"
        )


def test_rerun_rewrites_only_the_shards_whose_images_changed(src, tmp_path, capsys):
    dst = tmp_path / "dst"
    args = [str(src), str(dst), "--format", "wds", "--shard-size", "5"]
    main(args)
    names = [p.name for p in shards_of(dst / "train")]
    before = inodes(dst / "train", names)
    main(args)
    assert inodes(dst / "train", names) == before
    assert (
        f"{dst / 'train'}: 12 images in 3 wds shards (3 kept from an earlier run)\n"
        in capsys.readouterr().out
    )
    (src / "train" / "zebra" / "1.png").write_bytes(
        (src / "train" / "zebra" / "2.png").read_bytes()
    )  # other bytes
    main(args)
    assert (
        f"{dst / 'train'}: 12 images in 3 wds shards (2 kept from an earlier run)\n"
        in capsys.readouterr().out
    )
    after = inodes(dst / "train", names)
    assert (
        sum(after[n] == before[n] for n in names) == 2
    )  # the shard holding zebra/1.png is written again
    assert sorted(p for s in shards_of(dst / "train") for p in tar_pairs(s)) == source_pairs(
        src, "train"
    )


def test_a_full_disk_names_the_file_and_keeps_the_complete_shards(
    src, tmp_path, capsys, monkeypatch
):
    dst = tmp_path / "dst"
    args = [src, dst, "--format", "wds", "--shard-size", "5", "--workers", "1"]
    main([str(a) for a in args])
    names = [p.name for p in shards_of(dst / "train")]
    before = inodes(dst / "train", names)
    (src / "train" / "zebra" / "1.png").write_bytes(
        (src / "train" / "zebra" / "2.png").read_bytes()
    )  # the shard holding it is written again

    def full_disk(f, *args):
        f.write(b"part of a shard")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # a failed write names no file

    monkeypatch.setattr(make_shards_module, "write_tar", full_disk)
    code, err = run_main(capsys, *args)
    kept = inodes(dst / "train", names)
    (lost,) = set(names) - set(kept)
    assert (code, err) == (
        2,
        f"error: {dst / 'train' / lost}: could not be written (No space left on device); its "
        f"partial file was removed and the complete files kept: run the same command again once "
        f"there is space",
    )
    assert kept == {n: before[n] for n in kept} and len(kept) == 2
    assert not list(dst.rglob("*.partial"))
    monkeypatch.undo()
    main([str(a) for a in args])
    assert inodes(dst / "train", kept) == kept
    assert sorted(p for s in shards_of(dst / "train") for p in tar_pairs(s)) == source_pairs(
        src, "train"
    )


def run_main(capsys, *args):
    with pytest.raises(SystemExit) as exit_info:
        main([str(a) for a in args])
    err = capsys.readouterr().err.strip()
    return exit_info.value.code, err


def test_bad_input_is_one_error_line(src, tmp_path, capsys):
    fmt = ["--format", "wds"]
    assert run_main(capsys, tmp_path / "nope", tmp_path / "dst", *fmt) == (
        2,
        f"error: {tmp_path / 'nope'}: expected ImageFolder subfolders train/ and val/ in it (no train/)",
    )
    (tmp_path / "file").write_text("x")
    assert run_main(capsys, src, tmp_path / "file", *fmt) == (
        2,
        f"error: {tmp_path / 'file'}: exists and is not a directory",
    )
    assert run_main(capsys, src, "s3://bkt/set", *fmt) == (
        2,
        "error: s3://bkt/set: make_shards.py writes to local disk; write there, then upload the folder as it is "
        "(aws s3 sync DST s3://bkt/set)",
    )
    assert run_main(capsys, src, src, *fmt) == (
        2,
        f"error: {src}: DST must not be SRC {src}, inside it or hold it",
    )
    assert run_main(capsys, "s3://bkt/imagenet", tmp_path / "dst", *fmt) == (
        2,
        "error: s3://bkt/imagenet: make_shards.py reads local folders; copy the set to local disk",
    )
    (tmp_path / "mine" / "train").mkdir(parents=True)
    (tmp_path / "mine" / "train" / "notes.md").write_text("keep me")
    assert run_main(capsys, src, tmp_path / "mine", *fmt) == (
        2,
        f"error: {tmp_path / 'mine' / 'train' / 'notes.md'}: not written by make_shards.py --format wds; "
        f"choose an empty DST",
    )
    assert (tmp_path / "mine" / "train" / "notes.md").read_text() == "keep me"
    assert not (tmp_path / "dst").exists()
    for flag, value, allowed in (
        ("--shard-size", "0", "at least 1"),
        ("--workers", "0", "at least 1"),
        ("--max-size", "0", "at least 1"),
        ("--quality", "101", "in [1, 100]"),
        ("--quality", "0", "in [1, 100]"),
    ):
        code, err = run_main(capsys, src, tmp_path / "dst", *fmt, flag, value)
        assert code == 2 and err.endswith(f"error: argument {flag}: must be {allowed}, got {value}")
    assert not (tmp_path / "dst").exists()


def test_dst_inside_src_or_holding_it_is_refused_before_anything_is_written(src, tmp_path, capsys):
    (tmp_path / "link").symlink_to(src / "train")
    before = tree(tmp_path)
    for dst in (src / "train", src / "val" / "zebra", src / "shards", tmp_path / "link", tmp_path):
        assert run_main(capsys, src, dst, "--format", "wds") == (
            2,
            f"error: {dst}: DST must not be SRC {src}, inside it or hold it",
        )
    assert tree(tmp_path) == before  # no shard, claim or folder among SRC's images


def test_a_dst_another_run_writes_to_is_refused_and_its_lock_kept(src, tmp_path, capsys):
    dst = tmp_path / "dst"
    make_shards(str(src), str(dst), "wds", shard_size=5, seed=0)
    with open(dst / ".lock", "a") as lock:  # what another make_shards.py holds while it writes
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        before = tree(dst)
        for flags in ((), ("--shard-size", "2", "--overwrite")):
            assert run_main(capsys, src, dst, "--format", "wds", "--shard-size", "5", *flags) == (
                2,
                f"error: {dst}: another make_shards.py is writing to it ({dst / '.lock'} is "
                f"locked); wait for it or pick another DST",
            )
        assert tree(dst) == before
    main([str(src), str(dst), "--format", "wds", "--shard-size", "2", "--overwrite"])
    assert (dst / ".lock").exists() and len(shards_of(dst / "train")) == 6
    main([str(src), str(dst), "--format", "wds", "--shard-size", "2"])  # not a file of another set


def test_rerun_in_the_other_format_is_refused(src, tmp_path, capsys):
    make_shards(str(src), str(tmp_path / "dst"), "tfrecord", shard_size=5, seed=0)
    before = sorted(os.listdir(tmp_path / "dst" / "train"))
    code, err = run_main(capsys, src, tmp_path / "dst", "--format", "wds")
    assert code == 2 and err == (
        f"error: {tmp_path / 'dst' / 'train' / 'train-00000-of-00003'}: not written by "
        f"make_shards.py --format wds; choose an empty DST"
    )
    assert sorted(os.listdir(tmp_path / "dst" / "train")) == before


def test_another_data_sets_shards_are_replaced_only_with_overwrite(src, tmp_path, capsys):
    other = image_folder(tmp_path / "other", blue=200)
    dst = tmp_path / "dst"
    make_shards(
        str(other), str(dst), "wds", shard_size=2, seed=0
    )  # complete: 6 train shards, manifest and all
    before = {p.name: p.read_bytes() for p in (dst / "train").iterdir()}
    assert run_main(capsys, src, dst, "--format", "wds", "--shard-size", "5") == (
        2,
        f"error: {dst}: holds shards not written for this source and these settings (source {str(other)!r}, not "
        f"{str(src)!r}, shard_size 2, not 5); pass --overwrite to replace them",
    )
    assert {p.name: p.read_bytes() for p in (dst / "train").iterdir()} == before
    assert json.loads((dst / "manifest.json").read_text())["source"] == str(other)

    main([str(src), str(dst), "--format", "wds", "--shard-size", "5", "--overwrite"])
    assert [p.name for p in shards_of(dst / "train")] == train_shards(
        "wds", 3
    )  # other's six shards are gone
    for split in ("train", "val"):
        assert sorted(
            pair for shard in shards_of(dst / split) for pair in tar_pairs(shard)
        ) == source_pairs(src, split)
    assert json.loads((dst / "manifest.json").read_text())["source"] == str(src)


def test_tfrecord_named_files_of_another_writer_are_refused(src, tmp_path, capsys):
    # what TensorFlow's ImageNet scripts write: this script's names, but no claim.json of this script's
    dst = tmp_path / "dst"
    (dst / "train").mkdir(parents=True)
    for name in ("train-00000-of-00002", "train-00001-of-00002"):
        (dst / "train" / name).write_bytes(b"TensorFlow's records")
    assert run_main(capsys, src, dst, "--format", "tfrecord", "--shard-size", "5") == (
        2,
        f"error: {dst}: holds shards not written for this source and these settings (train/train-00000-of-00002, "
        f"with no claim.json); pass --overwrite to replace them",
    )
    assert sorted(os.listdir(dst / "train")) == ["train-00000-of-00002", "train-00001-of-00002"]
    assert (dst / "train" / "train-00000-of-00002").read_bytes() == b"TensorFlow's records"

    main([str(src), str(dst), "--format", "tfrecord", "--shard-size", "5", "--overwrite"])
    assert [p.name for p in shards_of(dst / "train")] == train_shards("tfrecord", 3)


def test_files_of_other_names_are_never_deleted(src, tmp_path, capsys):
    dst = tmp_path / "dst"
    make_shards(str(src), str(dst), "tfrecord", shard_size=2, seed=0)
    (dst / "README").write_text("DST itself may hold other files")
    (dst / "train" / "notes.md").write_text("keep me")

    def files():
        return {p: p.read_bytes() for p in dst.rglob("*") if p.is_file()}

    before = files()
    for fmt in ("tfrecord", "wds"):
        assert run_main(capsys, src, dst, "--format", fmt, "--shard-size", "5", "--overwrite") == (
            2,
            f"error: {dst / 'train' / 'notes.md'}: not written by make_shards.py --format {fmt}; choose an "
            f"empty DST",
        )
        assert files() == before  # nothing deleted, of any name
    (dst / "train" / "notes.md").unlink()
    before = files()
    assert run_main(
        capsys, src, dst, "--format", "wds", "--shard-size", "5", "--overwrite"
    ) == (  # TFRecord names
        2,
        f"error: {dst / 'train' / 'train-00000-of-00006'}: not written by make_shards.py --format wds; choose an "
        f"empty DST",
    )
    assert files() == before
    main([str(src), str(dst), "--format", "tfrecord", "--shard-size", "5", "--overwrite"])
    assert [p.name for p in shards_of(dst / "train")] == train_shards("tfrecord", 3)
    assert (dst / "README").read_text() == "DST itself may hold other files"


def test_val_class_missing_from_train_is_an_error(src, tmp_path, capsys):
    (src / "val" / "okapi").mkdir()
    Image.new("RGB", (4, 4)).save(src / "val" / "okapi" / "0.png")
    assert run_main(capsys, src, tmp_path / "dst", "--format", "tfrecord") == (
        2,
        f"error: {src / 'val' / 'okapi'}: class 'okapi' is not one of the 3 training classes",
    )


@pytest.mark.parametrize("name", ["x\ny", "x\ry", "x\x85y", "x\u2028y", "x\x0cy"])
def test_a_class_name_holding_a_line_break_is_refused(src, tmp_path, capsys, name):
    (src / "train" / name).mkdir()
    Image.new("RGB", (4, 4)).save(src / "train" / name / "0.png")
    assert run_main(capsys, src, tmp_path / "dst", "--format", "wds") == (
        2,
        f"error: {src / 'train'}: class folder {name!r} holds a line break, which a line of "
        "classes.txt cannot; rename it",
    )
    assert not (tmp_path / "dst").exists()


@pytest.mark.parametrize("fmt", ["tfrecord", "wds"])
@pytest.mark.parametrize("split", ["train", "val"])
def test_a_file_that_is_not_an_image_is_refused_before_any_shard_is_written(
    src, tmp_path, capsys, fmt, split
):
    # a trainer could name only its shard and sample, and DALI 2.4 could crash on it first
    bad = next((src / split).glob("*/")) / "notes.jpg"
    bad.write_text("written by a careless script\n")
    assert run_main(capsys, src, tmp_path / "dst", "--format", fmt) == (
        2,
        f"error: {bad}: cannot decode this image: not an image file (its first bytes are "
        "b'written ', not those of a JPEG, PNG, BMP, PPM/PGM, TIFF, WebP or JPEG 2000 file); "
        "remove or replace it",
    )
    assert not (tmp_path / "dst").exists()


CTRL_C = """
import os, signal, sys
sys.path.insert(0, {here!r})
import make_shards
# as in a terminal: a shell's background job starts with SIGINT ignored, and Python keeps that
signal.signal(signal.SIGINT, signal.default_int_handler)
calls = []
def write_then_interrupt(real):
    def write(f, *args):
        calls.append(1)
        if len(calls) == 2:  # Ctrl-C as the second shard is written: the terminal's whole group
            os.killpg(os.getpgrp(), signal.SIGINT)
        return real(f, *args)
    return write
make_shards.write_tfrecord = write_then_interrupt(make_shards.write_tfrecord)
make_shards.main()
"""


def test_ctrl_c_is_one_line_and_leaves_whole_shards(src, tmp_path):
    (tmp_path / "spy.py").write_text(CTRL_C.format(here=HERE))
    dst = tmp_path / "dst"
    proc = subprocess.run(
        [sys.executable, str(tmp_path / "spy.py"), str(src), str(dst), "--format", "tfrecord"]
        + ["--shard-size", "4", "--workers", "1"],
        capture_output=True,
        text=True,
        timeout=300,
        start_new_session=True,
    )
    assert proc.returncode == 130, proc.stderr
    assert proc.stderr.splitlines()[-1] == "interrupted: the shards written so far are whole"
    assert "Traceback" not in proc.stderr
    assert not [n for n in os.listdir(dst / "train") if n.startswith(".")]  # no part file left
