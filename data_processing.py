"""Data preparation: segmentation PNG image/mask pairs -> ``.npy`` pairs and a train/valid split;
the built-in demo sets of both trainers (synthetic nails, and shapes in an ImageFolder tree).

A PNG root holds ``Images/<group>/<name>.png`` and ``Masks/<group>/<name>.png``; an image and its
mask pair by name within a group (groups are subfolders such as 1..4). Converting it writes a
prepared root, the input of ``pipelines.fetch_dali_loader``:

    DST/Images/<group>/<name>.npy   (H, W, 3) uint8 RGB (RGBA and greyscale images become RGB;
                                    16-bit greyscale becomes 8-bit as DALI reads it: round(x / 257))
    DST/Masks/<group>/<name>.npy    (H, W, 1) uint8 class indices
    DST/csv_file/train.csv          index,images,masks  (paths relative to DST)
    DST/csv_file/valid.csv

Masks: a palette PNG (mode P) gives its palette indices as classes. A greyscale PNG (or an RGB one
with R == G == B everywhere) whose values are all in {0, 255} is binary and becomes 0/1; any other
greyscale values are kept as class indices. With ``ignore_index`` 255 (``--ignore-index 255``: 255
marks pixels to leave out, as in VOC, Cityscapes and ADE20K) 255 is never read as binary: every
mask keeps its values, so a mask holding only background and ignored pixels does not turn its
ignored pixels into class 1. A colour RGB mask is an error: save it as a palette or class-index
PNG, so that classes are indices and not colours.

The prepared root mirrors its PNG root. Beside each ``.npy`` a hidden record
(``.<name>.npy.source``) holds the size and SHA-256 of the PNG bytes it was converted from; a re-run
hashes every PNG and converts again only those whose record does not match (or whose ``.npy`` is
incomplete), so a replaced PNG is found whatever its timestamp. A ``.npy`` with a record whose PNG
is gone is removed, and its pair leaves the split; a ``.npy`` without a record is not ours to
delete, so one without a PNG is an error. A CSV is rewritten only when its text changes. Every file
is written to a temporary name in its folder and then renamed, so an interrupted run leaves no
half-written ``.npy`` or ``.csv`` under the final name (and the next run removes its temporary
files). The CSVs come last (and are removed before any ``.npy`` changes), so a root with both
``csv_file/train.csv`` and ``csv_file/valid.csv`` is complete.

Runs at once on one root (two trainers started together, torchrun ranks) take turns on a lock file,
``.data_processing.lock``, in the root they write: the later run waits, then finds the work done.
The lock is ``fcntl.flock`` (Linux, macOS); across nodes it needs a shared file system that passes
flock locks between them (Linux NFS clients do).

    python data_processing.py data/nails_png data/nails                  # convert + split
    python data_processing.py data/nails_png data/nails --valid-fraction 0.25 --seed 1
    python data_processing.py --demo data/demo_png                       # write the demo PNG set
    python data_processing.py --demo data/demo_png data/demo             # ... converted + split

    from data_processing import prepare
    from data_sources import read_split
    root = prepare("data/demo_png")       # a PNG root is prepared into data/demo_png/npy
    imgs, lbls = read_split(root, "train")

Checking and converting a root that takes minutes prints a progress line on stderr every few
seconds; stdout has only the summary line.

Bad input raises ``data_sources.DataError`` naming the offending path; on the command line it is
printed as ``error: <message>`` and the exit status is 2.
"""

import argparse
import contextlib
import csv
import fcntl
import functools
import hashlib
import io
import json
import os
import random
import re
import shutil
import sys
import tempfile
from collections import defaultdict

import flags

# Demo defaults: 160 pairs of 256x256 are quick to write and to convert on a CPU, and a small
# network trained at 64x64 or 128x128 separates these nails from skin within about a minute.
DEMO_PER_GROUP = 40
DEMO_GROUPS = 4
DEMO_SIZE = (256, 256)
# What --demo-size and --demo-per-group may ask for: a 4096-pixel demo image takes 48 MB to draw,
# and 10,000 pairs a group are 80,000 PNG files; no typo gets to allocate more.
DEMO_SIZES = (16, 4096)
DEMO_MAX_PER_GROUP = 10_000


