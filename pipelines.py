"""DALI input pipelines for PyTorch image training: classification and segmentation.

One class per task and split, written with DALI's ops API: operators are built in
``__init__``, ``define_graph`` wires them in the order the data flows. Every pipeline runs
on a GPU (``device_id=0``: mixed JPEG decode, GPU resize/augment) and on a machine with no
GPU at all (``device_id=None``: every operator on the CPU, no CUDA call anywhere).

    from pipelines import ClassifyTrainPipeline, classify_iterator
    pipe = ClassifyTrainPipeline(batch_size=256, num_threads=8, device_id=0, data_dir="imagenet/train")
    for batch in classify_iterator(pipe):
        images, labels = batch[0]["data"], batch[0]["label"].squeeze(-1).long()

    from pipelines import fetch_dali_loader
    loader = fetch_dali_loader(image_npys, mask_npys, batch_size=32, mode="train", device_id=0)
    for batch in loader:
        images, masks = batch[0]["image"], batch[0]["mask"]

Bad input (missing folders, unpaired or mis-shaped files) raises ``DataError`` naming the
offending path before DALI builds anything.
"""

import os

import numpy as np
from nvidia.dali import math as dmath
from nvidia.dali import ops, types
from nvidia.dali.pipeline import Pipeline
from nvidia.dali.plugin.base_iterator import LastBatchPolicy
from nvidia.dali.plugin.pytorch import DALIClassificationIterator, DALIGenericIterator

# ImageNet statistics on the 0..255 scale that DALI's decoders produce.
IMAGENET_MEAN = (0.485 * 255, 0.456 * 255, 0.406 * 255)
IMAGENET_STD = (0.229 * 255, 0.224 * 255, 0.225 * 255)

# The extensions torchvision's ImageFolder accepts (case-insensitive), so both loaders see the
# same files.
IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")

# Share of JPEG decoding sent to the GPU's hardware JPEG decoder; the rest is decoded by CPU threads
# and CUDA cores. Measured on the H200 with 16 DALI threads (see README): 1.0 delivered the most and
# leaves the CPU cores to the training loop.
DEFAULT_HW_DECODER_LOAD = 1.0
# Scratch memory the mixed decoder allocates up front so it never reallocates mid-epoch; the
# values of DALI's ResNet-50 example (enough for ImageNet's largest images).
DEVICE_MEMORY_PADDING = 211025920
HOST_MEMORY_PADDING = 140544512
# Batches each .npy reader reads ahead in its own thread (DALI's default is 1): evens out file access.
READER_PREFETCH = 3


class DataError(ValueError):
    """Input data that cannot be read as asked; the message names the offending path."""


def _dtype(name):
    try:
        return {"float32": types.FLOAT, "float16": types.FLOAT16}[name]
    except KeyError:
        raise ValueError(f"dtype must be 'float32' or 'float16', got {name!r}") from None


def _devices(device_id):
    """(decoder device, operator device) for a pipeline on ``device_id`` (None = CPU only)."""
    return ("cpu", "cpu") if device_id is None else ("mixed", "gpu")


# ------------------------------------------------------------------------------------------
# classification
# ------------------------------------------------------------------------------------------


def find_classes(data_dir):
    """Class names sorted exactly as torchvision's ImageFolder sorts them, and their indices."""
    if not os.path.isdir(data_dir):
        raise DataError(f"{data_dir}: no such directory (expected an ImageFolder tree: <dir>/<class>/<image>)")
    classes = sorted(e.name for e in os.scandir(data_dir) if e.is_dir())
    if not classes:
        raise DataError(f"{data_dir}: no class folders in it (expected <dir>/<class>/<image>)")
    return classes, {c: i for i, c in enumerate(classes)}


def list_image_folder(data_dir):
    """(files, labels, classes) of an ImageFolder tree, in torchvision's order."""
    classes, class_to_idx = find_classes(data_dir)
    files, labels = [], []
    for c in classes:
        class_files = []
        for root, _, names in sorted(os.walk(os.path.join(data_dir, c), followlinks=True)):
            class_files += [os.path.join(root, n) for n in sorted(names) if n.lower().endswith(IMG_EXTENSIONS)]
        if not class_files:
            raise DataError(
                f"{os.path.join(data_dir, c)}: no images in this class folder "
                f"(expected files ending in {', '.join(IMG_EXTENSIONS)})"
            )
        files += class_files
        labels += [class_to_idx[c]] * len(class_files)
    return files, labels, classes


