# Archived probe: ran at commits ee8ebdf (call6.sh: probe.log), 2da0839 (call7.sh: probe2.log) and dc4b6e1 (call9.sh:
# seg_ratio.log) against those commits' bench.py and pipelines.py; kept as a record, not maintained.
# To rerun: git checkout dc4b6e1.
"""Issue 13 probes on one H200 (16 cores), over bench.py's data (8192 JPEGs, 1024 .npy pairs):

  seg-cpu   CPU-only segmentation pipeline, Pipeline.run() alone, one augmentation set at a time, DALI's CPU
            noise against the torch-generated noise, 8 and 16 threads; then bench.py's loaders (to the GPU)
  seg-gpu   the GPU segmentation loader at other thread counts and prefetch depths, and the val pipeline
  rn18      ResNet-18 end to end (bench.py's loop) at DALI threads 16 / 8 / 4, stream priority, shards;
            per step, the main thread's time in next() and in launching the step
  profile   torch.profiler over 30 ResNet-18 steps (synthetic and DALI): GPU time per stream, the training
            stream's idle gaps inside a window of steps, DALI's top kernels

  seg-cpu2  (second call) the CPU-only segmentation pipeline stage by stage at 16 threads, with the torch noise
            on a thread pool of its own; batch 64; plain reads instead of memory-mapped ones
  seg-ratio (third call) bench.py's CPU-only segmentation loader and its DataLoader, 16 workers, three times in turn
  rn18b     (second call) ResNet-18 end to end at 8 DALI threads: the DALI batches fetched but the step trained
            on the synthetic batch (DALI's load on the machine without the wait for its data), deeper prefetch,
            hw_decoder_load below 1, the older executor, DALI's thread pinning

    python3 results/h200-2026-11-29c/probe.py seg-cpu seg-gpu rn18 profile   # first call (call6.sh)
    python3 results/h200-2026-11-29c/probe.py seg-cpu2 rn18b                 # second call (call7.sh)
    python3 results/h200-2026-11-29c/probe.py seg-ratio                      # third call (call9.sh)
"""
import argparse, gc, glob, gzip, itertools, json, os, sys, time
from contextlib import contextmanager
from functools import partial
sys.path.insert(0, ".")
import torch, torchvision
import bench
from bench import log
from nvidia.dali import ops
from pipelines import SegmentTrainPipeline, fetch_dali_loader, segment_iterator

TRACES = "/tmp/traces"
os.makedirs(TRACES, exist_ok=True)
what = sys.argv[1:]
args = bench.parse_args(os.environ.get("PROBE_ARGS", "--workers 16 --seg-samples 1024 --iters 150 --max-seconds 6").split())
args.gpu, args.device = True, "cuda"
args.data_dir, _ = bench.jpeg_set(args)
args.seg_imgs, args.seg_lbls = bench.seg_set(args)
if "rn18" in what or "rn18b" in what:
    args.shards = bench.shard_sets(args)


class DaliNoise(SegmentTrainPipeline):
    """The pipeline as it was: DALI's own CPU normal generator for the noise."""
    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.dali_noise = ops.noise.Gaussian(device="cpu")

    def add_noise(self, image):
        return self.on_drawn(self.noise_coin(), image, [self.noise_std()], lambda x, s: self.dali_noise(x, stddev=s))


def run_rate(pipe, seconds=5):
    pipe.build()
    for _ in range(5):
        pipe.run()
    n, t = 0, time.perf_counter()
    while time.perf_counter() - t < seconds:
        pipe.run(); n += pipe.max_batch_size
    rate = n / (time.perf_counter() - t)
    del pipe; gc.collect()
    return rate


NONE = dict(noise_p=0.0, blur_p=0.0, brightness_p=0.0, contrast_p=0.0)
if "seg-cpu" in what:
    log("seg-cpu: Pipeline.run() img/s, batch 32, 512x512 -> 384x384")
    imgs, lbls = args.seg_imgs, args.seg_lbls
    for threads in (16, 8):
        common = dict(size=(384, 384), seed=0)
        rows = [("val", lambda: fetch_dali_loader(imgs, lbls, 32, "eval", device_id=None, num_threads=threads, **common)),
                ("flips only", lambda: SegmentTrainPipeline(32, threads, None, imgs, lbls, **common, **NONE)),
                ("flips + torch noise", lambda: SegmentTrainPipeline(32, threads, None, imgs, lbls, **common, **dict(NONE, noise_p=0.15))),
                ("flips + dali noise", lambda: DaliNoise(32, threads, None, imgs, lbls, **common, **dict(NONE, noise_p=0.15))),
                ("all, torch noise", lambda: SegmentTrainPipeline(32, threads, None, imgs, lbls, **common)),
                ("all, dali noise", lambda: DaliNoise(32, threads, None, imgs, lbls, **common))]
        for name, make in rows:
            log(f"  {threads:2d}t {name:<22} {run_rate(make()):8.0f} img/s")
    log("seg-cpu through bench.py's loaders (to the GPU), 16 workers")
    for name, make in (("dali-cpu", partial(bench.dali_segment, device_id=None)), ("dataloader", bench.torch_segment)):
        bench.time_loader(name, make, args)
    for w in (8, 4):
        a = argparse.Namespace(**{**vars(args), "workers": w})
        for name, make in (("dali-cpu", partial(bench.dali_segment, device_id=None)), ("dataloader", bench.torch_segment)):
            bench.time_loader(f"{name} {w}w", make, a)

