#!/bin/sh
# Memory and speed of fp16 and bf16 activation storage and gradient accumulation (issue 5):
# models/fashion.cfg trained for EPOCHS epochs per configuration, one after another, then
# a table of: precision, batch, accumulate (and the micro-batch), the activation bytes of
# the memory plan, the measured peak RSS, images/s and test accuracy of the last epoch.
#
#   sh bench/precision.sh                          the default set (below), EPOCHS=1
#   EPOCHS=2 sh bench/precision.sh fp32:256:1 fp32:256:4
#   CFG=models/resnet-small.cfg EPOCHS=5 SEED=2 sh bench/precision.sh fp32:128:1 bf16:128:1
#
# A configuration is PRECISION:BATCH:ACCUMULATE (fp32|fp16|bf16, batch, micro-batches per
# step); the default set is fp32 and fp16, accumulate 1 and 4, at batch 64 and 512.
# Each run writes bench/out/precision/<precision>_b<batch>_a<accumulate>/ (train.log,
# metrics.jsonl). THREADS (default 2) and SEED (default 1) are passed to ./train; extra
# trainer keys can be given in TRAIN_ARGS. Runs are sequential: timings on a shared
# machine are only comparable when nothing else runs, so the load is printed with them.
# On a loaded machine OMP_WAIT_POLICY=passive helps a lot: a thread that reaches a barrier
# first spins while its partner waits for a core, and fp16 has more parallel regions (a
# conversion per layer and chunk) than fp32, so it suffers more:
#   OMP_WAIT_POLICY=passive sh bench/precision.sh
set -e
cd "$(dirname "$0")/.."
EPOCHS=${EPOCHS:-1}
THREADS=${THREADS:-2}
SEED=${SEED:-1}
CFG=${CFG:-models/fashion.cfg}
OUT=bench/out/precision
[ $# -gt 0 ] || set -- fp32:64:1 fp16:64:1 fp32:64:4 fp16:64:4 \
                      fp32:512:1 fp16:512:1 fp32:512:4 fp16:512:4
make -s train  # a plain build: the Makefile relinks it after `make SAN=1`
mkdir -p "$OUT"

echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores;" \
     "threads $THREADS; OMP_WAIT_POLICY ${OMP_WAIT_POLICY:-unset}; $CFG, epochs $EPOCHS, seed $SEED;" \
     "$(date -u '+%Y-%m-%d %H:%M UTC'); $(git rev-parse --short HEAD 2>/dev/null || echo 'no git')"

# A number field of the last line of a metrics.jsonl.
field() { tail -n 1 "$1" | sed -n "s/.*\"$2\": *\([^,}]*\).*/\1/p"; }

# "activations workspace total" in MB from a training log's memory plan: the one-line
# form ("memory plan: ..., activations X MB, workspace Y MB, ...; total Z MB") or the
# table ("memory plan (MB):" then "  activations  X", "  workspace (...)  Y", "  total  Z").
plan() {
    awk '/^memory plan:/ { for (i = 1; i < NF; i++) { if ($i == "activations") a = $(i + 1);
                                                       if ($i == "workspace") w = $(i + 1);
                                                       if ($i == "total") t = $(i + 1) } }
         /^memory plan \(MB\):/ { table = 1; next }
         table && /^  [a-z]/ { if ($1 == "activations") a = $NF; if ($1 == "workspace") w = $NF;
                               if ($1 == "total") t = $NF }
         table && !/^  / { table = 0 }
         END { print (a == "" ? "?" : a), (w == "" ? "?" : w), (t == "" ? "?" : t) }' "$1"
}

rows=""
for c in "$@"; do
    prec=${c%%:*}; rest=${c#*:}; batch=${rest%%:*}; acc=${rest#*:}
    case "$prec:$batch:$acc" in
        fp32:*:*|fp16:*:*|bf16:*:*) ;;
        *) echo "precision.sh: '$c' is not PRECISION:BATCH:ACCUMULATE (fp16:512:4)" >&2; exit 2 ;;
    esac
    name=${prec}_b${batch}_a${acc}
    dir=$OUT/$name
    mkdir -p "$dir"
    load=$(cut -d' ' -f1 /proc/loadavg)
    echo "== $name: ./train $CFG epochs=$EPOCHS batch=$batch accumulate=$acc precision=$prec (load $load)"
    # shellcheck disable=SC2086
    if ! ./train "$CFG" epochs="$EPOCHS" batch="$batch" accumulate="$acc" precision="$prec" \
            threads="$THREADS" seed="$SEED" save="$dir" $TRAIN_ARGS > "$dir/train.log" 2>&1; then
        tail -n 5 "$dir/train.log"
        echo "precision.sh: $name failed (log: $dir/train.log)" >&2
        exit 1
    fi
    grep '^epoch' "$dir/train.log"
    pl=$(plan "$dir/train.log")
    act=${pl%% *}; pl=${pl#* }; ws=${pl%% *}; total=${pl#* }
    m=$dir/metrics.jsonl
    rows="$rows$(printf '%-5s %6s %5s %6s %9s %9s %9s %9s %7s %8s %7s %6s' "$prec" "$batch" "$acc" \
        "$((batch / acc))" "$act" "$ws" "$total" "$(field "$m" peak_rss_mb)" \
        "$(field "$m" img_per_s)" "$(field "$m" val_acc)" "$(field "$m" skipped_steps)" "$load")
"
done

echo
printf '%-5s %6s %5s %6s %9s %9s %9s %9s %7s %8s %7s %6s\n' prec batch accum micro "act MB" \
    "ws MB" "plan MB" "peak MB" "img/s" "test %" skipped load
printf '%s' "$rows"
echo "(act/ws/plan: the memory plan's activations, workspace and total; peak: VmHWM after the"
echo " last epoch; img/s, test %, skipped: the last epoch; load: 1-minute load average at the start)"
