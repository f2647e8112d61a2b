"""Tests of data_processing.py on tiny PNG roots built in tmp_path; DALI runs on the CPU only."""

import csv
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from data_processing import (
    main,
    make_csv_file_npy,
    make_demo_pngs,
    png2numpy,
    prepare,
)
from data_sources import DataError, check_segmentation_files, read_split
from pipelines import fetch_dali_loader, segment_iterator

GROUPS = {"1": 5, "2": 4, "3": 2, "4": 1}  # pairs per group: the split rule's edge cases
HERE = os.path.dirname(os.path.abspath(__file__))


def save(path, array, mode=None, palette=None):
    path.parent.mkdir(parents=True, exist_ok=True)
    img = Image.fromarray(array) if mode is None else Image.fromarray(array).convert(mode)
    if palette is not None:
        img.putpalette(palette)  # makes an L image a P image with the same values as indices
    img.save(path)
    return path


def binary_root(root, groups=GROUPS, size=(12, 10)):
    """A PNG root of random RGB images and binary 0/255 masks, ``groups[g]`` pairs in group g."""
    rng = np.random.default_rng(0)
    for group, n in groups.items():
        for i in range(n):
            save(
                root / "Images" / group / f"p{i}.png",
                rng.integers(0, 256, (*size, 3), dtype=np.uint8),
            )
            save(
                root / "Masks" / group / f"p{i}.png",
                (rng.random(size) < 0.5).astype(np.uint8) * 255,
            )
    return root


def tree(root):
    """{relative path: bytes} of every file under root."""
    return {p.relative_to(root): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def mtimes(root):
    """{path: mtime} of root and everything under it: a folder's changes when a file in it is added or removed."""
    return {p: p.stat().st_mtime_ns for p in [root, *root.rglob("*")]}


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.reader(f))


def make_older(path, than):
    t = than.stat().st_mtime_ns - 10**9
    os.utime(path, ns=(t, t))


def partials(root):
    return sorted(p for p in root.rglob("*") if p.name.endswith(".partial"))


# ------------------------------------------------------------------------------------------
# PNG -> npy
# ------------------------------------------------------------------------------------------


