#!/usr/bin/env bash
# Archived probe: ran at commit fdd1487 with uncommitted trainer changes that 3b11cc0 then committed (callB.sh: the
# BatchNorm broadcast, not yet the exit-at-once fix; callC.sh: both), against that tree's bench.py, pipelines.py and
# trainers; kept as a record, not maintained. To rerun: git checkout 3b11cc0.
# ResNet-50 on 1 and 2 GPUs: DALI-fed against synthetic, and one setting at a time on 2 GPUs.
source results/h200x2-2026-11-29/common.sh
{ date -u; nvidia-smi -L; nvidia-smi topo -m; lscpu | grep -iE 'numa|model name|^CPU\(s\)|socket|core'
  python3 -c "import torch, torchvision, nvidia.dali as d; print(torch.__version__, torchvision.__version__, d.__version__)"
  echo "one-GPU CPUs: $HALF"; } > $R/machine.txt 2>&1
cat $R/machine.txt
python3 -c "import bench; a = bench.parse_args(['--workers', '32', '--seg-samples', '1024']); bench.jpeg_set(a); bench.seg_set(a)" > $R/gen.log 2>&1
J=$(ls -d $PWD/.cache/bench-jpegs/n8192-*); mkdir -p /tmp/cls/val; ln -sfn $J /tmp/cls/train
for c in $J/*/; do n=$(basename $c); mkdir -p /tmp/cls/val/$n; for f in $(ls $c | head -64); do ln -sf $c$f /tmp/cls/val/$n/$f; done; done
echo "train $(find -L /tmp/cls/train -name '*.jp*g' | wc -l) val $(find -L /tmp/cls/val -name '*.jp*g' | wc -l)"
C="train_classify.py --data /tmp/cls --arch resnet50 --amp bf16 --channels-last -b 256 --epochs 6 --print-freq 4"
run r50-1g-dali 1 "" $C
run r50-1g-syn 1 "" $C --loader synthetic
run r50-2g-syn 2 "" $C --loader synthetic
run r50-2g-dali 2 "" $C
run r50-2g-dali-ncclhi 2 nccl_hi $C
run r50-2g-dali-split 2 split $C
run r50-2g-dali-numa 2 numa=exclusive $C
run r50-2g-dali-j4 2 "" $C -j 4
run r50-2g-dali-j14 2 "" $C -j 14
run r50-2g-dali-ddp 2 static_graph,bucket_view $C
run r50-2g-syn-ddp 2 static_graph,bucket_view $C --loader synthetic
run r50-2g-dali-all 2 nccl_hi,split,static_graph,bucket_view $C
run r50-2g-syn-all 2 nccl_hi,split,static_graph,bucket_view $C --loader synthetic
run r50-2g-dali-again 2 "" $C
run r50-2g-syn-again 2 "" $C --loader synthetic
cp $R/machine.txt $OUT/
tar czf $OUT/callA.tgz -C $R --exclude='*.pth' --exclude='*.png' .
