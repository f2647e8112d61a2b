"""The cost of a 384x384x3 float32 Gaussian noise field on the CPU: DALI's noise.Gaussian, random.Normal,
random.Uniform, Box-Muller from two half-size uniform fields, and torch.randn_like, per image per thread.

    python results/cpu2-2026-11-29b/noise_cost.py
"""
import time, math, numpy as np
from nvidia.dali import ops, types, Pipeline
import nvidia.dali.math as dmath

class P(Pipeline):
    def __init__(self, kind):
        super().__init__(8, 2, None, seed=0)
        self.kind = kind
        self.src = ops.Constant(fdata=0.0, shape=[384, 384, 3], dtype=types.FLOAT)
        self.gauss = ops.noise.Gaussian(device="cpu")
        self.normal = ops.random.Normal(device="cpu")
        self.uni = ops.random.Uniform(range=[0.0, 1.0])
        self.std = ops.random.Uniform(range=[0.0, 0.33])
    def define_graph(self):
        x = self.src()
        s = self.std()
        if self.kind == "noise.gaussian":
            return self.gauss(x, stddev=s)
        if self.kind == "random.normal":
            return x + self.normal(shape=x.shape(dtype=types.INT32)) * s
        if self.kind == "random.uniform":
            return x + self.uni(shape=x.shape(dtype=types.INT32)) * s
        if self.kind == "box-muller":
            half = types.Constant(np.array([192, 384, 3], np.int32))
            u1 = self.uni(shape=half); u2 = self.uni(shape=half)
            r = dmath.sqrt(-2.0 * dmath.log(1.0 - u1))
            t = 2 * math.pi * u2
            return r * dmath.cos(t) * s, r * dmath.sin(t) * s
        if self.kind == "add only":
            return x * s

for kind in ("noise.gaussian", "random.normal", "random.uniform", "box-muller", "add only"):
    p = P(kind); p.build()
    for _ in range(2): p.run()
    n, t = 0, time.perf_counter()
    while time.perf_counter() - t < 5:
        p.run(); n += 8
    print(f"{kind:<16} {1000 * 2 * (time.perf_counter() - t) / n:6.2f} ms per 384x384x3 image per thread", flush=True)
import torch
torch.set_num_threads(1)
x = torch.zeros(3, 384, 384)
t = time.perf_counter()
for _ in range(50): y = x + torch.randn_like(x) * 0.2
print(f"torch randn_like  {1000 * (time.perf_counter() - t) / 50:6.2f} ms per image, one thread")
