#!/bin/sh
# bf16 against fp32 on this CPU (issue 34): each network's three settings, matmul = fp32,
# matmul = bf16 and precision = bf16, one after another, in ROUNDS rounds (default 2);
# for each run its profiled step (`profile=1`: ms a step over the steps run) and its
# ratio to fp32's step of the same round.
#
#   resnet-small     models/resnet-small.cfg on Fashion-MNIST, 50 steps of 128
#   fashion-resnet   models/fashion-resnet.cfg on Fashion-MNIST, 40 steps of 128
#   resnet18         models/resnet18.cfg at 224 x 224, batch 32, 6 steps of
#                    bench/resnet_bench.sh's generated folder (96 images)
#
#   sh bench/bf16_ratios.sh
#   ROUNDS=3 NETS="resnet-small resnet18" sh bench/bf16_ratios.sh
#
# THREADS (default 2) goes to ./train. Nothing else should run meanwhile: the ratios are
# of runs minutes apart.
set -e
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-2}
THREADS=${THREADS:-2}
NETS=${NETS:-resnet-small fashion-resnet resnet18}
OUT=bench/out/bf16_ratios
R=bench/out/resnet  # bench/resnet_bench.sh's folder and cache, shared
make -s train build/bench/make_folders
mkdir -p "$OUT" "$R"
[ -d "$R/png28_96" ] || build/bench/make_folders "$R/png28_96" png28 96 > /dev/null
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores," \
     "threads $THREADS; $(date -u '+%Y-%m-%d %H:%M UTC'); $(git rev-parse --short HEAD 2>/dev/null)"

step() {  # net setting: ms a step of the run's last profile
    case $1 in
    resnet-small) set -- "$2" models/resnet-small.cfg stop_after=50 ;;
    fashion-resnet) set -- "$2" models/fashion-resnet.cfg stop_after=40 ;;
    resnet18) set -- "$2" models/resnet18.cfg train="$R/png28_96" train_labels=none test=none test_labels=none \
        val_split=0 width=224 height=224 channels=3 mean=0.5 std=0.25 flip=0 batch=32 stop_after=6 \
        cache="$R/cache-224-3-96" ;;
    *) echo "unknown network $1 (resnet-small, fashion-resnet, resnet18)" >&2; exit 2 ;;
    esac
    setting=$1; shift
    ./train "$@" profile=1 threads="$THREADS" "$setting" save="$OUT/run" > "$OUT/run.log" 2>&1
    grep '^| total' "$OUT/run.log" | tail -n 1 | awk -F'|' '{printf "%.2f", $3}'
}

for r in $(seq 1 "$ROUNDS"); do
    for net in $NETS; do
        fp32=$(step "$net" matmul=fp32)
        echo "round $r $net matmul=fp32: $fp32 ms a step"
        for s in matmul=bf16 precision=bf16; do
            ms=$(step "$net" "$s")
            echo "round $r $net $s: $ms ms a step, $(echo "$fp32 $ms" | awk '{printf "%.2f", $1 / $2}')x fp32's speed"
        done
    done
done
