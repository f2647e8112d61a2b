# train_classify.py as issue 46 measures it (-b 256 --amp bf16 --channels-last --epochs 4, one run
# each), ResNet-18 on /tmp/jpegs: --loader synthetic, the defaults without the cache, then callA's
# best variants (pick.py): without the cache, with it, and the best at normal priority run under
# noprio.py (with synthetic again in its compile mode where that is not the default).
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
D=results/h200-2026-12-03g
NOPRIO=results/h200-2026-12-03e/noprio.py
OUTFILE=${OUTFILE:-$OUT/B-summary.jsonl}
mkdir -p /tmp/T
run() {  # NAME "ENV" WRAPPER TRAINER_FLAGS...  (WRAPPER: empty, or noprio.py)
  local name=r18-$1 e=$2 w=$3
  shift 3
  rm -rf /tmp/T/$name
  env $e timeout 110 python3 $w $D/patch.py train_classify.py --arch resnet18 -b 256 --amp bf16 \
    --channels-last --epochs 4 "$@" --output-dir /tmp/T/$name > /tmp/T/$name.log 2>&1
  python3 results/h200-2026-12-03f/summary.py /tmp/T/$name \
    | sed "s|^{|{\"flags\": \"$e $w $*\", |" | tee -a $OUTFILE
}
[ -n "$ONLY_C" ] && return 0 2>/dev/null
run synthetic "" "" --data /tmp/jpegs --loader synthetic
run off "" "" --data /tmp/jpegs --decoder-cache off
IFS='|' read -r e f s <<< "$(python3 $D/pick.py /tmp/A-sweep-hi.jsonl off)"
run off-best "$e" "" --data /tmp/jpegs --decoder-cache off $f
IFS='|' read -r e f s <<< "$(python3 $D/pick.py /tmp/A-sweep-hi.jsonl on)"
run on-best "$e" "" --data /tmp/jpegs --decoder-cache on $f
IFS='|' read -r e f s <<< "$(python3 $D/pick.py /tmp/A-sweep-np.jsonl off)"
run off-best-noprio "$e" $NOPRIO --data /tmp/jpegs --decoder-cache off $f
case "$f" in
  *--compile-mode*) run synthetic-mode "" "" --data /tmp/jpegs --loader synthetic --compile-mode "${f##*--compile-mode }" ;;
esac
