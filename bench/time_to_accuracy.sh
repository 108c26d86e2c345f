#!/bin/sh
# Time to accuracy (issue 34), DAWNBench's measure: a recipe (models/fashion-resnet.cfg)
# trained by cnn.c and by PyTorch (bench/pytorch_cfg.py: the same network built by
# bench/cfg_torch.py, the same data order, crop and flip of every image, optimizer and
# schedule), THREADS threads each, one run after another, alternating in each round.
# For every run: the wall time from its launch to the end of the first epoch whose test
# accuracy reaches TARGET (the test evaluation and the start-up included: what a user
# waits), that epoch, the final test accuracy and the training loop's mean images/s.
# Then each implementation's best time (its fastest variant's median over the rounds) and
# cnn.c's best over PyTorch's best.
#
#   sh bench/time_to_accuracy.sh                        the four variants below, 1 round
#   ROUNDS=2 sh bench/time_to_accuracy.sh cnn:fp32 torch:bf16
#   TARGET=93.5 TRAIN_ARGS="epochs=10" sh bench/time_to_accuracy.sh
#
# A variant is IMPL:PRECISION: cnn:fp32, cnn:bf16 (precision = bf16), cnn:bf16mm (matmul =
# bf16: bf16 GEMMs on fp32 activations), torch:fp32, torch:bf16 (torch.autocast("cpu",
# dtype=torch.bfloat16)). TRAIN_ARGS are cfg overrides
# given to both (key=value of [train] or [data]). Logs: bench/out/tta/<variant>_r<round>.log,
# each line prefixed by its seconds since the launch. A run takes minutes (20 epochs of
# Fashion-MNIST), so a round of the four takes about 90 minutes on 2 cores.
set -e
cd "$(dirname "$0")/.."
CFG=${CFG:-models/fashion-resnet.cfg}
TARGET=${TARGET:-94.0}
THREADS=${THREADS:-2}
ROUNDS=${ROUNDS:-1}
OUT=bench/out/tta
[ $# -gt 0 ] || set -- cnn:fp32 cnn:bf16 torch:fp32 torch:bf16
for v in "$@"; do
    case $v in
        cnn:fp32|cnn:bf16|cnn:bf16mm|torch:fp32|torch:bf16) ;;
        *) echo "time_to_accuracy.sh: '$v' is not cnn:fp32, cnn:bf16, cnn:bf16mm, torch:fp32 or torch:bf16" >&2; exit 2 ;;
    esac
done
case " $* " in *" torch:"*)
    /usr/bin/python3 -c 'import torch' 2>/dev/null ||
        { echo "time_to_accuracy.sh: PyTorch is missing for /usr/bin/python3: run make deps-bench" >&2; exit 1; } ;;
esac
make -s train
mkdir -p "$OUT"

echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores;" \
     "threads $THREADS; $CFG $TRAIN_ARGS; target $TARGET%; $ROUNDS round(s);" \
     "$(date -u '+%Y-%m-%d %H:%M UTC'); $(git rev-parse --short HEAD 2>/dev/null || echo 'no git')"

# Runs a command, writing each line of its output to the log prefixed by the seconds since
# its launch.
timed() {
    log=$1; shift
    t0=$(date +%s.%N)
    # shellcheck disable=SC2086
    { "$@" 2>&1 && echo "exit 0" || echo "exit $?"; } | while IFS= read -r line; do
        awk -v now="$(date +%s.%N)" -v t0="$t0" -v line="$line" 'BEGIN { printf "%.2f %s\n", now - t0, line }'
    done > "$log"
}

# "seconds epoch final img/s" of a log: the first epoch line with val_acc >= TARGET ("-"
# when none), the last epoch's val_acc, the mean of the epochs' images/s.
summary() {
    awk -v target="$TARGET" '
        / epoch [0-9]+\/[0-9]+ / {
            for (i = 2; i < NF; i++) {
                if ($i == "epoch") ep = $(i + 1)
                if ($i == "val_acc") { acc = $(i + 1); sub(/%/, "", acc) }
                if ($(i + 1) == "img/s") { ips += $i; n++ }
            }
            if (t == "" && acc + 0 >= target) { t = $1; te = ep }
            final = acc
        }
        END { printf "%s %s %s %.0f\n", (t == "" ? "-" : sprintf("%.1f", t)),
                     (te == "" ? "-" : te), (final == "" ? "?" : final), (n ? ips / n : 0) }' "$1"
}

rows=""
r=1
while [ "$r" -le "$ROUNDS" ]; do
    for v in "$@"; do
        impl=${v%%:*}; prec=${v#*:}
        log=$OUT/${impl}_${prec}_r$r.log
        echo "== round $r: $v (load $(cut -d' ' -f1 /proc/loadavg))"
        if [ "$impl" = cnn ]; then
            keys="precision=$prec"; [ "$prec" = bf16mm ] && keys="matmul=bf16"
            # shellcheck disable=SC2086
            timed "$log" ./train "$CFG" $keys threads="$THREADS" save="$OUT/run_$prec" $TRAIN_ARGS
        else
            flag=""; [ "$prec" = bf16 ] && flag=--bf16
            # shellcheck disable=SC2086
            timed "$log" /usr/bin/python3 bench/pytorch_cfg.py "$CFG" $TRAIN_ARGS --threads "$THREADS" $flag
        fi
        grep ' epoch [0-9]' "$log" || true
        if ! tail -n 1 "$log" | grep -q ' exit 0$'; then
            tail -n 5 "$log"
            echo "time_to_accuracy.sh: $v failed (log: $log)" >&2
            exit 1
        fi
        rows="$rows$v $r $(summary "$log")
"
    done
    r=$((r + 1))
done

echo
printf '%-11s %5s %14s %6s %8s %7s\n' variant round "s to $TARGET%" epoch "final %" "img/s"
printf '%s' "$rows" | awk '{ printf "%-11s %5s %14s %6s %8s %7s\n", $1, $2, $3, $4, $5, $6 }'
# Each implementation's best: the variant with the lowest median time (a run that never
# reached the target counts as infinite), and the ratio.
printf '%s' "$rows" | awk -v target="$TARGET" '
    { t = ($3 == "-") ? 1e30 : $3; v[$1] = v[$1] " " t }
    END {
        for (k in v) {
            n = split(substr(v[k], 2), a, " ")
            for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] < a[i]) { x = a[i]; a[i] = a[j]; a[j] = x }
            med = (n % 2) ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
            split(k, p, ":")
            if (!(p[1] in best) || med < best[p[1]]) { best[p[1]] = med; bestv[p[1]] = k }
        }
        for (i in best) printf "best %-5s %-11s %s\n", i, bestv[i], (best[i] >= 1e30 ? "did not reach " target "%" : sprintf("%.1f s", best[i]))
        if (("cnn" in best) && ("torch" in best) && best["cnn"] < 1e30 && best["torch"] < 1e30)
            printf "cnn.c best / PyTorch best: %.2fx the time\n", best["cnn"] / best["torch"]
    }'
