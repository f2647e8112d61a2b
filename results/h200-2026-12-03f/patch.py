"""Runs a script with the classification pipelines' keyword arguments that have no trainer flag
set from the environment: PADDINGS=example (the mixed decoder's memory paddings of DALI's
ResNet-50 example), DTYPE=float16 (the pipelines' output type). sweep.py's `trainer` lines name
them.

    PYTHONPATH=.:$PYTHONPATH PADDINGS=example python3 patch.py train_classify.py ARGS...
"""

import functools
import os
import runpy
import sys

import pipelines

extra = {}
if os.environ.get("PADDINGS") == "example":
    extra.update(device_memory_padding=211025920, host_memory_padding=140544512)
if os.environ.get("DTYPE"):
    extra["dtype"] = os.environ["DTYPE"]
init = pipelines._ClassifyPipeline.__init__


@functools.wraps(init)
def patched(self, *a, **k):
    init(self, *a, **{**k, **extra})


pipelines._ClassifyPipeline.__init__ = patched
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
