# The trainer's runs for ResNet-18 (trainer_runs.sh), with sweep.py's best variant from callA.
bash results/h200-2026-12-03f/trainer_runs.sh resnet18 $OUT/A-sweep-resnet18.jsonl $OUT/B-summary.jsonl 150
