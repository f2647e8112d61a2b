"""h200-2026-12-03f's sweep.py with more variants: a resize without antialiasing (DALI's linear
filter, where the trainer's is torchvision's antialiased one), the hardware decoder's whole share,
and the decoder cache (filled before the timed rows). PROFILE names the variants profiled.

One compiled model, fed by several variants of the trainer's training pipeline in one process:
each variant's `fed` rate against the random batch's (`synthetic`), timed twice in mirrored order
(synthetic v1 .. vn vn .. v1 synthetic), with the GPU's SM clock, power and clock-event reasons
read by nvidia-smi during each row. Then a profile of 15 synthetic and 15 fed steps (default
variant): the model's kernel time per step beside DALI's. One JSON line per row.

    python3 sweep.py DATA_ROOT --arch resnet18 [--modes default,reduce-overhead]

A variant is trainer flags (--hw-decoder-load, -j, --decoder) and, for what has no flag, keyword
arguments to the classification pipelines (the example's memory paddings, a float16 output).
Each line names the `trainer` command's flags and environment (patch.py) that run it whole.
"""

import collections
import functools
import itertools
import json
import os
import subprocess
import sys
import threading
import time

sys.path.insert(0, ".")
import torch  # noqa: E402

import pipelines  # noqa: E402
import train_classify as trainer  # noqa: E402
import training  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from patch import resize_filter  # noqa: E402
from split import SplitDecodePipeline  # noqa: E402

root = sys.argv[1]
arch = sys.argv[sys.argv.index("--arch") + 1]
modes = ["default"]
if "--modes" in sys.argv:
    modes = sys.argv[sys.argv.index("--modes") + 1].split(",")
BATCH = os.environ.get("BATCH", "256")  # a smaller one only for a CPU smoke run
BASE = ["--data", root, "--arch", arch, "-b", BATCH, "--amp", "bf16", "--channels-last"]
WARM, STEPS = int(os.environ.get("WARM", 15)), int(os.environ.get("STEPS", 60))
EXAMPLE_PADDINGS = dict(device_memory_padding=211025920, host_memory_padding=140544512)
CACHE_MB = 8000  # the 8,192 decoded JPEGs fit
VARIANTS = {  # name: (trainer flags, pipeline keyword arguments)
    "default": ([], {}),
    "linear": ([], dict(resize="linear")),
    "hw1.0": (["--hw-decoder-load", "1.0"], {}),
    "hw1.0-linear": (["--hw-decoder-load", "1.0"], dict(resize="linear")),
    "hw1.0-fp16": (["--hw-decoder-load", "1.0"], dict(dtype="float16")),
    "cache": (["--decoder-cache", "on"], {}),
    "cache-linear": (["--decoder-cache", "on"], dict(resize="linear")),
    "cache-fp16": (["--decoder-cache", "on"], dict(dtype="float16")),
    "split0.3": ([], dict(cpu_share=0.3)),
    "split0.4": ([], dict(cpu_share=0.4)),
    "split0.5": ([], dict(cpu_share=0.5)),
    "split0.4-j14": (["-j", "14"], dict(cpu_share=0.4)),
    "split0.5-j14": (["-j", "14"], dict(cpu_share=0.5)),
    "pad-example": ([], EXAMPLE_PADDINGS),
    "hw0.5": (["--hw-decoder-load", "0.5"], {}),
    "hw0.8": (["--hw-decoder-load", "0.8"], {}),
    "hw0.9": (["--hw-decoder-load", "0.9"], {}),
    "j4": (["-j", "4"], {}),
    "j12": (["-j", "12"], {}),
    "fp16-out": ([], dict(dtype="float16")),
    "cpu-j12": (["--decoder", "cpu", "-j", "12"], {}),
    "cpu-j15": (["--decoder", "cpu", "-j", "15"], {}),
}
names = os.environ.get("VARIANTS", "default,hw0.8").split(",")
ro_names = os.environ.get("RO_VARIANTS", "default").split(",")
profiled = os.environ.get("PROFILE", "default").split(",")

