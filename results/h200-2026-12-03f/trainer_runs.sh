# train_classify.py as issue 46 measures it (--data /tmp/jpegs -b 256 --amp bf16 --channels-last
# --epochs 4, one run each) for one model: --loader synthetic, DALI without the decoder cache
# (the defaults, then sweep.py's best variant through patch.py, and synthetic again in its
# compile mode where that is not the default), DALI with the cache. summary.py's line per run.
# BEST_ONLY=1: only the best variant's runs.
#     bash trainer_runs.sh ARCH SWEEP_JSONL OUT_JSONL SECONDS_PER_RUN
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
D=results/h200-2026-12-03f
arch=$1 sweep=$2 out=$3 limit=$4
mkdir -p /tmp/T
run() {  # NAME "ENV" TRAINER_FLAGS...
  local name=$arch-$1 e=$2
  shift 2
  rm -rf /tmp/T/$name
  env $e timeout $limit python3 $D/patch.py train_classify.py --data /tmp/jpegs --arch $arch \
    -b 256 --amp bf16 --channels-last --epochs 4 "$@" --output-dir /tmp/T/$name \
    > /tmp/T/$name.log 2>&1
  python3 $D/summary.py /tmp/T/$name | sed "s/^{/{\"flags\": \"$e $*\", /" | tee -a $out
}
best=$(python3 $D/pick.py $sweep)
IFS='|' read -r envs flags <<< "$best"
[ -z "$BEST_ONLY" ] && run synthetic "" --loader synthetic
[ -z "$BEST_ONLY" ] && run off "" --decoder-cache off
if [ -n "$best" ]; then
  run off-best "$envs" --decoder-cache off $flags
  case "$flags" in
    *--compile-mode*) run synthetic-mode "" --loader synthetic --compile-mode "${flags##*--compile-mode }" ;;
  esac
fi
[ -z "$BEST_ONLY" ] && run on "" --decoder-cache on
