# Archived probe: ran at commit fdd1487 with uncommitted trainer changes that 3b11cc0 then committed (callB.sh: the
# BatchNorm broadcast, not yet the exit-at-once fix; callC.sh: both), against that tree's bench.py, pipelines.py and
# trainers; kept as a record, not maintained. To rerun: git checkout 3b11cc0.
"""Runs train_classify.py or train_segment.py unchanged, with the process and DDP settings named in the
environment variable KNOBS (comma-separated) changed, for the 2-GPU measurements of this folder:

    nccl_hi        NCCL's collectives on a high-priority CUDA stream (ProcessGroupNCCL.Options)
    static_graph   DistributedDataParallel(static_graph=True)
    bucket_view    DistributedDataParallel(gradient_as_bucket_view=True)
    bucket=MB      DistributedDataParallel(bucket_cap_mb=MB)
    prefetch=N     the classification train pipeline's prefetch_queue_depth (DALI's default: 2)
    split          this process pinned to its LOCAL_RANK's share of the CPUs it may use (os.sched_setaffinity)

    KNOBS=nccl_hi,split torchrun --nproc_per_node=2 knobs.py train_classify.py --data ... (the trainer's flags)
"""

import functools
import os
import runpy
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.getcwd())  # the trainers and pipelines.py: run from the project root

knobs = dict(k.partition("=")[::2] for k in os.environ.get("KNOBS", "").split(",") if k)
unknown = set(knobs) - {"nccl_hi", "static_graph", "bucket_view", "bucket", "split", "prefetch"}
if unknown:
    sys.exit(f"error: KNOBS: unknown {sorted(unknown)}")

if "split" in knobs:
    cpus = sorted(os.sched_getaffinity(0))
    share = len(cpus) // int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    os.sched_setaffinity(0, cpus[local_rank * share:(local_rank + 1) * share])

if "nccl_hi" in knobs:
    init_process_group = dist.init_process_group

    @functools.wraps(init_process_group)
    def init_high_priority(backend=None, *args, **kwargs):
        if backend == "nccl":
            kwargs["pg_options"] = dist.ProcessGroupNCCL.Options(is_high_priority_stream=True)
        return init_process_group(backend, *args, **kwargs)

    dist.init_process_group = init_high_priority

ddp_kwargs = {}
if "static_graph" in knobs:
    ddp_kwargs["static_graph"] = True
if "bucket_view" in knobs:
    ddp_kwargs["gradient_as_bucket_view"] = True
if "bucket" in knobs:
    ddp_kwargs["bucket_cap_mb"] = float(knobs["bucket"])
if ddp_kwargs:
    torch.nn.parallel.DistributedDataParallel = functools.partial(torch.nn.parallel.DistributedDataParallel, **ddp_kwargs)

if "prefetch" in knobs:
    import pipelines

    pipelines.ClassifyTrainPipeline.__init__ = functools.partialmethod(
        pipelines.ClassifyTrainPipeline.__init__, prefetch_queue_depth=int(knobs["prefetch"]))

print(f"knobs: {knobs or 'none'}; CPUs {len(os.sched_getaffinity(0))}", flush=True)
script = sys.argv[1]
sys.argv = sys.argv[1:]
runpy.run_path(script, run_name="__main__")
