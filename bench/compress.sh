#!/bin/sh
# Compressed training state (issue 31): the accuracy of each saver that changes the result
# over seeds, side by side with the exact run. CFG (default models/resnet-small.cfg) trained
# EPOCHS epochs (default 5) for each seed of SEEDS (default 1 2 3) with each variant, one
# after another for each seed (so that the load falls on all alike):
#
#   exact     the cfg as it is
#   act8      compress = 8 (activations that backward reads as 8-bit codes)
#   act4      compress = 4
#   act2      compress = 2
#   state8    optimizer_state = int8
#   all       compress = 2, optimizer_state = int8 and precision = fp16
#   bf16      precision = bf16 (issue 34: bf16 storage and GEMMs)
#   bf16mm    matmul = bf16 (bf16 GEMMs on fp32 activations)
#
# then per variant the test accuracy's mean and standard deviation over the seeds, its mean
# difference from the exact runs' mean and that difference's standard error (from the
# spread of the same seed's differences: a limit closer to the difference than about two of
# them is not resolved by these seeds), the largest difference from the same seed's exact
# run, the plan's activations MB, and images/s as a ratio to the same seed's exact run.
#
#   sh bench/compress.sh
#   CFG=models/fashion.cfg EPOCHS=2 VARIANTS="exact act2" sh bench/compress.sh
#
# The optimizer is the cfg's unless OPTIM names keys (OPTIM="optimizer=sgd lr=0.05
# momentum=0.9"; state8 needs one with state). Each run writes bench/out/compress/<variant>_s<seed>/
# (train.log, metrics.jsonl; TAG=x: bench/out/compress-x/). THREADS (default 2) goes to
# ./train; TRAIN_ARGS adds keys to every run. EXACT=bench/out/compress-y/rows.txt compares
# with the exact runs of an earlier tag (while fp32's bits have not moved) instead of running
# them; with neither, the columns against exact print "-".
set -e
cd "$(dirname "$0")/.."
EPOCHS=${EPOCHS:-5}
THREADS=${THREADS:-2}
SEEDS=${SEEDS:-1 2 3}
VARIANTS=${VARIANTS:-exact act8 act4 act2 state8 all}
CFG=${CFG:-models/resnet-small.cfg}
OPTIM=${OPTIM:-}
EXACT=${EXACT:-}
[ -z "$EXACT" ] || [ -f "$EXACT" ] || { echo "compress.sh: EXACT=$EXACT: no such rows file" >&2; exit 2; }
OUT=bench/out/compress${TAG:+-$TAG}
make -s train  # a plain build: the Makefile relinks it after `make SAN=1`
mkdir -p "$OUT"

echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores;" \
     "threads $THREADS; $CFG $OPTIM, epochs $EPOCHS, seeds $SEEDS;" \
     "$(date -u '+%Y-%m-%d %H:%M UTC'); $(git rev-parse --short HEAD 2>/dev/null || echo 'no git')"

keys() {
    case $1 in
        exact) echo "" ;;
        act8) echo "compress=8" ;;
        act4) echo "compress=4" ;;
        act2) echo "compress=2" ;;
        state8) echo "optimizer_state=int8" ;;
        all) echo "compress=2 optimizer_state=int8 precision=fp16" ;;
        bf16) echo "precision=bf16" ;;
        bf16mm) echo "matmul=bf16" ;;
        *) echo "compress.sh: unknown variant '$1' (exact act8 act4 act2 state8 all bf16 bf16mm)" >&2; exit 2 ;;
    esac
}
# A number field of the last line of a metrics.jsonl.
field() { tail -n 1 "$1" | sed -n "s/.*\"$2\": *\([^,}]*\).*/\1/p"; }
# The activations' MB from a training log's memory plan.
act_mb() { awk '/^  activations/ { print $2; exit }' "$1"; }

rows=$OUT/rows.txt
: > "$rows"
for seed in $SEEDS; do
    for v in $VARIANTS; do
        dir=$OUT/${v}_s$seed
        mkdir -p "$dir"
        k="$OPTIM $(keys "$v")"
        echo "== ./train $CFG $k seed=$seed epochs=$EPOCHS (load $(cut -d' ' -f1 /proc/loadavg))"
        # shellcheck disable=SC2086
        if ! ./train "$CFG" $k seed="$seed" epochs="$EPOCHS" threads="$THREADS" save="$dir" \
                $TRAIN_ARGS > "$dir/train.log" 2>&1; then
            tail -n 5 "$dir/train.log"
            echo "compress.sh: $dir failed (log: $dir/train.log)" >&2
            exit 1
        fi
        m=$dir/metrics.jsonl
        echo "$v $seed $(field "$m" val_acc) $(field "$m" img_per_s) $(act_mb "$dir/train.log")" | tee -a "$rows"
    done
done

echo
echo "variant  seeds  test acc mean  sd    mean - exact  se of it  max |acc - exact|  activations MB  img/s vs exact"
# The exact runs: this run's, or EXACT's rows of the same seeds (their img/s from another
# hour: no ratio).
awk -v variants="$VARIANTS" -v rows="$rows" -v earlier="$EXACT" '
    FILENAME != rows && $1 != "exact" { next }
    FILENAME == rows { seeds[$2] = 1 }
    { acc[$1, $2] = $3; ips[$1, $2] = $4; mb[$1] = $5 }
    END {
        n = split(variants, vs, " ")
        c = 0; s = 0; have = 1
        for (sd in seeds) { if (!(("exact", sd) in acc)) have = 0; c++; s += acc["exact", sd] }
        base = c ? s / c : 0
        for (i = 1; i <= n; i++) {
            v = vs[i]; c = 0; s = 0; ss = 0; ds = 0; dss = 0; dmax = 0; r = 0
            for (sd in seeds) {
                a = acc[v, sd]; b = acc["exact", sd]; c++; s += a; ss += a * a
                d = a - b; ds += d; dss += d * d; if (d < 0) d = -d; if (d > dmax) dmax = d
                if (ips["exact", sd] > 0) r += ips[v, sd] / ips["exact", sd]
            }
            m = s / c; var = c > 1 ? (ss - c * m * m) / (c - 1) : 0; if (var < 0) var = 0
            dm = ds / c; dvar = c > 1 ? (dss - c * dm * dm) / (c - 1) : 0; if (dvar < 0) dvar = 0
            d = have ? sprintf("%.2f", m - base) : "-"; se = have ? sprintf("%.2f", sqrt(dvar / c)) : "-"
            far = have ? sprintf("%.2f", dmax) : "-"; ratio = have && earlier == "" ? sprintf("%.3f", r / c) : "-"
            printf "%-8s %5d  %13.2f  %4.2f  %12s  %8s  %17s  %14s  %14s\n", v, c, m, sqrt(var), d, se, far, mb[v], ratio
        }
    }' ${EXACT:+"$EXACT"} "$rows"