if "seg-gpu" in what:
    log("seg-gpu loaders (bench.time_loader)")
    bench.time_loader("dali-gpu 16t", partial(bench.dali_segment, device_id=0), args)
    for w in (8, 4, 2):
        bench.time_loader(f"dali-gpu {w}t", partial(bench.dali_segment, device_id=0), argparse.Namespace(**{**vars(args), "workers": w}))
    bench.time_loader("dali-gpu 16t pq3", partial(bench.dali_segment, device_id=0), argparse.Namespace(**{**vars(args), "prefetch_queue_depth": 3}))
    def val_gpu(a):
        pipe = fetch_dali_loader(a.seg_imgs, a.seg_lbls, 32, "eval", device_id=0, num_threads=a.workers, size=(384, 384))
        return bench.endless(segment_iterator(pipe), a.device, lambda b: (b[0]["image"], b[0]["mask"]))
    bench.time_loader("dali-gpu val 16t", val_gpu, args)
    def none_gpu(a):
        pipe = fetch_dali_loader(a.seg_imgs, a.seg_lbls, 32, "train", device_id=0, num_threads=a.workers, size=(384, 384), **NONE)
        return bench.endless(segment_iterator(pipe), a.device, lambda b: (b[0]["image"], b[0]["mask"]))
    bench.time_loader("dali-gpu flips 16t", none_gpu, args)


def probe_training(model, optimizer, name, make_loader, a, priority=-1, profile=None):
    """bench.time_training's loop, plus the main thread's time per step in next() and in launching the step."""
    torch.cuda.set_stream(torch.cuda.Stream(priority=priority))
    criterion = torch.nn.CrossEntropyLoss()
    fetch, launch = [], []
    with make_loader(a) as batches:
        gaps, step_end, steps = [], None, 0
        prof = None
        for step in itertools.count():
            if step == a.warmup:
                torch.cuda.synchronize()
                start, gaps, step_end, fetch, launch = time.perf_counter(), [], None, [], []
                if profile:
                    prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA])
                    prof.__enter__()
            t0 = time.perf_counter()
            images, labels = next(batches)
            t1 = time.perf_counter()
            if step_end is not None:
                fed = torch.cuda.Event(enable_timing=True); fed.record(); gaps.append((step_end, fed))
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = criterion(model(images.contiguous(memory_format=torch.channels_last)), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            step_end = torch.cuda.Event(enable_timing=True); step_end.record()
            fetch.append(t1 - t0); launch.append(time.perf_counter() - t1)
            if step >= a.warmup:
                steps += 1
                if steps == (profile or a.iters) or time.perf_counter() - start >= a.max_seconds:
                    break
        torch.cuda.synchronize()
        total = time.perf_counter() - start
        if prof:
            prof.__exit__(None, None, None)
            path = f"{TRACES}/{profile_name(name)}.json"
            prof.export_chrome_trace(path)
        waiting = sum(x.elapsed_time(y) for x, y in gaps) / 1000
    torch.cuda.set_stream(torch.cuda.default_stream())
    ms = lambda v: 1000 * sum(v) / len(v)
    log(f"  {name:<28} {steps * a.batch_size / total:9.1f} img/s  data wait {100 * waiting / total:5.1f} %  "
        f"step {1000 * total / steps:6.2f} ms  next() {ms(fetch):6.2f} ms  launch {ms(launch):6.2f} ms")
    return path if prof else None


def profile_name(name):
    return "trace-" + "".join(c if c.isalnum() else "-" for c in name)


def analyse(path, steps):
    events = json.load(open(path))["traceEvents"]
    kernels = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and "dur" in e]
    by_stream = {}
    for e in kernels:
        by_stream.setdefault(e["args"].get("stream"), []).append(e)
    train = max(by_stream, key=lambda s: sum(e["dur"] for e in by_stream[s]))
    def union(evs):
        iv = sorted((e["ts"], e["ts"] + e["dur"]) for e in evs)
        busy, gaps, cur_s, cur_e = 0.0, [], iv[0][0], iv[0][1]
        for s, e in iv[1:]:
            if s > cur_e:
                busy += cur_e - cur_s; gaps.append(s - cur_e); cur_s, cur_e = s, e
            else:
                cur_e = max(cur_e, e)
        busy += cur_e - cur_s
        return iv[0][0], cur_e, busy, gaps
    t0, t1, busy, gaps = union(by_stream[train])
    wall = t1 - t0
    big = [g for g in gaps if g > 200]
    log(f"  {os.path.basename(path)}: training stream {train}: window {wall / 1000:.1f} ms for ~{steps} steps, "
        f"busy {100 * busy / wall:.1f} %, idle gaps: {len(gaps)} ({sum(gaps) / 1000:.1f} ms), "
        f"of which > 200 us: {len(big)} ({sum(big) / 1000:.1f} ms), > 1 ms: {sum(g for g in gaps if g > 1000) / 1000:.1f} ms")
    for s, evs in sorted(by_stream.items(), key=lambda kv: -sum(e["dur"] for e in kv[1])):
        if s == train:
            continue
        tot = {}
        for e in evs:
            tot[e["name"][:60]] = tot.get(e["name"][:60], 0) + e["dur"]
        top = sorted(tot.items(), key=lambda kv: -kv[1])[:4]
        log(f"    stream {s}: {len(evs)} ops, {sum(tot.values()) / 1000:.1f} ms; top: " +
            "; ".join(f"{k} {v / 1000:.1f} ms" for k, v in top))
    # the training stream's gaps that other streams' work covers
    others = [e for s, evs in by_stream.items() if s != train for e in evs]
    ot0, ot1, obusy, _ = union(others) if others else (0, 0, 0, [])
    log(f"    other streams busy {obusy / 1000:.1f} ms in the window ({100 * obusy / wall:.1f} %)")


