# Archived probe: ran at commit 9e73d43 against that commit's bench.py and pipelines.py; kept as a record, not
# maintained. To rerun: git checkout 9e73d43.
"""Issue 13 probe on one H200 (16 cores), over bench.py's data (8192 JPEGs): ResNet-18 and ResNet-50 end to end in
bench.py's own loop (bench.time_training), the model eager and under torch.compile (inductor, default mode: fused
kernels, no CUDA graphs), fed by the synthetic batch and by the mixed-decode loader, in turn, twice. The compiled
model is compiled (and warmed) on the synthetic batch first, so no row times compilation.

    python3 results/h200-2026-11-29e/compile.py
"""
import gc, os, sys, time, traceback
from functools import partial
sys.path.insert(0, ".")
import torch, torchvision
import bench
from bench import log

args = bench.parse_args(os.environ.get("PROBE_ARGS", "--workers 16 --iters 150 --max-seconds 8").split())
args.gpu, args.device = True, "cuda"
args.data_dir, _ = bench.jpeg_set(args)
torch.backends.cudnn.benchmark = True
torch.cuda.set_stream(torch.cuda.Stream(priority=-1))  # as bench.py's end-to-end section
loaders = [("synthetic", bench.synthetic_classify), ("dali-mixed", partial(bench.dali_classify, device_id=0))]
log(f"torch {torch.__version__}, {args.workers} workers, gpu threads {args.gpu_threads}")
for model_name in ("resnet18", "resnet50"):
    eager = getattr(torchvision.models, model_name)(weights=None, num_classes=1000).cuda().to(memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(eager.parameters(), lr=0.01, momentum=0.9)
    try:
        t = time.perf_counter()
        compiled = torch.compile(eager)
        x = torch.randn(args.batch_size, 3, 224, 224, device="cuda").contiguous(memory_format=torch.channels_last)
        for _ in range(3):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = torch.nn.functional.cross_entropy(compiled(x), torch.zeros(args.batch_size, dtype=torch.long, device="cuda"))
            loss.backward()
        torch.cuda.synchronize()
        log(f"{model_name}: compiled in {time.perf_counter() - t:.1f} s")
    except Exception:
        traceback.print_exc()
        compiled = None
    models = [("eager", eager)] + ([("compiled", compiled)] if compiled is not None else [])
    rates = {}
    for rnd in range(2):
        for mode, model in models:
            for name, make in loaders:
                row = bench.time_training(model_name, model, optimizer, f"{mode} {name}", make, args)
                rates[(rnd, mode, name)] = row["img_per_s"]
    for rnd in range(2):
        for mode, _ in models:
            r = rates[(rnd, mode, "dali-mixed")] / rates[(rnd, mode, "synthetic")]
            log(f"{model_name} round {rnd} {mode}: dali-mixed / synthetic = {r:.3f}")
    del eager, compiled, models, optimizer
    gc.collect(); torch.cuda.empty_cache()
