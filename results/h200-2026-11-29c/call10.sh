#!/usr/bin/env bash
# Archived probe: ran at commit 0e37295 against that commit's bench.py, pipelines.py and test_pipelines.py; kept as a
# record, not maintained. To rerun: git checkout 0e37295.
# final: the bench command on the final code, then test_pipelines.py's GPU tests
export PYTHONPATH=/tmp/site:$PWD/.gpu-extra PYTHONUNBUFFERED=1
timeout 280 python3 bench.py --workers 16 --iters 150 --max-seconds 10 --seg-samples 1024 --json $OUT/bench-final.json > $OUT/bench-final.log 2>&1
echo "rc $?" >> $OUT/bench-final.log
grep -A48 "^date" $OUT/bench-final.log
timeout 60 python3 -m pytest -q test_pipelines.py -k gpu 2>&1 | tail -2 | tee $OUT/pytest_gpu_final.log
