# Archived probe: ran at commit fdd1487 with uncommitted trainer changes that 3b11cc0 then committed (callB.sh: the
# BatchNorm broadcast, not yet the exit-at-once fix; callC.sh: both), against that tree's bench.py, pipelines.py and
# trainers; kept as a record, not maintained. To rerun: git checkout 3b11cc0.
# Sourced by the call scripts of this folder, from the project root on the 2 x H200 machine.
export PYTHONPATH=/tmp/site:$PWD/.gpu-extra PYTHONUNBUFFERED=1
D=results/h200x2-2026-11-29; R=/tmp/x2; mkdir -p $R
# one-GPU runs: GPU 0 and the first half of the CPUs, the share a process gets with KNOBS=split on 2 GPUs
HALF=$(python3 -c "import os; c = sorted(os.sched_getaffinity(0)); print(','.join(map(str, c[:len(c) // 2])))")
# run NAME NPROC KNOBS SCRIPT ARGS...: KNOBS as knobs.py takes them, plus numa=MODE for torchrun --numa-binding
run() {
  local name=$1 n=$2 knobs=$3 numa=""; shift 3
  case ,$knobs, in *,numa=*) numa="--numa-binding $(echo ,$knobs, | sed 's/.*,numa=\([a-z-]*\),.*/\1/')";
                             knobs=$(echo ,$knobs, | sed 's/,numa=[a-z-]*,/,/; s/^,//; s/,$//');; esac
  rm -rf $R/$name
  if [ "$n" = 1 ]; then
    KNOBS=$knobs CUDA_VISIBLE_DEVICES=0 timeout 200 taskset -c $HALF python3 $D/knobs.py "$@" --output-dir $R/$name > $R/$name.log 2>&1
  else
    KNOBS=$knobs timeout 200 torchrun --standalone --nproc_per_node=$n $numa $D/knobs.py "$@" --output-dir $R/$name > $R/$name.log 2>&1
  fi
  echo "rc $? $(grep -c 'destroy_process_group' $R/$name.log) destroy-warnings" >> $R/$name.log
  python3 $D/summary.py $R/$name | tee -a $R/summary.txt ${OUT:+$OUT/summary.txt}
}
