# Data for the probes (bench.py's 8,192 JPEGs as train/ and val/; 500 demo pairs of 512 px), issue
# 48's bad-file checks on the GPU paths, then what holds the memory and what the segmentation
# augmentations cost (issue 46).
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
D=results/h200-2026-12-03c
python3 - <<'PY'
import argparse, os, bench
root, _ = bench.jpeg_set(argparse.Namespace(data=None, cache_dir="/tmp/cache", num_images=8192, workers=16))
os.makedirs("/tmp/jpegs", exist_ok=True)
for split in ("train", "val"):
    if not os.path.exists(f"/tmp/jpegs/{split}"):
        os.symlink(os.path.abspath(root), f"/tmp/jpegs/{split}")
print("jpegs", root, flush=True)
PY
python3 data_processing.py /tmp/segpng /tmp/seg --demo --demo-per-group 125 --demo-size 512 > /tmp/seg.log 2>&1
tail -n 1 /tmp/seg.log
bash results/h200-2026-12-03b/badfile.sh 2>&1 | tail -n 4
for c in example dali zero; do timeout 90 python3 $D/memory.py /tmp/jpegs $c; done 2>&1 | grep -v Warning | tee $OUT/memory.jsonl
timeout 150 python3 $D/segcost.py /tmp/seg eager 2>&1 | tee $OUT/segcost-eager.jsonl
