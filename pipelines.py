"""DALI input pipelines for PyTorch image training: classification and segmentation.

One class per task and split, written with DALI's ops API: operators are built in ``__init__``,
``define_graph`` wires them in the order the data flows. Every pipeline runs on a GPU
(``device_id=0``: mixed JPEG decode, GPU resize and augmentations) and on a machine with no GPU
at all (``device_id=None``: every operator on the CPU, no CUDA call anywhere).

    from pipelines import ClassifyTrainPipeline, classify_iterator
    pipe = ClassifyTrainPipeline(batch_size=256, num_threads=8, device_id=0, data_dir="imagenet/train")
    for batch in classify_iterator(pipe):
        images, labels = batch[0]["data"], batch[0]["label"].squeeze(-1).long()

    from pipelines import fetch_dali_loader, segment_iterator
    pipe = fetch_dali_loader(image_npys, mask_npys, batch_size=32, mode="train", device_id=0)
    for batch in segment_iterator(pipe):
        images, masks = batch[0]["image"], batch[0]["mask"].long()

The pipelines come first; below the banner sits the machinery that reads and checks the data.
Bad input (missing folders, unpaired or mis-shaped files) raises ``DataError`` naming the
offending path before DALI builds anything.
"""

import atexit
import colorsys
import contextlib
import csv
import functools
import hashlib
import io
import itertools
import json
import math
import os
import random
import re
import shutil
import signal
import struct
import sys
import tarfile
import tempfile
import time
import traceback
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
import torch.distributed as dist
from PIL import Image, ImageDraw
from torchvision.utils import draw_segmentation_masks, make_grid
from nvidia.dali import math as dmath
from nvidia.dali import ops, tfrecord, types
from nvidia.dali.pipeline import OperatorConcurrency, Pipeline
from nvidia.dali.plugin.base_iterator import LastBatchPolicy
from nvidia.dali.plugin.pytorch import DALIClassificationIterator, DALIGenericIterator

# ImageNet statistics on the 0..255 scale that DALI's decoders produce.
IMAGENET_MEAN = (0.485 * 255, 0.456 * 255, 0.406 * 255)
IMAGENET_STD = (0.229 * 255, 0.224 * 255, 0.225 * 255)
# Share of JPEG decoding sent to the GPU's hardware decoder (the rest goes to CUDA cores and CPU threads):
# 1.0 delivered the most on an H200 and leaves the CPU to the training loop (results/README.md).
DEFAULT_HW_DECODER_LOAD = 1.0
# Scratch memory the mixed decoder allocates up front so that it never reallocates mid-epoch; the values
# of DALI's ResNet-50 example (enough for ImageNet's largest images).
DEVICE_MEMORY_PADDING = 211025920
HOST_MEMORY_PADDING = 140544512
# Samples a shuffling TFRecord/WebDataset reader holds and picks from at random: those readers read shards
# front to back, so beyond this window an epoch's order comes from the shard order (reshuffled every epoch)
# and the order make_shards.py wrote. 4096 ImageNet JPEGs are ~450 MB of host memory per pipeline.
SHUFFLE_BUFFER = 4096
# Batches each .npy reader reads ahead in its own thread (DALI's default is 1): evens out file access.
READER_PREFETCH = 3


class DataError(ValueError):
    """Input data that cannot be read as asked; the message names the offending path."""


# ------------------------------------------------------------------------------------------
# classification
# ------------------------------------------------------------------------------------------


class _ClassifyPipeline(Pipeline):
    """What the two classification pipelines share: the reader (``ClassifyReader``: an ImageFolder tree, a DALI
    file_list, TFRecord files or WebDataset tars), where the decoder and the other operators run, and the final
    normalization with ImageNet mean/std.

    Attributes for the trainer: ``layout`` ("folder" for a tree or a file_list, "tfrecord", "wds"), ``classes``
    (class names in index order, or None when unknown), ``num_classes`` (or None), ``num_samples`` (the whole
    split, all shards), ``files`` (image files or shards, for ``find_undecodable``), ``output_layout``.
    """

    def __init__(self, batch_size, num_threads, device_id, data_dir, *, shuffle, crop_size, dtype="float32",
                 output_layout="CHW", file_list=None, shard_id=0, num_shards=1, seed=None, label_offset=0,
                 num_classes=None, classes=None, hw_decoder_load=DEFAULT_HW_DECODER_LOAD,
                 device_memory_padding=DEVICE_MEMORY_PADDING, host_memory_padding=HOST_MEMORY_PADDING,
                 decoder_cache=None, prefetch_queue_depth=2, **pipeline_kwargs):
        super().__init__(batch_size, num_threads, device_id, seed=seed, prefetch_queue_depth=prefetch_queue_depth,
                         **cpu_concurrency(device_id, pipeline_kwargs))
        self.decoder_device, self.device = ("cpu", "cpu") if device_id is None else ("mixed", "gpu")
        # decoder_cache (MB, on a GPU): whole images decoded once into DALI's GPU cache, where the next epochs find
        # them; a per-process cache needs each process to keep its shard every epoch (stick_to_shard).
        self.cached = device_id is not None and decoder_cache is not None
        cache = dict(cache_size=decoder_cache, cache_type="threshold", cache_threshold=0) if self.cached else {}
        # EXIF orientation is not applied, as torchvision's PIL loader does not apply it: the same pixels either way.
        self.decoder_args = dict(adjust_orientation=False) if device_id is None else dict(
            adjust_orientation=False, hw_decoder_load=hw_decoder_load, device_memory_padding=device_memory_padding,
            host_memory_padding=host_memory_padding, **cache)
        self.read = ClassifyReader(data_dir, file_list, classes=classes, num_classes=num_classes, label_offset=label_offset,
                                   shard_id=shard_id, num_shards=num_shards, shuffle=shuffle, batch_size=batch_size,
                                   stick_to_shard=self.cached, skip_cached_images=bool(cache and decoder_cache))
        self.layout, self.files, self.classes, self.num_shards = self.read.layout, self.read.files, self.read.classes, num_shards
        self.num_classes, self.num_samples = self.read.num_classes, self.read.num_samples
        self.output_layout = choice("output_layout", output_layout, {"CHW": "CHW", "HWC": "HWC"})
        self.normalize = ops.CropMirrorNormalize(
            device=self.device, dtype=choice("dtype", dtype, {"float32": types.FLOAT, "float16": types.FLOAT16}),
            output_layout=output_layout, crop=(crop_size, crop_size), mean=list(IMAGENET_MEAN), std=list(IMAGENET_STD))


class ClassifyTrainPipeline(_ClassifyPipeline):
    """ImageNet-style training input: random-resized crop fused with the decode, flip, normalize, and optionally
    random erasing. The crop's resize is DALI's on the GPU and torch's on the CPU (``resize_with_torch``).

    Outputs ``(images, labels)``: images (B, 3, crop_size, crop_size) float32 or float16, normalized with
    ImageNet mean/std, or (B, crop_size, crop_size, 3) with ``output_layout="HWC"`` (``images.permute(0, 3, 1,
    2)`` is then a channels_last tensor, no copy); labels (B, 1) int32. ``data_dir`` is an ImageFolder tree or
    a folder of TFRecord files or WebDataset tars (``find_layout``). Keyword-only: ``crop_size``, ``shard_id``,
    ``num_shards``, ``seed``, ``file_list``, ``dtype``, ``output_layout``, ``random_area``,
    ``random_aspect_ratio``, ``random_erase``, ``label_offset`` (subtracted from stored labels: 1 for
    TensorFlow's ImageNet TFRecords, which store 1..1000), ``num_classes``, ``classes`` (the training class
    names, which number a folder's labels), ``hw_decoder_load``, the decoder's memory paddings, ``decoder_cache``
    (MB of GPU memory for decoded images; None: decode only the crop's window, uncached), ``prefetch_queue_depth``;
    the rest goes to DALI's ``Pipeline`` (``enable_checkpointing``, ``checkpoint``, ``exec_dynamic``, ...).
    """

    last_batch_policy = LastBatchPolicy.FILL  # see classify_iterator

    def __init__(self, batch_size, num_threads, device_id, data_dir=None, *, crop_size=224, dtype="float32",
                 random_area=(0.08, 1.0), random_aspect_ratio=(3 / 4, 4 / 3), random_erase=0.0, **kwargs):
        # DALI's GPU Erase has no float16 kernel: erase the float32 image, then cast it.
        cast_after_erase = random_erase and dtype == "float16"
        super().__init__(batch_size, num_threads, device_id, data_dir, shuffle=True, crop_size=crop_size,
                         dtype="float32" if cast_after_erase else dtype, **kwargs)
        crop = dict(random_area=list(random_area), random_aspect_ratio=list(random_aspect_ratio), num_attempts=100)
        if self.cached:  # the whole image, cached, then the random crop of it on the GPU: the same distribution
            self.decode = ops.decoders.Image(device="mixed", output_type=types.RGB, **self.decoder_args)
            self.resize = ops.RandomResizedCrop(device="gpu", size=[crop_size, crop_size], **crop,
                                                interp_type=types.INTERP_TRIANGULAR, antialias=True)
        else:  # decoding only the random crop's window saves work on large images
            self.decode = ops.decoders.ImageRandomCrop(device=self.decoder_device, output_type=types.RGB, **crop,
                                                       **self.decoder_args)
            if device_id is None:  # torch's resize: the same filter, several times faster than DALI 2.4's on the CPU
                self.resize = ops.PythonFunction(
                    function=functools.partial(resize_with_torch, torch_threads(num_threads), num_threads,
                                               (crop_size, crop_size), True),
                    num_outputs=1, batch_processing=True, output_layouts="CHW")
            else:
                self.resize = ops.Resize(device=self.device, resize_x=crop_size, resize_y=crop_size,
                                         interp_type=types.INTERP_TRIANGULAR, antialias=True)
        self.flip = ops.random.CoinFlip(probability=0.5)
        self.erase = self.erase_random_box if random_erase else unchanged
        if random_erase:
            # torchvision's RandomErasing(p, scale=(0.02, 0.33), ratio=(0.3, 3.3), value=0), applied as its
            # classification reference does: after normalization, so 0 is the mean colour.
            self.erase_coin = ops.random.CoinFlip(probability=random_erase)
            self.erase_area = ops.random.Uniform(range=[0.02, 0.33])
            self.erase_log_ratio = ops.random.Uniform(range=[math.log(0.3), math.log(3.3)])
            self.erase_where = ops.random.Uniform(range=[0.0, 1.0], shape=[2])
            self.erase_op = ops.Erase(device=self.device, axis_names="HW", normalized=True, fill_value=0.0)
            self.to_float16 = ops.Cast(device=self.device, dtype=types.FLOAT16) if cast_after_erase else unchanged

    def define_graph(self):
        jpegs, labels = self.read()
        images = self.decode(jpegs)
        images = self.resize(images)
        images = self.normalize(images, mirror=self.flip())
        images = self.erase(images)
        return images, labels

    def erase_random_box(self, images):
        # (height, width) as fractions of the square crop: sqrt(area * ratio), sqrt(area / ratio). torchvision
        # redraws a box that does not fit (up to 10 times); here it is clipped to the crop, which changes only the
        # rare largest, most elongated boxes. A sample whose coin came up 0 gets a box of size 0: nothing erased.
        ratio = dmath.exp(self.erase_log_ratio() * types.Constant(np.array([1.0, -1.0], np.float32)))
        size = dmath.min(dmath.sqrt(self.erase_area() * ratio), 1.0) * self.erase_coin()
        return self.to_float16(self.erase_op(images, anchor=self.erase_where() * (1.0 - size), shape=size))


