#!/bin/sh
# The budget's choice against the hand-written settings (issue 30, point 4): for budgets
# from the plain plan down to the smallest exact plan, `memory = B` chooses a plan (a probe
# of a few steps times them) and trains; every hand-written exact setting that fits B
# (checkpoint = none, 2, 4, 7, 14 segments, fused_update on and off where it exists)
# trains too; the chosen plan's seconds a step are compared with the fastest hand-written
# one's, in ROUNDS rounds that alternate the order (a shared machine drifts).
#   ROUNDS=2 STEPS=3 sh bench/budget.sh
# Each run is one epoch of STEPS batches of resnet18 b32 at 224x224 (a folder of 28x28 PNGs
# resized and cached, so decoding is not what is measured); its epoch line's seconds.
set -e
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-2}
STEPS=${STEPS:-3}
BATCH=${BATCH:-32}
OUT=bench/out/budget
mkdir -p "$OUT"
make -s train build/bench/make_folders
FOLDER=$OUT/png28_$((STEPS * BATCH))
[ -d "$FOLDER" ] || build/bench/make_folders "$FOLDER" png28 $((STEPS * BATCH)) > /dev/null
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores; $(uptime | sed 's/.*load/load/')"
ARGS="train=$FOLDER train_labels=none test=none test_labels=none val_split=0 width=224 height=224
      channels=3 flip=0 batch=$BATCH optimizer=sgd lr=0.01 momentum=0.9 epochs=1 threads=2
      cache=$OUT/cache"
FUSED=
./train --help | grep -q '^ *fused_update' && FUSED="0 1"
# plan SETTINGS...: the plan's bytes (with the loader and the baseline) for these settings
plan() {
    ./train models/resnet18.cfg $ARGS "$@" --plan --json 2>/dev/null |
        /usr/bin/python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["total"] + d["baseline"])'
}
# seconds SETTINGS...: the epoch's seconds a step
seconds() {
    log=$OUT/run.log
    ./train models/resnet18.cfg $ARGS save="$OUT/run" "$@" > "$log" 2>&1
    /usr/bin/python3 -c 'import json,sys; l=[json.loads(x) for x in open(sys.argv[1])]; print("%.3f" % (l[-1]["seconds"] / int(sys.argv[2])))' \
        "$OUT/run/metrics.jsonl" "$STEPS"
}
SETTINGS=""
for c in none 2 4 7 14; do
    if [ -n "$FUSED" ]; then for f in $FUSED; do SETTINGS="$SETTINGS checkpoint=$c,fused_update=$f"; done
    else SETTINGS="$SETTINGS checkpoint=$c"; fi
done
PLAIN=$(plan checkpoint=none)
SMALLEST=$PLAIN
for s in $SETTINGS; do b=$(plan $(echo "$s" | tr ',' ' ')); [ "$b" -lt "$SMALLEST" ] && SMALLEST=$b; done
echo "plain plan $((PLAIN / 1000000)) MB, smallest exact plan $((SMALLEST / 1000000)) MB"
printf '%-10s %-44s %9s %-44s %9s %7s\n' budget chosen "s/step" "fastest hand-written setting" "s/step" ratio
for f in 100 80 65 50 40 30; do
    B=$((PLAIN * f / 100))
    [ "$B" -lt "$SMALLEST" ] && B=$SMALLEST
    MB=$(( (B + 1048575) / 1048576 ))
    fits=""
    for s in $SETTINGS; do [ "$(plan $(echo "$s" | tr ',' ' '))" -le "$((MB * 1048576))" ] && fits="$fits $s"; done
    chosen_t=0 best_t=0 best=""
    r=0
    while [ $r -lt "$ROUNDS" ]; do
        order="choose hand"; [ $((r % 2)) -eq 1 ] && order="hand choose"
        for side in $order; do
            if [ $side = choose ]; then
                t=$(seconds memory=${MB}M)
                chosen=$(grep -m1 'memory = .*: chose\|fits as configured' "$OUT/run.log" | sed 's/.*: chose //; s/: the plan.*//; s/.*fits as configured.*/as configured/')
                chosen_t=$(echo "$chosen_t + $t" | bc -l)
            else
                for s in $fits; do
                    t=$(seconds $(echo "$s" | tr ',' ' '))
                    eval "sum_$(echo "$s" | tr '=,' '__')=\$(echo \"\${sum_$(echo "$s" | tr '=,' '__'):-0} + $t\" | bc -l)"
                done
            fi
        done
        r=$((r + 1))
    done
    for s in $fits; do
        v=$(eval "echo \$sum_$(echo "$s" | tr '=,' '__')")
        if [ -z "$best" ] || [ "$(echo "$v < $best_t" | bc -l)" = 1 ]; then best=$s best_t=$v; fi
        eval "sum_$(echo "$s" | tr '=,' '__')=0"
    done
    printf '%-10s %-44s %9.3f %-44s %9.3f %7.2f\n' "${MB}M" "$chosen" "$(echo "$chosen_t / $ROUNDS" | bc -l)" \
        "$best" "$(echo "$best_t / $ROUNDS" | bc -l)" "$(echo "$chosen_t / $best_t" | bc -l)"
    [ "$B" -le "$SMALLEST" ] && break
done
