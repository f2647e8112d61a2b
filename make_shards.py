"""ImageFolder -> TFRecord or WebDataset shards that ``pipelines.py`` (and so the trainers) read.

SRC holds ImageFolder trees ``train/<class>/<image>`` and ``val/<class>/<image>``. DST gets

    DST/claim.json                       written first: the source and settings DST is being written for, and
                                         a digest of what each shard must hold
    DST/train/train-00000-of-00004 ...   --format tfrecord: TensorFlow's file names; tf.train.Example
                                         records with features image/encoded, image/class/label
    DST/train/train-000000.tar ...       --format wds: WebDataset tars of <key>.<ext> (the image) +
                                         <key>.cls (the class index as ASCII digits)
    DST/train/<shard>.idx(.json)         DALI's index of each shard and its summary (data_sources.shard_index)
    DST/train/classes.txt                train's class names, one a line, in index order
    DST/val/...                          the same for val, labelled by train's class names
    DST/manifest.json                    written last: the set is complete
    DST/.lock                            held while a run writes DST: another run at once is refused

The shards hold the original encoded files, byte for byte, in an order shuffled across classes with
``--seed``: DALI's shard readers shuffle only within a window, so the written order is what keeps a
batch from holding one class. With ``--max-size S``, an image whose shorter side exceeds S goes in
as a JPEG (``--quality``) resized to that shorter side instead: a smaller, lower-resolution copy.

    python make_shards.py data/imagenet data/imagenet-tfrecord --format tfrecord
    python make_shards.py data/imagenet data/imagenet-wds --format wds --shard-size 2000 --seed 1
    python make_shards.py data/imagenet data/imagenet-256 --format wds --max-size 256 --workers 16
    python train_classify.py --data data/imagenet-wds ...

``--workers`` processes write whole shards at once; the bytes do not depend on how many. Every file
is written under a temporary name and renamed, so a killed run leaves no half-written file under a
final name. claim.json, written before any shard, records the settings and a digest of each shard's
images (files, labels, sizes, modification times): running the same command again keeps every shard
it vouches for and writes the rest. A DST holding shards of another source or other settings is
refused unless ``--overwrite``, which replaces them; files of names this script does not write are
never deleted. Bad input prints one ``error:`` line and exits with status 2.
"""

import argparse
import contextlib
import fcntl
import functools
import hashlib
import io
import json
import multiprocessing
import os
import random
import re
import struct
import sys
import tarfile
from concurrent.futures import ProcessPoolExecutor
from types import SimpleNamespace


def int_in(low, high=None):
    """An argparse type: an int of at least ``low`` (and at most ``high``), else an error that says
    so."""

    def parse(text):
        value = int(text)  # a ValueError is argparse's "invalid int value: 'x'"
        if value < low or high is not None and value > high:
            raise argparse.ArgumentTypeError(
                f"must be {f'in [{low}, {high}]' if high else f'at least {low}'}, got {text}"
            )
        return value

    parse.__name__ = "int"
    return parse


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description="Convert an ImageFolder root (train/, val/) into TFRecord or "
        "WebDataset shards with DALI indexes."
    )
    parser.add_argument(
        "src",
        metavar="SRC",
        help="ImageFolder root: SRC/train/<class>/<image>, SRC/val/<class>/<image>",
    )
    parser.add_argument(
        "dst", metavar="DST", help="output root: DST/train/, DST/val/ and DST/manifest.json"
    )
    parser.add_argument(
        "--format",
        required=True,
        choices=["tfrecord", "wds"],
        help="tfrecord: TensorFlow's tf.train.Example files; wds: WebDataset tars",
    )
    parser.add_argument(
        "--shard-size", type=int_in(1), default=1024, help="images per shard (default: %(default)s)"
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="seed of the write-time shuffle (default: %(default)s)"
    )
    parser.add_argument(
        "--max-size",
        type=int_in(1),
        metavar="S",
        help="re-encode images whose shorter side exceeds S as JPEGs of shorter side S (default: "
        "none, every image copied byte for byte)",
    )
    parser.add_argument(
        "--quality",
        type=int_in(1, 100),
        default=90,
        help="JPEG quality of the images --max-size re-encodes (default: %(default)s)",
    )
    parser.add_argument(
        "--workers",
        type=int_in(1),
        default=len(os.sched_getaffinity(0)),
        help="processes writing shards (default: the CPUs this process may use, %(default)s)",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace this script's files in DST when they are of another source, "
        "other settings or another writer (files of other names stay an error)",
    )
    return parser.parse_args(argv)


if __name__ == "__main__":
    parse_args()  # --help and a bad flag answer here, before DALI (through data_sources) loads

from PIL import Image

from data_processing import eight_bits
from data_sources import DataError, check_image_heads, list_image_folder, masked_crc, shard_index
from outputs import atomic_open, atomic_temp_pattern, progress

