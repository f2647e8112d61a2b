# Archived probe: ran at commit dc4b6e1 against that commit's bench.py and pipelines.py; kept as a record, not
# maintained. To rerun: git checkout dc4b6e1.
"""Is the mixed-decode loader slowed by a busy GPU? bench.py's dali-mixed loader (8 threads) alone, then while a
synthetic ResNet-18 training (bench.py's loop, bf16, channels_last) runs in another process on the same GPU, then
alone again; the training process prints its own rate over its whole run.

    python3 results/h200-2026-11-29c/contention.py
"""
import subprocess, sys, time
from functools import partial
sys.path.insert(0, ".")
import torch, torchvision
import bench

if sys.argv[1:] == ["train"]:
    args = bench.parse_args("--workers 16 --iters 100000 --max-seconds 24 --models resnet18".split())
    args.gpu, args.device = True, "cuda"
    torch.backends.cudnn.benchmark = True
    torch.cuda.set_stream(torch.cuda.Stream(priority=-1))
    model = torchvision.models.resnet18(num_classes=1000).cuda().to(memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    bench.time_training("resnet18", model, optimizer, "synthetic, other process", bench.synthetic_classify, args)
else:
    args = bench.parse_args("--workers 16 --iters 400 --max-seconds 6".split())
    args.gpu, args.device = True, "cuda"
    args.data_dir, _ = bench.jpeg_set(args)
    loader = partial(bench.dali_classify, device_id=0)
    bench.time_loader("dali-mixed alone", loader, args)
    training = subprocess.Popen([sys.executable, __file__, "train"])
    time.sleep(12)  # the model built, cuDNN's autotuning and the warm-up steps done
    bench.time_loader("dali-mixed, GPU training", loader, args)
    training.wait()
    bench.time_loader("dali-mixed alone again", loader, args)
