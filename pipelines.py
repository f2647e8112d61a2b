"""DALI input pipelines for PyTorch image training: classification and segmentation.

One class per task and split, written with DALI's ops API: operators are built in ``__init__``,
``define_graph`` wires them in the order the data flows. Every pipeline runs on a GPU
(``device_id=0``: mixed JPEG decode, GPU resize and augmentations) and on a machine with no GPU
at all (``device_id=None``: every operator on the CPU, no CUDA call anywhere). This file alone,
with DALI, NumPy and PyTorch installed, runs these on the CPU over an ImageFolder tree in train/
and .npy pairs in npy/images/ and npy/masks/ (``device_id=0`` runs them on GPU 0):

    from pipelines import ClassifyTrainPipeline, classify_iterator
    pipe = ClassifyTrainPipeline(8, num_threads=2, device_id=None, data_dir="train", crop_size=64)
    for batch in classify_iterator(pipe):
        images, labels = batch[0]["data"], batch[0]["label"].squeeze(-1).long()

    import glob
    from pipelines import fetch_dali_loader, segment_iterator
    image_npys = sorted(glob.glob("npy/images/*.npy"))
    mask_npys = sorted(glob.glob("npy/masks/*.npy"))  # mask_npys[i] is image_npys[i]'s
    pipe = fetch_dali_loader(image_npys, mask_npys, 4, "train", device_id=None, size=(128, 128))
    for batch in segment_iterator(pipe):
        images, masks = batch[0]["image"], batch[0]["mask"].long()

Changing an augmentation is an edit of this file alone. Below the pipelines sit the few
operator-level helpers their ``define_graph`` calls (the CPU fallbacks).

What is read, alone: a local ImageFolder tree (``ImageFolderReader``) and lists of ``.npy`` image
and mask files, taken as they are. Their files are the caller's to check: DALI 2.4 can kill the
process on an image file it cannot decode, and reads a mask of the wrong size without a word. The
trainers check them first with data_sources.py, which names the offending file: pass
``reader=data_sources.ClassifyReader`` to a classification pipeline, and call
``data_sources.check_segmentation_files(imgs, lbls)`` (and ``check_finite_pixels`` for float
images) before ``fetch_dali_loader``. Other layouts (TFRecord files, WebDataset tars, DALI file
lists, ``s3://``, repeated augmentation) are data_sources.py's: it is imported where one is asked
for.
"""

import dataclasses
import functools
import math
import os
import warnings
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
from nvidia.dali import math as dmath
from nvidia.dali import ops, types
from nvidia.dali import pipeline as dali_pipeline
from nvidia.dali.auto_aug import augmentations as aug
from nvidia.dali.auto_aug import auto_augment, rand_augment, trivial_augment
from nvidia.dali.auto_aug.core import Policy
from nvidia.dali.pipeline import OperatorConcurrency, Pipeline
from nvidia.dali.plugin.base_iterator import LastBatchPolicy
from nvidia.dali.plugin.pytorch import DALIClassificationIterator, DALIGenericIterator

# ImageNet statistics on the 0..255 scale that DALI's decoders produce.
IMAGENET_MEAN = (0.485 * 255, 0.456 * 255, 0.406 * 255)
IMAGENET_STD = (0.229 * 255, 0.224 * 255, 0.225 * 255)
# Share of JPEG decoding sent to the GPU's hardware decoder; the rest goes to CPU threads and CUDA
# cores, which decode only the crop's window. DALI's own default: it fed ResNet-18 within a point of
# the best share on two machines whose CPUs differed. A third fed it three points better where the
# cores were many and fast, and eleven worse where they were slower: lower it only on such machines
# (results/README.md). 0.8 and 0.9 fed a compiled ResNet-18 less. With the decoder cache all of
# it goes there: a cache refilled after a resume meets each image at another place in its batch,
# and one decoder decodes it as before.
DEFAULT_HW_DECODER_LOAD = 0.65
CACHED_HW_DECODER_LOAD = 1.0
# Scratch memory the mixed decoder allocates up front for each of its threads, grown where an image
# needs more: DALI's own defaults. The values of DALI's ResNet-50 example (201 and 134 MB, enough
# for ImageNet's largest images without a reallocation) held 4.4 GB of pinned host memory in each
# pipeline at 8 threads, most of a run's; the loader alone ran within a few percent of it either
# way, and fed a compiled ResNet-18 no faster (results/README.md).
DEVICE_MEMORY_PADDING = 16 << 20
HOST_MEMORY_PADDING = 8 << 20
# Batches each .npy reader reads ahead in its own thread (DALI's default is 1): evens out file
# access.
READER_PREFETCH = 3
# torchvision's RandomResizedCrop: the crop's share of the image area, its aspect ratio, and how
# many draws it may take to find a crop that fits.
RANDOM_AREA = (0.08, 1.0)
RANDOM_ASPECT_RATIO = (3 / 4, 4 / 3)
CROP_ATTEMPTS = 100
# The extensions torchvision's ImageFolder accepts (case-insensitive), so that both loaders see the
# same files; data_sources.py's IMG_EXTENSIONS, for the trees it checks, are the same.
IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


# ------------------------------------------------------------------------------------------
# classification
# ------------------------------------------------------------------------------------------


@dataclasses.dataclass
class ReadSettings:
    """What a classification pipeline reads and how it is labelled: the pipelines' keyword
    arguments of these names, handed to their reader."""

    # What lists and reads them: a class taking (data_dir, ReadSettings, batch_size=, shuffle=,
    # stick_to_shard=, skip_cached_images=), as ImageFolderReader does. None: ImageFolderReader for
    # a local folder of class folders, data_sources.ClassifyReader for anything else.
    reader: type = None
    # A DALI file list (lines "<path relative to data_dir> <label>"), or a list of files each
    # labelled by its position in it (data_sources.ClassifyReader reads both).
    file_list: object = None
    classes: list = None  # the training class names, which number a folder's labels (for val)
    num_classes: int = None  # None: as many as ``classes``
    label_offset: int = 0  # subtracted from stored labels: 1 for TFRecords that store 1..1000
    shard_id: int = 0
    num_shards: int = 1
    ra_reps: int = 0  # torchvision's repeated augmentation (data_sources.RepeatedAugmentation)
    ra_seed: int = 0  # its order's seed, the same on every shard


@dataclasses.dataclass
class DecoderSettings:
    """Where and how a classification pipeline decodes (see ``_ClassifyPipeline.place_decoder``):
    the pipelines' keyword arguments of these names."""

    decoder: str = "mixed"
    hw_decoder_load: float = None  # None: DEFAULT_HW_DECODER_LOAD, or CACHED_HW_DECODER_LOAD
    device_memory_padding: int = DEVICE_MEMORY_PADDING
    host_memory_padding: int = HOST_MEMORY_PADDING
    decoder_cache: int = None  # MB of GPU memory for decoded images; None: no cache