class _ClassifyPipeline(Pipeline):
    """What the classification pipelines share: the reader (an ImageFolder tree or a DALI
    file_list), where the decoder and the other operators run, and the final normalization."""

    def __init__(self, batch_size, num_threads, device_id, data_dir, file_list, shard_id, num_shards,
                 shuffle, seed, crop_size, dtype, hw_decoder_load, device_memory_padding, host_memory_padding,
                 prefetch_queue_depth, pipeline_kwargs):
        super().__init__(batch_size, num_threads, device_id, seed=seed,
                         prefetch_queue_depth=prefetch_queue_depth, **pipeline_kwargs)
        self.decoder_device, self.device = _devices(device_id)
        self.decoder_args = {} if device_id is None else dict(
            hw_decoder_load=hw_decoder_load, device_memory_padding=device_memory_padding,
            host_memory_padding=host_memory_padding)
        self.normalize = ops.CropMirrorNormalize(
            device=self.device, dtype=_dtype(dtype), output_layout="CHW", crop=(crop_size, crop_size),
            mean=list(IMAGENET_MEAN), std=list(IMAGENET_STD))
        if file_list is not None:
            if not os.path.isfile(file_list):
                raise DataError(f"{file_list}: no such file (expected lines '<path relative to data_dir> <label>')")
            source = dict(file_root=data_dir, file_list=file_list)
            with open(file_list) as f:
                self.files = [os.path.join(data_dir, line.rsplit(maxsplit=1)[0]) for line in f if line.strip()]
            self.classes = None
        else:
            self.files, labels, self.classes = list_image_folder(data_dir)
            source = dict(files=self.files, labels=labels)
        # pad_last_batch: every shard returns the same number of batches (DDP needs equal step
        # counts); the iterator drops the padding, so one epoch is exactly one pass.
        self.reader = ops.readers.File(**source, shard_id=shard_id, num_shards=num_shards,
                                       random_shuffle=shuffle, pad_last_batch=True, name="Reader")


class ClassifyTrainPipeline(_ClassifyPipeline):
    """ImageNet-style training input: random-resized-crop fused with decode, flip, normalize.

    Outputs ``(images, labels)``: images (B, 3, crop_size, crop_size) float32/float16,
    normalized with ImageNet mean/std, layout CHW; labels (B, 1) int32. Further keyword
    arguments go to DALI's ``Pipeline`` (``exec_dynamic``, ``set_affinity``, ...).
    """

    def __init__(self, batch_size, num_threads, device_id, data_dir=None, crop_size=224, shard_id=0,
                 num_shards=1, seed=None, file_list=None, dtype="float32",
                 random_area=(0.08, 1.0), random_aspect_ratio=(3 / 4, 4 / 3),
                 hw_decoder_load=DEFAULT_HW_DECODER_LOAD, device_memory_padding=DEVICE_MEMORY_PADDING,
                 host_memory_padding=HOST_MEMORY_PADDING, prefetch_queue_depth=2, **pipeline_kwargs):
        super().__init__(batch_size, num_threads, device_id, data_dir, file_list, shard_id, num_shards, True, seed,
                         crop_size, dtype, hw_decoder_load, device_memory_padding, host_memory_padding,
                         prefetch_queue_depth, pipeline_kwargs)
        # Decoding only the random crop's region saves work on large images.
        self.decode = ops.decoders.ImageRandomCrop(
            device=self.decoder_device, output_type=types.RGB, random_area=list(random_area),
            random_aspect_ratio=list(random_aspect_ratio), num_attempts=100, **self.decoder_args)
        self.resize = ops.Resize(device=self.device, resize_x=crop_size, resize_y=crop_size,
                                 interp_type=types.INTERP_TRIANGULAR, antialias=True)
        self.coin = ops.random.CoinFlip(probability=0.5)

    def define_graph(self):
        jpegs, labels = self.reader()
        images = self.decode(jpegs)
        images = self.resize(images)
        images = self.normalize(images, mirror=self.coin())
        return images, labels


class ClassifyValPipeline(_ClassifyPipeline):
    """Validation input: decode, resize the shorter side to ``resize_size``, center crop, normalize.

    Same outputs as ``ClassifyTrainPipeline``; files are read in order, not shuffled.
    """

    def __init__(self, batch_size, num_threads, device_id, data_dir=None, crop_size=224, resize_size=256,
                 shard_id=0, num_shards=1, seed=None, file_list=None, dtype="float32",
                 hw_decoder_load=DEFAULT_HW_DECODER_LOAD, device_memory_padding=DEVICE_MEMORY_PADDING,
                 host_memory_padding=HOST_MEMORY_PADDING, prefetch_queue_depth=2, **pipeline_kwargs):
        super().__init__(batch_size, num_threads, device_id, data_dir, file_list, shard_id, num_shards, False, seed,
                         crop_size, dtype, hw_decoder_load, device_memory_padding, host_memory_padding,
                         prefetch_queue_depth, pipeline_kwargs)
        self.decode = ops.decoders.Image(device=self.decoder_device, output_type=types.RGB, **self.decoder_args)
        self.resize = ops.Resize(device=self.device, resize_shorter=resize_size,
                                 interp_type=types.INTERP_TRIANGULAR, antialias=True)

    def define_graph(self):
        jpegs, labels = self.reader()
        images = self.decode(jpegs)
        images = self.resize(images)
        images = self.normalize(images)
        return images, labels


