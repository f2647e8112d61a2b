# Archived probe: ran at commit 2231382 against that commit's pipelines.py (also run on 2 cores:
# cpu2-2026-11-29d/conc.log); kept as a record, not maintained. To rerun: git checkout 2231382.
"""Pipeline.run() img/s of the CPU-only segmentation (batch 32) and classification (batch 256) training pipelines,
DALI's default operator concurrency against OperatorConcurrency.FULL (independent operators, and so successive
iterations, may run at once), under DALI's default and its new thread pool (DALI_USE_NEW_THREAD_POOL=1).

    python3 results/h200-2026-11-29d/conc.py THREADS SEG_ROOT JPEG_ROOT SECONDS
"""
import glob, sys, time, os
sys.path.insert(0, ".")
from nvidia.dali.pipeline import OperatorConcurrency
from pipelines import SegmentTrainPipeline, ClassifyTrainPipeline
threads = int(sys.argv[1]); seg_root = sys.argv[2]; jpeg_root = sys.argv[3]; secs = float(sys.argv[4])
imgs = sorted(glob.glob(f"{seg_root}/Images/*/*.npy")); lbls = sorted(glob.glob(f"{seg_root}/Masks/*/*.npy"))
def rate(p):
    p.build()
    for _ in range(5): p.run()
    n, t = 0, time.perf_counter()
    while time.perf_counter() - t < secs:
        p.run(); n += p.max_batch_size
    return round(n / (time.perf_counter() - t))
variants = {"default": {}, "full": dict(exec_dynamic=True, concurrency=OperatorConcurrency.FULL)}
for rnd in range(2):
    for name, kw in variants.items():
        s = rate(SegmentTrainPipeline(32, threads, None, imgs, lbls, size=(384, 384), seed=0, **kw))
        c = rate(ClassifyTrainPipeline(256 if threads > 4 else 64, threads, None, jpeg_root, seed=0, **kw))
        print(f"{os.environ.get('DALI_USE_NEW_THREAD_POOL', '0')} {name:8} seg {s} cls {c}", flush=True)