# ------------------------------------------------------------------------------------------
# command line: the flags, read before the imports below load DALI
# ------------------------------------------------------------------------------------------


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description="Convert PNG image/mask pairs to .npy pairs and a train/valid split."
    )
    parser.add_argument(
        "src",
        metavar="SRC",
        help="PNG root: SRC/Images/<group>/<name>.png, SRC/Masks/<group>/<name>.png",
    )
    parser.add_argument(
        "dst",
        metavar="DST",
        nargs="?",
        help="prepared root to write (Images/, Masks/, csv_file/); may be left out with --demo",
    )
    parser.add_argument(
        "--valid-fraction",
        type=float,
        default=0.2,
        help="share of each group's pairs that goes to valid.csv (default: %(default)s)",
    )
    parser.add_argument(
        "--seed", type=int, default=42, help="seed of the train/valid split (default: %(default)s)"
    )
    parser.add_argument(
        "--ignore-index",
        type=int,
        help="mask value of pixels to leave out; 255 keeps 255 in every mask, never read as the "
        "foreground of a binary 0/255 mask",
    )
    parser.add_argument(
        "--demo", action="store_true", help="first write the synthetic demo PNG set into SRC"
    )
    parser.add_argument(
        "--demo-per-group",
        type=flags.number(
            int, f"in [1, {DEMO_MAX_PER_GROUP}]", lambda v: 1 <= v <= DEMO_MAX_PER_GROUP
        ),
        default=DEMO_PER_GROUP,
        help=f"demo pairs in each of its {DEMO_GROUPS} groups (default: %(default)s)",
    )
    parser.add_argument(
        "--demo-size",
        type=flags.number(
            int, "in [%d, %d]" % DEMO_SIZES, lambda v: DEMO_SIZES[0] <= v <= DEMO_SIZES[1]
        ),
        default=DEMO_SIZE[0],
        help="side of the square demo images in pixels (default: %(default)s)",
    )
    args = parser.parse_args(argv)
    if args.dst is None and not args.demo:
        parser.error("DST is required unless --demo is given")
    if not 0 < args.valid_fraction < 1:
        parser.error(
            f"--valid-fraction must be between 0 and 1 (exclusive), got {args.valid_fraction}"
        )
    return args


if __name__ == "__main__":
    parse_args()  # --help and a bad flag answer here, before DALI (through data_sources) loads

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

from data_sources import CSV_HEADER, DataError
from outputs import atomic_open, atomic_temp_pattern, progress

SPLITS = ("train", "valid")
# Where prepare() puts the .npy pairs of a PNG root: inside it, so no write access to its
# parent is needed and the data stays together.
PREPARED_SUBDIR = "npy"
LOCK_NAME = ".data_processing.lock"
# The temporary names of outputs.atomic_open; one found while holding the lock is a killed
# run's.
LEFTOVER = re.compile(atomic_temp_pattern(".+"))

SKIN_TONES = [(241, 194, 167), (224, 172, 140), (198, 134, 102), (160, 105, 75), (250, 214, 185)]
NAIL_COLOURS = [
    (232, 118, 150),
    (250, 165, 185),
    (205, 35, 60),
    (150, 15, 35),
    (222, 188, 160),
    (243, 203, 192),
    (120, 25, 60),
]


# ------------------------------------------------------------------------------------------
# files
# ------------------------------------------------------------------------------------------


def _list_files(folder, ext):
    """{(group, stem): path} of the files ending in ``ext`` under ``folder``; group is the
    subfolder."""
    found = {}
    for dirpath, dirnames, names in os.walk(folder, followlinks=True):
        dirnames.sort()
        group = os.path.relpath(dirpath, folder).replace(os.sep, "/")
        group = "" if group == "." else group
        for name in sorted(names):
            stem, name_ext = os.path.splitext(name)
            # Hidden files are skipped: macOS "._<name>.png" resource forks are not images, and
            # our own temporary files start with a dot.
            if name_ext.lower() != ext or name.startswith("."):
                continue
            path = os.path.join(dirpath, name)
            if (group, stem) in found:
                raise DataError(
                    f"{path}: same name as {found[group, stem]} "
                    "(names must be unique within a group)"
                )
            found[group, stem] = path
    return found


