#!/bin/sh
# make test-arch (issue 36): cnn.c on CPUs this machine is not, under emulation.
#   1. The x86-64 baseline: this build's binaries under qemu-x86_64 -cpu Nehalem (SSE4.2, no
#      AVX: an AVX instruction would end them with SIGILL). ./train must choose the
#      portable table, SUITES must pass, and STEPS steps of models/mnist.cfg must equal, bit
#      for bit, the native run of the same kernels (CNN_CPU_KERNELS=portable with OpenBLAS's
#      Nehalem kernels, OPENBLAS_CORETYPE=Nehalem, which qemu's CPU makes OpenBLAS choose).
#   2. AVX2 without AVX-512: the same binaries under qemu-x86_64 -cpu Haswell (AVX2, FMA,
#      F16C; no AVX-512). ./train must choose the AVX2 table without the AVX-512 code,
#      SUITES must pass, and AVX2_STEPS steps of models/mnist.cfg must equal, bit for bit,
#      the native run with CNN_CPU_KERNELS=avx2 and OpenBLAS's Haswell kernels (qemu 7.2
#      emulates AVX2 slowly: 10 steps took 3.5 minutes on 2 cores, test_layers 20x its time).
#   3. arm64: cross-built into build/aarch64 (Debian's aarch64-linux-gnu-gcc and the arm64
#      -dev packages, data/install_cross.sh), SUITES under qemu-aarch64-static, and one
#      epoch of models/mnist.cfg on make run's data whose test accuracy is within 0.5
#      points of the native build's. The emulated epoch takes some 20 minutes on 2 cores
#      (qemu runs float code 20-300 times slower); EPOCH=0 trains STEPS steps instead and
#      compares their last loss (within 1e-3 of the native's: the kernels' rounding
#      differs, OpenBLAS's armv8 products and gcc's NEON code against x86's).
# SUITES: the core suites that spawn no ./train and run in seconds natively (layers and
# their finite differences, GEMM, fp16, compression, optimizers, checkpoints, safetensors,
# the loader and image decoders, the budget's memory readings): each 10-25x slower under
# qemu. test_segments (70 s natively) and test_train (./train processes) stay native.
# The Makefile's ARCH_SUITES names them.
#   make test-arch [EPOCH=0]    (builds both, then runs this with SUITES)
set -u
cd "$(dirname "$0")/.." || exit 1
SUITES=${SUITES:?SUITES=the suites to run (make test-arch gives ARCH_SUITES)}
STEPS=${STEPS:-10}
AVX2_STEPS=${AVX2_STEPS:-3}
EPOCH=${EPOCH:-1}
ARM_TOLERANCE=1e-5
X86_CPU=Nehalem
AVX2_CPU=Haswell
ARM=build/aarch64
OUT=build/arch
rm -rf "$OUT"
mkdir -p "$OUT"
fails=0
check() {  # what status
    if [ "$2" = 0 ]; then echo "ok    $1"; else echo "FAIL  $1"; fails=$((fails + 1)); fi
}
suites() {  # tag dir runner... : every suite of SUITES (dir's) under the runner
    tag=$1 dir=$2
    shift 2
    for s in $SUITES; do
        "$@" "$dir/tests/test_$s" > "$OUT/$tag-test_$s.log" 2>&1
        check "test_$s under $*" $?
    done
}
# What a ./train log's " on cpu (...)" line says the CPU backend runs ("x86-64 loops, OpenBLAS
# Nehalem GEMM"), wherever the line is: under -cpu Haswell qemu first warns of the CPU's
# features that it does not emulate (pcid, x2apic, hle, rtm, ...).
cpu_of() { grep -m1 ' on cpu (' "$1" | sed 's/.* on cpu (\([^)]*\)).*/\1/'; }
val_acc() { grep '^epoch' "$1" | tail -n 1 | sed 's/.*val_acc \([0-9.]*\)%.*/\1/'; }

