#!/usr/bin/env bash
# torch.compile probe
export PYTHONPATH=/tmp/site:$PWD/.gpu-extra PYTHONUNBUFFERED=1
timeout 570 python3 results/h200-2026-11-29e/compile.py > $OUT/compile.log 2>&1
echo "rc $?" >> $OUT/compile.log
grep -v "^\s*$" $OUT/compile.log | tail -40