def _find_pairs(root, ext):
    """Sorted (group, stem, image path, mask path) of ``root/Images`` and ``root/Masks``."""
    files = {}
    for kind in ("Images", "Masks"):
        folder = os.path.join(root, kind)
        if not os.path.isdir(folder):
            raise DataError(f"{folder}: no such directory (expected {folder}/<group>/<name>{ext})")
        files[kind] = _list_files(folder, ext)
        if not files[kind]:
            raise DataError(
                f"{folder}: no {ext} files in it (expected {folder}/<group>/<name>{ext})"
            )
    for kind, other, role in (
        ("Images", "Masks", "image has no mask"),
        ("Masks", "Images", "mask has no image"),
    ):
        for group, stem in sorted(files[kind].keys() - files[other].keys()):
            expected = os.path.join(root, other, group, stem + ext)
            raise DataError(f"{files[kind][group, stem]}: {role} (expected {expected})")
    return [
        (group, stem, files["Images"][group, stem], files["Masks"][group, stem])
        for group, stem in sorted(files["Images"])
    ]


def _write_atomic(path, data):
    """Write ``data`` to ``path`` through a temporary file in the same folder and a rename.

    The rename is atomic, so ``path`` holds either its old content or all of ``data``, never a
    part, whenever the process is stopped.
    """
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with atomic_open(path) as f:
        f.write(data)


def _write_if_changed(path, data):
    """``_write_atomic`` unless ``path`` already holds ``data``; True when it wrote."""
    try:
        with open(path, "rb") as f:
            if f.read() == data:
                return False
    except FileNotFoundError:
        pass
    _write_atomic(path, data)
    return True


def _npy_bytes(array):
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


@contextlib.contextmanager
def _locked(folder, mode=fcntl.LOCK_EX):
    """Hold ``folder``'s lock file: one process at a time writes under ``folder``; readers
    (``mode`` LOCK_SH) share it with each other, not with a writer."""
    os.makedirs(folder, exist_ok=True)
    try:
        # Read-only is enough for flock, so a lock file another user created serves as well.
        fd = os.open(os.path.join(folder, LOCK_NAME), os.O_RDONLY | os.O_CREAT, 0o666)
    except PermissionError:
        # Where this process may not write (a shared data set someone else prepared), it writes
        # nothing, so it needs no turn; a write that is due fails with its own error.
        yield
        return
    try:
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"{folder}: waiting for another process writing there to finish", file=sys.stderr)
            fcntl.flock(fd, mode)
        yield
    finally:
        os.close(fd)


def _remove_leftovers(root):
    """Remove the temporary files of killed runs under ``root``'s Images/, Masks/ and csv_file/.

    Only while holding ``root``'s lock: every writer holds it, so none of them is in use.
    """
    for sub in ("Images", "Masks", "csv_file"):
        for dirpath, _, names in os.walk(os.path.join(root, sub)):
            for name in names:
                if LEFTOVER.fullmatch(name):
                    os.remove(os.path.join(dirpath, name))


def _remove(path):
    with contextlib.suppress(FileNotFoundError):
        os.remove(path)


# ------------------------------------------------------------------------------------------
# PNG -> npy
# ------------------------------------------------------------------------------------------


def _png_size(path):
    """(height, width) from the PNG header, without decoding the pixels."""
    try:
        with Image.open(path) as img:
            return img.height, img.width
    except (OSError, SyntaxError, ValueError) as e:
        raise DataError(f"{path}: not a readable PNG ({e})") from None


def _load_png(path, data):
    """The PNG ``data`` read from ``path``, decoded."""
    try:
        with Image.open(io.BytesIO(data)) as img:
            img.load()
            return img
    except (OSError, SyntaxError, ValueError) as e:
        raise DataError(f"{path}: not a readable PNG ({e})") from None