class Readers(SegmentTrainPipeline):
    """Only the two .npy readers (and the reshapes that move no data)."""
    def define_graph(self):
        return self.load()


class PlainReads(SegmentTrainPipeline):
    """The training pipeline with plain file reads (dont_use_mmap) instead of memory-mapped ones."""
    def __init__(self, batch_size, num_threads, device_id, imgs, lbls, **kwargs):
        super().__init__(batch_size, num_threads, device_id, imgs, lbls, **kwargs)
        reader_args = dict(random_shuffle=True, seed=0, pad_last_batch=True, cache_header_information=True,
                           prefetch_queue_depth=3, dont_use_mmap=True)
        self.read_image = ops.readers.Numpy(files=list(imgs), **reader_args)
        self.read_mask = ops.readers.Numpy(files=list(lbls), **reader_args)


if "seg-cpu2" in what:
    log("seg-cpu2: Pipeline.run() img/s at 16 threads, batch 32 (64 where said), 512x512 -> 384x384")
    imgs, lbls = args.seg_imgs, args.seg_lbls
    common = dict(size=(384, 384), seed=0)
    rows = [("readers only", lambda: Readers(32, 16, None, imgs, lbls, **common)),
            ("val", lambda: fetch_dali_loader(imgs, lbls, 32, "eval", device_id=None, num_threads=16, **common)),
            ("flips only", lambda: SegmentTrainPipeline(32, 16, None, imgs, lbls, **common, **NONE)),
            ("flips + torch noise", lambda: SegmentTrainPipeline(32, 16, None, imgs, lbls, **common, **dict(NONE, noise_p=0.15))),
            ("flips + dali noise", lambda: DaliNoise(32, 16, None, imgs, lbls, **common, **dict(NONE, noise_p=0.15))),
            ("flips + blur", lambda: SegmentTrainPipeline(32, 16, None, imgs, lbls, **common, **dict(NONE, blur_p=0.15))),
            ("flips + brightness", lambda: SegmentTrainPipeline(32, 16, None, imgs, lbls, **common, **dict(NONE, brightness_p=0.15))),
            ("flips + contrast", lambda: SegmentTrainPipeline(32, 16, None, imgs, lbls, **common, **dict(NONE, contrast_p=0.15))),
            ("all, torch noise", lambda: SegmentTrainPipeline(32, 16, None, imgs, lbls, **common)),
            ("all, dali noise", lambda: DaliNoise(32, 16, None, imgs, lbls, **common)),
            ("all, torch noise, batch 64", lambda: SegmentTrainPipeline(64, 16, None, imgs, lbls, **common)),
            ("all, plain reads", lambda: PlainReads(32, 16, None, imgs, lbls, **common)),
            ("all, torch noise, 8 threads", lambda: SegmentTrainPipeline(32, 8, None, imgs, lbls, **common)),
            ("all, torch noise, 32 threads", lambda: SegmentTrainPipeline(32, 32, None, imgs, lbls, **common))]
    for name, make in rows:
        log(f"  {name:<30} {run_rate(make()):8.0f} img/s")


