# Archived probe: ran at commit 09a5f6a (its bench.py and pipelines.py are those of 9e73d43) against that commit's
# bench.py and pipelines.py; kept as a record, not maintained.
# To rerun: git checkout 09a5f6a.
"""Issue 13 probe on one H200 (16 cores): do the CPU-only pipelines' torch calls (resize_with_torch on a pool of
16 threads) lose to torch's own intra-op threads, each pool thread's call starting its own team? Pipeline.run()
img/s at 16 threads of the CPU-only ClassifyTrainPipeline (batch 256) and SegmentTrainPipeline (batch 32, every
augmentation), with resize_with_torch as it is and with its flip and copy done by NumPy (single-threaded) instead
of torch, in turn, twice. Run it once as is and once with OMP_NUM_THREADS=1 (every torch call single-threaded).

    python3 results/h200-2026-11-29e/omp.py
    OMP_NUM_THREADS=1 python3 results/h200-2026-11-29e/omp.py
"""
import gc, os, sys, time
sys.path.insert(0, ".")
import numpy as np
import torch
import bench
import pipelines
from pipelines import ClassifyTrainPipeline, SegmentTrainPipeline

args = bench.parse_args("--workers 16 --seg-samples 1024".split())
args.gpu = False
jpegs, _ = bench.jpeg_set(args)
imgs, lbls = bench.seg_set(args)
as_is = pipelines.resize_with_torch


def numpy_flip(pool, size, antialias, images, flips=None):
    def resize(job):
        image, flip = job
        out = torch.nn.functional.interpolate(torch.from_numpy(image).permute(2, 0, 1)[None], size=size,
                                              mode="bilinear", antialias=antialias)[0].numpy()
        if flip[0]:
            out = out[:, ::-1]
        if flip[1]:
            out = out[:, :, ::-1]
        return np.ascontiguousarray(out)
    return list(pool.map(resize, zip(images, flips if flips is not None else [(0, 0)] * len(images))))


def rate(make, seconds=3):
    pipe = make()
    pipe.build()
    for _ in range(3):
        pipe.run()
    n, t = 0, time.perf_counter()
    while time.perf_counter() - t < seconds:
        pipe.run(); n += pipe.max_batch_size
    r = n / (time.perf_counter() - t)
    del pipe; gc.collect()
    return r


print(f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')} torch.get_num_threads()={torch.get_num_threads()}",
      flush=True)
for rnd in range(2):
    for name, fn in (("as is", as_is), ("numpy flip", numpy_flip)):
        pipelines.resize_with_torch = fn
        c = rate(lambda: ClassifyTrainPipeline(256, 16, None, jpegs, seed=0))
        s = rate(lambda: SegmentTrainPipeline(32, 16, None, imgs, lbls, size=(384, 384), seed=0))
        print(f"round {rnd} {name:<11} classification {c:7.0f} img/s   segmentation {s:7.0f} img/s", flush=True)
