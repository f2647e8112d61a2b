# Archived probe: ran at commit 2231382 against that commit's bench.py and pipelines.py; kept as a record, not
# maintained. To rerun: git checkout 2231382.
"""Issue 13, third probe on one H200 (16 cores), bench.py's 8192 JPEGs: does a second mixed-decode pipeline on the
same GPU feed ResNet-18 closer to its ceiling? The GPU stage of one DALI pipeline runs one iteration at a time, so
while the model trains, its rate is one batch per that stage's latency. Loaders:
  1 pipe         bench.py's loader: one ClassifyTrainPipeline, batch 256, 8 threads
  2 pipes cat    two pipelines of batch 128 (shards 0 and 1 of 2), one DALIClassificationIterator over both, the two
                 halves concatenated into one batch of 256; 8 and 4 threads each
  2 pipes alt    two pipelines of batch 256 (shards 0 and 1 of 2), their batches taken in turn; 8 threads each
Loader alone, then ResNet-18 and ResNet-50 end to end (bench.py's loop, eager step), twice.

    python3 results/h200-2026-11-29d/probe3.py
"""
import gc, os, sys
from functools import partial
sys.path.insert(0, ".")
import torch, torchvision
import bench
from bench import log
from nvidia.dali.plugin.base_iterator import LastBatchPolicy
from nvidia.dali.plugin.pytorch import DALIClassificationIterator
from pipelines import ClassifyTrainPipeline

args = bench.parse_args(os.environ.get("PROBE_ARGS", "--workers 16 --seg-samples 1024 --iters 150 --max-seconds 8").split())
args.gpu, args.device = True, "cuda"
args.data_dir, _ = bench.jpeg_set(args)


def pipes(a, n, batch, threads):
    return [ClassifyTrainPipeline(batch, threads, 0, a.data_dir, seed=bench.SEED + k, shard_id=k, num_shards=n,
                                  hw_decoder_load=a.hw_decoder_load) for k in range(n)]


def unpack(b):
    return torch.cat([d["data"] for d in b]), torch.cat([d["label"] for d in b]).squeeze(-1).long()


def cat_loader(a, threads):
    it = DALIClassificationIterator(pipes(a, 2, a.batch_size // 2, threads), reader_name="Reader",
                                    last_batch_policy=LastBatchPolicy.FILL, auto_reset=True)
    return bench.endless(it, a.device, unpack)


class Alternate:
    def __init__(self, iterators):
        self.iterators = iterators

    def __iter__(self):
        gens = [iter(i) for i in self.iterators]
        while True:
            for g in gens:
                try:
                    yield next(g)
                except StopIteration:
                    return


def alt_loader(a, threads):
    its = [DALIClassificationIterator(p, reader_name="Reader", last_batch_policy=LastBatchPolicy.FILL, auto_reset=True)
           for p in pipes(a, 2, a.batch_size, threads)]
    return bench.endless(Alternate(its), a.device, lambda b: (b[0]["data"], b[0]["label"].squeeze(-1).long()))


loaders = [("1 pipe", partial(bench.dali_classify, device_id=0)),
           ("2 pipes cat 8t", partial(cat_loader, threads=8)),
           ("2 pipes cat 4t", partial(cat_loader, threads=4)),
           ("2 pipes alt 8t", partial(alt_loader, threads=8))]
log("loader alone")
for name, make in loaders:
    bench.time_loader(name, make, args)
log("end to end, eager")
torch.backends.cudnn.benchmark = True
torch.cuda.set_stream(torch.cuda.Stream(priority=-1))
for model_name in ("resnet18", "resnet50"):
    model = getattr(torchvision.models, model_name)(weights=None, num_classes=1000).cuda().to(memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    for rnd in range(2 if model_name == "resnet18" else 1):
        rows = {name: bench.time_training(model_name, model, optimizer, name, make, args)["img_per_s"]
                for name, make in [("synthetic", bench.synthetic_classify)] + loaders}
        log("  " + "  ".join(f"{n}: {rows[n] / rows['synthetic']:.3f}" for n in rows if n != "synthetic"))
    del model, optimizer
    gc.collect(); torch.cuda.empty_cache()
