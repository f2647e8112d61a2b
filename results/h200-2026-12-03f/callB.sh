# The trainer's runs for ResNet-18 (trainer_runs.sh), with sweep.py's best variant from callA.
BEST_ONLY=1 bash results/h200-2026-12-03f/trainer_runs.sh resnet18 /tmp/A-sweep-resnet18.jsonl $OUT/B-summary.jsonl 150