def eight_bits(image):
    """A PIL ``image`` of 16-bit greyscale (how a 16-bit PNG opens: mode I;16, or I) in 8 bits as
    DALI's decoder reads it, round(x / 257); PIL's convert("RGB") would clip it at 255. Other modes
    as they are (PIL itself reads a 16-bit colour PNG as 8-bit RGB, x >> 8)."""
    if not image.mode.startswith("I"):
        return image
    return Image.fromarray(
        ((np.asarray(image, np.int64) + 128) // 257).clip(0, 255).astype(np.uint8)
    )


def _image_array(path, data):
    """(H, W, 3) uint8 RGB; alpha is dropped, greyscale and palette images are expanded, 16-bit
    greyscale scaled to 8 bits as DALI decodes it."""
    return np.asarray(eight_bits(_load_png(path, data)).convert("RGB"))


def _mask_array(path, data, ignore_index=None):
    """(H, W, 1) uint8 class indices, by the rules of the module docstring."""
    img = _load_png(path, data)
    if img.mode == "P":
        return np.asarray(img)[..., None]
    if img.mode in ("RGB", "RGBA"):
        rgb = np.asarray(img)[..., :3]
        if not ((rgb[..., 0] == rgb[..., 1]).all() and (rgb[..., 1] == rgb[..., 2]).all()):
            raise DataError(
                f"{path}: colour RGB mask (R, G, B differ); save it as a palette (mode P) or "
                f"greyscale class-index PNG, so that each class is an index, not a colour"
            )
        values = rgb[..., 0]
    elif img.mode in ("1", "LA"):
        values = np.asarray(img.convert("L"))
    elif img.mode in ("L", "I", "I;16"):
        values = np.asarray(img)
    else:
        raise DataError(
            f"{path}: mask of PNG mode {img.mode} "
            "(expected greyscale L, palette P, or RGB with R == G == B)"
        )
    present = np.unique(values)
    if set(present.tolist()) <= {0, 255} and ignore_index != 255:
        values = values == 255
    elif present[0] < 0 or present[-1] > 255:
        raise DataError(
            f"{path}: mask values {present[0]}..{present[-1]} do not fit uint8 class indices "
            "(expected 0..255)"
        )
    return values.astype(np.uint8)[..., None]


def _record_path(npy):
    """The record of the PNG that ``npy`` was converted from: a hidden file beside it."""
    folder, name = os.path.split(npy)
    return os.path.join(folder, f".{name}.source")


def _sha256(f):
    """The hex SHA-256 of the rest of the open file ``f``, read 1 MiB at a time
    (``hashlib.file_digest`` is 3.11+)."""
    digest = hashlib.sha256()
    for chunk in iter(lambda: f.read(1 << 20), b""):
        digest.update(chunk)
    return digest.hexdigest()


def _is_current(npy, png, shape, rule=None):
    """Whether ``npy`` is a complete uint8 array of ``shape`` converted from ``png`` as it is now,
    by ``rule`` (the record's, None for the default conversion).

    The content decides, not the timestamp: a replaced PNG can carry any modification time
    (``cp -p``, ``rsync -t`` and ``tar`` keep the old file's), but not the old bytes.
    """
    try:
        with open(_record_path(npy)) as f:
            record = json.load(f)
        with open(png, "rb") as f:
            # The size first: a PNG of another size is not read to be hashed.
            if record["size"] != os.fstat(f.fileno()).st_size:
                return False
            if record["sha256"] != _sha256(f) or record.get("rule") != rule:
                return False
        # The memory map checks that the file holds all the data its header announces.
        array = np.load(npy, mmap_mode="r")
    except (OSError, ValueError, EOFError, KeyError, TypeError):
        return False
    return array.shape == shape and array.dtype == np.uint8


def _convert(png, npy, to_array, rule):
    """Write ``npy`` from ``png`` by ``to_array``, then its record of the very bytes that were
    converted and the ``rule`` they were converted by."""
    with open(png, "rb") as f:
        data = f.read()
    array = to_array(png, data)
    record = _record_path(npy)
    # The old record goes first: a run stopped between the two renames leaves a .npy without a
    # record, which the next run converts again, never a record that vouches for the wrong one.
    _remove(record)
    _write_atomic(npy, _npy_bytes(array))
    written = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    if rule:
        written["rule"] = rule
    _write_atomic(record, json.dumps(written).encode())


def _outputs(dst_root):
    """The ``.npy`` paths under ``dst_root``'s Images/ and Masks/: of the files, and of the
    records."""
    found = set()
    for kind in ("Images", "Masks"):
        for dirpath, _, names in os.walk(os.path.join(dst_root, kind)):
            for name in names:
                if name.endswith(".npy") and not name.startswith("."):
                    found.add(os.path.join(dirpath, name))
                elif name.startswith(".") and name.endswith(".npy.source"):
                    found.add(os.path.join(dirpath, name[1 : -len(".source")]))
    return found


def _plan(pairs, src_root, dst_root, ignore_index=None):
    """(todo, stale) of ``png2numpy``: the (png, npy, to_array, rule) to convert, and the ``.npy``
    to remove."""
    wanted, todo = set(), []
    # Masks converted under another rule for 255 are converted again.
    mask_rule = "keep 255" if ignore_index == 255 else None
    to_mask = functools.partial(_mask_array, ignore_index=ignore_index)
    for group, stem, image_png, mask_png in progress(pairs, len(pairs), "checking PNG pairs"):
        image_size, mask_size = _png_size(image_png), _png_size(mask_png)
        if image_size != mask_size:
            raise DataError(
                f"{mask_png}: mask is {mask_size[0]}x{mask_size[1]} but its image {image_png} is "
                f"{image_size[0]}x{image_size[1]} (height x width must match)"
            )
        for kind, png, to_array, channels, rule in (
            ("Images", image_png, _image_array, 3, None),
            ("Masks", mask_png, to_mask, 1, mask_rule),
        ):
            npy = os.path.join(dst_root, kind, group, stem + ".npy")
            wanted.add(npy)
            if not _is_current(npy, png, (*image_size, channels), rule):
                todo.append((png, npy, to_array, rule))
    stale = sorted(_outputs(dst_root) - wanted)
    for npy in stale:
        if not os.path.exists(_record_path(npy)):
            png = os.path.join(
                src_root, os.path.splitext(os.path.relpath(npy, dst_root))[0] + ".png"
            )
            raise DataError(
                f"{npy}: not written by data_processing.py and there is no {png}; remove it "
                f"(a prepared root mirrors its PNG root)"
            )
    return todo, stale


def png2numpy(src_root, dst_root, ignore_index=None):
    """Mirror the PNG pairs of ``src_root`` as ``.npy`` pairs under ``dst_root``; returns the
    number of ``.npy`` files written (0 when everything was up to date). ``ignore_index`` 255 keeps
    255 in every mask (the module docstring).

    A ``.npy`` this function wrote whose PNG is gone is removed, with its record; a ``.npy``
    without a record and without a PNG is an error, raised before anything changes.
    """
    pairs = _find_pairs(src_root, ".png")
    # Checking only reads, so runs at once (torchrun ranks) check side by side and take turns
    # only when there is work, which is planned again then: another run may have done it.
    with _locked(dst_root, fcntl.LOCK_SH):
        todo, stale = _plan(pairs, src_root, dst_root, ignore_index)
    if not todo and not stale:
        return 0
    with _locked(dst_root):
        _remove_leftovers(dst_root)
        todo, stale = _plan(pairs, src_root, dst_root, ignore_index)
        if todo or stale:
            # The split marks a complete root, so it goes before any .npy changes.
            for split in SPLITS:
                _remove(os.path.join(dst_root, "csv_file", f"{split}.csv"))
        for npy in stale:
            # The .npy before its record: a run stopped in between leaves the record, so the next
            # run still knows the .npy is ours to remove.
            _remove(npy)
            _remove(_record_path(npy))
            with contextlib.suppress(OSError):
                os.rmdir(os.path.dirname(npy))  # only if that emptied the group's folder
        for png, npy, to_array, rule in progress(todo, len(todo), "converting PNGs to .npy"):
            _convert(png, npy, to_array, rule)
    return len(todo)


# ------------------------------------------------------------------------------------------
# train/valid split
# ------------------------------------------------------------------------------------------


def make_csv_file_npy(dst_root, valid_fraction=0.2, seed=42):
    """Write ``dst_root/csv_file/{train,valid}.csv`` from the ``.npy`` pairs under ``dst_root``.

    Each group is split on its own: round(valid_fraction * n) of its n pairs (Python's round,
    ties to even) go to valid, at least 1 and at most n - 1 when n >= 2 (a group of one pair
    goes to train). Rows are sorted by group, then name. Returns {group: (n_train, n_valid)}.
    """
    if not 0 < valid_fraction < 1:
        raise ValueError(
            f"valid_fraction must be between 0 and 1 (exclusive), got {valid_fraction}"
        )
    with _locked(dst_root):
        groups = defaultdict(list)
        for group, _, image, mask in _find_pairs(dst_root, ".npy"):
            groups[group].append(
                tuple(os.path.relpath(p, dst_root).replace(os.sep, "/") for p in (image, mask))
            )
        rows = {split: [] for split in SPLITS}
        counts = {}
        for group, pairs in groups.items():
            n = len(pairs)
            n_valid = min(max(round(valid_fraction * n), 1), n - 1) if n >= 2 else 0
            # Seeded per group, so adding or removing a group leaves the split of the others as it
            # was.
            valid = set(random.Random(f"{seed}/{group}").sample(range(n), n_valid))
            for k, pair in enumerate(pairs):
                rows["valid" if k in valid else "train"].append(pair)
            counts[group] = (n - n_valid, n_valid)
        for split in SPLITS:
            text = io.StringIO()
            writer = csv.writer(text, lineterminator="\n")
            writer.writerow(CSV_HEADER)
            writer.writerows((i, image, mask) for i, (image, mask) in enumerate(rows[split]))
            _write_if_changed(
                os.path.join(dst_root, "csv_file", f"{split}.csv"), text.getvalue().encode()
            )
    return counts


def prepare(root, valid_fraction=0.2, seed=42, demo=False, ignore_index=None):
    """The prepared root for ``root``, which is one of:

    - a prepared root (has ``csv_file/train.csv`` and ``csv_file/valid.csv``): returned as is;
    - a PNG root (has ``Images/`` and ``Masks/``): converted and split into ``root/npy``, which
      is returned. Running it again only redoes what changed; ``ignore_index`` as ``png2numpy``'s.

    With ``demo``, the synthetic demo PNG set is written into ``root`` first (``make_demo_pngs``).
    """
    if demo:
        make_demo_pngs(root)
    if all(os.path.isfile(os.path.join(root, "csv_file", f"{split}.csv")) for split in SPLITS):
        return root
    if not any(os.path.isdir(os.path.join(root, kind)) for kind in ("Images", "Masks")):
        raise DataError(
            f"{root}: neither a prepared root (csv_file/train.csv, csv_file/valid.csv) "
            f"nor a PNG root (Images/<group>/<name>.png, Masks/<group>/<name>.png)"
        )
    prepared = os.path.join(root, PREPARED_SUBDIR)
    png2numpy(root, prepared, ignore_index)
    make_csv_file_npy(prepared, valid_fraction, seed)
    return prepared


# ------------------------------------------------------------------------------------------
# demo data
# ------------------------------------------------------------------------------------------


def _superellipse(centre, a, b, angle, power, points=48):
    """Outline of |x/a|^p + |y/b|^p = 1 rotated by ``angle``: p=2 an ellipse, p>=4 a rounded
    rectangle."""
    t = np.linspace(0, 2 * np.pi, points, endpoint=False)
    x = a * np.sign(np.cos(t)) * np.abs(np.cos(t)) ** (2 / power)
    y = b * np.sign(np.sin(t)) * np.abs(np.sin(t)) ** (2 / power)
    c, s = np.cos(angle), np.sin(angle)
    return list(zip((centre[0] + x * c - y * s).tolist(), (centre[1] + x * s + y * c).tolist()))


def _colour(rgb):
    return tuple(int(v) for v in np.clip(rgb, 0, 255))


def _demo_skin(rng, height, width):
    """(RGB image, its tone): a skin tone in blotches, lit from one side, with sensor noise."""
    tone = np.array(SKIN_TONES[rng.integers(len(SKIN_TONES))], float) + rng.normal(0, 8, 3)
    blotches = rng.uniform(0.85, 1.15, (6, 6)).astype(np.float32)
    smooth = np.asarray(Image.fromarray(blotches).resize((width, height), Image.BICUBIC))
    yy, xx = np.mgrid[0:height, 0:width] / min(height, width)
    light = rng.uniform(0, 2 * np.pi)
    gradient = 1 + rng.uniform(0.1, 0.3) * (np.cos(light) * xx + np.sin(light) * yy - 0.5)
    skin = tone * (smooth * gradient)[..., None] + rng.normal(0, 4, (height, width, 3))
    return Image.fromarray(np.clip(skin, 0, 255).astype(np.uint8)), tone


def _demo_scene(rng, height, width):
    """(RGB image, L mask 0/255): fingers on textured skin, a glossy painted nail at each tip."""
    side = min(height, width)
    image, tone = _demo_skin(rng, height, width)
    mask = Image.new("L", (width, height), 0)
    gloss = Image.new("L", (width, height), 0)
    draw, draw_mask, draw_gloss = ImageDraw.Draw(image), ImageDraw.Draw(mask), ImageDraw.Draw(gloss)

    def paint(outline, fill, is_nail):
        # Whatever a later shape covers is no longer nail, in the mask and in the gloss.
        draw.polygon(outline, fill=_colour(fill))
        draw_mask.polygon(outline, fill=255 if is_nail else 0)
        draw_gloss.polygon(outline, fill=0)

    for _ in range(rng.integers(1, 5)):
        finger_width = rng.uniform(0.10, 0.18) * side
        finger_length = rng.uniform(0.5, 1.0) * side
        angle = rng.uniform(0, 2 * np.pi)
        along = np.array([np.cos(angle), np.sin(angle)])
        across = np.array([-along[1], along[0]])
        # The tip stays inside the frame, so every nail (and the last one uncovered) is visible.
        tip = rng.uniform(0.15, 0.85, 2) * (width, height)
        finger = tip - along * finger_length / 2
        finger_tone = tone * rng.uniform(0.85, 1.1)
        # A shadow gives edges that are not nails, so the shape alone does not give nails away.
        shadow = finger + across * rng.uniform(-0.15, 0.15) * finger_width + 0.05 * finger_width
        paint(
            _superellipse(shadow, finger_length / 2, finger_width / 2, angle, 3),
            finger_tone * 0.7,
            False,
        )
        paint(
            _superellipse(finger, finger_length / 2, finger_width / 2, angle, 3), finger_tone, False
        )
        nail_length, nail_width = (
            finger_width * rng.uniform(0.8, 1.2),
            finger_width * rng.uniform(0.6, 0.8),
        )
        nail = tip - along * (nail_length / 2 + 0.08 * finger_width)
        nail_angle = angle + rng.normal(0, 0.1)
        nail_colour = np.array(NAIL_COLOURS[rng.integers(len(NAIL_COLOURS))]) + rng.normal(0, 12, 3)
        paint(
            _superellipse(nail, nail_length / 2, nail_width / 2, nail_angle, rng.uniform(2, 5)),
            nail_colour,
            True,
        )
        streak = nail + across * nail_width * rng.uniform(-0.25, 0.25)
        draw_gloss.polygon(
            _superellipse(streak, nail_length * 0.3, nail_width * 0.1, nail_angle, 2),
            fill=int(rng.integers(90, 170)),
        )
    gloss = gloss.filter(ImageFilter.GaussianBlur(side / 150))
    image = Image.composite(Image.new("RGB", image.size, (255, 255, 255)), image, gloss)
    return image.filter(ImageFilter.GaussianBlur(0.6)), mask


def demo_pair(group, i, size=DEMO_SIZE, seed=0):
    """Demo pair ``i`` of ``group``: {its image's and mask's paths under the root: PNG bytes}."""
    # One generator per image: each scene depends only on (seed, group, i).
    image, mask = _demo_scene(np.random.default_rng([seed, group, i]), *size)
    pngs = {}
    for kind, picture in (("Images", image), ("Masks", mask)):
        buffer = io.BytesIO()
        # zlib level 1: a third of the default's encoding time for a fifth more bytes.
        picture.save(buffer, "PNG", compress_level=1)
        pngs[os.path.join(kind, str(group), f"{i:03d}.png")] = buffer.getvalue()
    return pngs


def make_demo_pngs(root, n_per_group=DEMO_PER_GROUP, groups=DEMO_GROUPS, size=DEMO_SIZE, seed=0):
    """Write a synthetic nail-segmentation PNG root:
    ``root/{Images,Masks}/<1..groups>/<000..>.png``.

    Images are RGB of ``size`` (height, width); masks are binary 0/255 greyscale PNGs of the nails.
    The same arguments give byte-identical files, and a file that already holds them is not
    rewritten. Returns the number of PNG files written. Files of an earlier, larger demo set in
    ``root`` are left alone. Runs at once on one ``root`` take turns to write: the later one finds
    the files written and writes none.
    """
    files = {
        os.path.join(root, name): data
        for group in range(1, groups + 1)
        for i in range(n_per_group)
        for name, data in demo_pair(group, i, size, seed).items()
    }
    # Drawn before the lock is taken, so that runs at once (torchrun ranks) draw in parallel.
    with _locked(root):
        _remove_leftovers(root)
        return sum(_write_if_changed(path, data) for path, data in files.items())


# the built-in classification demo set (train_classify.py --data demo)
# -----------------------------------

DEMO_CLASSES = ["circle", "square", "triangle", "ring", "cross", "stripes"]


def demo_image(k, rng):
    """Class ``k``'s shape in its own hue band, at a random place, size and angle, on a noisy colour
    gradient."""
    h, w = (int(v) for v in rng.integers(80, 113, size=2))
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float64)
    background = (
        rng.integers(0, 256, 3)
        + rng.normal(0, 12, (h, w, 3))
        + (xx[..., None] * rng.uniform(-80, 80, 3) + yy[..., None] * rng.uniform(-80, 80, 3))
        / max(h, w)
    )
    hue = int(255 * ((k / len(DEMO_CLASSES) + rng.uniform(-0.04, 0.04)) % 1))
    hsv = Image.new("HSV", (1, 1), (hue, int(rng.integers(170, 256)), int(rng.integers(170, 256))))
    r, angle = rng.uniform(0.25, 0.4) * min(h, w), rng.uniform(0, 2 * np.pi)
    x, y = xx - rng.uniform(r, w - r), yy - rng.uniform(r, h - r)
    # turned with the shape
    u, v = (
        x * np.cos(angle) + y * np.sin(angle),
        y * np.cos(angle) - x * np.sin(angle),
    )
    d, edge = np.hypot(u, v), np.maximum(abs(u), abs(v))
    inside = {
        "circle": d < r,
        "ring": abs(d - 0.83 * r) < r / 6,
        "square": edge < 0.71 * r,
        "triangle": (v < r / 2) & (np.sqrt(3) * abs(u) - v < r),
        "cross": (np.minimum(abs(u), abs(v)) < r / 4) & (edge < r),
        "stripes": np.sin(u * 2 * np.pi / rng.uniform(8, 14)) > 0,
    }[DEMO_CLASSES[k]]
    image = np.where(inside[..., None], np.array(hsv.convert("RGB").getpixel((0, 0))), background)
    return Image.fromarray(np.clip(image, 0, 255).astype(np.uint8))