class ClassifyValPipeline(_ClassifyPipeline):
    """Validation input: decode, resize the shorter side to ``resize_size``, center crop ``crop_size``, normalize.

    Same outputs and data arguments as ``ClassifyTrainPipeline``; samples are read in order, not shuffled. Pass
    the training pipeline's ``classes`` so that validation labels use train's indices.
    """

    last_batch_policy = LastBatchPolicy.PARTIAL  # see classify_iterator

    def __init__(self, batch_size, num_threads, device_id, data_dir=None, *, crop_size=224, resize_size=256,
                 **kwargs):
        super().__init__(batch_size, num_threads, device_id, data_dir, shuffle=False, crop_size=crop_size, **kwargs)
        self.decode = ops.decoders.Image(device=self.decoder_device, output_type=types.RGB, **self.decoder_args)
        self.resize = ops.Resize(device=self.device, resize_shorter=resize_size,
                                 interp_type=types.INTERP_TRIANGULAR, antialias=True)

    def define_graph(self):
        jpegs, labels = self.read()
        images = self.decode(jpegs)
        images = self.resize(images)
        images = self.normalize(images)
        return images, labels


def classify_iterator(pipe):
    """One pass over the pipeline's shard per epoch: ``batch[0]["data"]``, ``batch[0]["label"]``.

    Training batches are always full: the reader pads its shard with a few distinct samples of its own, repeated,
    so every rank runs the same number of full batches, never one of a single sample (BatchNorm needs more), and
    trains on those few samples twice. Validation batches drop the padding: every sample is seen exactly once.
    """
    return DALIClassificationIterator(pipe, reader_name="Reader", last_batch_policy=pipe.last_batch_policy,
                                      auto_reset=True)


# ------------------------------------------------------------------------------------------
# segmentation
# ------------------------------------------------------------------------------------------


class SegmentValPipeline(Pipeline):
    """Image and mask ``.npy`` files, ``imgs[i]`` paired with ``lbls[i]``, read in lock-step and resized to
    ``size`` (height, width), the image normalized.

    Outputs ``(image, mask)``, both CHW. Image (B, C, H, W) float32, C = ``self.channels`` (1 or 3, as stored).
    Mask (B, 1, H, W): uint8 for uint8 or bool masks, int32 for any other integer type. Images are resized
    linearly, masks by nearest neighbour, so a mask keeps exactly its class values.

    Normalization: 8-bit RGB images with ImageNet mean/std; every other kind (greyscale, uint16, float32) per
    image, each channel by the image's own mean and standard deviation (a constant channel becomes 0); or, for
    any kind, by ``mean`` and ``std`` when given (1 or C values each, on the image's own scale). Further keyword
    arguments go to DALI's ``Pipeline`` (``enable_checkpointing``, ``checkpoint``, ...).
    """

    shuffle = False
    last_batch_policy = LastBatchPolicy.PARTIAL  # see segment_iterator

    def __init__(self, batch_size, num_threads, device_id, imgs, lbls, *, size=(384, 384), shard_id=0,
                 num_shards=1, seed=42, mean=None, std=None, prefetch_queue_depth=2, **pipeline_kwargs):
        super().__init__(batch_size, num_threads, device_id, seed=seed, prefetch_queue_depth=prefetch_queue_depth,
                         **cpu_concurrency(device_id, pipeline_kwargs))
        (image_shape, image_dtype), (mask_shape, mask_dtype) = check_segmentation_files(imgs, lbls)
        if image_dtype.kind == "f" and (found := first_nonfinite(list(imgs)[shard_id::num_shards], num_threads)):
            raise DataError(f"{found}: holds NaN or infinite pixels; a float image must be finite everywhere")
        self.channels = image_shape[2] if len(image_shape) == 3 else 1
        if (mean is None) != (std is None):
            raise ValueError(f"give both mean and std, or neither (got mean={mean}, std={std})")
        if mean is None and self.channels == 3 and image_dtype == np.uint8:
            mean, std = IMAGENET_MEAN, IMAGENET_STD
        self.on_gpu = device_id is not None
        device = "gpu" if self.on_gpu else "cpu"
        if self.shuffle:  # a few distinct pairs repeated, so that every shard holds whole batches (see repeats)
            extra = extra_samples(len(imgs), num_shards, batch_size)
            imgs, lbls = list(imgs) + repeats(list(imgs), extra), list(lbls) + repeats(list(lbls), extra)
        # One seed, shuffle and sharding for both readers keeps them in lock-step. Memory-mapped reads with
        # cached headers: plain reads (dont_use_mmap) were 7x slower, and the reader was the ceiling.
        reader_args = dict(shard_id=shard_id, num_shards=num_shards, random_shuffle=self.shuffle, seed=seed,
                           pad_last_batch=True, cache_header_information=True, prefetch_queue_depth=READER_PREFETCH)
        self.read_image = ops.readers.Numpy(files=list(imgs), name="ReaderX", **reader_args)
        self.read_mask = ops.readers.Numpy(files=list(lbls), name="ReaderY", **reader_args)
        # (H, W) files get a channel axis of 1, so every kind of set runs through one graph.
        self.image_hwc = ops.Reshape(device=device, src_dims=[0, 1, -1] if len(image_shape) == 2 else [0, 1, 2],
                                     layout="HWC")
        self.mask_hwc = ops.Reshape(device=device, src_dims=[0, 1, -1] if len(mask_shape) == 2 else [0, 1, 2],
                                    layout="HWC")
        self.mask_chw = ops.Reshape(device=device, src_dims=[2, 0, 1], layout="CHW")  # (H, W, 1): moves no data
        # DALI's Resize reads uint8, int16, uint16 and float32: other masks (np.argmax gives int64) are resized as
        # float32, exact for class values below 2**24, and handed out as int32. A cast to the type a mask already
        # has would only copy it, so uint8 masks skip both.
        resized, handed_out = ((types.UINT8, types.UINT8) if mask_dtype in (np.uint8, np.bool_)
                               else (types.FLOAT, types.INT32))
        self.mask_to_resize = ops.Cast(device=device, dtype=resized) if mask_dtype != np.uint8 else unchanged
        self.mask_to_output = ops.Cast(device=device, dtype=handed_out) if handed_out != resized else unchanged
        # The training pipeline flips by reading the region of interest backwards (flip_by_roi).
        self.resize_mask = functools.partial(flip_by_roi, ops.Resize(
            device=device, size=list(size), interp_type=types.INTERP_NN, antialias=False, roi_relative=True))
        # One pool for a CPU-only pipeline's torch code (this resize, the training noise); threads start on use.
        self.torch_threads = None if self.on_gpu else torch_threads(num_threads)
        if not self.on_gpu and image_dtype == np.uint8:  # torch's resize: faster than DALI 2.4's CPU one, 8-bit only
            torch_resize = ops.PythonFunction(
                function=functools.partial(resize_with_torch, self.torch_threads, num_threads, tuple(size), False),
                num_outputs=1, batch_processing=True, output_layouts="CHW")
            self.resize_image = lambda image, flips=None: torch_resize(image, *([] if flips is None else [flips]))
            self.to_chw = unchanged  # torch hands out CHW
        else:
            self.resize_image = functools.partial(flip_by_roi, ops.Resize(
                device=device, size=list(size), interp_type=types.INTERP_LINEAR, antialias=False, roi_relative=True))
            self.to_chw = ops.Transpose(device=device, perm=[2, 0, 1], output_layout="CHW")
        if mean is None:
            self.channel_min = ops.reductions.Min(device=device, axes=[1, 2], keep_dims=True)
            self.standardize = ops.Normalize(device=device, axes=[1, 2], dtype=types.FLOAT)
            self.normalize = self.normalize_each_image
        else:
            mean, std = np.atleast_1d(mean).astype(float).tolist(), np.atleast_1d(std).astype(float).tolist()
            if {len(mean), len(std)} - {1, self.channels}:
                raise ValueError(f"mean and std need 1 or {self.channels} values each (the images have "
                                 f"{self.channels} channels), got mean={mean}, std={std}")
            self.normalize = ops.CropMirrorNormalize(device=device, dtype=types.FLOAT, output_layout="CHW",
                                                     mean=mean, std=std)

    def define_graph(self):
        image, mask = self.read()
        image, mask = self.resize_image(image), self.resize_mask(mask)
        image = self.normalize(image)
        return image, self.output_mask(mask)

    def read(self):
        """Each pair's image (H, W, C) and mask (H, W, 1), on the pipeline's device."""
        image, mask = self.read_image(), self.read_mask()
        if self.on_gpu:
            image, mask = image.gpu(), mask.gpu()
        return self.image_hwc(image), self.mask_to_resize(self.mask_hwc(mask))

    def normalize_each_image(self, image):
        # Each channel is shifted to start at 0 first: that changes nothing after standardizing, but makes a
        # constant channel exactly 0 (its float32 mean is a hair off, and the hair over a tiny std gave -1 or 1).
        image = self.to_chw(image)
        return self.standardize(image - self.channel_min(image))

    def output_mask(self, mask):
        return self.mask_to_output(self.mask_chw(mask))


