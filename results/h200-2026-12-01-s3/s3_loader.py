"""The classification loader reading from moto's S3 server on 127.0.0.1 against reading from local disk.

    python results/h200-2026-12-01-s3/s3_loader.py [--images 512] [--batch-size 64] [--threads 2] [--gpu]

Builds ImageNet-sized JPEGs (500x375, about 104 KB each) as an ImageFolder tree, WebDataset tars and TFRecords
(make_shards.py, 128 images a shard), uploads each to a moto server it starts, then times for each layout and
source: the reader alone (DALI's reader, no decode) and pipelines.ClassifyTrainPipeline (224 crop; CPU-only, or
with --gpu mixed decode and GPU ops on GPU 0), each with --threads DALI threads: the
time from building the pipeline to its first batch, and the rate over the two epochs after it. One JSON line per
measurement. A loopback server is not a cloud bucket: each request here costs milliseconds, not tens of them, and
moto itself (a Python server) shares the machine's cores with DALI.
"""

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

import numpy as np
from PIL import Image

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
import pipelines  # noqa: E402
from make_shards import make_shards  # noqa: E402
from nvidia.dali.pipeline import Pipeline  # noqa: E402


class ReadOnly(Pipeline):
    """The training reader alone (shuffled, as the trainer reads): encoded bytes and labels, nothing decoded."""

    def __init__(self, data_dir, batch_size, threads):
        super().__init__(batch_size, threads, None, seed=0)
        self.read = pipelines.ClassifyReader(data_dir, None, classes=None, num_classes=None, label_offset=0, shard_id=0,
                                             num_shards=1, shuffle=True, batch_size=batch_size)

    def define_graph(self):
        return self.read()


def make_images(root, n, val):
    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0:375, 0:500]
    base = np.stack([xx * 255 / 500, yy * 255 / 375, (xx + yy) * 255 / 875], -1)
    for split, count in (("train", n), ("val", val)):
        for i in range(count):
            folder = os.path.join(root, split, f"c{i % 4}")
            os.makedirs(folder, exist_ok=True)
            img = (base[:, ::-1] if i % 2 else base) + rng.normal(0, 25, base.shape)
            Image.fromarray(img.clip(0, 255).astype(np.uint8)).save(os.path.join(folder, f"{i}.jpg"), quality=90)


def timed(make, epochs=2):
    start = time.perf_counter()
    pipe = make()
    pipe.build()
    steps = pipe.epoch_size("Reader") // pipe.max_batch_size
    pipe.run()
    first = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(epochs * steps - 1):
        pipe.run()
    return first, (epochs * steps - 1) * pipe.max_batch_size / (time.perf_counter() - start)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--images", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--gpu", action="store_true")
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="s3-loader-")
    make_images(os.path.join(work, "folder"), args.images, 64)
    for fmt in ("wds", "tfrecord"):
        make_shards(os.path.join(work, "folder"), os.path.join(work, fmt), fmt, shard_size=128, seed=0)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    os.environ.update(AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}", AWS_ACCESS_KEY_ID="testing",
                      AWS_SECRET_ACCESS_KEY="testing")
    try:
        import boto3
        while True:  # until the server listens
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        client = boto3.client("s3")
        client.create_bucket(Bucket="bench")
        for layout in ("folder", "wds", "tfrecord"):
            for folder, _, names in os.walk(os.path.join(work, layout)):
                for name in names:
                    path = os.path.join(folder, name)
                    client.upload_file(path, "bench", f"{layout}/{os.path.relpath(path, os.path.join(work, layout))}")
        for layout in ("folder", "wds", "tfrecord"):
            for source, root in (("local", os.path.join(work, layout)), ("s3", f"s3://bench/{layout}")):
                train = os.path.join(root, "train")
                for what, make in (("reader", lambda: ReadOnly(train, args.batch_size, args.threads)),
                                   ("pipeline", lambda: pipelines.ClassifyTrainPipeline(
                                       args.batch_size, args.threads, 0 if args.gpu else None, train,
                                       crop_size=224, seed=0))):
                    first, rate = timed(make)
                    print(json.dumps({"layout": layout, "source": source, "what": what, "images": args.images,
                                      "batch": args.batch_size, "threads": args.threads,
                                      "gpu": args.gpu, "first_batch_s": round(first, 2),
                                      "img_s": round(rate, 1)}), flush=True)
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
