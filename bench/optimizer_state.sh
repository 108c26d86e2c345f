#!/bin/sh
# Compressed optimizer state (optimizer_state = bf16 | int8, nn/quant.h): its accuracy over
# seeds against the exact fp32 run, its memory and its speed. models/fashion.cfg (or CFG)
# trained EPOCHS epochs (default 2) with each optimizer of OPTIMIZERS and each seed of SEEDS,
# the three formats one after another for each (so that the load falls on all alike), then
# per optimizer and format: the test accuracy's mean and standard deviation over the seeds,
# the largest difference from the same seed's fp32 run, the plan's optimizer state, the
# images/s as a ratio to the same seed's fp32 run (mean).
#
#   sh bench/optimizer_state.sh
#   SEEDS="1 2 3 4 5" EPOCHS=3 OPTIMIZERS="sgd adamw" sh bench/optimizer_state.sh
#
# Each run writes bench/out/optimizer_state/<optimizer>_<format>_s<seed>/ (train.log,
# metrics.jsonl). THREADS (default 2) goes to ./train; TRAIN_ARGS adds keys to every run.
set -e
cd "$(dirname "$0")/.."
EPOCHS=${EPOCHS:-2}
THREADS=${THREADS:-2}
SEEDS=${SEEDS:-1 2 3}
OPTIMIZERS=${OPTIMIZERS:-adadelta sgd adamw}
CFG=${CFG:-models/fashion.cfg}
OUT=bench/out/optimizer_state
make -s train  # a plain build: the Makefile relinks it after `make SAN=1`
mkdir -p "$OUT"

echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores;" \
     "threads $THREADS; $CFG, epochs $EPOCHS, seeds $SEEDS;" \
     "$(date -u '+%Y-%m-%d %H:%M UTC'); $(git rev-parse --short HEAD 2>/dev/null || echo 'no git')"

# A number field of the last line of a metrics.jsonl.
field() { tail -n 1 "$1" | sed -n "s/.*\"$2\": *\([^,}]*\).*/\1/p"; }
# The optimizer state's MB from a training log's memory plan.
state_mb() { awk '/^  optimizer state/ { print $3; exit }' "$1"; }

# The optimizers' keys (fashion.cfg ships Adadelta at lr 1.0).
keys() {
    case $1 in
        adadelta) echo "optimizer=adadelta lr=1.0" ;;
        sgd) echo "optimizer=sgd lr=0.05 momentum=0.9" ;;
        adamw) echo "optimizer=adamw lr=0.001" ;;
        *) echo "optimizer_state.sh: unknown optimizer '$1' (adadelta, sgd, adamw)" >&2; exit 2 ;;
    esac
}

rows=$OUT/rows.txt
: > "$rows"
for opt in $OPTIMIZERS; do
    k=$(keys "$opt")
    for seed in $SEEDS; do
        for fmt in fp32 bf16 int8; do
            dir=$OUT/${opt}_${fmt}_s$seed
            mkdir -p "$dir"
            echo "== ./train $CFG $k optimizer_state=$fmt seed=$seed epochs=$EPOCHS (load $(cut -d' ' -f1 /proc/loadavg))"
            # shellcheck disable=SC2086
            if ! ./train "$CFG" $k optimizer_state="$fmt" seed="$seed" epochs="$EPOCHS" \
                    threads="$THREADS" save="$dir" $TRAIN_ARGS > "$dir/train.log" 2>&1; then
                tail -n 5 "$dir/train.log"
                echo "optimizer_state.sh: $dir failed (log: $dir/train.log)" >&2
                exit 1
            fi
            m=$dir/metrics.jsonl
            echo "$opt $fmt $seed $(field "$m" val_acc) $(field "$m" img_per_s) $(state_mb "$dir/train.log")" | tee -a "$rows"
        done
    done
done

echo
echo "optimizer format  seeds  test acc mean  sd    max |acc - fp32|  state MB  img/s vs fp32"
awk '{ acc[$1" "$2, $3] = $4; ips[$1" "$2, $3] = $5; mb[$1" "$2] = $6; key[$1" "$2] = 1; seeds[$3] = 1 }
     END {
         n = split("adadelta sgd adamw", opts, " "); split("fp32 bf16 int8", fmts, " ")
         for (o = 1; o <= n; o++) for (f = 1; f <= 3; f++) {
             k = opts[o] " " fmts[f]; if (!(k in key)) continue
             c = 0; s = 0; ss = 0; dmax = 0; r = 0
             for (sd in seeds) {
                 a = acc[k, sd]; b = acc[opts[o] " fp32", sd]; c++; s += a; ss += a * a
                 d = a - b; if (d < 0) d = -d; if (d > dmax) dmax = d
                 r += ips[k, sd] / ips[opts[o] " fp32", sd]
             }
             m = s / c; v = c > 1 ? (ss - c * m * m) / (c - 1) : 0; if (v < 0) v = 0
             printf "%-9s %-6s %5d  %13.2f  %4.2f  %16.2f  %8s  %13.3f\n", opts[o], fmts[f], c, m, sqrt(v), dmax, mb[k], r / c
         }
     }' "$rows"
