# Ran at f5a5f3d (results/README.md#cpu2-2026-12-01). Times what train_classify.save_checkpoint writes
# for ResNet-50 (model, SGD momentum, schedule, optionally the EMA copy): torch.save to a temporary file, fsync'd
# or not, then os.replace, the way the trainer saves. Imports nothing of the project.
import os, statistics, sys, tempfile, time
import torch, torchvision

def state(ema):
    model = torchvision.models.resnet50()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(2, 3, 64, 64)).sum().backward()
    opt.step()  # momentum buffers exist after the first step
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, 90)
    ckpt = {"model": model.state_dict(), "optimizer": opt.state_dict(), "lr_scheduler": sched.state_dict()}
    if ema:
        ckpt["model_ema"] = torch.optim.swa_utils.AveragedModel(model).state_dict()
    return ckpt

def save(ckpt, path, sync):
    tmp = f"{path}.tmp-{os.getpid()}"
    t = time.perf_counter()
    with open(tmp, "wb") as f:
        torch.save(ckpt, f)
        if sync:
            f.flush(), os.fsync(f.fileno())
    os.replace(tmp, path)
    return time.perf_counter() - t

torch.set_num_threads(os.cpu_count())
where = sys.argv[1] if len(sys.argv) > 1 else tempfile.gettempdir()
print(f"{os.cpu_count()} CPUs, torch {torch.__version__}, torchvision {torchvision.__version__}, saving into {where}")
for ema in (False, True):
    ckpt, path = state(ema), os.path.join(where, "checkpoint.pth")
    for sync in (False, True):
        times = [save(ckpt, path, sync) for _ in range(5)]
        print(f"ResNet-50{' + EMA' if ema else ''}: {os.path.getsize(path) / 2 ** 20:.0f} MiB, "
              f"{'fsync' if sync else 'no fsync'}: median {statistics.median(times):.2f} s "
              f"(min {min(times):.2f}, max {max(times):.2f}) of 5")
    os.remove(path)
