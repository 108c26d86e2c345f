#!/bin/sh
# make bench: one Fashion-MNIST epoch of cnn.c and of the same network in PyTorch
# (Debian's python3-torch), on the same cores in the same run, and their ratio.
#   THREADS=2 BATCH=64 EPOCHS=1 sh bench/run.sh
set -e
cd "$(dirname "$0")/.."
THREADS=${THREADS:-2}
BATCH=${BATCH:-64}
EPOCHS=${EPOCHS:-1}
OUT=bench/out
mkdir -p "$OUT"
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores; threads $THREADS, batch $BATCH"

./train models/fashion.cfg epochs="$EPOCHS" batch="$BATCH" threads="$THREADS" save="$OUT/fashion" \
    > "$OUT/cnn.log"
tail -n 1 "$OUT/cnn.log"
/usr/bin/python3 bench/pytorch_ref.py --epochs "$EPOCHS" --batch "$BATCH" --threads "$THREADS" --json \
    > "$OUT/pytorch.log"
grep -v '^{' "$OUT/pytorch.log" | tail -n 1

/usr/bin/python3 - "$OUT/fashion/metrics.jsonl" "$OUT/pytorch.log" <<'PY'
import json, sys
cnn = [json.loads(l) for l in open(sys.argv[1])][-1]
ref = [json.loads(l) for l in open(sys.argv[2]) if l.startswith('{')][-1]
print()
print("%-10s %10s %10s" % ("", "img/s", "test acc"))
print("%-10s %10.0f %9.2f%%" % ("cnn.c", cnn["img_per_s"], cnn["val_acc"]))
print("%-10s %10.0f %9.2f%%" % ("pytorch", ref["img_per_s"], ref["test_acc"]))
print("ratio cnn.c / pytorch: %.2fx" % (cnn["img_per_s"] / ref["img_per_s"]))
PY
