"""Runs a script with the classification pipelines' prefetch_queue_depth set to DEPTH (the
trainers leave DALI's 2). callF.sh: feedcost.py under it.

    PYTHONPATH=.:$PYTHONPATH python3 depth.py DEPTH SCRIPT ARGS...
"""

import functools
import runpy
import sys

import pipelines

DEPTH = int(sys.argv[1])
init = pipelines._ClassifyPipeline.__init__


@functools.wraps(init)
def deeper(self, *a, **k):
    k["prefetch_queue_depth"] = DEPTH
    init(self, *a, **k)


pipelines._ClassifyPipeline.__init__ = deeper
sys.argv = sys.argv[2:]
runpy.run_path(sys.argv[0], run_name="__main__")
