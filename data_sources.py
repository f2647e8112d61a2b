"""What the DALI pipelines read: finding, listing, indexing and checking image data.

Classification data is an ImageFolder tree, a DALI file list, TFRecord files or WebDataset tars, on
local disk or under an ``s3://`` prefix; ``ClassifyReader`` turns any of them into DALI's reader and
labels. Segmentation data is ``.npy`` image/mask pairs listed by split CSVs;
``check_segmentation_files`` checks them from their headers alone. Adding a layout is an edit of
this file (and of ``ClassifyReader``'s call).

Bad input raises ``DataError`` naming the offending path, before DALI builds anything.
"""

import atexit
import contextlib
import csv
import functools
import hashlib
import io
import itertools
import json
import math
import multiprocessing
import os
import random
import re
import shutil
import stat
import struct
import sys
import tarfile
import tempfile
import threading
import time
import warnings
import zipfile
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool

import google_crc32c
import numpy as np
from nvidia.dali import ops, tfrecord, types
from nvidia.dali.pipeline import Pipeline
from PIL import Image, UnidentifiedImageError

from outputs import atomic_open, progress


class DataError(ValueError):
    """Input data that cannot be read as asked; the message names the offending path."""


# Samples a shuffling TFRecord/WebDataset reader holds and picks from at random: those readers read
# shards front to back, so beyond this window an epoch's order comes from the shard order
# (reshuffled every epoch) and the order make_shards.py wrote. 4096 ImageNet JPEGs are ~450 MB of
# host memory per pipeline.
SHUFFLE_BUFFER = 4096
# The extensions torchvision's ImageFolder accepts (case-insensitive), so that both loaders see the
# same files; pipelines.py's IMG_EXTENSIONS, for the trees it reads unchecked, are the same.
IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
# The first bytes of the image types that DALI's decoders read: those of IMG_EXTENSIONS, and JPEG
# 2000, which DALI decodes whatever a file's name (WebP: "RIFF", a size, "WEBP"). DALI 2.4 can
# kill the process (SIGSEGV) when a file that is none of them fails to decode in a pipeline's
# first batch, before it could name the file; so a folder's files are checked for these first.
IMAGE_MAGIC = (
    b"\xff\xd8\xff",  # JPEG
    b"\x89PNG\r\n\x1a\n",
    b"BM",  # BMP
    *(b"P%d" % k for k in range(1, 7)),  # PBM, PGM, PPM (ASCII and binary)
    b"II*\x00",  # TIFF, little- and big-endian
    b"MM\x00*",
    b"\x00\x00\x00\x0cjP  \r\n\x87\n",  # JPEG 2000: the JP2 file, and the bare codestream
    b"\xff\x4f\xff\x51",
)
# The images whose headers PIL parses before DALI reads them (see broken_header).
PARSED_HEADERS = (b"\xff\xd8\xff", b"\x89PNG\r\n\x1a\n")
# Bytes read from the start of each image: every signature above, and the segments of most JPEGs
# up to their scan (plain_jpeg_header); PIL reads on in the others.
HEAD_BYTES = 4096
# The JPEG segments that plain_jpeg_header tells PIL opens: frames (baseline, extended,
# progressive); those PIL reads without looking inside (DHT, DRI, COM, APP3 to APP12, APP15);
# APP0 and APP14, whose JFIF and Adobe fields it reads from their first 7 bytes.
JPEG_FRAMES = (0xC0, 0xC1, 0xC2)
JPEG_PLAIN = (0xC4, 0xDD, 0xFE, *range(0xE3, 0xED), 0xEF)
JPEG_READ_7 = (0xE0, 0xEE)
# The verdicts' version: header-check caches and shard indexes of another were judged by other
# checks, so their files are checked again (bump it where a check changes).
CHECKS = 2
# Bytes read from the end of each JPEG: its end marker, or a short trailer after it (see jpeg_end).
TAIL_BYTES = 64
# Files whose first bytes are read at once: on a network file system each read waits for an answer.
HEAD_THREADS = 16
# Seconds a file's check may take before the rest are read by HEAD_THREADS threads: files already
# in memory are read faster by one thread alone, which never waits for the GIL (see _all_heads).
SLOW_HEAD = 100e-6
# A set of this many images takes a while to check, a file read each: a line says so first.
LONG_CHECK = 100_000
# Files a process stats, at least, where a start looks for the files changed since its check
# (file_stamps): a resume of a large set shares them among the cores.
STAT_SHARE = 100_000
# TensorFlow's shard names (train-00000-of-01024) have no extension; other writers use .tfrecord.
TFRECORD_NAME = re.compile(r"[^.].*-\d{5}-of-\d{5}|[^.].*\.tfrecords?")
TFRECORD_FEATURES = {
    "image/encoded": tfrecord.FixedLenFeature((), tfrecord.string, ""),
    "image/class/label": tfrecord.FixedLenFeature([1], tfrecord.int64, -1),
}
# A WebDataset sample is <key>.<image extension> + <key>.cls; the same image types as ImageFolder.
WDS_IMAGE_EXTENSIONS = tuple(e[1:] for e in IMG_EXTENSIONS)
# Longest .cls label in decimal digits: any class index that fits an int32.
LABEL_DIGITS = 9
# Where the index of a shard in a read-only folder goes, keyed by the shard's absolute path.
CACHE_HOME = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
INDEX_CACHE = os.path.join(CACHE_HOME, "dali-indexes")
# Where the header check keeps the files that passed it, one file per folder of images, keyed by the
# folder's real path: found by every later start on this machine (or on any, in a shared home), and
# the data's folder may be read-only.
HEAD_CACHE = os.path.join(CACHE_HOME, "dali-image-checks")
# A file changed this recently before its check is checked again at the next start: the file
# system's clock ticks coarsely, and a file rewritten within one tick keeps its time.
RACY_SECONDS = 2
# data in object storage: s3:// URLs, whose bytes DALI's readers fetch themselves
# ------------------------------ boto3 lists the prefixes and reads the small files (classes.txt,
# manifest.json, index summaries, digests): its errors say what is wrong (bucket, credentials,
# access, endpoint) before DALI builds anything.

# Seconds a request may wait for a connection, and then for each answer; AWS_MAX_ATTEMPTS (3) bounds
# the tries.
S3_TIMEOUT = 10
# Requests in flight at once while the indexes of remote shards are checked.
S3_THREADS = 16


# A URL's start: every data path goes through remote(), where a URL of another scheme is refused
# rather than taken for a local path that is not there.
URL_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")


def remote(path):
    """Whether ``path`` is in object storage (an s3:// URL); ``DataError`` for another URL."""
    path = str(path)
    if (scheme := URL_SCHEME.match(path)) and scheme[0] != "s3://":
        raise DataError(
            f"{path}: {scheme[0]} URLs are not read; expected a local path or an s3:// URL"
        )
    return path.startswith("s3://")


@functools.lru_cache(maxsize=1)
def s3_client():
    """boto3's S3 client: endpoint (``AWS_ENDPOINT_URL``), credentials and region found as the AWS
    tools find them."""
    try:
        import boto3
        from botocore.config import Config
    except ImportError:
        raise DataError("s3:// data needs the boto3 package (pip install boto3)") from None
    return boto3.client(
        "s3",
        config=Config(
            connect_timeout=S3_TIMEOUT, read_timeout=S3_TIMEOUT, retries={"mode": "standard"}
        ),
    )


@contextlib.contextmanager
def s3_errors(url):
    """The client, with boto3's errors about ``url`` turned into a ``DataError`` that says what to
    check, and a missing object into ``FileNotFoundError``."""
    client = s3_client()
    from botocore import exceptions

    try:
        yield client
    except exceptions.NoCredentialsError:
        raise DataError(
            f"{url}: no AWS credentials found (set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or "
            f"AWS_PROFILE)"
        ) from None
    except exceptions.ClientError as e:
        code, message = e.response["Error"].get("Code"), e.response["Error"].get("Message")
        if code == "NoSuchKey":
            raise FileNotFoundError(url) from None
        if code == "NoSuchBucket":
            raise DataError(f"{url}: no such bucket at {client.meta.endpoint_url}") from None
        if e.response["ResponseMetadata"].get("HTTPStatusCode") == 403:
            raise DataError(
                f"{url}: access denied ({code}: {message}); check the credentials and the bucket's "
                f"policy"
            ) from None
        raise DataError(f"{url}: {code} from {client.meta.endpoint_url} ({message})") from None
    except exceptions.BotoCoreError as e:  # no connection, or no answer within S3_TIMEOUT
        raise DataError(f"{url}: {e}; check AWS_ENDPOINT_URL and that the server is up") from None


def s3_bucket_key(url):
    bucket, _, key = url[len("s3://") :].partition("/")
    if re.search("[?#]", key):  # DALI parses its s3:// paths as URLs: its key ends at either
        raise DataError(
            f"{url}: DALI's S3 reader cannot read keys holding ? or #; expected a prefix and "
            "object names without them"
        )
    return bucket, key.strip("/")


