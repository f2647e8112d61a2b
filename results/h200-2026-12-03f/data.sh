# The data of every call, made once DALI is up (bench.py imports it): bench.py's 8,192 JPEGs,
# linked as train/ and val/ of /tmp/jpegs, as issue 46 set up. Then what the machine offers for
# a look inside the step.
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
python3 - <<'PY'
import argparse, os, bench
root, _ = bench.jpeg_set(argparse.Namespace(data=None, cache_dir="/tmp/cache", num_images=8192, workers=16))
os.makedirs("/tmp/jpegs", exist_ok=True)
for split in ("train", "val"):
    if not os.path.exists(f"/tmp/jpegs/{split}"):
        os.symlink(os.path.abspath(root), f"/tmp/jpegs/{split}")
print("jpegs", root, flush=True)
PY
nproc; python3 -c "import torch, torchvision; print(torch.__version__, torchvision.__version__)"
which nsys ncu 2>&1 | head -2; nvidia-smi --query-gpu=name,power.limit,clocks.max.sm --format=csv
