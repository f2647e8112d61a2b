# Archived probe: ran at commit 465e2ed against that commit's bench.py and pipelines.py; kept as a record, not
# maintained. To rerun: git checkout 465e2ed.
"""bench.py's CPU-only DALI loaders and their DataLoaders as bench.py times them on a GPU machine (batches delivered
to the GPU), 16 workers, in turn, twice; run it with DALI_USE_NEW_THREAD_POOL=1 for the CPU-only pipelines'
operators to run at once.

    DALI_USE_NEW_THREAD_POOL=1 python3 results/h200-2026-11-29d/ratio_gpu_machine.py
"""
import os, sys
from functools import partial
sys.path.insert(0, ".")
import bench
from bench import log

args = bench.parse_args("--workers 16 --seg-samples 1024 --iters 150 --max-seconds 8".split())
args.gpu, args.device = True, "cuda"
args.data_dir, _ = bench.jpeg_set(args)
args.seg_imgs, args.seg_lbls = bench.seg_set(args)
log(f"DALI_USE_NEW_THREAD_POOL={os.environ.get('DALI_USE_NEW_THREAD_POOL', 'unset')}")
for rnd in range(2):
    for name, make in (("seg dali-cpu", partial(bench.dali_segment, device_id=None)), ("seg dataloader", bench.torch_segment),
                       ("cls dali-cpu", partial(bench.dali_classify, device_id=None)), ("cls dataloader", bench.torchvision_classify)):
        bench.time_loader(name, make, args)
