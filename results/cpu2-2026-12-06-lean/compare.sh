#!/usr/bin/env bash
# compare.sh [MAIN_ROOT] [BASE_ROOT]     (defaults: /work/main /work/base)
#   REBUILD_BASE=1 compare.sh   remakes the cached baseline
#
# Baseline (cached in /work/compare/base/, remade when BASE_ROOT's files or the harness change):
# pipes.py and trainers.sh on BASE_ROOT, each run twice; entries that differ between the two runs
# are written to base/nondeterministic.json and left out of the diff. Then pipes.py and
# trainers.sh on MAIN_ROOT into /work/compare/main/, and diff.py: "IDENTICAL" (exit 0) or the
# first differing entries (exit 1).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
MAIN=$(cd "${1:-/work/main}" && pwd)
BASE=$(cd "${2:-/work/base}" && pwd)
PY=${PYTHON:-/work/main/.venv/bin/python}
export PYTHON=$PY OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 PYTHONDONTWRITEBYTECODE=1 CUDA_VISIBLE_DEVICES=""
unset DALI_USE_NEW_THREAD_POOL RANK WORLD_SIZE LOCAL_RANK PYTHONPATH || true

fingerprint() {  # ROOT's files (as trainers.sh copies them) and the harness itself
    { tar -C "$1" --exclude=./.git --exclude=./.venv --exclude=./.cache --exclude=./runs \
          --exclude=./results --exclude=./data --exclude=./out --exclude='__pycache__' \
          --exclude='*.pyc' --exclude=./.pytest_cache --sort=name --mtime=@0 --owner=0 \
          --group=0 --numeric-owner -cf - . ;
      cat "$HERE"/pipes.py "$HERE"/trainers.sh "$HERE"/metrics.py; } | sha256sum | cut -c1-64
}

run_all() {  # ROOT OUTDIR
    mkdir -p "$2"
    echo "== pipes.py $1 -> $2/pipes.json"
    "$PY" "$HERE/pipes.py" "$1" "$2/pipes.json" >"$2/pipes.log" 2>&1 \
        || { tail -30 "$2/pipes.log"; exit 2; }
    tail -1 "$2/pipes.log"
    grep ": ERROR" "$2/pipes.log" || true
    echo "== trainers.sh $1 -> $2"
    bash "$HERE/trainers.sh" "$1" "$2" | tail -1
    find "$2/runs" -name "*.pth" -delete  # checkpoints: large, not compared
}

B="$HERE/base"
FP=$(fingerprint "$BASE")
if [[ "${REBUILD_BASE:-0}" != 1 && -f "$B/fingerprint" && "$(cat "$B/fingerprint")" == "$FP" \
      && -f "$B/pipes.json" && -f "$B/classify.json" && -f "$B/segment.json" ]]; then
    echo "== baseline: cached in $B ($(git -C "$BASE" rev-parse --short HEAD 2>/dev/null || echo '?'))"
else
    echo "== baseline: making $B from $BASE (twice, to check it is reproducible)"
    rm -rf "$B"
    run_all "$BASE" "$B"
    run_all "$BASE" "$B/run2"
    "$PY" "$HERE/nondet.py" "$B" "$B/run2" "$B/nondeterministic.json"
    rm -rf "$B/src" "$B/run2/src"  # the copies of ROOT the trainers ran from
    git -C "$BASE" rev-parse HEAD >"$B/commit" 2>/dev/null || true
    echo "$FP" >"$B/fingerprint"
fi

M="$HERE/main"
rm -rf "$M"
run_all "$MAIN" "$M"
rm -rf "$M/src"
echo "== diff $B $M"
"$PY" "$HERE/diff.py" "$B" "$M"