def classify_iterator(pipe):
    """One pass over the pipeline's shard per epoch: ``batch[0]["data"]``, ``batch[0]["label"]``.

    The last batch is partial rather than padded or dropped, so every sample is seen once.
    """
    return DALIClassificationIterator(pipe, reader_name="Reader", last_batch_policy=LastBatchPolicy.PARTIAL,
                                      auto_reset=True)


# ------------------------------------------------------------------------------------------
# segmentation
# ------------------------------------------------------------------------------------------


def _npy_shape(path):
    """Shape and dtype from a .npy header; the memory map reads no array data."""
    try:
        array = np.load(path, mmap_mode="r")
    except FileNotFoundError:
        raise DataError(f"{path}: no such file") from None
    except ValueError as e:
        raise DataError(f"{path}: not a .npy array ({e})") from None
    return array.shape, array.dtype


def check_segmentation_files(imgs, lbls):
    """Image and mask lists that pair up: equal length, same file stems, same height x width.

    Images are (H, W, 3) uint8, masks (H, W, 1) integer class indices; anything else raises
    ``DataError`` naming the file.
    """
    if len(imgs) == 0:
        raise DataError("got an empty list of images")
    if len(imgs) != len(lbls):
        raise DataError(f"got {len(imgs)} images but {len(lbls)} masks (first image: {imgs[0]})")
    for img, lbl in zip(imgs, lbls):
        if os.path.splitext(os.path.basename(img))[0] != os.path.splitext(os.path.basename(lbl))[0]:
            raise DataError(f"{img} and {lbl} do not pair: an image and its mask must share a file name")
        img_shape, img_dtype = _npy_shape(img)
        lbl_shape, lbl_dtype = _npy_shape(lbl)
        if len(img_shape) != 3 or img_shape[2] != 3 or img_dtype != np.uint8:
            raise DataError(f"{img}: expected an image of shape (H, W, 3) uint8, got {img_shape} {img_dtype}")
        if len(lbl_shape) != 3 or lbl_shape[2] != 1 or lbl_dtype.kind not in "ui":
            raise DataError(f"{lbl}: expected a mask of shape (H, W, 1) of integer class indices, "
                            f"got {lbl_shape} {lbl_dtype}")
        if img_shape[:2] != lbl_shape[:2]:
            raise DataError(f"{lbl}: mask is {lbl_shape[0]}x{lbl_shape[1]} but its image {img} is "
                            f"{img_shape[0]}x{img_shape[1]} (height x width must match)")


class SegmentValPipeline(Pipeline):
    """Image + mask ``.npy`` files read in lock-step, resized to ``size``, image normalized.

    Outputs ``(image, mask)``: image (B, 3, H, W) float32 normalized with ImageNet mean/std,
    mask (B, 1, H, W) with the input's integer dtype; both CHW. Resizing is linear for the
    image and nearest-neighbour for the mask, so the mask keeps exactly its class values.
    """

    shuffle = False

    def __init__(self, batch_size, num_threads, device_id, imgs, lbls, size=(384, 384), shard_id=0,
                 num_shards=1, seed=42, mean=IMAGENET_MEAN, std=IMAGENET_STD, prefetch_queue_depth=2):
        super().__init__(batch_size, num_threads, device_id, seed=seed, prefetch_queue_depth=prefetch_queue_depth)
        check_segmentation_files(imgs, lbls)
        self.on_gpu = device_id is not None
        device = "gpu" if self.on_gpu else "cpu"
        # Both readers get the same seed, shuffle and sharding, so they stay in lock-step.
        # Memory-mapped reads with cached headers: plain reads (dont_use_mmap) were 7x slower on 512x512
        # uint8 files (780 vs 5,200 samples/s, 2-core CPU), and the reader was the segmentation ceiling.
        reader_args = dict(shard_id=shard_id, num_shards=num_shards, random_shuffle=self.shuffle, seed=seed,
                           pad_last_batch=True, cache_header_information=True,
                           prefetch_queue_depth=READER_PREFETCH)
        self.read_image = ops.readers.Numpy(files=list(imgs), **reader_args)
        self.read_mask = ops.readers.Numpy(files=list(lbls), **reader_args)
        self.hwc = ops.Reshape(device=device, layout="HWC")
        self.resize_image = ops.Resize(device=device, size=list(size), interp_type=types.INTERP_LINEAR,
                                       antialias=False)
        self.resize_mask = ops.Resize(device=device, size=list(size), interp_type=types.INTERP_NN,
                                      antialias=False)
        self.normalize = ops.CropMirrorNormalize(device=device, dtype=types.FLOAT, output_layout="HWC",
                                                 mean=list(mean), std=list(std))
        self.chw = ops.Transpose(device=device, perm=[2, 0, 1], output_layout="CHW")

    def load(self):
        image = self.read_image(name="ReaderX")
        mask = self.read_mask(name="ReaderY")
        if self.on_gpu:
            image, mask = image.gpu(), mask.gpu()
        image, mask = self.hwc(image), self.hwc(mask)
        return self.resize_image(image), self.resize_mask(mask)

    def define_graph(self):
        image, mask = self.load()
        image = self.normalize(image)
        return self.chw(image), self.chw(mask)


