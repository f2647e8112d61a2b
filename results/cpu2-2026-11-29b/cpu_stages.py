# Archived probe: ran at commit 5bb5e7b against that commit's pipelines.py; kept as a record, not maintained.
# To rerun: git checkout 5bb5e7b.
"""Where DALI's CPU-only classification pipeline spends its time, one stage added at a time, and its
resize alone with other settings: img/s of Pipeline.run() over bench.py's JPEGs, batch 64, 2 threads.

    python results/cpu2-2026-11-29b/cpu_stages.py [JPEG tree]   # default: .cache/bench-jpegs/n512-procedural
"""
import sys, time, itertools
sys.path.insert(0, ".")  # run from the project root
from nvidia.dali import ops, types, Pipeline
from pipelines import list_image_folder
root = sys.argv[1] if len(sys.argv) > 1 else ".cache/bench-jpegs/n512-procedural"
files, labels, _ = list_image_folder(root)

class P(Pipeline):
    def __init__(self, stage, dtype=types.FLOAT, interp=types.INTERP_TRIANGULAR, layout="CHW", roi=True):
        super().__init__(64, 2, None, seed=0)
        self.stage = stage
        self.reader = ops.readers.File(files=files, labels=labels, random_shuffle=True)
        self.decode = (ops.decoders.ImageRandomCrop(device="cpu", output_type=types.RGB, random_area=[0.08, 1.0],
                        random_aspect_ratio=[3/4, 4/3], num_attempts=100) if roi else ops.decoders.Image(device="cpu", output_type=types.RGB))
        self.rrc = ops.RandomResizedCrop(device="cpu", size=(224, 224), random_area=[0.08, 1.0]) 
        self.resize = ops.Resize(device="cpu", resize_x=224, resize_y=224, interp_type=interp, antialias=True)
        self.cmn = ops.CropMirrorNormalize(device="cpu", dtype=dtype, output_layout=layout, crop=(224, 224),
                                           mean=[255*m for m in (0.485, 0.456, 0.406)], std=[255*s for s in (0.229, 0.224, 0.225)])
        self.coin = ops.random.CoinFlip(probability=0.5)
    def define_graph(self):
        j, l = self.reader()
        if self.stage == "read":
            return j, l
        x = self.decode(j)
        if self.stage == "decode":
            return x, l
        x = self.rrc(x) if self.stage.startswith("rrc") else self.resize(x)
        if self.stage in ("resize", "rrc"):
            return x, l
        return self.cmn(x, mirror=self.coin()), l

def rate(pipe_class=None, **kw):
    p = (pipe_class or P)(**kw); p.build()
    for _ in range(3): p.run()
    n = 0; t = time.perf_counter()
    while time.perf_counter() - t < 8:
        p.run(); n += 64
    return n / (time.perf_counter() - t)
print('one stage at a time:')
for name, kw in [("read", dict(stage="read")), ("decode roi", dict(stage="decode")), ("decode full", dict(stage="decode", roi=False)),
                 ("roi+resize", dict(stage="resize")), ("full", dict(stage="full")), ("full fp16", dict(stage="full", dtype=types.FLOAT16)),
                 ("full HWC", dict(stage="full", layout="HWC")), ("full linear", dict(stage="full", interp=types.INTERP_LINEAR)),
                 ("full decode + rrc", dict(stage="rrcfull", roi=False)), ("full uint8", dict(stage="full", dtype=types.UINT8))]:
    print(f"{name:<40} {rate(**kw):8.0f} img/s", flush=True)


class ResizeOnly(P):
    """Decode the random crop's window, then only the resize, with the given settings."""
    def __init__(self, **resize_kw):
        super().__init__("resize")
        self.resize = ops.Resize(device="cpu", resize_x=224, resize_y=224, **resize_kw)


print("resize alone after the crop's decode:")
for name, kw in [("triangular, antialias (the pipeline's)", dict(interp_type=types.INTERP_TRIANGULAR, antialias=True)),
                 ("same, minibatch_size 1", dict(interp_type=types.INTERP_TRIANGULAR, antialias=True, minibatch_size=1)),
                 ("linear, antialias", dict(interp_type=types.INTERP_LINEAR, antialias=True)),
                 ("linear, no antialias", dict(interp_type=types.INTERP_LINEAR, antialias=False)),
                 ("nearest neighbour", dict(interp_type=types.INTERP_NN))]:
    print(f"{name:<40} {rate(ResizeOnly, **kw):8.0f} img/s", flush=True)
