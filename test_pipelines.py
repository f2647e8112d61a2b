"""Tests of pipelines.py on tiny data built in tmp_path: what the classification and segmentation pipelines, their
iterators and fetch_dali_loader hand out (shapes, dtypes, normalization, epochs and shards, crops and resizing,
augmentations, checkpoints, operator concurrency, bad arguments). What they read (layouts, shards, labels, bad data)
is test_data_sources.py's; shared fixtures are in conftest.py. CPU-only DALI everywhere; the GPU tests at the end
run where a CUDA device is visible (see README: they were run on an H200)."""

import json
import os
import pathlib
import re
import subprocess
import sys
import warnings
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch
from nvidia.dali import ops, types
from nvidia.dali.pipeline import OperatorConcurrency, Pipeline
from nvidia.dali.plugin.pytorch import DALIGenericIterator
from PIL import Image
from torchvision.datasets import ImageFolder

import pipelines
from conftest import (
    CLASSES,
    FORMATS,
    MEAN,
    NO_AUGMENT,
    PER_CLASS,
    SEG_H,
    SEG_N,
    SEG_W,
    STD,
    first_batches,
    gpu,
    identities,
    one_epoch,
    same_batches,
    save_pairs,
    seg_image,
    seg_mask,
    seg_pipe,
    solid_colour,
    to_shards,
    unnormalize,
)
from pipelines import (
    IMAGENET_STD,
    ClassifyTrainPipeline,
    ClassifyValPipeline,
    SegmentTrainPipeline,
    SegmentValPipeline,
    classify_iterator,
    fetch_dali_loader,
    segment_iterator,
)

pytestmark = pytest.mark.usefixtures("no_dist_env")
# --auto-augment's policies
POLICIES = ["ta_wide", "ra", "imagenet"]


# ------------------------------------------------------------------------------------------
# classification
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "dtype,torch_dtype,atol", [("float32", torch.float32, 1e-5), ("float16", torch.float16, 2e-3)]
)
def test_train_solid_colour_gives_exact_normalized_constant(solid_folder, dtype, torch_dtype, atol):
    pipe = ClassifyTrainPipeline(4, 2, None, str(solid_folder), crop_size=32, seed=1, dtype=dtype)
    batch = next(iter(classify_iterator(pipe)))[0]
    images, labels = batch["data"], batch["label"]
    assert (
        images.shape == (4, 3, 32, 32)
        and images.dtype == torch_dtype
        and images.device.type == "cpu"
    )
    assert labels.shape == (4, 1) and labels.dtype == torch.int32
    for image, (c, i) in zip(images, identities(images)):
        expected = (np.array(solid_colour(c, i), dtype=np.float32) - MEAN) / STD
        np.testing.assert_allclose(
            image.float().numpy(), np.broadcast_to(expected[:, None, None], (3, 32, 32)), atol=atol
        )


@pytest.mark.parametrize("pipeline", [ClassifyTrainPipeline, ClassifyValPipeline])
def test_hwc_output_is_the_chw_output_in_channels_last_memory(texture_folder, pipeline):
    def first_batch(output_layout):
        pipe = pipeline(
            4, 2, None, str(texture_folder), crop_size=24, seed=7, output_layout=output_layout
        )
        return next(iter(classify_iterator(pipe)))[0]["data"]

    chw, hwc = first_batch("CHW"), first_batch("HWC")
    assert chw.shape == (4, 3, 24, 24) and hwc.shape == (4, 24, 24, 3)
    nchw = hwc.permute(0, 3, 1, 2)
    assert nchw.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(nchw, chw)
    with pytest.raises(ValueError, match="output_layout must be 'CHW' or 'HWC'"):
        pipeline(4, 2, None, str(texture_folder), output_layout="NCHW")


EVERYTHING = sorted((c, i) for c in range(len(CLASSES)) for i in range(PER_CLASS))


def test_val_epoch_sees_every_file_once(solid_folder):
    pipe = ClassifyValPipeline(4, 2, None, str(solid_folder), crop_size=24)
    for _ in range(2):  # auto_reset: the second epoch is complete too
        seen, _ = one_epoch(pipe)
        assert sorted(seen) == EVERYTHING


def batch_sizes_and_identities(pipe):
    sizes, seen = [], []
    for batch in classify_iterator(pipe):
        sizes.append(batch[0]["data"].shape[0])
        seen += identities(batch[0]["data"])
    return sizes, seen


def test_train_epoch_is_full_batches_of_real_samples(solid_folder):
    pipe = ClassifyTrainPipeline(4, 2, None, str(solid_folder), crop_size=24, seed=5)
    for _ in range(2):
        sizes, seen = batch_sizes_and_identities(pipe)
        assert sizes == [4] * 6  # 21 samples: the last batch is filled up to 4
        assert sorted(set(seen)) == EVERYTHING  # every sample, nothing made up
        assert (
            sorted(Counter(seen).values()) == [1] * 18 + [2] * 3
        )  # the padding: three distinct real samples


def test_two_val_shards_cover_the_dataset_once(solid_folder):
    shards = [
        one_epoch(
            ClassifyValPipeline(
                4, 2, None, str(solid_folder), crop_size=24, shard_id=s, num_shards=2
            )
        )[0]
        for s in range(2)
    ]
    assert not set(shards[0]) & set(shards[1])
    assert sorted(shards[0] + shards[1]) == EVERYTHING
    assert abs(len(shards[0]) - len(shards[1])) <= 1


def test_two_train_shards_run_equal_full_batches_and_cover_the_dataset(solid_folder):
    shards = [
        batch_sizes_and_identities(
            ClassifyTrainPipeline(
                4, 2, None, str(solid_folder), crop_size=24, shard_id=s, num_shards=2, seed=5
            )
        )
        for s in range(2)
    ]
    # 21 samples and 3 distinct ones repeated: two shards of 3 batches of 4, as DistributedSampler pads
    assert [sizes for sizes, _ in shards] == [[4, 4, 4], [4, 4, 4]]
    counts = Counter(shards[0][1] + shards[1][1])
    assert sorted(counts) == EVERYTHING and sorted(counts.values()) == [1] * 18 + [2] * 3


def test_same_seed_same_batches_other_seed_different(texture_folder):
    def first_batches(seed):
        it = classify_iterator(
            ClassifyTrainPipeline(4, 2, None, str(texture_folder), crop_size=32, seed=seed)
        )
        return [next(it)[0]["data"].clone() for _ in range(2)]

    a, b, c = first_batches(11), first_batches(11), first_batches(12)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not all(torch.equal(x, y) for x, y in zip(a, c))