@functools.lru_cache(maxsize=None)
def s3_files(url):
    """{path relative to ``url``: (size in bytes, ETag)} of every object under the s3:// prefix
    ``url``, listed once (the ETag tells apart two versions of an object of the same size); the
    first byte of its first object is read too."""
    bucket, key = s3_bucket_key(url)
    prefix = key and key + "/"
    with s3_errors(url) as s3:
        pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        files = {
            o["Key"][len(prefix) :]: (o["Size"], o.get("ETag"))
            for page in pages
            for o in page.get("Contents", [])
            if not o["Key"].endswith("/")
        }  # a key ending in / is a console's folder marker
    # Credentials may list objects they may not get, which DALI reports only as "S3 Object not
    # found": one byte read here says "access denied" first. (A range of an empty object is no
    # range, and an object deleted since the listing is no matter here.)
    if first := next((rel for rel, (size, _) in files.items() if size), None):
        with contextlib.suppress(FileNotFoundError):
            s3_get(f"s3://{bucket}/{prefix}{first}", "bytes=0-0")
    return files


@functools.lru_cache(maxsize=None)
def s3_tree(url):
    """{top-level name under ``url``: its files' relative paths in ``walk``'s order}, from one
    listing."""
    tree = {}
    for rel in sorted(s3_files(url), key=os.path.split):
        tree.setdefault(rel.split("/")[0], []).append(rel)
    return tree


def s3_get(url, byte_range=None):
    """The bytes of an s3:// object (``byte_range``: HTTP's "bytes=first-last")."""
    bucket, key = s3_bucket_key(url)
    with s3_errors(url) as s3:
        return s3.get_object(
            Bucket=bucket, Key=key, **({"Range": byte_range} if byte_range else {})
        )["Body"].read()


def overlapped(fn, items, parallel):
    """``map(fn, items)``, in order; on ``S3_THREADS`` threads when ``parallel`` (requests to object
    storage, which overlap), in this thread otherwise."""
    if not parallel:
        yield from map(fn, items)
        return
    with ThreadPoolExecutor(S3_THREADS) as pool:
        yield from pool.map(fn, items)


def s3_size(url):
    """The size of an s3:// object from its prefix's one listing, or None when there is no such
    object."""
    return s3_files(os.path.dirname(url)).get(os.path.basename(url), (None,))[0]


def isdir(path):
    """``os.path.isdir``; for an s3:// prefix, whether any object is under it."""
    return bool(s3_files(path)) if remote(path) else os.path.isdir(path)


def entries(folder):
    """(name, is a folder) of everything in a folder or directly under an s3:// prefix."""
    if remote(folder):
        return [(name, "/" in rels[0]) for name, rels in s3_tree(folder).items()]
    return [(e.name, e.is_dir()) for e in os.scandir(folder)]


def walk(folder):
    """Every file under ``folder``, in torchvision's ImageFolder order (``sorted(os.walk(folder))``,
    each folder's names sorted); under an s3:// prefix, from its parent's one listing."""
    if remote(folder):
        parent, name = os.path.split(folder)
        return [os.path.join(parent, rel) for rel in s3_tree(parent).get(name, [])]
    found, real = [], {}

    def unreadable(e):  # os.walk would leave the folder out, its images with it
        raise DataError(f"{e.filename}: cannot be listed ({e.strerror}); fix its permissions")

    # symlinked folders are followed (sets are assembled so), but os.walk follows a link to an
    # ancestor until the paths grow too long: a folder that resolves to one of its ancestors is one
    for root, _, names in os.walk(folder, followlinks=True, onerror=unreadable):
        real[root], above = os.path.realpath(root), os.path.dirname(root)
        while above in real:
            if real[above] == real[root]:
                raise symlink_loop(root, real[root])
            above = os.path.dirname(above)
        found.append((root, names))
    # each name after its folder's prefix: os.path.join per file is most of a large tree's walk
    return [
        head + n
        for root, names in sorted(found)
        for head in [os.path.join(root, "")]
        for n in sorted(names)
    ]


def symlink_loop(root, target):
    """The DataError of a folder that ``walk`` found to resolve to ``target``, one of its
    ancestors: it names the link."""
    link = root
    while not os.path.islink(link):  # a link lies between the ancestor and ``root``
        link = os.path.dirname(link)
    return DataError(
        f"{link}: a symlink loop (it leads back to {target}, whose images would count again and "
        "again); remove the link"
    )


def isfile(path):
    """``os.path.isfile``; for an s3:// object, whether its prefix's listing holds it."""
    return s3_size(path) is not None if remote(path) else os.path.isfile(path)


def read_head(path, n):
    """The first ``n`` bytes of a file or s3:// object (one ranged request), and its size."""
    if remote(path):
        if (size := s3_size(path)) is None:
            raise FileNotFoundError(path)
        return s3_get(path, f"bytes=0-{n - 1}") if size else b"", size
    with open(path, "rb") as f:
        return f.read(n), os.fstat(f.fileno()).st_size


# numpy parses a .npy header as a Python literal. Python 3.11's parser keeps one recursion count
# for all threads, and two threads parsing at once can fail with "AST constructor recursion depth
# mismatch"; the checks below read headers on several threads, so they take turns parsing.
NPY_PARSE = threading.Lock()


def load_npy(path):
    """A .npy array, memory-mapped; an s3:// one read whole (the checks that read every pixel)."""
    if remote(path):
        data = io.BytesIO(s3_get(path))
        with NPY_PARSE:
            return np.load(data)
    with NPY_PARSE:
        return np.load(path, mmap_mode="r")


def read_bytes(path):
    """A whole (small) file or s3:// object; FileNotFoundError when there is none."""
    if remote(path):
        return s3_get(path)
    with open(path, "rb") as f:
        return f.read()


def remote_shard_index(shard, layout):
    """``shard_index`` of an s3:// shard: its index beside it, made before the upload, so that DALI
    reads both from the store. The summary's size and digest must still match the shard (not its
    time: an upload sets its own)."""
    name, listed = os.path.basename(shard), s3_files(os.path.dirname(shard))
    how = (
        f"index a local copy (python -c \"import data_sources; data_sources.shard_index('{name}', "
        f"'{layout}')\") and upload {name}.idx and {name}.idx.json beside it (make_shards.py "
        "writes both for every shard)"
    )
    if name + ".idx" not in listed or name + ".idx.json" not in listed:
        raise DataError(f"{shard}: no index beside it ({name}.idx and {name}.idx.json); {how}")
    text = s3_get(shard + ".idx.json")
    try:
        summary = json.loads(text)
        recorded = summary["shard"]["bytes"], summary["index_bytes"], summary["digest"]
    except (ValueError, KeyError, TypeError):
        recorded = None
    if recorded != (listed[name][0], listed[name + ".idx"][0], shard_digest(shard)):
        raise DataError(
            f"{shard}: does not match its index ({name}.idx.json records another size or digest: "
            f"the shard was rewritten since it was indexed); {how}"
        )
    return shard + ".idx", summary


def find_changed(pipe):
    """The first of ``pipe``'s s3:// files that is gone, or of another size or ETag, since the run
    listed them; or None."""
    return first_changed(pipe.read.data_dir, pipe.files)


def first_changed(root, files):
    """The first of ``files`` under the s3:// prefix ``root`` that is gone, or of another size or
    ETag, in a new listing than in the run's (see ``watch``); or None."""
    # the listing this run used, and a new one
    before, now = s3_files(root), s3_files.__wrapped__(root)
    return next(
        (f for f in files if now.get(rel := f[len(root) :].lstrip("/")) != before.get(rel)), None
    )


def watch(root, files, stamps=None):
    """``(root, files, stamps)`` for ``check_unchanged``: an s3:// root's listing is taken now, the
    one that later listings are compared with; local files' ``stamps`` (their sizes and
    modification times as the header check found them, ``ClassifyReader.stamps``) are compared
    with the file system's."""
    if remote(root):
        s3_files(root)
    return root, files, stamps


def check_unchanged(watched):
    """A ``DataError`` naming the first file of ``watched`` (``watch``'s triples) replaced or gone
    since the run listed it. DALI reads a replaced file's new bytes without a word (a JPEG cut
    short, or text, which DALI 2.4's decoder can die on), so a run looks again: one listing of each
    s3:// root, a stat of each local file."""
    for root, files, stamps in watched:
        changed = first_changed(root, files) if remote(root) else first_restamped(files, stamps)
        if changed:
            raise DataError(
                f"{changed}: changed or gone since this run listed it (another size or "
                f"{'ETag' if remote(root) else 'modification time'}); the data must stay as listed "
                "for the whole run"
            )


@contextlib.contextmanager
def unchanged(watched):
    """``check_unchanged(watched)`` in a thread while the block runs (validation, which its stat of
    each file or listing of the store would otherwise wait for); its DataError at the block's
    end."""
    with ThreadPoolExecutor(1) as pool:
        looking = pool.submit(check_unchanged, watched)
        yield
    looking.result()


def first_restamped(files, stamps):
    """The first of the local ``files`` whose (size, modification time) is no longer its row of
    ``stamps``, or None."""
    moved = np.flatnonzero((file_stamps(files) != stamps).any(axis=1))
    return files[moved[0]] if moved.size else None


def first_gone(files):
    """The first of the local ``files`` that is no longer there (deleted under the run), or None."""
    return next((f for f in files if not remote(f) and not os.path.isfile(f)), None)


