"""What holds a classification run's host and GPU memory: the trainer's train and val pipelines
(batch 256, 8 DALI threads, mixed decode, HWC output), built and run one epoch each, with the mixed
decoder's memory paddings at one setting, in a fresh process. Prints one JSON line per stage:
the process's RSS and its peak (VmHWM) and the GPU's used memory, in GB.

    python3 memory.py ROOT example|dali|zero [threads]
"""

import json
import sys
import time

import torch

sys.path.insert(0, ".")
import pipelines  # noqa: E402

root, case = sys.argv[1], sys.argv[2]
threads = int(sys.argv[3]) if len(sys.argv) > 3 else 8
paddings = {
    "example": (pipelines.DEVICE_MEMORY_PADDING, pipelines.HOST_MEMORY_PADDING),
    "dali": (16 << 20, 8 << 20),  # DALI's own defaults
    "zero": (0, 0),
}[case]


def status():
    fields = dict(line.split(":", 1) for line in open("/proc/self/status"))
    kb = lambda k: int(fields[k].split()[0]) / 1e6  # noqa: E731
    free, total = torch.cuda.mem_get_info()
    return dict(rss_gb=round(kb("VmRSS"), 2), hwm_gb=round(kb("VmHWM"), 2),
                gpu_used_gb=round((total - free) / 1e9, 2))


def stage(name, **extra):
    print(json.dumps(dict(case=case, threads=threads, stage=name, **status(), **extra)), flush=True)


torch.zeros(1, device="cuda")
stage("cuda")
common = dict(device_memory_padding=paddings[0], host_memory_padding=paddings[1],
              output_layout="HWC", seed=1)
train = pipelines.ClassifyTrainPipeline(256, threads, 0, data_dir=f"{root}/train", **common)
train.build()
stage("train built")
val = pipelines.ClassifyValPipeline(256, threads, 0, data_dir=f"{root}/val", classes=train.classes,
                                    crop_size=224, resize_size=256, **common)
val.build()
stage("val built")
loader = pipelines.classify_iterator(train)
for epoch in range(2):
    start, n = time.perf_counter(), 0
    for batch in loader:
        n += batch[0]["data"].shape[0]
    torch.cuda.synchronize()
    stage(f"train epoch {epoch + 1}", img_s=round(n / (time.perf_counter() - start)))
for batch in pipelines.classify_iterator(val):
    pass
stage("val epoch")