args = trainer.parse_args([*BASE, "--decoder-cache", "off"])
world = training.setup_distributed(args)  # the trainer's device and high-priority stream


# --- nvidia-smi, read in a thread, each line stamped on arrival -----------------------------
FIELDS = "clocks.sm,power.draw,clocks_event_reasons.active"
if subprocess.run(
    ["nvidia-smi", f"--query-gpu={FIELDS}", "--format=csv"], capture_output=True
).returncode:
    FIELDS = "clocks.sm,power.draw"
samples = []


def read_smi():
    cmd = ["nvidia-smi", f"--query-gpu={FIELDS}", "--format=csv,noheader,nounits", "-lms", "100"]
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True) as p:
        for line in p.stdout:
            samples.append((time.time(), [x.strip() for x in line.split(",")]))


threading.Thread(target=read_smi, daemon=True).start()


def gpu_state(t0, t1):
    window = [s for t, s in samples if t0 <= t <= t1]
    if not window:
        return {}
    out = dict(
        sm_mhz=round(sum(float(s[0]) for s in window) / len(window)),
        power_w=round(sum(float(s[1]) for s in window) / len(window)),
    )
    if len(window[0]) > 2:
        out["reasons"] = dict(collections.Counter(s[2] for s in window).most_common(3))
    return out


# --- the pipelines ----------------------------------------------------------------------------
FILTER_ARGS = ("interp_type", "antialias")


def pipeline_for(name):
    extra_flags, kwargs = VARIANTS[name]
    kwargs = dict(kwargs)
    filter_name = kwargs.pop("resize", None)
    a = trainer.parse_args([*BASE, "--decoder-cache", "off", *extra_flags])
    a.dali_device = args.dali_device  # set by setup_distributed: DALI on the GPU
    cache = CACHE_MB if a.decoder_cache == "on" else None
    original = trainer.ClassifyTrainPipeline
    cls = SplitDecodePipeline if "cpu_share" in kwargs else original
    trainer.ClassifyTrainPipeline = functools.partial(cls, **kwargs)
    try:
        with resize_filter(filter_name):
            pipe = trainer.make_train_pipeline(a, world, None, cache)
    finally:
        trainer.ClassifyTrainPipeline = original
    resize = getattr(pipe, "crop", None) or getattr(pipe, "resize")
    filt = {k: str(v) for k, v in getattr(resize, "_init_args", {}).items() if k in FILTER_ARGS}
    print(json.dumps(dict(row="built", variant=name, cache_mb=cache, resize=filt)), flush=True)
    loader = pipelines.classify_iterator(pipe)

    def endless():
        while True:
            yield from trainer.batches_on_device(loader, pipe, world.device)

    it = endless()
    if cache:  # one epoch and a bit: every image decoded into the cache before the timed rows
        for _ in range(40):
            next(it)
    return it


def trainer_command(name):
    extra_flags, kwargs = VARIANTS[name]
    env = {}
    if "device_memory_padding" in kwargs:
        env["PADDINGS"] = "example"
    if "dtype" in kwargs:
        env["DTYPE"] = kwargs["dtype"]
    if "resize" in kwargs:
        env["RESIZE"] = kwargs["resize"]
    if "cpu_share" in kwargs:
        env["SPLIT"] = kwargs["cpu_share"]
    return dict(flags=extra_flags, env=env)


t = time.perf_counter()
fed = {n: pipeline_for(n) for n in names}
print(
    json.dumps(dict(row="pipelines built", seconds=round(time.perf_counter() - t, 1))), flush=True
)

model = trainer.make_model(args, 1000).to(world.device, memory_format=torch.channels_last)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
criterion = torch.nn.CrossEntropyLoss()
first = next(fed["default"])
synthetic = (
    torch.randn(first[0].shape, device=world.device).contiguous(memory_format=torch.channels_last),
    first[1].clone(),
)