def test_round_trip_is_exact(tmp_path):
    rng = np.random.default_rng(1)
    src, dst = tmp_path / "src", tmp_path / "dst"
    rgb = rng.integers(0, 256, (9, 7, 3), dtype=np.uint8)
    rgba = rng.integers(0, 256, (9, 7, 4), dtype=np.uint8)
    grey = rng.integers(0, 256, (9, 7), dtype=np.uint8)
    binary = (rng.random((9, 7)) < 0.5).astype(np.uint8) * 255
    classes = rng.integers(0, 4, (9, 7), dtype=np.uint8)
    indices = rng.integers(0, 5, (9, 7), dtype=np.uint8)
    # Palette colours unrelated to the indices: the indices are the classes.
    palette = [200, 10, 10, 10, 200, 10, 10, 10, 200, 255, 255, 0, 0, 255, 255] + [0] * (3 * 251)
    cases = {  # name: (image array, mode, mask array, mode, palette, expected image, expected mask)
        "rgb_binary": (rgb, None, binary, None, None, rgb, binary // 255),
        "rgba_classes": (rgba, None, classes, None, None, rgba[..., :3], classes),
        "grey_palette": (grey, None, indices, None, palette, np.stack([grey] * 3, -1), indices),
        "rgb_greymask": (rgb, None, np.stack([binary] * 3, -1), None, None, rgb, binary // 255),
        "rgb_greyclasses": (rgb, None, np.stack([classes] * 3, -1), None, None, rgb, classes),
        "rgb_bilevel": (rgb, None, binary, "1", None, rgb, binary // 255),
    }
    for name, (image, image_mode, mask, mask_mode, pal, _, _) in cases.items():
        save(src / "Images" / "1" / f"{name}.png", image, image_mode)
        save(src / "Masks" / "1" / f"{name}.png", mask, mask_mode, pal)
    assert Image.open(src / "Masks" / "1" / "grey_palette.png").mode == "P"
    assert Image.open(src / "Images" / "1" / "rgba_classes.png").mode == "RGBA"

    assert png2numpy(src, dst) == 2 * len(cases)
    for name, (*_, expected_image, expected_mask) in cases.items():
        image = np.load(dst / "Images" / "1" / f"{name}.npy")
        mask = np.load(dst / "Masks" / "1" / f"{name}.npy")
        assert image.dtype == np.uint8 and image.shape == (9, 7, 3), name
        assert mask.dtype == np.uint8 and mask.shape == (9, 7, 1), name
        np.testing.assert_array_equal(image, expected_image, err_msg=name)
        np.testing.assert_array_equal(mask[..., 0], expected_mask, err_msg=name)


def test_a_16_bit_image_is_scaled_as_dali_decodes_it_and_a_16_bit_mask_kept(tmp_path):
    src, dst = tmp_path / "src", tmp_path / "dst"
    image = np.array([[0, 128, 129, 255], [1000, 32896, 60000, 65535]], np.uint16)
    # DALI's CPU decoder reads a 16-bit PNG as round(x / 257) (x >> 8 would give 3 and 234)
    scaled = np.array([[0, 0, 1, 1], [4, 128, 233, 255]], np.uint8)
    save(src / "Images" / "1" / "a.png", image)
    save(src / "Masks" / "1" / "a.png", np.array([[0, 1, 2, 3], [4, 5, 6, 255]], np.uint16))
    assert Image.open(src / "Images" / "1" / "a.png").mode == "I;16"
    png2numpy(src, dst)
    np.testing.assert_array_equal(np.load(dst / "Images" / "1" / "a.npy"), np.dstack([scaled] * 3))
    np.testing.assert_array_equal(
        np.load(dst / "Masks" / "1" / "a.npy")[..., 0], [[0, 1, 2, 3], [4, 5, 6, 255]]
    )
    mask = save(src / "Masks" / "1" / "a.png", np.array([[0, 1, 2, 3], [4, 5, 6, 300]], np.uint16))
    with pytest.raises(DataError, match=re.escape(f"{mask}: mask values 0..300 do not fit uint8")):
        png2numpy(src, dst)


def test_colour_rgb_mask_is_an_error(tmp_path):
    src = binary_root(tmp_path / "src", {"1": 1})
    colour = np.zeros((12, 10, 3), np.uint8)
    colour[2:5, 3:6] = (255, 0, 0)
    mask = save(src / "Masks" / "1" / "p0.png", colour)
    with pytest.raises(DataError, match=re.escape(f"{mask}: colour RGB mask") + ".*palette"):
        png2numpy(src, tmp_path / "dst")


# ------------------------------------------------------------------------------------------
# split
# ------------------------------------------------------------------------------------------


def test_split_is_deterministic_disjoint_complete_and_within_groups(tmp_path):
    src = binary_root(tmp_path / "src")
    for dst in (tmp_path / "a", tmp_path / "b"):
        png2numpy(src, dst)
        counts = make_csv_file_npy(dst)
    # 5 -> round(1.0) = 1, 4 -> round(0.8) = 1, 2 -> at least 1, 1 -> train only.
    assert counts == {"1": (4, 1), "2": (3, 1), "3": (1, 1), "4": (1, 0)}
    dst = tmp_path / "a"
    assert tree(dst / "csv_file") == tree(tmp_path / "b" / "csv_file")
    before = tree(dst / "csv_file")
    make_csv_file_npy(dst)
    assert tree(dst / "csv_file") == before

    listed = {}
    for split in ("train", "valid"):
        rows = read_csv(dst / "csv_file" / f"{split}.csv")
        assert rows[0] == ["index", "images", "masks"]
        assert [int(r[0]) for r in rows[1:]] == list(range(len(rows) - 1))
        for _, image, mask in rows[1:]:
            assert image.startswith("Images/") and mask == "Masks/" + image[len("Images/") :]
            assert (dst / image).is_file() and (dst / mask).is_file()
            assert image not in listed, f"{image} listed twice"
            listed[image] = split
    every = {f"Images/{g}/p{i}.npy" for g, n in GROUPS.items() for i in range(n)}
    assert set(listed) == every
    valid_groups = {image.split("/")[1] for image, split in listed.items() if split == "valid"}
    assert valid_groups == {"1", "2", "3"}

    other = tmp_path / "other_seed"
    png2numpy(src, other)
    make_csv_file_npy(other, seed=7)
    assert read_csv(other / "csv_file" / "valid.csv") != read_csv(dst / "csv_file" / "valid.csv")


def test_read_split_and_prepare(tmp_path):
    src = binary_root(tmp_path / "src")
    prepared = prepare(str(src))
    assert prepared == str(src / "npy")
    assert prepare(prepared) == prepared
    imgs, lbls = read_split(prepared, "train")
    valid_imgs, _ = read_split(prepared, "valid")
    assert len(imgs) + len(valid_imgs) == sum(GROUPS.values())
    assert all(os.path.isabs(p) and os.path.isfile(p) for p in imgs + lbls)
    check_segmentation_files(imgs, lbls)

    os.remove(lbls[2])
    with pytest.raises(
        DataError, match=re.escape(f"train.csv row index 2: {lbls[2]}: no such file")
    ):
        read_split(prepared, "train")


def test_prepared_demo_runs_through_the_dali_loader(tmp_path):
    make_demo_pngs(tmp_path / "demo", n_per_group=4, groups=2, size=(48, 40))
    root = prepare(str(tmp_path / "demo"))
    imgs, lbls = read_split(root, "train")
    assert len(imgs) == 6
    check_segmentation_files(imgs, lbls)
    batch = next(
        segment_iterator(fetch_dali_loader(imgs, lbls, batch_size=4, mode="train", size=(64, 64)))
    )[0]
    image, mask = batch["image"], batch["mask"]
    assert tuple(image.shape) == (4, 3, 64, 64) and str(image.dtype) == "torch.float32"
    assert tuple(mask.shape) == (4, 1, 64, 64) and str(mask.dtype) == "torch.uint8"
    assert set(mask.unique().tolist()) <= {0, 1}


# ------------------------------------------------------------------------------------------
# re-running
# ------------------------------------------------------------------------------------------


def test_second_run_rewrites_nothing(tmp_path):
    src, dst = binary_root(tmp_path / "src"), tmp_path / "dst"
    png2numpy(src, dst)
    make_csv_file_npy(dst)
    before = mtimes(dst)
    assert png2numpy(src, dst) == 0
    make_csv_file_npy(dst)
    assert mtimes(dst) == before


def test_stale_or_corrupt_outputs_are_rewritten(tmp_path):
    src, dst = binary_root(tmp_path / "src"), tmp_path / "dst"
    png2numpy(src, dst)
    make_csv_file_npy(dst)
    expected = tree(dst)
    garbage = dst / "Images" / "1" / "p0.npy"
    garbage.write_bytes(b"\x93NUMPY garbage")
    make_older(garbage, than=src / "Images" / "1" / "p0.png")
    # Newer than its source but cut short, as a non-atomic writer would leave it.
    truncated = dst / "Masks" / "2" / "p1.npy"
    truncated.write_bytes(truncated.read_bytes()[:-7])
    leftover = dst / "Images" / "1" / ".p2.npy.12345.partial"
    leftover.write_bytes(b"half a file")
    untouched = dst / "Images" / "3" / "p0.npy"
    untouched_mtime = untouched.stat().st_mtime_ns

    assert png2numpy(src, dst) == 2
    assert not (dst / "csv_file" / "train.csv").exists()  # removed until the split is rewritten
    make_csv_file_npy(dst)
    assert tree(dst) == expected  # the killed run's temporary file is gone too
    assert untouched.stat().st_mtime_ns == untouched_mtime
    assert ".partial" not in (dst / "csv_file" / "train.csv").read_text()


def test_changed_source_is_converted_again(tmp_path):
    src, dst = binary_root(tmp_path / "src"), tmp_path / "dst"
    png2numpy(src, dst)
    new_mask = np.zeros((12, 10), np.uint8)
    new_mask[:3] = 255
    save(src / "Masks" / "2" / "p0.png", new_mask)
    assert png2numpy(src, dst) == 1
    np.testing.assert_array_equal(np.load(dst / "Masks" / "2" / "p0.npy")[..., 0], new_mask // 255)


def test_replaced_png_of_the_same_size_and_an_older_mtime_is_converted_again(tmp_path):
    src, dst = binary_root(tmp_path / "src"), tmp_path / "dst"
    old, new = np.random.default_rng(5).integers(0, 256, (2, 12, 10, 3), dtype=np.uint8)
    png, npy = src / "Images" / "3" / "p1.png", dst / "Images" / "3" / "p1.npy"
    # Stored uncompressed, a PNG's size depends on its height and width only.
    Image.fromarray(old).save(png, compress_level=0)
    assert png2numpy(src, dst) == 2 * sum(GROUPS.values())
    size, mtime = png.stat().st_size, png.stat().st_mtime_ns
    Image.fromarray(new).save(png, compress_level=0)
    os.utime(png, ns=(mtime - 10**9,) * 2)
    assert png.stat().st_size == size and png.stat().st_mtime_ns < min(
        mtime, npy.stat().st_mtime_ns
    )
    assert png2numpy(src, dst) == 1
    np.testing.assert_array_equal(np.load(npy), new)


def test_deleted_pairs_leave_the_split_and_their_npy_go(tmp_path):
    src, dst = binary_root(tmp_path / "src"), tmp_path / "dst"
    png2numpy(src, dst)
    make_csv_file_npy(dst)
    notes = dst / "Images" / "2" / "notes.txt"
    notes.write_text("not ours")
    for kind in ("Images", "Masks"):
        (src / kind / "2" / "p1.png").unlink()
        shutil.rmtree(src / kind / "4")
    assert png2numpy(src, dst) == 0
    make_csv_file_npy(dst)
    fresh = tmp_path / "fresh"
    png2numpy(src, fresh)
    make_csv_file_npy(fresh)
    # The same .npy files, records and split as a root prepared from the PNGs that are left; the
    # emptied group folders go, a file this tool did not write stays.
    assert tree(dst) == {**tree(fresh), notes.relative_to(dst): b"not ours"}
    assert not (dst / "Images" / "4").exists() and not (dst / "Masks" / "4").exists()
    rows = (
        read_csv(dst / "csv_file" / "train.csv")[1:] + read_csv(dst / "csv_file" / "valid.csv")[1:]
    )
    assert sorted(image for _, image, _ in rows) == sorted(
        f"Images/{g}/p{i}.npy"
        for g, n in GROUPS.items()
        for i in range(n)
        if g != "4" and (g, i) != ("2", 1)
    )


def test_npy_without_png_and_record_is_an_error_and_changes_nothing(tmp_path):
    src, dst = binary_root(tmp_path / "src"), tmp_path / "dst"
    png2numpy(src, dst)
    make_csv_file_npy(dst)
    foreign = dst / "Images" / "1" / "extra.npy"
    np.save(foreign, np.zeros((12, 10, 3), np.uint8))
    for kind in ("Images", "Masks"):  # a pair whose .npy would go, were it not for the error
        (src / kind / "2" / "p0.png").unlink()
    before = tree(dst)
    png = src / "Images" / "1" / "extra.png"
    with pytest.raises(
        DataError,
        match=re.escape(f"{foreign}: not written by data_processing.py and there is no {png}"),
    ):
        png2numpy(src, dst)
    assert tree(dst) == before


def test_prepare_again_writes_nothing(tmp_path):
    src = binary_root(tmp_path / "src")
    prepare(str(src))
    before = mtimes(src)
    assert prepare(str(src)) == str(src / "npy")
    assert mtimes(src) == before


def test_a_root_that_cannot_be_locked_is_read_without_a_lock(tmp_path, monkeypatch):
    src = binary_root(tmp_path / "src")
    prepare(str(src))
    (src / "npy" / ".data_processing.lock").unlink()
    before = mtimes(src)
    os_open = os.open

    def no_write_access(
        path, flags, *args
    ):  # tests may run as root, for whom chmod forbids nothing
        if path.endswith(".data_processing.lock"):
            raise PermissionError(13, "Permission denied", path)
        return os_open(path, flags, *args)

    monkeypatch.setattr(os, "open", no_write_access)
    assert prepare(str(src)) == str(src / "npy")
    assert mtimes(src) == before


def test_interrupted_run_leaves_no_split_and_no_partial_npy(tmp_path, monkeypatch):
    src, dst = binary_root(tmp_path / "src"), tmp_path / "dst"
    png2numpy(src, dst)
    make_csv_file_npy(dst)
    for record in dst.rglob(".*.source"):  # no record: every .npy is converted again
        record.unlink()
    replace, renames = os.replace, []

    def interrupted_replace(tmp, path):
        renames.append(path)
        if (
            len(renames) == 4
        ):  # the second .npy is renamed, the temporary file of its record fully written
            raise KeyboardInterrupt
        replace(tmp, path)

    monkeypatch.setattr(os, "replace", interrupted_replace)
    with pytest.raises(KeyboardInterrupt):
        png2numpy(src, dst)
    monkeypatch.setattr(os, "replace", replace)
    assert not list(dst.rglob("*.partial"))
    with pytest.raises(DataError, match="csv_file"):  # the root does not look complete
        read_split(str(dst), "train")
    for npy in dst.rglob("*.npy"):
        np.load(npy)  # every .npy there is whole
    assert renames[2].endswith(".npy") and not os.path.exists(renames[3])
    # Only the first .npy has its record; the second, renamed but without one, is converted again.
    assert png2numpy(src, dst) == 2 * sum(GROUPS.values()) - 1
    make_csv_file_npy(dst)
    check_segmentation_files(*read_split(str(dst), "train"))


# ------------------------------------------------------------------------------------------
# demo set
# ------------------------------------------------------------------------------------------


def test_demo_set_is_deterministic_binary_and_non_trivial(tmp_path):
    args = dict(n_per_group=3, groups=2, size=(48, 40))
    assert make_demo_pngs(tmp_path / "a", **args) == 12
    make_demo_pngs(tmp_path / "b", **args)
    files = tree(tmp_path / "a")
    assert len(files) == 12 + 1 and files == tree(tmp_path / "b")  # the PNGs and the lock file
    make_demo_pngs(tmp_path / "c", seed=1, **args)
    assert tree(tmp_path / "c") != files
    before = mtimes(tmp_path / "a")
    assert make_demo_pngs(tmp_path / "a", **args) == 0
    assert mtimes(tmp_path / "a") == before
    for mask_png in (tmp_path / "a" / "Masks").rglob("*.png"):
        mask = Image.open(mask_png)
        image = Image.open(tmp_path / "a" / "Images" / mask_png.parent.name / mask_png.name)
        assert mask.mode == "L" and image.mode == "RGB" and mask.size == image.size == (40, 48)
        values = np.asarray(mask)
        assert set(np.unique(values).tolist()) == {0, 255}, mask_png
        assert 0 < (values == 255).mean() < 0.5, mask_png


# ------------------------------------------------------------------------------------------
# two runs at once
# ------------------------------------------------------------------------------------------

# Both children import first, then start on the parent's word, so they start together; every
# write is slowed down, so that the two runs overlap and one has to wait for the other.
CHILD = """
import sys, time
import data_processing

write = data_processing._write_atomic


def slow_write(path, data):
    time.sleep(0.02)
    write(path, data)


data_processing._write_atomic = slow_write
print("ready", flush=True)
sys.stdin.readline()
print(eval(sys.argv[1], vars(data_processing)))
"""


def at_once(call):
    """[(exit status, stdout, stderr)] of two processes that evaluate ``call`` in data_processing together."""
    children = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, call],
            cwd=HERE,
            text=True,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for _ in range(2)
    ]
    ready = [child.stdout.readline() for child in children]
    for child in children:
        try:
            child.stdin.write("go\n")
            child.stdin.flush()
        except BrokenPipeError:  # it died: its status and stderr tell why
            pass
    outputs = [child.communicate(timeout=120) for child in children]
    results = [(child.returncode, out, err) for child, (out, err) in zip(children, outputs)]
    assert ready == ["ready\n"] * 2, results
    return results


WAITING = ": waiting for another process writing there to finish"


def only_waited(stderr):
    return all(line.endswith(WAITING) for line in stderr.splitlines())


def test_two_prepares_at_once_both_succeed_and_leave_a_complete_root(tmp_path):
    src, reference = binary_root(tmp_path / "src"), binary_root(tmp_path / "reference")
    results = at_once(f"prepare({str(src)!r})")
    assert [(status, out) for status, out, _ in results] == [(0, f"{src / 'npy'}\n")] * 2, results
    assert all(only_waited(err) for _, _, err in results), results
    assert any(err for _, _, err in results), "neither run waited for the other"
    prepare(str(reference))
    assert tree(src / "npy") == tree(reference / "npy")
    assert not partials(tmp_path)


def test_two_demo_builds_at_once_write_each_file_once(tmp_path):
    args = "n_per_group=2, groups=2, size=(32, 32)"
    results = at_once(f"make_demo_pngs({str(tmp_path / 'demo')!r}, {args})")
    assert sorted((status, out) for status, out, _ in results) == [(0, "0\n"), (0, "8\n")], results
    assert sorted(err for _, _, err in results) == ["", f"{tmp_path / 'demo'}{WAITING}\n"]
    make_demo_pngs(tmp_path / "reference", n_per_group=2, groups=2, size=(32, 32))
    assert tree(tmp_path / "demo") == tree(tmp_path / "reference")
    assert not partials(tmp_path)


# ------------------------------------------------------------------------------------------
# errors
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("missing", ["Images", "Masks"])
def test_missing_folder(tmp_path, missing):
    src = binary_root(tmp_path / "src", {"1": 1})
    (src / missing / "1" / "p0.png").unlink()
    (src / missing / "1").rmdir()
    (src / missing).rmdir()
    with pytest.raises(DataError, match=re.escape(f"{src / missing}: no such directory")):
        png2numpy(src, tmp_path / "dst")


@pytest.mark.parametrize("empty", ["Images", "Masks"])
def test_folder_without_pngs(tmp_path, empty):
    src = binary_root(tmp_path / "src", {"1": 1})
    (src / empty / "1" / "p0.png").rename(src / empty / "1" / "p0.jpg")
    with pytest.raises(DataError, match=re.escape(f"{src / empty}: no .png files")):
        png2numpy(src, tmp_path / "dst")


def test_image_without_mask(tmp_path):
    src = binary_root(tmp_path / "src", {"1": 2})
    (src / "Masks" / "1" / "p1.png").rename(src / "Masks" / "1" / "other.png")
    with pytest.raises(
        DataError, match=re.escape(f"{src / 'Images' / '1' / 'p1.png'}: image has no mask")
    ):
        png2numpy(src, tmp_path / "dst")


def test_mask_without_image(tmp_path):
    src = binary_root(tmp_path / "src", {"1": 2, "2": 1})
    (src / "Images" / "2" / "p0.png").unlink()
    with pytest.raises(
        DataError, match=re.escape(f"{src / 'Masks' / '2' / 'p0.png'}: mask has no image")
    ):
        png2numpy(src, tmp_path / "dst")


def test_mask_size_differs_from_image(tmp_path):
    src = binary_root(tmp_path / "src", {"1": 2})
    mask = save(src / "Masks" / "1" / "p1.png", np.zeros((10, 12), np.uint8))
    with pytest.raises(
        DataError,
        match=re.escape(
            f"{mask}: mask is 10x12 but its image {src / 'Images' / '1' / 'p1.png'} is 12x10"
        ),
    ):
        png2numpy(src, tmp_path / "dst")


@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_unreadable_png(tmp_path, damage):
    src = binary_root(tmp_path / "src", {"1": 2})
    bad = src / "Images" / "1" / "p1.png"
    bad.write_bytes(b"not a png" if damage == "garbage" else bad.read_bytes()[:80])
    with pytest.raises(DataError, match=re.escape(f"{bad}: not a readable PNG")):
        png2numpy(src, tmp_path / "dst")


def test_prepare_rejects_a_folder_of_neither_kind(tmp_path):
    with pytest.raises(DataError, match=re.escape(f"{tmp_path}: neither a prepared root")):
        prepare(str(tmp_path))


# ------------------------------------------------------------------------------------------
# command line
# ------------------------------------------------------------------------------------------


def test_command_line_converts_and_reports(tmp_path, capsys):
    src = binary_root(tmp_path / "src")
    main([str(src), str(tmp_path / "dst"), "--valid-fraction", "0.5", "--seed", "3"])
    out = capsys.readouterr().out.strip()
    assert out.count("\n") == 0
    assert (
        "12 pairs, train 7, valid 5" in out and "1: 3+2" in out and "24 .npy files written" in out
    )


def test_command_line_demo_then_convert(tmp_path, capsys):
    main(["--demo", str(tmp_path / "png"), "--demo-per-group", "2", "--demo-size", "32"])
    assert "16 PNG files written" in capsys.readouterr().out
    main(
        [
            "--demo",
            str(tmp_path / "png"),
            str(tmp_path / "npy"),
            "--demo-per-group",
            "2",
            "--demo-size",
            "32",
        ]
    )
    out = capsys.readouterr().out.splitlines()
    assert "0 PNG files written" in out[0] and "8 pairs, train 4, valid 4" in out[1]


def test_command_line_bad_input_prints_one_error_line(tmp_path):
    result = subprocess.run(
        [sys.executable, "data_processing.py", str(tmp_path / "nope"), str(tmp_path / "dst")],
        capture_output=True,
        text=True,
        cwd=os.path.dirname(os.path.abspath(__file__)),
    )
    assert result.returncode == 2
    assert (
        result.stderr == f"error: {tmp_path / 'nope' / 'Images'}: no such directory "
        f"(expected {tmp_path / 'nope' / 'Images'}/<group>/<name>.png)\n"
    )


# A clock that moves 2 s at every reading, so each PNG seems to take seconds, as in a root of tens of thousands.
# In a child process: outputs.progress writes to the sys.stderr of its import, which pytest's capture does not see.
SLOW_CLOCK = """
import itertools, sys, time
import data_processing

clock = itertools.count(0, 2)
time.perf_counter = lambda: next(clock)
data_processing.main(sys.argv[1:])
"""


def test_long_conversion_prints_progress_on_stderr_and_a_quick_one_none(tmp_path):
    src, slow_dst, quick_dst = binary_root(tmp_path / "src"), tmp_path / "slow", tmp_path / "quick"
    slow = subprocess.run(
        [sys.executable, "-c", SLOW_CLOCK, str(src), str(slow_dst)],
        capture_output=True,
        text=True,
        cwd=HERE,
    )
    quick = subprocess.run(
        [sys.executable, "data_processing.py", str(src), str(quick_dst)],
        capture_output=True,
        text=True,
        cwd=HERE,
    )
    assert (quick.returncode, quick.stderr) == (0, ""), quick
    assert quick.stdout.startswith(f"{quick_dst}: 12 pairs") and quick.stdout.endswith(
        " 24 .npy files written\n"
    )
    # The progress lines leave stdout as it was: the same summary line.
    assert (slow.returncode, slow.stdout) == (
        0,
        quick.stdout.replace(str(quick_dst), str(slow_dst)),
    ), slow
    lines = slow.stderr.splitlines()
    assert all(
        line.startswith(("checking PNG pairs: ", "converting PNGs to .npy: ")) for line in lines
    ), lines
    # Two checks: the one that finds work to do, then the plan made again under the writers' lock.
    assert lines.count("checking PNG pairs: 12 done in 26 s") == 2, lines
    assert "converting PNGs to .npy: 3/24 (12 %), 0.5/s, eta 42 s" in lines, lines
    assert lines[-1] == "converting PNGs to .npy: 24 done in 50 s", lines


def test_ignore_index_255_keeps_255_in_every_mask_and_converts_again_when_it_changes(tmp_path):
    """Without it a 0/255 mask is binary (0/1); with 255 as the ignore value, a mask of background
    and ignored pixels alone keeps them apart, and so does one with classes too."""
    src, dst = tmp_path / "src", tmp_path / "dst"
    only_ignored = np.zeros((6, 5), np.uint8)
    only_ignored[:, 0] = 255
    with_classes = only_ignored.copy()
    with_classes[2:4, 2:4] = 2
    for name, mask in (("a", only_ignored), ("b", with_classes)):
        save(src / "Images" / "1" / f"{name}.png", np.zeros((6, 5, 3), np.uint8))
        save(src / "Masks" / "1" / f"{name}.png", mask)

    def masks():
        return [np.load(dst / "Masks" / "1" / f"{n}.npy")[..., 0] for n in "ab"]

    assert png2numpy(src, dst) == 4
    assert [m.tolist() for m in masks()] == [(only_ignored // 255).tolist(), with_classes.tolist()]
    assert png2numpy(src, dst, ignore_index=255) == 2  # the masks alone, converted by the new rule
    assert [m.tolist() for m in masks()] == [only_ignored.tolist(), with_classes.tolist()]
    assert png2numpy(src, dst, ignore_index=255) == 0
    assert png2numpy(src, dst) == 2


@pytest.mark.parametrize(
    "flag, value, allowed",
    [
        ("--demo-size", "0", "[16, 4096]"),
        ("--demo-size", "100000", "[16, 4096]"),  # 100000² pixels: 30 GB to draw one image
        ("--demo-per-group", "0", "[1, 10000]"),
        ("--demo-per-group", "10000000", "[1, 10000]"),
    ],
)
def test_demo_sizes_are_bounded_before_anything_is_drawn(tmp_path, capsys, flag, value, allowed):
    with pytest.raises(SystemExit) as exit_info:
        main(["--demo", str(tmp_path / "png"), flag, value])
    assert exit_info.value.code == 2
    # argparse names the program as run: here pytest
    assert (
        capsys.readouterr()
        .err.splitlines()[-1]
        .endswith(f": error: argument {flag}: must be in {allowed}, got {value}")
    )
    assert not (tmp_path / "png").exists()


CTRL_C = """
import os, signal, sys
sys.path.insert(0, {here!r})
import data_processing
# as in a terminal: a shell's background job starts with SIGINT ignored, and Python keeps that
signal.signal(signal.SIGINT, signal.default_int_handler)
converted = []
real = data_processing._convert
def convert_then_interrupt(*args):
    converted.append(1)
    if len(converted) == 3:  # Ctrl-C in the middle of the conversion
        os.killpg(os.getpgrp(), signal.SIGINT)
    return real(*args)
data_processing._convert = convert_then_interrupt
data_processing.main()
"""


def test_ctrl_c_is_one_line_and_leaves_whole_files(tmp_path):
    here = os.path.dirname(os.path.abspath(__file__))
    (tmp_path / "spy.py").write_text(CTRL_C.format(here=here))
    src, dst = tmp_path / "png", tmp_path / "npy"
    proc = subprocess.run(
        [sys.executable, str(tmp_path / "spy.py"), str(src), str(dst), "--demo"]
        + ["--demo-per-group", "2"],
        capture_output=True,
        text=True,
        timeout=300,
        start_new_session=True,
    )
    assert proc.returncode == 130, proc.stderr
    assert proc.stderr.splitlines()[-1] == (
        "interrupted: what was written is whole; run it again to finish"
    )
    assert "Traceback" not in proc.stderr
    left = [f for _, _, names in os.walk(dst) for f in names if ".partial" in f or ".tmp" in f]
    assert not left
