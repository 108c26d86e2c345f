#!/bin/sh
# On the GPU machine (nvcc, cuBLAS and a C compiler; no Debian packages, no network):
# builds cnn.c against the packages that gpu/fetch_debs.sh downloaded (gpu/debs/, carried
# along), runs `make test-gpu` and the training runs of issue 17, and writes every log to
# OUT, with their result lines in OUT/summary.txt.
#   here:             make gpu-debs
#   on the GPU:       sh gpu/run.sh OUT          (the device tool: carry gpu/debs)
set -u
OUT=${1:?usage: sh gpu/run.sh OUTDIR}
mkdir -p "$OUT"
SUMMARY=$OUT/summary.txt
: > "$SUMMARY"
say() { echo "$*" | tee -a "$SUMMARY"; }

ls gpu/debs/*.deb > /dev/null 2>&1 || { say "gpu/run.sh: no gpu/debs/*.deb: run make gpu-debs first"; exit 1; }
P=/tmp/cnn-deps
rm -rf "$P"
mkdir -p "$P"
for f in gpu/debs/*.deb; do dpkg -x "$f" "$P" || { say "dpkg -x $f failed"; exit 1; }; done
# Absolute symlinks (libz.so -> /lib/x86_64-linux-gnu/...) point into the prefix instead.
find "$P" -type l | while read -r l; do
    t=$(readlink "$l")
    case $t in /*) ln -sfn "$P$t" "$l" ;; esac
done

nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1
say "GPU: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | head -1)"
say "nvcc: $(nvcc --version 2>&1 | tail -1)"
MAKE="make DEPS_PREFIX=$P MPI=0 CUDA=1"
if ! $MAKE -j"$(nproc)" train ckpt libcnn_cuda.so > "$OUT/build.log" 2>&1; then
    say "build failed: see build.log"
    tail -30 "$OUT/build.log"
    exit 1
fi
$MAKE test-gpu > "$OUT/test-gpu.log" 2>&1
say "make test-gpu: exit $? ($(grep -E '^\[  (PASSED|FAILED)  \] [0-9]+ test' "$OUT/test-gpu.log" | tr '\n' ' '))"

# Fashion-MNIST one epoch on each device and precision, same seed; resnet-small with the
# memory savers on the GPU. The plan and the GPU memory each run took are in its log.
F=$P/usr/share/datasets/fashion-mnist
DATA="train=$F/train-images-idx3-ubyte.gz train_labels=$F/train-labels-idx1-ubyte.gz"
DATA="$DATA test=$F/t10k-images-idx3-ubyte.gz test_labels=$F/t10k-labels-idx1-ubyte.gz"
run() {  # name cfg args...
    name=$1 cfg=$2
    shift 2
    ./train "$cfg" $DATA epochs=1 save="/tmp/runs/$name" "$@" > "$OUT/$name.log" 2>&1
    say "$name ($*): exit $? $(grep '^epoch 1/' "$OUT/$name.log")"
}
run fashion-cpu-fp32 models/fashion.cfg device=cpu
run fashion-cuda-fp32 models/fashion.cfg device=cuda
run fashion-cuda-fp16 models/fashion.cfg device=cuda precision=fp16
run resnet-small-cuda-plain models/resnet-small.cfg device=cuda
run resnet-small-cuda-fp16 models/resnet-small.cfg device=cuda precision=fp16
run resnet-small-cuda-sqrt models/resnet-small.cfg device=cuda checkpoint=sqrt
run resnet-small-cuda-sqrt-fp16 models/resnet-small.cfg device=cuda checkpoint=sqrt precision=fp16
