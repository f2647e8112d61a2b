"""A torchvision model's training step on one random batch already on the GPU (bf16 autocast,
channels_last, SGD), eager or torch.compile'd in a mode: the first step's seconds (the compile) and
the img/s of the steps after a warm-up. One model and mode per process (no compile caches shared
in memory).

    python3 compile_modes.py resnet50 default   # eager | default | reduce-overhead | max-autotune...
"""

import json
import sys
import time

import torch
import torchvision

arch, mode = sys.argv[1], sys.argv[2]
batch, warm, steps = 256, 20, 80
torch.backends.cudnn.benchmark = True
model = getattr(torchvision.models, arch)().cuda().to(memory_format=torch.channels_last)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
images = torch.randn(batch, 3, 224, 224, device="cuda").contiguous(memory_format=torch.channels_last)
labels = torch.randint(0, 1000, (batch,), device="cuda")
forward = model if mode == "eager" else torch.compile(model, mode=None if mode == "default" else mode)
criterion = torch.nn.CrossEntropyLoss()


def step():
    with torch.autocast("cuda", torch.bfloat16):
        loss = criterion(forward(images), labels)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()


start = time.perf_counter()
step()
torch.cuda.synchronize()
first = time.perf_counter() - start
for _ in range(warm):
    step()
torch.cuda.synchronize()
rates = []
for _ in range(4):  # four windows: the median is the figure, the spread says how steady it is
    start = time.perf_counter()
    for _ in range(steps // 4):
        step()
    torch.cuda.synchronize()
    rates.append(steps // 4 * batch / (time.perf_counter() - start))
rates.sort()
row = dict(arch=arch, mode=mode, first_step_s=round(first, 1), img_s=round((rates[1] + rates[2]) / 2),
           windows=[round(r) for r in rates], max_reserved_gb=round(torch.cuda.max_memory_reserved() / 1e9, 2))
print(json.dumps(row), flush=True)