class SegmentTrainPipeline(SegmentValPipeline):
    """``SegmentValPipeline`` plus augmentations, on the device of the pipeline.

    Flips (vertical, horizontal; ``flip_p`` each) are drawn per sample and applied to image and mask alike. On
    the normalized image only, each drawn per sample with its own probability: Gaussian noise, Gaussian blur,
    brightness scaling, and contrast scaling clamped to the image's own min/max.
    """

    shuffle = True
    # Full batches only, the same number on every shard: the readers' pad_last_batch fills a shard's last batch
    # by repeating its own samples, so no step sees made-up data (see segment_iterator).
    last_batch_policy = LastBatchPolicy.FILL

    def __init__(self, batch_size, num_threads, device_id, imgs, lbls, *, flip_p=0.5, noise_p=0.15,
                 noise_std=(0.0, 0.33), blur_p=0.15, blur_sigma=(0.5, 1.5), brightness_p=0.15, brightness=(0.7, 1.3),
                 contrast_p=0.13, contrast=(0.9, 1.1), **kwargs):
        super().__init__(batch_size, num_threads, device_id, imgs, lbls, **kwargs)
        device = "gpu" if self.on_gpu else "cpu"
        self.flip_coins = ops.random.CoinFlip(probability=flip_p, shape=[2])  # (vertical, horizontal)
        self.as_float = ops.Cast(dtype=types.FLOAT)
        self.noise_coin = ops.random.CoinFlip(probability=noise_p, dtype=types.BOOL)
        self.noise_draws = [ops.random.Uniform(range=list(noise_std))]  # the stddev
        if self.on_gpu:
            gaussian = ops.noise.Gaussian(device=device)
            self.add_noise = lambda image, stddev: gaussian(image, stddev=stddev)
        else:
            # DALI's CPU normal generator was ten times slower than torch's. Torch's generators are seeded from a
            # DALI draw (below 2**47, see add_gaussian_noise), so the seed and checkpoints still decide the noise.
            self.noise_draws.append(ops.random.Uniform(range=[0.0, 2.0 ** 47], dtype=types.FLOAT64))
            self.add_noise = ops.PythonFunction(function=functools.partial(add_gaussian_noise, self.torch_threads),
                                                num_outputs=1, batch_processing=True, output_layouts="CHW")
        self.blur_coin = ops.random.CoinFlip(probability=blur_p, dtype=types.BOOL)
        self.blur_sigma = ops.random.Uniform(range=list(blur_sigma))
        gaussian_blur = ops.GaussianBlur(device=device)
        self.blur = lambda image, sigma: gaussian_blur(image, sigma=sigma)
        self.brightness_coin = ops.random.CoinFlip(probability=brightness_p, dtype=types.BOOL)
        self.brightness = ops.random.Uniform(range=list(brightness))
        self.contrast_coin = ops.random.CoinFlip(probability=contrast_p, dtype=types.BOOL)
        self.contrast = ops.random.Uniform(range=list(contrast))
        self.min = ops.reductions.Min(device=device)
        self.max = ops.reductions.Max(device=device)
        # The ops API has no per-sample `if`; these are the operators that DALI's conditionals run for one. DALI
        # keeps them in ops._conditional, so requirements.txt pins DALI's version exactly.
        self.split = ops._conditional.Split(device=device)
        self.split_draw = ops._conditional.Split(device="cpu")
        self.merge = ops._conditional.Merge(device=device)

    def define_graph(self):
        image, mask = self.read()
        flips = self.as_float(self.flip_coins())  # one draw per sample for image and mask alike
        image, mask = self.resize_image(image, flips), self.resize_mask(mask, flips)
        image = self.normalize(image)
        image = self.where_drawn(self.noise_coin, self.add_noise, image, *self.noise_draws)
        image = self.where_drawn(self.blur_coin, self.blur, image, self.blur_sigma)
        image = self.where_drawn(self.brightness_coin, lambda x, factor: x * factor, image, self.brightness)
        image = self.where_drawn(self.contrast_coin, self.scale_contrast, image, self.contrast)
        return image, self.output_mask(mask)

    def where_drawn(self, coin, augment, image, *draws):
        """``augment(image, *values)`` on the samples whose ``coin`` came up, the others as they were; ``draws`` are
        random operators, one value per sample. Only the samples that drew an augmentation pay for it: computing
        it for every sample and keeping it by the coin made the CPU pipeline 4x slower than a DataLoader."""
        predicate = coin()
        drawn, kept = self.split(image, predicate=predicate)
        values = [self.split_draw(draw(), predicate=predicate)[0] for draw in draws]
        return self.merge(augment(drawn, *values), kept, predicate=predicate)

    def scale_contrast(self, image, factor):
        # a min of a max: dmath.clamp took twice as long on the CPU
        return dmath.min(dmath.max(image * factor, self.min(image)), self.max(image))


def segment_iterator(pipe):
    """Batches of a segmentation pipeline as PyTorch tensors: ``batch[0]["image"]``, ``batch[0]["mask"]``.

    A validation pipeline yields every sample of its shard exactly once per epoch (the last batch partial). A
    training pipeline yields full batches only, the same number on every shard, the last one filled with repeats
    of the shard's own samples: under DDP every rank takes the same number of steps, on real data.
    """
    return DALIGenericIterator(pipe, ["image", "mask"], reader_name="ReaderX",
                               last_batch_policy=pipe.last_batch_policy, auto_reset=True)


SEGMENT_PIPELINES = {"train": SegmentTrainPipeline, "eval": SegmentValPipeline, "test": SegmentValPipeline}
PIPELINE_KEYS = ("device_id", "num_threads", "shard_id", "num_shards", "seed", "size", "mean", "std",
                 "prefetch_queue_depth", "enable_checkpointing", "checkpoint")
AUGMENTATION_KEYS = ("flip_p", "noise_p", "noise_std", "blur_p", "blur_sigma", "brightness_p", "brightness",
                     "contrast_p", "contrast")
# The nail-segmentation write-up's settings that stand for one of ours: DALI threads, number of shards.
WRITEUP_KEYS = ("num_workers", "gpus")
# Its settings this loader has no use for (3D volumes, patch sampling, benchmark mode, GPU staging): accepted
# so that its client code runs unchanged, and ignored.
IGNORED_KEYS = ("dim", "overlap", "benchmark", "oversampling", "test_batches", "train_batches", "load_to_gpu")


def fetch_dali_loader(imgs, lbls, batch_size, mode, **kwargs):
    """The segmentation pipeline for ``mode``: ``SegmentTrainPipeline`` for "train", ``SegmentValPipeline`` for
    "eval" or "test", over ``.npy`` files paired by position (``imgs[i]`` with ``lbls[i]``).

    Returns the pipeline, as the nail-segmentation write-up's loader does: wrap it with ``segment_iterator(pipe)``,
    or with the write-up's ``DALIGenericIterator`` subclass (``reader_name="ReaderX"``; it keeps DALI's default
    policy, FILL, so its validation epochs end with a batch padded by repeats, where ``segment_iterator`` counts
    every validation sample once). ``pipe.channels`` is the number of image channels a model must take.

    Takes the write-up's settings dict as it stands: ``num_workers`` (DALI threads), ``gpus`` (shards when not
    under torchrun), ``seed``; ``dim``, ``overlap``, ``benchmark``, ``oversampling``, ``test_batches``,
    ``train_batches`` and ``load_to_gpu`` are ignored. Unless given as ``device_id``, ``shard_id`` and
    ``num_shards``, the device and shard come from the environment, as in the write-up: GPU ``LOCAL_RANK`` (0 if
    unset) when PyTorch sees a GPU, else the CPU only (``device_id=None``); shard ``RANK`` of ``WORLD_SIZE`` under
    torchrun, else shard ``LOCAL_RANK`` of ``gpus``. Our own settings: ``num_threads`` (wins over
    ``num_workers``; default 4), ``seed``, ``size``, ``mean``, ``std``, ``prefetch_queue_depth``,
    ``enable_checkpointing``, ``checkpoint``, and ``SegmentTrainPipeline``'s augmentation settings (used by
    "train", ignored by "eval" and "test"). Any other key raises ``ValueError`` listing the accepted ones.
    """
    if mode not in SEGMENT_PIPELINES:
        raise ValueError(f"mode must be one of {', '.join(SEGMENT_PIPELINES)}, got {mode!r}")
    unknown = [key for key in kwargs if key not in PIPELINE_KEYS + AUGMENTATION_KEYS + WRITEUP_KEYS + IGNORED_KEYS]
    if unknown:
        raise ValueError(f"fetch_dali_loader got unknown keyword argument(s) {', '.join(unknown)}; it accepts "
                         f"{', '.join(PIPELINE_KEYS + AUGMENTATION_KEYS + WRITEUP_KEYS)}, and ignores "
                         f"{', '.join(IGNORED_KEYS)}")
    pipeline = SEGMENT_PIPELINES[mode]
    used = PIPELINE_KEYS + (AUGMENTATION_KEYS if pipeline is SegmentTrainPipeline else ())
    settings = {key: value for key, value in kwargs.items() if key in used}
    settings.setdefault("num_threads", kwargs.get("num_workers", 4))
    settings.setdefault("num_shards", env_int("WORLD_SIZE", kwargs.get("gpus", 1)))
    settings.setdefault("shard_id", env_int("RANK", env_int("LOCAL_RANK", 0)))
    settings.setdefault("device_id", env_int("LOCAL_RANK", 0) if torch.cuda.is_available() else None)
    if not 0 <= settings["shard_id"] < settings["num_shards"]:
        raise ValueError(f"shard_id {settings['shard_id']} is out of range for num_shards {settings['num_shards']} "
                         f"(from the arguments, else RANK or LOCAL_RANK, and WORLD_SIZE or gpus)")
    return pipeline(batch_size, settings.pop("num_threads"), settings.pop("device_id"), imgs, lbls, **settings)


# ==========================================================================================
# Machinery: reading and checking the data; the trainers' stop and exit handling. Nothing here is a pipeline.
# ==========================================================================================