class _ClassifyPipeline(Pipeline):
    """What the two classification pipelines share: the reader (``ReadSettings``), where the
    decoder and the other operators run (``DecoderSettings``), and the normalization with ImageNet
    mean/std, into ``dtype`` and ``output_layout``.

    Attributes for the trainer: ``layout`` ("folder" for a tree or a file_list, "tfrecord", "wds"),
    ``classes`` (class names in index order, or None when unknown), ``num_classes`` (or None),
    ``num_samples`` (the whole split, all shards), ``files`` (image files or shards, for
    ``find_undecodable``), ``output_layout``.
    """

    def __init__(
        self,
        batch_size,
        num_threads,
        device_id,
        data_dir,
        *,
        crop_size,
        dtype="float32",
        output_layout="CHW",
        **kwargs,
    ):
        reading, decode = settings(ReadSettings, kwargs), settings(DecoderSettings, kwargs)
        # seed, prefetch_queue_depth and the rest are DALI's Pipeline's own
        super().__init__(batch_size, num_threads, device_id, **cpu_concurrency(device_id, kwargs))
        # Arguments are checked once the Pipeline exists: a half-built one cannot be cleaned up.
        positive_int("batch_size", batch_size)
        positive_int("crop_size", crop_size)
        self.place_decoder(device_id, decode)
        reader = reading.reader or default_reader(data_dir, reading)
        self.read = reader(
            data_dir, reading, batch_size=batch_size, shuffle=self.shuffle, **self.cache_reading
        )
        self.layout, self.files, self.classes = self.read.layout, self.read.files, self.read.classes
        self.num_classes, self.num_samples = self.read.num_classes, self.read.num_samples
        self.num_shards = reading.num_shards
        self.output_layout = choice("output_layout", output_layout, {"CHW": "CHW", "HWC": "HWC"})
        self.dtype = choice("dtype", dtype, {"float32": types.FLOAT, "float16": types.FLOAT16})

    def place_decoder(self, device_id, decode):
        """Where the decoder and the operators after it run, and the decoder's arguments: all on
        the CPU without a GPU; on one, as ``place_on_gpu`` says."""
        decoder = choice("decoder", decode.decoder, {"mixed": "mixed", "cpu": "cpu"})
        self.cached = False
        self.decoder_device, self.device = "cpu", "cpu"
        # EXIF orientation is not applied, as torchvision's PIL loader does not apply it.
        self.decoder_args = dict(adjust_orientation=False)
        self.cache_reading = dict(stick_to_shard=False, skip_cached_images=False)  # the reader's
        if device_id is not None:
            self.place_on_gpu(decoder, decode)

    def place_on_gpu(self, decoder, decode):
        """The operators on the GPU, the decoder there ("mixed": its hardware decoder takes
        ``hw_decoder_load`` of the JPEGs) or on DALI's threads ("cpu": no decoding kernel beside the
        model's, results/README.md). ``decoder_cache`` (MB): whole images decoded once into DALI's
        GPU cache, where the next epochs find them; a per-process cache needs each process to keep
        its shard every epoch (stick_to_shard)."""
        self.cached = decode.decoder_cache is not None
        if self.cached and decoder == "cpu":
            raise ValueError(
                "decoder_cache needs decoder='mixed' (DALI caches what its GPU decoder decodes), "
                "got decoder='cpu'"
            )
        self.decoder_device, self.device = decoder, "gpu"
        if decoder == "mixed":
            load = CACHED_HW_DECODER_LOAD if self.cached else DEFAULT_HW_DECODER_LOAD
            self.decoder_args.update(
                hw_decoder_load=load if decode.hw_decoder_load is None else decode.hw_decoder_load,
                device_memory_padding=decode.device_memory_padding,
                host_memory_padding=decode.host_memory_padding,
            )
        if self.cached:
            cache = dict(cache_size=decode.decoder_cache, cache_type="threshold", cache_threshold=0)
            self.decoder_args.update(cache)
            skip = bool(decode.decoder_cache)  # images already in the cache: not read again
            self.cache_reading = dict(stick_to_shard=True, skip_cached_images=skip)

    def decoded(self, jpegs):
        """``jpegs`` decoded, on the device of the operators after the decoder."""
        images = self.decode(jpegs)
        if self.decoder_device == "cpu" and self.device == "gpu":
            return images.gpu()
        return images

    def imagenet_normalize(self, dtype, **crop):
        """CropMirrorNormalize with ImageNet's mean and std, into ``dtype`` and the pipeline's
        ``output_layout``."""
        return ops.CropMirrorNormalize(
            device=self.device,
            dtype=dtype,
            output_layout=self.output_layout,
            mean=list(IMAGENET_MEAN),
            std=list(IMAGENET_STD),
            **crop,
        )


