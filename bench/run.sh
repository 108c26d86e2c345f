#!/bin/sh
# make bench: the seed network on Fashion-MNIST, cnn.c against PyTorch (Debian's
# python3-torch) on the same cores in the same run, and against the OpenBLAS sgemm
# ceiling measured in the same run.
#   THREADS=2 EPOCHS=1 CONFIGS="fp32:64 fp16:64 fp32:256 fp16:256" sh bench/run.sh
set -e
cd "$(dirname "$0")/.."
THREADS=${THREADS:-2}
EPOCHS=${EPOCHS:-1}
CONFIGS=${CONFIGS:-"fp32:64 fp16:64 fp32:256 fp16:256"}
OUT=bench/out/run
mkdir -p "$OUT"
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores, threads $THREADS; $(uptime | sed 's/.*load/load/')"

build/bench/sgemm "$THREADS" | tee "$OUT/sgemm.log"
for c in $CONFIGS; do
    p=${c%%:*}; b=${c##*:}
    ./train models/fashion.cfg epochs="$EPOCHS" batch="$b" precision="$p" threads="$THREADS" \
        save="$OUT/cnn-$p-$b" > "$OUT/cnn-$p-$b.log"
    tail -n 2 "$OUT/cnn-$p-$b.log" | head -n 1
    # PyTorch has no fp16 on the CPU: its fp32 run is the reference for both.
    if [ ! -f "$OUT/pytorch-$b.log" ]; then
        /usr/bin/python3 bench/pytorch_ref.py --epochs "$EPOCHS" --batch "$b" --threads "$THREADS" \
            --json > "$OUT/pytorch-$b.log"
        grep -v '^{' "$OUT/pytorch-$b.log" | tail -n 1
    fi
done

/usr/bin/python3 - "$OUT" "$CONFIGS" <<'PY'
import json, sys
out, configs = sys.argv[1], sys.argv[2].split()
ceiling = json.loads(open(out + "/sgemm.log").read().splitlines()[-1])["sgemm_ceiling_gflops"]
MFLOP = 68.0  # GEMM work of one training step per image (forward + both gradients)
print()
print("sgemm ceiling %.1f GFLOP/s = %.0f img/s at %.1f MFLOP per image" % (ceiling, ceiling * 1e3 / MFLOP, MFLOP))
print("%-6s %6s %10s %10s %8s %10s %10s %10s" % ("", "batch", "cnn img/s", "torch img/s", "ratio",
                                              "GFLOP/s", "of ceiling", "test acc"))
for c in configs:
    p, b = c.split(":")
    cnn = [json.loads(l) for l in open("%s/cnn-%s-%s/metrics.jsonl" % (out, p, b))][-1]
    ref = [json.loads(l) for l in open("%s/pytorch-%s.log" % (out, b)) if l.startswith("{")][-1]
    g = cnn["img_per_s"] * MFLOP / 1e3
    print("%-6s %6s %10.0f %10.0f %7.2fx %10.1f %9.0f%% %9.2f%%" % (p, b, cnn["img_per_s"], ref["img_per_s"],
          cnn["img_per_s"] / ref["img_per_s"], g, 100 * g / ceiling, cnn["val_acc"]))
PY