def data_digest(root, files, sizes=None):
    """SHA-256 (hex) of the name relative to ``root`` and the size (on s3://, and the ETag) of each
    of ``files``, in order: what a run reads, from the listing and the inodes alone (no file is
    read), so that a checkpoint, or another process of the run, can tell its set from another of as
    many files, yet not from a copy of it elsewhere. ``sizes``: the files' sizes where they are
    known (``ClassifyReader.sizes``), not asked of the file system again."""
    prefix = root.rstrip("/") + "/"  # a slice: relpath would take most of the time
    rels = [f[len(prefix) :] if f.startswith(prefix) else os.path.relpath(f, root) for f in files]
    if remote(root):
        listed = s3_files(root)  # the listing the run read its files from
        text = "".join("%s\0%d\0%s\n" % (rel, *listed[rel]) for rel in rels)
    else:
        sizes = sizes or [os.stat(f).st_size for f in files]
        text = "".join(f"{rel}\0{size}\n" for rel, size in zip(rels, sizes))
    return hashlib.sha256(text.encode()).hexdigest()


# classification data: folders, file lists and shards
# ------------------------------------------------


class ClassifyReader:
    """The reader of a classification pipeline and its labels, its data checked: called in
    ``define_graph``, it gives the encoded images and their labels (int32 of shape (1,), less
    ``reading.label_offset``). ``reading``: pipelines.ReadSettings; ``file_args``:
    ``stick_to_shard`` and ``skip_cached_images`` of DALI's reader.

    ``data_dir`` is an ImageFolder tree (labelled by ``reading.classes`` when given: train's names
    for a val split), a ``reading.file_list``'s root, or a folder of TFRecord files or WebDataset
    tars (indexed on first use, see ``shard_index``). Every shard returns the same number of
    batches, as DDP needs: a training reader (``shuffle``) repeats a few distinct samples of the set
    so that every shard holds whole batches (see pipelines.repeats), a validation reader pads its
    last batch, which the iterator drops. Stored labels outside [0, num_classes) raise
    ``DataError``. ``reading.ra_reps`` (an ImageFolder tree or a file list only) reads torchvision's
    repeated augmentation instead (see ``RepeatedAugmentation``), its order drawn from
    ``reading.ra_seed``, the same on every shard.
    """

    def __init__(self, data_dir, reading, *, batch_size, shuffle, **file_args):
        self.label_offset, self.data_dir, self.ra = reading.label_offset, data_dir, None
        self.stamps = None  # of a local tree's or file list's files, from their check
        self.layout = "folder" if reading.file_list is not None else find_layout(data_dir)
        # what the iterator counts an epoch by: the reader's own shard, or the sampler's batches
        self.epoch = dict(reader_name="Reader")
        if reading.ra_reps:
            ranges = self.ra_reader(data_dir, reading, batch_size)
        elif self.layout == "folder":
            from pipelines import file_reader  # what reads a tree's files, checked here first

            labels, ranges = self.list_folder(data_dir, reading.file_list, reading.classes)
            self.reader = file_reader(self.files, labels, reading, batch_size, shuffle, **file_args)
            self.read_samples = self.reader
        else:
            ranges = self.shard_reader(data_dir, reading, batch_size, shuffle, file_args)
        self.num_classes = reading.num_classes
        if reading.num_classes is None and self.classes is not None:
            self.num_classes = len(self.classes)
        self.check_labels(ranges)
        self.to_int32 = ops.Cast(dtype=types.INT32)

    @property
    def sizes(self):
        """The sizes of a local tree's or file list's files, from their check; else None."""
        return None if self.stamps is None else self.stamps[:, 0].tolist()

    def check_labels(self, ranges):
        """A ``DataError`` where a stored label, less ``label_offset``, is outside
        [0, num_classes): ``ranges`` holds (where, lowest, highest) of each file or shard."""
        for where, lowest, highest in ranges:
            for label in (lowest, highest):
                if not 0 <= label - self.label_offset < (self.num_classes or math.inf):
                    raise DataError(
                        f"{where}: stored label {label} minus label_offset "
                        f"{self.label_offset} is outside [0, {self.num_classes or 'inf'})"
                    )

    def list_folder(self, data_dir, file_list, classes):
        """The files and labels of an ImageFolder tree or a file list, their heads checked; (where,
        lowest, highest) stored label."""
        if file_list is None:
            self.files, labels, self.classes = list_image_folder(data_dir, classes)
            ranges = [(data_dir, min(labels), max(labels))]
        else:
            self.files, labels = read_file_list(data_dir, file_list)
            self.classes, ranges = classes, []
            if labels:
                ranges = [(file_list, min(labels), max(labels))]
        if not remote(data_dir):  # in object storage, a request per file: DALI reads them unchecked
            self.stamps = check_image_heads(self.files, data_dir)
        self.num_samples = len(self.files)
        return labels, ranges

    def ra_reader(self, data_dir, reading, batch_size):
        """Repeated augmentation (RepeatedAugmentation) over an ImageFolder tree or a file list."""
        if self.layout != "folder":
            raise DataError(
                f"{data_dir}: --ra-sampler reads ImageFolder trees and file lists, not "
                f"{self.layout} shards (read one by one from a shuffle buffer); expected one of "
                "those, or no --ra-sampler"
            )
        labels, ranges = self.list_folder(data_dir, reading.file_list, reading.classes)
        shard = dict(
            shard_id=reading.shard_id, num_shards=reading.num_shards, batch_size=batch_size
        )
        self.ra = RepeatedAugmentation(
            self.files, labels, reps=reading.ra_reps, seed=reading.ra_seed, **shard
        )
        self.epoch = dict(size=self.ra.steps * self.ra.batch_size)
        self.reader = ops.ExternalSource(
            source=self.ra.batch, num_outputs=2, batch=True, batch_info=True
        )
        self.read_files = ops.io.file.Read()
        self.read_samples = self.read_repeated
        return ranges

    def shard_reader(self, data_dir, reading, batch_size, shuffle, file_args):
        """DALI's TFRecord or WebDataset reader over the shards of ``data_dir``, indexed first;
        (shard, lowest, highest) stored label of each."""
        from pipelines import extra_samples  # the padding of a training set, as a tree's

        self.files = shard_files(data_dir, self.layout)
        check_manifest(data_dir, self.files)
        index = functools.partial(shard_index, layout=self.layout)
        indexed = overlapped(index, self.files, remote(data_dir))
        progress_lines = progress(indexed, len(self.files), f"{data_dir}: shards indexed")
        indexes, summaries = zip(*progress_lines)
        self.num_samples = sum(s["samples"] for s in summaries)
        if shuffle and (n := extra_samples(self.num_samples, reading.num_shards, batch_size)):
            indexes = padded_indexes(indexes, self.layout, n)
        listed = read_classes_txt(data_dir)
        classes = reading.classes
        if classes is not None and listed is not None and list(classes) != listed:
            raise DataError(
                f"{os.path.join(data_dir, 'classes.txt')}: its {len(listed)} classes "
                f"differ from the {len(classes)} training classes (names and index "
                f"order must match)"
            )
        self.classes = list(classes) if classes is not None else listed
        args = dict(
            shard_id=reading.shard_id,
            num_shards=reading.num_shards,
            random_shuffle=shuffle,
            pad_last_batch=True,
            name="Reader",
            **file_args,
        )
        if shuffle:
            # Samples from a SHUFFLE_BUFFER window; whole shards in a new order every epoch (the
            # same on every rank: the default shuffle_after_epoch_seed, not the per-rank seed),
            # unless each process keeps its shard (stick_to_shard, for the decoder cache), which
            # DALI's shard readers cannot do with shards reshuffled.
            args.update(
                initial_fill=SHUFFLE_BUFFER, shuffle_after_epoch=not args.get("stick_to_shard")
            )
        if self.layout == "tfrecord":
            # DALI's TFRecord reader has no skip_cached_images: it reads every image's bytes, and
            # the decoder still finds the cached ones decoded.
            args["skip_cached_images"] = False
            self.reader = ops.readers.TFRecord(
                path=self.files, index_path=list(indexes), features=TFRECORD_FEATURES, **args
            )
            self.read_samples = self.read_tfrecord
        else:
            self.reader = ops.readers.Webdataset(
                paths=self.files,
                index_paths=list(indexes),
                ext=[";".join(WDS_IMAGE_EXTENSIONS), "cls"],
                missing_component_behavior="error",
                **args,
            )
            self.pad_digits = ops.Pad(fill_value=ord("0"), shape=[LABEL_DIGITS])
            self.to_int64 = ops.Cast(dtype=types.INT64)
            self.sum = ops.reductions.Sum(keep_dims=True)
            self.read_samples = self.read_wds
        return [(shard, *s["labels"]) for shard, s in zip(self.files, summaries)]

    def __call__(self):
        images, labels = self.read_samples()
        return images, self.to_int32(labels - self.label_offset)

    def read_tfrecord(self):
        record = self.reader()
        return record["image/encoded"], record["image/class/label"]

    def read_wds(self):
        images, text = self.reader()
        # .cls holds the label in ASCII digits ("103"). Padded on the right with "0" to
        # LABEL_DIGITS digits it reads as label * 10 ** padding; the division takes that off.
        digits = self.to_int64(self.pad_digits(text)) - ord("0")
        place_values = types.Constant(10 ** np.arange(LABEL_DIGITS - 1, -1, -1, dtype=np.int64))
        labels = self.sum(digits * place_values) // 10 ** (
            LABEL_DIGITS - text.shape(dtype=types.INT64)
        )
        return images, labels

    def read_repeated(self):
        names, labels = self.reader()
        return self.read_files(names), labels


