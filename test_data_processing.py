"""Tests of data_processing.py on tiny PNG roots built in tmp_path; DALI runs on the CPU only."""

import csv
import re
import os
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
    read_split,
)
from pipelines import DataError, check_segmentation_files, fetch_dali_loader, segment_iterator

GROUPS = {"1": 5, "2": 4, "3": 2, "4": 1}  # pairs per group: the split rule's edge cases


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
            save(root / "Images" / group / f"p{i}.png", rng.integers(0, 256, (*size, 3), dtype=np.uint8))
            save(root / "Masks" / group / f"p{i}.png", (rng.random(size) < 0.5).astype(np.uint8) * 255)
    return root


def tree(root):
    """{relative path: bytes} of every file under root."""
    return {p.relative_to(root): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def mtimes(root):
    return {p: p.stat().st_mtime_ns for p in root.rglob("*") if p.is_file()}


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.reader(f))


def make_older(path, than):
    t = than.stat().st_mtime_ns - 10**9
    os.utime(path, ns=(t, t))


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
            assert image.startswith("Images/") and mask == "Masks/" + image[len("Images/"):]
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
    with pytest.raises(DataError, match=re.escape(f"train.csv row index 2: {lbls[2]}: no such file")):
        read_split(prepared, "train")


def test_prepared_demo_runs_through_the_dali_loader(tmp_path):
    make_demo_pngs(tmp_path / "demo", n_per_group=4, groups=2, size=(48, 40))
    root = prepare(str(tmp_path / "demo"))
    imgs, lbls = read_split(root, "train")
    assert len(imgs) == 6
    check_segmentation_files(imgs, lbls)
    batch = next(segment_iterator(fetch_dali_loader(imgs, lbls, batch_size=4, mode="train", size=(64, 64))))[0]
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
    assert tree(dst) == {**expected, leftover.relative_to(dst): b"half a file"}
    assert untouched.stat().st_mtime_ns == untouched_mtime
    assert ".partial" not in (dst / "csv_file" / "train.csv").read_text()


def test_changed_source_is_converted_again(tmp_path):
    src, dst = binary_root(tmp_path / "src"), tmp_path / "dst"
    png2numpy(src, dst)
    new_mask = np.zeros((12, 10), np.uint8)
    new_mask[:3] = 255
    mask_png = save(src / "Masks" / "2" / "p0.png", new_mask)
    os.utime(mask_png, ns=(mask_png.stat().st_mtime_ns + 10**9,) * 2)  # on coarse-clock file systems too
    assert png2numpy(src, dst) == 1
    np.testing.assert_array_equal(np.load(dst / "Masks" / "2" / "p0.npy")[..., 0], new_mask // 255)


def test_interrupted_run_leaves_no_split_and_no_partial_npy(tmp_path, monkeypatch):
    src, dst = binary_root(tmp_path / "src"), tmp_path / "dst"
    png2numpy(src, dst)
    make_csv_file_npy(dst)
    for npy in dst.rglob("*.npy"):  # older than every source: all is converted again
        os.utime(npy, ns=(0, 0))
    replace, renames = os.replace, []

    def interrupted_replace(tmp, path):
        renames.append(path)
        if len(renames) == 4:  # the temporary file is fully written, the rename not yet done
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
    assert png2numpy(src, dst) == 2 * sum(GROUPS.values()) - 3
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
    assert len(files) == 12 and files == tree(tmp_path / "b")
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
    with pytest.raises(DataError, match=re.escape(f"{src / 'Images' / '1' / 'p1.png'}: image has no mask")):
        png2numpy(src, tmp_path / "dst")


def test_mask_without_image(tmp_path):
    src = binary_root(tmp_path / "src", {"1": 2, "2": 1})
    (src / "Images" / "2" / "p0.png").unlink()
    with pytest.raises(DataError, match=re.escape(f"{src / 'Masks' / '2' / 'p0.png'}: mask has no image")):
        png2numpy(src, tmp_path / "dst")


def test_mask_size_differs_from_image(tmp_path):
    src = binary_root(tmp_path / "src", {"1": 2})
    mask = save(src / "Masks" / "1" / "p1.png", np.zeros((10, 12), np.uint8))
    with pytest.raises(DataError, match=re.escape(f"{mask}: mask is 10x12 but its image {src / 'Images' / '1' / 'p1.png'} is 12x10")):
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
    assert "12 pairs, train 7, valid 5" in out and "1: 3+2" in out and "24 .npy files written" in out


def test_command_line_demo_then_convert(tmp_path, capsys):
    main(["--demo", str(tmp_path / "png"), "--demo-per-group", "2", "--demo-size", "32"])
    assert "16 PNG files written" in capsys.readouterr().out
    main(["--demo", str(tmp_path / "png"), str(tmp_path / "npy"), "--demo-per-group", "2", "--demo-size", "32"])
    out = capsys.readouterr().out.splitlines()
    assert "0 PNG files written" in out[0] and "8 pairs, train 4, valid 4" in out[1]


def test_command_line_bad_input_prints_one_error_line(tmp_path):
    result = subprocess.run([sys.executable, "data_processing.py", str(tmp_path / "nope"), str(tmp_path / "dst")],
                            capture_output=True, text=True, cwd=os.path.dirname(os.path.abspath(__file__)))
    assert result.returncode == 2
    assert result.stderr == f"error: {tmp_path / 'nope' / 'Images'}: no such directory " \
                            f"(expected {tmp_path / 'nope' / 'Images'}/<group>/<name>.png)\n"
