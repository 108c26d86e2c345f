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
#   sh bench/optimizer_state.sh speed      the cost instead: ROUNDS (3) alternating rounds of
#       ./train profile=1 with each format, fashion.cfg (Adadelta, 100 steps) and resnet18
#       at 224 px, batch 32, SGD momentum (5 steps) on a folder of 600x600 JPEGs: the
#       profile's step and its optimizer row, ms a step, per format
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

if [ "${1:-}" = speed ]; then
    make -s build/bench/make_folders
    FOLDER=$OUT/jpg600_200
    [ -d "$FOLDER" ] || build/bench/make_folders "$FOLDER" jpg600 200 > /dev/null
    table=$OUT/speed.txt
    : > "$table"
    # The profile's ms a step of a row ("total", "optimizer") in a log.
    row() { grep "^| $2 " "$1" | awk -F'|' '{gsub(/ /, "", $3); print $3}'; }
    for r in $(seq "${ROUNDS:-3}"); do
        for fmt in fp32 bf16 int8; do
            log=$OUT/speed-fashion-$fmt-$r.log
            ./train models/fashion.cfg stop_after=100 threads="$THREADS" profile=1 \
                optimizer_state="$fmt" save="$OUT/speed-fashion-$fmt-$r" > "$log" 2>&1
            echo "fashion $fmt $(row "$log" total) $(row "$log" optimizer)" | tee -a "$table"
            log=$OUT/speed-resnet18-$fmt-$r.log
            ./train models/resnet18.cfg train="$FOLDER" val_split=0 cache="$OUT/cache" batch=32 \
                optimizer=sgd lr=0.01 momentum=0.9 stop_after=5 threads="$THREADS" profile=1 \
                optimizer_state="$fmt" save="$OUT/speed-resnet18-$fmt-$r" > "$log" 2>&1
            echo "resnet18 $fmt $(row "$log" total) $(row "$log" optimizer)" | tee -a "$table"
        done
    done
    echo
    echo "model     format  ms/step  optimizer ms/step   (means over the rounds)"
    awk '{ k = $1 " " $2; n[k]++; t[k] += $3; o[k] += $4 }
         END { split("fashion resnet18", ms, " "); split("fp32 bf16 int8", fs, " ")
               for (i = 1; i <= 2; i++) for (j = 1; j <= 3; j++) { k = ms[i] " " fs[j]
                   printf "%-9s %-6s %8.1f %10.2f\n", ms[i], fs[j], t[k] / n[k], o[k] / n[k] } }' "$table"
    exit 0
fi

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