class RepeatedAugmentation:
    """torchvision's RASampler (references/classification/sampler.py) as a DALI batch source of
    (file name, label): every epoch a permutation of the set drawn from ``seed`` + epoch, each index
    repeated ``reps`` times in a row, padded to a multiple of ``num_shards``; shard r takes every
    ``num_shards``-th from r, and keeps the first (len // 256 * 256) // num_shards of them. An epoch
    keeps its length and sees about 1 / ``reps`` of the images, each ``reps`` times, the copies on
    different shards where there are enough, each differently augmented. The last batch is filled
    with the shard's next indices, so every shard runs ``steps`` full batches.

    DALI's checkpoint restores the iteration of a source that takes a ``BatchInfo``, and the batch
    is a function of that alone (the source runs on, never ending an epoch; the iterator counts
    them by size), so a resumed run reads on from the same sample."""

    def __init__(self, files, labels, *, reps, shard_id, num_shards, batch_size, seed):
        self.files, self.labels, self.reps, self.seed = files, labels, reps, seed
        self.shard_id, self.num_shards, self.batch_size = shard_id, num_shards, batch_size
        self.selected = len(files) // 256 * 256 // num_shards
        self.steps = math.ceil(self.selected / batch_size)
        if not self.steps:
            raise DataError(
                f"--ra-sampler: {len(files)} training samples leave no batch for each of "
                f"{num_shards} process(es) (RASampler keeps len // 256 * 256 / processes per "
                f"process and epoch); expected at least 256 samples, or no --ra-sampler"
            )

    @functools.lru_cache(maxsize=2)  # an epoch's indices, computed once on its first batch
    def indices(self, epoch):
        import torch  # torchvision's own generator and permutation, as its sampler draws them

        generator = torch.Generator()
        generator.manual_seed(self.seed + epoch)
        order = torch.randperm(len(self.files), generator=generator).repeat_interleave(self.reps)
        total = math.ceil(len(order) / self.num_shards) * self.num_shards
        order = torch.cat([order, order[: total - len(order)]])
        return order[self.shard_id :: self.num_shards].tolist()

    def batch(self, info):
        epoch, step = divmod(info.iteration, self.steps)
        mine = self.indices(epoch)
        first = step * self.batch_size
        picked = [mine[k % len(mine)] for k in range(first, first + self.batch_size)]
        return (
            [np.frombuffer(self.files[i].encode(), np.uint8) for i in picked],
            [np.array([self.labels[i]], np.int32) for i in picked],
        )


def read_file_list(data_dir, file_list):
    """(files, labels) of a DALI file list: lines '<path relative to data_dir> <label>'; or of a
    list of files, unlabelled (images to predict on), each labelled by its position in it."""
    if not isinstance(file_list, (str, os.PathLike)):
        return list(file_list), list(range(len(file_list)))
    if not os.path.isfile(file_list):
        raise DataError(
            f"{file_list}: no such file (expected lines '<path relative to data_dir> <label>')"
        )
    with open(file_list) as f:
        entries = [line.rsplit(maxsplit=1) for line in f if line.strip()]
    if not all(len(e) == 2 and e[1].lstrip("-").isdigit() for e in entries):
        raise DataError(f"{file_list}: expected lines '<path relative to data_dir> <label>'")
    return [os.path.join(data_dir, path) for path, _ in entries], [int(n) for _, n in entries]


