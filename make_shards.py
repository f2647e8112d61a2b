"""ImageFolder -> TFRecord or WebDataset shards that ``pipelines.py`` (and so the trainers) read.

SRC holds ImageFolder trees ``train/<class>/<image>`` and ``val/<class>/<image>``. DST gets

    DST/train/train-00000-of-00004 ...   --format tfrecord: TensorFlow's file names; tf.train.Example
                                         records with features image/encoded, image/class/label
    DST/train/train-000000.tar ...       --format wds: WebDataset tars of <key>.<ext> (the image) +
                                         <key>.cls (the class index as ASCII digits)
    DST/train/<shard>.idx(.json)         DALI's index of each shard and its summary (pipelines.shard_index)
    DST/train/classes.txt                train's class names, one a line, in index order
    DST/val/...                          the same for val, labelled by train's class names
    DST/manifest.json                    written last: the set is complete

The shards hold the original encoded files, byte for byte (no re-encode), in an order shuffled
across classes with ``--seed``: DALI's shard readers shuffle only within a window, so the
written order is what keeps a batch from holding one class.

    python make_shards.py data/imagenet data/imagenet-tfrecord --format tfrecord
    python make_shards.py data/imagenet data/imagenet-wds --format wds --shard-size 2000 --seed 1
    python train_classify.py --data data/imagenet-wds ...

Every file is written under a temporary name and renamed, and the manifest goes first out and
last in, so a killed run leaves no half-written file under a final name; running the same
command again rewrites the set completely and removes what a killed run with other settings
left behind. Bad input prints one ``error:`` line and exits with status 2.
"""

import argparse
import io
import json
import os
import random
import re
import struct
import sys
import tarfile

import google_crc32c

from pipelines import DataError, atomic_open, atomic_temp_pattern, list_image_folder, shard_index

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
        "image/class/label": _field(3, _field(1, _varint(label))),  # Feature.int64_list.value, packed
    }
    # Example.features = Features, whose field 1 is a map: entries of key = 1, value = 2
    return _field(1, b"".join(_field(1, _field(1, k.encode()) + _field(2, v)) for k, v in features.items()))


def masked_crc(data):
    """TFRecord's checksum: CRC-32C, rotated and offset as TensorFlow masks it."""
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def write_tfrecord(f, samples):
    for path, label in samples:
        with open(path, "rb") as image:
            data = tf_example(image.read(), label)
        length = struct.pack("<Q", len(data))
        f.write(length + struct.pack("<I", masked_crc(length)) + data + struct.pack("<I", masked_crc(data)))


def write_tar(f, samples, keys):
    # dereference: a symlinked image goes in as the image, not as a link
    with tarfile.open(fileobj=f, mode="w", format=tarfile.GNU_FORMAT, dereference=True) as tar:
        for key, (path, label) in zip(keys, samples):
            tar.add(path, f"{key}{os.path.splitext(path)[1].lower()}")
            text = str(label).encode()
            cls = tarfile.TarInfo(f"{key}.cls")
            cls.size = len(text)
            tar.addfile(cls, io.BytesIO(text))


def shard_names(split, count, fmt):
    if fmt == "tfrecord":
        return [f"{split}-{k:05d}-of-{count:05d}" for k in range(count)]
    return [f"{split}-{k:06d}.tar" for k in range(count)]


def our_files(split, fmt):
    """A pattern of the names this script writes into a split folder: shards, indexes, classes.txt
    and their temporaries (see pipelines.atomic_open)."""
    shard = rf"{split}-\d{{5}}-of-\d{{5}}" if fmt == "tfrecord" else rf"{split}-\d{{6}}\.tar"
    name = rf"(?:{shard}(?:\.idx|\.idx\.json)?|classes\.txt)"
    return re.compile(rf"{name}|{atomic_temp_pattern(name)}")


