# Archived probe: ran at commit dc4b6e1 against that commit's pipelines.py; kept as a record, not maintained. To
# rerun: git checkout dc4b6e1.
"""The CPU segmentation pipeline's torch noise (pipelines.add_gaussian_noise) at other chunk sizes: the function
alone on 5 images of 3x384x384 (a batch of 32 at p 0.15) with a pool of 16 threads, and the pipeline with flips and
noise at 16 threads (Pipeline.run img/s), over bench.py's .npy pairs.

    python3 results/h200-2026-11-29c/noise_pool.py .cache/bench-seg/n1024-512px [threads]
"""
import glob, sys, time
from concurrent.futures import ThreadPoolExecutor
sys.path.insert(0, ".")
import numpy as np
import pipelines
from pipelines import SegmentTrainPipeline, add_gaussian_noise

root = sys.argv[1]
threads = int(sys.argv[2]) if len(sys.argv) > 2 else 16
imgs = sorted(glob.glob(f"{root}/Images/*/*.npy")); lbls = sorted(glob.glob(f"{root}/Masks/*/*.npy"))
images = [np.random.rand(3, 384, 384).astype(np.float32) for _ in range(5)]
stddevs, seeds = [np.float32(0.2)] * 5, [np.float64(1e9 + i) for i in range(5)]
chunks = [("2**16 (default)", 1 << 16), ("2**18", 1 << 18), ("one per sample", 1 << 30)]
for name, chunk in [("one thread, one per sample", 1 << 30)] + chunks:
    pipelines.NOISE_CHUNK = chunk
    pool = ThreadPoolExecutor(1 if name.startswith("one thread") else threads)
    add_gaussian_noise(pool, images, stddevs, seeds)
    t = time.perf_counter()
    for _ in range(40):
        add_gaussian_noise(pool, images, stddevs, seeds)
    print(f"function, chunk {name:<28} {(time.perf_counter() - t) / 40 * 1000:6.2f} ms per 5 images", flush=True)
    pool.shutdown()
for name, chunk in chunks:
    pipelines.NOISE_CHUNK = chunk
    pipe = SegmentTrainPipeline(32, threads, None, imgs, lbls, size=(384, 384), seed=0, noise_p=0.15, blur_p=0.0,
                                brightness_p=0.0, contrast_p=0.0)
    pipe.build()
    for _ in range(5):
        pipe.run()
    n, t = 0, time.perf_counter()
    while time.perf_counter() - t < 5:
        pipe.run(); n += 32
    print(f"pipeline flips + noise, chunk {name:<18} {n / (time.perf_counter() - t):7.0f} img/s", flush=True)
    del pipe