def padded_indexes(indexes, layout, extra):
    """Copies of DALI's index files of a set of shards with ``extra`` records repeated (see
    pipelines.repeats), in a temporary folder of this process."""
    from pipelines import repeats  # the samples every training reader repeats

    header = 1 if layout == "wds" else 0  # "v1.2 <samples>"
    lines = [read_bytes(index).decode().splitlines() for index in indexes]
    for k, line in repeats(
        [(k, line) for k, ls in enumerate(lines) for line in ls[header:]], extra
    ):
        lines[k].append(line)
    folder = tempfile.mkdtemp(prefix="dali-index-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    paths = [os.path.join(folder, f"{k}.idx") for k in range(len(lines))]
    for path, ls in zip(paths, lines):
        with open(path, "w") as f:
            f.write(
                "".join(
                    line + "\n" for line in ([f"v1.2 {len(ls) - 1}"] + ls[1:] if header else ls)
                )
            )
    return paths


def list_image_folder(data_dir, classes=None):
    """(files, labels, classes) of an ImageFolder tree, checked, in torchvision's order (as
    pipelines.ImageFolderReader lists a tree unchecked). ``classes``, the training split's names,
    number the labels instead of the tree's folders: a validation split that lacks some classes
    keeps train's indices, and a folder not in the list is an error."""
    if (layout := find_layout(data_dir)) != "folder":  # a missing or empty folder: find_layout's
        raise DataError(
            f"{data_dir}: {layout} shards, not an ImageFolder tree <dir>/<class>/<image>"
        )
    found = sorted(name for name, is_dir in entries(data_dir) if is_dir)
    index = {c: i for i, c in enumerate(found if classes is None else classes)}
    if unknown := [c for c in found if c not in index]:
        raise DataError(
            f"{os.path.join(data_dir, unknown[0])}: class {unknown[0]!r} is not one of the "
            f"{len(classes)} training classes"
        )
    files, labels, real = [], [], {}
    for c in found:
        folder = os.path.join(data_dir, c)
        twin = folder if remote(folder) else real.setdefault(os.path.realpath(folder), folder)
        if twin != folder:
            raise DataError(
                f"{folder}: the same folder as {twin} (a symlink), so its images would train "
                "under two labels; remove the link"
            )
        class_files = [f for f in walk(folder) if f.lower().endswith(IMG_EXTENSIONS)]
        if not class_files:
            raise DataError(
                f"{folder}: no images in this class folder (expected files ending in "
                f"{', '.join(IMG_EXTENSIONS)})"
            )
        files += class_files
        labels += [index[c]] * len(class_files)
    return files, labels, found if classes is None else list(classes)


def check_image_heads(files, where):
    """A ``DataError`` naming the first of the local image ``files`` (those of ``where``, a folder)
    that does not start as an image does (IMAGE_MAGIC: a text file, a GIF or a PDF named .jpg) or
    whose JPEG or PNG header is broken (broken_header); else their sizes and modification times
    (a row each, int64). Those that pass are kept
    with their sizes and times (HEAD_CACHE): a later start (a resume, a requeue, another run) reads
    only the files added or changed. A check of LONG_CHECK files or more says so in one line."""
    prefix = where.rstrip("/") + "/"
    rels = [f[len(prefix) :] if f.startswith(prefix) else f for f in files]
    key = hashlib.sha256(os.path.realpath(where).encode("utf-8", "surrogateescape")).hexdigest()
    cache = os.path.join(HEAD_CACHE, f"v{CHECKS}-{key[:32]}.npz")
    sizes, times, todo = [0] * len(files), [0] * len(files), range(len(files))
    if os.path.exists(cache):  # a start after the first: only what changed is read
        sizes, times, todo = unchanged_heads(cache, files, rels) or (sizes, times, todo)
    if len(todo) >= LONG_CHECK:
        print(f"{where}: checking {len(todo):,} images' first bytes", file=sys.stderr, flush=True)
    chunks = [[files[k] for k in todo[i : i + 1024]] for i in range(0, len(todo), 1024)]
    started, checked = time.time_ns(), 0
    with ThreadPoolExecutor(HEAD_THREADS) as pool, warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # size is no fault here
        try:
            for k, (size, mtime, why) in zip(todo, _all_heads(pool, chunks)):
                if why:
                    raise DataError(f"{files[k]}: {why}")
                sizes[k], times[k] = size, mtime
                checked += 1
        finally:
            if checked:  # what passed until a bad file or Ctrl-C, too
                save_heads(cache, rels, sizes, times, todo[checked:], started)
    return np.array([sizes, times], np.int64).T.reshape(-1, 2)


def _all_heads(pool, chunks):
    """_head of each file of ``chunks``, in order: chunk by chunk in this thread while each file
    takes less than SLOW_HEAD, then the rest in ``pool``'s threads, whose reads overlap, after two
    slow chunks in a row (one alone may be a pause: the first chunk's imports, a collection)."""
    slow = 0
    for k, chunk in enumerate(chunks):
        clock = time.perf_counter()
        yield from _heads(chunk)
        slow = slow + 1 if time.perf_counter() - clock > SLOW_HEAD * len(chunk) else 0
        if slow == 2:
            yield from itertools.chain.from_iterable(pool.map(_heads, chunks[k + 1 :]))
            return


def _heads(paths):
    return [_head(path) for path in paths]


def _head(path):
    """(size, modification time in ns, why it cannot be decoded or None) of an image file: from
    its first HEAD_BYTES, and PIL where they are a JPEG or PNG header that plain_jpeg_header cannot
    tell whole (see broken_header)."""
    try:  # os calls: Python's buffered file object would cost more than the read
        # not blocking: a FIFO named .jpg would wait for a writer
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                return 0, 0, "not a regular file (a FIFO, socket or device named as an image)"
            head = os.pread(fd, HEAD_BYTES, 0)
            why = image_fault(
                head,
                st.st_size,
                lambda at, n: os.pread(fd, n, at),
                lambda: os.fdopen(fd, "rb", closefd=False),
            )
            return st.st_size, st.st_mtime_ns, why
        finally:
            os.close(fd)
    except OSError as e:
        return 0, 0, f"cannot be read ({e.strerror})"


def image_fault(head, size, read, file):
    """Why the image of ``size`` bytes that starts with ``head`` (its first HEAD_BYTES) cannot be
    decoded, or None: not an image DALI decodes (not_an_image), a JPEG or PNG header broken
    (broken_header, where plain_jpeg_header cannot tell), a JPEG cut short (jpeg_end).
    ``read(offset, n)`` reads its bytes; ``file()`` opens it for PIL."""
    why = not_an_image(head)
    plain = head.startswith(PARSED_HEADERS) and plain_jpeg_header(head)
    if not why and head.startswith(PARSED_HEADERS) and not plain:
        with file() as f:
            why = broken_header(f)
    if not why and head.startswith(b"\xff\xd8"):
        why = jpeg_end(read, size, plain)
    return why


def not_an_image(head):
    """Why a file that starts with ``head`` is no image DALI decodes, or None."""
    if head.startswith(IMAGE_MAGIC) or (head[:4], head[8:12]) == (b"RIFF", b"WEBP"):
        return None
    found = f"its first bytes are {head[:8]!r}" if head else "it is empty"
    return (
        f"cannot decode this image: not an image file ({found}, not those of a JPEG, PNG, BMP, "
        "PPM/PGM, TIFF, WebP or JPEG 2000 file); remove or replace it"
    )


def plain_jpeg_header(head):
    """Where the scan's header ends, if ``head`` starts with a JPEG header that PIL opens
    (broken_header), told from segments PIL reads whole or checks as below, each within ``head``, a
    frame before the scan; 0 where PIL must tell (another segment, one cut short or past ``head``,
    a PNG)."""
    pos, framed = 2, False
    while pos + 4 <= len(head):
        ff, marker, length = struct.unpack_from(">BBH", head, pos)
        start, end = pos + 4, pos + 2 + length
        if ff != 0xFF or length < 2 or end > len(head):
            return 0
        if marker == 0xDA:  # the scan: PIL reads its header and no further
            return end if framed else 0
        if marker in JPEG_FRAMES:  # 8-bit samples, a size, 1, 3 or 4 components of 3 bytes each
            if length < 8 or length % 3 != 2:
                return 0
            bits, height, width, components = struct.unpack_from(">BHHB", head, start)
            if not (bits == 8 and height > 0 and width > 0 and components in (1, 3, 4)):
                return 0
            framed = True
        elif marker == 0xDB:  # quantization tables of 1 + 64 or 1 + 128 bytes, filling it
            while start < end:
                start += 65 if head[start] < 16 else 129
            if start != end:
                return 0
        elif not (marker in JPEG_PLAIN or (marker in JPEG_READ_7 and length >= 9)):
            return 0
        pos = end
    return 0


def jpeg_end(read, size, scan=0):
    """Why the JPEG of ``size`` bytes that ``read(offset, n)`` reads is not whole, or None. One cut
    short (a copy or download stopped) is decoded by nvJPEG and by DALI's CPU decoder without a
    word, the rest of the image grey: its end marker (FF D9) is missing. The scan's own bytes never
    hold one, so any after the scan's header (``scan``, where plain_jpeg_header found it) ends the
    image; a camera's trailer may follow it. The last TAIL_BYTES tell for most files; the others,
    and those whose header PIL judged, are read whole."""
    if scan and read(max(scan, size - TAIL_BYTES), TAIL_BYTES).find(b"\xff\xd9") >= 0:
        return None
    data = read(0, size)
    if not scan:  # PIL reads up to the end of the scan's header, and no further
        with contextlib.suppress(Exception), Image.open(f := io.BytesIO(data)):
            scan = f.tell()
    if data.find(b"\xff\xd9", scan or 2) >= 0:
        return None
    return (
        "cannot decode this image: its bytes stop before the JPEG's end (cut short; DALI would "
        "decode the part there without a word, the rest grey); remove or replace it"
    )


def broken_header(f):
    """Why the JPEG or PNG in file ``f`` cannot be decoded, from its header alone (PIL reads no
    pixels for it), or None. DALI 2.4's parser can kill the process (SIGSEGV) on an image that ends
    or breaks before its size: random bytes after a JPEG's first marker, a PNG cut after its first
    chunk."""
    try:
        f.seek(0)
        with Image.open(f):
            return None
    except Image.DecompressionBombError:  # whole, only large: DALI decodes it
        return None
    except Exception as e:  # PIL's own: not an image it knows, a chunk cut short, a bad marker
        why = (str(e).strip() or type(e).__name__).splitlines()[0][:120]
        return f"cannot decode this image: its header is broken or cut short (PIL: {why})"


def unchanged_heads(cache, files, rels):
    """(sizes, modification times, indices of the files to check) of ``files`` (``rels`` relative
    to their folder), from the header check's ``cache`` of that folder: a file of the same name,
    size and time as there passed it then; any other is to check. None where the cache cannot be
    read (damaged, cut short, of another format): then every file is checked again."""
    try:
        with np.load(cache) as saved:
            names = saved["names"].tobytes().decode("utf-8", "surrogateescape").split("\n")
            then = np.stack([saved["size"], saved["mtime"]], axis=1).astype(np.int64)
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
        return None
    if len(names) != len(then):  # an array's header damaged
        return None
    now = file_stamps(files)
    if names != rels:  # files added or removed since: each found by name
        index = {name: k for k, name in enumerate(names)}
        then = np.array([then[index[rel]] if rel in index else (-1, -1) for rel in rels], np.int64)
    todo = np.flatnonzero((now != then.reshape(-1, 2)).any(axis=1)).tolist()
    return now[:, 0].tolist(), now[:, 1].tolist(), todo


def file_stamps(files):
    """The (size, modification time in ns) row of each of the local ``files``, int64; (-1, -1)
    where one is gone or unreadable. Many files are shared among forked processes, one a core
    (STAT_SHARE files or more each): threads would only queue for the GIL, which each stat gives
    up and takes back."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1
    parts = min(cores, len(files) // STAT_SHARE)
    if parts < 2 or multiprocessing.current_process().daemon:  # a pool's worker may not fork
        return _stamps(files)
    cuts = [len(files) * k // parts for k in range(parts + 1)]
    # forked, the processes have the list already: sent to them, it would cost what they save
    fork = multiprocessing.get_context("fork")
    try:
        with ProcessPoolExecutor(parts, fork, _keep_files, (files,)) as pool:
            return np.concatenate(list(pool.map(_stamps_between, cuts[:-1], cuts[1:])))
    except BrokenProcessPool:  # one was killed (out of memory): the stat is done here instead
        return _stamps(files)


def _stamps(files):  # a file at a time: no tuple a file is kept
    return np.fromiter(map(_stat, files), np.dtype((np.int64, 2)), len(files)).reshape(-1, 2)


def _keep_files(files):  # in each of file_stamps' processes
    global _STAMPED
    _STAMPED = files


def _stamps_between(start, stop):
    return _stamps(_STAMPED[start:stop])


def _stat(path):
    try:
        found = os.stat(path)
    except OSError:  # gone or unreadable: _head says which
        return -1, -1
    return found.st_size, found.st_mtime_ns


def save_heads(cache, rels, sizes, times, unchecked, started):
    """Writes the header check's ``cache`` (whole: atomic_open): the files ``rels`` that passed it
    (all but ``unchecked``), with their sizes and modification times. A file changed within
    RACY_SECONDS before the check ``started`` (ns) is left out: changed again within the same tick
    of the file system's clock, it would keep its time. Nothing is written where none is kept."""
    kept = np.ones(len(rels), bool)
    kept[list(unchecked)] = False
    kept &= np.array(times, np.int64) < started - RACY_SECONDS * 10**9
    if not kept.any():
        return
    names = "\n".join(itertools.compress(rels, kept)).encode("utf-8", "surrogateescape")
    try:
        os.makedirs(HEAD_CACHE, exist_ok=True)
        with atomic_open(cache) as f:
            np.savez(
                f,
                names=np.frombuffer(names, np.uint8),
                size=np.array(sizes, np.int64)[kept],
                mtime=np.array(times, np.int64)[kept],
            )
    except OSError as e:  # a cache, not the data: the next start checks again
        print(f"{cache}: not written ({e.strerror}); the next start checks again", file=sys.stderr)


def find_layout(split_dir):
    """What ``split_dir`` holds: "folder" (class folders), "tfrecord" or "wds" (WebDataset .tar
    shards)."""
    if not isdir(split_dir):
        raise DataError(
            f"{split_dir}: no such directory (expected class folders, TFRecord files or .tar "
            "shards)"
        )
    found = set()
    for name, is_dir in entries(split_dir):
        if is_dir:
            found.add("folder")
        elif TFRECORD_NAME.fullmatch(name):
            found.add("tfrecord")
        elif name.endswith(".tar") and not name.startswith("."):
            found.add("wds")
    if len(found) != 1:
        raise not_one_layout(split_dir, found)
    return found.pop()


def not_one_layout(split_dir, found):
    """find_layout's error for a folder that holds no layout it knows, or several."""
    if found:
        return DataError(
            f"{split_dir}: holds {' and '.join(sorted(found))} data; keep one layout in a folder"
        )
    return DataError(
        f"{split_dir}: no class folders, TFRecord files or .tar shards in it (expected "
        "<dir>/<class>/<image>, <dir>/*.tfrecord or <dir>/train-00000-of-01024, or <dir>/*.tar)"
    )


def shard_files(split_dir, layout):
    """The TFRecord files or tar shards of a split, sorted by name."""
    match = (
        TFRECORD_NAME.fullmatch
        if layout == "tfrecord"
        else lambda n: n.endswith(".tar") and n[0] != "."
    )
    return sorted(
        os.path.join(split_dir, n) for n, is_dir in entries(split_dir) if not is_dir and match(n)
    )


def check_manifest(split_dir, shards):
    """A ``DataError`` naming a shard that the set's manifest.json (make_shards.py writes it beside
    the splits) lists for this split and that is not there: a copy that lost a shard would train on
    fewer samples."""
    split_dir = split_dir.rstrip("/") if remote(split_dir) else os.path.abspath(split_dir)
    manifest = os.path.join(os.path.dirname(split_dir), "manifest.json")
    split = os.path.basename(split_dir)
    try:
        text = read_bytes(manifest)
    except FileNotFoundError:
        return  # sets written by other tools have none
    except OSError as e:
        raise DataError(f"{manifest}: cannot be read ({e.strerror})") from None
    try:  # a split the manifest does not describe has nothing to check
        listed = json.loads(text)["splits"].get(split, {"shards": []})["shards"]
    except (ValueError, KeyError, TypeError, AttributeError):
        listed = None
    if not (isinstance(listed, list) and all(isinstance(name, str) for name in listed)):
        raise DataError(
            f"{manifest}: expected the JSON manifest make_shards.py writes "
            f'({{"splits": {{"{split}": {{"shards": [shard file names]}}}}}}); write the set '
            "again, or move the file away if another tool wrote it"
        )
    missing = sorted(set(listed) - {os.path.basename(shard) for shard in shards})
    if missing:
        raise DataError(
            f"{os.path.join(split_dir, missing[0])}: missing, but {manifest} lists it "
            f"({len(missing)} of "
            f"{len(listed)} shards missing); copy the set again or rerun make_shards.py"
        )


def read_classes_txt(split_dir):
    """The class names in ``split_dir/classes.txt`` (one a line, in index order), or None without
    one."""
    path = os.path.join(split_dir, "classes.txt")
    expected = "expected UTF-8 text, one class name a line, in index order"
    try:
        text = read_bytes(path).decode("utf-8")
    except (FileNotFoundError, IsADirectoryError):
        return None
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not UTF-8 text (byte {e.start}); {expected}") from None
    # names exactly as written, spaces and all (make_shards.py refuses names holding a line break);
    # an empty line names no folder, and an editor may leave one at the end
    names = [line for line in text.splitlines() if line]
    if not names:  # a 0-way head would fail only once training starts
        raise DataError(f"{path}: no class names in it; {expected}")
    return names


# Our own indexer rather than DALI's tfrecord2idx / wds2idx: it also reads every label once (the
# label range check), finds truncated shards, and records what it indexed, so that an index is never
# trusted for a shard that changed since.


def shard_index(shard, layout):
    """(path of DALI's index of ``shard``, {"samples": n, "labels": [lowest, highest] stored
    label}).

    The index is built on first use, beside the shard or, when its folder is read-only, under
    ``INDEX_CACHE``. A summary beside the index records the shard's size, modification time and a
    digest of its first and last bytes (a copy made with ``cp -p`` or ``rsync -a`` keeps the other
    two); an index whose shard no longer matches them (rewritten, truncated) is built again, never
    trusted. An s3:// shard's index must be beside it already (see ``remote_shard_index``).
    """
    if remote(shard):
        return remote_shard_index(shard, layout)
    try:
        stat = os.stat(shard)
        source, digest = {"bytes": stat.st_size, "mtime_ns": stat.st_mtime_ns}, shard_digest(shard)
    except OSError as e:  # a link to nothing, a shard this user may not read
        raise DataError(f"{shard}: cannot be read ({e.strerror})") from None
    beside = shard + ".idx"
    cached = os.path.join(
        INDEX_CACHE,
        hashlib.sha1(os.path.abspath(shard).encode()).hexdigest()[:16],
        os.path.basename(shard) + ".idx",
    )
    for index in (beside, cached):
        try:
            with open(index + ".json") as f:
                summary = json.load(f)
            if (summary["shard"], summary["digest"], summary["index_bytes"], summary["checks"]) == (
                source,
                digest,
                os.path.getsize(index),
                CHECKS,  # its samples were checked as today's are
            ):
                return index, summary
        except (OSError, ValueError, KeyError, TypeError):
            pass
    index = beside if os.access(os.path.dirname(os.path.abspath(shard)), os.W_OK) else cached
    text, labels, samples = _scan_shard(shard, layout)
    summary = {
        "shard": source,
        "digest": digest,
        "index_bytes": len(text.encode()),
        "samples": samples,
        "labels": labels,
        "checks": CHECKS,
    }
    os.makedirs(os.path.dirname(index), exist_ok=True)
    with atomic_open(index, "w") as f:
        f.write(text)
    with atomic_open(index + ".json", "w") as f:  # last: the index counts only once this exists
        json.dump(summary, f)
    return index, summary


def shard_digest(shard, ends=1 << 16):
    """SHA-1 of a shard's first and last ``ends`` bytes: a rewrite with other samples changes
    them."""
    if remote(shard):  # two ranged reads
        head, size = read_head(shard, ends)
        return hashlib.sha1(
            head
            + (s3_get(shard, f"bytes={max(len(head), size - ends)}-") if size > len(head) else b"")
        ).hexdigest()
    with open(shard, "rb") as f:
        head = f.read(ends)
        f.seek(max(len(head), os.fstat(f.fileno()).st_size - ends))
        return hashlib.sha1(head + f.read()).hexdigest()


def _scan_shard(shard, layout):
    """(DALI's index of ``shard`` as text, [lowest, highest] stored label, number of samples)."""
    lines, labels = [], []
    if layout == "tfrecord":
        for i, start, length, features, f in _tfrecord_records(shard):
            if "image/encoded" not in features or "image/class/label" not in features:
                raise DataError(
                    f"{shard}: record {i} lacks the image/encoded or image/class/label feature"
                )
            labels.append(_feature_values(f, features["image/class/label"])[0])
            lines.append(f"{start} {length}\n")
            check_sample(shard, f"record {i}", _feature_values(f, features["image/encoded"])[0])
    else:
        for key, parts, tar in _tar_samples(shard):
            images = [ext for ext in parts if ext in WDS_IMAGE_EXTENSIONS]
            if len(images) != 1 or "cls" not in parts:
                raise DataError(
                    f"{shard}: sample {key} has {', '.join(sorted(parts))}; expected one image "
                    f"({', '.join(WDS_IMAGE_EXTENSIONS)}) and a .cls label"
                )
            check_sample(shard, f"sample {key}", tar.extractfile(parts[images[0]]).read())
            text = tar.extractfile(parts["cls"]).read()
            if not (text.isdigit() and len(text) <= LABEL_DIGITS):
                raise DataError(
                    f"{shard}: sample {key}: .cls holds {text[:20]!r}; expected the class index in "
                    f"decimal digits"
                )
            labels.append(int(text))
            lines.append(
                " ".join(f"{ext} {m.offset_data} {m.size} {m.name}" for ext, m in parts.items())
                + "\n"
            )
        lines.insert(0, f"v1.2 {len(lines)}\n")
    if not labels:
        raise DataError(f"{shard}: holds no samples")
    return "".join(lines), [min(labels), max(labels)], len(labels)


def check_sample(shard, which, image):
    """A ``DataError`` naming a shard's sample that DALI cannot decode whole, as a file's check
    finds it (image_fault)."""
    head, size = image[:HEAD_BYTES], len(image)
    why = image_fault(head, size, lambda at, n: image[at : at + n], lambda: io.BytesIO(image))
    if why:
        why = why.removesuffix("; remove or replace it")
        raise DataError(f"{shard}: {which}: {why}; write the shard again without it")


def _varint(f):
    """One protobuf varint read from ``f``."""
    value = shift = 0
    while True:
        byte = f.read(1)
        if not byte:
            raise EOFError
        value |= (byte[0] & 0x7F) << shift
        if byte[0] < 0x80:
            return value
        shift += 7


def _tfrecord_records(shard):
    """(index, offset, length, {feature name: (offset, length)}, record) of each record of a
    TFRecord file, ``record`` its Example as a file in memory, where the features' offsets point.
    Both of a record's checksums are checked: a byte changed since the shard was written is one
    line naming the record, not a picture trained on."""
    size = os.path.getsize(shard)
    with open(shard, "rb") as f:
        i = 0
        while f.tell() < size:
            start = f.tell()
            # uint64 length, uint32 masked CRC of the length, the Example, its CRC
            header = f.read(12)
            if len(header) == 12 and struct.unpack("<I", header[8:])[0] != masked_crc(header[:8]):
                raise changed_record(shard, i, start)
            end = (
                start + 12 + (struct.unpack("<Q", header[:8])[0] if len(header) == 12 else size) + 4
            )
            if end > size:
                raise DataError(
                    f"{shard}: truncated or not a TFRecord file (record {i} at byte {start} runs "
                    "past "
                    f"the end of the file); write it again"
                )
            data = f.read(end - start - 16)
            if struct.unpack("<I", f.read(4))[0] != masked_crc(data):
                raise changed_record(shard, i, start)
            record = io.BytesIO(data)
            features = {}
            try:
                if record.tell() < len(data):  # Example.features: a tag and a length, then the map
                    _varint(record)
                    _varint(record)
                while record.tell() < len(data):  # Features.feature, a map: key = 1, value = 2
                    _varint(record)
                    entry_end = _varint(record) + record.tell()
                    key = value = None
                    while record.tell() < entry_end:
                        field, length = _varint(record) >> 3, _varint(record)
                        if field == 1:
                            key = record.read(length).decode()
                        else:
                            value = (record.tell(), length)
                            record.seek(length, os.SEEK_CUR)
                    features[key] = value
            except (EOFError, UnicodeDecodeError):
                raise DataError(f"{shard}: record {i} is not a tf.train.Example") from None
            yield i, start, end - start, features, record
            i += 1


def changed_record(shard, i, start):
    return DataError(
        f"{shard}: record {i} at byte {start} fails its checksum (a byte changed since the shard "
        "was written); write the shard again"
    )


def masked_crc(data):
    """TFRecord's checksum: CRC-32C, rotated and offset as TensorFlow masks it."""
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _feature_values(f, where):
    """The values of the serialized tf.train.Feature at ``where``: bytes (bytes_list) or ints
    (int64_list)."""
    f.seek(where[0])
    feature = io.BytesIO(f.read(where[1]))
    kind = _varint(feature) >> 3  # 1 bytes_list, 2 float_list, 3 int64_list
    values_end = _varint(feature) + feature.tell()
    values = []
    while feature.tell() < values_end:
        wire_type = _varint(feature) & 7
        if wire_type == 0:  # one unpacked int64
            values.append(_varint(feature))
        elif kind == 3:  # packed int64s
            packed = io.BytesIO(feature.read(_varint(feature)))
            while packed.tell() < len(packed.getbuffer()):
                values.append(_varint(packed))
        else:
            values.append(feature.read(_varint(feature)))
    return [
        v - (1 << 64) if isinstance(v, int) and v >= 1 << 63 else v for v in values
    ]  # two's complement


def _tar_samples(shard):
    """(key, {extension: member}, open tar) of each sample of a WebDataset tar, in file order."""
    size = os.path.getsize(shard)
    try:
        with tarfile.open(shard, "r:") as tar:
            key, parts = None, {}
            for member in tar:  # reads the headers only
                name = os.path.basename(member.name)
                if not member.isfile() or name.startswith("."):
                    continue
                # DALI's index is whitespace-separated lines of "<ext> <offset> <size> <name>"
                if re.search(r"\s", member.name):
                    raise DataError(
                        f"{shard}: member {member.name!r} has a space or line break in its name, "
                        "which DALI's index of a tar cannot hold; rename it"
                    )
                if member.offset_data + member.size > size:
                    raise DataError(
                        f"{shard}: truncated ({member.name} runs past the end of the file); write "
                        "it again"
                    )
                # WebDataset's key: the path up to the first dot of the file name; the rest is the
                # extension
                stem, _, ext = name.partition(".")
                if member.name[: -len(name)] + stem != key:
                    if parts:
                        yield key, parts, tar
                    key, parts = member.name[: -len(name)] + stem, {}
                parts[ext] = member
            if parts:
                yield key, parts, tar
            # a tar cut between two members reads as a shorter archive; only its missing end marker
            # tells
            tar.fileobj.seek(tar.offset)
            if tar.fileobj.read(1024) != bytes(1024):
                raise DataError(
                    f"{shard}: truncated (no end-of-archive marker after its last member); write "
                    "it again"
                )
    except tarfile.TarError as e:
        raise DataError(f"{shard}: not an uncompressed tar file ({e})") from None


class _DecodeCheck(Pipeline):
    """``op`` (DALI's header parser or its decoder, on the CPU) over batches of encoded images from
    ``batches``."""

    def __init__(self, batches, op, batch_size):
        super().__init__(
            batch_size, min(4, os.cpu_count() or 1), None, exec_async=False, exec_pipelined=False
        )
        self.source, self.op = ops.ExternalSource(source=batches, batch=True), op

    def define_graph(self):
        return self.op(self.source())


def _samples(layout, path):
    """(description, encoded bytes) of every image of a file or shard."""
    if layout == "folder":
        with open(path, "rb") as f:
            yield path, f.read()
    elif layout == "tfrecord":
        for i, _, _, features, f in _tfrecord_records(path):
            yield (
                f"{path}: sample {i}",
                _feature_values(f, features["image/encoded"])[0]
                if "image/encoded" in features
                else b"",
            )
    else:
        for key, parts, tar in _tar_samples(path):
            yield (
                f"{path}: sample {key}",
                next(
                    (
                        tar.extractfile(m).read()
                        for ext, m in parts.items()
                        if ext in WDS_IMAGE_EXTENSIONS
                    ),
                    b"",
                ),
            )


def _first_failing(samples, op, batch_size=256):
    """The description of the first of ``samples`` on which ``op`` fails, or None. DALI stops a
    pipeline at the first failure, so a failed batch is tried again one image at a time."""
    fed = []

    def batches():
        while chunk := list(itertools.islice(samples, batch_size)):
            fed.append(chunk)
            yield [np.frombuffer(data, np.uint8) for _, data in chunk]

    def fails(source, size):
        pipe = _DecodeCheck(source, op, size)
        pipe.build()
        try:
            while True:
                pipe.run()
        except StopIteration:
            return False
        except RuntimeError:
            return True

    if not fails(batches(), batch_size):
        return None
    return next(
        (name for name, data in fed[-1] if fails(iter([[np.frombuffer(data, np.uint8)]]), 1)), None
    )


def find_undecodable(pipe):
    """The first sample of ``pipe``'s data that DALI's own CPU decoder cannot decode, or None:
    "<file>" for an image file, "<shard>: sample <record index or key>" in a shard; meant for after
    the pipeline failed, to name the culprit. DALI parses every image's header first (quick), and
    decodes them in full only if all parse."""
    for op in (ops.PeekImageShape(), ops.decoders.Image(output_type=types.RGB)):
        culprit = _first_failing(
            itertools.chain.from_iterable(_samples(pipe.layout, p) for p in pipe.files), op
        )
        if culprit is not None:
            return culprit
    return None


def _image_size(name, data):
    """(width, height) of an encoded image, from its header; ``DataError`` naming ``name`` (a file,
    or a shard's sample) when PIL cannot read it."""
    try:
        with Image.open(io.BytesIO(data)) as image:
            return image.size
    except UnidentifiedImageError:  # its message names the BytesIO, not the file
        raise DataError(
            f"{name}: cannot decode this image (PIL does not know it as an image); remove or "
            "replace it"
        ) from None
    except (OSError, Image.DecompressionBombError) as e:  # PIL's limit: ~179 M pixels
        raise DataError(
            f"{name}: cannot decode this image (PIL: {e}); remove or replace it"
        ) from None


def decoded_size(pipe, sample=256):
    """MB that the images of ``pipe``'s shard take decoded (8-bit RGB), estimated from the headers
    of a sample of them: what a decoder cache must hold for every epoch after the first to find them
    all there."""
    files = random.Random(0).sample(
        pipe.files, min(len(pipe.files), sample if pipe.layout == "folder" else 8)
    )
    samples = itertools.islice(
        itertools.chain.from_iterable(_samples(pipe.layout, f) for f in files), sample
    )
    pixels = [math.prod(_image_size(name, data)) for name, data in samples]
    return (
        3
        * sum(pixels)
        / max(1, len(pixels))
        * math.ceil(pipe.num_samples / pipe.num_shards)
        / 2**20
    )


def plan_decoder_cache(mode, pipes, free_mb):
    """(MB of decoder cache for ``pipes``, or None; a line saying which and why). ``mode`` "off",
    "on" (all of the pipelines' shares of decoded images), "auto" (on when they fit in half of
    ``free_mb``, the GPU's free memory, the rest left to the model), or a number of MB: a cache of
    that size, holding the images that fit, the others decoded whole every epoch. DALI keeps one
    cache per GPU for every decoder of the process, so all of ``pipes`` get the same size."""
    if mode == "off":
        return None, None
    if pipes[0].device_id is None:  # DALI on the CPU: said when asked for, auto means "if it can"
        if mode == "auto":
            return None, None
        return None, (
            f"decoder cache off ({mode}): DALI runs on the CPU, and its cache holds only what its "
            f"GPU decoder decodes"
        )
    why = None
    if remote(pipes[0].read.data_dir):  # the estimate reads a sample of the images from Python
        why = "not for data in object storage, whose images it cannot sample"
    elif pipes[0].decoder_device == "cpu":
        why = "not with --decoder cpu: DALI caches what its GPU decoder decodes"
    elif pipes[0].read.ra:  # a process's share changes every epoch: a cache of it would miss
        why = "not with --ra-sampler, whose processes read other images every epoch"
    if why:
        if mode != "auto":
            raise DataError(f"--decoder-cache {mode}: {why}; pass auto or off")
        return None, f"decoder cache off ({mode}): {why}"
    need = 1.1 * sum(decoded_size(p) for p in pipes)  # 1.1: room for the estimate's error
    if mode in ("on", "auto"):
        size = need if mode == "on" or need < free_mb / 2 else None
    else:
        size = min(need, mode)
    state = "off" if size is None else "on" if size == need else f"on, about {size / need:.0%}"
    return (None if size is None else math.ceil(size)), (
        f"decoder cache {state} ({mode}): this process's images take about {need / 1024:.1f} GB "
        f"decoded, and {free_mb / 1024:.1f} GB of GPU memory are free"
    )


@contextlib.contextmanager
def decode_errors_named(pipe):
    """A DALI error caused by an image of ``pipe``'s that cannot be decoded becomes a ``DataError``
    naming it (name_undecodable)."""
    try:
        yield
    except RuntimeError as e:
        name_undecodable(pipe, e)
        raise


def name_undecodable(pipe, error):
    """A ``DataError`` naming the image of ``pipe``'s behind DALI's ``error``: one that cannot be
    decoded, or one changed or gone since the run listed it; nothing where none is to blame."""
    dali = (str(error).split("encountered:")[-1].strip(" :\n") or "?").splitlines()[
        0
    ]  # its words, after its traceback
    if remote(
        pipe.read.data_dir
    ):  # searching for the culprit would read the whole set back through Python
        changed = find_changed(pipe)
        raise DataError(
            f"{changed}: changed or gone since this run listed it (DALI: {dali})"
            if changed
            else f"{pipe.read.data_dir}: DALI failed reading this data (DALI: {dali})"
        ) from None
    # a file replaced or deleted under the run: the search below would stop on a deleted one
    stamps = getattr(pipe.read, "stamps", None)
    if stamps is not None and (changed := first_restamped(pipe.files, stamps)):
        what = "changed" if os.path.exists(changed) else "gone"
        raise DataError(f"{changed}: {what} since this run listed it (DALI: {dali})") from None
    if gone := first_gone(pipe.files):
        raise DataError(f"{gone}: gone since this run listed it (DALI: {dali})") from None
    culprit = find_undecodable(pipe)
    if culprit is not None:
        raise DataError(
            f"{culprit}: cannot decode this image (DALI: {dali}); remove or replace it"
        ) from None


# segmentation data: .npy headers and split CSVs ---------------------------------------------------

# What a segmentation set's .npy files may be: (what, the axes after (H, W), the dtypes, the words
# for them). A set holds one kind of image and one of mask (DALI reads a batch of one kind).
IMAGE_DTYPES = ("uint8", "uint16", "float32")
MASK_DTYPES = ("bool", "uint8", "int8", "uint16", "int16", "uint32", "int32", "uint64", "int64")
NPY_KINDS = (
    (
        "image",
        ((), (1,), (3,)),
        IMAGE_DTYPES,
        f"an image of shape (H, W), (H, W, 1) or (H, W, 3) of {', '.join(IMAGE_DTYPES)}",
    ),
    (
        "mask",
        ((), (1,)),
        MASK_DTYPES,
        "a mask of shape (H, W) or (H, W, 1) of integer class indices",
    ),
)
# Bytes read from the start of each .npy: numpy pads its headers to 128 bytes unless the shape is
# long.
NPY_PREFIX = 256
NPY_MAGIC = b"\x93NUMPY"
# The columns of the split CSVs that data_processing.make_csv_file_npy writes.
CSV_HEADER = ["index", "images", "masks"]


@functools.lru_cache(maxsize=4096)
def _parse_npy_header(header):
    """(shape, dtype) of a raw .npy header. A set's files mostly share one header, and parsing it (a
    Python literal) costs more than reading it, so each distinct header is parsed once (timings in
    results/README.md)."""
    f = io.BytesIO(header)
    version = np.lib.format.read_magic(f)
    read = np.lib.format.read_array_header_2_0  # versions 2 and 3: a 4-byte header length
    if version == (1, 0):
        read = np.lib.format.read_array_header_1_0
    with NPY_PARSE:
        shape, _, dtype = read(f)
    return shape, dtype


def npy_header(path):
    """Shape and dtype from a .npy header, read without the array data; ``DataError`` when the file
    is missing, not a .npy array, or shorter than its header says (a truncated copy)."""
    try:
        head, size = read_head(path, NPY_PREFIX)
        if not head.startswith(NPY_MAGIC):
            raise DataError(
                f"{path}: not a .npy array (it does not start with numpy's magic string)"
            )
        # magic (6 bytes), version (2), header length (2 bytes in version 1, 4 after), header
        start = 10 if head[6:7] == b"\x01" else 12
        end = start + int.from_bytes(head[8:start], "little")
        if end > len(head):
            head, size = read_head(path, end)
    except FileNotFoundError:
        raise DataError(f"{path}: no such file") from None
    except OSError as e:
        raise DataError(f"{path}: cannot be read ({e.strerror})") from None
    try:
        shape, dtype = _parse_npy_header(head[:end])
    except ValueError as e:
        raise DataError(f"{path}: not a .npy array ({e})") from None
    if dtype.hasobject:  # its data is a pickle, of no size that the header tells
        raise DataError(
            f"{path}: holds pickled Python objects (dtype {dtype}); expected a plain numeric array"
        )
    needed = end + math.prod(shape) * dtype.itemsize
    if size < needed:
        raise DataError(
            f"{path}: truncated: {size} bytes, but its header ({shape} {dtype}) needs {needed}"
        )
    return shape, dtype


def read_split(prepared_root, split):
    """(images, masks): absolute ``.npy`` paths of ``prepared_root/csv_file/<split>.csv``, each
    there."""
    path = os.path.join(prepared_root, "csv_file", f"{split}.csv")
    columns = ",".join(CSV_HEADER)
    try:
        reader = csv.reader(io.StringIO(read_bytes(path).decode("utf-8"), newline=""))
    except (FileNotFoundError, IsADirectoryError):
        raise DataError(
            f"{path}: no such file (expected a split written by make_csv_file_npy)"
        ) from None
    if (header := next(reader, None)) != CSV_HEADER:
        raise DataError(f"{path}: header is {header}, expected {columns}")
    imgs, lbls = [], []
    for row in reader:
        if len(row) != 3:
            raise DataError(
                f"{path} line {reader.line_num}: expected 3 columns ({columns}), got {row}"
            )
        pair = [os.path.join(prepared_root, rel) for rel in row[1:]]
        image, mask = pair if remote(prepared_root) else map(os.path.abspath, pair)
        if missing := next((file for file in (image, mask) if not isfile(file)), None):
            raise DataError(f"{path} row index {row[0]}: {missing}: no such file")
        imgs.append(image)
        lbls.append(mask)
    if not imgs:
        raise DataError(f"{path}: no rows after its header (expected {columns} rows, one per pair)")
    return imgs, lbls


def check_finite_pixels(paths, threads=8):
    """A ``DataError`` naming the first of the float image ``paths`` that holds a NaN or an
    infinity: each is read once, on ``threads``."""
    with ThreadPoolExecutor(max(1, threads or 1)) as pool:
        finite = pool.map(lambda path: bool(np.isfinite(load_npy(path)).all()), paths)
        if found := next((path for path, ok in zip(paths, finite) if not ok), None):
            raise DataError(
                f"{found}: holds NaN or infinite pixels; a float image must be finite everywhere"
            )


def scan_masks(lbls, limit, threads=8, ignore=None):
    """((path, largest value) of the first mask in ``lbls`` that holds a value above ``limit``, or
    None; how many masks hold a class above 0), ``ignore``'s pixels aside: every mask is read
    once, on ``threads`` threads."""

    def largest_kept(path):
        mask = load_npy(path)
        return int(mask[mask != ignore].max(initial=0) if ignore is not None else mask.max())

    with ThreadPoolExecutor(threads) as pool:
        largest = list(pool.map(largest_kept, lbls))
    above = next(((path, value) for path, value in zip(lbls, largest) if value > limit), None)
    return above, sum(value > 0 for value in largest)


def check_segmentation_files(imgs, lbls):
    """Checks an image/mask ``.npy`` set before DALI reads it, from the files' headers alone: each
    file of its kind (NPY_KINDS), one kind of image and one of mask in a set (DALI reads a batch of
    one kind), ``imgs[i]`` of ``lbls[i]``'s height x width; else a ``DataError`` naming the file.
    Returns the first pair's ``((shape, dtype), (shape, dtype))``, which stands for the set."""
    imgs, lbls = [] if imgs is None else list(imgs), [] if lbls is None else list(lbls)
    if len(imgs) == 0:
        raise DataError("got an empty list of images")
    if len(imgs) != len(lbls):
        raise DataError(f"got {len(imgs)} images but {len(lbls)} masks (first image: {imgs[0]})")
    headers = list(overlapped(npy_header, imgs + lbls, remote(imgs[0])))
    images, masks = headers[: len(imgs)], headers[len(imgs) :]
    for kind, paths, found in zip(NPY_KINDS, (imgs, lbls), (images, masks)):
        what, axes, dtypes, expected = kind
        first_shape, first_dtype = found[0]
        for path, (shape, dtype) in zip(paths, found):
            fits = len(shape) in (2, 3) and shape[2:] in axes and 0 not in shape
            if not (fits and dtype.name in dtypes and dtype.isnative):
                raise DataError(f"{path}: expected {expected}, got {shape} {dtype}")
            if shape[2:] != first_shape[2:] or dtype != first_dtype:
                raise DataError(
                    f"{path}: {what} of shape {shape} {dtype}, but the set's first {what} "
                    f"{paths[0]} is {first_shape} {first_dtype} (all {what}s of a set share their "
                    "number of dimensions, channels and dtype)"
                )
    for img, lbl, (image_shape, _), (mask_shape, _) in zip(imgs, lbls, images, masks):
        if image_shape[:2] != mask_shape[:2]:
            raise DataError(
                f"{lbl}: mask is {mask_shape[0]}x{mask_shape[1]} but its image {img} is "
                f"{image_shape[0]}x{image_shape[1]} (height x width must match)"
            )
    return images[0], masks[0]
