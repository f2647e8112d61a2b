"""Runs a script with every torch.cuda.Stream at normal priority: the trainers' training stream
(training.setup_distributed asks for priority -1) as DALI's. callE.sh: feedcost.py under it.

    python3 noprio.py SCRIPT ARGS...
"""

import runpy
import sys

import torch

S = torch.cuda.Stream
torch.cuda.Stream = lambda *a, priority=0, **k: S(
    *a, **k
)  # the trainer's stream at normal priority
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
