"""Data in object storage: train_classify.py --data s3://... against a real S3 server, moto's, started here on
127.0.0.1 (requirements.txt installs boto3, moto and Flask). Every layout reads the samples, labels and pixels that the same
set gives from local disk; a run killed mid-epoch resumes to the uninterrupted run's weights; each way the store can
fail is one error line."""

import json
import os
import re
import socket
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest
import torch

import data_sources
import pipelines
from make_shards import make_shards
from test_train_classify import (
    CPU_ENV,
    SCRIPT,
    TINY,
    assert_one_line_error,
    assert_resume_is_exact,
    final_weights,
    records,
    run,
    started_training,
    tiny_imagefolder,
)

boto3 = pytest.importorskip("boto3")
pytest.importorskip("moto.server")  # moto's standalone server (Flask)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_moto(**env):
    """moto's S3 server on a free port of 127.0.0.1, once it listens: (process, endpoint URL)."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, **env},
    )
    deadline = time.time() + 60
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc, f"http://127.0.0.1:{port}"
        except OSError:
            assert proc.poll() is None and time.time() < deadline, "moto's server did not start"
            time.sleep(0.1)


def stop(proc):
    proc.terminate()
    proc.wait()


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """A server for the module, a bucket on it, its variables in this process and in the trainers' CPU_ENV."""
    proc, endpoint = start_moto()
    nothing = str(
        tmp_path_factory.mktemp("aws") / "none"
    )  # no credentials or config files of the machine's
    env = {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_SHARED_CREDENTIALS_FILE": nothing,
        "AWS_CONFIG_FILE": nothing,
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    saved = dict(CPU_ENV)
    CPU_ENV.update(env)  # run() and the resume helpers start the trainer with CPU_ENV
    try:
        with pytest.MonkeyPatch.context() as mp:
            for k, v in env.items():
                mp.setenv(k, v)
            clear_caches()
            client = boto3.client("s3")
            client.create_bucket(Bucket="bkt")
            yield SimpleNamespace(client=client, env=env)
            clear_caches()
    finally:
        CPU_ENV.clear()
        CPU_ENV.update(saved)
        stop(proc)


def clear_caches():
    for cached in (data_sources.s3_client, data_sources.s3_files, data_sources.s3_tree):
        cached.cache_clear()


def upload(client, root, prefix, skip=lambda name: False):
    """Every file under ``root`` to s3://bkt/``prefix``/, as it is."""
    for folder, _, names in os.walk(root):
        for name in names:
            if not skip(name):
                path = os.path.join(folder, name)
                client.upload_file(path, "bkt", f"{prefix}/{os.path.relpath(path, root)}")
    return f"s3://bkt/{prefix}"


@pytest.fixture(scope="module")
def sets(s3, tmp_path_factory):
    """The same 24 + 24 images as an ImageFolder tree, WebDataset tars and TFRecords (shards of 5), each on local
    disk and uploaded: {layout: (local root, s3:// URL)}."""
    root = tmp_path_factory.mktemp("sets")
    folder = tiny_imagefolder(str(root / "folder"), per_class=12)
    make_shards(folder, str(root / "wds"), "wds", shard_size=5, seed=0)
    make_shards(folder, str(root / "tfrecord"), "tfrecord", shard_size=5, seed=0)
    return {
        layout: (str(root / layout), upload(s3.client, str(root / layout), layout))
        for layout in ("folder", "wds", "tfrecord")
    }


def epoch(pipe):
    batches = [
        (b[0]["data"].clone(), b[0]["label"].clone()) for b in pipelines.classify_iterator(pipe)
    ]
    return torch.cat([images for images, _ in batches]), torch.cat(
        [labels for _, labels in batches]
    )


@pytest.mark.parametrize("layout", ["folder", "wds", "tfrecord"])
def test_each_layout_from_s3_gives_the_samples_labels_and_pixels_of_local_disk(
    sets, layout, monkeypatch
):
    """Both shards of two, training (shuffled, augmented, padded) and validation, batch for batch."""
    # DALI's Webdataset reader fetches each sample of its initial fill on its own, this tiny set many times over
    monkeypatch.setattr(data_sources, "SHUFFLE_BUFFER", 64)
    local, url = sets[layout]
    for shard_id in (0, 1):
        args = dict(
            num_threads=1, device_id=None, crop_size=32, seed=7, shard_id=shard_id, num_shards=2
        )
        pipes = [
            pipelines.ClassifyTrainPipeline(4, data_dir=os.path.join(d, "train"), **args)
            for d in (local, url)
        ]
        assert [(p.layout, p.num_samples, p.classes) for p in pipes] == [
            (layout, 24, ["a", "b"])
        ] * 2
        assert pipes[1].files[0].startswith(url + "/train/")
        (images, labels), (s3_images, s3_labels) = map(epoch, pipes)
        assert len(labels) == 12 and labels.unique().tolist() == [0, 1]
        assert torch.equal(labels, s3_labels) and torch.equal(images, s3_images)
        val = [
            pipelines.ClassifyValPipeline(
                4, data_dir=os.path.join(d, "val"), classes=["a", "b"], resize_size=36, **args
            )
            for d in (local, url)
        ]
        (images, labels), (s3_images, s3_labels) = map(epoch, val)
        assert (
            len(labels) == 12 and torch.equal(labels, s3_labels) and torch.equal(images, s3_images)
        )


# The trainers' runs read TFRecords: the Webdataset reader's initial fill of SHUFFLE_BUFFER samples takes half a
# minute from this server (see the test above).


def test_training_from_s3_ends_with_the_weights_of_training_from_local_disk(sets, tmp_path):
    local, url = sets["tfrecord"]
    proc = run("--data", url, *TINY, "--output-dir", str(tmp_path / "s3"))
    (line,) = [line for line in proc.stdout.splitlines() if line.startswith("start: ")]
    assert line.endswith(
        f"  data {url}  layout tfrecord  train_samples 24  val_samples 24  classes 2"
    )
    run("--data", local, *TINY, "--output-dir", str(tmp_path / "local"))
    (start,) = records(str(tmp_path / "s3"), "start")
    assert (start["data"], start["layout"], start["train_samples"], start["val_samples"]) == (
        url,
        "tfrecord",
        24,
        24,
    )
    assert [r["loss"] for r in records(str(tmp_path / "s3"), "train")] == [
        r["loss"] for r in records(str(tmp_path / "local"), "train")
    ]
    a, b = final_weights(str(tmp_path / "s3")), final_weights(str(tmp_path / "local"))
    assert all(torch.equal(a[k], b[k]) for k in a)


gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@gpu
@pytest.mark.parametrize("decoder", ["mixed", "cpu"])
def test_gpu_pipeline_on_s3_bytes_gives_the_batches_of_local_disk(sets, decoder):
    local, url = sets["tfrecord"]
    args = dict(num_threads=2, device_id=0, crop_size=32, seed=7, decoder=decoder)
    pipes = [
        pipelines.ClassifyTrainPipeline(4, data_dir=os.path.join(d, "train"), **args)
        for d in (local, url)
    ]
    (images, labels), (s3_images, s3_labels) = map(epoch, pipes)
    assert (
        images.is_cuda
        and images.shape == (24, 3, 32, 32)
        and torch.equal(labels.cpu(), s3_labels.cpu())
    )
    assert (
        images - s3_images
    ).abs().max().item() <= 1 / 255 / 0.224  # the same bytes: one 8-bit level at most


@gpu
def test_training_on_the_gpu_from_s3_logs_the_layout_and_keeps_the_cache_off(sets, tmp_path):
    url, out = sets["tfrecord"][1], str(tmp_path / "gpu")
    proc = run(
        "--data",
        url,
        *[f for f in TINY if f not in ("--dali-device", "cpu")],
        "--output-dir",
        out,
        env={**os.environ, **{k: v for k, v in CPU_ENV.items() if k.startswith("AWS")}},
    )
    # on a GPU the cache's decision comes first, after the notes of a fresh run's defaults
    lines = [line for line in proc.stdout.splitlines() if not line.startswith("note: ")]
    assert (
        lines[0]
        == "decoder cache off (auto): not for data in object storage, whose images it cannot sample"
    )
    assert lines[1].endswith(
        f"  data {url}  layout tfrecord  train_samples 24  val_samples 24  classes 2"
    ), lines[:3]
    (decision,) = records(out, "decoder_cache")
    assert decision["mb"] is None and records(out, "config")[0]["args"]["dali_device"] == "gpu"
    (last,) = records(out, "epoch")
    assert last["epoch"] == 1 and 0 <= last["val_top1"] <= 100


def test_mid_epoch_resume_from_s3_gives_the_uninterrupted_weights(sets, tmp_path):
    assert_resume_is_exact(
        SCRIPT,
        ["--data", sets["tfrecord"][1], *TINY, "--epochs", "2", "--checkpoint-every", "2"],
        tmp_path,
    )


# ------------------------------------------------------------------------------------------
# the store fails: one error line, exit status 2, nothing written
# ------------------------------------------------------------------------------------------


def run_fails(url, tmp_path, env=None):
    out = str(tmp_path / "o")
    proc = run(
        "--data", url, *TINY, "--output-dir", out, check=False, env={**CPU_ENV, **(env or {})}
    )
    return proc, out


def test_error_no_such_bucket_or_prefix(s3, tmp_path):
    proc, out = run_fails("s3://nosuchbucket/set", tmp_path)
    assert_one_line_error(
        proc, f"s3://nosuchbucket/set/train: no such bucket at {s3.env['AWS_ENDPOINT_URL']}"
    )
    assert not os.path.exists(out)
    proc, out = run_fails("s3://bkt/nosuchprefix", tmp_path)
    assert_one_line_error(proc, "--data s3://bkt/nosuchprefix: expected subfolders train/ and val/")
    assert not os.path.exists(out)


def test_error_no_credentials(sets, tmp_path):
    proc, out = run_fails(
        sets["wds"][1], tmp_path, env={"AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": ""}
    )
    assert_one_line_error(
        proc, "s3://bkt/wds/train: no AWS credentials found (set AWS_ACCESS_KEY_ID"
    )
    assert not os.path.exists(out)


def test_error_access_denied(s3, tmp_path):
    # a server that checks credentials after its first three requests: a bucket, a user, the user's key
    proc, endpoint = start_moto(INITIAL_NO_AUTH_ACTION_COUNT="3")
    try:
        access_denied(endpoint, tmp_path)
    finally:
        stop(proc)


def access_denied(endpoint, tmp_path):
    admin = dict(
        endpoint_url=endpoint,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        region_name="us-east-1",
    )
    boto3.client("s3", **admin).create_bucket(Bucket="locked")
    iam = boto3.client("iam", **admin)
    iam.create_user(UserName="nobody")
    key = iam.create_access_key(UserName="nobody")[
        "AccessKey"
    ]  # a user with no policy: may read nothing
    for key_id, secret, code in (
        (key["AccessKeyId"], key["SecretAccessKey"], "AccessDenied"),
        ("unknown", "testing", "InvalidAccessKeyId"),
    ):
        proc, out = run_fails(
            "s3://locked/set",
            tmp_path,
            env={
                "AWS_ENDPOINT_URL": endpoint,
                "AWS_ACCESS_KEY_ID": key_id,
                "AWS_SECRET_ACCESS_KEY": secret,
            },
        )
        assert_one_line_error(
            proc, f"s3://locked/set/train: access denied ({code}: ", "check the credentials"
        )
        assert not os.path.exists(out)


def test_error_objects_listed_but_not_readable(tmp_path):
    """Credentials that may list the bucket but not get its objects: DALI's read says only "S3 Object not found"."""
    folder = tiny_imagefolder(str(tmp_path / "folder"), per_class=2)
    count = sum(len(names) for _, _, names in os.walk(folder))
    # a server that checks credentials after the bucket, its objects, a user, its policy and its key
    proc, endpoint = start_moto(INITIAL_NO_AUTH_ACTION_COUNT=str(count + 4))
    try:
        admin = dict(
            endpoint_url=endpoint,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            region_name="us-east-1",
        )
        client = boto3.client("s3", **admin)
        client.create_bucket(Bucket="bkt")
        url = upload(client, folder, "listed")
        iam = boto3.client("iam", **admin)
        iam.create_user(UserName="lister")
        may = {"Effect": "Allow", "Action": "s3:ListBucket", "Resource": "arn:aws:s3:::bkt"}
        iam.put_user_policy(
            UserName="lister",
            PolicyName="list-only",
            PolicyDocument=json.dumps({"Version": "2012-10-17", "Statement": [may]}),
        )
        key = iam.create_access_key(UserName="lister")["AccessKey"]
        env = {
            "AWS_ENDPOINT_URL": endpoint,
            "AWS_ACCESS_KEY_ID": key["AccessKeyId"],
            "AWS_SECRET_ACCESS_KEY": key["SecretAccessKey"],
        }
        proc_run, out = run_fails(url, tmp_path, env=env)
    finally:
        stop(proc)
    assert_one_line_error(
        proc_run, f"{url}/train/a/0.png: access denied (AccessDenied: ", "check the credentials"
    )
    assert not os.path.exists(out)


def test_error_an_endpoint_that_does_not_answer_is_a_bounded_wait(s3, tmp_path):
    with socket.socket() as silent:  # accepts connections (the kernel does) and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        endpoint = f"http://127.0.0.1:{silent.getsockname()[1]}"
        start = time.time()
        proc, out = run_fails(
            "s3://bkt/wds", tmp_path, env={"AWS_ENDPOINT_URL": endpoint, "AWS_MAX_ATTEMPTS": "1"}
        )
        took = time.time() - start
    assert_one_line_error(
        proc,
        f's3://bkt/wds/train: Read timeout on endpoint URL: "{endpoint}/bkt?',
        "check AWS_ENDPOINT_URL",
    )
    assert data_sources.S3_TIMEOUT <= took < data_sources.S3_TIMEOUT + 30 and not os.path.exists(
        out
    )
    proc, out = run_fails(
        "s3://bkt/wds", tmp_path, env={"AWS_ENDPOINT_URL": f"http://127.0.0.1:{free_port()}"}
    )
    assert_one_line_error(proc, "s3://bkt/wds/train: Could not connect to the endpoint URL")


def test_error_a_shard_without_its_index(s3, sets, tmp_path):
    url = upload(
        s3.client, sets["wds"][0], "wds-no-index", skip=lambda name: name == "train-000002.tar.idx"
    )
    proc, out = run_fails(url, tmp_path)
    assert_one_line_error(
        proc,
        f"{url}/train/train-000002.tar: no index beside it (train-000002.tar.idx and "
        f'train-000002.tar.idx.json); index a local copy (python -c "import data_sources; '
        f"data_sources.shard_index('train-000002.tar', 'wds')\") and upload",
    )
    assert not os.path.exists(os.path.join(out, "metrics.jsonl"))


def test_error_a_shard_rewritten_since_its_index(s3, sets, tmp_path):
    local = sets["tfrecord"][0]
    url = upload(s3.client, local, "tfrecord-rewritten")
    with open(os.path.join(local, "train", "train-00000-of-00005"), "rb") as f:
        shard = bytearray(f.read())
    shard[100] ^= 1  # one bit of an image: the same size, another digest
    s3.client.put_object(
        Bucket="bkt", Key="tfrecord-rewritten/train/train-00000-of-00005", Body=bytes(shard)
    )
    proc, out = run_fails(url, tmp_path)
    assert_one_line_error(proc, f"{url}/train/train-00000-of-00005: does not match its index")
    assert not os.path.exists(os.path.join(out, "metrics.jsonl"))


def test_error_a_shard_truncated_mid_run(s3, sets, tmp_path):
    """Cut short while the run trains, after it checked the shard: DALI's read fails; the line names the shard."""
    url = upload(s3.client, sets["tfrecord"][0], "tfrecord-truncated")
    out = str(tmp_path / "o")
    proc = started_training(out, "--data", url, "--epochs", "2")
    with open(os.path.join(sets["tfrecord"][0], "train", "train-00001-of-00005"), "rb") as f:
        s3.client.put_object(
            Bucket="bkt", Key="tfrecord-truncated/train/train-00001-of-00005", Body=f.read(300)
        )
    _, stderr = proc.communicate(timeout=300)
    assert_one_line_error(
        SimpleNamespace(returncode=proc.returncode, stderr=stderr),
        f"{url}/train/train-00001-of-00005: changed or gone since this run listed it (DALI: ",
    )
    assert re.search(
        r"\(DALI: \w.*\)$", stderr.strip()
    )  # DALI's own words (they depend on where its read was cut)
    assert len(records(out, "epoch")) < 2  # stopped before the run's end


@pytest.mark.parametrize("char", ["#", "?"])
def test_error_a_prefix_holding_a_character_dalis_s3_reader_cannot_read(s3, sets, char):
    url = upload(s3.client, sets["folder"][0], f"folder{char}1")
    with pytest.raises(
        data_sources.DataError,
        match=f"^{re.escape(url)}/val: DALI's S3 reader cannot read keys holding \\? or #; "
        "expected a prefix and object names without them$",
    ):
        epoch(pipelines.ClassifyValPipeline(4, 1, None, f"{url}/val", crop_size=32))


def test_an_object_replaced_by_one_of_the_same_size_is_found_changed(s3, sets):
    """Another image of the same byte count, other pixels: the listing's ETag tells them apart."""
    local = os.path.join(sets["folder"][0], "val")
    url = upload(s3.client, local, "folder-replaced/val")
    pipe = pipelines.ClassifyValPipeline(4, 1, None, url, crop_size=32, resize_size=36)
    assert data_sources.find_changed(pipe) is None
    with open(os.path.join(local, "b", "1.png"), "rb") as f:
        other = f.read()
    assert len(other) == os.path.getsize(os.path.join(local, "b", "0.png"))
    s3.client.put_object(Bucket="bkt", Key="folder-replaced/val/b/0.png", Body=other)
    assert data_sources.find_changed(pipe) == f"{url}/b/0.png"


def test_error_an_object_replaced_mid_run_by_one_of_the_same_size_stops_before_its_epoch_is_saved(
    s3, sets, tmp_path
):
    """DALI reads the new bytes without a word; the main process lists the store again at each
    epoch's end, before the checkpoint, and stops on the object's new ETag."""
    local = sets["folder"][0]
    url = upload(s3.client, local, "folder-replaced-mid-run")
    with open(os.path.join(local, "train", "b", "1.png"), "rb") as f:
        other = f.read()
    assert len(other) == os.path.getsize(os.path.join(local, "train", "b", "0.png"))
    out = str(tmp_path / "o")
    proc = started_training(out, "--data", url, "--epochs", "3")
    s3.client.put_object(Bucket="bkt", Key="folder-replaced-mid-run/train/b/0.png", Body=other)
    epochs_before = len(records(out, "epoch"))
    _, stderr = proc.communicate(timeout=300)
    assert_one_line_error(
        SimpleNamespace(returncode=proc.returncode, stderr=stderr),
        f"error: {url}/train/b/0.png: changed or gone since this run listed it (another size or "
        "ETag); the data must stay as listed for the whole run",
    )
    # the epoch it changed in is not saved (one more where the change came after that check)
    assert len(records(out, "epoch")) <= min(epochs_before + 1, 2)
    assert not records(out, "end")


def test_the_data_digest_follows_the_objects_not_their_prefix(s3, sets):
    local = os.path.join(sets["folder"][0], "val")
    a, b = (upload(s3.client, local, f"digest-{k}/val") for k in "ab")
    digest = data_sources.data_digest(a, data_sources.walk(a))
    assert data_sources.data_digest(b, data_sources.walk(b)) == digest
    with open(os.path.join(local, "b", "1.png"), "rb") as f:  # as many bytes as b/0.png
        s3.client.put_object(Bucket="bkt", Key="digest-b/val/b/0.png", Body=f.read())
    clear_caches()
    assert data_sources.data_digest(b, data_sources.walk(b)) != digest


def test_s3_data_without_boto3_is_one_error_line(tmp_path):
    hide = tmp_path / "hide"  # a sitecustomize that makes boto3 unimportable
    hide.mkdir()
    (hide / "sitecustomize.py").write_text("import sys\nsys.modules['boto3'] = None\n")
    proc, out = run_fails("s3://bkt/wds", tmp_path, env={"PYTHONPATH": str(hide)})
    assert_one_line_error(proc, "s3:// data needs the boto3 package (pip install boto3)")
    assert not os.path.exists(out)


def test_the_decoder_cache_is_off_for_data_in_object_storage_and_on_is_refused():
    pipe = SimpleNamespace(device_id=0, read=SimpleNamespace(data_dir="s3://bkt/wds/train"))
    assert data_sources.plan_decoder_cache("auto", [pipe], 80 * 1024) == (
        None,
        "decoder cache off (auto): not for data in object storage, whose images it cannot sample",
    )
    with pytest.raises(data_sources.DataError) as e:
        data_sources.plan_decoder_cache("on", [pipe], 80 * 1024)
    assert str(e.value) == (
        "--decoder-cache on: not for data in object storage, whose images it cannot sample; "
        "pass auto or off"
    )


# ------------------------------------------------------------------------------------------
# segmentation: a prepared root (csv_file/ and the .npy pairs) in the store, read by DALI's Numpy reader
# ------------------------------------------------------------------------------------------

SEGMENT = os.path.join(os.path.dirname(SCRIPT), "train_segment.py")
SEG_TINY = [
    "--size",
    "32",
    "--unet-width",
    "4",
    "--batch-size",
    "2",
    "--epochs",
    "1",
    "--dali-device",
    "cpu",
    "--workers",
    "1",
    "--print-freq",
    "1",
]


@pytest.fixture(scope="module")
def seg(s3, tmp_path_factory):
    """A prepared root of 16 pairs of 32 x 32, on local disk and uploaded: (local root, s3:// URL)."""
    from test_train_segment import prepared_root

    root = prepared_root(str(tmp_path_factory.mktemp("seg") / "p"), n=16, size=(32, 32))
    return root, upload(s3.client, root, "seg")


def test_segmentation_pairs_from_s3_give_the_batches_of_local_disk(seg):
    local, url = seg
    batches = []
    for root in seg:
        imgs, lbls = data_sources.read_split(root, "train")
        pipe = pipelines.fetch_dali_loader(
            imgs,
            lbls,
            4,
            "train",
            num_threads=1,
            device_id=None,
            size=(32, 32),
            shard_id=1,
            num_shards=2,
            seed=3,
        )
        batches.append(
            [
                (b[0]["image"].clone(), b[0]["mask"].clone())
                for b in pipelines.segment_iterator(pipe)
            ]
        )
    assert data_sources.read_split(url, "train")[0][0].startswith(url + "/Images/1/")
    (local_batches, s3_batches) = batches
    assert len(local_batches) == len(s3_batches) > 0
    for (image, mask), (s3_image, s3_mask) in zip(local_batches, s3_batches):
        assert (
            image.shape == (4, 3, 32, 32)
            and mask.shape == (4, 1, 32, 32)
            and mask.dtype == torch.uint8
        )
        assert torch.equal(image, s3_image) and torch.equal(mask, s3_mask)


def test_segmentation_training_from_s3_ends_with_the_weights_of_local_disk(seg, tmp_path):
    outs = [str(tmp_path / name) for name in ("local", "s3")]
    for root, out in zip(seg, outs):
        run("--data", root, *SEG_TINY, "--output-dir", out, script=SEGMENT)
    assert [r["loss"] for r in records(outs[0], "train")] == [
        r["loss"] for r in records(outs[1], "train")
    ]
    a, b = final_weights(outs[0]), final_weights(outs[1])
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_segmentation_mid_epoch_resume_from_s3_gives_the_uninterrupted_weights(seg, tmp_path):
    assert_resume_is_exact(
        SEGMENT, ["--data", seg[1], *SEG_TINY, "--epochs", "2", "--checkpoint-every", "2"], tmp_path
    )


def test_segmentation_errors_from_s3_name_the_object(s3, seg, tmp_path):
    local, _ = seg
    url = upload(s3.client, local, "seg-broken")
    s3.client.delete_object(
        Bucket="bkt", Key="seg-broken/Masks/1/3.npy"
    )  # a row's mask not in the store
    with open(
        os.path.join(local, "Masks", "1", "5.npy"), "rb"
    ) as f:  # cut short: its header needs more bytes
        s3.client.put_object(Bucket="bkt", Key="seg-broken/Masks/1/5.npy", Body=f.read()[:-100])
    ((split, index),) = [
        (split, row.split(",")[0])
        for split in ("train", "valid")
        for row in open(os.path.join(local, "csv_file", f"{split}.csv"))
        if "/3.npy" in row
    ]
    out = str(tmp_path / "o")
    proc = run("--data", url, *SEG_TINY, "--output-dir", out, script=SEGMENT, check=False)
    assert_one_line_error(
        proc, f"{url}/csv_file/{split}.csv row index {index}: {url}/Masks/1/3.npy: no such file"
    )
    s3.client.put_object(
        Bucket="bkt",
        Key="seg-broken/Masks/1/3.npy",
        Body=open(os.path.join(local, "Masks", "1", "3.npy"), "rb").read(),
    )
    proc = run("--data", url, *SEG_TINY, "--output-dir", out, script=SEGMENT, check=False)
    assert_one_line_error(proc, f"{url}/Masks/1/5.npy: truncated: ")
    proc = run(
        "--data",
        "s3://bkt/no-such-root",
        *SEG_TINY,
        "--output-dir",
        out,
        script=SEGMENT,
        check=False,
    )
    assert_one_line_error(
        proc,
        "--data s3://bkt/no-such-root: no such directory (expected a prepared root with csv_file/",
    )
    # The run folder the first two made is gone: a start that fails before training leaves none.
    assert not os.path.exists(out)