def test_val_center_crop_lands_in_the_center(tmp_path):
    # 256 x 320 image whose pixels encode their position: R = row, G = column // 2.
    rows, cols = np.meshgrid(np.arange(256), np.arange(320), indexing="ij")
    pixels = np.stack([rows, cols // 2, np.full_like(rows, 77)], axis=-1).astype(np.uint8)
    (tmp_path / "pos" / "only").mkdir(parents=True)
    Image.fromarray(pixels).save(tmp_path / "pos" / "only" / "a.png")
    pipe = ClassifyValPipeline(1, 1, None, str(tmp_path / "pos"), crop_size=224, resize_size=256)
    image = unnormalize(next(iter(classify_iterator(pipe)))[0]["data"])[0]
    assert image.shape == (224, 224, 3)
    # the shorter side is already 256, so no resize: the crop starts at row 16, column 48
    np.testing.assert_allclose(image, pixels[16:240, 48:272].astype(np.float32), atol=0.01)


def test_val_resizes_shorter_side_before_the_crop(solid_folder):
    pipe = ClassifyValPipeline(3, 1, None, str(solid_folder), crop_size=20, resize_size=24)
    images = next(iter(classify_iterator(pipe)))[0]["data"]
    assert images.shape == (3, 3, 20, 20)


def exif_rotated(path, size=(64, 48)):
    """A JPEG, red on its left half and blue on its right, that asks viewers to turn it 90 degrees (EXIF 6)."""
    pixels = np.zeros((size[1], size[0], 3), np.uint8)
    pixels[:, : size[0] // 2, 0] = pixels[:, size[0] // 2 :, 2] = 255
    exif = Image.Exif()
    exif[0x0112] = 6
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels).save(path, quality=95, exif=exif)


def test_exif_orientation_is_not_applied_as_in_torchvision(tmp_path):
    """torchvision's PIL loader ignores EXIF orientation; so do the pipelines, so that a photo reaches the model the
    same way whichever loader reads it."""
    exif_rotated(tmp_path / "exif" / "c" / "a.jpg")
    torchvision_image = np.asarray(ImageFolder(str(tmp_path / "exif"))[0][0])
    assert (
        torchvision_image.shape == (48, 64, 3) and torchvision_image[:, :8, 0].mean() > 200
    )  # not turned
    image = unnormalize(
        next(
            iter(
                classify_iterator(
                    ClassifyValPipeline(
                        1, 1, None, str(tmp_path / "exif"), crop_size=48, resize_size=48
                    )
                )
            )
        )[0]["data"]
    )[0]
    assert (
        image[:, :8, 0].mean() > 200 and image[:, -8:, 2].mean() > 200
    )  # red left, blue right: not turned
    train = next(
        iter(
            classify_iterator(
                ClassifyTrainPipeline(
                    1,
                    1,
                    None,
                    str(tmp_path / "exif"),
                    crop_size=16,
                    random_area=(1.0, 1.0),
                    random_aspect_ratio=(4 / 3, 4 / 3),
                    seed=0,
                )
            )
        )
    )[0]["data"]
    columns = unnormalize(train)[0].mean(axis=0)  # flipped or not, one side red and the other blue
    assert {columns[:4, 0].mean() > 200, columns[-4:, 0].mean() > 200} == {True, False}


def photo_like(h, w, seed=0):
    """Smooth colour gradients with grain: what a resize filter's differences show on."""
    y, x = np.mgrid[0:h, 0:w] / max(h, w)
    base = np.stack(
        [128 + 100 * np.sin(6 * x + 2 * y), 128 + 90 * np.cos(5 * y - 3 * x), 60 + 150 * x * y], -1
    )
    return np.clip(base + np.random.default_rng(seed).normal(0, 12, (h, w, 3)), 0, 255).astype(
        np.uint8
    )


FLIPS = [
    np.array(f, np.float32) for f in ([0, 0], [1, 0], [0, 1], [1, 1])
]  # (vertical, horizontal)


@pytest.mark.parametrize("shape", [(449, 450), (300, 200), (97, 150), (60, 500), (224, 224)])
@pytest.mark.parametrize("antialias", [True, False], ids=["classification", "segmentation"])
def test_cpu_resize_by_torch_is_dalis_resize(shape, antialias):
    """CPU-only pipelines resize 8-bit images with torch (resize_with_torch) where the GPU pipelines use DALI's
    Resize: the classification crop antialiased (DALI's INTERP_TRIANGULAR), segmentation images linearly and
    flipped by a backwards region of interest. Torch's result is DALI's up to rounding, flips included; the
    antialiased one is also PIL's bilinear resize, which torchvision's RandomResizedCrop applies to PIL images.
    Shrinking, enlarging, both at once, and neither."""
    image = photo_like(*shape)
    with ThreadPoolExecutor(2) as pool:
        outs = pipelines.resize_with_torch(pool, 2, (224, 224), antialias, [image] * 4, FLIPS)
    assert all(out.dtype == np.uint8 and out.shape == (3, 224, 224) for out in outs)
    outs = [out.transpose(1, 2, 0) for out in outs]

    class DaliResize(Pipeline):
        def __init__(self):
            super().__init__(4, 1, None)
            self.images = ops.ExternalSource(source=lambda: [image] * 4, layout="HWC", batch=True)
            self.flips = ops.ExternalSource(source=lambda: FLIPS, batch=True)
            self.resize = ops.Resize(
                resize_x=224,
                resize_y=224,
                antialias=antialias,
                roi_relative=True,
                interp_type=types.INTERP_TRIANGULAR if antialias else types.INTERP_LINEAR,
            )

        def define_graph(self):
            flips = self.flips()
            return self.resize(self.images(), roi_start=flips, roi_end=1 - flips)

    pipe = DaliResize()
    pipe.build()
    dali = np.array(pipe.run()[0].as_tensor()).astype(int)
    for out, expected in zip(outs, dali):
        diff = np.abs(out.astype(int) - expected)
        assert diff.mean() < 0.25 and np.percentile(diff, 99) <= 1 and diff.max() <= 4
    if antialias:
        pil = np.asarray(Image.fromarray(image).resize((224, 224), Image.BILINEAR)).astype(int)
        assert np.abs(outs[0].astype(int) - pil).max() <= 1


# ------------------------------------------------------------------------------------------
# classification: random erasing, checkpoints
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("p", [1.0, 0.5, 0.0])
def test_random_erase_blanks_one_box_of_torchvisions_size(solid_folder, p):
    pipe = ClassifyTrainPipeline(
        16, 2, None, str(solid_folder), crop_size=64, seed=4, random_erase=p
    )
    images = next(iter(classify_iterator(pipe)))[0]["data"].numpy()
    areas = []
    for image in images:
        erased = (image == 0).all(
            axis=0
        )  # no solid colour here normalizes to exactly 0 in all channels
        rest = image[:, ~erased]
        assert (
            np.ptp(rest, axis=1).max() < 1e-5
        )  # the rest is the image's unchanged constant colour
        r, g, _ = np.rint(rest[:, 0] * STD + MEAN).astype(int)
        assert (r - 40) % 60 == 0 and (g - 10) % 20 == 0
        if erased.any():
            rows, cols = np.nonzero(erased)
            height, width = np.ptp(rows) + 1, np.ptp(cols) + 1
            assert height * width == erased.sum()  # one axis-aligned box
            areas.append(erased.mean())
    # a box side is rounded to whole pixels: at most 0.5 px * (64 + 64) + 0.25 px^2 of 64^2 off
    assert all(0.02 - 0.016 <= a <= 0.33 + 0.016 for a in areas)
    if p == 1.0:
        assert len(areas) == 16 and 0.1 < np.mean(areas) < 0.25  # area ~ U(0.02, 0.33): mean 0.175
    elif p == 0.5:
        assert 0 < len(areas) < 16
    else:
        assert areas == []


def test_random_erase_in_float16(solid_folder):
    pipe = ClassifyTrainPipeline(
        8, 2, None, str(solid_folder), crop_size=32, seed=4, dtype="float16", random_erase=1.0
    )
    images = next(iter(classify_iterator(pipe)))[0]["data"]
    assert images.dtype == torch.float16 and images.shape == (8, 3, 32, 32)
    assert (images == 0).all(dim=1).flatten(1).any(dim=1).all()  # a box in every image


@pytest.mark.parametrize(
    "fmt,auto_augment",
    [("folder", None), *((fmt, None) for fmt in FORMATS), *(("folder", p) for p in POLICIES)],
)
def test_checkpoint_resumes_mid_epoch_with_the_same_batches(split_root, fmt, auto_augment):
    data = split_root / "train" if fmt == "folder" else to_shards(split_root, fmt) / "train"

    def loader(**kwargs):
        return classify_iterator(
            ClassifyTrainPipeline(
                4,
                1,
                None,
                str(data),
                crop_size=16,
                seed=3,
                random_erase=0.5,
                auto_augment=auto_augment,
                enable_checkpointing=True,
                **kwargs,
            )
        )

    def rest_and_next_epoch(it):
        return [(b[0]["data"], b[0]["label"]) for epoch in range(2) for b in it]

    it = loader()
    next(it), next(it)
    checkpoint = it.checkpoints()[0]
    expected = rest_and_next_epoch(it)
    resumed = rest_and_next_epoch(loader(checkpoint=checkpoint))
    assert len(expected) == 4 + 6  # 21 samples in batches of 4: 6 a epoch, 2 were taken
    assert all(torch.equal(a, c) and torch.equal(b, d) for (a, b), (c, d) in zip(expected, resumed))
    assert len(resumed) == len(expected)


@pytest.mark.parametrize(
    "device_id,cache",
    [
        pytest.param(None, None, id="cpu"),
        pytest.param(0, None, marks=gpu, id="gpu"),
        pytest.param(0, 64, marks=gpu, id="gpu-decoder-cache"),
    ],
)
def test_crop_sizes_change_per_epoch_and_resume_mid_epoch(solid_folder, device_id, cache):
    def loader(**kwargs):
        pipe = ClassifyTrainPipeline(
            4,
            1,
            device_id,
            str(solid_folder),
            crop_size=32,
            crop_sizes=lambda epoch: (16, 24, 32)[min(epoch, 2)],
            seed=3,
            decoder_cache=cache,
            enable_checkpointing=True,
            **kwargs,
        )
        return classify_iterator(pipe)

    def epochs(it, n):
        return [[(b[0]["data"].cpu(), b[0]["label"].cpu()) for b in it] for _ in range(n)]

    it = loader()
    (first,) = epochs(it, 1)
    next(it), next(it)
    checkpoint = it.checkpoints()[0]  # two batches into the second epoch
    expected = epochs(it, 2)
    # 21 samples in batches of 4: 6 a epoch; each epoch's own size, every image still its colour
    sizes = [{tuple(x.shape) for x, _ in e} for e in (first, *expected)]
    assert sizes == [{(4, 3, 16, 16)}, {(4, 3, 24, 24)}, {(4, 3, 32, 32)}]
    assert [len(e) for e in expected] == [4, 6]
    for x, y in first + expected[0]:
        assert [sorted(CLASSES).index(CLASSES[c]) for c, _ in identities(x)] == y.flatten().tolist()
    resumed = epochs(loader(checkpoint=checkpoint), 2)
    assert same_batches(sum(expected, []), sum(resumed, []))


# ------------------------------------------------------------------------------------------
# classification: auto-augment
# ------------------------------------------------------------------------------------------


def three_epochs(folder, device_id=None, seed=7, **kwargs):
    pipe = ClassifyTrainPipeline(4, 2, device_id, str(folder), crop_size=32, seed=seed, **kwargs)
    it = classify_iterator(pipe)
    return torch.cat([b[0]["data"].cpu() for epoch in range(3) for b in it])


def check_auto_augment(folder, policy, device_id=None, **kwargs):
    """Under ``policy`` the images are still uint8 images before normalization, most unlike the
    plain ones; returns how many are the same. On the CPU the crops and flips are the same draws as
    without it, so a sample the policy left alone (identity, or its stages skipped) is the same."""
    plain = three_epochs(folder, device_id, **kwargs)
    augmented = three_epochs(folder, device_id, auto_augment=policy, **kwargs)
    assert augmented.shape == plain.shape == (36, 3, 32, 32) and augmented.dtype == torch.float32
    pixels = unnormalize(augmented)
    assert np.abs(pixels - np.rint(pixels)).max() < 1e-3
    assert pixels.min() > -1e-3 and pixels.max() < 255 + 1e-3
    unchanged = sum(torch.equal(a, p) for a, p in zip(augmented, plain))
    assert unchanged < len(plain) / 2
    return unchanged


@pytest.mark.parametrize("policy", POLICIES)
def test_auto_augment_changes_images_within_uint8_images(texture_folder, policy):
    assert check_auto_augment(texture_folder, policy) > 0


def test_trivial_augment_of_a_solid_colour_is_its_colour_or_another_and_black_fill(solid_folder):
    # one colour operation or one warp (bilinear: black where the image moved out, and along that
    # edge blends of the colour with black): every pixel a shade of the brightest colour
    images = three_epochs(solid_folder, auto_augment="ta_wide")
    changed = 0
    for image, identity in zip(unnormalize(images), identities(three_epochs(solid_folder))):
        colours = np.unique(np.rint(image).reshape(-1, 3), axis=0)
        colour = colours[colours.sum(1).argmax()]
        shade = colours.sum(1, keepdims=True) / max(colour.sum(), 1)
        assert np.abs(colours - shade * colour).max() <= 1.5, (colour, colours)
        changed += tuple(colour) != solid_colour(*identity)
    assert changed > 0


@pytest.mark.parametrize("policy", POLICIES)
def test_auto_augment_repeats_with_its_seed(texture_folder, policy):
    first = three_epochs(texture_folder, auto_augment=policy)
    assert torch.equal(first, three_epochs(texture_folder, auto_augment=policy))
    assert not torch.equal(first, three_epochs(texture_folder, seed=8, auto_augment=policy))


@pytest.mark.parametrize("policy", POLICIES)
def test_auto_augment_builds_without_deprecation_warnings(texture_folder, policy):
    # DALI warns under a filter of its own that "error" would not override: record them instead
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pipe = ClassifyTrainPipeline(
            4, 2, None, str(texture_folder), crop_size=32, auto_augment=policy
        )
        pipe.build()
    deprecations = (DeprecationWarning, PendingDeprecationWarning, FutureWarning)
    assert [str(w.message) for w in caught if issubclass(w.category, deprecations)] == []


def test_unknown_auto_augment_policy_is_refused(texture_folder):
    with pytest.raises(ValueError, match="auto_augment must be 'ta_wide' or 'ra' or 'imagenet'"):
        ClassifyTrainPipeline(4, 1, None, str(texture_folder), auto_augment="autoaugment")


# ------------------------------------------------------------------------------------------
# segmentation
# ------------------------------------------------------------------------------------------


def seg_loader(imgs, lbls, batch_size, mode, **kwargs):
    return segment_iterator(seg_pipe(imgs, lbls, batch_size, mode, **kwargs))


def seg_epoch(loader):
    images, masks = [], []
    for batch in loader:
        images.append(batch[0]["image"])
        masks.append(batch[0]["mask"])
    return torch.cat(images), torch.cat(masks)


def sample_ids(images):
    """Which seg_image each normalized image of a batch is."""
    return np.rint(unnormalize(images)[:, 0, 0, 1] / 10).astype(int).tolist()


def test_segment_val_shapes_and_values(seg_files):
    pipe = seg_pipe(*seg_files, batch_size=4, mode="eval", size=(SEG_H, SEG_W))
    assert pipe.channels == 3
    loader = segment_iterator(pipe)
    images, masks = seg_epoch(loader)
    assert len(loader) == 3  # 4 + 4 + 2: the last batch partial
    assert images.shape == (SEG_N, 3, SEG_H, SEG_W) and images.dtype == torch.float32
    assert masks.shape == (SEG_N, 1, SEG_H, SEG_W) and masks.dtype == torch.uint8
    for k in range(SEG_N):  # no shuffle: file order
        np.testing.assert_array_equal(masks[k].numpy().transpose(1, 2, 0), seg_mask(k))
        raw = unnormalize(images[k : k + 1])[0]
        np.testing.assert_allclose(raw[..., 1], 10 * k, atol=1e-3)
        np.testing.assert_allclose(raw[..., 0], seg_mask(k)[..., 0] * 100.0, atol=1e-3)


def test_segment_train_flips_keep_image_and_mask_aligned(seg_files):
    aug = dict(NO_AUGMENT, flip_p=0.5)
    loader = seg_loader(*seg_files, batch_size=5, mode="train", size=(SEG_H, SEG_W), seed=3, **aug)
    flips = set()
    for _ in range(3):
        images, masks = seg_epoch(loader)
        assert images.shape == (SEG_N, 3, SEG_H, SEG_W)
        raw = unnormalize(images)
        ids = sample_ids(images)
        assert sorted(ids) == list(range(SEG_N))  # 5 divides 10: every sample once, no filling
        for k, image, mask in zip(ids, raw, masks.numpy()):
            np.testing.assert_allclose(image[..., 0], mask[0] * 100.0, atol=1e-3)  # aligned
            expected = seg_mask(k)[..., 0]
            flip = next(
                f
                for f in [(1, 1), (-1, 1), (1, -1), (-1, -1)]
                if np.array_equal(mask[0], expected[:: f[0], :: f[1]])
            )
            flips.add(flip)
    assert len(flips) == 4  # none, vertical, horizontal, both


def test_segment_masks_keep_class_values_under_all_augmentations(seg_files):
    aug = dict(flip_p=0.5, noise_p=1.0, blur_p=1.0, brightness_p=1.0, contrast_p=1.0)
    images, masks = seg_epoch(
        seg_loader(*seg_files, batch_size=5, mode="train", size=(37, 53), **aug)
    )
    assert images.shape == (SEG_N, 3, 37, 53) and masks.shape == (SEG_N, 1, 37, 53)
    assert masks.dtype == torch.uint8
    assert set(masks.unique().tolist()) == {0, 1, 2}
    assert torch.isfinite(images).all()


@pytest.mark.parametrize("augmentation", ["noise_p", "blur_p", "brightness_p", "contrast_p"])
def test_each_photometric_augmentation_changes_image_not_mask(seg_files, augmentation):
    def run(**aug):
        return seg_epoch(
            seg_loader(
                *seg_files, batch_size=SEG_N, mode="train", size=(SEG_H, SEG_W), seed=9, **aug
            )
        )

    base_images, base_masks = run(**NO_AUGMENT)
    images, masks = run(**dict(NO_AUGMENT, **{augmentation: 1.0}))
    assert torch.equal(masks, base_masks)
    assert (images - base_images).abs().amax(dim=(1, 2, 3)).min() > 1e-3  # every sample changed
    assert torch.isfinite(images).all()


def test_augmentations_touch_only_the_samples_that_draw_them(seg_files):
    # p=0.5 over 40 samples: some drawn, some not; an undrawn sample is exactly the unaugmented one
    imgs, lbls = [p * 4 for p in seg_files]
    base, _ = seg_epoch(
        seg_loader(
            imgs, lbls, batch_size=40, mode="train", size=(SEG_H, SEG_W), seed=4, **NO_AUGMENT
        )
    )
    for augmentation in ("noise_p", "blur_p", "brightness_p", "contrast_p"):
        images, _ = seg_epoch(
            seg_loader(
                imgs,
                lbls,
                batch_size=40,
                mode="train",
                size=(SEG_H, SEG_W),
                seed=4,
                **dict(NO_AUGMENT, **{augmentation: 0.5}),
            )
        )
        changed = (images - base).abs().amax(dim=(1, 2, 3)) > 1e-3
        assert 0 < changed.sum() < 40, augmentation
        assert torch.equal(images[~changed], base[~changed])


@pytest.mark.parametrize("device_id", [None, pytest.param(0, marks=gpu)])
def test_noise_is_gaussian_with_the_drawn_stddev_and_set_by_the_seed(seg_files, device_id):
    # noise_std (0.25, 0.2501): every drawn sample gets N(0, ~0.25**2) noise per element, a fresh draw per sample
    def run(num_threads=4, **aug):
        loader = seg_loader(
            *seg_files,
            batch_size=SEG_N,
            mode="train",
            size=(160, 160),
            seed=6,
            device_id=device_id,
            num_threads=num_threads,
            **dict(NO_AUGMENT, **aug),
        )
        return seg_epoch(loader)[0].cpu()

    noisy = run(noise_p=1.0, noise_std=(0.25, 0.2501))
    noise = (
        (noisy - run()).flatten(1).double()
    )  # the reader's shuffle follows its seed: the same order
    assert noise.shape == (
        SEG_N,
        3 * 160 * 160,
    )  # more than one of the CPU pipeline's chunks of 2**16 elements
    assert noise.mean(1).abs().max() < 0.015
    assert ((noise.std(1) - 0.25).abs() < 0.01).all()
    assert (
        abs((noise.abs() < 0.25).double().mean().item() - 0.6827) < 0.01
    )  # one standard deviation
    assert abs((noise.abs() < 0.5).double().mean().item() - 0.9545) < 0.005  # two
    correlation = torch.corrcoef(noise)
    assert (correlation - torch.eye(SEG_N)).abs().max() < 0.03  # independent across samples
    tail = noise.shape[1] - 2**16
    within = torch.corrcoef(torch.stack([noise[:, :tail].flatten(), noise[:, 2**16 :].flatten()]))[
        0, 1
    ]
    assert abs(within) < 0.03  # and within a sample
    assert torch.equal(
        run(noise_p=1.0, noise_std=(0.25, 0.2501)), noisy
    )  # the same seed, the same noise
    assert torch.equal(
        run(num_threads=1, noise_p=1.0, noise_std=(0.25, 0.2501)), noisy
    )  # on any number of threads


def test_contrast_stays_within_the_image_range(seg_files):
    base, _ = seg_epoch(
        seg_loader(*seg_files, batch_size=SEG_N, mode="train", size=(SEG_H, SEG_W), **NO_AUGMENT)
    )
    aug = dict(NO_AUGMENT, contrast_p=1.0)
    images, _ = seg_epoch(
        seg_loader(*seg_files, batch_size=SEG_N, mode="train", size=(SEG_H, SEG_W), **aug)
    )
    for a, b in zip(base, images):
        assert b.min() >= a.min() - 1e-5 and b.max() <= a.max() + 1e-5


def ramp_pairs(tmp_path, n):
    """``n`` copies of one pair that tells where each pixel came from: image channels 0 and 1 are
    10 x its row and 6 x its column, channel 2 is 50; the int64 mask is row * SEG_W + column."""
    rows, cols = np.mgrid[:SEG_H, :SEG_W]
    image = np.stack([10 * rows, 6 * cols, np.full_like(rows, 50)], -1).astype(np.uint8)
    return save_pairs(tmp_path, [image] * n, [rows * SEG_W + cols] * n)


def ramp_scales(coords, pad, axis):
    """Each sample's output pixels per source pixel along ``axis``: the mean step of the source
    coordinate between unpadded neighbours."""
    steps = np.abs(np.diff(np.where(pad, np.nan, coords), axis=axis))
    return 1 / np.nanmean(steps, axis=(1, 2))


SCALED = dict(NO_AUGMENT, flip_p=0.5, scale_range=(0.5, 2.0))


@pytest.mark.parametrize(
    "device_id", [pytest.param(None, id="cpu"), pytest.param(0, marks=gpu, id="gpu")]
)
def test_scale_range_scales_image_and_mask_alike_then_crops_to_size(tmp_path, device_id):
    """Where each pixel came from, read linearly from the image and by nearest neighbour from the
    mask, agrees to half a source pixel: both were scaled, flipped and cropped by the same draws.
    The padding is where both show it; the ramps' slopes give each sample's scale, the same along
    rows and columns (1 is ``size``), different between samples, and the seed repeats them."""
    imgs, lbls = ramp_pairs(tmp_path, 20)

    def run(seed):
        kwargs = dict(size=(SEG_H, SEG_W), device_id=device_id, seed=seed, mask_pad=-1, **SCALED)
        images, masks = seg_epoch(seg_loader(imgs, lbls, batch_size=10, mode="train", **kwargs))
        return images.cpu(), masks.cpu()

    images, masks = run(seed=5)
    assert images.shape == (20, 3, SEG_H, SEG_W) and masks.shape == (20, 1, SEG_H, SEG_W)
    raw, masks = unnormalize(images), masks[:, 0].numpy()
    pad = masks == -1
    assert set(np.unique(masks)) <= set(range(SEG_H * SEG_W)) | {-1}
    # the image is padded with 0 after normalization: the mean colour
    np.testing.assert_array_equal(np.abs(raw[..., 2] - MEAN[2]) < 1e-3, pad)
    np.testing.assert_allclose(raw[..., 2][~pad], 50, atol=1e-3)
    assert 0 < pad.any(axis=(1, 2)).sum() < 20  # the samples scaled below 1, not the others
    rows, cols = raw[..., 0] / 10, raw[..., 1] / 6
    assert np.abs(rows - masks // SEG_W)[~pad].max() <= 0.5 + 1e-3
    assert np.abs(cols - masks % SEG_W)[~pad].max() <= 0.5 + 1e-3
    scales = ramp_scales(rows, pad, axis=1)
    np.testing.assert_allclose(ramp_scales(cols, pad, axis=2), scales, rtol=0.1)
    assert 0.45 < scales.min() < 0.8 and 1.5 < scales.max() < 2.2, scales
    again, other = run(seed=5), run(seed=6)
    assert torch.equal(again[0], images) and np.array_equal(again[1][:, 0].numpy(), masks)
    assert not torch.equal(other[0], images)


def test_scale_range_keeps_mask_classes_under_all_augmentations(seg_files):
    aug = dict(SCALED, noise_p=1.0, blur_p=1.0, brightness_p=1.0, contrast_p=1.0)
    images, masks = seg_epoch(
        seg_loader(*seg_files, batch_size=5, mode="train", size=(37, 53), mask_pad=255, **aug)
    )
    assert images.shape == (SEG_N, 3, 37, 53) and masks.shape == (SEG_N, 1, 37, 53)
    assert masks.dtype == torch.uint8 and set(masks.unique().tolist()) == {0, 1, 2, 255}
    assert torch.isfinite(images).all()


def test_segment_val_shards_cover_the_dataset_once(seg_files):
    seen = [
        sample_ids(
            seg_epoch(
                seg_loader(
                    *seg_files,
                    batch_size=3,
                    mode="eval",
                    size=(SEG_H, SEG_W),
                    shard_id=shard,
                    num_shards=2,
                )
            )[0]
        )
        for shard in range(2)
    ]
    assert seen == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]


def test_train_epoch_over_uneven_shards_runs_equal_full_batches_of_real_samples(seg_files):
    imgs, lbls = (
        seg_files[0][:9],
        seg_files[1][:9],
    )  # 9 samples over 2 shards, batch 2: 3 distinct ones repeated
    loaders = [
        seg_loader(
            imgs,
            lbls,
            batch_size=2,
            mode="train",
            size=(SEG_H, SEG_W),
            shard_id=shard,
            num_shards=2,
            seed=5,
            **NO_AUGMENT,
        )
        for shard in range(2)
    ]
    for epoch in range(2):
        shards = []
        for loader in loaders:
            batches = list(loader)
            assert len(batches) == len(loader) == 3  # 12 samples: 6 a shard
            ids = []
            for batch in batches:
                images, masks = batch[0]["image"], batch[0]["mask"]
                assert images.shape == (2, 3, SEG_H, SEG_W)  # full, padded or not
                for k, mask in zip(sample_ids(images), masks.numpy()):
                    np.testing.assert_array_equal(
                        mask.transpose(1, 2, 0), seg_mask(k)
                    )  # aligned, real
                    ids.append(k)
            shards.append(ids)
        counts = Counter(shards[0] + shards[1])
        assert sorted(counts) == list(range(9))  # every sample this epoch
        assert (
            sorted(counts.values()) == [1] * 6 + [2] * 3
        )  # and three distinct ones twice, nothing else


def test_pairs_by_position_whatever_the_names(tmp_path):
    names = [("img_0.npy", "mask_0.npy"), ("x.npy", "x_mask.npy"), ("scans/a.npy", "labels/zz.npy")]
    imgs, lbls = save_pairs(
        tmp_path, [seg_image(k) for k in range(3)], [seg_mask(k) for k in range(3)], names
    )
    images, masks = seg_epoch(
        seg_loader(imgs, lbls, batch_size=3, mode="eval", size=(SEG_H, SEG_W))
    )
    assert sample_ids(images) == [0, 1, 2]
    for k in range(3):
        np.testing.assert_array_equal(masks[k].numpy().transpose(1, 2, 0), seg_mask(k))


def per_image(image):
    """(H, W, C) -> (C, H, W), each channel standardized by its own mean and standard deviation."""
    image = image.astype(np.float64).reshape(image.shape[0], image.shape[1], -1)
    std = image.std(axis=(0, 1))
    return ((image - image.mean(axis=(0, 1))) / np.where(std > 0, std, 1)).transpose(2, 0, 1)


IMAGE_KINDS = [
    ((), np.uint8),
    ((1,), np.uint8),
    ((), np.uint16),
    ((3,), np.uint16),
    ((1,), np.float32),
    ((3,), np.float32),
]


@pytest.mark.parametrize("channels,dtype", IMAGE_KINDS, ids=lambda v: str(v))
def test_image_kinds_are_normalized_per_image(tmp_path, channels, dtype):
    rng = np.random.default_rng(0)
    top = {np.uint8: 255, np.uint16: 4000, np.float32: 1}[dtype]
    images = [(rng.random((SEG_H, SEG_W, *channels)) * top).astype(dtype) for _ in range(3)]
    images[2][:] = images[2].flat[0]  # a constant image normalizes to 0, not NaN
    imgs, lbls = save_pairs(tmp_path, images, [seg_mask(k) for k in range(3)])
    pipe = seg_pipe(imgs, lbls, batch_size=3, mode="eval", size=(SEG_H, SEG_W))
    c = channels[0] if channels else 1
    assert pipe.channels == c
    out, masks = seg_epoch(segment_iterator(pipe))
    assert out.shape == (3, c, SEG_H, SEG_W) and out.dtype == torch.float32
    for image, result in zip(images, out.numpy()):
        np.testing.assert_allclose(result, per_image(image), atol=1e-4)
    np.testing.assert_allclose(out[:2].mean(dim=(2, 3)), 0, atol=1e-5)
    np.testing.assert_allclose(out[:2].std(dim=(2, 3), correction=0), 1, atol=1e-4)
    assert torch.equal(out[2], torch.zeros_like(out[2]))


def test_per_image_normalization_numbers(tmp_path):
    image = np.array([[0, 100], [200, 300]], np.uint16)  # mean 150, std sqrt(12500)
    imgs, lbls = save_pairs(tmp_path, [image], [np.zeros((2, 2), np.uint8)])
    out, _ = seg_epoch(seg_loader(imgs, lbls, batch_size=1, mode="eval", size=(2, 2)))
    np.testing.assert_allclose(
        out[0, 0].numpy(), (image.astype(float) - 150) / np.sqrt(12500), atol=1e-6
    )


def test_given_mean_and_std_replace_the_default(tmp_path, seg_files):
    imgs, lbls = save_pairs(
        tmp_path,
        [np.array([[1000, 1010], [1020, 990]], np.uint16)],
        [np.zeros((2, 2), np.uint8)],
        [("u16/image.npy", "u16/mask.npy")],
    )
    out, _ = seg_epoch(
        seg_loader(imgs, lbls, batch_size=1, mode="eval", size=(2, 2), mean=1000, std=10)
    )
    np.testing.assert_allclose(out[0, 0].numpy(), [[0, 1], [2, -1]], atol=1e-6)
    rgb, _ = seg_epoch(
        seg_loader(
            *seg_files,
            batch_size=SEG_N,
            mode="eval",
            size=(SEG_H, SEG_W),
            mean=[0, 0, 50],
            std=[1, 10, 2],
        )
    )  # 8-bit RGB too
    np.testing.assert_allclose(rgb[:, 1].amax(dim=(1, 2)).numpy(), list(range(SEG_N)), atol=1e-6)
    np.testing.assert_allclose(rgb[:, 2].numpy(), 0, atol=1e-6)


# what each stored mask type is handed out as, and class values it must keep exactly
MASK_KINDS = [
    (np.uint8, torch.uint8, [0, 1, 255]),
    (np.bool_, torch.uint8, [0, 1]),
    (np.int8, torch.int32, [-1, 0, 3]),
    (np.int16, torch.int32, [-1, 0, 300]),
    (np.uint16, torch.int32, [0, 3, 65535]),
    (np.int32, torch.int32, [0, 1, 2, 3]),
    (np.int64, torch.int32, [-1, 0, 1, 2, 3]),
    (np.uint32, torch.int32, [0, 2, 70000]),
]


@pytest.mark.parametrize("stored,handed_out,classes", MASK_KINDS, ids=lambda v: str(v))
@pytest.mark.parametrize("shape", [(SEG_H, SEG_W), (SEG_H, SEG_W, 1)], ids=["HW", "HW1"])
def test_mask_kinds_keep_their_class_values(tmp_path, stored, handed_out, classes, shape):
    rng = np.random.default_rng(1)
    masks = [
        np.array(classes)[rng.integers(0, len(classes), shape)].astype(stored) for _ in range(2)
    ]
    imgs, lbls = save_pairs(tmp_path, [seg_image(k) for k in range(2)], masks)
    for mode, scale in (("eval", 1), ("train", 2)):
        aug = NO_AUGMENT if mode == "train" else {}
        images, out = seg_epoch(
            seg_loader(
                imgs, lbls, batch_size=2, mode=mode, size=(scale * SEG_H, scale * SEG_W), **aug
            )
        )
        assert out.dtype == handed_out and out.shape == (2, 1, scale * SEG_H, scale * SEG_W)
        for k, result in zip(sample_ids(images), out.numpy()):
            # nearest neighbour at 2x: each pixel becomes 2 x 2
            expected = (
                masks[k].reshape(SEG_H, SEG_W).astype(np.int64).repeat(scale, 0).repeat(scale, 1)
            )
            np.testing.assert_array_equal(result[0], expected)


def test_writeup_client_code_runs_unchanged(seg_files):
    kwargs = {
        "dim": 2,
        "seed": 42,
        "gpus": 1,
        "overlap": 0.5,
        "benchmark": False,
        "num_workers": 4,
        "oversampling": 0.4,
        "test_batches": 0,
        "train_batches": 0,
        "load_to_gpu": True,
    }
    train = fetch_dali_loader(
        imgs=seg_files[0], lbls=seg_files[1], batch_size=5, mode="train", **kwargs
    )
    valid = fetch_dali_loader(
        imgs=seg_files[0], lbls=seg_files[1], batch_size=4, mode="eval", **kwargs
    )
    assert isinstance(train, SegmentTrainPipeline) and isinstance(valid, SegmentValPipeline)
    assert train.num_threads == 4 and train.device_id == (0 if torch.cuda.is_available() else None)

    class LightningWrapper(DALIGenericIterator):
        def __next__(self):
            return super().__next__()[0]

    # The wrapper keeps DALIGenericIterator's default policy (FILL): full batches, the last one of the
    # validation epoch (4 + 4 + 2) padded with repeats. segment_iterator counts validation samples once.
    for pipe, batch_size, batches in ((train, 5, 2), (valid, 4, 3)):
        loader = LightningWrapper(
            pipe,
            auto_reset=True,
            reader_name="ReaderX",
            output_map=["image", "label"],
            dynamic_shape=False,
        )
        for epoch in range(2):
            out = list(loader)
            assert len(out) == batches and all(set(batch) == {"image", "label"} for batch in out)
            assert all(
                batch["image"].shape[1:] == (3, 384, 384)
                and batch["image"].shape[0] == batch_size
                and batch["label"].shape[1:] == (1, 384, 384)
                for batch in out
            )


def test_unknown_keyword_is_refused_with_the_accepted_ones(seg_files):
    with pytest.raises(
        ValueError,
        match="unknown keyword argument.* patch_size; it accepts device_id, "
        "num_threads.*flip_p.*num_workers, gpus, and ignores dim, overlap",
    ):
        fetch_dali_loader(*seg_files, batch_size=2, mode="train", patch_size=[64, 64])


def test_augmentation_settings_are_ignored_by_eval(seg_files):
    plain, _ = seg_epoch(seg_loader(*seg_files, batch_size=SEG_N, mode="eval", size=(SEG_H, SEG_W)))
    given, _ = seg_epoch(
        seg_loader(
            *seg_files,
            batch_size=SEG_N,
            mode="eval",
            size=(SEG_H, SEG_W),
            noise_p=1.0,
            flip_p=1.0,
            contrast_p=1.0,
        )
    )
    assert torch.equal(given, plain)


@pytest.mark.parametrize(
    "env,kwargs,expected",
    [
        ({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}, {}, [5, 6, 7, 8, 9]),  # torchrun
        ({"RANK": "1", "WORLD_SIZE": "2"}, {"shard_id": 0}, [0, 1, 2, 3, 4]),  # explicit wins
        (
            {"RANK": "0", "WORLD_SIZE": "1"},
            {"gpus": 2},
            list(range(SEG_N)),
        ),  # torchrun's count wins over gpus
        (
            {"LOCAL_RANK": "1"},
            {"gpus": 2},
            [5, 6, 7, 8, 9],
        ),  # the write-up: shard LOCAL_RANK of gpus
        ({}, {}, list(range(SEG_N))),
    ],
)
def test_shard_from_the_environment(seg_files, monkeypatch, env, kwargs, expected):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # LOCAL_RANK 1 names no GPU here
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    pipe = fetch_dali_loader(*seg_files, batch_size=5, mode="eval", size=(SEG_H, SEG_W), **kwargs)
    assert pipe.device_id is None
    assert sample_ids(seg_epoch(segment_iterator(pipe))[0]) == expected


def test_fetch_dali_loader_takes_any_iterable_of_paths_and_refuses_one_path(seg_files):
    """A list, tuple, generator, NumPy array of str or pathlib.Path items each read every sample
    once, in order; a single path (str or Path) is refused in one line, not read letter by
    letter."""
    imgs, lbls = seg_files
    forms = [
        (tuple(imgs), tuple(lbls)),
        ((f for f in imgs), (f for f in lbls)),
        (np.array(imgs), np.array(lbls)),
        ([pathlib.Path(f) for f in imgs], [pathlib.Path(f) for f in lbls]),
    ]
    for a, b in forms:
        pipe = fetch_dali_loader(a, b, batch_size=5, mode="eval", size=(SEG_H, SEG_W))
        assert sample_ids(seg_epoch(segment_iterator(pipe))[0]) == list(range(SEG_N))
    for one in (imgs[0], pathlib.Path(imgs[0])):
        with pytest.raises(TypeError, match=r"^imgs is one path, .*: expected a list of paths"):
            fetch_dali_loader(one, lbls, batch_size=2, mode="eval")
    with pytest.raises(TypeError, match=r"^lbls is one path"):
        fetch_dali_loader(imgs, lbls[0], batch_size=2, mode="eval")


def test_shard_out_of_range(seg_files, monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "1")
    with pytest.raises(ValueError, match="shard_id 1 is out of range for num_shards 1"):
        fetch_dali_loader(*seg_files, batch_size=2, mode="train", gpus=1)


@pytest.mark.parametrize("scale", [{}, dict(scale_range=(0.5, 2.0))], ids=["fixed", "scaled"])
def test_checkpoint_resumes_the_train_pipeline(seg_files, scale):
    kwargs = dict(
        batch_size=3,
        mode="train",
        size=(SEG_H, SEG_W),
        seed=7,
        enable_checkpointing=True,
        noise_p=0.5,
        blur_p=0.5,
        **scale,
    )
    loader = seg_loader(*seg_files, **kwargs)
    next(loader)
    checkpoint = loader.checkpoints()[0]
    expected = next(loader)[0]
    resumed = next(seg_loader(*seg_files, checkpoint=checkpoint, **kwargs))[0]
    assert torch.equal(resumed["image"], expected["image"]) and torch.equal(
        resumed["mask"], expected["mask"]
    )


def test_cpu_only_pipelines_ask_to_run_operators_at_once(solid_folder, seg_files):
    """What makes DALI_USE_NEW_THREAD_POOL=1 count (README): CPU-only pipelines ask DALI for full operator
    concurrency, unless told otherwise; pipelines on a GPU keep DALI's default (None). Building is not needed."""
    for device_id, expected in ((None, OperatorConcurrency.FULL), (0, None)):
        assert ClassifyTrainPipeline(4, 1, device_id, str(solid_folder))._concurrency == expected
        assert ClassifyValPipeline(4, 1, device_id, str(solid_folder))._concurrency == expected
        assert SegmentTrainPipeline(4, 1, device_id, *seg_files)._concurrency == expected
    told = SegmentValPipeline(4, 1, None, *seg_files, concurrency=OperatorConcurrency.BACKEND)
    assert told._concurrency == OperatorConcurrency.BACKEND


@pytest.mark.skipif(
    os.environ.get("DALI_USE_NEW_THREAD_POOL") == "1", reason="this run is the one it starts"
)
def test_cpu_pipelines_pass_these_tests_with_operators_running_at_once():
    """README's DALI_USE_NEW_THREAD_POOL=1 lets a CPU-only pipeline run independent operators, and successive
    iterations, at once. Every CPU test of this file and of test_data_sources.py (labels, epochs, alignment,
    augmentations, checkpoints, bad input) runs again in a process started with it; DALI's notice in the output
    shows that it took effect."""
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-s",
            "-p",
            "no:cacheprovider",
            __file__,
            os.path.join(os.path.dirname(os.path.abspath(__file__)), "test_data_sources.py"),
            "-k",
            "not gpu and not operators_running_at_once",
        ],
        env={**os.environ, "DALI_USE_NEW_THREAD_POOL": "1"},
        capture_output=True,
        text=True,
        cwd=os.path.dirname(os.path.abspath(__file__)),
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert "Forced use of NewThreadPool" in run.stdout + run.stderr
    assert re.search(r"\b\d{3,} passed", run.stdout), run.stdout[-500:]  # every one of them


# ------------------------------------------------------------------------------------------
# bad arguments
# ------------------------------------------------------------------------------------------


def test_mean_without_std(seg_files):
    with pytest.raises(ValueError, match="give both mean and std, or neither"):
        fetch_dali_loader(*seg_files, batch_size=2, mode="eval", mean=[0.5, 0.5, 0.5])


def test_mean_of_the_wrong_length(seg_files):
    with pytest.raises(
        ValueError, match=r"mean and std need 1 or 3 values each .* got mean=\[0.0, 0.0\]"
    ):
        fetch_dali_loader(*seg_files, batch_size=2, mode="eval", mean=[0, 0], std=[1, 1])


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(mean=[0.5], std=[0.0]), r"std must be above 0 and mean finite, got mean=\[0.5\], std=\[0.0\]"),
        (dict(mean=[float("nan")], std=[1.0]), r"std must be above 0 and mean finite"),
        (dict(flip_p=2.0), r"flip_p must be a probability in \[0, 1\], got 2.0"),
        (dict(noise_std=(0.3, 0.1)), r"noise_std must be \(low, high\) with 0 <= low <= high, got \(0.3, 0.1\)"),
        (dict(scale_range=(0, 2)), r"scale_range must be \(low, high\) with 0 < low <= high, got \(0, 2\)"),
        (dict(scale_range=(2, 1)), r"scale_range must be \(low, high\) with 0 < low <= high, got \(2, 1\)"),
        (dict(mask_pad=256), r"mask_pad must be a whole number in \[0, 255\] \(what the masks hold\), got 256"),
        (dict(size=(64, 0)), r"size must be a whole number of at least 1, got 0"),
        (dict(size=(1, 2, 3)), r"size must be \(height, width\) or one number, got \(1, 2, 3\)"),
    ],
)  # fmt: skip
def test_bad_segmentation_arguments_are_named_before_dali_builds(seg_files, kwargs, message):
    """What a researcher calls from a notebook is checked as the trainers check their flags."""
    with pytest.raises(ValueError, match=message):
        fetch_dali_loader(*seg_files, batch_size=2, mode="train", device_id=None, **kwargs)