class ClassifyTrainPipeline(_ClassifyPipeline):
    """ImageNet-style training input: random-resized crop fused with the decode, flip, normalize,
    and optionally random erasing. The crop's resize is DALI's on the GPU and torch's on the CPU
    (``resize_with_torch``).

    Outputs ``(images, labels)``: images (B, 3, crop_size, crop_size) float32 or float16
    (``dtype``), normalized with ImageNet mean/std, or (B, crop_size, crop_size, 3) with
    ``output_layout="HWC"`` (``images.permute(0, 3, 1, 2)`` is then a channels_last tensor, no
    copy); labels (B, 1) int32. ``data_dir`` is an ImageFolder tree, or (read by data_sources.py) a
    folder of TFRecord files or WebDataset tars (``data_sources.find_layout``). Keyword-only:
    ``crop_size``, ``random_area``, ``random_aspect_ratio``, ``auto_augment`` (``AUTO_AUGMENT``'s
    names), ``random_erase``, ``crop_sizes`` (below), ``dtype``, ``output_layout``; what is read and
    how it is labelled (``ReadSettings``: ``shard_id``, ``num_shards``, ``file_list``, ``classes``,
    ``reader``, ...) and decoded (``DecoderSettings``: ``decoder``, ``decoder_cache``, ...); the
    rest goes to DALI's ``Pipeline`` (``seed``, ``prefetch_queue_depth``, ``enable_checkpointing``,
    ``checkpoint``, ``exec_dynamic``, ...).

    ``crop_sizes`` (progressive resizing): a function from an epoch's index (0 for the pipeline's
    first; a pipeline restored from a checkpoint counts on from the checkpointed run's) to that
    epoch's crop size, at most ``crop_size``. The one pipeline then hands out batches of each
    epoch's size, its decoder cache kept.
    """

    shuffle = True
    last_batch_policy = LastBatchPolicy.FILL  # see classify_iterator

    def __init__(
        self,
        batch_size,
        num_threads,
        device_id,
        data_dir=None,
        *,
        crop_size=224,
        random_area=RANDOM_AREA,
        random_aspect_ratio=RANDOM_ASPECT_RATIO,
        auto_augment=None,
        random_erase=0.0,
        crop_sizes=None,
        **kwargs,
    ):
        super().__init__(
            batch_size, num_threads, device_id, data_dir, crop_size=crop_size, **kwargs
        )
        probability("random_erase", random_erase)
        value_range("random_area", random_area, high=1.0)
        value_range("random_aspect_ratio", random_aspect_ratio)
        self.crop_sizes = crop_sizes
        self.graph = dict(  # the options that decide which steps define_graph wires
            auto_augment=auto_augment,
            random_erase=bool(random_erase),
            progressive_resize=crop_sizes is not None,
        )
        self.build_crop(crop_size, random_area, random_aspect_ratio, crop_sizes)
        self.flip = ops.random.CoinFlip(probability=0.5)
        if auto_augment is not None:
            self.build_auto_augment(auto_augment, crop_size)
        # DALI's GPU Erase has no float16 kernel: erase the float32 image, then cast it.
        cast_after_erase = random_erase and self.dtype == types.FLOAT16
        dtype = types.FLOAT if cast_after_erase else self.dtype
        # nothing left to crop: build_crop's operators give the crop, resized to its size
        self.normalize = self.imagenet_normalize(dtype)
        if random_erase:
            self.build_erase(random_erase, cast_after_erase)
        if auto_augment is not None:
            self.define_with_conditionals()

    def define_graph(self):
        graph = self.graph  # the options that decide which steps run
        jpegs, labels = self.read()
        images = self.decoded(jpegs)  # the random crop's window; with the cache, the whole image
        if self.cached:
            images = self.crop(images)
        if graph["progressive_resize"]:
            images = self.resize(images, self.epoch_crop_size())
        elif not self.cached:
            images = self.resize(images)
        mirror = self.flip()
        if graph["auto_augment"] is not None:
            images, mirror = self.flip_and_auto_augment(images, mirror), 0
        images = self.normalize(images, mirror=mirror)
        if graph["random_erase"]:
            images = self.erase_random_box(images)
        return images, labels

    def build_crop(self, crop_size, random_area, random_aspect_ratio, crop_sizes):
        """torchvision's RandomResizedCrop: the decoder decodes the random crop's window and it is
        resized to crop_size; with the cache, the decoder decodes the whole image and the crop is
        cut and resized on the GPU; with crop_sizes, resized to each epoch's size."""
        size = [crop_size, crop_size]
        crop = dict(
            random_area=list(random_area),
            random_aspect_ratio=list(random_aspect_ratio),
            num_attempts=CROP_ATTEMPTS,
        )
        if self.cached:
            self.build_cached_crop(size, crop)
        else:  # decoding only the random crop's window saves work on large images
            self.decode = ops.decoders.ImageRandomCrop(
                device=self.decoder_device, output_type=types.RGB, **crop, **self.decoder_args
            )
        if crop_sizes is not None:
            self.build_epoch_resize()
        elif not self.cached:
            self.resize = antialiased_resize(self.device_id, self.num_threads, size)

    def build_cached_crop(self, size, crop):
        # the whole image, cached, then the random crop of it on the GPU
        self.decode = ops.decoders.Image(device="mixed", output_type=types.RGB, **self.decoder_args)
        self.crop = ops.RandomResizedCrop(
            device="gpu", size=size, **crop, interp_type=types.INTERP_TRIANGULAR, antialias=True
        )

    def build_epoch_resize(self):
        # The size comes into the graph as an input read every batch, not as an operator's fixed
        # argument: the one pipeline (and its decoder cache) serves every epoch. A cached image's
        # crop, at crop_size, is resized again to the epoch's.
        self.epoch_crop_size = ops.ExternalSource(
            source=self.batch_crop_sizes, batch=True, batch_info=True
        )
        self.resize = antialiased_resize(self.device_id, self.num_threads, None)

    def build_auto_augment(self, name, crop_size):
        policy = choice("auto_augment", name, AUTO_AUGMENT)
        self.policy, self.crop_size = without_dali_alias_warnings(policy), crop_size
        # torchvision's order: flip, then the policy, on uint8 HWC images (the CPU resize gives
        # CHW).
        self.flip_op = ops.Flip(device=self.device)
        if self.device == "cpu":
            self.to_hwc = ops.Transpose(perm=[1, 2, 0], output_layout="HWC")

    def define_with_conditionals(self):
        # DALI's policies pick each sample's operations with `if`s on its random draws: DALI's
        # conditionals. The graph is defined now, by the steps of pipeline_def(enable_conditionals=
        # True): define_graph converted by AutoGraph (which converts DALI's auto_aug modules in
        # turn), the condition stack set up, then the graph traced where DALI's operator traces
        # expect a converted function. build() then takes these outputs as set_outputs' ones.
        # These steps are private to DALI: requirements.txt pins DALI exactly.
        define_graph = dali_pipeline._preprocess_pipe_func(self.define_graph, True)
        dali_pipeline._preprocess_pipe_object(self, True, (), {})
        dali_pipeline._generate_graph(self, define_graph, (), {})

    def flip_and_auto_augment(self, images, mirror):
        images = self.flip_op(images, horizontal=mirror)
        if self.device == "cpu":
            images = self.to_hwc(images)
        return self.policy(self.crop_size, images)

    def batch_crop_sizes(self, info):
        # DALI's checkpoint holds the batch count that this callback is given, so a resumed
        # pipeline goes on with the sizes of the epoch it stopped in. An epoch is the shard's whole
        # batches (see repeats), or repeated augmentation's own number of them.
        epoch_batches = math.ceil(
            math.ceil(self.num_samples / self.num_shards) / self.max_batch_size
        )
        if self.read.ra:
            epoch_batches = self.read.ra.steps
        side = self.crop_sizes(info.iteration // epoch_batches)
        return np.full((self.max_batch_size, 2), side, np.float32)

    def build_erase(self, probability, cast_after_erase):
        # torchvision's RandomErasing(p, scale=(0.02, 0.33), ratio=(0.3, 3.3), value=0), applied
        # as its classification reference does: after normalization, so 0 is the mean colour.
        self.erase_coin = ops.random.CoinFlip(probability=probability)
        self.erase_area = ops.random.Uniform(range=[0.02, 0.33])
        self.erase_log_ratio = ops.random.Uniform(range=[math.log(0.3), math.log(3.3)])
        self.erase_where = ops.random.Uniform(range=[0.0, 1.0], shape=[2])
        self.erase = ops.Erase(device=self.device, axis_names="HW", normalized=True, fill_value=0.0)
        self.cast_after_erase = cast_after_erase
        if cast_after_erase:
            self.to_float16 = ops.Cast(device=self.device, dtype=types.FLOAT16)

    def erase_random_box(self, images):
        # (height, width) as fractions of the square crop: sqrt(area * ratio), sqrt(area / ratio).
        # torchvision redraws a box that does not fit (up to 10 times); here it is clipped to the
        # crop, which changes only the rare largest, most elongated boxes. A sample whose coin came
        # up 0 gets a box of size 0: nothing erased.
        signs = types.Constant(np.array([1.0, -1.0], np.float32))
        ratio = dmath.exp(self.erase_log_ratio() * signs)
        size = dmath.min(dmath.sqrt(self.erase_area() * ratio), 1.0) * self.erase_coin()
        anchor = self.erase_where() * (1.0 - size)
        images = self.erase(images, anchor=anchor, shape=size)
        if self.cast_after_erase:
            images = self.to_float16(images)
        return images


class ClassifyValPipeline(_ClassifyPipeline):
    """Validation input: decode, resize the shorter side to ``resize_size``, center crop
    ``crop_size``, normalize.

    Same outputs and data arguments as ``ClassifyTrainPipeline``; samples are read in order, not
    shuffled. Pass the training pipeline's ``classes`` so that validation labels use train's
    indices.
    """

    shuffle = False
    last_batch_policy = LastBatchPolicy.PARTIAL  # see classify_iterator

    def __init__(
        self,
        batch_size,
        num_threads,
        device_id,
        data_dir=None,
        *,
        crop_size=224,
        resize_size=256,
        **kwargs,
    ):
        super().__init__(
            batch_size, num_threads, device_id, data_dir, crop_size=crop_size, **kwargs
        )
        self.decode = ops.decoders.Image(
            device=self.decoder_device, output_type=types.RGB, **self.decoder_args
        )
        self.resize = ops.Resize(
            device=self.device,
            resize_shorter=resize_size,
            interp_type=types.INTERP_TRIANGULAR,
            antialias=True,
        )
        self.normalize = self.imagenet_normalize(self.dtype, crop=(crop_size, crop_size))

    def define_graph(self):
        jpegs, labels = self.read()
        images = self.decoded(jpegs)
        images = self.resize(images)
        images = self.normalize(images)
        return images, labels


def classify_iterator(pipe):
    """One pass over the pipeline's shard per epoch: ``batch[0]["data"]``, ``batch[0]["label"]``.
    Training batches are full, as many on every rank, never of one sample (BatchNorm needs more):
    the reader repeats a few samples (``repeats``); validation's drop its padding."""
    with warnings.catch_warnings():
        # --ra-sampler's epochs are counted by size, which DALI warns of as if a reader's shard
        warnings.filterwarnings("ignore", "Please set `reader_name`")
        return DALIClassificationIterator(
            pipe, **pipe.read.epoch, last_batch_policy=pipe.last_batch_policy, auto_reset=True
        )


def default_reader(data_dir, reading):
    """The reader class of a classification pipeline given none: ``ImageFolderReader`` for a local
    folder that holds folders, data_sources.ClassifyReader for anything else (shards, ``s3://``, a
    file list, repeated augmentation), imported only then."""
    local = data_dir is not None and os.path.isdir(data_dir)
    if local and reading.file_list is None and not reading.ra_reps:
        if any(entry.is_dir() for entry in os.scandir(data_dir)):
            return ImageFolderReader
    from data_sources import ClassifyReader

    return ClassifyReader


class ImageFolderReader:
    """A local ImageFolder tree (``data_dir/<class>/<image>``) as a classification pipeline reads
    it, unchecked: torchvision's ImageFolder's files (names ending in ``IMG_EXTENSIONS``, symlinked
    folders followed), in its order, labelled by its class indices (those of ``reading.classes``
    where given), read by DALI's file reader (``file_reader``). Called in ``define_graph``, it gives
    the encoded images and their labels (int32 of shape (1,), less ``reading.label_offset``).

    data_sources.ClassifyReader reads a tree the same way once it has checked it: every class
    folder holds images, every image's first bytes are an image's, no symlink loops.
    """

    layout = "folder"
    ra = None  # no repeated augmentation's sampler: data_sources.ClassifyReader's
    epoch = dict(reader_name="Reader")  # the iterator counts an epoch by the reader's shard

    def __init__(self, data_dir, reading, *, batch_size, shuffle, **file_args):
        self.data_dir, self.label_offset = data_dir, reading.label_offset
        found = sorted(entry.name for entry in os.scandir(data_dir) if entry.is_dir())
        self.classes = found if reading.classes is None else list(reading.classes)
        self.num_classes = len(self.classes) if reading.num_classes is None else reading.num_classes
        index = {name: k for k, name in enumerate(self.classes)}
        self.files, labels = [], []
        for name in found:
            for root, _, names in sorted(os.walk(os.path.join(data_dir, name), followlinks=True)):
                kept = [n for n in sorted(names) if n.lower().endswith(IMG_EXTENSIONS)]
                self.files += [os.path.join(root, n) for n in kept]
                labels += [index[name]] * len(kept)
        self.num_samples = len(self.files)
        self.reader = file_reader(self.files, labels, reading, batch_size, shuffle, **file_args)
        self.to_int32 = ops.Cast(dtype=types.INT32)

    def __call__(self):
        images, labels = self.reader()
        return images, self.to_int32(labels - self.label_offset)


def file_reader(files, labels, reading, batch_size, shuffle, **file_args):
    """DALI's file reader over image ``files`` and their ``labels``, sharded as ``reading`` says,
    each shard's last batch padded; a training reader (``shuffle``) reads a few distinct samples
    twice (``repeats``) so that every shard holds whole batches."""
    extra = extra_samples(len(files), reading.num_shards, batch_size) if shuffle else 0
    return ops.readers.File(
        files=files + repeats(files, extra),
        labels=labels + repeats(labels, extra),
        shard_id=reading.shard_id,
        num_shards=reading.num_shards,
        random_shuffle=shuffle,
        pad_last_batch=True,
        name="Reader",
        **file_args,
    )


def extra_samples(n, num_shards, batch_size):
    """How many samples a training set of ``n`` needs so that its ``num_shards`` equal shards hold
    whole batches."""
    return num_shards * batch_size * math.ceil(math.ceil(n / num_shards) / batch_size) - n


def repeats(items, extra):
    """``extra`` of ``items``, spread evenly over them, each at most once while there are enough:
    what training readers append to their set. DALI's shards then need no padding of their own,
    which repeats a shard's last sample to fill its last batch; DistributedSampler, likewise, pads
    with real samples of the set."""
    return [items[k * len(items) // extra] for k in range(extra)]


def settings(record, kwargs):
    """A ``record`` (a dataclass) of the keyword arguments in ``kwargs`` that name its fields, taken
    out of ``kwargs``."""
    names = [field.name for field in dataclasses.fields(record)]
    return record(**{name: kwargs.pop(name) for name in names if name in kwargs})


# ------------------------------------------------------------------------------------------
# segmentation
# ------------------------------------------------------------------------------------------


class _SegmentImagePipeline(Pipeline):
    """What the segmentation pipelines share: an image's resize to ``size`` and its normalization,
    operator for operator, so that a PNG to predict on and the same pixels as .npy give the model
    the same input."""

    def build_image_ops(self, image, size, num_threads):
        shape, dtype = image
        self.image_hwc = ops.Reshape(device=self.device, src_dims=hwc_dims(shape), layout="HWC")
        if not self.on_gpu and dtype == np.uint8:  # torch's resize on the CPU, for 8-bit images
            resize = functools.partial(
                resize_with_torch, self.torch_threads, num_threads, tuple(size), False
            )
            self.resize_image = ops.PythonFunction(
                function=resize, num_outputs=1, batch_processing=True, output_layouts="CHW"
            )
            self.to_chw = unchanged  # torch hands out CHW
        else:
            self.resize_image = roi_resize(self.device, types.INTERP_LINEAR, size)
            self.to_chw = ops.Transpose(device=self.device, perm=[2, 0, 1], output_layout="CHW")

    def build_normalize(self, image, mean, std):
        if (mean is None) != (std is None):
            raise ValueError(f"give both mean and std, or neither (got mean={mean}, std={std})")
        if mean is not None:
            mean, std = self.checked_mean_std(mean, std)
        elif self.channels == 3 and image[1] == np.uint8:
            mean, std = list(IMAGENET_MEAN), list(IMAGENET_STD)
        else:
            self.channel_min = ops.reductions.Min(device=self.device, axes=[1, 2], keep_dims=True)
            self.standardize = ops.Normalize(device=self.device, axes=[1, 2], dtype=types.FLOAT)
            self.normalize = self.normalize_each_image
            return
        self.normalize = ops.CropMirrorNormalize(
            device=self.device, dtype=types.FLOAT, output_layout="CHW", mean=mean, std=std
        )

    def checked_mean_std(self, mean, std):
        """The caller's ``mean`` and ``std`` as lists of floats, or a ValueError."""
        mean = np.atleast_1d(mean).astype(float).tolist()
        std = np.atleast_1d(std).astype(float).tolist()
        if not (np.isfinite(mean + std).all() and min(std) > 0):
            raise ValueError(f"std must be above 0 and mean finite, got mean={mean}, std={std}")
        if {len(mean), len(std)} - {1, self.channels}:
            raise ValueError(
                f"mean and std need 1 or {self.channels} values each (the images have "
                f"{self.channels} channels), got mean={mean}, std={std}"
            )
        return mean, std

    def normalize_each_image(self, image):
        # Each channel is shifted to start at 0 first: that changes nothing after standardizing, but
        # makes a constant channel exactly 0 (its float32 mean is a hair off, and the hair over a
        # tiny std gave -1 or 1).
        image = self.to_chw(image)
        return self.standardize(image - self.channel_min(image))


class SegmentValPipeline(_SegmentImagePipeline):
    """Image and mask ``.npy`` files, ``imgs[i]`` paired with ``lbls[i]``, read in lock-step and
    resized to ``size`` (height, width), the image normalized.

    Outputs ``(image, mask)``, both CHW. Image (B, C, H, W) float32, C = ``self.channels`` (1 or 3,
    as stored). Mask (B, 1, H, W): uint8 for uint8 or bool masks, int32 for any other integer type.
    Images are resized linearly, masks by nearest neighbour, so a mask keeps exactly its class
    values. With ``own_size_masks`` two more outputs follow, for scoring at each mask's own size:
    the masks as read (B, 1, H, W), each padded with 0 to the batch's largest height and width, and
    their sizes (B, 3): height, width, 1.

    Normalization: 8-bit RGB images with ImageNet mean/std; every other kind (greyscale, uint16,
    float32) per image, each channel by the image's own mean and standard deviation (a constant
    channel becomes 0); or, for any kind, by ``mean`` and ``std`` when given (1 or C values each, on
    the image's own scale). Further keyword arguments go to DALI's ``Pipeline``
    (``prefetch_queue_depth``, ``enable_checkpointing``, ``checkpoint``, ...).

    The files are the caller's to check: images (H, W), (H, W, 1) or (H, W, 3) of uint8, uint16 or
    float32, masks (H, W) or (H, W, 1) of an integer type or bool, one kind each in a set (the first
    pair's headers stand for it), each mask of its image's size. data_sources.py's
    ``check_segmentation_files`` checks so from the headers, ``check_finite_pixels`` float pixels.
    """

    shuffle = False
    last_batch_policy = LastBatchPolicy.PARTIAL  # see segment_iterator

    def __init__(
        self,
        batch_size,
        num_threads,
        device_id,
        imgs,
        lbls,
        *,
        size=(384, 384),
        shard_id=0,
        num_shards=1,
        seed=42,
        mean=None,
        std=None,
        own_size_masks=False,
        **pipeline_kwargs,
    ):
        pipeline_kwargs = cpu_concurrency(device_id, pipeline_kwargs)
        super().__init__(batch_size, num_threads, device_id, seed=seed, **pipeline_kwargs)
        # Arguments are checked once the Pipeline exists: a half-built one cannot be cleaned up.
        positive_int("batch_size", batch_size)
        self.size = image_size(size)
        imgs, lbls = ([] if paths is None else list(paths) for paths in (imgs, lbls))
        if not imgs or len(imgs) != len(lbls):
            raise ValueError(
                f"expected one mask for each image, and an image: got {len(imgs)} images and "
                f"{len(lbls)} masks"
            )
        # (shape, dtype) of each, from the first pair's headers: the set is the caller's to check
        image, mask = npy_header(imgs[0]), npy_header(lbls[0])
        self.channels = image[0][2] if len(image[0]) == 3 else 1
        self.files = imgs + lbls  # what it reads, the images first
        self.on_gpu, self.device = device_id is not None, "cpu" if device_id is None else "gpu"
        self.own_size_masks = own_size_masks
        self.build_readers(imgs, lbls, batch_size, shard_id, num_shards, seed)
        self.build_mask_ops(mask, self.size)
        # One pool for a CPU-only pipeline's torch code (its resize, the training noise); threads
        # start on use.
        self.torch_threads = None if self.on_gpu else torch_threads(num_threads)
        self.build_image_ops(image, self.size, num_threads)
        self.build_normalize(image, mean, std)

    def build_readers(self, imgs, lbls, batch_size, shard_id, num_shards, seed):
        """The image and the mask reader, in lock-step: one seed, shuffle and sharding for both."""
        if self.shuffle:  # a few distinct pairs repeated, so every shard holds whole batches
            extra = extra_samples(len(imgs), num_shards, batch_size)
            imgs, lbls = imgs + repeats(imgs, extra), lbls + repeats(lbls, extra)
        # Memory-mapped reads with cached headers: plain reads (dont_use_mmap) were much slower,
        # and the reader was the ceiling (results/README.md).
        reader_args = dict(
            shard_id=shard_id,
            num_shards=num_shards,
            random_shuffle=self.shuffle,
            seed=seed,
            pad_last_batch=True,
            cache_header_information=True,
            prefetch_queue_depth=READER_PREFETCH,
        )
        self.read_image = ops.readers.Numpy(files=imgs, name="ReaderX", **reader_args)
        self.read_mask = ops.readers.Numpy(files=lbls, name="ReaderY", **reader_args)

    def build_mask_ops(self, mask, size):
        shape, dtype = mask
        # (H, W) files get a channel axis of 1, so every kind of set runs through one graph.
        self.mask_hwc = ops.Reshape(device=self.device, src_dims=hwc_dims(shape), layout="HWC")
        # moves no data
        self.mask_chw = ops.Reshape(device=self.device, src_dims=[2, 0, 1], layout="CHW")
        # A cast to the type a mask already has would only copy it: uint8 masks skip both casts.
        self.mask_to_resize = self.mask_to_output = unchanged
        self.mask_type = types.UINT8
        if dtype != np.uint8:
            self.build_mask_casts(dtype)
        # Nearest neighbour: a mask keeps exactly its class values.
        self.resize_mask = roi_resize(self.device, types.INTERP_NN, size)
        # own_size_masks: a batch of masks of several sizes, made one tensor that PyTorch can take
        self.pad_mask = ops.Pad(device=self.device, axes=[0, 1], fill_value=0)

    def build_mask_casts(self, dtype):
        # DALI's Resize reads uint8, int16, uint16 and float32: other masks (np.argmax gives int64)
        # are resized as float32, exact for class values below 2**24, and handed out as int32.
        resized = types.UINT8 if dtype == np.bool_ else types.FLOAT
        self.mask_to_resize = ops.Cast(device=self.device, dtype=resized)
        if dtype != np.bool_:
            self.mask_type = types.INT32
            self.mask_to_output = ops.Cast(device=self.device, dtype=types.INT32)

    def define_graph(self):
        image, own = self.read()
        image, mask = self.resize_image(image), self.resize_mask(own)
        image = self.normalize(image)
        if self.own_size_masks:
            own_masks = self.output_mask(self.pad_mask(own))
            return image, self.output_mask(mask), own_masks, own.shape()
        return image, self.output_mask(mask)

    def read(self):
        """Each pair's image (H, W, C) and mask (H, W, 1), on the pipeline's device."""
        image, mask = self.read_image(), self.read_mask()
        if self.on_gpu:
            image, mask = image.gpu(), mask.gpu()
        return self.image_hwc(image), self.mask_to_resize(self.mask_hwc(mask))

    def output_mask(self, mask):
        return self.mask_to_output(self.mask_chw(mask))


@dataclasses.dataclass
class Augmentations:
    """``SegmentTrainPipeline``'s augmentations: its keyword arguments of these names. A ``_p`` is
    each sample's chance of its augmentation; a (low, high) range, that of the augmentation's
    uniform draw for a sample."""

    flip_p: float = 0.5  # vertical and horizontal, each
    noise_p: float = 0.15
    noise_std: tuple = (0.0, 0.33)  # Gaussian noise's standard deviation
    blur_p: float = 0.15
    blur_sigma: tuple = (0.5, 1.5)  # Gaussian blur's
    brightness_p: float = 0.15
    brightness: tuple = (0.7, 1.3)  # a factor
    contrast_p: float = 0.13
    contrast: tuple = (0.9, 1.1)  # a factor, the result clamped to the image's own min and max
    scale_range: tuple = None  # torchvision's scale augmentation; None: off
    mask_pad: int = 0  # what pads a scaled mask where it came out smaller than ``size``

    def check(self, mask_type):
        """A ValueError naming the first probability or range out of its bounds, or a ``mask_pad``
        that masks of ``mask_type`` cannot hold."""
        for name in ("flip_p", "noise_p", "blur_p", "brightness_p", "contrast_p"):
            probability(name, getattr(self, name))
        for name in ("noise_std", "blur_sigma", "brightness", "contrast"):
            value_range(name, getattr(self, name))
        lowest, highest = (0, 255) if mask_type == types.UINT8 else (-(2**31), 2**31 - 1)
        if not (
            isinstance(self.mask_pad, (int, np.integer)) and lowest <= self.mask_pad <= highest
        ):
            raise ValueError(
                f"mask_pad must be a whole number in [{lowest}, {highest}] (what the masks hold), "
                f"got {self.mask_pad!r}"
            )


class SegmentTrainPipeline(SegmentValPipeline):
    """``SegmentValPipeline`` plus augmentations, on the device of the pipeline.

    Flips (vertical, horizontal; ``flip_p`` each) are drawn per sample and applied to image and mask
    alike. With ``scale_range`` (low, high), as torchvision's segmentation training: each sample
    scaled by its own s ~ U(low, high) (1 is ``size``; image linearly, mask by nearest neighbour),
    then cut back to ``size`` at a random place, padded where it came out smaller: the mask with
    ``mask_pad``, the normalized image with 0 (the mean colour). On the normalized image only, each
    drawn per sample with its own probability: Gaussian noise, Gaussian blur, brightness scaling,
    and contrast scaling clamped to the image's own min/max. Their keyword arguments and defaults:
    ``Augmentations``.
    """

    shuffle = True
    # Full batches only, the same number on every shard: the readers' pad_last_batch fills a
    # shard's last batch by repeating its own samples, so no step sees made-up data.
    last_batch_policy = LastBatchPolicy.FILL

    def __init__(self, batch_size, num_threads, device_id, imgs, lbls, **kwargs):
        augment = settings(Augmentations, kwargs)
        super().__init__(batch_size, num_threads, device_id, imgs, lbls, **kwargs)
        augment.check(self.mask_type)
        # the options that decide which steps define_graph wires
        self.graph = dict(scale_range=augment.scale_range is not None)
        coin = functools.partial(ops.random.CoinFlip, dtype=types.BOOL)
        # (vertical, horizontal)
        self.flip_coins = ops.random.CoinFlip(probability=augment.flip_p, shape=[2])
        self.as_float = ops.Cast(dtype=types.FLOAT)
        if self.graph["scale_range"]:
            self.build_scale(augment.scale_range, augment.mask_pad)
        self.noise_coin = coin(probability=augment.noise_p)
        self.build_noise(augment.noise_std)
        self.blur_coin = coin(probability=augment.blur_p)
        self.blur_sigma = ops.random.Uniform(range=list(augment.blur_sigma))
        gaussian_blur = ops.GaussianBlur(device=self.device)
        self.blur = lambda image, sigma: gaussian_blur(image, sigma=sigma)
        self.brightness_coin = coin(probability=augment.brightness_p)
        self.brightness = ops.random.Uniform(range=list(augment.brightness))
        self.contrast_coin = coin(probability=augment.contrast_p)
        self.contrast = ops.random.Uniform(range=list(augment.contrast))
        self.min = ops.reductions.Min(device=self.device)
        self.max = ops.reductions.Max(device=self.device)
        # The ops API has no per-sample `if`; these are the operators that DALI's conditionals run
        # for one. DALI keeps them in ops._conditional, so requirements.txt pins DALI exactly.
        self.split = ops._conditional.Split(device=self.device)
        self.split_draw = ops._conditional.Split(device="cpu")
        self.merge = ops._conditional.Merge(device=self.device)

    def build_scale(self, scale_range, mask_pad):
        value_range("scale_range", scale_range, positive=True)
        low, high = (float(v) for v in scale_range)
        # DALI's range must not be empty: low == high is the one value
        draw = dict(range=[low, high]) if low < high else dict(values=[low])
        self.scale = ops.random.Uniform(**draw)
        # One crop position per sample, for image and mask alike.
        self.crop_x = ops.random.Uniform(range=[0.0, 1.0])
        self.crop_y = ops.random.Uniform(range=[0.0, 1.0])
        crop = dict(device=self.device, crop=list(self.size), out_of_bounds_policy="pad")
        self.crop_image = ops.Crop(**crop, fill_values=0.0)
        self.crop_mask = ops.Crop(**crop, fill_values=float(mask_pad))

    def build_noise(self, noise_std):
        self.noise_draws = [ops.random.Uniform(range=list(noise_std))]  # the stddev
        if self.on_gpu:
            gaussian = ops.noise.Gaussian(device="gpu")
            self.add_noise = lambda image, stddev: gaussian(image, stddev=stddev)
            return
        # torch's normal generator, much faster than DALI's CPU one, seeded from a DALI draw
        # (below 2**47, see add_gaussian_noise): the seed and checkpoints decide the noise.
        self.noise_draws.append(ops.random.Uniform(range=[0.0, 2.0**47], dtype=types.FLOAT64))
        noise = functools.partial(add_gaussian_noise, self.torch_threads)
        self.add_noise = ops.PythonFunction(
            function=noise, num_outputs=1, batch_processing=True, output_layouts="CHW"
        )

    def define_graph(self):
        image, mask = self.read()
        flips = self.as_float(self.flip_coins())  # one draw per sample for image and mask alike
        sizes = self.draw_sizes()  # with scale_range, likewise one scale per sample for both
        image, mask = self.resize_image(image, flips, *sizes), self.resize_mask(mask, flips, *sizes)
        # Cut after normalizing: padding is then not counted in an image's own mean and std.
        image, mask = self.random_crop(self.normalize(image), self.output_mask(mask))
        image = self.where_drawn(self.noise_coin, self.add_noise, image, *self.noise_draws)
        image = self.where_drawn(self.blur_coin, self.blur, image, self.blur_sigma)
        brighten = lambda x, factor: x * factor  # noqa: E731
        image = self.where_drawn(self.brightness_coin, brighten, image, self.brightness)
        image = self.where_drawn(self.contrast_coin, self.scale_contrast, image, self.contrast)
        return image, mask

    def draw_sizes(self):
        """With ``scale_range``, each sample's (height, width): ``size`` times its scale, in whole
        pixels; without, none (the fixed ``size``)."""
        if not self.graph["scale_range"]:
            return ()
        sizes = dmath.floor(self.scale() * types.Constant(np.float32(self.size)) + 0.5)
        return (dmath.max(sizes, 1.0),)

    def random_crop(self, image, mask):
        """With ``scale_range``, ``size`` out of each scaled image and mask, at one random place for
        both; a side shorter than ``size`` lands at a random place in its padding."""
        if not self.graph["scale_range"]:
            return image, mask
        where = dict(crop_pos_x=self.crop_x(), crop_pos_y=self.crop_y())
        return self.crop_image(image, **where), self.crop_mask(mask, **where)

    def where_drawn(self, coin, augment, image, *draws):
        """``augment(image, *values)`` on the samples whose ``coin`` came up, the others as they
        were; ``draws`` are random operators, one value per sample. Only the samples that drew an
        augmentation pay for it (on the CPU, computing it for every sample and keeping it by the
        coin cost several times more)."""
        predicate = coin()
        drawn, kept = self.split(image, predicate=predicate)
        values = [self.split_draw(draw(), predicate=predicate)[0] for draw in draws]
        return self.merge(augment(drawn, *values), kept, predicate=predicate)

    def scale_contrast(self, image, factor):
        # a min of a max: faster than dmath.clamp on the CPU
        return dmath.min(dmath.max(image * factor, self.min(image)), self.max(image))


def segment_iterator(pipe):
    """Batches of a segmentation pipeline as PyTorch tensors: ``batch[0]["image"]``,
    ``batch[0]["mask"]`` (with ``own_size_masks`` also ``"own_mask"`` and ``"own_size"``), every
    validation sample once an epoch; training batches full and as many on every shard (see the
    pipelines' ``last_batch_policy``), so under DDP every rank takes as many steps, on real data."""
    names = ["image", "mask"] + (["own_mask", "own_size"] if pipe.own_size_masks else [])
    policy = dict(last_batch_policy=pipe.last_batch_policy, auto_reset=True)
    return DALIGenericIterator(pipe, names, reader_name="ReaderX", **policy)


class SegmentPredictPipeline(_SegmentImagePipeline):
    """Images to segment: the PNG or JPEG ``files`` (any size, grey or colour) under ``data_dir``,
    each read once, in order (shard ``shard_id`` of ``num_shards``), decoded to ``channels`` (3:
    RGB, 1: grey), resized to ``size`` and normalized as ``SegmentValPipeline`` does 8-bit images of
    as many channels, operator for operator: a PNG and the same pixels as .npy give the model the
    same input.

    Outputs ``(image, shape, index)``: image (B, C, H, W) float32; the decoded image's (height,
    width, channels), before the resize; the file's position in ``files``. ``read``, ``files`` and
    ``layout`` are what ``data_sources.decode_errors_named`` needs to name an undecodable file.
    """

    last_batch_policy = LastBatchPolicy.PARTIAL  # see predict_iterator

    def __init__(
        self,
        batch_size,
        num_threads,
        device_id,
        data_dir,
        files,
        *,
        size=(384, 384),
        channels=3,
        shard_id=0,
        num_shards=1,
        **pipeline_kwargs,
    ):
        pipeline_kwargs = cpu_concurrency(device_id, pipeline_kwargs)
        super().__init__(batch_size, num_threads, device_id, **pipeline_kwargs)
        positive_int("batch_size", batch_size)
        size = image_size(size)
        self.channels = choice("channels", channels, {1: 1, 3: 3})
        # a list of files, checked and each labelled by its position by data_sources.py's reader
        from data_sources import ClassifyReader

        reading = ReadSettings(file_list=list(files), shard_id=shard_id, num_shards=num_shards)
        self.read = ClassifyReader(data_dir, reading, batch_size=batch_size, shuffle=False)
        self.files, self.layout = self.read.files, self.read.layout
        self.on_gpu, self.device = device_id is not None, "cpu" if device_id is None else "gpu"
        # EXIF orientation is not applied, as in the classification pipelines and PIL's reading.
        self.decode = ops.decoders.Image(
            device="mixed" if self.on_gpu else "cpu",
            output_type=types.RGB if channels == 3 else types.GRAY,
            adjust_orientation=False,
        )
        self.torch_threads = None if self.on_gpu else torch_threads(num_threads)
        decoded = ((1, 1, channels), np.uint8)  # (shape, dtype) as the .npy checks give them
        self.build_image_ops(decoded, size, num_threads)
        self.build_normalize(decoded, None, None)

    def define_graph(self):
        encoded, index = self.read()
        image = self.decode(encoded)
        return self.normalize(self.resize_image(image)), image.shape(), index


def predict_iterator(pipe):
    """One pass over a ``SegmentPredictPipeline``'s shard, every image once (the reader's padding
    dropped): ``batch[0]["image"]``, ``batch[0]["shape"]``, ``batch[0]["index"]``."""
    return DALIGenericIterator(
        pipe,
        ["image", "shape", "index"],
        reader_name="Reader",
        last_batch_policy=pipe.last_batch_policy,
    )


SEGMENT_PIPELINES = {
    "train": SegmentTrainPipeline,
    "eval": SegmentValPipeline,
    "test": SegmentValPipeline,
}
PIPELINE_KEYS = (
    "device_id",
    "num_threads",
    "shard_id",
    "num_shards",
    "seed",
    "size",
    "mean",
    "std",
    "prefetch_queue_depth",
    "enable_checkpointing",
    "checkpoint",
)
# What "eval" and "test" alone take.
VAL_KEYS = ("own_size_masks",)
# The nail-segmentation write-up's settings that stand for one of ours: DALI threads, shards.
WRITEUP_KEYS = ("num_workers", "gpus")
# Its settings this loader has no use for (3D volumes, patch sampling, benchmark mode, GPU staging):
# accepted so that its client code runs unchanged, and ignored.
IGNORED_KEYS = (
    "dim",
    "overlap",
    "benchmark",
    "oversampling",
    "test_batches",
    "train_batches",
    "load_to_gpu",
)


def fetch_dali_loader(imgs, lbls, batch_size, mode, **kwargs):
    """The segmentation pipeline for ``mode``: ``SegmentTrainPipeline`` for "train",
    ``SegmentValPipeline`` for "eval" or "test", over ``.npy`` files paired by position (``imgs[i]``
    with ``lbls[i]``): any iterable of paths (a list, a generator, a NumPy array, ``pathlib.Path``
    items), not a single path.

    Returns the pipeline, as the nail-segmentation write-up's loader does: wrap it with
    ``segment_iterator(pipe)``, or with the write-up's ``DALIGenericIterator`` subclass
    (``reader_name="ReaderX"``; it keeps DALI's default policy, FILL, so its validation epochs end
    with a batch padded by repeats, where ``segment_iterator`` counts every validation sample once).
    ``pipe.channels`` is the number of image channels a model must take.

    Takes the write-up's settings dict as it stands: ``num_workers`` (DALI threads), ``gpus``
    (shards when not under torchrun), ``seed``; ``dim``, ``overlap``, ``benchmark``,
    ``oversampling``, ``test_batches``, ``train_batches`` and ``load_to_gpu`` are ignored. Unless
    given as ``device_id``, ``shard_id`` and ``num_shards``, the device and shard come from the
    environment, as in the write-up: GPU ``LOCAL_RANK`` (0 if unset) when PyTorch sees a GPU, else
    the CPU only (``device_id=None``); shard ``RANK`` of ``WORLD_SIZE`` under torchrun, else shard
    ``LOCAL_RANK`` of ``gpus``. Our own settings: ``num_threads`` (wins over ``num_workers``;
    default 4), ``seed``, ``size``, ``mean``, ``std``, ``prefetch_queue_depth``,
    ``enable_checkpointing``, ``checkpoint``, and ``SegmentTrainPipeline``'s augmentation settings
    (used by "train", ignored by "eval" and "test"), ``own_size_masks`` (``SegmentValPipeline``'s;
    used by "eval" and "test", ignored by "train"). Any other key raises ``ValueError`` listing the
    accepted ones.
    """
    if mode not in SEGMENT_PIPELINES:
        raise ValueError(f"mode must be one of {', '.join(SEGMENT_PIPELINES)}, got {mode!r}")
    for name, paths in (("imgs", imgs), ("lbls", lbls)):
        if isinstance(paths, (str, bytes, os.PathLike)):  # else read letter by letter
            raise TypeError(
                f"{name} is one path, {paths!r}: expected a list of paths, one a sample"
            )
    augmentations = tuple(field.name for field in dataclasses.fields(Augmentations))
    known = PIPELINE_KEYS + augmentations + VAL_KEYS + WRITEUP_KEYS
    unknown = [key for key in kwargs if key not in known + IGNORED_KEYS]
    if unknown:
        raise ValueError(
            f"fetch_dali_loader got unknown keyword argument(s) {', '.join(unknown)}; "
            f"it accepts {', '.join(known)}, and ignores {', '.join(IGNORED_KEYS)}"
        )
    pipeline = SEGMENT_PIPELINES[mode]
    used = PIPELINE_KEYS + (augmentations if pipeline is SegmentTrainPipeline else VAL_KEYS)
    chosen = {key: value for key, value in kwargs.items() if key in used}
    chosen.setdefault("num_threads", kwargs.get("num_workers", 4))
    chosen.setdefault("num_shards", env_int("WORLD_SIZE", kwargs.get("gpus", 1)))
    chosen.setdefault("shard_id", env_int("RANK", env_int("LOCAL_RANK", 0)))
    if "device_id" not in chosen:
        chosen["device_id"] = env_int("LOCAL_RANK", 0) if torch.cuda.is_available() else None
    if not 0 <= chosen["shard_id"] < chosen["num_shards"]:
        raise ValueError(
            f"shard_id {chosen['shard_id']} is out of range for num_shards "
            f"{chosen['num_shards']} (from the arguments, else RANK or LOCAL_RANK, "
            f"and WORLD_SIZE or gpus)"
        )
    threads, device_id = chosen.pop("num_threads"), chosen.pop("device_id")
    return pipeline(batch_size, threads, device_id, imgs, lbls, **chosen)


# ------------------------------------------------------------------------------------------
# operator-level helpers that define_graph calls
# ------------------------------------------------------------------------------------------

# Elements of noise one task generates: DALI's own CPU random operators split a large sample so.
NOISE_CHUNK = 1 << 16


# --auto-augment: torchvision's policies with DALI's operators, drawing with DALI's random operators
# (seeded from the pipeline's seed, restored by its checkpoints). As torchvision's classification
# reference: bilinear warps (its --interpolation) filled with black, and RandAugment's 2 operations
# at magnitude 9 of 31 shifting by up to 150/331 of the crop. TrivialAugmentWide's translation is
# DALI's default, torchvision's 32 pixels.
TORCHVISION_WARP = dict(fill_value=0, interp_type=types.INTERP_LINEAR)
# DALI's own auto_aug builds sharpness and equalize with fn.experimental.filter and
# fn.experimental.equalize, aliases DALI 2.x deprecates for fn.filter and fn.equalize: a warning
# about DALI's code that ours cannot act on. DALI warns under a filter of its own, which overrides
# any filterwarnings, so the policies catch the warnings they raise and pass on all but these.
DALI_ALIAS_WARNINGS = tuple(
    f"WARNING: `nvidia.dali.fn.experimental.{name}` is now deprecated"
    for name in ("filter", "equalize")
)


def without_dali_alias_warnings(policy):
    @functools.wraps(policy)
    def build(crop_size, images):
        with warnings.catch_warnings(record=True) as caught:
            augmented = policy(crop_size, images)
        for w in caught:
            if not (
                w.category is DeprecationWarning and str(w.message).startswith(DALI_ALIAS_WARNINGS)
            ):
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno, source=w.source)
        return augmented

    return build


def trivial_augment_wide(crop_size, images):
    return trivial_augment.trivial_augment_wide(images, **TORCHVISION_WARP)


def rand_augment_2_9(crop_size, images):
    shape = dict(shape=(crop_size, crop_size), max_translate_rel=150 / 331)
    return rand_augment.rand_augment(images, n=2, m=9, **shape, **TORCHVISION_WARP)


def imagenet_auto_augment(crop_size, images):
    return auto_augment.apply_auto_augment(
        torchvision_imagenet_policy(), images, **TORCHVISION_WARP
    )


def torchvision_imagenet_policy():
    """torchvision's AutoAugmentPolicy.IMAGENET (DALI's "image_net" is another one, TensorFlow's)
    with its magnitudes: 10 bins; posterize keeps 8 to 4 bits, solarize's threshold is 255 to 0;
    the others' ranges are DALI's defaults, the same as torchvision's. Its one stage of
    probability 0 is left out."""
    posterize = aug.posterize.augmentation((8, 4), False, aug.poster_mask_uint8)
    solarize = aug.solarize.augmentation((255, 0))
    rotate, equalize, color, invert = aug.rotate, aug.equalize, aug.color, aug.invert
    auto_contrast, contrast, sharpness = aug.auto_contrast, aug.contrast, aug.sharpness
    sub_policies = [
        [(posterize, 0.4, 8), (rotate, 0.6, 9)],
        [(solarize, 0.6, 5), (auto_contrast, 0.6, None)],
        [(equalize, 0.8, None), (equalize, 0.6, None)],
        [(posterize, 0.6, 7), (posterize, 0.6, 6)],
        [(equalize, 0.4, None), (solarize, 0.2, 4)],
        [(equalize, 0.4, None), (rotate, 0.8, 8)],
        [(solarize, 0.6, 3), (equalize, 0.6, None)],
        [(posterize, 0.8, 5), (equalize, 1.0, None)],
        [(rotate, 0.2, 3), (solarize, 0.6, 8)],
        [(equalize, 0.6, None), (posterize, 0.4, 6)],
        [(rotate, 0.8, 8), (color, 0.4, 0)],
        [(rotate, 0.4, 9), (equalize, 0.6, None)],
        [(equalize, 0.8, None)],
        [(invert, 0.6, None), (equalize, 1.0, None)],
        [(color, 0.6, 4), (contrast, 1.0, 8)],
        [(rotate, 0.8, 8), (color, 1.0, 2)],
        [(color, 0.8, 8), (solarize, 0.8, 7)],
        [(sharpness, 0.4, 7), (invert, 0.6, None)],
        [(aug.shear_x, 0.6, 5), (equalize, 1.0, None)],
        [(color, 0.4, 0), (equalize, 0.6, None)],
        [(equalize, 0.4, None), (solarize, 0.2, 4)],
        [(solarize, 0.6, 5), (auto_contrast, 0.6, None)],
        [(invert, 0.6, None), (equalize, 1.0, None)],
        [(color, 0.6, 4), (contrast, 1.0, 8)],
        [(equalize, 0.8, None), (equalize, 0.6, None)],
    ]
    return Policy("torchvision ImageNet", num_magnitude_bins=10, sub_policies=sub_policies)


AUTO_AUGMENT = {
    "ta_wide": trivial_augment_wide,
    "ra": rand_augment_2_9,
    "imagenet": imagenet_auto_augment,
}


def unchanged(data):
    """The identity: stands in for an operator a pipeline does not need."""
    return data


def choice(name, value, allowed):
    """``allowed[value]``, or a ValueError naming ``name`` and the allowed values."""
    if value not in allowed:
        raise ValueError(f"{name} must be {' or '.join(map(repr, allowed))}, got {value!r}")
    return allowed[value]


def positive_int(name, value):
    """``value``, a whole number of at least 1, or a ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a whole number of at least 1, got {value!r}")
    return int(value)


def image_size(size):
    """(height, width) from ``size``: one whole number (a square) or two."""
    pair = (size, size) if isinstance(size, (int, np.integer)) else tuple(size)
    if len(pair) != 2:
        raise ValueError(f"size must be (height, width) or one number, got {size!r}")
    return tuple(positive_int("size", side) for side in pair)


def probability(name, value):
    if not (isinstance(value, (int, float)) and 0 <= value <= 1):
        raise ValueError(f"{name} must be a probability in [0, 1], got {value!r}")


def value_range(name, bounds, high=math.inf, positive=False):
    """A ValueError naming ``name`` unless ``bounds`` is (low, high) with 0 <= low <= high (0 < low
    if ``positive``), both finite, and high at most ``high``."""
    try:
        low_value, high_value = (float(v) for v in bounds)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a (low, high) pair, got {bounds!r}") from None
    above = 0 < low_value if positive else 0 <= low_value
    if not (above and low_value <= high_value <= high and math.isfinite(high_value)):
        limit = f", at most {high}" if math.isfinite(high) else ""
        zero = "0 <" if positive else "0 <="
        raise ValueError(
            f"{name} must be (low, high) with {zero} low <= high{limit}, got {bounds!r}"
        )


def env_int(name, default):
    return int(os.environ[name]) if os.environ.get(name) else default


def npy_header(path):
    """(shape, dtype) of a ``.npy`` file, from its header; an ``s3://`` one's through
    data_sources.py."""
    if str(path).startswith("s3://"):
        from data_sources import npy_header

        return npy_header(path)
    array = np.load(path, mmap_mode="r")
    return array.shape, array.dtype


def hwc_dims(shape):
    """Reshape's ``src_dims`` that make an (H, W) or (H, W, C) array (H, W, C)."""
    return [0, 1, -1] if len(shape) == 2 else [0, 1, 2]


def cpu_concurrency(device_id, pipeline_kwargs):
    """``Pipeline`` keyword arguments: a CPU-only pipeline lets independent operators, and with them
    successive iterations, run at once. DALI 2.4 does so only in a process started with
    ``DALI_USE_NEW_THREAD_POOL=1`` (its new thread pool); without it CPU operators run one at a
    time, as by default."""
    if device_id is None:
        return {"concurrency": OperatorConcurrency.FULL, **pipeline_kwargs}
    return pipeline_kwargs


def torch_threads(num_threads):
    """The threads on which a CPU-only pipeline's torch code runs: as many as DALI's own (a
    ``PythonFunction`` calls its function on one thread; torch's kernels let go of the GIL). At
    least one, so that a ``num_threads`` below 1 reaches DALI's build and its own message."""
    return ThreadPoolExecutor(max(1, num_threads or 1), thread_name_prefix="torch")


def antialiased_resize(device_id, num_threads, size):
    """An operator that resizes to ``size`` (height, width) with an antialiased triangle filter:
    DALI's on a GPU; on the CPU torch's (``resize_with_torch``), the same filter and faster than
    DALI's CPU one (results/README.md). ``size`` None: a function ``(images, sizes)`` resizing each
    image to its sample of ``sizes``, (height, width) float32 on the CPU."""
    if device_id is not None:
        return gpu_resize(size)
    pool = torch_threads(num_threads)

    def resize(images, sizes=None):
        return resize_with_torch(pool, num_threads, size, True, images, sizes=sizes)

    return ops.PythonFunction(
        function=resize, num_outputs=1, batch_processing=True, output_layouts="CHW"
    )


def gpu_resize(size):
    """antialiased_resize's on a GPU: DALI's."""
    if size is None:
        resize = ops.Resize(device="gpu", interp_type=types.INTERP_TRIANGULAR, antialias=True)
        return lambda images, sizes: resize(images, size=sizes)
    return ops.Resize(
        device="gpu",
        resize_x=size[1],
        resize_y=size[0],
        interp_type=types.INTERP_TRIANGULAR,
        antialias=True,
    )


def roi_resize(device, interp_type, size):
    """DALI's resize to ``size`` (height, width) with ``interp_type``, called through
    ``flip_by_roi``: the training pipeline flips by reading the region of interest backwards, and
    may give each sample a size of its own."""
    resize = ops.Resize(device=device, interp_type=interp_type, antialias=False, roi_relative=True)
    return functools.partial(flip_by_roi, resize, list(size))


def flip_by_roi(resize, size, data, flips=None, sizes=None):
    """DALI's ``resize`` of ``data`` to ``size`` (height, width), or to each sample's own ``sizes``
    where given, flipped where ``flips`` (vertical, horizontal) is 1: the region of interest read
    backwards, from 1 to 0 along the flipped axes, costs no pass of its own."""
    size = size if sizes is None else sizes
    if flips is None:
        return resize(data, size=size)
    return resize(data, size=size, roi_start=flips, roi_end=1 - flips)


def resize_with_torch(pool, threads, size, antialias, images, flips=None, sizes=None):
    """DALI's CPU ``Resize``, computed by torch on the ``threads`` threads of ``pool``: ``images``
    (HWC uint8 NumPy arrays of any size) resized to ``size`` (height, width), or each to its own
    ``sizes`` where given, each flipped where its ``flips`` (vertical, horizontal) is 1; CHW uint8
    arrays, torch's own layout (a copy back to HWC cost more than it saved).

    Torch's bilinear resize samples pixel centres as DALI's linear one does and, with
    ``antialias``, widens its triangle to the scale when shrinking, as DALI's ``INTERP_TRIANGULAR``
    with antialiasing and PIL's bilinear resize do. Each torch call hands the GIL back and forth,
    and many threads waited on it more than they resized: so the NCHW view is NumPy's, the result is
    read through ``numpy()``, an unflipped image costs one torch call, and each thread gets a few
    runs of images rather than a task per image.
    """

    def resize(jobs):
        out = []
        for image, flip, shape in jobs:
            nchw = torch.from_numpy(image[None].transpose(0, 3, 1, 2))
            resized = torch.nn.functional.interpolate(
                nchw, size=[int(side) for side in shape], mode="bilinear", antialias=antialias
            )
            dims = [d for d, f in zip((2, 3), flip) if f]
            if dims:
                resized = resized.flip(dims)
            out.append(np.ascontiguousarray(resized.numpy()[0]))  # no copy when unflipped
        return out

    if flips is None:
        flips = [(0, 0)] * len(images)
    if sizes is None:
        sizes = [size] * len(images)
    jobs = list(zip(images, flips, sizes))
    step = max(1, -(-len(jobs) // (2 * threads)))  # two runs a thread even out uneven images
    runs = [jobs[i : i + step] for i in range(0, len(jobs), step)]
    return [array for run in pool.map(resize, runs) for array in run]


def add_gaussian_noise(pool, images, stddevs, seeds):
    """``images[i]`` plus noise drawn from N(0, ``stddevs[i]``²) for every element: the CPU
    pipeline's Gaussian noise, on lists of NumPy arrays. Torch generates it in chunks of
    ``NOISE_CHUNK`` elements on ``pool``'s threads, each chunk with a generator seeded by
    ``seeds[i]`` and the chunk's index, so the noise does not depend on which thread ran which
    chunk."""
    noisy = [np.empty(image.shape, np.float32) for image in images]

    def fill(job):
        out, image, stddev, seed, k = job
        chunk = slice(k * NOISE_CHUNK, (k + 1) * NOISE_CHUNK)
        noise = out.reshape(-1)[chunk]
        generator = torch.Generator().manual_seed(seed * 2**16 + k)
        torch.from_numpy(noise).normal_(0.0, float(stddev), generator=generator)
        noise += image.reshape(-1)[chunk]

    jobs = []
    for out, image, stddev, seed in zip(noisy, images, stddevs, seeds):
        chunks = -(-image.size // NOISE_CHUNK)
        jobs += [(out, image, stddev, int(seed), k) for k in range(chunks)]
    for _ in pool.map(fill, jobs):
        pass
    return noisy
