# Archived probe: ran at commit 7ca3136 against that commit's pipelines.py; kept as a record, not maintained.
# To rerun: git checkout 7ca3136.
"""Where DALI's CPU-only segmentation training pipeline spends its time: img/s of Pipeline.run() with one
augmentation at a time (batch 32, 512x512 -> 384x384, 2 threads), over bench.py's .npy pairs.

    python results/cpu2-2026-11-29b/seg_stages.py .cache/bench-seg/n256-512px
"""
import glob, sys, time
sys.path.insert(0, ".")
from nvidia.dali import ops, types
import pipelines
from pipelines import fetch_dali_loader
root = sys.argv[1]
imgs = sorted(glob.glob(f"{root}/Images/*/*.npy")); lbls = sorted(glob.glob(f"{root}/Masks/*/*.npy"))

def rate(pipe, seconds=8):
    pipe.build()
    for _ in range(3): pipe.run()
    n, t = 0, time.perf_counter()
    while time.perf_counter() - t < seconds:
        pipe.run(); n += pipe.max_batch_size
    return n / (time.perf_counter() - t)

common = dict(device_id=None, num_threads=2, size=(384, 384), seed=0)
none = dict(noise_p=0.0, blur_p=0.0, brightness_p=0.0, contrast_p=0.0)
print("val (read, resize, normalize)       %6.0f img/s" % rate(fetch_dali_loader(imgs, lbls, 32, "eval", **common)))
print("train, flips only                   %6.0f img/s" % rate(fetch_dali_loader(imgs, lbls, 32, "train", **common, **none)))
for name in ("noise", "blur", "brightness", "contrast"):
    only = dict(none, **{f"{name}_p": 0.15})
    print(f"train, flips + {name:<10} at p 0.15  %6.0f img/s" % rate(fetch_dali_loader(imgs, lbls, 32, "train", **common, **only)))
print("train, all (the defaults)           %6.0f img/s" % rate(fetch_dali_loader(imgs, lbls, 32, "train", **common)))
