#!/usr/bin/env bash
# Archived probe: ran at commit fdd1487 with uncommitted trainer changes that 3b11cc0 then committed (callB.sh: the
# BatchNorm broadcast, not yet the exit-at-once fix; callC.sh: both), against that tree's bench.py, pipelines.py and
# trainers; kept as a record, not maintained. To rerun: git checkout 3b11cc0.
# After the shutdown fix: a rank meeting a bad JPEG under NCCL; then DALI's prefetch depth and the logging
# sync's cost on 2 GPUs, with default and synthetic runs of the same call to compare against.
source results/h200x2-2026-11-29/common.sh
rm -f $R/summary.txt
s=$(date +%s); timeout 180 torchrun --standalone --nproc_per_node=2 train_classify.py --data /tmp/bad --arch resnet18 -b 64 \
  --epochs 2 --output-dir $R/bad2 > $R/bad2.log 2>&1; echo "rc $? after $(( $(date +%s) - s )) s" >> $R/bad2.log
{ grep -E '^error|^rc |exitcode' $R/bad2.log; echo "destroy warnings: $(grep -c destroy_process_group $R/bad2.log)"; } | tee $OUT/bad_rank_fixed.txt
C="train_classify.py --data /tmp/cls --arch resnet50 --amp bf16 --channels-last -b 256 --epochs 6 --print-freq 4"
run c-r50-2g-syn 2 "" $C --loader synthetic
run c-r50-2g-dali 2 "" $C
run c-r50-2g-dali-pf3 2 prefetch=3 $C
run c-r50-2g-dali-pf4 2 prefetch=4 $C
run c-r50-2g-dali-pfq8 2 "" ${C/print-freq 4/print-freq 8}
run c-r50-2g-syn-pfq8 2 "" ${C/print-freq 4/print-freq 8} --loader synthetic
C18=${C/resnet50/resnet18}
run c-r18-2g-dali 2 "" $C18
run c-r18-2g-dali-pf4 2 prefetch=4 $C18
run c-r18-1g-dali-pf4 1 prefetch=4 $C18
tar czf $OUT/callC.tgz -C $R --exclude='*.pth' --exclude='*.png' --exclude='*.jpg' --exclude=bad --exclude='r*' summary.txt bad2.log $(cd $R && ls -d c-*)