def make_step(forward):
    def step(images, targets):
        if not images.is_contiguous(memory_format=torch.channels_last):
            images = images.contiguous(memory_format=torch.channels_last)  # as the trainer
        with torch.autocast("cuda", torch.bfloat16):
            loss = criterion(forward(images), targets)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    return step


def timed(step, it, warm=WARM):
    """img/s of STEPS steps after `warm`, the GPU's idle share between steps, the CPU's time in
    next() per step, and the GPU's clock and power over the steps."""
    for _ in range(warm):
        step(*next(it))
    torch.cuda.synchronize()
    gaps, end, cpu_wait = [], None, 0.0
    wall0, start = time.time(), time.perf_counter()
    for _ in range(STEPS):
        t = time.perf_counter()
        batch = next(it)
        cpu_wait += time.perf_counter() - t
        if end is not None:
            arrived = torch.cuda.Event(enable_timing=True)
            arrived.record()
            gaps.append((end, arrived))
        step(*batch)
        end = torch.cuda.Event(enable_timing=True)
        end.record()
    torch.cuda.synchronize()
    took = time.perf_counter() - start
    idle = sum(a.elapsed_time(b) for a, b in gaps) / 1000
    return dict(
        img_s=round(STEPS * len(synthetic[0]) / took),
        gpu_idle_pct=round(100 * idle / took, 1),
        next_ms=round(1000 * cpu_wait / STEPS, 2),
        **gpu_state(wall0, time.time()),
    )


def source(name):
    return itertools.repeat(synthetic) if name == "synthetic" else fed[name]


for mode in modes:
    forward = torch.compile(model, mode=None if mode == "default" else mode)
    step = make_step(forward)
    t = time.perf_counter()
    step(*first)
    torch.cuda.synchronize()
    print(
        json.dumps(dict(row="first step", mode=mode, seconds=round(time.perf_counter() - t, 1))),
        flush=True,
    )
    these = names if mode == "default" else ro_names
    order = ["synthetic", *these, *reversed(these), "synthetic"]
    rates = collections.defaultdict(list)
    for name in order:
        r = timed(step, source(name))
        rates[name].append(r["img_s"])
        print(json.dumps(dict(row=name, mode=mode, arch=arch, **r)), flush=True)
    base = sum(rates["synthetic"]) / 2
    for name in these:
        print(
            json.dumps(
                dict(
                    row="share",
                    variant=name,
                    mode=mode,
                    arch=arch,
                    share=round(sum(rates[name]) / 2 / base, 4),
                    passes=[round(r / base, 4) for r in rates[name]],
                    synthetic_img_s=round(base),
                    trainer=trainer_command(name),
                )
            ),
            flush=True,
        )

# --- kernel time per step: synthetic against fed (PROFILE's variants, the first mode) ---------
from torch.profiler import ProfilerActivity, profile  # noqa: E402

step = make_step(torch.compile(model, mode=None if modes[0] == "default" else modes[0]))
dali_words = ("dali", "nvjpeg", "jpeg", "huffman", "idct", "resize", "crop", "normalize", "color")
N = 15
for name in ("synthetic", *profiled):
    it = source(name)
    for _ in range(5):
        step(*next(it))
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        t = time.perf_counter()
        for _ in range(N):
            step(*next(it))
        torch.cuda.synchronize()
        wall = time.perf_counter() - t
    kernels = collections.Counter()
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA and e.device_time_total:
            kernels[e.name] += e.device_time_total
    dali = sum(v for k, v in kernels.items() if any(w in k.lower() for w in dali_words))
    total = sum(kernels.values())
    print(
        json.dumps(
            dict(
                row="kernels per step",
                rows=name,
                arch=arch,
                step_ms=round(1000 * wall / N, 2),
                gpu_ms=round(total / N / 1000, 2),
                dali_like_ms=round(dali / N / 1000, 2),
                model_ms=round((total - dali) / N / 1000, 2),
                top={k[:80]: round(v / N / 1000, 3) for k, v in kernels.most_common(6)},
            )
        ),
        flush=True,
    )
