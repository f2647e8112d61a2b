"""One 8-bit RGB image resized on one thread: torch's bilinear resize (antialiased or not) against DALI's CPU Resize
(INTERP_TRIANGULAR antialiased, as the classification crop; INTERP_LINEAR, as segmentation images), ms per image.
DALI's figure is a batch of 32 through a one-thread pipeline, so it carries the pipeline's own overhead too.

    python results/cpu2-2026-11-29d/resize_micro.py
"""
import time
import numpy as np
import torch
import torch.nn.functional as F
from nvidia.dali import fn, pipeline_def, types

torch.set_num_threads(1)
rng = np.random.default_rng(0)
for (h, w), out, antialias in (((330, 330), 224, True), ((449, 450), 224, True), ((150, 120), 224, True),
                               ((512, 512), 384, False)):
    img = rng.integers(0, 255, (h, w, 3), dtype=np.uint8)
    t = torch.from_numpy(img).permute(2, 0, 1)[None]
    for _ in range(5):
        F.interpolate(t, size=(out, out), mode="bilinear", antialias=antialias)
    n, t0 = 200, time.perf_counter()
    for _ in range(n):
        F.interpolate(t, size=(out, out), mode="bilinear", antialias=antialias)
    torch_ms = (time.perf_counter() - t0) / n * 1e3

    @pipeline_def(batch_size=32, num_threads=1, device_id=None)
    def dali_resize():
        images = fn.external_source(source=lambda: [img] * 32, layout="HWC", batch=True)
        return fn.resize(images, size=[out, out], antialias=antialias,
                         interp_type=types.INTERP_TRIANGULAR if antialias else types.INTERP_LINEAR)

    pipe = dali_resize()
    pipe.build()
    for _ in range(3):
        pipe.run()
    n, t0 = 10, time.perf_counter()
    for _ in range(n):
        pipe.run()
    dali_ms = (time.perf_counter() - t0) / n / 32 * 1e3
    print(f"{h}x{w} -> {out}x{out} antialias={antialias}: torch {torch_ms:.3f} ms, DALI {dali_ms:.3f} ms per image")
