"""ResNet-18 (or --models) fed by ClassifyTrainPipeline at several hw_decoder_load values and by NVIDIA's example,
each row run twice in the order A B C ... C B A (synthetic first and last), so that a drift over the
run weighs on every row alike. Usage: abba.py OUT.json [bench.py flags], e.g. --data DIR --workers 16.
"""

import json
import os
import sys
from functools import partial

import torch
import torchvision

sys.path.insert(0, os.getcwd())
import bench  # noqa: E402

LOADS = (0.35, 0.5, 0.65, 1.0)


def main():
    out, argv = sys.argv[1], sys.argv[2:]
    args = bench.parse_args(argv)
    args.gpu, args.device = True, "cuda"
    args.data_dir, _ = bench.jpeg_set(args)
    rows = [
        (
            f"ours hw={load}",
            partial(bench.dali_classify, device_id=0, output_layout="HWC", hw_decoder_load=load),
        )
        for load in LOADS
    ] + [("nvidia-example", partial(bench.nvidia_example, device_id=0))]
    report = dict(alone=[], train=[])
    for name, make in rows + [
        ("nvidia-example-cpu", partial(bench.nvidia_example, device_id=None))
    ]:
        report["alone"].append(bench.time_loader(name, make, args))
    torch.backends.cudnn.benchmark = True
    torch.cuda.set_stream(torch.cuda.Stream(priority=-1))
    order = [("synthetic", bench.synthetic_classify)] + rows + rows[::-1]
    for arch in args.models.split(","):
        model = getattr(torchvision.models, arch)(num_classes=1000)
        model = model.cuda().to(memory_format=torch.channels_last)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        for name, make in order + [order[0]]:
            report["train"].append(bench.time_training(arch, model, optimizer, name, make, args))
            with open(out, "w") as f:
                json.dump(report, f, indent=1)
        del model, optimizer
        rates = {}
        for row in report["train"]:
            if row["model"] == arch:
                rates.setdefault(row["loader"], []).append(row["img_per_s"])
        synthetic = sum(rates["synthetic"]) / len(rates["synthetic"])
        for name, values in rates.items():
            shares = " ".join(f"{100 * v / synthetic:.1f}" for v in values)
            mean = 100 * sum(values) / len(values) / synthetic
            print(
                f"SUMMARY {arch} {name:<16} {mean:5.1f} % of synthetic (each: {shares})", flush=True
            )


if __name__ == "__main__":
    main()
