# Archived probe: ran at commit 4fa0118 against that commit's pipelines.py; kept as a record, not maintained.
# To rerun: git checkout 4fa0118.
"""The CPU-only SegmentTrainPipeline (batch 32, every augmentation) with its 8-bit images resized and flipped by DALI's
CPU Resize (as before this change) against torch's (resize_with_torch, as now): Pipeline.run() img/s, in turn, twice.

    python results/cpu2-2026-11-29d/seg_torch_resize.py THREADS SEG_ROOT
"""
import glob, sys, time
sys.path.insert(0, ".")
from nvidia.dali import ops, types
from pipelines import SegmentTrainPipeline


class DaliResize(SegmentTrainPipeline):
    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.torch_resize = False
        self.resize_image = ops.Resize(device="cpu", size=[384, 384], interp_type=types.INTERP_LINEAR, antialias=False,
                                       roi_relative=True)


threads, root = int(sys.argv[1]), sys.argv[2]
imgs, lbls = sorted(glob.glob(f"{root}/Images/*/*.npy")), sorted(glob.glob(f"{root}/Masks/*/*.npy"))


def rate(p, secs=6):
    p.build()
    for _ in range(5):
        p.run()
    n, t = 0, time.perf_counter()
    while time.perf_counter() - t < secs:
        p.run(); n += 32
    return round(n / (time.perf_counter() - t))


for rnd in range(2):
    for name, cls in (("dali resize", DaliResize), ("torch resize", SegmentTrainPipeline)):
        print(name, threads, rate(cls(32, threads, None, imgs, lbls, size=(384, 384), seed=0)), flush=True)
