#!/bin/sh
# bench/dist_bench.sh: data-parallel training over 2 hosts (bench/netns.sh: network
# namespaces whose links tbf shapes to RATE, OpenMPI over TCP between them) at several
# bandwidths: the gradient sum during backward (bucket_mb = auto) against one sum after
# backward (bucket_mb = 0), and the scaling model of bench/RESULTS.md ("Data parallelism
# across hosts") checked against what they measure, then extrapolated.
#   sh bench/dist_bench.sh           (root: the namespaces; exits 77 without)
#   RATES="none 1gbit 200mbit" ROUNDS=2 CFG=models/resnet-small.cfg BATCH=128 PER_CLASS=1200
# Each rate: the gradient sum alone (build/bench/allreduce_bench: the network's gradients
# and a tail bucket of TAIL floats), then ROUNDS rounds of one epoch of PER_CLASS x 10
# Fashion-MNIST images (no test set), 1 thread a process, alternating which of auto and 0
# goes first. Per run: the training seconds, the epoch line's comm (what the gradient sums
# cost the steps, as the last process to reach each saw it) and waits (all this process
# waited, a slower process included). The model: a step is compute C, then what the sum
# leaves exposed: all of it, S(B), for one sum after backward; with buckets, S(B) less the
# backward it overlaps (W = 2/3 C, backward being twice forward), but at least the tail
# bucket's S(TAIL). C comes from the unshaped runs (none) without buckets, less their comm.
set -e
cd "$(dirname "$0")/.."
RATES=${RATES:-"none 1gbit 200mbit"}
ROUNDS=${ROUNDS:-2}
CFG=${CFG:-models/resnet-small.cfg}
BATCH=${BATCH:-128}
PER_CLASS=${PER_CLASS:-1200}
TAIL=${TAIL:-2000}
FASHION=/usr/share/datasets/fashion-mnist
OUT=bench/out/dist
[ "$(id -u)" = 0 ] || { echo "bench/dist_bench.sh: needs root (bench/netns.sh); skipped" >&2; exit 77; }
rm -rf "$OUT"
mkdir -p "$OUT"
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores; $(uptime | sed 's/.*load/load/')"

python3 bench/idx_subset.py "$FASHION/train-images-idx3-ubyte.gz" "$FASHION/train-labels-idx1-ubyte.gz" \
    "$OUT/fm" --classes 0,1,2,3,4,5,6,7,8,9 --per-class "$PER_CLASS" > /dev/null
IMAGES=$((PER_CLASS * 10))
STEPS=$(((IMAGES + BATCH - 1) / BATCH))
FLOATS=$(./train "$CFG" --plan --json | sed 's/.*"grads_unfused": \([0-9]*\).*/\1/')
FLOATS=$((FLOATS / 4))
echo "$CFG at batch $BATCH over 2 hosts: $FLOATS gradient floats, $STEPS steps an epoch"

# sum RATE: the gradient sum alone at RATE, ms (all of B, then the tail) into $OUT/sum-RATE
sum() {
    sh bench/netns.sh run 2 "$1" -- build/bench/allreduce_bench "$FLOATS" "$TAIL" > "$OUT/sum-$1.log" 2>&1
    sed -n 's/.*floats ([0-9.]* MB): \([0-9.]*\) ms median.*/\1/p' "$OUT/sum-$1.log" | tr '\n' ' '
}
# train RATE BUCKET ROUND: one epoch; "seconds comm waits" on stdout
train() {
    log="$OUT/train-$1-$2-$3.log"
    sh bench/netns.sh run 2 "$1" -- ./train "$CFG" train="$OUT/fm-images-idx3-ubyte" \
        train_labels="$OUT/fm-labels-idx1-ubyte" test= test_labels= epochs=1 batch="$BATCH" \
        threads=1 bucket_mb="$2" save="$OUT/run-$1-$2" > "$log" 2>&1
    grep -a '^epoch' "$log" | tail -n 1 |
        sed 's/.*img\/s  \([0-9.]*\) s .*comm \([0-9.]*\) s.*waits \([0-9.]*\) s.*/\1 \2 \3/'
}

