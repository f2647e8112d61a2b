# The data of callA-callC, made once DALI is up (bench.py imports it): bench.py's 8,192 JPEGs,
# linked as train/ and val/ of /tmp/jpegs, and 2,000 demo pairs of 512 px as issue 46 set up,
# prepared into /tmp/seg.
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
python3 data_processing.py /tmp/segpng /tmp/seg --demo --demo-per-group 500 --demo-size 512 \
  > /tmp/seg.log 2>&1 &
python3 - <<'PY'
import argparse, os, bench
root, _ = bench.jpeg_set(argparse.Namespace(data=None, cache_dir="/tmp/cache", num_images=8192, workers=15))
os.makedirs("/tmp/jpegs", exist_ok=True)
for split in ("train", "val"):
    if not os.path.exists(f"/tmp/jpegs/{split}"):
        os.symlink(os.path.abspath(root), f"/tmp/jpegs/{split}")
print("jpegs", root, flush=True)
PY
wait
tail -n 1 /tmp/seg.log
nproc; python3 -c "import torch, torchvision; print(torch.__version__, torchvision.__version__)"