def check_paths(src, dst, fmt):
    for split in SPLITS:
        if not os.path.isdir(os.path.join(src, split)):
            raise DataError(f"{src}: expected ImageFolder subfolders train/ and val/ in it (no {split}/)")
    if os.path.exists(dst) and not os.path.isdir(dst):
        raise DataError(f"{dst}: exists and is not a directory")
    real_src, real_dst = os.path.realpath(src), os.path.realpath(dst)
    if real_dst == real_src or any(real_dst.startswith(os.path.join(real_src, s) + os.sep) for s in SPLITS):
        raise DataError(f"{dst}: must not be SRC or inside SRC's train/ or val/")
    for split in SPLITS:
        folder = os.path.join(dst, split)
        # a rerun may replace what an earlier run of this format wrote, and nothing else
        other = sorted(n for n in os.listdir(folder) if not our_files(split, fmt).fullmatch(n)) \
            if os.path.isdir(folder) else []
        if other:
            raise DataError(f"{os.path.join(folder, other[0])}: not written by make_shards.py --format {fmt}; "
                            f"choose an empty DST")


def make_shards(src, dst, fmt, shard_size, seed):
    """Write the shards, indexes and class lists of both splits, then the manifest; returns the manifest."""
    check_paths(src, dst, fmt)
    train_files, train_labels, classes = list_image_folder(os.path.join(src, "train"))
    # val is labelled by train's class names: a val class that train lacks is an error
    val_files, val_labels, _ = list_image_folder(os.path.join(src, "val"), classes)
    manifest_path = os.path.join(dst, "manifest.json")
    if os.path.exists(manifest_path):
        os.remove(manifest_path)  # until this run ends, DST is not a complete set
    manifest = {"source": os.path.abspath(src), "format": fmt, "shard_size": shard_size, "seed": seed, "splits": {}}
    for split, files, labels in (("train", train_files, train_labels), ("val", val_files, val_labels)):
        folder = os.path.join(dst, split)
        os.makedirs(folder, exist_ok=True)
        order = list(range(len(files)))
        random.Random(f"{seed}-{split}").shuffle(order)
        parts = [order[k:k + shard_size] for k in range(0, len(order), shard_size)]
        names = shard_names(split, len(parts), fmt)
        for name, part in zip(names, parts):
            path = os.path.join(folder, name)
            samples = [(files[i], labels[i]) for i in part]
            with atomic_open(path) as f:
                if fmt == "tfrecord":
                    write_tfrecord(f, samples)
                else:
                    write_tar(f, samples, [f"{i:08d}" for i in part])  # key: the image's index in SRC's order
            shard_index(path, fmt)
        with atomic_open(os.path.join(folder, "classes.txt"), "w") as f:
            f.write("".join(f"{c}\n" for c in classes))
        keep = set(names) | {n + ".idx" for n in names} | {n + ".idx.json" for n in names} | {"classes.txt"}
        for name in set(os.listdir(folder)) - keep:  # a killed run's temporaries, shards of other settings
            os.remove(os.path.join(folder, name))
        manifest["splits"][split] = {"samples": len(files), "shards": names}
        print(f"{folder}: {len(files)} images in {len(names)} {fmt} shards")
    manifest["classes"] = classes
    with atomic_open(manifest_path, "w") as f:
        json.dump(manifest, f, indent=1)
    return manifest


def main(argv=None):
    parser = argparse.ArgumentParser(description="Convert an ImageFolder root (train/, val/) into TFRecord or "
                                                 "WebDataset shards with DALI indexes.")
    parser.add_argument("src", metavar="SRC",
                        help="ImageFolder root: SRC/train/<class>/<image>, SRC/val/<class>/<image>")
    parser.add_argument("dst", metavar="DST", help="output root: DST/train/, DST/val/ and DST/manifest.json")
    parser.add_argument("--format", required=True, choices=["tfrecord", "wds"],
                        help="tfrecord: TensorFlow's tf.train.Example files; wds: WebDataset tars")
    parser.add_argument("--shard-size", type=int, default=1024, help="images per shard (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the write-time shuffle (default: %(default)s)")
    args = parser.parse_args(argv)
    if args.shard_size < 1:
        parser.error(f"--shard-size must be at least 1, got {args.shard_size}")
    try:
        make_shards(args.src, args.dst, args.format, args.shard_size, args.seed)
    except (DataError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
