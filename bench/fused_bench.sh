#!/bin/sh
# Issue 30 point 1: what the fused update (fused_update = 1) costs against the update after
# backward. Alternating rounds of ./train with profile=1, STEPS steps each: odd rounds run
# unfused then fused, even rounds fused then unfused, on
#   fashion   models/fashion.cfg as it is (batch 64, Adadelta)
#   resnet18  models/resnet18.cfg at 224x224, batch 32, SGD momentum 0.9, on a folder of
#             600x600 JPEGs (build/bench/make_folders jpg600), decoded once into a cache
# and quotes the profile's milliseconds per step (the whole step, and its optimizer row:
# the update, wherever it runs) for each run, then the means and the fused/unfused ratio.
# The step totals include the loader and the checkpoint written at stop_after, and swing
# with the machine's load; build/bench/fused_step (bench/fused_step.c) alternates the two
# within one process, step by step, for the compute alone.
#   ROUNDS=4 THREADS=2 sh bench/fused_bench.sh
set -e
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-4}
THREADS=${THREADS:-2}
FASHION_STEPS=${FASHION_STEPS:-60}
RESNET_STEPS=${RESNET_STEPS:-6}
OUT=bench/out/fused
make -s train build/bench/make_folders
mkdir -p "$OUT"
rm -rf "$OUT/runs"
mkdir -p "$OUT/runs"
FOLDER=$OUT/jpg600_200
[ -d "$FOLDER" ] || build/bench/make_folders "$FOLDER" jpg600 200 > /dev/null
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores, threads $THREADS${OMP_WAIT_POLICY:+, OMP_WAIT_POLICY=$OMP_WAIT_POLICY}; $(uptime | sed 's/.*load/load/')"

run() {  # model fused round
    log="$OUT/runs/$1-fused$2-$3.log"
    case $1 in
    fashion) ./train models/fashion.cfg stop_after="$FASHION_STEPS" threads="$THREADS" profile=1 \
                 fused_update="$2" save="$OUT/runs/$1-$2-$3" > "$log" 2>&1 ;;
    resnet18) ./train models/resnet18.cfg train="$FOLDER" val_split=0 cache="$OUT/cache" \
                  batch=32 optimizer=sgd lr=0.01 momentum=0.9 stop_after="$RESNET_STEPS" \
                  threads="$THREADS" profile=1 fused_update="$2" save="$OUT/runs/$1-$2-$3" \
                  > "$log" 2>&1 ;;
    esac
    total=$(grep '^| total ' "$log" | awk -F'|' '{gsub(/ /, "", $3); print $3}')
    opt=$(grep '^| optimizer ' "$log" | awk -F'|' '{gsub(/ /, "", $3); print $3}')
    echo "$1 fused_update=$2 round $3: $total ms/step, optimizer $opt ms/step" | tee -a "$OUT/runs/table"
}

for r in $(seq "$ROUNDS"); do
    for m in fashion resnet18; do
        if [ $((r % 2)) -eq 1 ]; then run $m 0 "$r"; run $m 1 "$r"; else run $m 1 "$r"; run $m 0 "$r"; fi
    done
done

awk '{ key = $1 " " $2; n[key]++; t[key] += $5; o[key] += $8 }
     END { for (m in n) if (m ~ /=0$/) {
               split(m, a, " "); f = a[1] " fused_update=1";
               printf "%-9s unfused %8.1f ms/step (optimizer %6.2f)   fused %8.1f ms/step (optimizer %6.2f)   fused/unfused %.3f\n",
                      a[1], t[m] / n[m], o[m] / n[m], t[f] / n[f], o[f] / n[f], (t[f] / n[f]) / (t[m] / n[m]) } }' \
    "$OUT/runs/table"