def test_a_segmentation_size_of_one_number_is_a_square(seg_files):
    pipe = fetch_dali_loader(*seg_files, batch_size=2, mode="eval", device_id=None, size=32)
    batch = next(iter(segment_iterator(pipe)))[0]
    assert batch["image"].shape[-2:] == (32, 32) and batch["mask"].shape[-2:] == (32, 32)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(random_erase=1.5), r"random_erase must be a probability in \[0, 1\], got 1.5"),
        (dict(random_area=(0.5, 2.0)), r"random_area must be \(low, high\) with 0 <= low <= high, at most 1.0"),
        (dict(crop_size=0), r"crop_size must be a whole number of at least 1, got 0"),
    ],
)  # fmt: skip
def test_bad_classification_arguments_are_named_before_dali_builds(solid_folder, kwargs, message):
    with pytest.raises(ValueError, match=message):
        ClassifyTrainPipeline(4, 1, None, str(solid_folder), **kwargs)


@pytest.mark.parametrize("batch_size", [0, 2.5])
def test_a_batch_size_below_one_or_not_whole_is_named(seg_files, solid_folder, batch_size):
    expected = f"batch_size must be a whole number of at least 1, got {batch_size}"
    with pytest.raises(ValueError, match=re.escape(expected)):
        fetch_dali_loader(*seg_files, batch_size=batch_size, mode="eval", device_id=None)
    with pytest.raises(ValueError, match=re.escape(expected)):
        ClassifyValPipeline(batch_size, 1, None, str(solid_folder))


