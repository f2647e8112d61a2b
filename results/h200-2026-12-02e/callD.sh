# ResNet-18 on the full-size JPEGs again, with bench.py's --against-example rows (one knob at a time),
# after callB's run gave the mixed decoder 78.4 % of synthetic against the example's 88.2 %
timeout 280 python3 bench.py --workers 16 --models resnet18 --against-example \
  --only dali-mixed-hwc,nvidia-example --iters 300 --max-seconds 7 --json $OUT/r18.json > $OUT/r18.log 2>&1
grep -E "img/s|FAILED|Error" $OUT/r18.log | grep -v "JPEGs$" | tail -30
