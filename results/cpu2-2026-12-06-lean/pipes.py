"""pipes.py ROOT OUT.json [--only SUBSTRING ...] [--data DIR]

Imports ROOT's pipelines.py (ROOT first on sys.path), builds tiny deterministic data once (in a
fixed folder, /tmp/dali-compare-data by default; rebuilt byte-for-byte from a fixed RNG if absent),
runs every configuration below on the CPU (device_id=None, num_threads=2, fixed seed) through the
project's own iterators, and writes, per configuration and in order, each output tensor's sha256,
shape and dtype, plus the public attributes a trainer reads. A configuration that raises is recorded
as {"error": ...} and the run goes on.

Data are built with NumPy and PIL only (not ROOT's code), so base and main read the same files.
"""

import argparse
import gc
import hashlib
import json
import os
import shutil
import sys
import time
import traceback

import warnings

import numpy as np

warnings.filterwarnings("ignore", category=DeprecationWarning)

BATCH = 4
THREADS = 2
SEED = 1234
DATA_VERSION = "v3"


# ------------------------------------------------------------------------------------------
# tiny data
# ------------------------------------------------------------------------------------------

CLASSES = ["zebra", "Apple", "b c"]  # unsorted, mixed case, a space: ImageFolder's order matters
PER_CLASS = 12


def textured(rng, h, w, channels=3):
    """A smooth gradient plus noise: resizes and crops change it visibly, JPEG keeps it lively."""
    y, x = np.meshgrid(np.linspace(0, 1, h), np.linspace(0, 1, w), indexing="ij")
    base = np.stack([x * 200, y * 200, (x + y) * 100][:channels], -1)
    noise = rng.integers(0, 56, size=(h, w, channels))
    return np.clip(base + noise, 0, 255).astype(np.uint8)


def build_classify(root, rng):
    from PIL import Image

    folder = os.path.join(root, "classify")
    lines = []
    for c, name in enumerate(CLASSES):
        os.makedirs(os.path.join(folder, name))
        for i in range(PER_CLASS):
            h, w = 40 + 7 * ((i * 5 + c) % 9), 48 + 9 * ((i * 3 + 2 * c) % 8)
            pixels = textured(rng, h, w)
            if i % 3 == 2:  # some greyscale files, decoded to RGB
                img = Image.fromarray(pixels[..., 0], "L")
            else:
                img = Image.fromarray(pixels)
            ext = "jpg" if i % 2 else "png"
            rel = os.path.join(name, f"img{i:02d}.{ext}")
            if ext == "jpg":
                img.save(os.path.join(folder, rel), quality=90)
            else:
                img.save(os.path.join(folder, rel))
            lines.append(f"{rel} {sorted(CLASSES).index(name)}")
    # a DALI file list: relative path and label, a subset in its own order
    with open(os.path.join(root, "file_list.txt"), "w") as f:
        f.write("\n".join(lines[::-1][:30]) + "\n")
    # repeated augmentation (ra_reps) keeps len // 256 * 256 samples: a set of 264 tiny images
    for c, name in enumerate(CLASSES):
        os.makedirs(os.path.join(root, "classify_ra", name))
        for i in range(88):
            h, w = 20 + (i * 7 + c) % 13, 20 + (i * 5 + 2 * c) % 11
            Image.fromarray(textured(rng, h, w)).save(
                os.path.join(root, "classify_ra", name, f"r{i:03d}.png"))


SEG_N = 10


def seg_shape(k):
    return 24 + 4 * (k % 4), 32 + 6 * (k % 3)