# The extensions torchvision's ImageFolder accepts (case-insensitive), so that both loaders see the same files.
IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
# TensorFlow's shard names (train-00000-of-01024) have no extension; other writers use .tfrecord.
TFRECORD_NAME = re.compile(r"[^.].*-\d{5}-of-\d{5}|[^.].*\.tfrecords?")
TFRECORD_FEATURES = {"image/encoded": tfrecord.FixedLenFeature((), tfrecord.string, ""),
                     "image/class/label": tfrecord.FixedLenFeature([1], tfrecord.int64, -1)}
# A WebDataset sample is <key>.<image extension> + <key>.cls; the same image types as ImageFolder.
WDS_IMAGE_EXTENSIONS = tuple(e[1:] for e in IMG_EXTENSIONS)
# Longest .cls label in decimal digits: any class index that fits an int32.
LABEL_DIGITS = 9
# Where the index of a shard in a read-only folder goes, keyed by the shard's absolute path.
INDEX_CACHE = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "dali-indexes")
# Elements of noise one task generates: DALI's own CPU random operators split a large sample the same way.
NOISE_CHUNK = 1 << 16
# Seconds between two progress lines of a long job; a job done sooner prints none.
PROGRESS_EVERY = 5.0


def progress(items, total, what, every=PROGRESS_EVERY, out=None):
    """``items``, passed through, with a line on ``out`` (stderr) every ``every`` seconds: ``what``, the count of ``total``, the
    rate and the ETA; one line at a time, so that it reads the same on a terminal and in a cluster log. A job done
    within the first ``every`` seconds prints nothing; one that printed ends with a line of its total time."""
    start = last = time.perf_counter()
    done = 0
    for done, item in enumerate(items, 1):
        yield item
        if (now := time.perf_counter()) - last >= every:
            last, rate = now, done / (now - start)
            eta = f", eta {round((total - done) / rate)} s" if total else ""
            print(f"{what}: {done:,}/{total:,} ({100 * done / max(total, 1):.0f} %), {rate:,.1f}/s{eta}",
                  file=out or sys.stderr, flush=True)
    if last > start:
        print(f"{what}: {done:,} done in {time.perf_counter() - start:.0f} s", file=out or sys.stderr, flush=True)


def alongside(items, extra):
    """``items``, passed through, taking one item of ``extra`` after each, and the rest of it after the last: work
    done beside a loop, a step at a time, that the loop's first item does not wait for."""
    extra = iter(extra)
    for item in items:
        yield item
        next(extra, None)
    for _ in extra:
        pass


def unchanged(data):
    """The identity: stands in for an operator a pipeline does not need (a cast to the type data already has)."""
    return data


def choice(name, value, allowed):
    """``allowed[value]``, or a ValueError naming ``name`` and the allowed values."""
    if value not in allowed:
        raise ValueError(f"{name} must be {' or '.join(map(repr, allowed))}, got {value!r}")
    return allowed[value]


def env_int(name, default):
    return int(os.environ[name]) if os.environ.get(name) else default


def cpu_concurrency(device_id, pipeline_kwargs):
    """``Pipeline`` keyword arguments: a CPU-only pipeline lets independent operators, and with them successive
    iterations, run at once. DALI 2.4 does so only in a process started with ``DALI_USE_NEW_THREAD_POOL=1`` (its
    new thread pool); without it CPU operators run one at a time, as by default."""
    return {"concurrency": OperatorConcurrency.FULL, **pipeline_kwargs} if device_id is None else pipeline_kwargs


def torch_threads(num_threads):
    """The threads on which a CPU-only pipeline's torch code runs: as many as DALI's own (a ``PythonFunction``
    calls its function on one thread; torch's kernels let go of the GIL). At least one, so that a
    ``num_threads`` below 1 reaches DALI's build and its own message."""
    return ThreadPoolExecutor(max(1, num_threads or 1), thread_name_prefix="torch")


def flip_by_roi(resize, data, flips=None):
    """DALI's ``resize`` of ``data``, flipped where ``flips`` (vertical, horizontal) is 1: the region of interest
    read backwards, from 1 to 0 along the flipped axes, costs no pass of its own."""
    return resize(data) if flips is None else resize(data, roi_start=flips, roi_end=1 - flips)


