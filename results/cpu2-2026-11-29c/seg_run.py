# Archived probe: ran (under perf) between commits ee8ebdf and 0e37295, most likely at dc4b6e1 (not recorded), against
# that commit's pipelines.py, before 0e37295 removed the uint8 mask casts; kept as a record, not maintained.
# To rerun: git checkout dc4b6e1.
"""Pipeline.run() of the CPU-only SegmentTrainPipeline (batch 32, 2 threads) with flips and one augmentation at
p 0.15 (or "flips" alone, or "all"), for perf:  perf record -F 999 -g python results/cpu2-2026-11-29c/seg_run.py brightness
"""
import glob, sys, time
sys.path.insert(0, ".")
from pipelines import SegmentTrainPipeline
root = ".cache/bench-seg/n256-512px"
imgs = sorted(glob.glob(f"{root}/Images/*/*.npy")); lbls = sorted(glob.glob(f"{root}/Masks/*/*.npy"))
aug = dict(noise_p=0.0, blur_p=0.0, brightness_p=0.0, contrast_p=0.0)
if sys.argv[1] != "flips":
    aug[sys.argv[1] + "_p"] = 0.15 if sys.argv[1] != "all" else 0
if sys.argv[1] == "all":
    aug = {}
p = SegmentTrainPipeline(32, 2, None, imgs, lbls, size=(384, 384), seed=0, **aug)
p.build()
for _ in range(5): p.run()
n, t = 0, time.perf_counter()
while time.perf_counter() - t < 8:
    p.run(); n += 32
print(sys.argv[1], n / (time.perf_counter() - t))
