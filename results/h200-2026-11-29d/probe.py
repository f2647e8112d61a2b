# Archived probe: ran at commit 2231382 against that commit's bench.py and pipelines.py; kept as a record, not
# maintained. To rerun: git checkout 2231382.
"""Issue 13 probes on one H200 (16 cores), over bench.py's data (8192 JPEGs, 1024 .npy pairs):

  graph    ResNet-18 and ResNet-50 end to end (bench.py's loop), the training step eager and captured as one CUDA
           graph (forward, backward and SGD step replayed; each batch copied into the graph's input first, for the
           synthetic batch as for DALI's), fed by the synthetic batch and by the mixed-decode loader
  seg-cpu  the CPU-only segmentation pipeline, Pipeline.run() at 16 threads: as it is (brightness and contrast under
           conditionals) against 'fused' (both as one arithmetic pass over every sample, factor 1 where not drawn);
           then bench.py's dali-cpu and DataLoader loaders, in turn, twice
  cls-cpu  bench.py's CPU-only classification loader: float32 (as it is), float16, HWC float16; and the DataLoader;
           in turn, twice; once more delivered to the CPU instead of the GPU

    python3 results/h200-2026-11-29d/probe.py graph seg-cpu cls-cpu
"""
import argparse, gc, glob, itertools, os, sys, time
from functools import partial
sys.path.insert(0, ".")
import torch, torchvision
import bench
from bench import log
from nvidia.dali import math as dmath
from pipelines import SegmentTrainPipeline

what = sys.argv[1:]
args = bench.parse_args(os.environ.get("PROBE_ARGS", "--workers 16 --seg-samples 1024 --iters 150 --max-seconds 8").split())
args.gpu, args.device = True, "cuda"
args.data_dir, _ = bench.jpeg_set(args)
args.seg_imgs, args.seg_lbls = bench.seg_set(args)


class GraphedStep:
    """One training step (bf16 autocast forward, backward, SGD step) captured as a CUDA graph; __call__ copies the
    batch into the graph's input tensors and replays it."""

    def __init__(self, model, optimizer, criterion, batch_size, crop=224):
        self.x = torch.zeros(batch_size, 3, crop, crop, device="cuda").contiguous(memory_format=torch.channels_last)
        self.y = torch.zeros(batch_size, dtype=torch.long, device="cuda")
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                optimizer.zero_grad(set_to_none=True)
                with torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False):
                    loss = criterion(model(self.x), self.y)
                loss.backward()
                optimizer.step()
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        optimizer.zero_grad(set_to_none=True)
        with torch.cuda.graph(self.graph):
            with torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False):
                self.loss = criterion(model(self.x), self.y)
            self.loss.backward()
            optimizer.step()

    def __call__(self, images, labels):
        self.x.copy_(images)
        self.y.copy_(labels)
        self.graph.replay()


def train_rate(model, optimizer, name, make_loader, a, graphed=None):
    criterion = torch.nn.CrossEntropyLoss()
    fetch, launch = [], []
    with make_loader(a) as batches:
        gaps, step_end, steps = [], None, 0
        for step in itertools.count():
            if step == a.warmup:
                torch.cuda.synchronize()
                start, gaps, step_end, fetch, launch = time.perf_counter(), [], None, [], []
            t0 = time.perf_counter()
            images, labels = next(batches)
            t1 = time.perf_counter()
            if step_end is not None:
                fed = torch.cuda.Event(enable_timing=True); fed.record(); gaps.append((step_end, fed))
            if graphed:
                graphed(images, labels)
            else:
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    loss = criterion(model(images.contiguous(memory_format=torch.channels_last)), labels)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
            step_end = torch.cuda.Event(enable_timing=True); step_end.record()
            fetch.append(t1 - t0); launch.append(time.perf_counter() - t1)
            if step >= a.warmup:
                steps += 1
                if steps == a.iters or time.perf_counter() - start >= a.max_seconds:
                    break
        torch.cuda.synchronize()
        total = time.perf_counter() - start
        waiting = sum(x.elapsed_time(y) for x, y in gaps) / 1000
    ms = lambda v: 1000 * sum(v) / len(v)
    rate = steps * a.batch_size / total
    log(f"  {name:<34} {rate:9.1f} img/s  data wait {100 * waiting / total:5.1f} %  "
        f"step {1000 * total / steps:6.2f} ms  next() {ms(fetch):6.2f} ms  launch {ms(launch):6.2f} ms")
    return rate