def _maybe(coin, augmented, original):
    """``augmented`` where the per-sample coin came up 1, else ``original``."""
    return coin * augmented + (1 - coin) * original


class SegmentTrainPipeline(SegmentValPipeline):
    """``SegmentValPipeline`` plus augmentations, applied on the device of the pipeline.

    Flips (horizontal, vertical; p=0.5 each) are drawn once per sample and applied to image and
    mask alike. On the image only, each with its own probability: Gaussian noise, Gaussian blur,
    brightness scaling, and contrast scaling clamped to the image's own min/max.
    """

    shuffle = True

    def __init__(self, batch_size, num_threads, device_id, imgs, lbls, flip_p=0.5,
                 noise_p=0.15, noise_std=(0.0, 0.33), blur_p=0.15, blur_sigma=(0.5, 1.5),
                 brightness_p=0.15, brightness=(0.7, 1.3), contrast_p=0.13, contrast=(0.9, 1.1), **kwargs):
        super().__init__(batch_size, num_threads, device_id, imgs, lbls, **kwargs)
        device = "gpu" if self.on_gpu else "cpu"
        self.flip = ops.Flip(device=device)
        self.flip_coin = ops.random.CoinFlip(probability=flip_p)
        self.noise_coin = ops.random.CoinFlip(probability=noise_p)
        self.noise_std = ops.random.Uniform(range=list(noise_std))
        self.noise = ops.noise.Gaussian(device=device)
        self.blur_coin = ops.random.CoinFlip(probability=blur_p)
        self.blur_sigma = ops.random.Uniform(range=list(blur_sigma))
        self.blur = ops.GaussianBlur(device=device)
        self.brightness_coin = ops.random.CoinFlip(probability=brightness_p)
        self.brightness = ops.random.Uniform(range=list(brightness))
        self.contrast_coin = ops.random.CoinFlip(probability=contrast_p)
        self.contrast = ops.random.Uniform(range=list(contrast))
        self.min = ops.reductions.Min(device=device)
        self.max = ops.reductions.Max(device=device)

    def define_graph(self):
        image, mask = self.load()
        horizontal, vertical = self.flip_coin(), self.flip_coin()
        image = self.flip(image, horizontal=horizontal, vertical=vertical)
        mask = self.flip(mask, horizontal=horizontal, vertical=vertical)
        image = self.normalize(image)
        image = _maybe(self.noise_coin(), self.noise(image, stddev=self.noise_std()), image)
        image = _maybe(self.blur_coin(), self.blur(image, sigma=self.blur_sigma()), image)
        image = image * _maybe(self.brightness_coin(), self.brightness(), 1.0)
        scaled = image * _maybe(self.contrast_coin(), self.contrast(), 1.0)
        image = dmath.clamp(scaled, self.min(image), self.max(image))
        return self.chw(image), self.chw(mask)


def segment_iterator(pipe):
    """One pass per epoch over the pipeline's shard: ``batch[0]["image"]``, ``batch[0]["mask"]``."""
    return DALIGenericIterator(pipe, ["image", "mask"], reader_name="ReaderX",
                               last_batch_policy=LastBatchPolicy.PARTIAL, auto_reset=True)


SEGMENT_PIPELINES = {"train": SegmentTrainPipeline, "eval": SegmentValPipeline}


def fetch_dali_loader(imgs, lbls, batch_size, mode, device_id=None, num_threads=4, **kwargs):
    """A DALI iterator over paired image/mask ``.npy`` files for ``mode`` "train" or "eval".

    ``device_id=None`` runs on the CPU only; ``kwargs`` go to the pipeline (``size``, ``seed``,
    ``shard_id``, ``num_shards``, augmentation probabilities and ranges).
    """
    if mode not in SEGMENT_PIPELINES:
        raise ValueError(f"mode must be one of {sorted(SEGMENT_PIPELINES)}, got {mode!r}")
    # the pipeline checks the lists (empty, unequal, unpaired, mis-shaped) before DALI builds anything
    pipe = SEGMENT_PIPELINES[mode](batch_size, num_threads, device_id, [] if imgs is None else imgs,
                                   [] if lbls is None else lbls, **kwargs)
    return segment_iterator(pipe)