# name cpu kernels steps table: the x86-64 binaries under qemu-x86_64 -cpu CPU: SUITES pass,
# ./train chooses TABLE (its first line's start), and STEPS steps of mnist.cfg equal bit for
# bit the native run of the same kernels (CNN_CPU_KERNELS=KERNELS, OpenBLAS's CPU kernels).
emulated_x86() {
    name=$1 cpu=$2 kernels=$3 steps=$4 table=$5
    echo "== $name under qemu-x86_64 -cpu $cpu"
    emulator="qemu-x86_64-static -cpu $cpu"
    suites "$name" build $emulator
    $emulator ./train models/mnist.cfg epochs=1 stop_after="$steps" save="$OUT/$name-qemu" \
        > "$OUT/$name-qemu.log" 2>&1
    rc=$?
    check "./train under qemu: $(cpu_of "$OUT/$name-qemu.log")" $rc
    grep -q "on cpu ($table" "$OUT/$name-qemu.log"
    check "the table for this CPU chosen ($table)" $?
    CNN_CPU_KERNELS=$kernels OPENBLAS_CORETYPE=$cpu ./train models/mnist.cfg epochs=1 \
        stop_after="$steps" save="$OUT/$name-native" > "$OUT/$name-native.log" 2>&1
    ./ckpt diff "$OUT/$name-native/last.safetensors" "$OUT/$name-qemu/last.safetensors" \
        > "$OUT/$name-diff.log" 2>&1
    check "$steps steps under qemu equal the native run's (CNN_CPU_KERNELS=$kernels) bit for bit" $?
}
emulated_x86 x86-64 "$X86_CPU" portable "$STEPS" "x86-64 loops"
emulated_x86 avx2 "$AVX2_CPU" avx2 "$AVX2_STEPS" "AVX2 loops, OpenBLAS"

echo "== arm64 under qemu-aarch64-static"
ARM_RUN=qemu-aarch64-static
suites arm64 "$ARM" $ARM_RUN
if [ "$EPOCH" = 1 ]; then
    ./train models/mnist.cfg epochs=1 save="$OUT/native-epoch" > "$OUT/native-epoch.log" 2>&1
    $ARM_RUN "$ARM/train" models/mnist.cfg epochs=1 save="$OUT/arm-epoch" > "$OUT/arm-epoch.log" 2>&1
    rc=$?
    check "an epoch of mnist.cfg under qemu-aarch64 ($(cpu_of "$OUT/arm-epoch.log"))" $rc
    a=$(val_acc "$OUT/native-epoch.log") b=$(val_acc "$OUT/arm-epoch.log")
    awk -v a="$a" -v b="$b" 'BEGIN { d = a - b; exit !(a != "" && b != "" && (d < 0 ? -d : d) <= 0.5) }'
    check "test accuracy: arm64 $b% against native $a% (within 0.5 points)" $?
else
    ./train models/mnist.cfg epochs=1 stop_after=1 save="$OUT/native-steps" > /dev/null 2>&1
    $ARM_RUN "$ARM/train" models/mnist.cfg epochs=1 stop_after=1 save="$OUT/arm-steps" \
        > "$OUT/arm-steps.log" 2>&1
    check "a step of mnist.cfg under qemu-aarch64" $?
    ./ckpt diff "$OUT/native-steps/last.safetensors" "$OUT/arm-steps/last.safetensors" \
        > "$OUT/arm-diff.log" 2>&1
    awk -v t="$ARM_TOLERANCE" '/max abs/ { if ($4 + 0 > t) bad = 1 } END { exit bad }' "$OUT/arm-diff.log"
    rc=$?
    check "its weights within $ARM_TOLERANCE of the native run's (largest: $(awk '/max abs/ { if ($4 + 0 > m) m = $4 + 0 } END { print m + 0 }' "$OUT/arm-diff.log"))" $rc
fi
echo "test-arch: $fails failed (logs in $OUT)"
[ "$fails" = 0 ]
