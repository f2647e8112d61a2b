# Archived probe: ran at commit f304285 (the log as committed in 2606baf) and again at 4fa0118 (torch_resize.log as it
# is now), against those commits' pipelines.py; kept as a record, not maintained.
# To rerun: git checkout 4fa0118.
"""The CPU-only ClassifyTrainPipeline with its crop resized by DALI's CPU Resize (as before f304285) against torch's
(resize_with_torch, as now): Pipeline.run() img/s, in turn, twice; and how far apart the two pipelines' batches are
(same seed, so the same crops), in 8-bit levels.

    python results/cpu2-2026-11-29d/torch_resize.py THREADS JPEG_DIR BATCH
"""
import sys, time
sys.path.insert(0, ".")
import numpy as np
from nvidia.dali import ops, types
from pipelines import ClassifyTrainPipeline


class DaliResize(ClassifyTrainPipeline):
    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.resize = ops.Resize(device="cpu", resize_x=224, resize_y=224, interp_type=types.INTERP_TRIANGULAR,
                                 antialias=True)


threads, root, bs = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])


def rate(p, secs=5):
    p.build()
    for _ in range(3):
        p.run()
    n, t = 0, time.perf_counter()
    while time.perf_counter() - t < secs:
        p.run(); n += bs
    return round(n / (time.perf_counter() - t))


for rnd in range(2):
    for name, cls in (("dali resize", DaliResize), ("torch resize", ClassifyTrainPipeline)):
        print(name, threads, rate(cls(bs, threads, None, root, seed=0)), flush=True)
a, b = DaliResize(bs, threads, None, root, seed=3), ClassifyTrainPipeline(bs, threads, None, root, seed=3)
a.build(); b.build()
for _ in range(3):
    d = np.abs(np.array(a.run()[0].as_tensor()) - np.array(b.run()[0].as_tensor())) * 58  # ~ back to 8-bit levels
    print("mean |diff| levels", d.mean().round(3), "p99", np.percentile(d, 99).round(2), "max", d.max().round(2))
