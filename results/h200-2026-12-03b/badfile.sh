# After issue 48's fixes, a file that is not an image on
# the GPU paths (DALI-NOTES: training with the decoder cache's plan ended in PIL's traceback,
# --predict crashed 1 run in 3): 24 JPEGs of 3 classes and a 200-byte text file named .jpg.
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
python3 - <<'PY'
import os, numpy as np
from PIL import Image
rng = np.random.default_rng(0)
for split in ("train", "val"):
    for c in ("a", "b", "c"):
        os.makedirs(f"/tmp/bad/{split}/{c}", exist_ok=True)
        for i in range(8):
            Image.fromarray(rng.integers(0, 255, (48, 56, 3), np.uint8)).save(f"/tmp/bad/{split}/{c}/{i}.jpg")
open("/tmp/bad/train/b/notes.jpg", "w").write("x" * 200)
os.makedirs("/tmp/pred", exist_ok=True)
for i in range(40):
    Image.fromarray(rng.integers(0, 255, (48, 56, 3), np.uint8)).save(f"/tmp/pred/{i}.png")
open("/tmp/pred/notes.jpg", "w").write("x" * 200)
import torch, torchvision
torch.save(torchvision.models.resnet18(num_classes=3).state_dict(), "/tmp/r18.pth")
PY
for i in ${RUNS:-1 2}; do
  python3 train_classify.py --data /tmp/bad -b 32 --epochs 1 --output-dir /tmp/o$i > /dev/null 2> /tmp/e$i
  echo "train run $i: exit $? | $(tail -n 1 /tmp/e$i | cut -c1-220)"
  python3 train_classify.py --predict /tmp/pred --weights /tmp/r18.pth --arch resnet18 --num-classes 3 \
    --output-dir /tmp/p$i > /dev/null 2> /tmp/f$i
  echo "predict run $i: exit $? | $(tail -n 1 /tmp/f$i | cut -c1-220)"
done 2>&1 | tee $OUT/badfile.log