if "seg-ratio" in what:
    log("seg-ratio: bench.py's segmentation loaders to the GPU, 16 workers, in turn")
    for _ in range(3):
        for name, make in (("dali-cpu", partial(bench.dali_segment, device_id=None)), ("dataloader", bench.torch_segment)):
            bench.time_loader(name, make, args)


@contextmanager
def fetch_but_train_on_synthetic(a):
    """DALI's batches fetched (on a side stream, so the training stream never waits for them) and dropped;
    every step trains on the synthetic batch."""
    side = torch.cuda.Stream()
    with bench.dali_classify(a, device_id=0) as dali, bench.synthetic_classify(a) as synthetic:
        def batches():
            for batch in synthetic:
                with torch.cuda.stream(side):
                    next(dali)
                yield batch
        yield batches()


if "rn18" in what or "profile" in what or "rn18b" in what:
    torch.backends.cudnn.benchmark = True
    model = torchvision.models.resnet18(num_classes=1000).cuda().to(memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    w = lambda n: argparse.Namespace(**{**vars(args), "workers": n, "gpu_threads": n})
    if "rn18" in what:
        log("rn18 end to end")
        probe_training(model, optimizer, "synthetic", bench.synthetic_classify, args)
        for n in (16, 8, 4):
            probe_training(model, optimizer, f"dali {n}t", partial(bench.dali_classify, device_id=0), w(n))
        probe_training(model, optimizer, "dali 8t normal-priority", partial(bench.dali_classify, device_id=0), w(8), priority=0)
        probe_training(model, optimizer, "dali 8t hwc", partial(bench.dali_classify, device_id=0, output_layout="HWC"), w(8))
        probe_training(model, optimizer, "dali 8t tfrecord", partial(bench.dali_classify, device_id=0, layout="tfrecord"), w(8))
        probe_training(model, optimizer, "dali 16t tfrecord", partial(bench.dali_classify, device_id=0, layout="tfrecord"), w(16))
        probe_training(model, optimizer, "synthetic again", bench.synthetic_classify, args)
    if "rn18b" in what:
        log("rn18b end to end, 8 DALI threads")
        a8 = w(8)
        probe_training(model, optimizer, "synthetic", bench.synthetic_classify, args)
        probe_training(model, optimizer, "dali 8t", partial(bench.dali_classify, device_id=0), a8)
        probe_training(model, optimizer, "dali fetched, synthetic trained", fetch_but_train_on_synthetic, a8)
        for depth in (3, 4):
            probe_training(model, optimizer, f"dali 8t prefetch {depth}", partial(bench.dali_classify, device_id=0),
                           argparse.Namespace(**{**vars(a8), "prefetch_queue_depth": depth}))
        for load in (0.9, 0.75):
            probe_training(model, optimizer, f"dali 8t hw_decoder_load {load}", partial(bench.dali_classify, device_id=0),
                           argparse.Namespace(**{**vars(a8), "hw_decoder_load": load}))
        probe_training(model, optimizer, "dali 8t exec_dynamic=False", partial(bench.dali_classify, device_id=0, exec_dynamic=False), a8)
        probe_training(model, optimizer, "dali 8t set_affinity", partial(bench.dali_classify, device_id=0, set_affinity=True), a8)
        probe_training(model, optimizer, "dali 8t wds", partial(bench.dali_classify, device_id=0, layout="wds"), a8)
        probe_training(model, optimizer, "dali 8t again", partial(bench.dali_classify, device_id=0), a8)
        probe_training(model, optimizer, "synthetic again", bench.synthetic_classify, args)
    if "profile" in what:
        log("profiles, 30 steps each")
        for name, make, a in (("synthetic", bench.synthetic_classify, args),
                              ("dali 8t", partial(bench.dali_classify, device_id=0), w(8)),
                              ("dali 16t", partial(bench.dali_classify, device_id=0), w(16))):
            path = probe_training(model, optimizer, name + " (profiled)", make, a, profile=30)
            analyse(path, 30)