@pytest.mark.parametrize("masks", ["one fewer", "none", "both empty"])
def test_image_and_mask_lists_must_pair_up(seg_files, masks):
    """The pipeline's own check of its lists; the files themselves are the caller's to check
    (data_sources.check_segmentation_files, test_data_sources.py)."""
    imgs, lbls = seg_files
    imgs, lbls = {"one fewer": (imgs, lbls[:-1]), "none": (imgs, None), "both empty": ([], [])}[
        masks
    ]
    expected = (
        f"expected one mask for each image, and an image: got {len(imgs)} images and "
        f"{len(lbls or [])} masks"
    )
    for mode in ("train", "eval"):
        with pytest.raises(ValueError, match=f"^{expected}$"):
            fetch_dali_loader(imgs, lbls, batch_size=2, mode=mode, device_id=None)


def test_unknown_mode(seg_files):
    with pytest.raises(ValueError, match="mode must be one of train, eval, test, got 'predict'"):
        fetch_dali_loader(*seg_files, batch_size=2, mode="predict")


@pytest.mark.parametrize(
    "pipeline, kwargs, load",
    [
        (ClassifyTrainPipeline, {}, 0.65),
        (ClassifyTrainPipeline, dict(decoder_cache=64), 1.0),
        (ClassifyTrainPipeline, dict(decoder_cache=64, hw_decoder_load=0.7), 0.7),
        (ClassifyValPipeline, {}, 0.65),
        (ClassifyValPipeline, dict(decoder_cache=64), 1.0),
    ],
)
def test_the_hardware_decoders_share_is_dalis_default_and_all_with_the_cache(
    solid_folder, pipeline, kwargs, load
):
    """Set up (not built, so no GPU needed) for device 0: the mixed decoder's arguments."""
    pipe = pipeline(4, 1, 0, str(solid_folder), crop_size=24, **kwargs)
    assert pipe.decoder_device == "mixed" and pipe.decoder_args["hw_decoder_load"] == load
    cpu = pipeline(4, 1, None, str(solid_folder), crop_size=24, **kwargs)
    assert cpu.decoder_device == "cpu" and "hw_decoder_load" not in cpu.decoder_args


