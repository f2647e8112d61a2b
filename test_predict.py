"""--predict of both trainers on the CPU (any GPU hidden), from the checkpoints of tiny runs: masks at each
image's own size holding class values only, the model's argmax on the validation pipeline's input, flipped
images with --tta, folders mirrored, nothing overwritten, bad input as one line; predictions.csv's rows; two
processes under torchrun sharing the images. The GPU variant compares its masks with the CPU's."""

import csv
import os
import struct
import subprocess
import sys
import zlib

import numpy as np
import pytest
import torch
from PIL import Image

from data_processing import make_csv_file_npy
from pipelines import SegmentPredictPipeline, fetch_dali_loader, predict_iterator, segment_iterator
from predict import PREDICT_MAX_PIXELS
from test_train_classify import DISK_FULL, assert_one_line_error, tiny_imagefolder
from train_segment import UNet

HERE = os.path.dirname(os.path.abspath(__file__))
CPU_ENV = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
# (path in the folder, height, width, channels): a grey PNG, an RGB PNG, an RGB JPEG, none square
IMAGES = [("g.png", 50, 70, 1), ("sub/r.png", 41, 30, 3), ("sub/deeper/c.jpg", 33, 81, 3)]


def run(script, *flags, launcher=(sys.executable,), env=CPU_ENV):
    return subprocess.run(
        [*launcher, os.path.join(HERE, script), *flags],
        cwd=HERE,
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )


def write_images(root, images=IMAGES, seed=0):
    rng = np.random.default_rng(seed)
    for name, h, w, c in images:
        os.makedirs(os.path.dirname(os.path.join(root, name)), exist_ok=True)
        pixels = rng.integers(0, 256, (h, w, c) if c == 3 else (h, w), dtype=np.uint8)
        Image.fromarray(pixels).save(os.path.join(root, name))
    return str(root)


def read_png(path):
    with Image.open(path) as im:
        return im.mode, im.size, np.asarray(im)


def mask_of(out, name):
    return os.path.join(out, os.path.splitext(name)[0] + ".png")


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    return write_images(tmp_path_factory.mktemp("images"))


