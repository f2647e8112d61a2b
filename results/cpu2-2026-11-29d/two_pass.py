"""CPU resize in two passes (vertical then horizontal, or the reverse, each its own Resize) against one Resize, after the
training pipeline's crop-decode, batch 64, 2 threads; pipeline.run() img/s, twice in turn.

    python results/cpu2-2026-11-29d/two_pass.py one,vfirst,hfirst
"""
import sys, time
from nvidia.dali import pipeline_def, fn, types
import nvidia.dali.math as dmath
import numpy as np
root = ".cache/bench-jpegs/n512-procedural"
import glob
files = sorted(glob.glob(root + "/*/*.jpg"))
@pipeline_def(batch_size=64, num_threads=2, device_id=None, seed=0)
def p(mode):
    jpegs, _ = fn.readers.file(files=files, random_shuffle=True, seed=1)
    img = fn.decoders.image_random_crop(jpegs, device="cpu", random_area=[0.08, 1.0], random_aspect_ratio=[3/4, 4/3], num_attempts=100, seed=3)
    if mode == "one":
        out = fn.resize(img, resize_x=224, resize_y=224, interp_type=types.INTERP_TRIANGULAR, antialias=True)
    elif mode == "vfirst":
        w = fn.cast(fn.shapes(img)[1], dtype=types.FLOAT)
        v = fn.resize(img, resize_x=w, resize_y=224, interp_type=types.INTERP_TRIANGULAR, antialias=True)
        out = fn.resize(v, resize_x=224, resize_y=224, interp_type=types.INTERP_TRIANGULAR, antialias=True)
    else:  # "hfirst"
        h = fn.cast(fn.shapes(img)[0], dtype=types.FLOAT)
        v = fn.resize(img, resize_x=224, resize_y=h, interp_type=types.INTERP_TRIANGULAR, antialias=True)
        out = fn.resize(v, resize_x=224, resize_y=224, interp_type=types.INTERP_TRIANGULAR, antialias=True)
    return fn.crop_mirror_normalize(out, dtype=types.FLOAT, output_layout="CHW", crop=(224, 224), mean=[124., 116., 104.], std=[58., 57., 57.], mirror=fn.random.coin_flip(seed=5)), img
res = {}
for rnd in range(2):
    for mode in sys.argv[1].split(","):
        pp = p(mode); pp.build()
        for _ in range(3): pp.run()
        n, t = 0, time.perf_counter()
        while time.perf_counter() - t < 5:
            o = pp.run(); n += 64
        print(mode, round(n / (time.perf_counter() - t)), flush=True)
