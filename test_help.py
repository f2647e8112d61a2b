"""Every script's --help answers with its usage before torch, DALI or the project modules that load
them are imported: --help and a bad flag must answer at once."""

import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPTS = [
    "train_classify.py",
    "train_segment.py",
    "bench.py",
    "launch.py",
    "make_shards.py",
    "data_processing.py",
]
HEAVY = ["torch", "torchvision", "nvidia.dali", "numpy", "PIL", "pipelines", "data_sources"]

# Runs the script as `python SCRIPT --help` does, then prints its exit status and the heavy modules
# it imported.
HELP_RUN = """
import json, runpy, sys
sys.argv = [{script!r}, "--help"]
try:
    runpy.run_path({script!r}, run_name="__main__")
    code = None
except SystemExit as e:
    code = e.code
print(json.dumps(dict(code=code, heavy=[m for m in {heavy!r} if m in sys.modules])))
"""


def help_run(script):
    proc = subprocess.run(
        [sys.executable, "-c", HELP_RUN.format(script=script, heavy=HEAVY)],
        cwd=HERE,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    *help_lines, last = proc.stdout.splitlines()
    return "\n".join(help_lines), json.loads(last)


@pytest.mark.parametrize("script", SCRIPTS)
def test_help_prints_the_usage_without_loading_torch_or_dali(script):
    text, result = help_run(script)
    assert result == dict(code=0, heavy=[])
    assert text.startswith(f"usage: {script} ")


def test_launch_help_says_what_it_adds_and_where_torchruns_flags_are():
    proc = subprocess.run(
        [sys.executable, "launch.py", "--help"], cwd=HERE, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    assert "every stop signal reaches the workers" in proc.stdout
    assert "python -m torch.distributed.run --help" in proc.stdout


def test_launch_answers_help_before_the_training_script_only():
    from launch import asks_for_help

    assert asks_for_help(["-h"]) and asks_for_help(["--standalone", "--help"])
    assert not asks_for_help(["train_classify.py", "--help"])
    assert not asks_for_help(["--standalone", "train_classify.py", "-h"])
    assert not asks_for_help([])


@pytest.mark.parametrize("script", ["train_classify.py", "train_segment.py"])
def test_help_names_each_default_that_differs_from_the_anchors_and_the_table_is_ours(script):
    """The trainer's ANCHOR_DEFAULTS, one table: --help lists each row, and each row's "ours"
    holds the trainer's default (-b's, which the device sets, as its help says)."""
    import importlib

    trainer = importlib.import_module(script[:-3])
    parser = trainer.get_args_parser()
    text, _ = help_run(script)
    shown = " ".join(text.split())
    assert "Defaults that differ from the anchors', each with the flag that does as the anchor" in (
        shown
    )
    for dest, ours, *theirs in trainer.ANCHOR_DEFAULTS:
        assert ours in shown and all(t in shown for t in theirs if t), dest
        default = parser.get_default(dest)
        assert default is None or ours.endswith(f" {default}") or f" {default} " in ours, dest
    if script == "train_classify.py":
        assert (
            "--lr-scheduler cosine (torchvision's reference: --lr-scheduler steplr; DALI's "
            "ResNet-50 example: --lr-scheduler step, the nearest: it decays at epochs 30, 60 and "
            "80; pytorch/examples' main.py: --lr-scheduler step)" in shown
        )
