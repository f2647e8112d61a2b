#!/usr/bin/env bash
# trainers.sh ROOT OUTDIR
# Runs ROOT's train_classify.py and train_segment.py (--data demo, 1 epoch, seed 0, DALI and the
# model on the CPU) from a fresh copy of ROOT's files (nothing else on sys.path, demo data built
# inside the copy), and writes the reproducible part of each run's metrics.jsonl (per-step losses,
# epoch metrics, final record; timing/memory fields dropped) to OUTDIR/classify.json and
# OUTDIR/segment.json. The full logs stay in OUTDIR/{classify,segment}.log.
set -euo pipefail
ROOT=$(cd "$1" && pwd)
OUTDIR=$(mkdir -p "$2" && cd "$2" && pwd)
HERE=$(cd "$(dirname "$0")" && pwd)
PY=${PYTHON:-/work/main/.venv/bin/python}

# Determinism on a shared 2-core CPU: a fixed torch/OpenMP thread count, no GPU, no new DALI pool.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} MKL_NUM_THREADS=${MKL_NUM_THREADS:-1}
export CUDA_VISIBLE_DEVICES="" PYTHONHASHSEED=0 PYTHONDONTWRITEBYTECODE=1
unset DALI_USE_NEW_THREAD_POOL RANK WORLD_SIZE LOCAL_RANK PYTHONPATH || true

SRC="$OUTDIR/src"
rm -rf "$SRC" "$OUTDIR/runs"
mkdir -p "$SRC"
# ROOT's own files only: no .git, venv, caches (demo data), earlier runs or results.
tar -C "$ROOT" --exclude=./.git --exclude=./.venv --exclude=./.cache --exclude=./runs \
    --exclude=./results --exclude=./data --exclude=./out --exclude='__pycache__' \
    --exclude='*.pyc' --exclude=./.pytest_cache -cf - . | tar -C "$SRC" -xf -

COMMON=(--data demo --epochs 1 --seed 0 --workers 2 --device cpu --dali-device cpu
        --use-deterministic-algorithms --print-freq 1)
cd "$SRC"
for task in classify segment; do
    "$PY" "train_$task.py" "${COMMON[@]}" --output-dir "$OUTDIR/runs/$task" \
        >"$OUTDIR/$task.log" 2>&1 || { echo "train_$task.py failed, see $OUTDIR/$task.log" >&2; tail -20 "$OUTDIR/$task.log" >&2; exit 1; }
    "$PY" "$HERE/metrics.py" "$OUTDIR/runs/$task/metrics.jsonl" "$OUTDIR/$task.json" "$OUTDIR"
done
echo "trainers: wrote $OUTDIR/classify.json $OUTDIR/segment.json"
