"""README's SLURM batch script, run whole with bash on the CPU: srun and scontrol are stand-ins on
PATH (srun runs its command on this machine, with the tiny data and flags of the tests, and can send
it SLURM's SIGUSR1 once training has started; scontrol names this machine and records its calls),
SLURM's variables are set by hand. A run that ends exits 0 and is not requeued; a run stopped by the
signal exits 128 + it and is requeued."""

import json
import os
import re
import signal
import socket
import subprocess
import sys

from test_ddp import TINY_RUN
from test_train_classify import CPU_ENV, tiny_imagefolder

HERE = os.path.dirname(os.path.abspath(__file__))
JOB_ID = "4242"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def readme_slurm_script():
    """The indented block of README.md's section on several nodes that starts with #!/bin/bash."""
    with open(os.path.join(HERE, "README.md")) as f:
        text = f.read()
    section = re.search(r"^## Several GPUs and several nodes\n(.*?)(?=^## )", text, re.S | re.M)
    assert section, "README.md has no section '## Several GPUs and several nodes'"
    block = re.search(r"^    #!/bin/bash\n(?:(?:    .*)?\n)*", section[1], re.M)
    assert block, "README.md's section on several nodes has no indented #!/bin/bash script"
    script = "\n".join(line[4:] for line in block[0].splitlines()).strip() + "\n"
    assert "srun " in script and "scontrol requeue" in script, script
    return script


# srun: the step on this machine, as SLURM would start it, with the README's paths and sizes
# replaced by the test's; with STOP_AFTER_STEPS, SIGUSR1 (SLURM's --signal) after that many steps.
SRUN = """#!{python}
import json, os, signal, subprocess, sys, time
swap = json.loads(os.environ["SRUN_SWAP"])
argv = [swap.get(a, a) for a in sys.argv[1:]]
argv[0] = sys.executable if argv[0] == "python" else argv[0]
proc = subprocess.Popen(argv + json.loads(os.environ["SRUN_EXTRA"]))
metrics, stop = os.environ["SRUN_METRICS"], int(os.environ.get("STOP_AFTER_STEPS", 0))
while stop and proc.poll() is None:
    if os.path.exists(metrics) and open(metrics).read().count('"type": "train"') >= stop:
        proc.send_signal(signal.SIGUSR1)
        break
    time.sleep(0.05)
sys.exit(proc.wait())
"""
SCONTROL = """#!/bin/sh
echo "$@" >> "$SCONTROL_LOG"
[ "$1" = show ] && echo 127.0.0.1
exit 0
"""


def run_batch_script(tmp_path, stop_after_steps=0):
    """README's script run by bash in ``tmp_path`` (a copy of the scripts beside it); (its
    completed process, scontrol's calls, the run folder)."""
    bin_dir, work = tmp_path / "bin", tmp_path / "work"
    bin_dir.mkdir()
    work.mkdir()
    for name in ("srun", "scontrol"):
        text = SRUN.format(python=sys.executable) if name == "srun" else SCONTROL
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    for name in os.listdir(HERE):
        if name.endswith(".py"):
            os.symlink(os.path.join(HERE, name), work / name)
    data = tiny_imagefolder(str(tmp_path / "data"), per_class=12)
    out = work / "runs" / "in1k"
    swap = {
        "/data/imagenet": data,
        "--nproc_per_node=8": "--nproc_per_node=1",
        "--rdzv-endpoint=127.0.0.1:29500": f"--rdzv-endpoint=127.0.0.1:{free_port()}",
    }
    (tmp_path / "job.sh").write_text(readme_slurm_script())
    proc = subprocess.run(
        ["bash", str(tmp_path / "job.sh")],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=600,
        env={
            **CPU_ENV,
            "PATH": f"{bin_dir}:{os.environ['PATH']}",
            "SLURM_JOB_ID": JOB_ID,
            "SLURM_NNODES": "1",
            "SCONTROL_LOG": str(tmp_path / "scontrol.log"),
            "SRUN_SWAP": json.dumps(swap),
            # README's -j 2 given again as -j: one flag under two names would be refused
            "SRUN_EXTRA": json.dumps(
                [
                    *("-j" if a == "--workers" else a for a in TINY_RUN),
                    "--epochs",
                    "2" if not stop_after_steps else "20",
                ]
            ),
            "SRUN_METRICS": str(out / "metrics.jsonl"),
            "STOP_AFTER_STEPS": str(stop_after_steps),
        },
    )
    return proc, (tmp_path / "scontrol.log").read_text().splitlines(), out


def test_readme_slurm_script_exits_0_after_a_finished_run_and_does_not_requeue(tmp_path):
    proc, calls, out = run_batch_script(tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert calls == ["show hostnames"]
    ends = [json.loads(r) for r in open(out / "metrics.jsonl") if '"type": "end"' in r]
    assert len(ends) == 1


def test_readme_slurm_script_requeues_a_run_stopped_by_slurms_signal(tmp_path):
    proc, calls, out = run_batch_script(tmp_path, stop_after_steps=2)
    assert proc.returncode == 128 + signal.SIGUSR1, proc.stderr[-3000:]
    assert calls == ["show hostnames", f"requeue {JOB_ID}"]
    assert "stopped by SIGUSR1 at epoch 1 step" in proc.stderr
    assert os.path.exists(out / "checkpoint.pth")
