#!/bin/sh
# Two builds (or settings) of ./train side by side on make bench's seed-net rows:
# models/fashion.cfg for one epoch in each of CONFIGS (precision:batch), ROUNDS rounds
# that alternate which side goes first (ABBA), img/s of each run and the means' ratio B/A.
#   A=/tmp/old/train B=./train sh bench/ab.sh
#   A=./train B="env CNN_CPU_KERNELS=portable ./train" ROUNDS=2 sh bench/ab.sh
# A and B are command lines (run with the cfg and keys appended). THREADS (default 2);
# TRAIN_ARGS adds keys to every run (a smaller training set: train=... train_labels=...).
set -e
cd "$(dirname "$0")/.."
A=${A:?A=command of the first build}
B=${B:?B=command of the second build}
THREADS=${THREADS:-2}
ROUNDS=${ROUNDS:-3}
CONFIGS=${CONFIGS:-"fp32:64 fp16:64 fp32:256 fp16:256"}
OUT=bench/out/ab
rm -rf "$OUT"
mkdir -p "$OUT"
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores, threads $THREADS"
echo "A: $A"
echo "B: $B"
echo "keys: ${TRAIN_ARGS:-none}"
one() {  # side command precision batch round: prints the run's img/s
    log="$OUT/$1-$3-$4-$5.log"
    $2 models/fashion.cfg epochs=1 batch="$4" precision="$3" threads="$THREADS" save="$OUT/run" \
        ${TRAIN_ARGS:-} > "$log"
    grep '^epoch' "$log" | tail -n 1 | sed 's/.*  \([0-9]*\) img\/s.*/\1/'
}
for c in $CONFIGS; do
    p=${c%%:*} b=${c##*:} as="" bs=""
    for r in $(seq "$ROUNDS"); do
        if [ $((r % 2)) -eq 1 ]; then
            x=$(one A "$A" "$p" "$b" "$r"); y=$(one B "$B" "$p" "$b" "$r")
        else
            y=$(one B "$B" "$p" "$b" "$r"); x=$(one A "$A" "$p" "$b" "$r")
        fi
        as="$as $x" bs="$bs $y"
    done
    echo "$p batch $b: A$as, B$bs" | awk -v as="$as" -v bs="$bs" '{
        na = split(as, a, " "); nb = split(bs, b, " "); sa = sb = 0
        for (i = 1; i <= na; i++) sa += a[i]
        for (i = 1; i <= nb; i++) sb += b[i]
        printf "%s img/s; B/A = %.3f\n", $0, (sb / nb) / (sa / na) }'
done