def make_demo_images(root, train_per_class=120, val_per_class=30, seed=0):
    """The demo set: JPEGs in ImageFolder layout (``root/{train,val}/<class>/<n>.jpg``), the same
    bytes every time. Built in a temporary folder and renamed into place, so that an interrupted
    build is never used; of two builds at once, the first rename wins and the other uses that set.
    """
    if not os.path.isdir(root):
        # A folder of its own: two nodes building into one shared folder may run processes of one
        # id, each in its own container.
        os.makedirs(os.path.dirname(os.path.abspath(root)), exist_ok=True)
        tmp = tempfile.mkdtemp(prefix=f"{os.path.basename(root)}.tmp-", dir=os.path.dirname(root))
        for s, (split, count) in enumerate((("train", train_per_class), ("val", val_per_class))):
            for k, name in enumerate(DEMO_CLASSES):
                os.makedirs(os.path.join(tmp, split, name))
                for i in range(count):
                    demo_image(k, np.random.default_rng([seed, s, k, i])).save(
                        os.path.join(tmp, split, name, f"{i:04d}.jpg"), quality=90
                    )
        try:
            os.rename(tmp, root)
        except OSError:  # another build renamed its copy first: the same bytes, so use it
            shutil.rmtree(tmp)
            if not os.path.isdir(root):
                raise
    return root


# ------------------------------------------------------------------------------------------
# command line
# ------------------------------------------------------------------------------------------


def main(argv=None):
    args = parse_args(argv)
    try:
        if args.demo:
            written = make_demo_pngs(
                args.src, args.demo_per_group, size=(args.demo_size, args.demo_size)
            )
            print(
                f"{args.src}: demo set of {DEMO_GROUPS} groups x {args.demo_per_group} pairs at "
                f"{args.demo_size}x{args.demo_size} ({written} PNG files written)"
            )
        if args.dst is not None:
            written = png2numpy(args.src, args.dst, args.ignore_index)
            counts = make_csv_file_npy(args.dst, args.valid_fraction, args.seed)
            n_train, n_valid = (sum(c[k] for c in counts.values()) for k in (0, 1))
            groups = ", ".join(f"{g or '.'}: {t}+{v}" for g, (t, v) in counts.items())
            print(
                f"{args.dst}: {n_train + n_valid} pairs, train {n_train}, valid {n_valid} "
                f"(per group train+valid: {groups}); {written} .npy files written"
            )
    except (DataError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:  # every file is written whole or not at all
        print("interrupted: what was written is whole; run it again to finish", file=sys.stderr)
        sys.exit(130)


if __name__ == "__main__":
    main()
