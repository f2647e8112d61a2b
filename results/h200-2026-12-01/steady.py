# Ran at 6006116 (imports nothing of the project). The trainer's steady rate from its metrics.jsonl: the mean of
# the img/s and data-wait % of the records at step 32 (steps 17-32 of each epoch) of epochs 2-8.
import json, statistics, sys
for name in sys.argv[1:]:
    recs = [r for r in map(json.loads, open(name)) if r["type"] == "train" and r["epoch"] >= 2 and r["step"] == r["steps"]]
    print(f"{name:24s} {statistics.mean(r['img_s'] for r in recs):9,.0f} img/s  data wait "
          f"{statistics.mean(r['data_wait'] for r in recs):4.1f} %  ({len(recs)} windows)")
