# torch.compile's modes against eager, ResNet-18 and ResNet-50 on a random batch (issue 46 item 1),
# each in its own process; max-autotune last, as long as the call has time for it.
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
D=results/h200-2026-12-03c
for a in resnet18 resnet50; do
  for m in eager default reduce-overhead; do
    timeout 150 python3 $D/compile_modes.py $a $m 2>&1 | grep '^{' | tee -a $OUT/compile.jsonl
  done
done
timeout 200 python3 $D/compile_modes.py resnet18 max-autotune-no-cudagraphs 2>&1 | grep '^{' | tee -a $OUT/compile.jsonl