def seg_mask(rng, k, h, w):
    mask = np.zeros((h, w), np.uint8)
    mask[2 + k % 5 : h // 2 + 3, 3 : 6 + 2 * k] = 1
    mask[h // 2 + 4 : h - 2, w // 2 + k % 7 : w - 1] = 2
    mask[rng.integers(0, h, 5), rng.integers(0, w, 5)] = 3
    return mask


def build_segment(root, rng):
    sets = {name: ([], []) for name in ("u8", "hw_masks", "i64", "grey", "grey_hw", "f32", "u16")}

    def save(name, k, image, mask):
        d = os.path.join(root, "seg", name)
        os.makedirs(os.path.join(d, "images"), exist_ok=True)
        os.makedirs(os.path.join(d, "masks"), exist_ok=True)
        ip, mp = os.path.join(d, "images", f"s{k}.npy"), os.path.join(d, "masks", f"s{k}.npy")
        np.save(ip, image)
        np.save(mp, mask)
        sets[name][0].append(ip)
        sets[name][1].append(mp)

    for k in range(SEG_N):
        h, w = seg_shape(k)
        mask = seg_mask(rng, k, h, w)
        image = textured(rng, h, w)
        image[..., 0] = np.where(mask > 0, mask * 60, image[..., 0])
        save("u8", k, image, mask[..., None])
        save("hw_masks", k, image, mask)
        save("i64", k, image, mask[..., None].astype(np.int64) * 7)  # classes 0..21, np.argmax type
        save("grey", k, image[..., :1].copy(), mask[..., None])
        save("grey_hw", k, image[..., 0].copy(), mask)
        f32 = image.astype(np.float32) / 255.0 + rng.normal(0, 0.01, image.shape).astype(np.float32)
        save("f32", k, f32, mask[..., None])
        save("u16", k, image[..., 0].astype(np.uint16) * 200, mask[..., None])
    with open(os.path.join(root, "seg", "sets.json"), "w") as f:
        json.dump({k: [[os.path.relpath(p, root) for p in v[0]],
                       [os.path.relpath(p, root) for p in v[1]]] for k, v in sets.items()}, f)


def build_predict(root, rng):
    from PIL import Image

    folder = os.path.join(root, "predict")
    os.makedirs(os.path.join(folder, "sub"))
    names = []
    for k in range(9):
        h, w = 30 + 11 * k, 50 - 3 * k
        pixels = textured(rng, h, w)
        sub = "sub" if k % 3 == 0 else ""
        grey, ext = (k % 4) in (1, 3), "png" if (k % 4) < 2 else "jpg"  # RGB/grey, PNG/JPEG
        img = Image.fromarray(pixels[..., 1], "L") if grey else Image.fromarray(pixels)
        rel = os.path.join(sub, f"p{k}.{ext}")
        img.save(os.path.join(folder, rel), **({"quality": 85} if ext == "jpg" else {}))
        names.append(rel)
    with open(os.path.join(root, "predict_files.json"), "w") as f:
        json.dump(names, f)


def build_data(root):
    """The data, built once at ``root`` (a tmp folder renamed into place); its files' digest."""
    stamp = os.path.join(root, f"complete-{DATA_VERSION}")
    if not os.path.exists(stamp):
        tmp = f"{root}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
        rng = np.random.default_rng(20240611)
        build_classify(tmp, rng)
        build_segment(tmp, rng)
        build_predict(tmp, rng)
        open(os.path.join(tmp, f"complete-{DATA_VERSION}"), "w").close()
        shutil.rmtree(root, ignore_errors=True)
        os.rename(tmp, root)
    digest = hashlib.sha256()
    for dirpath, dirnames, filenames in sorted(os.walk(root)):
        dirnames.sort()
        for name in sorted(filenames):
            path = os.path.join(dirpath, name)
            digest.update(os.path.relpath(path, root).encode())
            with open(path, "rb") as f:
                digest.update(f.read())
    return digest.hexdigest()


# ------------------------------------------------------------------------------------------
# recording
# ------------------------------------------------------------------------------------------


def tensor_record(t):
    import torch

    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
        raw = t.view(torch.int16).numpy().tobytes()
    else:
        raw = t.numpy().tobytes()
    return {"sha256": hashlib.sha256(raw).hexdigest(), "shape": list(t.shape),
            "dtype": str(t.dtype)}


def batch_record(batch):
    """One iterator step: ``batch`` is DALI's list (one entry per device) of {name: tensor}."""
    out = []
    for per_device in batch:
        out.append({name: tensor_record(per_device[name]) for name in sorted(per_device)})
    return out


def plain(value, root):
    """A JSON-able, machine-independent form of an attribute's value."""
    if value is None or isinstance(value, (bool, int, str)):
        if isinstance(value, str) and value.startswith(root):
            return "<DATA>/" + os.path.relpath(value, root)
        return value
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, (list, tuple)):
        return [plain(v, root) for v in value]
    if isinstance(value, dict):
        return {str(k): plain(v, root) for k, v in value.items()}
    return f"<{type(value).__name__}>{value}"


MISSING = "<missing>"


def attributes(obj, names, root):
    out = {}
    for name in names:
        try:
            target = obj
            for part in name.split("."):
                target = getattr(target, part)
            out[name] = plain(target, root)
        except AttributeError:
            out[name] = MISSING
        except Exception as e:  # noqa: BLE001
            out[name] = f"<error {type(e).__name__}: {e}>"
    return out


CLASSIFY_ATTRS = ["layout", "classes", "num_classes", "num_samples", "files", "output_layout",
                  "num_shards", "max_batch_size", "read.data_dir", "read.epoch",
                  "read.ra.steps", "read.ra.batch_size", "last_batch_policy"]
SEGMENT_ATTRS = ["channels", "own_size_masks", "last_batch_policy", "max_batch_size"]
PREDICT_ATTRS = ["channels", "files", "layout", "last_batch_policy", "max_batch_size"]


def run_batches(it, epochs=None, batches=None):
    """Records of ``epochs`` whole epochs (auto_reset iterators), or of the next ``batches``."""
    records = []
    if batches is not None:
        while len(records) < batches:
            got = False
            for batch in it:
                got = True
                records.append(batch_record(batch))
                if len(records) == batches:
                    break
            if not got:
                break
        return records
    per_epoch = []
    for _ in range(epochs):
        n = 0
        for batch in it:
            records.append(batch_record(batch))
            n += 1
        per_epoch.append(n)
    return {"batches_per_epoch": per_epoch, "batches": records}


# ------------------------------------------------------------------------------------------
# configurations
# ------------------------------------------------------------------------------------------


def configurations(P, data):
    """(name, function returning a dict) for every configuration; ``P`` is ROOT's pipelines."""
    cls_dir = os.path.join(data, "classify")
    file_list = os.path.join(data, "file_list.txt")
    with open(os.path.join(data, "seg", "sets.json")) as f:
        seg_sets = {k: [[os.path.join(data, p) for p in v[0]], [os.path.join(data, p) for p in v[1]]]
                    for k, v in json.load(f).items()}
    with open(os.path.join(data, "predict_files.json")) as f:
        predict_files = [os.path.join(data, "predict", p) for p in json.load(f)]
    configs = []

    def classify(name, pipeline="train", epochs=2, **kwargs):
        def run():
            cls = P.ClassifyTrainPipeline if pipeline == "train" else P.ClassifyValPipeline
            kw = dict(seed=SEED, **kwargs)
            if "classes_from_train" in kw:
                del kw["classes_from_train"]
                train = P.ClassifyTrainPipeline(BATCH, THREADS, None, cls_dir, seed=SEED)
                kw["classes"] = train.classes
                del train
            pipe = cls(BATCH, THREADS, None, kw.pop("data_dir", cls_dir), **kw)
            it = P.classify_iterator(pipe)
            out = {"attrs": attributes(pipe, CLASSIFY_ATTRS, data), "len": safe_len(it)}
            out.update(run_batches(it, epochs=epochs))
            return out

        configs.append((f"classify/{pipeline}/{name}", run))

    classify("defaults")
    classify("hwc", output_layout="HWC")
    classify("float16", dtype="float16")
    classify("random_erase0.5", random_erase=0.5)
    classify("random_erase0.5_float16", random_erase=0.5, dtype="float16")
    classify("random_erase1.0_hwc_crop48", random_erase=1.0, output_layout="HWC", crop_size=48)
    for policy in sorted(P.AUTO_AUGMENT):
        classify(f"auto_augment_{policy}", auto_augment=policy, crop_size=64)
    classify("auto_augment_ta_wide_default_crop", auto_augment="ta_wide")
    classify("auto_augment_ra_erase_fp16_hwc", auto_augment="ra", crop_size=64,
             random_erase=0.5, dtype="float16", output_layout="HWC")
    classify("progressive", crop_size=96, crop_sizes=lambda e: [64, 96][min(e, 1)], epochs=3)
    classify("progressive_hwc_fp16", crop_size=96, crop_sizes=lambda e: [64, 96][min(e, 1)],
             output_layout="HWC", dtype="float16")
    ra_dir = os.path.join(data, "classify_ra")  # 264 images: RASampler keeps 256 of them
    classify("ra_reps3", ra_reps=3, ra_seed=5, crop_size=32, data_dir=ra_dir)
    classify("ra_reps3_shard1of2", ra_reps=3, ra_seed=5, crop_size=32, shard_id=1, num_shards=2,
             data_dir=ra_dir)
    classify("ra_reps2_progressive", ra_reps=2, ra_seed=9, crop_size=32, data_dir=ra_dir,
             crop_sizes=lambda e: [24, 32][min(e, 1)])
    classify("crop64_area_aspect", crop_size=64, random_area=(0.25, 1.0),
             random_aspect_ratio=(0.5, 2.0))
    classify("file_list", crop_size=64, data_dir=cls_dir, file_list=file_list)
    classify("shard1of2", shard_id=1, num_shards=2, crop_size=64)
    classify("shard0of2", shard_id=0, num_shards=2, crop_size=64)
    classify("decoder_cpu", decoder="cpu", crop_size=64)
    classify("label_offset_num_classes", crop_size=64, num_classes=5)
    classify("prefetch1_batch_seed", crop_size=64, prefetch_queue_depth=1)

    classify("defaults_classes_from_train", pipeline="val", classes_from_train=True)
    classify("defaults", pipeline="val")
    classify("resize80_crop64", pipeline="val", resize_size=80, crop_size=64,
             classes_from_train=True)
    classify("hwc", pipeline="val", output_layout="HWC", resize_size=80, crop_size=64)
    classify("float16", pipeline="val", dtype="float16", resize_size=80, crop_size=64)
    classify("shard1of2", pipeline="val", shard_id=1, num_shards=2, resize_size=80, crop_size=64)
    classify("file_list", pipeline="val", data_dir=cls_dir, file_list=file_list, resize_size=80,
             crop_size=64)

    small = dict(size=(40, 56))

    def segment(name, mode, via, data_set="u8", epochs=2, **kwargs):
        def run():
            imgs, lbls = seg_sets[data_set]
            kw = dict(seed=SEED, **kwargs)
            if via == "fetch":
                pipe = P.fetch_dali_loader(imgs, lbls, BATCH, mode, device_id=None,
                                           num_threads=THREADS, **kw)
            else:
                cls = P.SegmentTrainPipeline if mode == "train" else P.SegmentValPipeline
                pipe = cls(BATCH, THREADS, None, imgs, lbls, **kw)
            it = P.segment_iterator(pipe)
            out = {"attrs": attributes(pipe, SEGMENT_ATTRS, data), "len": safe_len(it)}
            out.update(run_batches(it, epochs=epochs))
            return out

        configs.append((f"segment/{mode}/{via}/{name}", run))

    no_aug = dict(noise_p=0.0, blur_p=0.0, brightness_p=0.0, contrast_p=0.0)
    all_on = dict(flip_p=1.0, noise_p=1.0, blur_p=1.0, brightness_p=1.0, contrast_p=1.0)
    for via in ("fetch", "direct"):
        segment("defaults", "train", via)
        segment("scale_range", "train", via, scale_range=(0.5, 2.0), **small)
        segment("scale_range_mask_pad255", "train", via, scale_range=(0.5, 2.0), mask_pad=255,
                **small)
        segment("int64_masks", "train", via, data_set="i64", **small)
        segment("int64_masks_scale_pad", "train", via, data_set="i64", scale_range=(0.7, 1.5),
                mask_pad=-1, **small)
        segment("hw_masks", "train", via, data_set="hw_masks", **small)
        segment("greyscale", "train", via, data_set="grey", **small)
        segment("greyscale_hw", "train", via, data_set="grey_hw", **small)
        segment("float32", "train", via, data_set="f32", **small)
        segment("uint16", "train", via, data_set="u16", **small)
        segment("mean_std", "train", via, mean=(100.0, 110.0, 120.0), std=(50.0, 60.0, 70.0),
                **small)
        segment("mean_std_scalar_grey", "train", via, data_set="grey", mean=90.0, std=40.0, **small)
        segment("flips_only", "train", via, **no_aug, **small)
        segment("all_p1", "train", via, **all_on, **small)
        segment("all_p1_scale", "train", via, **all_on, scale_range=(0.5, 2.0), **small)
        segment("all_p1_float32", "train", via, data_set="f32", **all_on, **small)
        # 160x160x3 > NOISE_CHUNK elements: the CPU noise is drawn in several chunks
        segment("all_p1_size160", "train", via, **all_on, size=160)
        segment("ranges", "train", via, noise_p=0.5, noise_std=(0.1, 0.2), blur_p=0.5,
                blur_sigma=(0.3, 0.9), brightness_p=0.5, brightness=(0.5, 1.5), contrast_p=0.5,
                contrast=(0.8, 1.2), **small)
        segment("shard1of2", "train", via, shard_id=1, num_shards=2, **small)
        segment("scale_fixed1", "train", via, scale_range=(1.0, 1.0), **small)

        segment("defaults", "eval", via)
        segment("own_size_masks", "eval", via, own_size_masks=True, **small)
        segment("greyscale", "eval", via, data_set="grey", **small)
        segment("greyscale_hw_own", "eval", via, data_set="grey_hw", own_size_masks=True, **small)
        segment("float32", "eval", via, data_set="f32", **small)
        segment("uint16", "eval", via, data_set="u16", **small)
        segment("int64_masks", "eval", via, data_set="i64", **small)
        segment("int64_masks_own", "eval", via, data_set="i64", own_size_masks=True, **small)
        segment("hw_masks", "eval", via, data_set="hw_masks", **small)
        segment("mean_std", "eval", via, mean=(100.0, 110.0, 120.0), std=(50.0, 60.0, 70.0),
                **small)
        segment("shard1of2", "eval", via, shard_id=1, num_shards=2, **small)
    segment("defaults", "test", "fetch", **small)
    segment("writeup_keys", "train", "fetch", num_workers=3, gpus=1, dim=2, oversampling=0.4,
            **small)

    def predict(name, files=predict_files, **kwargs):
        def run():
            pipe = P.SegmentPredictPipeline(BATCH, THREADS, None, os.path.join(data, "predict"),
                                            files, **kwargs)
            it = P.predict_iterator(pipe)
            out = {"attrs": attributes(pipe, PREDICT_ATTRS, data), "len": safe_len(it)}
            out.update(run_batches(it, epochs=1))
            return out

        configs.append((f"predict/{name}", run))

    predict("defaults_rgb")
    predict("grey", channels=1)
    predict("rgb_small", size=(40, 56))
    predict("grey_small", channels=1, size=48)
    predict("shard1of2", size=32, shard_id=1, num_shards=2)

    # checkpoint round trips
    def checkpoint(name, build, iterator):
        def run():
            first = iterator(build(enable_checkpointing=True))
            before = run_batches(first, batches=3)
            ckpt = first.checkpoints()[0]
            continued = run_batches(first, batches=3)
            resumed = run_batches(iterator(build(enable_checkpointing=True, checkpoint=ckpt)),
                                  batches=3)
            return {"before": before, "resumed": resumed,
                    "resumed_equals_continued": resumed == continued,
                    "checkpoint_type": type(ckpt).__name__}

        configs.append((f"checkpoint/{name}", run))

    checkpoint(
        "classify_train",
        lambda **kw: P.ClassifyTrainPipeline(BATCH, THREADS, None, cls_dir, seed=SEED,
                                             crop_size=64, random_erase=0.5, **kw),
        P.classify_iterator)
    checkpoint(
        "classify_train_auto_augment_progressive",
        lambda **kw: P.ClassifyTrainPipeline(BATCH, THREADS, None, cls_dir, seed=SEED,
                                             crop_size=64, auto_augment="ra",
                                             crop_sizes=lambda e: [48, 64][min(e, 1)], **kw),
        P.classify_iterator)
    checkpoint(
        "segment_train",
        lambda **kw: P.SegmentTrainPipeline(BATCH, THREADS, None, *seg_sets["u8"], seed=SEED,
                                            noise_p=0.5, blur_p=0.5, scale_range=(0.5, 2.0),
                                            **small, **kw),
        P.segment_iterator)
    checkpoint(
        "segment_train_fetch",
        lambda **kw: P.fetch_dali_loader(*seg_sets["u8"], BATCH, "train", device_id=None,
                                         num_threads=THREADS, seed=SEED, **small, **kw),
        P.segment_iterator)
    return configs


def safe_len(it):
    try:
        return len(it)
    except Exception as e:  # noqa: BLE001
        return f"<error {type(e).__name__}>"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("root")
    parser.add_argument("out")
    parser.add_argument("--only", nargs="*", default=None, help="substrings of config names")
    parser.add_argument("--data", default="/tmp/dali-compare-data")
    args = parser.parse_args()
    root = os.path.abspath(args.root)
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "DALI_USE_NEW_THREAD_POOL"):
        os.environ.pop(name, None)
    sys.path.insert(0, root)
    sys.dont_write_bytecode = True  # leave ROOT untouched
    os.chdir(root)
    import pipelines as P  # noqa: N812

    assert os.path.dirname(os.path.abspath(P.__file__)) == root, P.__file__
    import torch

    torch.manual_seed(0)
    data = os.path.abspath(args.data)
    digest = build_data(data)
    result = {"data_sha256": digest, "dali": __import__("nvidia.dali").dali.__version__,
              "torch": torch.__version__, "configs": {}}
    errors = 0
    for name, run in configurations(P, data):
        if args.only and not any(s in name for s in args.only):
            continue
        start = time.time()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                result["configs"][name] = run()
            status = "ok"
        except Exception as e:  # noqa: BLE001
            errors += 1
            result["configs"][name] = {"error": f"{type(e).__name__}: {e}".splitlines()[0][:500]}
            status = "ERROR " + result["configs"][name]["error"]
            if os.environ.get("PIPES_TRACEBACK"):
                traceback.print_exc()
        gc.collect()
        print(f"{name}: {status} ({time.time() - start:.1f}s)", flush=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1, sort_keys=True)
    print(f"pipes: {len(result['configs'])} configurations, {errors} errors -> {args.out}")


if __name__ == "__main__":
    main()
