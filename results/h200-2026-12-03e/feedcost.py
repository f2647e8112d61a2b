"""Where a DALI-fed training step loses time against one random batch already on the GPU: the
trainers' own pipelines (their parse_args, builders and batch conversion), model, loss and step
(bf16, channels_last, SGD, training.py's high-priority stream), in five rows:

  synthetic   one random batch, every step (the trainers' --loader synthetic)
  fed         DALI's batches, as the trainer takes them
  beside      the random batch, while DALI's next batch is still fetched each step and dropped:
              what DALI's work costs the model by running beside it (GPU and CPU)
  stored      32 of DALI's batches fetched first, then cycled: real data, no DALI beside it
  alone       DALI's batches, no model (the loader's own rate)

each timed twice in mirrored order (synthetic fed beside stored | stored beside fed synthetic), then
a torch.profiler window of `fed`: GPU kernel time per step, DALI's (its operators, nvJPEG) against
the model's. One JSON line per row.

    python3 feedcost.py classify DATA_ROOT [trainer flags...]   # e.g. --arch resnet18 --decoder-cache off
    python3 feedcost.py segment PREPARED_ROOT [trainer flags...]
"""

import collections
import itertools
import json
import sys
import time

sys.path.insert(0, ".")
import torch  # noqa: E402

import training  # noqa: E402

task, root, flags = sys.argv[1], sys.argv[2], sys.argv[3:]
trainer = __import__("train_classify" if task == "classify" else "train_segment")
args = trainer.parse_args(["--data", root, "--amp", "bf16", "--channels-last", *flags])
world = training.setup_distributed(args)  # the trainer's device and high-priority stream
WARM, STEPS, STORED = 15, 60, 32


def build():
    """The trainer's training pipeline, its iterator and its batches, endlessly; the model."""
    if task == "classify":
        from data_sources import plan_decoder_cache

        pipe, val_pipe, _ = trainer.make_pipelines(args, world, None)
        free_mb = torch.cuda.mem_get_info(world.device)[0] / 2**20
        cache, _ = plan_decoder_cache(args.decoder_cache, (pipe, val_pipe), free_mb)
        if cache:  # as the trainer: built again, decoding whole images into the cache
            pipe = trainer.make_train_pipeline(args, world, None, cache)
        print(json.dumps(dict(row="decoder cache", mb=cache)), flush=True)
        from pipelines import classify_iterator

        loader = classify_iterator(pipe)
        convert = lambda loader: trainer.batches_on_device(loader, pipe, world.device)  # noqa: E731
        model = trainer.make_model(args, 1000)
    else:
        from data_sources import read_split
        from pipelines import segment_iterator

        imgs, lbls = read_split(args.data, "train")
        pipe = trainer.train_pipeline(args, world, None, 1, imgs, lbls)
        loader = segment_iterator(pipe)
        convert = lambda loader: trainer.batches_on_device(loader, imgs + lbls, world.device)  # noqa: E731
        model = trainer.make_model(args, pipe.channels)

    def endless():
        while True:
            yield from convert(loader)

    return endless(), model, pipe


batches, model, pipe = build()
model = model.to(world.device, memory_format=torch.channels_last)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
forward = torch.compile(model, mode=args.compile_mode) if args.compile else model
if task == "classify":
    criterion = torch.nn.CrossEntropyLoss()
else:
    criterion = trainer.make_criterion(args, world.device)


def step(images, targets):
    if task == "segment" or not images.is_contiguous(memory_format=torch.channels_last):
        images = images.contiguous(memory_format=torch.channels_last)  # as the trainers
    with torch.autocast("cuda", torch.bfloat16):
        loss = criterion(forward(images), targets)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()


first = next(batches)
t0 = time.perf_counter()
step(*first)
torch.cuda.synchronize()
print(json.dumps(dict(row="first step", seconds=round(time.perf_counter() - t0, 1))), flush=True)
images, targets = first
synthetic = (
    torch.randn(images.shape, device=world.device).contiguous(memory_format=torch.channels_last)
    if task == "classify"
    else torch.randn(images.shape, device=world.device),
    targets.clone(),
)
stored = [tuple(t.clone() for t in next(batches)) for _ in range(STORED)]


def source(row):
    if row == "synthetic":
        return itertools.repeat(synthetic)
    if row in ("fed", "alone"):
        return batches
    if row == "stored":
        return itertools.cycle(stored)
    return (synthetic for _ in iter(lambda: next(batches), None))  # beside: fetch, drop


def timed(row):
    """img/s of STEPS steps after WARM, and the GPU's idle share between steps."""
    run = (lambda *b: None) if row == "alone" else step
    it = source(row)
    for _ in range(WARM):
        run(*next(it))
    torch.cuda.synchronize()
    gaps, end, cpu_wait = [], None, 0.0
    start = time.perf_counter()
    for _ in range(STEPS):
        t = time.perf_counter()
        batch = next(it)
        cpu_wait += time.perf_counter() - t
        if end is not None:
            arrived = torch.cuda.Event(enable_timing=True)
            arrived.record()
            gaps.append((end, arrived))
        run(*batch)
        end = torch.cuda.Event(enable_timing=True)
        end.record()
    torch.cuda.synchronize()
    took = time.perf_counter() - start
    idle = sum(a.elapsed_time(b) for a, b in gaps) / 1000
    n = len(synthetic[0])
    return dict(
        img_s=round(STEPS * n / took),
        gpu_idle_pct=round(100 * idle / took, 1),
        next_ms=round(1000 * cpu_wait / STEPS, 2),
    )


what = dict(task=task, flags=flags, compile=bool(args.compile), workers=args.workers)
results = collections.defaultdict(list)
for row in [
    "synthetic",
    "fed",
    "beside",
    "stored",
    "stored",
    "beside",
    "fed",
    "synthetic",
    "alone",
]:
    r = timed(row)
    results[row].append(r["img_s"])
    print(json.dumps(dict(row=row, **r, **what)), flush=True)
base = sum(results["synthetic"]) / 2
print(
    json.dumps(
        dict(
            row="shares",
            **{k: round(sum(v) / len(v) / base, 3) for k, v in results.items()},
            synthetic_img_s=round(base),
            **what,
        )
    ),
    flush=True,
)

# GPU kernel time per step of `fed`, DALI's against the model's
from torch.profiler import ProfilerActivity, profile  # noqa: E402

for _ in range(5):
    step(*next(batches))
torch.cuda.synchronize()
N = 15
with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
    for _ in range(N):
        step(*next(batches))
    torch.cuda.synchronize()
kernels = collections.Counter()
dali_words = ("dali", "nvjpeg", "jpeg", "huffman", "idct", "resize", "crop", "normalize", "color")
for e in prof.events():
    if e.device_type == torch.autograd.DeviceType.CUDA and e.device_time_total:
        kernels[e.name] += e.device_time_total
dali = {k: v for k, v in kernels.items() if any(w in k.lower() for w in dali_words)}
total = sum(kernels.values())
print(
    json.dumps(
        dict(
            row="kernels per step",
            gpu_ms=round(total / N / 1000, 2),
            dali_like_ms=round(sum(dali.values()) / N / 1000, 2),
            top_dali_like={
                k[:90]: round(v / N / 1000, 3) for k, v in collections.Counter(dali).most_common(10)
            },
            top_all={k[:90]: round(v / N / 1000, 3) for k, v in kernels.most_common(8)},
            **what,
        )
    ),
    flush=True,
)
print(prof.key_averages().table(sort_by="self_device_time_total", row_limit=25), flush=True)
