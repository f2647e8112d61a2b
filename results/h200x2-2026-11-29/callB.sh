#!/usr/bin/env bash
# Archived probe: ran at commit fdd1487 with uncommitted trainer changes that 3b11cc0 then committed (callB.sh: the
# BatchNorm broadcast, not yet the exit-at-once fix; callC.sh: both), against that tree's bench.py, pipelines.py and
# trainers; kept as a record, not maintained. To rerun: git checkout 3b11cc0.
# ResNet-18 on 1 and 2 GPUs, segmentation on 1 and 2 GPUs with the Dice check, bench.py --ddp, a failing rank.
source results/h200x2-2026-11-29/common.sh
ALL=nccl_hi,split,static_graph,bucket_view
C="train_classify.py --data /tmp/cls --arch resnet18 --amp bf16 --channels-last -b 256 --epochs 6 --print-freq 4"
run r18-1g-dali 1 "" $C
run r18-1g-syn 1 "" $C --loader synthetic
run r18-2g-syn 2 "" $C --loader synthetic
run r18-2g-dali 2 "" $C
run r18-2g-dali-all 2 $ALL $C
run r18-2g-syn-all 2 $ALL $C --loader synthetic
run r18-2g-dali-j14 2 "" $C -j 14
S=$PWD/.cache/bench-seg/n1024-512px
python3 -c "from data_processing import make_csv_file_npy; make_csv_file_npy('$S', 0.2, 0)" > /dev/null
G="train_segment.py --data $S --amp bf16 --channels-last -b 32 --epochs 5 --print-freq 4"
run s-1g-dali 1 "" $G
run s-1g-syn 1 "" $G --loader synthetic
run s-2g-dali 2 "" $G
run s-2g-syn 2 "" $G --loader synthetic
# the 2-GPU run's last checkpoint, evaluated on 1 GPU and on 2: the Dice of its last epoch each time
E="train_segment.py --data $S --amp bf16 --channels-last -b 32 --resume $R/s-2g-dali/checkpoint.pth --evaluate"
{ echo "2 GPUs, logged: $(grep 'val Dice' $R/s-2g-dali.log | tail -1)"
  echo "1 GPU, --evaluate: $(CUDA_VISIBLE_DEVICES=0 timeout 120 python3 $E 2>&1 | grep -E 'Test|error' | tail -1)"
  echo "2 GPUs, --evaluate: $(timeout 120 torchrun --standalone --nproc_per_node=2 $E 2>&1 | grep -E 'Test|error' | tail -1)"
} | tee $R/dice_check.txt $OUT/dice_check.txt
# one rank meets a truncated JPEG: the job must end with its error line, not hang in a collective
mkdir -p /tmp/bad && rm -rf /tmp/bad/* && cp -r /tmp/cls/val /tmp/bad/val && cp -rL /tmp/cls/val /tmp/bad/train
f=$(ls /tmp/bad/train/*/* | sort | tail -1); { printf '\xff\xd8\xff'; head -c 4000 /dev/urandom; } > $f
s=$(date +%s); timeout 180 torchrun --standalone --nproc_per_node=2 train_classify.py --data /tmp/bad --arch resnet18 -b 64 \
  --epochs 2 --output-dir $R/bad > $R/bad.log 2>&1; echo "rc $? after $(( $(date +%s) - s )) s" >> $R/bad.log
{ grep -E '^error|rc ' $R/bad.log; echo "destroy warnings: $(grep -c destroy_process_group $R/bad.log)"; } | tee $OUT/bad_rank.txt
timeout 240 torchrun --standalone --nproc_per_node=2 bench.py --ddp --iters 100 --max-seconds 8 --json $R/bench_ddp.json \
  > $R/bench_ddp.log 2>&1; tail -12 $R/bench_ddp.log | tee $OUT/bench_ddp.txt
tar czf $OUT/callB.tgz -C $R --exclude='*.pth' --exclude='*.png' --exclude='*.jpg' --exclude=bad/train .
