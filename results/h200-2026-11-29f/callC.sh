#!/usr/bin/env bash
# Archived probe: ran at commit 9dc1999 against that commit's bench.py, pipelines.py and test_pipelines.py (with an
# earlier version of stages.py); kept as a record, not maintained. To rerun: git checkout 9dc1999.
# After resize_with_torch's GIL change: the stage probe at 8 and 16 threads and a py-spy profile at 16, the
# README's bench command (the run of record), then the GPU tests of test_pipelines.py (CPU/GPU comparisons).
export PYTHONPATH=/tmp/site:$PWD/.gpu-extra PYTHONUNBUFFERED=1
D=results/h200-2026-11-29f
for t in 8 16; do taskset -c 0-$((t-1)) timeout 60 python3 $D/stages.py $t decode decode+torch_resize full loader; done > $OUT/stages-after.log 2>&1
cat $OUT/stages-after.log
SECONDS_PER=8 timeout 90 .gpu-extra/bin/py-spy record -r 200 --native --threads --idle -f raw -o /tmp/spy_after.txt -- python3 $D/stages.py 16 full > /dev/null 2>&1
python3 $D/spy_summary.py /tmp/spy_after.txt 5 2>&1 | head -40 > $OUT/spy_after_summary.txt
head -16 $OUT/spy_after_summary.txt
timeout 330 python3 bench.py --workers 16 --iters 150 --max-seconds 10 --seg-samples 1024 --json $OUT/bench.json > $OUT/bench.log 2>&1
tail -45 $OUT/bench.log
timeout 150 python3 -m pytest -q -rs -p no:cacheprovider test_pipelines.py -k "gpu or noise_is_gaussian" 2>&1 | tail -6 > $OUT/pytest_gpu.log
cat $OUT/pytest_gpu.log
