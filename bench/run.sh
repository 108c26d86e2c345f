#!/bin/sh
# make bench: the seed network on Fashion-MNIST, cnn.c against PyTorch (Debian's
# python3-torch) on the same cores in the same run, and against the sgemm ceiling of the
# project's GEMM (bench/sgemm.c) measured in the same run.
#   THREADS=2 EPOCHS=1 ROUNDS=2 CONFIGS="fp32:64 fp16:64 fp32:256 fp16:256" sh bench/run.sh
# Each configuration trains ROUNDS times, in rounds that alternate which of cnn.c and
# PyTorch goes first (ABBA), and the mean of each side is compared: a shared machine's
# speed drifts by 10% and more within minutes, and the alternation cancels the drift.
set -e
cd "$(dirname "$0")/.."
THREADS=${THREADS:-2}
EPOCHS=${EPOCHS:-1}
ROUNDS=${ROUNDS:-2}
CONFIGS=${CONFIGS:-"fp32:64 fp16:64 fp32:256 fp16:256"}
OUT=bench/out/run
rm -rf "$OUT"
mkdir -p "$OUT"
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores, threads $THREADS; $(uptime | sed 's/.*load/load/')"

build/bench/sgemm "$THREADS" | tee "$OUT/sgemm.log"

cnn() {  # precision batch round
    ./train models/fashion.cfg epochs="$EPOCHS" batch="$2" precision="$1" threads="$THREADS" \
        save="$OUT/cnn-$1-$2-$3" > "$OUT/cnn-$1-$2-$3.log"
    echo "cnn.c $1 batch $2: $(grep '^epoch' "$OUT/cnn-$1-$2-$3.log" | tail -n 1)"
}
torch() {  # batch round. PyTorch has no fp16 on the CPU: its fp32 run is the reference for both.
    /usr/bin/python3 bench/pytorch_ref.py --epochs "$EPOCHS" --batch "$1" --threads "$THREADS" \
        --json > "$OUT/pytorch-$1-$2.log"
    grep -v '^{' "$OUT/pytorch-$1-$2.log" | tail -n 1
}

batches=$(for c in $CONFIGS; do echo "${c##*:}"; done | awk '!seen[$0]++')
for r in $(seq "$ROUNDS"); do
    for b in $batches; do
        [ $((r % 2)) -eq 0 ] && torch "$b" "$r"
        for c in $CONFIGS; do [ "${c##*:}" = "$b" ] && cnn "${c%%:*}" "$b" "$r"; done
        [ $((r % 2)) -eq 1 ] && torch "$b" "$r"
    done
done

/usr/bin/python3 - "$OUT" "$CONFIGS" "$ROUNDS" <<'PY'
import json, sys
out, configs, rounds = sys.argv[1], sys.argv[2].split(), int(sys.argv[3])
ceiling = json.loads(open(out + "/sgemm.log").read().splitlines()[-1])["sgemm_ceiling_gflops"]
MFLOP = 68.0  # GEMM work of one training step per image (forward + both gradients)

def cnn(p, b, r):
    return [json.loads(l) for l in open("%s/cnn-%s-%s-%d/metrics.jsonl" % (out, p, b, r))][-1]

def torch(b, r):
    return [json.loads(l) for l in open("%s/pytorch-%s-%d.log" % (out, b, r)) if l.startswith("{")][-1]

print()
print("sgemm ceiling %.1f GFLOP/s = %.0f img/s at %.1f MFLOP per image" % (ceiling, ceiling * 1e3 / MFLOP, MFLOP))
print("means of %d round(s); img/s of each round in brackets" % rounds)
print("%-6s %6s %20s %20s %8s %8s %10s %9s" % ("", "batch", "cnn.c img/s", "PyTorch img/s", "ratio",
                                             "GFLOP/s", "of ceiling", "test acc"))
for c in configs:
    p, b = c.split(":")
    mine = [cnn(p, b, r)["img_per_s"] for r in range(1, rounds + 1)]
    ref = [torch(b, r)["img_per_s"] for r in range(1, rounds + 1)]
    m, t = sum(mine) / rounds, sum(ref) / rounds
    g = m * MFLOP / 1e3
    each = lambda v: "%.0f [%s]" % (sum(v) / len(v), " ".join("%.0f" % x for x in v))
    print("%-6s %6s %20s %20s %7.2fx %8.1f %9.0f%% %8.2f%%" % (p, b, each(mine), each(ref), m / t, g,
          100 * g / ceiling, cnn(p, b, 1)["val_acc"]))
PY
