# Archived probe: this version ran at commit 9dc1999 (callD.sh, callE.sh) against that commit's bench.py and pipelines.py;
# an earlier version (no faults or CPU time, no RESIZE) ran at 09a5f6a (callA.sh) and 9dc1999 (callC.sh); kept as a
# record, not maintained. To rerun: git checkout 9dc1999.
"""Issue 13 probe: where the CPU-only classification pipeline stops scaling past a few cores.

Pipeline.run() img/s of the CPU-only training pipeline cut after each stage (read; read + crop-decode; + torch's
resize; + CropMirrorNormalize = ClassifyTrainPipeline as it is), the full decode for comparison, DALI's resize in
place of torch's, and the whole loader as bench.py times it (classify_iterator, then .to(device)). Batch 256 of
bench.py's JPEGs, ``threads`` DALI threads; run it under ``taskset -c 0-(threads-1)`` so cores = threads.

    for t in 2 4 8 16; do taskset -c 0-$((t-1)) python3 results/h200-2026-11-29f/stages.py $t; done
    python3 results/h200-2026-11-29f/stages.py 16 full     # one variant (for a profiler)
    RESIZE=before python3 results/h200-2026-11-29f/stages.py 16 full    # resize_with_torch as at 09a5f6a

stages.log, stages-after.log and the py-spy summaries come from this script before it printed faults and CPU time
per image and had RESIZE; stages-cpu.log and ab.log from it as it is (callA.sh .. callE.sh, in that order).
"""
import functools, gc, os, resource, sys, time
sys.path.insert(0, ".")
import torch
from nvidia.dali import ops, types
from nvidia.dali.pipeline import Pipeline
import bench
import pipelines
from pipelines import ClassifyTrainPipeline, classify_iterator, list_image_folder, IMAGENET_MEAN, IMAGENET_STD



def resize_before(pool, size, antialias, images, flips=None):
    """resize_with_torch as it was at 09a5f6a (a task per image, five torch calls each), for RESIZE=before."""
    def resize(job):
        image, flip = job
        chw = torch.from_numpy(image).permute(2, 0, 1)[None]
        out = torch.nn.functional.interpolate(chw, size=size, mode="bilinear", antialias=antialias)[0]
        dims = [d for d, f in zip((1, 2), flip) if f]
        return (out.flip(dims) if dims else out).contiguous().numpy()

    return list(pool.map(resize, zip(images, flips if flips is not None else [(0, 0)] * len(images))))


if os.environ.get("RESIZE") == "before":
    pipelines.resize_with_torch = resize_before
threads = int(sys.argv[1])
only = sys.argv[2:]
seconds = float(os.environ.get("SECONDS_PER", 3))
args = bench.parse_args([])
args.workers = 16
root, _ = bench.jpeg_set(args)
files, labels, _ = list_image_folder(root)
device = "cuda" if torch.cuda.is_available() else "cpu"


class Stages(Pipeline):
    def __init__(self, upto, full_decode=False, dali_resize=False):
        super().__init__(256, threads, None, seed=0, **pipelines._executor_args(None, {}))
        self.upto = upto
        self.reader = ops.readers.File(files=files, labels=labels, random_shuffle=True, name="Reader")
        self.decode = (ops.decoders.Image(device="cpu", output_type=types.RGB) if full_decode else
                       ops.decoders.ImageRandomCrop(device="cpu", output_type=types.RGB, random_area=[0.08, 1.0],
                                                    random_aspect_ratio=[3 / 4, 4 / 3], num_attempts=100))
        if dali_resize:  # (RESIZE=before patches pipelines.resize_with_torch, which the else branch reads)
            self.resize = ops.Resize(device="cpu", resize_x=224, resize_y=224, interp_type=types.INTERP_TRIANGULAR,
                                     antialias=True)
        else:
            self.pool = pipelines._torch_pool(threads)
            self.resize = ops.PythonFunction(function=functools.partial(pipelines.resize_with_torch, self.pool,
                                                                        (224, 224), True),
                                             num_outputs=1, batch_processing=True, output_layouts="CHW")

    def define_graph(self):
        jpegs, labels = self.reader()
        if self.upto == "read":
            return jpegs, labels
        images = self.decode(jpegs)
        if self.upto == "decode":
            return images, labels
        return self.resize(images), labels


def rate(make):
    pipe = make()
    pipe.build()
    for _ in range(3):
        pipe.run()
    n, t = 0, time.perf_counter()
    while time.perf_counter() - t < seconds:
        pipe.run(); n += 256
    r = n / (time.perf_counter() - t)
    del pipe; gc.collect()
    return r


def loader_rate():
    it = classify_iterator(ClassifyTrainPipeline(256, threads, None, root, seed=0))
    n, t = 0, None
    while True:
        for b in it:
            x = b[0]["data"].to(device, non_blocking=True); b[0]["label"].to(device, non_blocking=True)
            n += 1
            if n == 3 and t is None:
                torch.cuda.synchronize() if device == "cuda" else None
                t, n = time.perf_counter(), 0
            if t and time.perf_counter() - t > seconds:
                torch.cuda.synchronize() if device == "cuda" else None
                r = n * 256 / (time.perf_counter() - t)
                del it; gc.collect()
                return r


variants = {
    "read": lambda: rate(lambda: Stages("read")),
    "decode": lambda: rate(lambda: Stages("decode")),
    "decode_full": lambda: rate(lambda: Stages("decode", full_decode=True)),
    "decode+torch_resize": lambda: rate(lambda: Stages("resize")),
    "decode+dali_resize": lambda: rate(lambda: Stages("resize", dali_resize=True)),
    "full": lambda: rate(lambda: ClassifyTrainPipeline(256, threads, None, root, seed=0)),
    "loader": loader_rate,
}
print(f"threads {threads}, cpus {len(os.sched_getaffinity(0))}, torch threads {torch.get_num_threads()}, "
      f"DALI_USE_NEW_THREAD_POOL={os.environ.get('DALI_USE_NEW_THREAD_POOL', 'unset')}, "
      f"resize_with_torch {os.environ.get('RESIZE', 'as in pipelines.py')}", flush=True)
for name, measure in variants.items():
    if only and name not in only:
        continue
    # the process's page faults and CPU seconds per image over the variant (build and warm-up included)
    before, start = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    r = measure()
    after, wall = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter() - start
    images = r * seconds  # about the images of the timed part
    print(f"  {name:<20} {r:8.0f} img/s   per image: {(after.ru_minflt - before.ru_minflt) / images:6.1f} minor faults, "
          f"user {1e6 * (after.ru_utime - before.ru_utime) / images:5.0f} us, sys {1e6 * (after.ru_stime - before.ru_stime) / images:5.0f} us "
          f"(cores busy: {(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime) / wall:4.1f})", flush=True)
