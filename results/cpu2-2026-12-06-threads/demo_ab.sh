#!/usr/bin/env bash
# README's main command (the demo set already built) at 7fccbd2 (old: torch takes the cores less
# DALI's -j) and de11f4f (new: torch's own threads, idle ones sleep), in turn; BUSY processes of
# `yes` beside them stand for other work on the machine.
# usage: demo_ab.sh ROUNDS BUSY
cd /tmp/r70/ab  # copies: git archive 7fccbd2 into old/, de11f4f into new/ (the demo set copied in)
source /work/main/.venv/bin/activate
export XDG_CACHE_HOME=/tmp/r70/ab/xdg
busy=()
for _ in $(seq 1 "$2"); do yes > /dev/null & busy+=($!); done
for r in $(seq 1 "$1"); do for v in old new; do
  rm -rf runs-$v
  s=$(date +%s.%N)
  (cd $v && python train_classify.py --data demo --output-dir ../runs-$v > ../demo-$v.log 2>&1)
  e=$(date +%s.%N)
  printf "busy %s round %s %s: %.1f s wall  %s  %s\n" "$2" "$r" "$v" "$(echo "$e - $s" | bc)" \
    "$(grep -o 'val_top1 [0-9.]*' demo-$v.log | tail -1)" "$(grep -o '^cpu_threads:.*' demo-$v.log)"
done; done
[ ${#busy[@]} -gt 0 ] && kill "${busy[@]}"