def banded_root(root, n=8, size=64):
    """A prepared root whose class is a pixel's brightness band in channel 0 (0: below 85, 1: below
    170, 2: above): a tiny U-Net learns it in a few epochs, and its predictions vary over an image."""
    rng = np.random.default_rng(0)
    for kind in ("Images", "Masks"):
        os.makedirs(os.path.join(root, kind, "1"))
    for k in range(n):
        image = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
        np.save(os.path.join(root, "Images", "1", f"{k}.npy"), image)
        np.save(os.path.join(root, "Masks", "1", f"{k}.npy"), image[..., :1] // 86)
    make_csv_file_npy(root, valid_fraction=0.25, seed=0)
    return root


@pytest.fixture(scope="module")
def segment_ckpt(tmp_path_factory):
    """A U-Net of width 8 at size 64 for 3 classes, trained for 5 epochs on banded_root."""
    root = banded_root(str(tmp_path_factory.mktemp("seg") / "data"))
    out = os.path.join(os.path.dirname(root), "out")
    flags = ["--size", "64", "--unet-width", "8", "-b", "2", "--lr", "0.0625", "--num-classes", "3"]
    proc = run("train_segment.py", "--data", root, *flags, "--epochs", "5", "--output-dir", out)
    assert proc.returncode == 0, proc.stderr
    return os.path.join(out, "checkpoint.pth")


@pytest.fixture(scope="module")
def segment_out(images, segment_ckpt, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("pred") / "out")
    proc = run(
        "train_segment.py", "--predict", images, "--resume", segment_ckpt, "--output-dir", out
    )
    assert proc.returncode == 0, proc.stderr
    assert "--predict: --num-classes 3 --unet-width 8 --size 64, as in" in proc.stdout
    return out


def test_segment_masks_have_each_images_size_and_class_values_in_mirrored_folders(segment_out):
    for name, h, w, _ in IMAGES:
        mode, size, values = read_png(mask_of(segment_out, name))
        assert mode == "P" and size == (w, h) and set(np.unique(values)) <= {0, 1, 2}
        # the image, and beside it the classes drawn over it
        assert read_png(mask_of(os.path.join(segment_out, "overlays"), name))[:2] == (
            "RGB",
            (2 * w, h),
        )
    written = [os.path.join(d, f) for d, _, names in os.walk(segment_out) for f in names]
    masks = [mask_of(segment_out, name) for name, *_ in IMAGES]
    overlays = [mask_of(os.path.join(segment_out, "overlays"), name) for name, *_ in IMAGES]
    mark = os.path.join(segment_out, ".predictions")  # a later --predict skips this folder
    assert sorted(written) == sorted(masks + overlays + [mark])


def test_segment_prediction_is_the_models_argmax_on_the_validation_input(
    images, segment_out, segment_ckpt, tmp_path
):
    """The PNG's pixels as .npy through SegmentValPipeline, the model run by hand, its logits resized
    bilinearly to the image's size: their argmax is the mask --predict wrote."""
    name, h, w, _ = IMAGES[1]
    np.save(tmp_path / "x.npy", np.asarray(Image.open(os.path.join(images, name))))
    np.save(tmp_path / "m.npy", np.zeros((h, w), np.uint8))
    pipe = fetch_dali_loader(
        [str(tmp_path / "x.npy")], [str(tmp_path / "m.npy")], 1, "eval", device_id=None, size=64
    )
    (batch,) = list(segment_iterator(pipe))
    model = UNet(3, 3, width=8)
    model.load_state_dict(torch.load(segment_ckpt, weights_only=True)["model"])
    with torch.no_grad():
        logits = model.eval()(batch[0]["image"])
    logits = torch.nn.functional.interpolate(logits, size=(h, w), mode="bilinear")
    expected = logits[0].argmax(0).numpy()
    assert len(np.unique(expected)) > 1  # not a constant answer
    np.testing.assert_array_equal(read_png(mask_of(segment_out, name))[2], expected)


def test_segment_tta_gives_a_flipped_image_the_flipped_prediction(segment_ckpt, tmp_path):
    rng = np.random.default_rng(1)
    pixels = rng.integers(0, 256, (45, 70, 3), dtype=np.uint8)
    os.makedirs(tmp_path / "in")
    Image.fromarray(pixels).save(tmp_path / "in" / "a.png")
    Image.fromarray(pixels[:, ::-1]).save(tmp_path / "in" / "b.png")
    out = str(tmp_path / "out")
    proc = run(
        "train_segment.py", "--predict", str(tmp_path / "in"), "--resume", segment_ckpt,
        "--tta", "--output-dir", out,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    a, b = read_png(os.path.join(out, "a.png"))[2], read_png(os.path.join(out, "b.png"))[2]
    assert len(np.unique(a)) > 1
    # the four views' probabilities are summed in another order for the flipped image: a tie
    # broken the other way by a rounding is allowed, a handful of pixels at most
    assert (a[:, ::-1] != b).sum() <= 3


def test_segment_refuses_to_overwrite_and_names_the_first_existing_output(
    images, segment_out, segment_ckpt
):
    before = open(mask_of(segment_out, IMAGES[0][0]), "rb").read()
    common = ["--predict", images, "--resume", segment_ckpt, "--output-dir", segment_out]
    proc = run("train_segment.py", *common)
    assert_one_line_error(proc, f"{mask_of(segment_out, IMAGES[0][0])}: exists", "--overwrite")
    assert open(mask_of(segment_out, IMAGES[0][0]), "rb").read() == before
    proc = run("train_segment.py", *common, "--overwrite")
    assert proc.returncode == 0, proc.stderr
    assert open(mask_of(segment_out, IMAGES[0][0]), "rb").read() == before


def test_segment_errors_name_the_undecodable_file_the_empty_and_the_missing_folder(
    segment_ckpt, tmp_path
):
    bad = write_images(tmp_path / "bad", IMAGES[:1])
    (tmp_path / "bad" / "sub").mkdir()
    (tmp_path / "bad" / "sub" / "notes.png").write_text("not an image\n")
    (tmp_path / "empty" / "sub").mkdir(parents=True)
    (tmp_path / "empty" / "sub" / "readme.txt").write_text("no image here\n")
    # batch 2, two files: DALI 2.4 can crash (SIGSEGV) when many decodes fail in one batch, as when
    # the reader fills a last batch with copies of a bad last file (its classification pipelines too)
    common = ["--resume", segment_ckpt, "--output-dir", str(tmp_path / "out"), "-b", "2"]
    proc = run("train_segment.py", "--predict", bad, *common)
    assert_one_line_error(proc, f"{tmp_path / 'bad' / 'sub' / 'notes.png'}: cannot decode")
    proc = run("train_segment.py", "--predict", str(tmp_path / "empty"), *common)
    assert_one_line_error(proc, f"--predict {tmp_path / 'empty'}: ", "expected PNG or JPEG files")
    proc = run("train_segment.py", "--predict", str(tmp_path / "none"), *common)
    assert_one_line_error(proc, f"--predict {tmp_path / 'none'}: no such directory")


def test_predict_pipeline_shards_give_every_image_once_with_its_shape(images):
    files = [os.path.join(images, name) for name, *_ in IMAGES] * 2  # 6 files, 2 shards, batch 2
    seen = []
    for shard in (0, 1):
        pipe = SegmentPredictPipeline(
            2, 1, None, images, files, size=32, shard_id=shard, num_shards=2
        )
        for batch in predict_iterator(pipe):
            for shape, k in zip(batch[0]["shape"].tolist(), batch[0]["index"].flatten().tolist()):
                seen.append(k)
                assert shape == [*IMAGES[k % 3][1:3], 3]  # RGB, the grey PNG too
    assert sorted(seen) == list(range(6))


def test_segment_two_processes_under_torchrun_write_every_image_as_one_does(
    images, segment_out, segment_ckpt, tmp_path
):
    out = str(tmp_path / "out")
    launcher = (sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2")
    proc = run(
        "train_segment.py", "--predict", images, "--resume", segment_ckpt, "--output-dir", out,
        "-b", "1", launcher=(*launcher, "--master_port=29537"),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    for name, *_ in IMAGES:
        assert (
            read_png(mask_of(out, name))[2].tolist()
            == read_png(mask_of(segment_out, name))[2].tolist()
        )
    written = [f for _, _, names in os.walk(out) for f in names]
    assert sorted(written).count(".predictions") == 1  # the mark a later --predict skips
    assert len(written) == 2 * len(IMAGES) + 1  # no temporary file left behind


@gpu
def test_segment_predict_on_the_gpu_matches_the_cpu(images, segment_out, segment_ckpt, tmp_path):
    out = str(tmp_path / "out")
    proc = run(
        "train_segment.py", "--predict", images, "--resume", segment_ckpt, "--output-dir", out,
        env=os.environ,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    for name, h, w, _ in IMAGES:
        mode, size, values = read_png(mask_of(out, name))
        assert mode == "P" and size == (w, h)
        # GPU resizes and convolutions round differently: nearly every pixel agrees
        assert (values == read_png(mask_of(segment_out, name))[2]).mean() > 0.95


# ------------------------------------------------------------------------------------------
# classification
# ------------------------------------------------------------------------------------------

CLASSES = ["a", "b", "c", "d", "e", "f"]


@pytest.fixture(scope="module")
def classify_ckpt(tmp_path_factory):
    root = tiny_imagefolder(str(tmp_path_factory.mktemp("cls") / "data"), CLASSES, CLASSES, 2)
    out = os.path.join(os.path.dirname(root), "out")
    flags = ["--arch", "resnet18", "--crop-size", "32", "--val-resize-size", "36", "-b", "4"]
    proc = run("train_classify.py", "--data", root, *flags, "--epochs", "1", "--output-dir", out)
    assert proc.returncode == 0, proc.stderr
    return os.path.join(out, "checkpoint.pth")


def predictions(out):
    with open(os.path.join(out, "predictions.csv"), newline="") as f:
        return list(csv.reader(f))


def test_classify_predictions_csv_has_the_top5_of_every_image(images, classify_ckpt, tmp_path):
    out = str(tmp_path / "out")
    proc = run(
        "train_classify.py", "--predict", images, "--resume", classify_ckpt, "--output-dir", out
    )
    assert proc.returncode == 0, proc.stderr
    header, *rows = predictions(out)
    assert header == ["path"] + [f"{c}{n}" for n in range(1, 6) for c in ("class", "prob")]
    assert sorted(row[0] for row in rows) == sorted(name for name, *_ in IMAGES)
    for row in rows:
        names, probs = row[1::2], [float(p) for p in row[2::2]]
        assert len(set(names)) == 5 and set(names) <= set(CLASSES)
        assert probs == sorted(probs, reverse=True) and 0 < sum(probs) <= 1 + 1e-5
    proc = run(
        "train_classify.py", "--predict", images, "--resume", classify_ckpt, "--output-dir", out
    )
    assert_one_line_error(proc, f"{os.path.join(out, 'predictions.csv')}: exists")


def test_classify_two_processes_under_torchrun_give_one_row_per_image(
    images, classify_ckpt, tmp_path
):
    launcher = (sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2")
    out = str(tmp_path / "out")
    proc = run(
        "train_classify.py", "--predict", images, "--resume", classify_ckpt, "--output-dir", out,
        "-b", "1", launcher=(*launcher, "--master_port=29538"),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [row[0] for row in predictions(out)[1:]] == sorted(name for name, *_ in IMAGES)


@pytest.mark.parametrize("trainer", ["train_classify.py", "train_segment.py"])
def test_a_file_that_is_not_an_image_is_named_at_the_default_batch(
    trainer, classify_ckpt, segment_ckpt, tmp_path
):
    # DALI 2.4 killed the process (SIGSEGV) in some runs when such a file failed to decode in a
    # first batch of 32 or more (--predict's default batch): now it is refused when listed
    ckpt = classify_ckpt if trainer == "train_classify.py" else segment_ckpt
    folder = write_images(tmp_path / "in", [(f"{k}.png", 20, 24, 3) for k in range(40)])
    bad = tmp_path / "in" / "scan.jpg"
    bad.write_bytes(b"%PDF-1.4\n" + bytes(200))
    out = tmp_path / "out"
    proc = run(trainer, "--predict", folder, "--resume", ckpt, "--output-dir", str(out))
    assert_one_line_error(
        proc,
        f"{bad}: cannot decode this image: not an image file (its first bytes are b'%PDF-1.4'",
    )
    assert not out.exists() or os.listdir(out) == []


# ------------------------------------------------------------------------------------------
# --predict at its edges, both trainers
# ------------------------------------------------------------------------------------------

SCRIPTS = {"classify": "train_classify.py", "segment": "train_segment.py"}


@pytest.fixture(params=["classify", "segment"])
def trained(request):
    """(script, checkpoint) of each trainer."""
    return SCRIPTS[request.param], request.getfixturevalue(f"{request.param}_ckpt")


def test_predict_resume_auto_without_a_checkpoint_is_one_line(images, trained, tmp_path):
    script, _ = trained
    out = str(tmp_path / "out")
    proc = run(script, "--predict", images, "--resume", "auto", "--output-dir", out)
    assert_one_line_error(
        proc, f"error: --resume auto: no checkpoint.pth in --output-dir {out} to predict with; "
    )
    assert not os.path.exists(out)


def test_predict_into_a_file_is_one_line_and_keeps_it(images, trained, tmp_path):
    script, ckpt = trained
    out = tmp_path / "out"
    out.write_text("mine")
    proc = run(script, "--predict", images, "--resume", ckpt, "--output-dir", str(out))
    assert_one_line_error(proc, f"error: --output-dir {out}: is a file; expected a folder")
    assert out.read_text() == "mine"


def test_predict_into_its_own_folder_writes_the_csv_there_and_refuses_masks(trained, tmp_path):
    """predictions.csv beside the images is no image a later run reads; masks over the images'
    own names would replace them."""
    script, ckpt = trained
    folder = write_images(tmp_path / "in")
    before = {name: open(os.path.join(folder, name), "rb").read() for name, *_ in IMAGES}
    proc = run(script, "--predict", folder, "--resume", ckpt, "--output-dir", folder)
    if script == "train_classify.py":
        assert proc.returncode == 0, proc.stderr
        rows = predictions(folder)[1:]
        assert sorted(row[0] for row in rows) == sorted(name for name, *_ in IMAGES)
    else:
        assert_one_line_error(
            proc, f"error: --output-dir {folder}: is --predict {folder} or holds it, so the masks"
        )
        assert sorted(os.listdir(folder)) == ["g.png", "sub"]
    assert {name: open(os.path.join(folder, name), "rb").read() for name in before} == before


def test_predict_with_fewer_images_than_processes_is_one_line(trained, tmp_path):
    script, ckpt = trained
    folder = write_images(tmp_path / "in", IMAGES[:1])
    out = str(tmp_path / "out")
    proc = run(
        script, "--predict", folder, "--resume", ckpt, "--output-dir", out, "-b", "1",
        launcher=(sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
                  "--master_port=29539"),
    )  # fmt: skip
    assert proc.returncode != 0
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert errors and set(errors) == {
        f"error: --predict {folder}: fewer images (1) than processes (2); each process needs one: "
        "run at most 1"
    }, proc.stderr[-3000:]
    # torchrun's own traceback of its failed child follows; the workers' DALI never started
    assert "nvidia/dali" not in proc.stderr and not os.path.exists(out)


def test_predict_refuses_an_image_too_large_to_decode_from_its_header(trained, tmp_path):
    script, ckpt = trained
    folder = write_images(tmp_path / "in")
    big = os.path.join(folder, "big.png")
    Image.new("L", (PREDICT_MAX_PIXELS // 4000 + 1, 4000)).save(big)
    out = str(tmp_path / "out")
    proc = run(script, "--predict", folder, "--resume", ckpt, "--output-dir", out)
    assert_one_line_error(
        proc, f"error: {big}: {PREDICT_MAX_PIXELS // 4000 + 1} x 4000 pixels, more than --predict "
    )
    assert not os.path.exists(out)


def test_predict_on_a_full_disk_is_one_line_and_leaves_no_part_file(images, trained, tmp_path):
    script, ckpt = trained
    out = tmp_path / "out"
    full = tmp_path / "full.py"  # DISK_FULL, opening /dev/full in binary mode where asked
    full.write_text(
        DISK_FULL.replace('"/dev/full", "w"', '"/dev/full", "wb" if "b" in mode else "w"')
    )
    proc = subprocess.run(
        [sys.executable, str(full), os.path.join(HERE, script), "--predict", images,
         "--resume", ckpt, "--output-dir", str(out)],
        cwd=HERE, capture_output=True, text=True, timeout=600,
        env={**CPU_ENV, "FULL_DIR": str(out)},
    )  # fmt: skip
    first = "predictions.csv" if script == "train_classify.py" else "g.png"
    assert_one_line_error(
        proc,
        f"error: {out / first}: could not write it (No space left on device); the outputs "
        "written before it are kept, none is half-written",
    )
    assert [f for _, _, names in os.walk(out) for f in names] == []


def test_a_second_predict_inside_its_input_skips_the_first_ones_outputs(
    images, segment_ckpt, tmp_path
):
    """Masks and overlays written into a folder inside --predict's DIR were predicted on by a second
    run into another folder there; the first run's folder holds a mark that keeps them out."""
    folder = write_images(tmp_path / "in")
    for out in ("first", "second"):
        proc = run(
            "train_segment.py", "--predict", folder, "--resume", segment_ckpt, "--output-dir",
            os.path.join(folder, out),
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        assert f"--predict: {len(IMAGES)} images of {folder}" in proc.stdout
    second = [
        os.path.join(d, f) for d, _, names in os.walk(os.path.join(folder, "second")) for f in names
    ]
    assert len([f for f in second if f.endswith(".png")]) == 2 * len(IMAGES)


def test_predict_refuses_an_image_past_pils_own_limit_in_one_line(trained, tmp_path):
    """A PNG whose header says 20,000 x 20,000 pixels (over PIL's own limit, which raised from its
    size check); only its header is written."""
    script, ckpt = trained
    folder = write_images(tmp_path / "in")
    big = os.path.join(folder, "huge.png")

    def chunk(kind, data):
        return (
            struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
        )

    header = chunk(b"IHDR", struct.pack(">IIBBBBB", 20000, 20000, 8, 0, 0, 0, 0))
    with open(big, "wb") as f:  # a first data chunk that holds nothing, then the end
        f.write(
            b"\x89PNG\r\n\x1a\n" + header + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b"")
        )
    out = str(tmp_path / "out")
    proc = run(script, "--predict", folder, "--resume", ckpt, "--output-dir", out)
    assert_one_line_error(
        proc, f"error: {big}: more pixels than PIL opens, more than --predict takes"
    )
    assert not os.path.exists(out)


@pytest.mark.parametrize("trainer", ["train_classify.py", "train_segment.py"])
def test_a_jpeg_whose_header_breaks_is_named_not_a_crash(
    trainer, classify_ckpt, segment_ckpt, tmp_path
):
    """FF D8 FF E0 and random bytes: DALI 2.4 killed --predict (SIGSEGV) in 9 runs of 10 at its
    default batch; it is refused, from its header, when listed."""
    ckpt = classify_ckpt if trainer == "train_classify.py" else segment_ckpt
    folder = write_images(tmp_path / "in", [(f"{k}.png", 20, 24, 3) for k in range(40)])
    bad = tmp_path / "in" / "photo.jpg"
    bad.write_bytes(
        b"\xff\xd8\xff\xe0" + np.random.default_rng(0).integers(0, 256, 3000, np.uint8).tobytes()
    )
    proc = run(
        trainer, "--predict", folder, "--resume", ckpt, "--output-dir", str(tmp_path / "out")
    )
    assert_one_line_error(
        proc, f"{bad}: cannot decode this image: its header is broken or cut short"
    )
