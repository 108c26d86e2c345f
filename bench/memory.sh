#!/bin/sh
# Memory benchmarks (issues 6 and 14): the plan against the measured peak RSS, and
# activation checkpointing on models/deep.cfg and models/resnet18.cfg. Each run trains
# STEPS optimizer steps (stop_after; RSTEPS for resnet18) and is measured with
# /usr/bin/time (wall and CPU seconds per step: the CPU time is the steadier measure on a
# shared machine; both include start-up and one checkpoint write); the plan comes from
# ./train --plan --json.
#   STEPS=20 RSTEPS=4 sh bench/memory.sh
set -e
cd "$(dirname "$0")/.."
STEPS=${STEPS:-20}
OUT=bench/out/memory
mkdir -p "$OUT"
[ -f data/mnist/train-images-idx3-ubyte ] || sh data/make_mnist.sh
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores; $(uptime | sed 's/.*load/load/')"

# run CFG NAME ARGS...: prints plan total + baseline, peak RSS, seconds per step
run() {
    cfg=$1; name=$2; shift 2
    plan=$(./train "$cfg" --plan --json "$@")
    /usr/bin/time -f "%M %e %U %S" -o "$OUT/$name.time" ./train "$cfg" "$@" stop_after="$STEPS" \
        save="$OUT/$name" > "$OUT/$name.log" 2>&1
    /usr/bin/python3 - "$plan" "$OUT/$name.time" "$name" "$STEPS" <<'PY'
import json, sys
plan = json.loads(sys.argv[1]); peak_kib, secs, user, system = open(sys.argv[2]).read().split()[-4:]
expected = (plan["total"] + plan["baseline"]) / 1e6; peak = int(peak_kib) * 1024 / 1e6
steps = int(sys.argv[4])
print("%-28s %12.1f %12.1f %14.1f %8.1f %+8.1f%% %9.2f %9.2f" % (sys.argv[3], plan["activations"] / 1e6,
      plan["total"] / 1e6, expected, peak, 100 * (peak - expected) / expected, float(secs) / steps,
      (float(user) + float(system)) / steps))
PY
}

header() {
    printf '%-28s %12s %12s %14s %8s %9s %9s %9s\n' "run" "activ. MB" "plan MB" "plan+base MB" "peak MB" "diff" "s/step" "cpu s/step"
}

echo; echo "plan against measured peak RSS (fp32)"; header
for b in 32 128 512; do run models/fashion.cfg "fashion batch=$b" batch=$b; done
for b in 16 64 128; do run models/deep.cfg "deep batch=$b" batch=$b; done

echo; echo "activation checkpointing on models/deep.cfg, batch 64"; header
for c in none sqrt 2 4; do run models/deep.cfg "deep checkpoint=$c" checkpoint=$c; done

# ResNets: models/resnet-small.cfg on Fashion-MNIST, models/resnet18.cfg at 224x224 on a
# folder of 2,000 Fashion-MNIST PNGs (28x28, resized: the decoder's buffers stay small, so
# the network's memory is what is measured).
FOLDER=bench/out/png28_2k
[ -d "$FOLDER" ] || { make -s build/bench/make_folders && build/bench/make_folders "$FOLDER" png28 2000; }
RSTEPS=${RSTEPS:-4}
echo; echo "ResNets (resnet18: $RSTEPS steps)"; header
run models/resnet-small.cfg "resnet-small batch=128"
run models/resnet-small.cfg "resnet-small sqrt fp16" checkpoint=sqrt precision=fp16
STEPS=$RSTEPS
for p in fp32 fp16; do
    for c in none sqrt; do
        run models/resnet18.cfg "resnet18 b32 $p checkpoint=$c" train=$FOLDER batch=32 precision=$p checkpoint=$c
    done
done

# The same on 600x600 JPEGs (bench/make_folders' jpg600, as the cfg's default folder): the
# loader's decoding at the DCT scale is in the plan too (issue 30).
JPEGS=bench/out/jpg600_300
[ -d "$JPEGS" ] || { make -s build/bench/make_folders && build/bench/make_folders "$JPEGS" jpg600 300; }
run models/resnet18.cfg "resnet18 b32 fp32 jpg600" train=$JPEGS batch=32