: > "$OUT/runs"
for rate in $RATES; do
    s=$(sum "$rate")
    echo "$rate sum: $s ms (all $FLOATS floats, then $TAIL)"
    echo "sum $rate $s" >> "$OUT/runs"
    for r in $(seq "$ROUNDS"); do
        if [ $((r % 2)) -eq 1 ]; then order="auto 0"; else order="0 auto"; fi
        for b in $order; do
            t=$(train "$rate" "$b" "$r")
            echo "$rate bucket_mb=$b round $r: seconds comm waits = $t"
            echo "run $rate $b $t" >> "$OUT/runs"
        done
    done
done

awk -v steps="$STEPS" -v floats="$FLOATS" '
$1 == "sum" { S[$2] = $3 / 1000; T[$2] = $4 / 1000 }
$1 == "run" { k = $2 " " $3; n[k]++; sec[k] += $4; comm[k] += $5; waits[k] += $6; rates[$2] = 1 }
END {
    if (!n["none 0"]) { print "no unshaped run without buckets: no C"; exit }
    C = (sec["none 0"] - comm["none 0"]) / n["none 0"] / steps
    W = 2 * C / 3
    printf "\nthe model: C = %.1f ms a step (compute), W = %.1f ms (backward)\n", 1e3 * C, 1e3 * W
    printf "%-8s %-6s %12s %12s %10s %14s %14s\n", "rate", "bucket", "step ms", "model ms", "model/step", "comm ms/step", "model comm"
    for (rate in rates) for (b = 0; b < 2; b++) {
        k = rate " " (b ? "auto" : "0")
        if (!n[k]) continue
        step = sec[k] / n[k] / steps; c = comm[k] / n[k] / steps
        e = b ? (S[rate] - W > T[rate] ? S[rate] - W : T[rate]) : S[rate]
        printf "%-8s %-6s %12.1f %12.1f %10.3f %14.2f %14.2f\n", rate, b ? "auto" : "0", 1e3 * step,
               1e3 * (C + e), (C + e) / step, 1e3 * c, 1e3 * e
    }
    # Extrapolated (weak scaling: each machine a process of this batch share, compute C).
    # A sum of b floats over N machines, as nn/dist.c runs it: each phase (slices to their
    # owners, then the summed slices to everyone) sends N - 1 messages of b / N floats per
    # machine at once: 2 (alpha + (N - 1) o) + 2 (N - 1) / N x 4b / bandwidth, with alpha the
    # latency of a message on a LAN (50 us), o the per-message cost of posting and handling
    # one more peer (5 us), and TCP carrying 95% of the link. The gradients go in K = 8
    # buckets (auto); the tail bucket (the first layers) is taken as a full one.
    alpha = 50e-6; o = 5e-6; K = 8
    nets[1] = "this network"; fl[1] = floats; cc[1] = C
    nets[2] = "ResNet-18"; fl[2] = 11.2e6; cc[2] = 2.9
    printf "\nextrapolated: exposed sum a step (ms) and efficiency C / (C + exposed); alpha 50 us, o 5 us\n"
    printf "%-14s %-9s %-8s %20s %20s %20s %20s\n", "network", "link", "bucket", "2 machines", "8", "64", "512"
    split("1 10 100", gbits, " ")
    for (i = 1; i <= 2; i++) for (g = 1; g <= 3; g++) for (b = 0; b < 2; b++) {
        bw = gbits[g] * 1e9 / 8 * 0.95; line = ""
        split("2 8 64 512", Ns, " ")
        for (j = 1; j <= 4; j++) {
            N = Ns[j]
            one = 2 * (alpha + (N - 1) * o) + 2 * (N - 1) / N * 4 * fl[i] / K / bw
            all = K * 2 * (alpha + (N - 1) * o) + 2 * (N - 1) / N * 4 * fl[i] / bw
            Wb = 2 * cc[i] / 3
            e = b ? (all - Wb > one ? all - Wb : one) : all
            line = line sprintf(" %12.1f, %5.1f%%", 1e3 * e, 100 * cc[i] / (cc[i] + e))
        }
        printf "%-14s %-9s %-8s%s\n", nets[i], gbits[g] " Gbit/s", b ? "auto" : "0", line
    }
}' "$OUT/runs"