def images_graph(pipe):
    """(operator, its device) from the pipeline's images output back to its reader, traced as
    DALI's build traces it (define_graph in the pipeline's scope), without building: no GPU
    needed."""
    with pipe:
        node, _ = pipe.define_graph()
    graph = []
    while node is not None:
        graph.append((type(node.source._op).__name__, node.source._op.device))
        node = node.source.inputs[0] if node.source.inputs else None
    return graph


@pytest.mark.parametrize(
    "pipeline, decode",
    [(ClassifyTrainPipeline, "ImageRandomCrop"), (ClassifyValPipeline, "Image")],
)
@pytest.mark.parametrize("decoder", ["mixed", "cpu"])
@pytest.mark.parametrize(
    "layout, reader", [("folder", "File"), ("tfrecord", "TFRecord"), ("wds", "Webdataset")]
)
def test_the_decoder_runs_where_asked_and_the_rest_on_the_gpu(
    split_root, pipeline, decode, decoder, layout, reader
):
    data = split_root if layout == "folder" else to_shards(split_root, layout)
    pipe = pipeline(4, 1, 0, str(data / "train"), crop_size=24, decoder=decoder)
    assert images_graph(pipe) == [
        ("CropMirrorNormalize", "gpu"),
        ("Resize", "gpu"),
        (decode, decoder),
        (reader, "cpu"),
    ]
    assert ("hw_decoder_load" in pipe.decoder_args) == (decoder == "mixed")
    cpu = pipeline(4, 1, None, str(data / "train"), crop_size=24, decoder=decoder)
    assert {device for _, device in images_graph(cpu)} == {"cpu"}


