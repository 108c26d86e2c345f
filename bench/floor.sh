#!/bin/sh
# The exact savers at their floor (issue 30): models/resnet18.cfg at 224x224, batch 32,
# SGD lr 0.01 momentum 0.9 (PyTorch's --sgd), 2 threads, against PyTorch's plain run
# measured in the same rounds.
#   ROUNDS=5 STEPS=3 sh bench/floor.sh
# (PyTorch's peak varies by up to 400 MB from one run to the next, about one run in five
# far lower: the ratios are against the mean of its ROUNDS runs, so take five or more.)
# 1. The activation block of checkpoint=sqrt against the plain run's, and the bits: after
#    STEPS steps the weights, running statistics and momentum of the plain run, of
#    checkpoint=sqrt and of every exact fp32 saver are the same tensors (./ckpt diff).
# 2. Peak RSS (/usr/bin/time) of cnn.c with every exact saver, fp32 and fp16 storage, and
#    with the fp32 savers plus the lossy ones (2-bit activations, int8 optimizer state),
#    against its plan (--plan --json: total + baseline) and against PyTorch's plain peak
#    (bench/resnet_torch.py --sgd: bench/cfg_torch.py's network, the same layers; and
#    torchvision's resnet18, whose in-place ReLUs keep less), rounds alternating the order.
# The data is a folder of 28x28 PNGs resized to 224 (bench/make_folders), so the decoder's
# buffers stay small and the network's memory is what is measured.
set -e
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-5}
STEPS=${STEPS:-3}
OUT=bench/out/floor
mkdir -p "$OUT"
make -s train ckpt build/bench/make_folders
FOLDER=$OUT/png28_512
[ -d "$FOLDER" ] || build/bench/make_folders "$FOLDER" png28 512 > /dev/null
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores; $(uptime | sed 's/.*load/load/')"
ARGS="train=$FOLDER train_labels=none test=none test_labels=none val_split=0 width=224 height=224
      channels=3 flip=0 crop_pad=0 batch=32 optimizer=sgd lr=0.01 momentum=0.9 threads=2 cache=$OUT/cache"
FP32="checkpoint=sqrt fused_update=1 prefetch=1"
FP16="checkpoint=sqrt precision=fp16 prefetch=1"
LOSSY="fused_update=1 prefetch=1 compress=2 optimizer_state=int8"

# json NAME SETTINGS...: the plan's JSON of these settings into $OUT/NAME.json
json() { name=$1; shift; ./train models/resnet18.cfg $ARGS "$@" --plan --json > "$OUT/$name.json"; }
# field NAME KEY: a number from NAME's plan
field() { /usr/bin/python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$OUT/$1.json" "$2"; }
# train NAME SETTINGS...: STEPS steps into $OUT/NAME/, peak RSS in KiB into $OUT/NAME.kib
train() {
    name=$1; shift
    rm -rf "${OUT:?}/$name"
    /usr/bin/time -f "%M" -o "$OUT/$name.time" ./train models/resnet18.cfg $ARGS "$@" \
        stop_after="$STEPS" save="$OUT/$name" > "$OUT/$name.log" 2>&1
    tail -n 1 "$OUT/$name.time" > "$OUT/$name.kib"
}
# torch NAME ARGS...: PyTorch's plain run; peak RSS in KiB into $OUT/NAME.kib
torch() {
    name=$1; shift
    /usr/bin/python3 bench/resnet_torch.py models/resnet18.cfg --size 224 --batch 32 \
        --steps "$STEPS" --threads 2 --sgd "$@" > "$OUT/$name.jsonl"
    /usr/bin/python3 -c 'import json,sys; print(round(json.loads(open(sys.argv[1]).read())["peak_rss_mb"] * 1e6 / 1024))' \
        "$OUT/$name.jsonl" > "$OUT/$name.kib"
}

echo
echo "1. checkpoint=sqrt against the plain run (activation block), and the bits after $STEPS steps"
json plain checkpoint=none fused_update=0
json sqrt checkpoint=sqrt fused_update=0
PLAIN_A=$(field plain activations) SQRT_A=$(field sqrt activations)
printf '   activations: plain %.1f MB, checkpoint=sqrt %.1f MB: %.2fx less\n' \
    "$(echo "$PLAIN_A / 1000000" | bc -l)" "$(echo "$SQRT_A / 1000000" | bc -l)" "$(echo "$PLAIN_A / $SQRT_A" | bc -l)"
train bits_plain checkpoint=none fused_update=0
train bits_sqrt checkpoint=sqrt fused_update=0
train bits_fp32 $FP32
for run in bits_sqrt bits_fp32; do
    if ./ckpt diff "$OUT/bits_plain/last.safetensors" "$OUT/$run/last.safetensors" > "$OUT/$run.diff"; then
        echo "   $run: every tensor identical to the plain run's ($(grep -c . "$OUT/$run.diff") lines of ./ckpt diff)"
    else
        echo "   $run: DIFFERS from the plain run (see $OUT/$run.diff)"; exit 1
    fi
done

echo
echo "2. peak RSS, $ROUNDS rounds (MB = 10^6 bytes)"
json fp32 $FP32
json fp16 $FP16
json lossy $LOSSY
r=0
while [ $r -lt "$ROUNDS" ]; do
    order="cnn torch"; [ $((r % 2)) -eq 1 ] && order="torch cnn"
    for side in $order; do
        if [ $side = cnn ]; then
            train "fp32_$r" $FP32
            train "fp16_$r" $FP16
            train "lossy_$r" $LOSSY
        else
            torch "torch_$r"
            torch "torchvision_$r" --torchvision
        fi
    done
    r=$((r + 1))
done
/usr/bin/python3 - "$OUT" "$ROUNDS" "$FP32" "$FP16" "$LOSSY" <<'PY'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
mb = lambda name: [int(open("%s/%s_%d.kib" % (out, name, r)).read()) * 1024 / 1e6 for r in range(rounds)]
torch, tv = mb("torch"), mb("torchvision")
print("   PyTorch plain (cfg_torch's network): %s MB" % " ".join("%.1f" % x for x in torch))
print("   PyTorch plain (torchvision resnet18): %s MB" % " ".join("%.1f" % x for x in tv))
ref = statistics.mean(torch)
print("   %-52s %9s %9s %8s %9s %8s" % ("cnn.c", "plan MB", "peak MB", "diff", "x PyTorch", "target"))
for name, settings, target in (("fp32", sys.argv[3], 0.20), ("fp16", sys.argv[4], 0.15), ("lossy", sys.argv[5], 0.10)):
    plan = json.load(open("%s/%s.json" % (out, name)))
    expected = (plan["total"] + plan["baseline"]) / 1e6
    for r, peak in enumerate(mb(name)):
        print("   %-52s %9.1f %9.1f %+7.1f%% %9.3f %8.2f" % ("%s (round %d)" % (settings, r), expected, peak,
              100 * (peak - expected) / expected, peak / ref, target))
PY