def resize_with_torch(pool, threads, size, antialias, images, flips=None):
    """DALI's CPU ``Resize``, computed by torch on the ``threads`` threads of ``pool``: ``images`` (HWC uint8 NumPy
    arrays of any size) resized to ``size`` (height, width), each flipped where its ``flips`` (vertical,
    horizontal) is 1; CHW uint8 arrays, torch's own layout (a copy back to HWC cost more than it saved).

    Torch's bilinear resize samples pixel centres as DALI's linear one does and, with ``antialias``, widens its
    triangle to the scale when shrinking, as DALI's ``INTERP_TRIANGULAR`` with antialiasing and PIL's bilinear
    resize do. Each torch call hands the GIL back and forth, and many threads waited on it more than they
    resized: so the NCHW view is NumPy's, the result is read through ``numpy()``, an unflipped image costs one
    torch call, and each thread gets a few runs of images rather than a task per image.
    """
    def resize(jobs):
        out = []
        for image, flip in jobs:
            nchw = torch.from_numpy(image[None].transpose(0, 3, 1, 2))
            resized = torch.nn.functional.interpolate(nchw, size=size, mode="bilinear", antialias=antialias)
            dims = [d for d, f in zip((2, 3), flip) if f]
            out.append(np.ascontiguousarray((resized.flip(dims) if dims else resized).numpy()[0]))  # no copy
        return out

    jobs = list(zip(images, flips if flips is not None else [(0, 0)] * len(images)))
    step = max(1, -(-len(jobs) // (2 * threads)))  # two runs per thread even out images of different sizes
    return [a for run in pool.map(resize, [jobs[i:i + step] for i in range(0, len(jobs), step)]) for a in run]


def add_gaussian_noise(pool, images, stddevs, seeds):
    """``images[i]`` plus noise drawn from N(0, ``stddevs[i]``²) for every element: the CPU pipeline's Gaussian
    noise, on lists of NumPy arrays. Torch generates it in chunks of ``NOISE_CHUNK`` elements on ``pool``'s
    threads, each chunk with a generator seeded by ``seeds[i]`` and the chunk's index, so the noise does not
    depend on which thread ran which chunk."""
    noisy = [np.empty(image.shape, np.float32) for image in images]

    def fill(job):
        out, image, stddev, seed, k = job
        chunk = slice(k * NOISE_CHUNK, (k + 1) * NOISE_CHUNK)
        noise = out.reshape(-1)[chunk]
        generator = torch.Generator().manual_seed(seed * 2 ** 16 + k)
        torch.from_numpy(noise).normal_(0.0, float(stddev), generator=generator)
        noise += image.reshape(-1)[chunk]

    jobs = [(out, image, stddev, int(seed), k) for out, image, stddev, seed in zip(noisy, images, stddevs, seeds)
            for k in range(-(-image.size // NOISE_CHUNK))]
    for _ in pool.map(fill, jobs):
        pass
    return noisy


@contextlib.contextmanager
def atomic_open(path, mode="wb"):
    """A file that appears under ``path`` only once it is completely written (a temporary name in the same folder,
    then a rename), so that a killed writer never leaves half a file behind that name."""
    folder, name = os.path.split(path)
    tmp = os.path.join(folder, f".{name}.{os.getpid()}.partial")  # what atomic_temp_pattern matches
    try:
        with open(tmp, mode) as f:
            yield f
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def atomic_temp_pattern(name):
    """A regular expression of ``atomic_open``'s temporary names for the files that the expression ``name``
    matches: what a killed writer leaves behind."""
    return rf"\.{name}\.\d+\.partial"


# data in object storage: s3:// URLs, whose bytes DALI's readers fetch themselves ------------------------------
# boto3 lists the prefixes and reads the small files (classes.txt, manifest.json, index summaries, digests): its
# errors say what is wrong (bucket, credentials, access, endpoint) before DALI builds anything.

# Seconds a request may wait for a connection, and then for each answer; AWS_MAX_ATTEMPTS (3) bounds the tries.
S3_TIMEOUT = 10
# Requests in flight at once while the indexes of remote shards are checked.
S3_THREADS = 16


def remote(path):
    """Whether ``path`` is in object storage (an s3:// URL)."""
    return str(path).startswith("s3://")


@functools.lru_cache(maxsize=1)
def s3_client():
    """boto3's S3 client: endpoint (``AWS_ENDPOINT_URL``), credentials and region found as the AWS tools find them."""
    try:
        import boto3
        from botocore.config import Config
    except ImportError:
        raise DataError("s3:// data needs the boto3 package (pip install boto3)") from None
    return boto3.client("s3", config=Config(connect_timeout=S3_TIMEOUT, read_timeout=S3_TIMEOUT,
                                            retries={"mode": "standard"}))


@contextlib.contextmanager
def s3_errors(url):
    """The client, with boto3's errors about ``url`` turned into a ``DataError`` that says what to check, and a
    missing object into ``FileNotFoundError``."""
    client = s3_client()
    from botocore import exceptions
    try:
        yield client
    except exceptions.NoCredentialsError:
        raise DataError(f"{url}: no AWS credentials found (set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or "
                        f"AWS_PROFILE)") from None
    except exceptions.ClientError as e:
        code, message = e.response["Error"].get("Code"), e.response["Error"].get("Message")
        if code == "NoSuchKey":
            raise FileNotFoundError(url) from None
        if code == "NoSuchBucket":
            raise DataError(f"{url}: no such bucket at {client.meta.endpoint_url}") from None
        if e.response["ResponseMetadata"].get("HTTPStatusCode") == 403:
            raise DataError(f"{url}: access denied ({code}: {message}); check the credentials and the bucket's "
                            f"policy") from None
        raise DataError(f"{url}: {code} from {client.meta.endpoint_url} ({message})") from None
    except exceptions.BotoCoreError as e:  # no connection, or no answer within S3_TIMEOUT
        raise DataError(f"{url}: {e}; check AWS_ENDPOINT_URL and that the server is up") from None


def s3_bucket_key(url):
    bucket, _, key = url[len("s3://"):].partition("/")
    return bucket, key.strip("/")


@functools.lru_cache(maxsize=None)
def s3_files(url):
    """{path relative to ``url``: size in bytes} of every object under the s3:// prefix ``url``, listed once."""
    bucket, key = s3_bucket_key(url)
    prefix = key and key + "/"
    with s3_errors(url) as s3:
        pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        return {o["Key"][len(prefix):]: o["Size"] for page in pages for o in page.get("Contents", [])
                if not o["Key"].endswith("/")}  # a key ending in / is a console's folder marker


@functools.lru_cache(maxsize=None)
def s3_tree(url):
    """{top-level name under ``url``: its files' relative paths in ``walk``'s order}, from one listing."""
    tree = {}
    for rel in sorted(s3_files(url), key=os.path.split):
        tree.setdefault(rel.split("/")[0], []).append(rel)
    return tree


def s3_get(url, byte_range=None):
    """The bytes of an s3:// object (``byte_range``: HTTP's "bytes=first-last")."""
    bucket, key = s3_bucket_key(url)
    with s3_errors(url) as s3:
        return s3.get_object(Bucket=bucket, Key=key, **({"Range": byte_range} if byte_range else {}))["Body"].read()


def overlapped(fn, items, parallel):
    """``map(fn, items)``, in order; on ``S3_THREADS`` threads when ``parallel`` (requests to object storage, which
    overlap), in this thread otherwise."""
    if not parallel:
        yield from map(fn, items)
        return
    with ThreadPoolExecutor(S3_THREADS) as pool:
        yield from pool.map(fn, items)


def s3_size(url):
    """The size of an s3:// object from its prefix's one listing, or None when there is no such object."""
    return s3_files(os.path.dirname(url)).get(os.path.basename(url))


def isdir(path):
    """``os.path.isdir``; for an s3:// prefix, whether any object is under it."""
    return bool(s3_files(path)) if remote(path) else os.path.isdir(path)


def entries(folder):
    """(name, is a folder) of everything in a folder or directly under an s3:// prefix."""
    if remote(folder):
        return [(name, "/" in rels[0]) for name, rels in s3_tree(folder).items()]
    return [(e.name, e.is_dir()) for e in os.scandir(folder)]


def walk(folder):
    """Every file under ``folder``, in torchvision's ImageFolder order (``sorted(os.walk(folder))``, each folder's
    names sorted); under an s3:// prefix, from its parent's one listing."""
    if remote(folder):
        parent, name = os.path.split(folder)
        return [os.path.join(parent, rel) for rel in s3_tree(parent).get(name, [])]
    return [os.path.join(root, n) for root, _, names in sorted(os.walk(folder, followlinks=True)) for n in sorted(names)]


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


def load_npy(path):
    """A .npy array, memory-mapped; an s3:// one read whole (the checks that read every pixel)."""
    return np.load(io.BytesIO(s3_get(path))) if remote(path) else np.load(path, mmap_mode="r")


def read_bytes(path):
    """A whole (small) file or s3:// object; FileNotFoundError when there is none."""
    if remote(path):
        return s3_get(path)
    with open(path, "rb") as f:
        return f.read()


def remote_shard_index(shard, layout):
    """``shard_index`` of an s3:// shard: its index beside it, made before the upload, so that DALI reads both from
    the store. The summary's size and digest must still match the shard (not its time: an upload sets its own)."""
    name, listed = os.path.basename(shard), s3_files(os.path.dirname(shard))
    how = (f"index a local copy (python -c \"import pipelines; pipelines.shard_index('{name}', '{layout}')\") and "
           f"upload {name}.idx and {name}.idx.json beside it (make_shards.py writes both for every shard)")
    if name + ".idx" not in listed or name + ".idx.json" not in listed:
        raise DataError(f"{shard}: no index beside it ({name}.idx and {name}.idx.json); {how}")
    text = s3_get(shard + ".idx.json")
    try:
        summary = json.loads(text)
        recorded = summary["shard"]["bytes"], summary["index_bytes"], summary["digest"]
    except (ValueError, KeyError, TypeError):
        recorded = None
    if recorded != (listed[name], listed[name + ".idx"], shard_digest(shard)):
        raise DataError(f"{shard}: does not match its index ({name}.idx.json records another size or digest: the "
                        f"shard was rewritten since it was indexed); {how}")
    return shard + ".idx", summary


def find_changed(pipe):
    """The first of ``pipe``'s s3:// files that is gone, or of another size, since the run listed them; or None."""
    split = pipe.read.data_dir
    before, now = s3_files(split), s3_files.__wrapped__(split)  # the listing this run used, and a new one
    return next((f for f in pipe.files if now.get(rel := f[len(split):].lstrip("/")) != before[rel]), None)


# classification data: folders, file lists and shards ------------------------------------------------


class ClassifyReader:
    """The reader of a classification pipeline and its labels: called in ``define_graph``, it gives the encoded
    images and their labels (int32 of shape (1,), less ``label_offset``).

    ``data_dir`` is an ImageFolder tree (labelled by ``classes`` when given: train's names for a val split), a
    ``file_list``'s root, or a folder of TFRecord files or WebDataset tars (indexed on first use, see
    ``shard_index``). Every shard returns the same number of batches, as DDP needs: a training reader
    (``shuffle``) repeats a few distinct samples of the set so that every shard holds whole batches (see
    ``repeats``), a validation reader pads its last batch, which the iterator drops. Stored labels outside
    [0, num_classes) raise ``DataError``.
    """

    def __init__(self, data_dir, file_list, *, classes, num_classes, label_offset, shard_id, num_shards, shuffle,
                 batch_size, stick_to_shard=False, skip_cached_images=False):
        args = dict(shard_id=shard_id, num_shards=num_shards, random_shuffle=shuffle, pad_last_batch=True,
                    stick_to_shard=stick_to_shard, skip_cached_images=skip_cached_images, name="Reader")
        self.label_offset, self.data_dir = label_offset, data_dir
        self.layout = "folder" if file_list is not None else find_layout(data_dir)
        if file_list is not None:
            if not os.path.isfile(file_list):
                raise DataError(f"{file_list}: no such file (expected lines '<path relative to data_dir> <label>')")
            with open(file_list) as f:
                entries = [line.rsplit(maxsplit=1) for line in f if line.strip()]
            if not all(len(e) == 2 and e[1].lstrip("-").isdigit() for e in entries):
                raise DataError(f"{file_list}: expected lines '<path relative to data_dir> <label>'")
            self.files, labels = [os.path.join(data_dir, path) for path, _ in entries], [int(n) for _, n in entries]
            self.classes, ranges = classes, [(file_list, min(labels), max(labels))] if labels else []
        elif self.layout == "folder":
            self.files, labels, self.classes = list_image_folder(data_dir, classes)
            ranges = [(data_dir, min(labels), max(labels))]
        if self.layout == "folder":
            self.num_samples, extra = len(self.files), extra_samples(len(self.files), num_shards, batch_size, shuffle)
            self.reader = ops.readers.File(files=self.files + repeats(self.files, extra),
                                           labels=labels + repeats(labels, extra), **args)
        else:
            self.files = shard_files(data_dir, self.layout)
            check_manifest(data_dir, self.files)
            index = functools.partial(shard_index, layout=self.layout)
            indexes, summaries = zip(*progress(overlapped(index, self.files, remote(data_dir)), len(self.files),
                                               f"{data_dir}: shards indexed"))
            self.num_samples = sum(s["samples"] for s in summaries)
            if extra := extra_samples(self.num_samples, num_shards, batch_size, shuffle):
                indexes = padded_indexes(indexes, self.layout, extra)
            listed = read_classes_txt(data_dir)
            if classes is not None and listed is not None and list(classes) != listed:
                raise DataError(f"{os.path.join(data_dir, 'classes.txt')}: its {len(listed)} classes differ from the "
                                f"{len(classes)} training classes (names and index order must match)")
            self.classes = list(classes) if classes is not None else listed
            if shuffle:
                # Whole shards in a new order every epoch (the same on every rank: the default
                # shuffle_after_epoch_seed, not the per-rank seed), samples from a SHUFFLE_BUFFER window.
                args.update(initial_fill=SHUFFLE_BUFFER, shuffle_after_epoch=True)
            if self.layout == "tfrecord":
                self.reader = ops.readers.TFRecord(path=self.files, index_path=list(indexes),
                                                   features=TFRECORD_FEATURES, **args)
            else:
                self.reader = ops.readers.Webdataset(paths=self.files, index_paths=list(indexes),
                                                     ext=[";".join(WDS_IMAGE_EXTENSIONS), "cls"],
                                                     missing_component_behavior="error", **args)
                self.pad_digits = ops.Pad(fill_value=ord("0"), shape=[LABEL_DIGITS])
                self.to_int64 = ops.Cast(dtype=types.INT64)
                self.sum = ops.reductions.Sum(keep_dims=True)
            ranges = [(shard, *s["labels"]) for shard, s in zip(self.files, summaries)]
        self.num_classes = len(self.classes) if num_classes is None and self.classes is not None else num_classes
        for where, lowest, highest in ranges:
            for label in (lowest, highest):
                if not 0 <= label - label_offset < (self.num_classes or math.inf):
                    raise DataError(f"{where}: stored label {label} minus label_offset {label_offset} is outside "
                                    f"[0, {self.num_classes or 'inf'})")
        self.to_int32 = ops.Cast(dtype=types.INT32)

    def __call__(self):
        if self.layout == "tfrecord":
            record = self.reader()
            images, labels = record["image/encoded"], record["image/class/label"]
        elif self.layout == "wds":
            images, text = self.reader()
            # .cls holds the label in ASCII digits ("103"). Padded on the right with "0" to LABEL_DIGITS digits it
            # reads as label * 10 ** padding; the division takes that off.
            digits = self.to_int64(self.pad_digits(text)) - ord("0")
            place_values = types.Constant(10 ** np.arange(LABEL_DIGITS - 1, -1, -1, dtype=np.int64))
            labels = self.sum(digits * place_values) // 10 ** (LABEL_DIGITS - text.shape(dtype=types.INT64))
        else:
            images, labels = self.reader()
        return images, self.to_int32(labels - self.label_offset)


def extra_samples(n, num_shards, batch_size, training=True):
    """How many samples a training set of ``n`` needs so that its ``num_shards`` equal shards hold whole batches."""
    return num_shards * batch_size * math.ceil(math.ceil(n / num_shards) / batch_size) - n if training else 0


def repeats(items, extra):
    """``extra`` of ``items``, spread evenly over them, each at most once while there are enough: what training
    readers append to their set. DALI's shards then need no padding of their own, which repeats a shard's last
    sample to fill its last batch; DistributedSampler, likewise, pads with real samples of the set."""
    return [items[k * len(items) // extra] for k in range(extra)]


def padded_indexes(indexes, layout, extra):
    """Copies of DALI's index files of a set of shards with ``extra`` records repeated (see ``repeats``), in a
    temporary folder of this process."""
    header = 1 if layout == "wds" else 0  # "v1.2 <samples>"
    lines = [read_bytes(index).decode().splitlines() for index in indexes]
    for k, line in repeats([(k, line) for k, ls in enumerate(lines) for line in ls[header:]], extra):
        lines[k].append(line)
    folder = tempfile.mkdtemp(prefix="dali-index-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    paths = [os.path.join(folder, f"{k}.idx") for k in range(len(lines))]
    for path, ls in zip(paths, lines):
        with open(path, "w") as f:
            f.write("".join(line + "\n" for line in ([f"v1.2 {len(ls) - 1}"] + ls[1:] if header else ls)))
    return paths


def find_classes(data_dir):
    """Class names sorted exactly as torchvision's ImageFolder sorts them, and their indices."""
    if not isdir(data_dir):
        raise DataError(f"{data_dir}: no such directory (expected an ImageFolder tree: <dir>/<class>/<image>)")
    classes = sorted(name for name, is_dir in entries(data_dir) if is_dir)
    if not classes:
        raise DataError(f"{data_dir}: no class folders in it (expected <dir>/<class>/<image>)")
    return classes, {c: i for i, c in enumerate(classes)}


def list_image_folder(data_dir, classes=None):
    """(files, labels, classes) of an ImageFolder tree, in torchvision's order.

    ``classes`` (the training split's class names) numbers the labels by that list instead of by this tree's own
    folders: a validation split that lacks some classes keeps train's indices, and a folder that is not in the
    list is an error.
    """
    found, class_to_idx = find_classes(data_dir)
    if classes is not None:
        class_to_idx = {c: i for i, c in enumerate(classes)}
        for c in found:
            if c not in class_to_idx:
                raise DataError(f"{os.path.join(data_dir, c)}: class {c!r} is not one of the {len(classes)} "
                                f"training classes")
    files, labels = [], []
    for c in found:
        class_files = [f for f in walk(os.path.join(data_dir, c)) if f.lower().endswith(IMG_EXTENSIONS)]
        if not class_files:
            raise DataError(f"{os.path.join(data_dir, c)}: no images in this class folder "
                            f"(expected files ending in {', '.join(IMG_EXTENSIONS)})")
        files += class_files
        labels += [class_to_idx[c]] * len(class_files)
    return files, labels, found if classes is None else list(classes)


def find_layout(split_dir):
    """What ``split_dir`` holds: "folder" (class folders), "tfrecord" or "wds" (WebDataset .tar shards)."""
    if not isdir(split_dir):
        raise DataError(f"{split_dir}: no such directory (expected class folders, TFRecord files or .tar shards)")
    found = set()
    for name, is_dir in entries(split_dir):
        if is_dir:
            found.add("folder")
        elif TFRECORD_NAME.fullmatch(name):
            found.add("tfrecord")
        elif name.endswith(".tar") and not name.startswith("."):
            found.add("wds")
    if not found:
        raise DataError(f"{split_dir}: no class folders, TFRecord files or .tar shards in it (expected "
                        f"<dir>/<class>/<image>, <dir>/*.tfrecord or <dir>/train-00000-of-01024, or <dir>/*.tar)")
    if len(found) > 1:
        raise DataError(f"{split_dir}: holds {' and '.join(sorted(found))} data; keep one layout in a folder")
    return found.pop()


def shard_files(split_dir, layout):
    """The TFRecord files or tar shards of a split, sorted by name."""
    match = TFRECORD_NAME.fullmatch if layout == "tfrecord" else lambda n: n.endswith(".tar") and n[0] != "."
    return sorted(os.path.join(split_dir, n) for n, is_dir in entries(split_dir) if not is_dir and match(n))


def check_manifest(split_dir, shards):
    """A ``DataError`` naming a shard that the set's manifest.json (make_shards.py writes it beside the splits)
    lists for this split and that is not there: a copy that lost a shard would train on fewer samples."""
    split_dir = split_dir.rstrip("/") if remote(split_dir) else os.path.abspath(split_dir)
    manifest = os.path.join(os.path.dirname(split_dir), "manifest.json")
    try:
        listed = json.loads(read_bytes(manifest))["splits"][os.path.basename(split_dir)]["shards"]
    except (OSError, ValueError, KeyError, TypeError):
        return
    missing = sorted(set(listed) - {os.path.basename(shard) for shard in shards})
    if missing:
        raise DataError(f"{os.path.join(split_dir, missing[0])}: missing, but {manifest} lists it ({len(missing)} of "
                        f"{len(listed)} shards missing); copy the set again or rerun make_shards.py")


def read_classes_txt(split_dir):
    """The class names in ``split_dir/classes.txt`` (one a line, in index order), or None without one."""
    try:
        text = read_bytes(os.path.join(split_dir, "classes.txt")).decode("utf-8")
    except (FileNotFoundError, IsADirectoryError):
        return None
    return [line.rstrip("\r\n") for line in io.StringIO(text, newline=None) if line.strip()]


# Our own indexer rather than DALI's tfrecord2idx / wds2idx: it also reads every label once (the label range
# check), finds truncated shards, and records what it indexed, so that an index is never trusted for a shard
# that changed since.


def shard_index(shard, layout):
    """(path of DALI's index of ``shard``, {"samples": n, "labels": [lowest, highest] stored label}).

    The index is built on first use, beside the shard or, when its folder is read-only, under ``INDEX_CACHE``. A
    summary beside the index records the shard's size, modification time and a digest of its first and last
    bytes (a copy made with ``cp -p`` or ``rsync -a`` keeps the other two); an index whose shard no longer matches
    them (rewritten, truncated) is built again, never trusted. An s3:// shard's index must be beside it already
    (see ``remote_shard_index``).
    """
    if remote(shard):
        return remote_shard_index(shard, layout)
    stat = os.stat(shard)
    source, digest = {"bytes": stat.st_size, "mtime_ns": stat.st_mtime_ns}, shard_digest(shard)
    beside = shard + ".idx"
    cached = os.path.join(INDEX_CACHE, hashlib.sha1(os.path.abspath(shard).encode()).hexdigest()[:16],
                          os.path.basename(shard) + ".idx")
    for index in (beside, cached):
        try:
            with open(index + ".json") as f:
                summary = json.load(f)
            if (summary["shard"], summary["digest"], summary["index_bytes"]) == (source, digest,
                                                                                 os.path.getsize(index)):
                return index, summary
        except (OSError, ValueError, KeyError, TypeError):
            pass
    index = beside if os.access(os.path.dirname(os.path.abspath(shard)), os.W_OK) else cached
    text, labels, samples = _scan_shard(shard, layout)
    summary = {"shard": source, "digest": digest, "index_bytes": len(text.encode()), "samples": samples,
               "labels": labels}
    os.makedirs(os.path.dirname(index), exist_ok=True)
    with atomic_open(index, "w") as f:
        f.write(text)
    with atomic_open(index + ".json", "w") as f:  # last: the index counts only once this exists
        json.dump(summary, f)
    return index, summary


def shard_digest(shard, ends=1 << 16):
    """SHA-1 of a shard's first and last ``ends`` bytes: a rewrite with other samples changes them."""
    if remote(shard):  # two ranged reads
        head, size = read_head(shard, ends)
        return hashlib.sha1(head + (s3_get(shard, f"bytes={max(len(head), size - ends)}-") if size > len(head)
                                    else b"")).hexdigest()
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
                raise DataError(f"{shard}: record {i} lacks the image/encoded or image/class/label feature")
            labels.append(_feature_values(f, features["image/class/label"])[0])
            lines.append(f"{start} {length}\n")
    else:
        for key, parts, tar in _tar_samples(shard):
            images = [ext for ext in parts if ext in WDS_IMAGE_EXTENSIONS]
            if len(images) != 1 or "cls" not in parts:
                raise DataError(f"{shard}: sample {key} has {', '.join(sorted(parts))}; expected one image "
                                f"({', '.join(WDS_IMAGE_EXTENSIONS)}) and a .cls label")
            text = tar.extractfile(parts["cls"]).read()
            if not (text.isdigit() and len(text) <= LABEL_DIGITS):
                raise DataError(f"{shard}: sample {key}: .cls holds {text[:20]!r}; expected the class index in "
                                f"decimal digits")
            labels.append(int(text))
            lines.append(" ".join(f"{ext} {m.offset_data} {m.size} {m.name}" for ext, m in parts.items()) + "\n")
        lines.insert(0, f"v1.2 {len(lines)}\n")
    if not labels:
        raise DataError(f"{shard}: holds no samples")
    return "".join(lines), [min(labels), max(labels)], len(labels)


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
    """(index, offset, length, {feature name: (offset, length)}, open file) of each record of a TFRecord file.
    Values are located, not read: indexing an ImageNet shard reads its names and labels, not its JPEGs."""
    size = os.path.getsize(shard)
    with open(shard, "rb") as f:
        i = 0
        while f.tell() < size:
            start = f.tell()
            header = f.read(12)  # uint64 length, uint32 masked CRC of the length, the Example, its CRC
            end = start + 12 + (struct.unpack("<Q", header[:8])[0] if len(header) == 12 else size) + 4
            if end > size:
                raise DataError(f"{shard}: truncated or not a TFRecord file (record {i} at byte {start} runs past "
                                f"the end of the file); write it again")
            features = {}
            try:
                if f.tell() < end - 4:  # Example.features: a tag and a length, then the map's entries
                    _varint(f)
                    _varint(f)
                while f.tell() < end - 4:  # Features.feature, a map: entries of key = 1, value = 2
                    _varint(f)
                    entry_end = _varint(f) + f.tell()
                    key = value = None
                    while f.tell() < entry_end:
                        field, length = _varint(f) >> 3, _varint(f)
                        if field == 1:
                            key = f.read(length).decode()
                        else:
                            value = (f.tell(), length)
                            f.seek(length, os.SEEK_CUR)
                    features[key] = value
            except (EOFError, UnicodeDecodeError):
                raise DataError(f"{shard}: record {i} is not a tf.train.Example") from None
            yield i, start, end - start, features, f
            f.seek(end)
            i += 1


def _feature_values(f, where):
    """The values of the serialized tf.train.Feature at ``where``: bytes (bytes_list) or ints (int64_list)."""
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
    return [v - (1 << 64) if isinstance(v, int) and v >= 1 << 63 else v for v in values]  # two's complement


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
                if member.offset_data + member.size > size:
                    raise DataError(f"{shard}: truncated ({member.name} runs past the end of the file); write it again")
                # WebDataset's key: the path up to the first dot of the file name; the rest is the extension
                stem, _, ext = name.partition(".")
                if member.name[:-len(name)] + stem != key:
                    if parts:
                        yield key, parts, tar
                    key, parts = member.name[:-len(name)] + stem, {}
                parts[ext] = member
            if parts:
                yield key, parts, tar
            # a tar cut between two members reads as a shorter archive; only its missing end marker tells
            tar.fileobj.seek(tar.offset)
            if tar.fileobj.read(1024) != bytes(1024):
                raise DataError(f"{shard}: truncated (no end-of-archive marker after its last member); write it again")
    except tarfile.TarError as e:
        raise DataError(f"{shard}: not an uncompressed tar file ({e})") from None


class _DecodeCheck(Pipeline):
    """``op`` (DALI's header parser or its decoder, on the CPU) over batches of encoded images from ``batches``."""

    def __init__(self, batches, op, batch_size):
        super().__init__(batch_size, min(4, os.cpu_count() or 1), None, exec_async=False, exec_pipelined=False)
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
            yield f"{path}: sample {i}", _feature_values(f, features["image/encoded"])[0] if "image/encoded" in features else b""
    else:
        for key, parts, tar in _tar_samples(path):
            yield f"{path}: sample {key}", next((tar.extractfile(m).read() for ext, m in parts.items()
                                                 if ext in WDS_IMAGE_EXTENSIONS), b"")


def _first_failing(samples, op, batch_size=256):
    """The description of the first of ``samples`` on which ``op`` fails, or None. DALI stops a pipeline at the first
    failure, so a failed batch is tried again one image at a time."""
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
    return next((name for name, data in fed[-1] if fails(iter([[np.frombuffer(data, np.uint8)]]), 1)), None)


def find_undecodable(pipe):
    """The first sample of ``pipe``'s data that DALI's own CPU decoder cannot decode, or None: "<file>" for an image
    file, "<shard>: sample <record index or key>" in a shard; meant for after the pipeline failed, to name the
    culprit. DALI parses every image's header first (quick), and decodes them in full only if all parse."""
    for op in (ops.PeekImageShape(), ops.decoders.Image(output_type=types.RGB)):
        culprit = _first_failing(itertools.chain.from_iterable(_samples(pipe.layout, p) for p in pipe.files), op)
        if culprit is not None:
            return culprit
    return None


def decoded_size(pipe, sample=256):
    """MB that the images of ``pipe``'s shard take decoded (8-bit RGB), estimated from the headers of a sample of
    them: what a decoder cache must hold for every epoch after the first to find them all there."""
    files = random.Random(0).sample(pipe.files, min(len(pipe.files), sample if pipe.layout == "folder" else 8))
    samples = itertools.islice(itertools.chain.from_iterable(_samples(pipe.layout, f) for f in files), sample)
    pixels = [math.prod(Image.open(io.BytesIO(data)).size) for _, data in samples]
    return 3 * sum(pixels) / max(1, len(pixels)) * math.ceil(pipe.num_samples / pipe.num_shards) / 2 ** 20


def plan_decoder_cache(mode, pipes):
    """(MB of decoder cache for ``pipes``, or None; a line saying which and why). ``mode`` "on", "off", or "auto": on
    when the pipelines' shares of decoded images fit in half the GPU's free memory, the rest left to the model.
    DALI keeps one cache per GPU for every decoder of the process, so all of ``pipes`` get the same size."""
    if mode == "off" or pipes[0].device_id is None:
        return None, None
    if remote(pipes[0].read.data_dir):  # the estimate reads a sample of the images from Python
        return None, f"decoder cache off ({mode}): not for data in object storage, whose images it cannot sample"
    need = 1.1 * sum(decoded_size(p) for p in pipes)  # 1.1: room for the estimate's error
    free = torch.cuda.mem_get_info(pipes[0].device_id)[0] / 2 ** 20
    on = mode == "on" or need < free / 2
    return math.ceil(need) if on else None, (
        f"decoder cache {'on' if on else 'off'} ({mode}): this process's images take about {need / 1024:.1f} GB "
        f"decoded, and {free / 1024:.1f} GB of GPU memory are free")


@contextlib.contextmanager
def decode_errors_named(pipe):
    """A DALI error caused by an image of ``pipe``'s that cannot be decoded becomes a ``DataError`` naming it."""
    try:
        yield
    except RuntimeError as e:
        dali = (str(e).split("encountered:")[-1].strip(" :\n") or "?").splitlines()[0]  # its words, after its traceback
        if remote(pipe.read.data_dir):  # searching for the culprit would read the whole set back through Python
            changed = find_changed(pipe)
            raise DataError(f"{changed}: changed or gone since this run listed it (DALI: {dali})" if changed else
                            f"{pipe.read.data_dir}: DALI failed reading this data (DALI: {dali})") from None
        culprit = find_undecodable(pipe)
        if culprit is None:
            raise
        raise DataError(f"{culprit}: cannot decode this image (DALI: {dali}); remove or replace it") from None


# segmentation data: .npy headers and split CSVs ---------------------------------------------------

# What a segmentation set may hold: images (H, W), (H, W, 1) or (H, W, 3) of these types; masks (H, W) or
# (H, W, 1) of integer class indices (or bool).
IMAGE_DTYPES = ("uint8", "uint16", "float32")
# Bytes read from the start of each .npy: numpy pads its headers to 128 bytes unless the shape is long.
NPY_PREFIX = 256
NPY_MAGIC = b"\x93NUMPY"
# The columns of the split CSVs that data_processing.make_csv_file_npy writes.
CSV_HEADER = ["index", "images", "masks"]


@functools.lru_cache(maxsize=4096)
def _parse_npy_header(header):
    """(shape, dtype) of a raw .npy header. A set's files mostly share one header, and parsing it (a Python
    literal) costs more than reading it, so each distinct header is parsed once (timings in results/README.md)."""
    f = io.BytesIO(header)
    version = np.lib.format.read_magic(f)
    read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    shape, _, dtype = read(f)
    return shape, dtype


def _npy_shape(path):
    """Shape and dtype from a .npy header, read without the array data; ``DataError`` when the file is missing,
    not a .npy array, or shorter than its header says (a truncated copy)."""
    try:
        head, size = read_head(path, NPY_PREFIX)
        if not head.startswith(NPY_MAGIC):
            raise DataError(f"{path}: not a .npy array (it does not start with numpy's magic string)")
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
    needed = end + math.prod(shape) * dtype.itemsize
    if size < needed:
        raise DataError(f"{path}: truncated: {size} bytes, but its header ({shape} {dtype}) needs {needed}")
    return shape, dtype


def read_split(prepared_root, split):
    """(images, masks): absolute ``.npy`` paths of ``prepared_root/csv_file/<split>.csv``."""
    path = os.path.join(prepared_root, "csv_file", f"{split}.csv")
    try:
        reader = csv.reader(io.StringIO(read_bytes(path).decode("utf-8"), newline=""))
    except (FileNotFoundError, IsADirectoryError):
        raise DataError(f"{path}: no such file (expected a split written by make_csv_file_npy)") from None
    imgs, lbls = [], []
    header = next(reader, None)
    if header != CSV_HEADER:
        raise DataError(f"{path}: header is {header}, expected {','.join(CSV_HEADER)}")
    for row in reader:
        if len(row) != 3:
            raise DataError(f"{path} line {reader.line_num}: expected 3 columns ({','.join(CSV_HEADER)}), got {row}")
        image, mask = (os.path.join(prepared_root, rel) if remote(prepared_root) else
                       os.path.abspath(os.path.join(prepared_root, rel)) for rel in row[1:])
        for file in (image, mask):
            if not isfile(file):
                raise DataError(f"{path} row index {row[0]}: {file}: no such file")
        imgs.append(image)
        lbls.append(mask)
    if not imgs:
        raise DataError(f"{path}: no rows after its header (expected {','.join(CSV_HEADER)} rows, one per pair)")
    return imgs, lbls


def first_nonfinite(paths, threads=8):
    """The first of the float ``paths`` holding a NaN or an infinity, or None: each is read once, on ``threads``."""
    with ThreadPoolExecutor(max(1, threads or 1)) as pool:
        finite = pool.map(lambda path: bool(np.isfinite(load_npy(path)).all()), paths)
        return next((path for path, ok in zip(paths, finite) if not ok), None)


def first_mask_above(lbls, limit, threads=8):
    """(path, largest value) of the first mask in ``lbls`` that holds a value above ``limit``, or None: every mask is
    read, on ``threads`` threads."""
    with ThreadPoolExecutor(threads) as pool:
        largest = pool.map(lambda path: int(load_npy(path).max()), lbls)
        return next(((path, value) for path, value in zip(lbls, largest) if value > limit), None)


def check_segmentation_files(imgs, lbls):
    """Checks an image/mask ``.npy`` set before DALI reads it, from the files' headers alone.

    ``imgs[i]`` pairs with ``lbls[i]`` whatever their names; a pair must agree in height x width. Images are
    (H, W), (H, W, 1) or (H, W, 3) of uint8, uint16 or float32, masks (H, W) or (H, W, 1) of an integer type or
    bool; all images of a set share one shape pattern and dtype, and so do all masks (DALI reads a batch of one
    kind). Anything else raises ``DataError`` naming the file. Returns ``((image_shape, image_dtype),
    (mask_shape, mask_dtype))`` of the first pair, which stands for the set.
    """
    imgs, lbls = [] if imgs is None else list(imgs), [] if lbls is None else list(lbls)
    if len(imgs) == 0:
        raise DataError("got an empty list of images")
    if len(imgs) != len(lbls):
        raise DataError(f"got {len(imgs)} images but {len(lbls)} masks (first image: {imgs[0]})")
    headers = list(overlapped(_npy_shape, imgs + lbls, remote(imgs[0])))
    first_image, first_mask = headers[0], headers[len(imgs)]
    for img, lbl, image, mask in zip(imgs, lbls, headers, headers[len(imgs):]):
        (image_shape, image_dtype), (mask_shape, mask_dtype) = image, mask
        if (len(image_shape) not in (2, 3) or image_shape[2:] not in ((), (1,), (3,)) or 0 in image_shape
                or image_dtype.name not in IMAGE_DTYPES or not image_dtype.isnative):
            raise DataError(f"{img}: expected an image of shape (H, W), (H, W, 1) or (H, W, 3) of "
                            f"{', '.join(IMAGE_DTYPES)}, got {image_shape} {image_dtype}")
        if (len(mask_shape) not in (2, 3) or mask_shape[2:] not in ((), (1,)) or 0 in mask_shape
                or mask_dtype.kind not in "uib" or not mask_dtype.isnative):
            raise DataError(f"{lbl}: expected a mask of shape (H, W) or (H, W, 1) of integer class indices, "
                            f"got {mask_shape} {mask_dtype}")
        if image_shape[:2] != mask_shape[:2]:
            raise DataError(f"{lbl}: mask is {mask_shape[0]}x{mask_shape[1]} but its image {img} is "
                            f"{image_shape[0]}x{image_shape[1]} (height x width must match)")
        for path, (shape, dtype), (first_shape, first_dtype), first_path, what in (
                (img, image, first_image, imgs[0], "image"), (lbl, mask, first_mask, lbls[0], "mask")):
            if shape[2:] != first_shape[2:] or dtype != first_dtype:
                raise DataError(f"{path}: {what} of shape {shape} {dtype}, but the set's first {what} {first_path} "
                                f"is {first_shape} {first_dtype} (all {what}s of a set share their number of "
                                f"dimensions, channels and dtype)")
    return first_image, first_mask


# segmentation overlays -----------------------------------------------------------------------------------

def save_overlay(path, images, masks, preds, num_classes, line=16):
    """A PNG of a segmentation batch: a row per image (any normalization, 1 or 3 channels), in three columns: the
    image, its ground truth ``masks`` drawn on it, its predictions ``preds`` drawn on it ((B, H, W) class indices);
    each foreground class in a colour of its own, the same in both, a title over each column, a legend below."""
    # Each image stretched to 0..255 on its own: right for any normalization and channel count.
    low, high = images.amin(dim=(1, 2, 3), keepdim=True), images.amax(dim=(1, 2, 3), keepdim=True)
    images = (255 * (images - low) / (high - low).clamp(min=1e-6)).to(torch.uint8).expand(-1, 3, -1, -1).cpu()
    classes = list(range(1, max(2, num_classes)))  # foreground classes; background stays bare
    colors = [tuple(round(255 * c) for c in colorsys.hsv_to_rgb((1 / 3 + k / len(classes)) % 1, 1, 1))
              for k in range(len(classes))]  # green first, then hues evenly apart
    shown = torch.tensor(classes)[:, None, None]
    tiles = [tile for image, mask, pred in zip(images, masks.cpu(), preds.cpu()) for tile in
             (image, *(draw_segmentation_masks(image, labels[None] == shown, alpha=0.45, colors=colors)
                       for labels in (mask, pred)))]
    grid = Image.fromarray(make_grid(tiles, nrow=3, padding=4).permute(1, 2, 0).numpy())
    draw, step = ImageDraw.Draw(grid), images.shape[-1] + 4
    names, places, x, y = [f"class {k}" for k in classes], [], 4, 0
    for name in names:  # the legend's entries, in as many lines as the width needs
        width = 14 + round(draw.textlength(name)) + 12
        x, y = (4, y + 1) if x + width > grid.width and x > 4 else (x, y)
        places.append((x, y))
        x += width
    canvas = Image.new("RGB", (grid.width, grid.height + line * (y + 2)))
    canvas.paste(grid, (0, line))
    draw = ImageDraw.Draw(canvas)
    titles = ("image", "ground truth", "prediction")
    for column, title in enumerate(titles if draw.textlength(titles[1]) < step - 4 else ("image", "truth", "pred")):
        draw.text((4 + column * step, 3), title, fill="white")
    for name, color, (x, y) in zip(names, colors, places):
        top = line + grid.height + y * line + 3
        draw.rectangle([x, top, x + 9, top + 9], fill=color)
        draw.text((x + 14, top - 1), name, fill="white")
    with atomic_open(path) as f:
        canvas.save(f, format="png")


# the built-in classification demo set (train_classify.py --data demo) -----------------------------------

DEMO_CLASSES = ["circle", "square", "triangle", "ring", "cross", "stripes"]


def demo_image(k, rng):
    """Class ``k``'s shape in its own hue band, at a random place, size and angle, on a noisy colour gradient."""
    h, w = (int(v) for v in rng.integers(80, 113, size=2))
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float64)
    background = rng.integers(0, 256, 3) + rng.normal(0, 12, (h, w, 3)) + (
        xx[..., None] * rng.uniform(-80, 80, 3) + yy[..., None] * rng.uniform(-80, 80, 3)) / max(h, w)
    hue = int(255 * ((k / len(DEMO_CLASSES) + rng.uniform(-0.04, 0.04)) % 1))
    hsv = Image.new("HSV", (1, 1), (hue, int(rng.integers(170, 256)), int(rng.integers(170, 256))))
    r, angle = rng.uniform(0.25, 0.4) * min(h, w), rng.uniform(0, 2 * np.pi)
    x, y = xx - rng.uniform(r, w - r), yy - rng.uniform(r, h - r)
    u, v = x * np.cos(angle) + y * np.sin(angle), y * np.cos(angle) - x * np.sin(angle)  # turned with the shape
    d, edge = np.hypot(u, v), np.maximum(abs(u), abs(v))
    inside = {"circle": d < r, "ring": abs(d - 0.83 * r) < r / 6, "square": edge < 0.71 * r,
              "triangle": (v < r / 2) & (np.sqrt(3) * abs(u) - v < r),
              "cross": (np.minimum(abs(u), abs(v)) < r / 4) & (edge < r),
              "stripes": np.sin(u * 2 * np.pi / rng.uniform(8, 14)) > 0}[DEMO_CLASSES[k]]
    image = np.where(inside[..., None], np.array(hsv.convert("RGB").getpixel((0, 0))), background)
    return Image.fromarray(np.clip(image, 0, 255).astype(np.uint8))


def make_demo_images(root, train_per_class=120, val_per_class=30, seed=0):
    """The demo set: JPEGs in ImageFolder layout (``root/{train,val}/<class>/<n>.jpg``), the same bytes every time.
    Built in a temporary folder and renamed into place, so that an interrupted build is never used; of two builds
    at once, the first rename wins and the other uses that set."""
    if not os.path.isdir(root):
        tmp = f"{root}.tmp-{os.getpid()}"
        for s, (split, count) in enumerate((("train", train_per_class), ("val", val_per_class))):
            for k, name in enumerate(DEMO_CLASSES):
                os.makedirs(os.path.join(tmp, split, name))
                for i in range(count):
                    demo_image(k, np.random.default_rng([seed, s, k, i])).save(
                        os.path.join(tmp, split, name, f"{i:04d}.jpg"), quality=90)
        try:
            os.rename(tmp, root)
        except OSError:  # another build renamed its copy first: the same bytes, so use it
            shutil.rmtree(tmp)
            if not os.path.isdir(root):
                raise
    return root


# ------------------------------------------------------------------------------------------
# training runs: preemption and how a run ends, shared by both trainers
# ------------------------------------------------------------------------------------------


class StopSignals:
    """SIGTERM (SLURM's and Kubernetes' preemption), SIGINT (Ctrl-C) and SIGUSR1 (SLURM's warning) stop the run at the
    next step; a second Ctrl-C at once. ``requested()``, called by every process at the same points, gives them all
    the largest signal any caught, over a gloo (CPU) group, sent at one step and read at the next: no step waits."""

    def __init__(self, ddp):
        self.signum, self.pending = 0, None
        self.group = dist.new_group(backend="gloo") if ddp.active else None
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
            signal.signal(signum, self.catch)

    def catch(self, signum, frame):
        if signum == self.signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.signum = self.signum or signum

    def requested(self):
        if self.group is None:
            return self.signum
        agreed = self.pending[1].item() if self.pending and self.pending[0].wait() else 0
        flag = torch.tensor([self.signum])
        self.pending = (dist.all_reduce(flag, dist.ReduceOp.MAX, group=self.group, async_op=True), flag)
        return agreed

    @staticmethod
    def exit(signum, path, epoch, step):  # after the stop's checkpoint: one line, the status of the signal's end
        if path:  # the main process's
            print(f"stopped by {signal.Signals(signum).name} at epoch {epoch} step {step}: saved {path}; to continue, "
                  f"run the same command with --resume {path}", file=sys.stderr, flush=True)
        sys.exit(128 + signum)


def run_main(main, args, usage_error):
    """``main(args)``, ended as a training script ends: a ``usage_error`` or ``DataError`` as one ``error:`` line and
    exit status 2, Ctrl-C as one line and 130, anything else as its traceback and 1; the process group destroyed."""
    try:
        main(args)
    except (Exception, KeyboardInterrupt) as e:
        status = 2 if isinstance(e, (usage_error, DataError)) else 130 if isinstance(e, KeyboardInterrupt) else 1
        alone = not (dist.is_initialized() and dist.get_world_size() > 1)
        if status == 1 and alone:
            raise
        print(f"error: {e}" if status == 2 else "interrupted: nothing saved since the last checkpoint" if status == 130
              else traceback.format_exc(), file=sys.stderr, flush=True)
        sys.stdout.flush()
        # Other processes may wait for this one in a collective, where NCCL's graceful destroy_process_group() would
        # wait forever: end at once, and torchrun stops the others with this error.
        sys.exit(status) if alone else os._exit(status)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