@pytest.mark.parametrize(
    "kwargs, expected",
    [
        (dict(decoder="gpu"), "decoder must be 'mixed' or 'cpu', got 'gpu'"),
        (
            dict(decoder="cpu", decoder_cache=64),
            "decoder_cache needs decoder='mixed' (DALI caches what its GPU decoder decodes), "
            "got decoder='cpu'",
        ),
    ],
)
def test_a_decoder_that_cannot_be_is_named(solid_folder, kwargs, expected):
    with pytest.raises(ValueError, match=re.escape(expected)):
        ClassifyTrainPipeline(4, 1, 0, str(solid_folder), crop_size=24, **kwargs)


# ------------------------------------------------------------------------------------------
# pipelines.py copied alone
# ------------------------------------------------------------------------------------------

# Runs the module docstring's two examples, as written, in a folder that holds pipelines.py and the
# data only; each example's iterator is wrapped to keep every batch of its epoch.
ALONE = """
import importlib.util, json, sys, textwrap
import numpy as np
import pipelines

assert importlib.util.find_spec("data_sources") is None  # nothing but pipelines.py beside it
examples = [[]]
for line in pipelines.__doc__.splitlines():
    if line.startswith("    "):
        examples[-1].append(line)
    elif examples[-1]:
        examples.append([])
kept = {}
for name in ("classify_iterator", "segment_iterator"):
    def keeping(pipe, make=getattr(pipelines, name), name=name):
        for batch in make(pipe):
            kept.setdefault(name, []).append({k: v.clone() for k, v in batch[0].items()})
            yield batch
    setattr(pipelines, name, keeping)
for example in examples[:2]:
    exec(textwrap.dedent("\\n".join(example)), {})
assert "data_sources" not in sys.modules
out = {}
for name, batches in kept.items():
    out[name] = [{k: [list(v.shape), str(v.dtype), v.tolist()] for k, v in b.items()} for b in batches]
json.dump(out, sys.stdout)
"""


