"""Runs a script as h200-2026-12-03f's patch.py does (PADDINGS, DTYPE from the environment), and
with RESIZE=linear builds the training pipeline's resizes with DALI's linear filter and no
antialiasing (`resize_filter`; the trainer's is torchvision's antialiased triangle filter), and
with SPLIT=P trains on split.py's pipeline, P of the JPEGs decoded by DALI's CPU threads.
sweep.py's `trainer` lines name these variables.

    PYTHONPATH=.:$PYTHONPATH RESIZE=linear python3 patch.py train_classify.py ARGS...
"""

import contextlib
import functools
import os
import runpy
import sys

from nvidia.dali import types

import pipelines

HERE = os.path.dirname(os.path.abspath(__file__))


def forced(op, **fixed):
    return lambda *a, **k: op(*a, **{**k, **fixed})


@contextlib.contextmanager
def resize_filter(name):
    """With "linear", DALI's Resize and RandomResizedCrop (the resize with the decoder cache) are
    built with the linear filter and no antialiasing while in the block."""
    originals = pipelines.ops.Resize, pipelines.ops.RandomResizedCrop
    if name == "linear":
        cheaper = dict(interp_type=types.INTERP_LINEAR, antialias=False)
        pipelines.ops.Resize = forced(originals[0], **cheaper)
        pipelines.ops.RandomResizedCrop = forced(originals[1], **cheaper)
    try:
        yield
    finally:
        pipelines.ops.Resize, pipelines.ops.RandomResizedCrop = originals


if __name__ == "__main__":
    init = pipelines.ClassifyTrainPipeline.__init__

    @functools.wraps(init)
    def patched(self, *a, **k):
        with resize_filter(os.environ.get("RESIZE")):
            init(self, *a, **k)

    pipelines.ClassifyTrainPipeline.__init__ = patched
    if os.environ.get("SPLIT"):
        sys.path.insert(0, HERE)
        from split import SplitDecodePipeline

        class Split(SplitDecodePipeline):
            def __init__(self, *a, **k):
                super().__init__(*a, cpu_share=float(os.environ["SPLIT"]), **k)
                print(f"split.py's pipeline, cpu_share {os.environ['SPLIT']}", flush=True)

        pipelines.ClassifyTrainPipeline = Split
    sys.argv = [os.path.join(HERE, "..", "h200-2026-12-03f", "patch.py"), *sys.argv[1:]]
    runpy.run_path(sys.argv[0], run_name="__main__")
