# Archived probe: ran at commit 2231382 against that commit's bench.py and pipelines.py; kept as a record, not
# maintained. To rerun: git checkout 2231382.
"""Issue 13, second probe on one H200 (16 cores), bench.py's 8192 JPEGs: the mixed-decode training loader with the
random-resized-crop window decoded alone (ROI decode, ImageRandomCrop, then Resize: as pipelines.py has it) against
the whole image decoded and the window cut and resized on the GPU in one operator (decoders.Image, then
RandomResizedCrop with the same area, aspect ratio, attempts and filter). Loader alone, in turn, twice; then
ResNet-18 and ResNet-50 end to end (bench.py's loop, eager step), synthetic and both loaders, twice.

    python3 results/h200-2026-11-29d/probe2.py
"""
import gc, os, sys
from functools import partial
sys.path.insert(0, ".")
import torch, torchvision
import bench
from bench import log
from nvidia.dali import ops, types
import pipelines

args = bench.parse_args(os.environ.get("PROBE_ARGS", "--workers 16 --seg-samples 1024 --iters 150 --max-seconds 8").split())
args.gpu, args.device = True, "cuda"
args.data_dir, _ = bench.jpeg_set(args)


class DecodeThenCrop(pipelines.ClassifyTrainPipeline):
    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.decode = ops.decoders.Image(device="mixed", output_type=types.RGB, **self.decoder_args)
        self.resize = ops.RandomResizedCrop(device="gpu", size=[224, 224], random_area=[0.08, 1.0],
                                            random_aspect_ratio=[3 / 4, 4 / 3], num_attempts=100,
                                            interp_type=types.INTERP_TRIANGULAR, antialias=True)


def dali(a, cls):
    saved = bench.ClassifyTrainPipeline
    bench.ClassifyTrainPipeline = cls
    try:
        return bench.dali_classify(a, 0)
    finally:
        bench.ClassifyTrainPipeline = saved


loaders = [("crop-decode", partial(dali, cls=pipelines.ClassifyTrainPipeline)),
           ("decode+rrc", partial(dali, cls=DecodeThenCrop))]
log("loader alone")
for rnd in range(2):
    for name, make in loaders:
        bench.time_loader(name, make, args)
log("end to end, eager")
torch.backends.cudnn.benchmark = True
torch.cuda.set_stream(torch.cuda.Stream(priority=-1))
for model_name in ("resnet18", "resnet50"):
    model = getattr(torchvision.models, model_name)(weights=None, num_classes=1000).cuda().to(memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    for rnd in range(2):
        rows = {name: bench.time_training(model_name, model, optimizer, name, make, args)["img_per_s"]
                for name, make in [("synthetic", bench.synthetic_classify)] + loaders}
        log("  " + "  ".join(f"{model_name} {n} / synthetic = {rows[n] / rows['synthetic']:.3f}" for n in rows if n != "synthetic"))
    del model, optimizer
    gc.collect(); torch.cuda.empty_cache()