SPLITS = ("train", "val")


def _varint(value):
    """``value`` as a protobuf varint."""
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _field(number, payload):
    """A length-delimited protobuf field."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def tf_example(image, label):
    """A serialized tf.train.Example of the encoded ``image`` and its int64 ``label``."""
    features = {
        "image/encoded": _field(1, _field(1, image)),  # Feature.bytes_list.value
        "image/class/label": _field(
            3, _field(1, _varint(label))
        ),  # Feature.int64_list.value, packed
    }
    # Example.features = Features, whose field 1 is a map: entries of key = 1, value = 2
    return _field(
        1, b"".join(_field(1, _field(1, k.encode()) + _field(2, v)) for k, v in features.items())
    )


def encoded(path, max_size=None, quality=90):
    """(bytes, extension) of an image as it goes into a shard: the file itself or, when its shorter
    side exceeds ``max_size``, a JPEG at ``quality`` resized to that shorter side."""
    with open(path, "rb") as f:
        data = f.read()
    if max_size is not None:
        try:
            with Image.open(io.BytesIO(data)) as image:  # reads the header only
                w, h = image.size
                if min(w, h) > max_size:
                    size = (
                        (max_size, round(h * max_size / w))
                        if w <= h
                        else (round(w * max_size / h), max_size)
                    )
                    # reducing_gap: a large shrink starts with a box reduction, faster and, per PIL,
                    # no worse
                    small = (
                        eight_bits(image)
                        .convert("RGB")
                        .resize(size, Image.Resampling.LANCZOS, reducing_gap=3.0)
                    )
                    out = io.BytesIO()
                    # the EXIF block as it was: DALI's decoder turns an image by its orientation tag
                    small.save(out, "JPEG", quality=quality, exif=image.info.get("exif", b""))
                    return out.getvalue(), ".jpg"
        except (OSError, Image.DecompressionBombError) as e:
            raise DataError(
                f"{path}: cannot be decoded to re-encode it for --max-size ({e})"
            ) from None
    return data, os.path.splitext(path)[1].lower()


def write_tfrecord(f, samples, max_size=None, quality=90):
    for path, label in samples:
        data = tf_example(encoded(path, max_size, quality)[0], label)
        length = struct.pack("<Q", len(data))
        f.write(
            length
            + struct.pack("<I", masked_crc(length))
            + data
            + struct.pack("<I", masked_crc(data))
        )


def write_tar(f, samples, keys, max_size=None, quality=90):
    # dereference: a symlinked image goes in as the image, not as a link
    with tarfile.open(fileobj=f, mode="w", format=tarfile.GNU_FORMAT, dereference=True) as tar:
        for key, (path, label) in zip(keys, samples):
            data, ext = encoded(path, max_size, quality)
            image = tar.gettarinfo(path, f"{key}{ext}")  # the file's own mode, owner and time
            image.size = len(data)
            tar.addfile(image, io.BytesIO(data))
            text = str(label).encode()
            cls = tarfile.TarInfo(f"{key}.cls")
            cls.size = len(text)
            tar.addfile(cls, io.BytesIO(text))


@contextlib.contextmanager
def writing(path):
    """Names ``path`` in the error of a write that failed: a full disk's OSError names no file.
    Around atomic_open, which has removed the partial file by then; complete files stay, and a
    rerun keeps those its claim vouches for."""
    try:
        yield
    except OSError as e:
        if e.filename is not None:  # a file that could not be read or made, named already
            raise
        raise DataError(
            f"{path}: could not be written ({e.strerror}); its partial file was removed and the "
            "complete files kept: run the same command again once there is space"
        ) from None


def write_text(path, text):
    with writing(path), atomic_open(path, "w") as f:
        f.write(text)


def write_shard(path, samples, keys, *, fmt, max_size, quality):
    """One shard and its index; runs in a worker process."""
    with writing(path), atomic_open(path) as f:
        if fmt == "tfrecord":
            write_tfrecord(f, samples, max_size, quality)
        else:
            write_tar(f, samples, keys, max_size, quality)
    with writing(path + ".idx"):
        shard_index(path, fmt)


def shard_names(split, count, fmt):
    if fmt == "tfrecord":
        return [f"{split}-{k:05d}-of-{count:05d}" for k in range(count)]
    return [f"{split}-{k:06d}.tar" for k in range(count)]


def contents(samples, keys):
    """A digest of what a shard holds: each sample's file, label and key, and the file's size and
    modification time."""
    rows = [
        (path, label, key, (st := os.stat(path)).st_size, st.st_mtime_ns)
        for (path, label), key in zip(samples, keys)
    ]
    return hashlib.sha256(json.dumps(rows).encode()).hexdigest()


def check_paths(src, dst):
    if "://" in src:  # it reads each image many times over: a local copy first
        raise DataError(f"{src}: make_shards.py reads local folders; copy the set to local disk")
    for split in SPLITS:
        if not os.path.isdir(os.path.join(src, split)):
            raise DataError(
                f"{src}: expected ImageFolder subfolders train/ and val/ in it (no {split}/)"
            )
    if "://" in dst:  # the trainers read the local set from object storage once it is uploaded
        raise DataError(
            f"{dst}: make_shards.py writes to local disk; write there, then upload the folder as "
            f"it is (aws s3 sync DST {dst})"
        )
    if os.path.exists(dst) and not os.path.isdir(dst):
        raise DataError(f"{dst}: exists and is not a directory")
    # Shards, claim and manifest written among SRC's images would become part of what it trains on;
    # real paths, so that a symlink does not hide the overlap.
    real = os.path.realpath(src), os.path.realpath(dst)
    if os.path.commonpath(real) in real:
        raise DataError(f"{dst}: DST must not be SRC {src}, inside it or hold it")


def our_files(dst, fmt):
    """(final, temporary): the files in DST that this script writes (paths relative to DST) and the
    temporaries a killed run left (see outputs.atomic_open). Any other file in DST/train or
    DST/val is an error."""
    names = {"": r"(?:claim|manifest)\.json"}
    for split in SPLITS:
        shard = rf"{split}-\d{{5}}-of-\d{{5}}" if fmt == "tfrecord" else rf"{split}-\d{{6}}\.tar"
        names[split] = rf"(?:{shard}(?:\.idx|\.idx\.json)?|classes\.txt)"
    final, temporary = [], []
    for folder, name in names.items():
        path = os.path.join(dst, folder)
        for n in sorted(os.listdir(path)) if os.path.isdir(path) else []:
            if re.fullmatch(name, n):
                final.append(os.path.join(folder, n))
            elif re.fullmatch(atomic_temp_pattern(name), n):
                temporary.append(os.path.join(folder, n))
            elif folder:  # DST itself may hold other things: only train/ and val/ are ours
                raise DataError(
                    f"{os.path.join(path, n)}: not written by make_shards.py --format {fmt}; "
                    f"choose an empty DST"
                )
    return final, temporary


def read_claim(path):
    try:
        with open(path) as f:
            claim = json.load(f)
        return claim if isinstance(claim, dict) else None
    except (OSError, ValueError):
        return None


def claim_dst(dst, fmt, settings, digests, overwrite):
    """Make DST hold only what it may keep, then write its claim (``settings`` and each shard's
    ``digests``); returns the shards kept (paths relative to DST). A file under a final name is
    complete (atomic_open), and a claim is written only into a DST whose files are all written for
    it; so a shard stays where DST's claim is of the same settings and records the same digest for
    it."""
    final, temporary = our_files(dst, fmt)
    old = read_claim(os.path.join(dst, "claim.json"))
    same = old is not None and all(old.get(k) == v for k, v in settings.items())
    if final and not same and not overwrite:
        why = (
            ", ".join(
                f"{k} {old.get(k)!r}, not {v!r}" for k, v in settings.items() if old.get(k) != v
            )
            if old
            else f"{final[0]}, with no claim.json"
        )
        raise DataError(
            f"{dst}: holds shards not written for this source and these settings ({why}); pass "
            f"--overwrite to replace them"
        )
    keep = {
        s for s in final if same and s in digests and old.get("shards", {}).get(s) == digests[s]
    }
    if "manifest.json" in final:
        # first: until this run ends, DST is not a complete set
        os.remove(os.path.join(dst, "manifest.json"))
    for name in (
        set(final + temporary)
        - keep
        - {s + ".idx" for s in keep}
        - {s + ".idx.json" for s in keep}
        - {"claim.json", "manifest.json"}
    ):
        os.remove(os.path.join(dst, name))
    os.makedirs(dst, exist_ok=True)
    write_text(
        os.path.join(dst, "claim.json"), json.dumps({**settings, "shards": digests}, indent=1)
    )
    return keep


@contextlib.contextmanager
def lock_dst(dst):
    """DST's lock, held for the whole run: two runs at once into one DST would leave one's manifest
    beside the other's claim and shards. Not one of the set's files (our_files looks only at
    train/, val/ and the two .json files in DST), so neither a rerun nor --overwrite touches it."""
    lock = os.path.join(dst, ".lock")
    try:
        os.makedirs(dst, exist_ok=True)
        fd = os.open(lock, os.O_WRONLY | os.O_CREAT, 0o644)
    except OSError as e:
        raise DataError(f"{dst}: cannot write there ({e.strerror})") from None
    try:
        # The OS releases it however the process ends; forked workers share it while they write.
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise DataError(
            f"{dst}: another make_shards.py is writing to it ({lock} is locked); wait for it or "
            "pick another DST"
        ) from None
    try:
        yield
    finally:
        os.close(fd)


def make_shards(
    src, dst, fmt, shard_size, seed, *, max_size=None, quality=90, workers=1, overwrite=False
):
    """Write the shards, indexes and class lists of both splits, then the manifest; returns the
    manifest."""
    check_paths(src, dst)
    src = os.path.abspath(src)
    settings = {
        "source": src,
        "format": fmt,
        "shard_size": shard_size,
        "seed": seed,
        "max_size": max_size,
        "quality": quality,
    }
    manifest, shards = plan_shards(src, settings)
    digests = {s: contents(*shards[s]) for s in shards}
    write = functools.partial(write_shard, fmt=fmt, max_size=max_size, quality=quality)
    # One worker writes in this process. More are forked: they start at once, without importing
    # torch and DALI again (DALI runs on Linux only).
    fork = multiprocessing.get_context("fork")
    pool = ProcessPoolExecutor(workers, mp_context=fork) if workers > 1 else None
    with lock_dst(dst), pool or contextlib.nullcontext(SimpleNamespace(map=map)) as pool:
        keep = claim_dst(dst, fmt, settings, digests, overwrite)
        for split in SPLITS:
            folder = os.path.join(dst, split)
            os.makedirs(folder, exist_ok=True)
            mine = [s for s in shards if s.startswith(split + os.sep)]
            kept = [os.path.join(dst, s) for s in mine if s in keep]
            # each kept shard's index reused, or built again if stale
            list(pool.map(shard_index, kept, [fmt] * len(kept)))
            todo = [s for s in mine if s not in keep]
            paths = [os.path.join(dst, s) for s in todo]
            done = pool.map(
                write, paths, [shards[s][0] for s in todo], [shards[s][1] for s in todo]
            )
            # a shard's images count once it is done
            images = (key for s, _ in zip(todo, done) for key in shards[s][1])
            total = sum(len(shards[s][1]) for s in todo)
            for _ in progress(images, total, f"{folder}: images written"):
                pass
            write_text(
                os.path.join(folder, "classes.txt"), "".join(f"{c}\n" for c in manifest["classes"])
            )
            written = f"{manifest['splits'][split]['samples']} images in {len(mine)} {fmt} shards"
            reused = f" ({len(kept)} kept from an earlier run)" if kept else ""
            print(f"{folder}: {written}{reused}")
        write_text(os.path.join(dst, "manifest.json"), json.dumps(manifest, indent=1))
    return manifest


def plan_shards(src, settings):
    """(the manifest, {shard path under DST: ([(file, label)], [key])}): both splits in an order
    shuffled by the seed, cut into shards of ``shard_size``."""
    train_files, train_labels, classes = list_image_folder(os.path.join(src, "train"))
    # classes.txt holds a name a line: one holding a line break would read back as two names
    for c in classes:
        if c.splitlines() != [c]:
            raise DataError(
                f"{os.path.join(src, 'train')}: class folder {c!r} holds a line break, which a "
                "line of classes.txt cannot; rename it"
            )
    # val is labelled by train's class names: a val class that train lacks is an error
    val_files, val_labels, _ = list_image_folder(os.path.join(src, "val"), classes)
    # a file that is not an image would go into a shard as it is, and a trainer could only name its
    # shard and sample (or DALI crash on it): refused here, by its own name, before any shard exists
    for files in (train_files, val_files):
        check_image_heads(files, src)
    manifest, shards = {**settings, "splits": {}, "classes": classes}, {}
    size, fmt = settings["shard_size"], settings["format"]
    for split, files, labels in (
        ("train", train_files, train_labels),
        ("val", val_files, val_labels),
    ):
        order = list(range(len(files)))
        random.Random(f"{settings['seed']}-{split}").shuffle(order)
        parts = [order[k : k + size] for k in range(0, len(order), size)]
        names = shard_names(split, len(parts), fmt)
        manifest["splits"][split] = {"samples": len(files), "shards": names}
        for name, part in zip(names, parts):  # key: the image's index in SRC's order
            shards[os.path.join(split, name)] = (
                [(files[i], labels[i]) for i in part],
                [f"{i:08d}" for i in part],
            )
    return manifest, shards


def main(argv=None):
    args = parse_args(argv)
    try:
        make_shards(
            args.src,
            args.dst,
            args.format,
            args.shard_size,
            args.seed,
            max_size=args.max_size,
            quality=args.quality,
            workers=args.workers,
            overwrite=args.overwrite,
        )
    except (DataError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:  # the shards written whole stay; the one being written is not kept
        print("interrupted: the shards written so far are whole", file=sys.stderr)
        sys.exit(130)


if __name__ == "__main__":
    main()