if "graph" in what:
    log("graph: end to end, eager step vs CUDA-graphed step")
    torch.backends.cudnn.benchmark = True
    torch.cuda.set_stream(torch.cuda.Stream(priority=-1))
    loaders = [("synthetic", bench.synthetic_classify), ("dali-mixed", partial(bench.dali_classify, device_id=0)),
               ]
    for model_name in ("resnet18", "resnet50"):
        model = getattr(torchvision.models, model_name)(weights=None, num_classes=1000).cuda().to(memory_format=torch.channels_last)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        rates = {}
        for name, make in loaders:
            rates["eager " + name] = train_rate(model, optimizer, f"{model_name} eager {name}", make, args)
        graphed = GraphedStep(model, optimizer, torch.nn.CrossEntropyLoss(), args.batch_size)
        for rnd in range(2):
            for name, make in loaders:
                rates[f"graph {name} {rnd}"] = train_rate(model, optimizer, f"{model_name} graph {name} ({rnd})", make, args, graphed)
        for mode in ("eager",):
            log(f"  {model_name} eager dali-mixed / synthetic = {rates['eager dali-mixed'] / rates['eager synthetic']:.3f}")
        for rnd in range(2):
            for n in ("dali-mixed",):
                log(f"  {model_name} graph {n} / synthetic ({rnd}) = {rates[f'graph {n} {rnd}'] / rates[f'graph synthetic {rnd}']:.3f}")
        del model, optimizer, graphed
        gc.collect(); torch.cuda.empty_cache()
    torch.cuda.set_stream(torch.cuda.default_stream())


class Fused(SegmentTrainPipeline):
    def define_graph(self):
        image, mask = self.load()
        flips = self.as_float(self.flip_coin())
        image, mask = self.resize(image, mask, roi_start=flips, roi_end=1 - flips)
        image = self.normalize(image)
        image = self.add_noise(image)
        image = self.on_drawn(self.blur_coin(), image, [self.blur_sigma()], lambda x, s: self.blur(x, sigma=s))
        b = 1.0 + self.as_float(self.brightness_coin()) * (self.brightness() - 1.0)
        c = 1.0 + self.as_float(self.contrast_coin()) * (self.contrast() - 1.0)
        image = dmath.min(dmath.max(image * b * c, self.min(image) * b), self.max(image) * b)
        return self.output(image, mask)


def run_rate(pipe, seconds=6):
    pipe.build()
    for _ in range(5):
        pipe.run()
    n, t = 0, time.perf_counter()
    while time.perf_counter() - t < seconds:
        pipe.run(); n += pipe.max_batch_size
    rate = n / (time.perf_counter() - t)
    del pipe; gc.collect()
    return rate


if "seg-cpu" in what:
    log("seg-cpu: Pipeline.run() img/s, 512x512 -> 384x384, 16 threads")
    for rnd in range(2):
        for bs in (32, 64):
            for name, cls in (("as is", SegmentTrainPipeline), ("fused", Fused)):
                log(f"  b{bs} {name:<8} {run_rate(cls(bs, 16, None, args.seg_imgs, args.seg_lbls, size=(384, 384), seed=0)):8.0f} img/s")
    log("seg-cpu: bench.py's loaders (to the GPU), 16 workers, in turn")
    for rnd in range(2):
        for name, make in (("dali-cpu", partial(bench.dali_segment, device_id=None)), ("dataloader", bench.torch_segment)):
            bench.time_loader(name, make, args)

if "cls-cpu" in what:
    log("cls-cpu: bench.py's loaders, 16 workers, in turn")
    loaders = [("dali-cpu", partial(bench.dali_classify, device_id=None)),
               ("dali-cpu fp16", partial(bench.dali_classify, device_id=None, dtype="float16")),
               ("dali-cpu hwc fp16", partial(bench.dali_classify, device_id=None, dtype="float16", output_layout="HWC")),
               ("dataloader", bench.torchvision_classify)]
    for rnd in range(2):
        for name, make in loaders:
            bench.time_loader(name, make, args)
    log("cls-cpu: delivered to the CPU")
    cpu = argparse.Namespace(**{**vars(args), "device": "cpu", "gpu": False})
    for name, make in loaders:
        bench.time_loader(name + " (cpu)", make, cpu)
