# The trainer's runs for ResNet-50 (trainer_runs.sh), with sweep.py's best variant from callA.
bash results/h200-2026-12-03f/trainer_runs.sh resnet50 /tmp/A-sweep-resnet50.jsonl $OUT/C-summary.jsonl 170