def test_pipelines_py_alone_runs_its_docstring_examples_on_the_cpu(tmp_path):
    """pipelines.py alone in a folder, with no data_sources.py: an ImageFolder tree and .npy pairs,
    each colour telling its class, give batches whose labels and masks match their pixels."""
    (tmp_path / "pipelines.py").write_bytes(open(pipelines.__file__, "rb").read())
    colours = {"cat": (200, 30, 30), "dog": (30, 30, 200)}  # class 0 red, class 1 blue
    for name, colour in colours.items():
        (tmp_path / "train" / name).mkdir(parents=True)
        for k in range(8):
            Image.new("RGB", (40 + 6 * k, 70 - 4 * k), colour).save(
                tmp_path / "train" / name / f"{k}.png"
            )
    for folder in ("images", "masks"):
        (tmp_path / "npy" / folder).mkdir(parents=True)
    for k in range(8):  # foreground (class 1) on the left, bright; background dark
        mask = np.zeros((48, 64), np.uint8)
        mask[:, : 16 + 4 * k] = 1
        image = np.where(mask[..., None] == 1, 220, 40).astype(np.uint8).repeat(3, axis=2)
        np.save(tmp_path / "npy" / "images" / f"{k}.npy", image)
        np.save(tmp_path / "npy" / "masks" / f"{k}.npy", mask)
    (tmp_path / "alone.py").write_text(ALONE)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "RANK", "WORLD_SIZE")}
    proc = subprocess.run(
        [sys.executable, "alone.py"], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    kept = json.loads(proc.stdout)

    classified = kept["classify_iterator"]  # one epoch of 16 images, batches of 8
    assert len(classified) == 2
    labels = []
    for batch in classified:
        (shape, dtype, images), (label_shape, label_dtype, label) = batch["data"], batch["label"]
        assert shape == [8, 3, 64, 64] and dtype == "torch.float32"
        assert label_shape == [8, 1] and label_dtype == "torch.int32"
        for image, (value,) in zip(np.array(images), label):
            # every pixel the class's colour, normalized: red above the mean for class 0
            assert np.ptp(image, axis=(1, 2)).max() < 1e-4
            assert (image[0, 0, 0] > 0) == (value == 0) and (image[2, 0, 0] > 0) == (value == 1)
            labels.append(value)
    assert sorted(labels) == [0] * 8 + [1] * 8

    segmented = kept["segment_iterator"]  # one epoch of 8 pairs, batches of 4
    assert len(segmented) == 2
    for batch in segmented:
        (shape, dtype, images), (mask_shape, mask_dtype, masks) = batch["image"], batch["mask"]
        assert shape == [4, 3, 128, 128] and dtype == "torch.float32"
        assert mask_shape == [4, 1, 128, 128] and mask_dtype == "torch.uint8"
        for image, mask in zip(np.array(images), np.array(masks)[:, 0]):
            assert set(np.unique(mask)) == {0, 1}
            # flipped alike: the foreground's pixels bright, the background's dark, whatever the
            # augmentations (the blur and the resize smear the border's pixels a little)
            assert np.mean((image.mean(0) > 0) == (mask == 1)) > 0.97


# ------------------------------------------------------------------------------------------
# GPU
# ------------------------------------------------------------------------------------------


@gpu
@pytest.mark.parametrize("decoder", ["mixed", "cpu"])
def test_gpu_mixed_decode_train(texture_folder, decoder):
    pipe = ClassifyTrainPipeline(
        4, 2, 0, str(texture_folder), crop_size=32, seed=1, dtype="float16", decoder=decoder
    )
    labels = []
    for batch in classify_iterator(pipe):
        images = batch[0]["data"]
        assert (
            images.device.type == "cuda"
            and images.dtype == torch.float16
            and images.shape[1:] == (3, 32, 32)
        )
        labels += batch[0]["label"].flatten().tolist()
    assert sorted(labels) == sorted(c for c in range(len(CLASSES)) for _ in range(4))


@gpu
@pytest.mark.parametrize("fmt", FORMATS)
def test_gpu_shards_train_with_random_erase(split_root, fmt):
    pipe = ClassifyTrainPipeline(
        4,
        2,
        0,
        str(to_shards(split_root, fmt) / "train"),
        crop_size=32,
        seed=1,
        dtype="float16",
        random_erase=1.0,
    )
    labels = []
    for batch in classify_iterator(pipe):
        images = batch[0]["data"]
        assert (
            images.device.type == "cuda"
            and images.dtype == torch.float16
            and images.shape == (4, 3, 32, 32)
        )
        assert (images == 0).all(dim=1).flatten(1).any(dim=1).all()  # every image has an erased box
        labels += batch[0]["label"].squeeze(-1).tolist()
    assert len(labels) == 24 and set(labels) == {0, 1, 2}


LEVEL = 1 / min(IMAGENET_STD)  # one 8-bit step, in normalized units


def smooth_picture(rng, h, w):
    """Photo-like content: smooth colour gradients and a few soft-edged shapes."""
    yy, xx = np.mgrid[0:h, 0:w] / max(h, w)
    picture = (
        rng.uniform(40, 200, 3)
        + xx[..., None] * rng.uniform(-80, 80, 3)
        + yy[..., None] * rng.uniform(-80, 80, 3)
    )
    for _ in range(3):
        cy, cx, r = rng.uniform(0, 1, 3) * (h, w, min(h, w) / 2)
        inside = ((np.mgrid[0:h, 0:w][0] - cy) ** 2 + (np.mgrid[0:h, 0:w][1] - cx) ** 2) < r**2
        picture[inside] = 0.5 * picture[inside] + 0.5 * rng.uniform(0, 255, 3)
    return Image.fromarray(np.clip(picture, 0, 255).astype(np.uint8))


def gpu_cpu_val_difference(folder, **gpu_kwargs):
    out = {}
    for device_id in (None, 0):
        kwargs = gpu_kwargs if device_id == 0 else {}
        pipe = ClassifyValPipeline(
            12, 2, device_id, str(folder), crop_size=40, resize_size=44, **kwargs
        )
        batch = next(iter(classify_iterator(pipe)))[0]
        out[device_id] = (batch["data"].cpu(), batch["label"].cpu())
    assert torch.equal(out[None][1], out[0][1])
    diff = (out[None][0] - out[0][0]).abs() / LEVEL
    print(f"GPU vs CPU, {folder.name}: mean {diff.mean():.3f}, max {diff.max():.3f} 8-bit levels")
    return diff


@gpu
def test_gpu_and_cpu_val_outputs_match_on_png(tmp_path):
    # PNG decodes identically on both; resizing and normalizing may differ by rounding only.
    rng = np.random.default_rng(1)
    for c in range(3):
        (tmp_path / "png" / f"c{c}").mkdir(parents=True)
        for i in range(4):
            smooth_picture(rng, 60 + 7 * i, 80 - 5 * i).save(
                tmp_path / "png" / f"c{c}" / f"{i}.png"
            )
    diff = gpu_cpu_val_difference(tmp_path / "png")
    assert diff.mean() < 0.1 and diff.max() <= 2


@gpu
def test_gpu_and_cpu_val_outputs_match_on_jpeg(tmp_path):
    # nvJPEG and libjpeg-turbo upsample chroma and round the IDCT differently: close on average,
    # a few levels apart at sharp colour edges. A swapped channel, wrong normalisation or a shifted
    # crop would be tens of levels off on average.
    rng = np.random.default_rng(2)
    for c in range(3):
        (tmp_path / "jpeg" / f"c{c}").mkdir(parents=True)
        for i in range(4):
            smooth_picture(rng, 60 + 7 * i, 80 - 5 * i).save(
                tmp_path / "jpeg" / f"c{c}" / f"{i}.jpg", quality=90
            )
    diff = gpu_cpu_val_difference(tmp_path / "jpeg")
    assert diff.mean() < 1 and diff.max() < 32
    # decoder="cpu": libjpeg-turbo on both sides, so only the resize's rounding differs, as on PNG
    diff = gpu_cpu_val_difference(tmp_path / "jpeg", decoder="cpu")
    assert diff.mean() < 0.1 and diff.max() <= 2


@gpu
@pytest.mark.parametrize("kind", ["rgb8", "uint16-grey-int64-mask"])
def test_gpu_and_cpu_segmentation_val_match(tmp_path, seg_files, kind):
    if kind == "rgb8":
        imgs, lbls = seg_files
    else:
        rng = np.random.default_rng(2)
        images = [(rng.random((SEG_H, SEG_W)) * 4000).astype(np.uint16) for _ in range(4)]
        masks = [rng.integers(-1, 4, (SEG_H, SEG_W)).astype(np.int64) for _ in range(4)]
        imgs, lbls = save_pairs(
            tmp_path, images, masks, [(f"g/i{k}.npy", f"g/m{k}.npy") for k in range(4)]
        )
    cpu_images, cpu_masks = seg_epoch(
        seg_loader(imgs, lbls, batch_size=4, mode="eval", size=(32, 48))
    )
    gpu_images, gpu_masks = seg_epoch(
        seg_loader(imgs, lbls, batch_size=4, mode="eval", size=(32, 48), device_id=0)
    )
    assert gpu_images.device.type == "cuda" and gpu_masks.dtype == cpu_masks.dtype
    assert torch.equal(cpu_masks, gpu_masks.cpu())
    diff = (cpu_images - gpu_images.cpu()).abs()
    if kind == "rgb8":
        # The CPU pipeline resizes 8-bit images with torch and keeps them 8-bit (rounded), the GPU one with DALI's
        # Resize in float: a level of the input apart at most, a quarter of one on average (rounding's own share).
        levels = diff * torch.tensor(pipelines.IMAGENET_STD).view(1, 3, 1, 1)
        assert levels.max() <= 1.001 and levels.mean() < 0.4
    else:
        # both resized by DALI, rounding differently: about 1 / 1150 for a 0..4000 uint16 image normalized by its std
        assert diff.max() < 3e-3


@gpu
def test_gpu_segmentation_train_alignment(seg_files):
    loader = seg_loader(
        *seg_files,
        batch_size=5,
        mode="train",
        size=(SEG_H, SEG_W),
        device_id=0,
        **dict(NO_AUGMENT, flip_p=0.5),
    )
    images, masks = seg_epoch(loader)
    assert sorted(sample_ids(images)) == list(range(SEG_N))
    raw = unnormalize(images)
    np.testing.assert_allclose(raw[..., 0], masks[:, 0].cpu().numpy() * 100.0, atol=1e-3)


@gpu
def test_gpu_augmentations_touch_only_the_samples_that_draw_them(seg_files):
    imgs, lbls = [p * 4 for p in seg_files]
    kwargs = dict(batch_size=40, mode="train", size=(SEG_H, SEG_W), device_id=0, seed=4)
    base, base_masks = seg_epoch(seg_loader(imgs, lbls, **kwargs, **NO_AUGMENT))
    for augmentation in ("noise_p", "blur_p", "brightness_p", "contrast_p"):
        images, masks = seg_epoch(
            seg_loader(imgs, lbls, **kwargs, **dict(NO_AUGMENT, **{augmentation: 0.5}))
        )
        changed = (images - base).abs().amax(dim=(1, 2, 3)) > 1e-3
        assert 0 < changed.sum() < 40, augmentation
        assert torch.equal(images[~changed], base[~changed]) and torch.equal(masks, base_masks)


@gpu
def test_gpu_and_cpu_leave_exif_orientation_alone(tmp_path):
    exif_rotated(tmp_path / "exif" / "c" / "a.jpg")
    cpu, gpu_ = (
        unnormalize(
            next(
                iter(
                    classify_iterator(
                        ClassifyValPipeline(
                            1, 1, device_id, str(tmp_path / "exif"), crop_size=48, resize_size=48
                        )
                    )
                )
            )[0]["data"]
        )[0]
        for device_id in (None, 0)
    )
    assert cpu.shape == gpu_.shape == (48, 48, 3) and np.abs(cpu - gpu_).mean() < 2
    assert (
        gpu_[:, :8, 0].mean() > 200 and gpu_[:, -8:, 2].mean() > 200
    )  # red left, blue right: not turned


@gpu
def test_gpu_decoder_cache_gives_the_batches_of_the_same_pipeline_without_it(texture_folder):
    """Whole images decoded into DALI's GPU cache, then cropped on the GPU: over 2.5 epochs (the first fills the
    cache, the next find every image there) the batches are bit for bit those of the same pipeline with no cache."""

    def batches(cache):  # 12 images in batches of 2: 6 a epoch
        return first_batches(
            classify_iterator(
                ClassifyTrainPipeline(
                    2, 2, 0, str(texture_folder), crop_size=24, seed=3, decoder_cache=cache
                )
            ),
            15,
        )

    plain, cached = batches(0), batches(64)
    assert plain[0][0].shape == (2, 3, 24, 24) and same_batches(plain, cached)
    assert not same_batches(
        plain,
        first_batches(
            classify_iterator(
                ClassifyTrainPipeline(  # the crop-decode path
                    2, 2, 0, str(texture_folder), crop_size=24, seed=3
                )
            ),
            15,
        ),
    )


@gpu
@pytest.mark.parametrize("cache", [None, 64])
@pytest.mark.parametrize("policy", POLICIES)
def test_gpu_auto_augment_changes_images_within_uint8_images(texture_folder, policy, cache):
    check_auto_augment(texture_folder, policy, device_id=0, decoder_cache=cache)


@gpu
@pytest.mark.parametrize("auto_augment", [None, "ta_wide"])
def test_gpu_decoder_cache_resumes_from_a_checkpoint_with_the_same_batches(
    texture_folder, auto_augment
):
    def loader(**kwargs):
        return classify_iterator(
            ClassifyTrainPipeline(
                2,
                2,
                0,
                str(texture_folder),
                crop_size=24,
                seed=5,
                decoder_cache=64,
                auto_augment=auto_augment,
                enable_checkpointing=True,
                **kwargs,
            )
        )

    it = loader()
    first_batches(it, 8)  # into the second epoch: the cache holds every image
    checkpoint = it.checkpoints()[0]
    assert same_batches(first_batches(it, 7), first_batches(loader(checkpoint=checkpoint), 7))


@gpu
def test_gpu_cached_validation_sees_every_sample_once_per_epoch_on_two_shards(solid_folder):
    loaders = [
        classify_iterator(
            ClassifyValPipeline(
                4, 1, 0, str(solid_folder), crop_size=24, shard_id=s, num_shards=2, decoder_cache=64
            )
        )
        for s in range(2)
    ]
    for _ in range(3):  # the first epoch fills the caches; each shard keeps its own samples
        seen = [sample for it in loaders for batch in it for sample in identities(batch[0]["data"])]
        assert sorted(seen) == EVERYTHING


# The decoder cache on every local layout: DALI's shard readers cannot reshuffle their shards while
# each process keeps its own (stick_to_shard), and its TFRecord reader cannot skip cached images.


def cached_layout(split_root, layout):
    return split_root if layout == "folder" else to_shards(split_root, layout)


@gpu
@pytest.mark.parametrize("layout", ["folder", *FORMATS])
def test_gpu_decoder_cache_on_every_layout_gives_the_uncached_training_batches(split_root, layout):
    """Two shards of 21 images, batch 4: 3 batches an epoch each. Over 2.7 epochs (the first fills
    the cache) the batches are bit for bit those of the same pipeline without a cache, and each
    epoch the two shards together see every image."""
    root = cached_layout(split_root, layout) / "train"

    def batches(cache, shard):
        pipe = ClassifyTrainPipeline(
            4,
            2,
            0,
            str(root),
            crop_size=24,
            seed=3,
            shard_id=shard,
            num_shards=2,
            decoder_cache=cache,
        )
        return first_batches(classify_iterator(pipe), 9)

    runs = [(batches(0, shard), batches(64, shard)) for shard in range(2)]
    for plain, cached in runs:
        assert plain[0][0].shape == (4, 3, 24, 24) and same_batches(plain, cached)
    everything = {(c, i) for c in range(len(CLASSES)) for i in range(PER_CLASS)}
    for epoch in range(3):
        seen = [
            x
            for _, cached in runs
            for data, _ in cached[3 * epoch : 3 * epoch + 3]
            for x in identities(data)
        ]
        assert set(seen) == everything and len(seen) == 24


@gpu
@pytest.mark.parametrize("layout", ["folder", *FORMATS])
def test_gpu_cached_validation_on_every_layout_is_uncached_and_sees_every_sample_once(
    split_root, layout
):
    """One shard: over 3 epochs (the first fills the cache) the batches are bit for bit those
    without a cache. Two shards, each keeping its own samples: every sample once an epoch."""
    root = cached_layout(split_root, layout) / "val"

    def loaders(cache, num_shards):
        return [
            classify_iterator(
                ClassifyValPipeline(
                    3,
                    1,
                    0,
                    str(root),
                    classes=sorted(CLASSES),
                    crop_size=24,
                    shard_id=s,
                    num_shards=num_shards,
                    decoder_cache=cache,
                )
            )
            for s in range(num_shards)
        ]

    def epoch(its):
        return [(b[0]["data"].cpu(), b[0]["label"].cpu()) for it in its for b in it]

    plain, cached, two_shards = loaders(None, 1), loaders(64, 1), loaders(64, 2)
    for _ in range(3):
        assert same_batches(epoch(plain), epoch(cached))
        seen = [x for data, _ in epoch(two_shards) for x in identities(data)]
        assert sorted(seen) == [(0, 0), (0, 1), (2, 0), (2, 1)]


@gpu
@pytest.mark.parametrize("layout", ["folder", *FORMATS])
def test_gpu_cached_training_resumes_mid_epoch_on_every_layout(split_root, layout):
    root = cached_layout(split_root, layout) / "train"

    def loader(**kwargs):
        return classify_iterator(
            ClassifyTrainPipeline(
                4,
                2,
                0,
                str(root),
                crop_size=24,
                seed=5,
                decoder_cache=64,
                enable_checkpointing=True,
                **kwargs,
            )
        )

    it = loader()
    first_batches(it, 8)  # 6 batches an epoch: into the second, the cache holding every image
    checkpoint = it.checkpoints()[0]
    assert same_batches(first_batches(it, 7), first_batches(loader(checkpoint=checkpoint), 7))
