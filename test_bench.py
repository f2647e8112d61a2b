"""Runs bench.py --quick as a user would, and checks what its JSON reports. About 20 s on 2 CPU cores."""

import json
import os
import subprocess
import sys

import pytest

from bench import (
    SWEEP_HW_DECODER_LOADS,
    SWEEP_OPTIONS,
    SWEEP_THREADS,
    TORCHVISION_AUTO_AUGMENT,
    ddp_report,
    parse_args,
)

REPO = os.path.dirname(os.path.abspath(__file__))
QUICK_IMAGES = 64


def bench(*args, timeout=300):
    result = subprocess.run(
        [sys.executable, "bench.py", "--quick", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    """One generating run shared by the tests: (its JSON, its stdout, its cache directory)."""
    tmp = tmp_path_factory.mktemp("bench")
    stdout = bench("--cache-dir", str(tmp / "cache"), "--json", str(tmp / "bench.json"))
    with open(tmp / "bench.json") as f:
        return json.load(f), stdout, tmp / "cache"


def test_quick_run_reports_every_section(quick_run):
    report, stdout, _ = quick_run
    assert {
        "meta",
        "dataset",
        "segmentation_dataset",
        "classification",
        "segmentation",
        "end_to_end",
        "sweep",
        "skipped",
    } <= report.keys()
    meta = report["meta"]
    assert "bench.py --quick" in meta["command"]
    assert {"dali", "torch", "torchvision", "python"} <= meta["versions"].keys()
    settings = meta["settings"]
    assert settings["gpu_threads"] == min(8, settings["workers"])  # the trainers' default -j
    assert f"GPU DALI threads {settings['gpu_threads']}" in stdout
    new_pool = os.environ.get("DALI_USE_NEW_THREAD_POOL") == "1"  # inherited by bench.py's process
    assert settings["dali_new_thread_pool"] is new_pool
    assert f"DALI_USE_NEW_THREAD_POOL {'1' if new_pool else 'unset'}" in stdout

    dataset = report["dataset"]
    assert dataset["images"] == QUICK_IMAGES and dataset["classes"] == 16
    assert 400**2 <= dataset["mean_pixels"] <= 500**2
    assert dataset["mean_kib"] > 0
    assert (
        report["segmentation_dataset"]["samples"] > 0
        and report["segmentation_dataset"]["mean_kib"] > 0
    )

    for section in ("classification", "segmentation"):
        rows = {row["loader"]: row for row in report[section]}
        assert {"dali-cpu", "dataloader"} <= rows.keys()
        if section == "classification":  # NVIDIA's example, the peer, on the CPU too
            assert "nvidia-example-cpu" in rows
        assert all(row["img_per_s"] > 0 and row["vs_dataloader"] > 0 for row in rows.values())
        assert rows["dataloader"]["vs_dataloader"] == 1.0

    if meta["gpu"] is None:
        assert report["end_to_end"] == [] and "end_to_end" in report["skipped"]
    else:
        assert {row["loader"] for row in report["end_to_end"]} == {
            "synthetic",
            "dali-mixed",
            "dali-mixed-hwc",
            "dali-mixed-hwc-fp16",
            "dali-cpu-decode-hwc",
            "dali-mixed-full",
            "dali-mixed-cached",
            "dali-mixed-half-cache",
            "dali-mixed-tenth-cache",
            "dali-mixed-tfrecord",
            "dali-mixed-wds",
            "nvidia-example",
        }
        assert all(
            row["img_per_s"] > 0 and 0 <= row["data_wait_pct"] <= 100
            for row in report["end_to_end"]
        )

    # The printed report carries the same numbers.
    assert f"{dataset['images']} JPEGs" in stdout
    assert f"{report['classification'][0]['img_per_s']:,.1f}" in stdout


def test_given_data_and_cache_reuse(quick_run, tmp_path):
    _, _, cache = quick_run
    jpegs = next((cache / "bench-jpegs").iterdir())
    stdout = bench(
        "--data",
        str(jpegs),
        "--cache-dir",
        str(cache),
        "--json",
        str(tmp_path / "given.json"),
        "--warmup",
        "1",
        "--iters",
        "1",
        "--sweep",
    )
    assert "generating" not in stdout  # the segmentation set is reused, the JPEGs are given
    with open(tmp_path / "given.json") as f:
        report = json.load(f)
    assert report["dataset"]["source"] == "given" and report["dataset"]["images"] == QUICK_IMAGES
    assert all(row["img_per_s"] > 0 for row in report["classification"] + report["segmentation"])
    if report["meta"]["gpu"] is None:
        assert "sweep" in report["skipped"]
    else:
        assert len(report["sweep"]) == len(SWEEP_THREADS) * len(SWEEP_HW_DECODER_LOADS) + len(
            SWEEP_OPTIONS
        )


def test_auto_augment_adds_each_loader_with_the_policy(quick_run, tmp_path):
    _, _, cache = quick_run
    bench(
        "--cache-dir",
        str(cache),
        "--json",
        str(tmp_path / "aa.json"),
        "--only",
        "dataloader",
        "--auto-augment",
        "ta_wide",
        "--iters",
        "2",
    )
    with open(tmp_path / "aa.json") as f:
        rows = json.load(f)["classification"]
    assert [row["loader"] for row in rows] == ["dataloader", "dataloader-ta_wide"]
    assert all(row["img_per_s"] > 0 for row in rows)
    # a word that names no loader measured nothing and exited 0
    typo = subprocess.run(
        [sys.executable, "bench.py", "--quick", "--cache-dir", str(cache), "--only", "datalaoder"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert typo.returncode == 2
    assert typo.stderr.splitlines()[-1].startswith(
        "error: --only datalaoder: datalaoder names none of "
    )


def test_ddp_report_gives_each_row_its_share_of_synthetic_and_its_scaling(tmp_path, capsys):
    args = parse_args(["--quick", "--json", str(tmp_path / "ddp.json")])
    args.gpu = False
    rate = {("synthetic", 1): 1000.0, ("dali-mixed", 1): 900.0}
    rate.update({("synthetic", 2): 1900.0, ("dali-mixed", 2): 1710.0})
    rows = [
        dict(model="resnet18", loader=loader, gpus=gpus, img_per_s=r, data_wait_pct=1.0)
        for (loader, gpus), r in rate.items()
    ]
    ddp_report(rows, args, world=2)
    shares = {(r["loader"], r["gpus"]): (r["vs_synthetic"], r["scaling"]) for r in rows}
    assert shares == {
        ("synthetic", 1): (1.0, 1.0),
        ("dali-mixed", 1): (0.9, 1.0),
        ("synthetic", 2): (1.0, 0.95),
        ("dali-mixed", 2): (0.9, 0.95),
    }
    assert "DDP: training img/s on 1 and 2 GPUs" in capsys.readouterr().out
    with open(tmp_path / "ddp.json") as f:
        assert json.load(f)["ddp"] == rows


def test_auto_augment_choices_are_the_pipelines_policies():
    # bench.py names them before pipelines.py loads, so that --help answers at once
    from pipelines import AUTO_AUGMENT

    for policy in AUTO_AUGMENT:
        assert parse_args(["--auto-augment", policy]).auto_augment == policy
    with pytest.raises(SystemExit):
        parse_args(["--auto-augment", "autoaugment"])
    assert set(TORCHVISION_AUTO_AUGMENT) == set(AUTO_AUGMENT)


# A stand-in trainer for share.py: two epochs of four steps, a line every two; its img/s is
# synthetic's or the loader's, each run's second epoch at twice its first; the loader's data wait
# 5 % an epoch
FAKE_TRAINER = """
import json, os, sys
out = sys.argv[sys.argv.index("--output-dir") + 1]
os.makedirs(out)
rate = 200.0 if "--loader" in sys.argv else 150.0
records = [{"type": "config", "args": {"batch_size": 4}, "world_size": 2}]
for epoch in (1, 2):
    for step in (2, 4):
        records.append(
            {"type": "train", "epoch": epoch, "step": step, "steps": 4, "img_s": rate * epoch / 2,
             "data_wait": 0.0 if "--loader" in sys.argv else 5.0 * epoch}
        )
with open(os.path.join(out, "metrics.jsonl"), "w") as f:
    f.write("".join(json.dumps(r) + "\\n" for r in records))
"""


def test_share_is_the_median_of_each_runs_windows_after_the_skipped_epochs(tmp_path):
    import share

    fake = tmp_path / "fake.py"
    fake.write_text(FAKE_TRAINER)
    rate, seconds, wait = share.run_rate([str(fake)], str(tmp_path / "o"), 1)
    # epoch 2's two windows of 2 steps of 4 images on each of 2 processes, at 150 img/s, 10 % wait
    assert rate == 150.0 and seconds == pytest.approx(2 * (2 * 4 * 2 / 150)) and wait == 10.0
    proc = subprocess.run(
        [sys.executable, "share.py", "--runs", "3", "--json", str(tmp_path / "s.json"), "--",
         str(fake), "--variant-flag"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[:2] == [
        "run 1/3 synthetic: 200 img/s, data wait 0.0 % (too short: 0 s timed)",
        "run 1/3 dali: 150 img/s, data wait 10.0 % (too short: 0 s timed)",
    ]
    assert lines[-2:] == [
        "synthetic: median 200 img/s, 200 to 200",
        "dali: median 150 img/s, share 75.0 % (75.0 to 75.0)",
    ]
    with open(tmp_path / "s.json") as f:
        report = json.load(f)
    assert report["rates"] == {"synthetic": [200.0] * 3, "dali": [150.0] * 3}
    assert report["data_wait"] == {"synthetic": [0.0] * 3, "dali": [10.0] * 3}


def test_share_refuses_fewer_than_three_runs():
    proc = subprocess.run(
        [sys.executable, "share.py", "--runs", "2", "--", "train_classify.py"],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2
    assert "error: expected --runs 3 or more and a trainer with its flags after --" in proc.stderr


@pytest.mark.parametrize("script", ["bench.py", "share.py"])
def test_json_into_a_folder_or_a_missing_folder_is_refused_before_measuring(tmp_path, script):
    """--json is written once the measuring is done: a path that cannot take the file is refused
    at once, not after the runs, with their results lost."""
    trainer = ["--runs", "3", "--", "train_classify.py"] if script == "share.py" else []
    for path, expected in [
        (tmp_path, f"{tmp_path} is a folder; expected a file name, such as "),
        (tmp_path / "none" / "r.json", f"{tmp_path / 'none' / 'r.json'}: its folder does not"),
    ]:
        proc = subprocess.run(
            [sys.executable, script, "--json", str(path), *trainer],
            cwd=REPO, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert proc.returncode == 2, proc.stderr
        assert f"argument --json: {expected}" in proc.stderr.splitlines()[-1]
        assert os.listdir(tmp_path) == [], "nothing measured, nothing written"


def test_startup_times_a_fresh_run_its_resume_and_a_new_run(tmp_path):
    """--startup: the first training step of a fresh run, of the same run resumed after a SIGTERM
    (as a requeue), and of a new run over the data the first checked; each --startup-runs times."""
    bench(
        "--startup", "1500", "--num-images", "8", "--models", "resnet18", "--batch-size", "4",
        "--workers", "1", "--startup-runs", "1", "--cache-dir", str(tmp_path / "cache"),
        "--json", str(tmp_path / "startup.json"),
    )  # fmt: skip
    with open(tmp_path / "startup.json") as f:
        report = json.load(f)["startup"]
    assert (report["train_images"], report["val_images"]) == (1500, 1000)
    tree = tmp_path / "cache" / "bench-startup" / "n1500-from-8"
    assert len(os.listdir(tree / "train")) == 1000 and len(os.listdir(tree / "val")) == 1000
    (run,) = report["runs"]
    assert len(run["load"]) == 3
    for start in ("fresh", "resume", "new_run"):
        seconds, last = run[start][-1]
        assert report["first_step_s"][start] == {"median": seconds, "runs": [seconds]}
        assert last.startswith("train: epoch 1  step "), last
    step = int(run["resume"][-1][1].split()[4])
    assert step > 1 and run["fresh"][-1][1].split()[4] == run["new_run"][-1][1].split()[4] == "1"
    assert any(f"after step {step - 1} of 375" in line for _, line in run["resume"]), run["resume"]
