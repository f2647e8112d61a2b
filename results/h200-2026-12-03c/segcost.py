"""What each of the segmentation training pipeline's augmentations costs a fast model:
DeepLabV3-MobileNetV3-Large (train_segment.py's model and loss, binary), batch 32 at 384 px, bf16,
channels_last, fed by SegmentTrainPipeline (2 DALI threads, the trainer's default) with one
augmentation turned off at a time; against the same model on one random batch already on the GPU.
Also each pipeline alone (img/s, no model). One JSON line per row.

    python3 segcost.py PREPARED_ROOT [eager|compile]
"""

import json
import sys
import time
from types import SimpleNamespace

import torch

sys.path.insert(0, ".")
import data_sources  # noqa: E402
import pipelines  # noqa: E402
import train_segment  # noqa: E402

root, how = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "eager"
batch, warm, steps = 32, 15, 90
imgs, lbls = data_sources.read_split(root, "train")
torch.backends.cudnn.benchmark = True
args = SimpleNamespace(arch="deeplabv3_mobilenet_v3_large", num_classes=1, unet_width=32)
model = train_segment.make_model(args, 3).cuda().to(memory_format=torch.channels_last)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
forward = torch.compile(model) if how == "compile" else model


def train_step(images, masks):
    with torch.autocast("cuda", torch.bfloat16):
        loss = train_segment.dice_ce_loss(forward(images), masks, 1)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()


def batches(pipe):
    while True:
        for b in pipelines.segment_iterator(pipe):
            yield (b[0]["image"].contiguous(memory_format=torch.channels_last), b[0]["mask"].long())


def timed(source, step):
    for _ in range(warm):
        step(*next(source))
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        step(*next(source))
    torch.cuda.synchronize()
    return round(steps * batch / (time.perf_counter() - start))


x = torch.randn(batch, 3, 384, 384, device="cuda").contiguous(memory_format=torch.channels_last)
y = torch.randint(0, 2, (batch, 1, 384, 384), device="cuda")
synthetic = timed(iter(lambda: (x, y), None), train_step)
print(json.dumps(dict(how=how, row="synthetic", img_s=synthetic)), flush=True)
off = {"none off": {}, "flip off": dict(flip_p=0), "noise off": dict(noise_p=0),
       "blur off": dict(blur_p=0), "brightness off": dict(brightness_p=0),
       "contrast off": dict(contrast_p=0),
       "all off": dict(flip_p=0, noise_p=0, blur_p=0, brightness_p=0, contrast_p=0)}
for row, kwargs in off.items():
    pipe = pipelines.SegmentTrainPipeline(batch, 2, 0, imgs, lbls, size=(384, 384), seed=1, **kwargs)
    alone = timed(batches(pipe), lambda images, masks: None)
    pipe = pipelines.SegmentTrainPipeline(batch, 2, 0, imgs, lbls, size=(384, 384), seed=1, **kwargs)
    fed = timed(batches(pipe), train_step)
    print(json.dumps(dict(how=how, row=row, img_s=fed, share=round(fed / synthetic, 3),
                          pipeline_alone_img_s=alone)), flush=True)
