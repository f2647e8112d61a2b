# Archived probe: ran (under perf) between commits ee8ebdf and 0e37295, most likely at dc4b6e1 (not recorded), against
# that commit's pipelines.py, before 0e37295 removed the uint8 mask casts; kept as a record, not maintained.
# To rerun: git checkout dc4b6e1.
"""Pipeline.run() of the CPU-only ClassifyTrainPipeline (batch 64, 2 threads), for perf:
    perf record -F 999 -g python results/cpu2-2026-11-29c/cls_run.py
"""
import sys, time
sys.path.insert(0, ".")
from pipelines import ClassifyTrainPipeline
p = ClassifyTrainPipeline(64, 2, None, ".cache/bench-jpegs/n512-procedural", seed=0)
p.build()
for _ in range(3): p.run()
n, t = 0, time.perf_counter()
while time.perf_counter() - t < 8:
    p.run(); n += 64
print("cls", n / (time.perf_counter() - t))
