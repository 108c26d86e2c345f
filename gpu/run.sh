#!/bin/sh
# On the GPU machine (nvcc, cuBLAS and a C compiler; no Debian packages, no network):
# builds cnn.c against the packages that gpu/fetch_debs.sh downloaded (gpu/debs/, carried
# along), runs the stages below, and writes every log to OUT, with their result lines in
# OUT/summary.txt.
#   here:             make gpu-debs
#   on the GPU:       sh gpu/run.sh OUT [STAGE ...]     (the device tool: carry gpu/debs)
# Stages, all of them in this order by default (the build always comes first):
#   test     make test-gpu: every kernel, a training step and checkpoints against the CPU
#   sanitize compute-sanitizer over 3 steps (errors only a GPU shows): memcheck of fashion.cfg,
#            of resnet-small and of mobilenet_v2 in fp16 with checkpoint=sqrt, of resnet-small in
#            bf16 with 2-bit activations, int8 state and checkpoint=sqrt; racecheck of fashion.cfg
#   train    issue 17: a Fashion-MNIST epoch on the CPU in fp32 and on the GPU in fp32 and
#            fp16 (accuracy; the GPU's first-epoch loss against the CPU's), resnet-small on
#            the GPU plain, fp16, checkpoint=sqrt and both, bf16, 2-bit activations with int8
#            state, and all of these (the GPU memory against the plan)
#   resume   a checkpoint written on the GPU resumed on the CPU and the other way round,
#            each against the run that stayed on its device one step on (./ckpt diff)
#   memory   models/resnet18.cfg at 224x224: the plan with memory=15G (what fits a 16 GB
#            T4) at batch 64, 128 and 256
#   nets     issue 32's networks (grouped and depthwise convolutions, ReLU6, the general
#            block): mobilenet_v2, resnet34 and resnet50 at 224x224, batch 32, an epoch of
#            the photos each, fp32 and fp16 + checkpoint=sqrt: img/s, GPU memory against the plan
#   profile  models/resnet18.cfg, fp16, batch 64, and fashion.cfg at batch 64 and 512: time
#            per layer type (profile=1)
#   bench    bench/gpu_bench.sh: cnn.c against PyTorch on this GPU (issue 18), two rounds
#            without torch.compile or the largest-batch search (ROUNDS, COMPILE, MAXBATCH
#            from the environment override them)
# DRY=1 checks the script where there is no GPU: this machine's build and packages,
# device=cpu, a few steps a run (the numbers mean nothing). A run stopped by stop_after
# exits with 0, its checkpoint written.
set -u
OUT=${1:?usage: sh gpu/run.sh OUTDIR [test sanitize train resume memory nets profile bench]}
shift
STAGES=${*:-test sanitize train resume memory nets profile bench}
DRY=${DRY:-0}
mkdir -p "$OUT"
SUMMARY=$OUT/summary.txt
: > "$SUMMARY"
say() { echo "$*" | tee -a "$SUMMARY"; }
RUNS=/tmp/cnn-runs
rm -rf "$RUNS"
mkdir -p "$RUNS"

if [ "$DRY" = 1 ]; then
    P=
    GPU=cpu
    SHORT="stop_after=5"
    MAKE="make CUDA=0"
    say "DRY=1: device=cpu, $SHORT"
else
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
    GPU=cuda
    SHORT=
    MAKE="make DEPS_PREFIX=$P MPI=0 CUDA=1"
    nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1
    say "GPU: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | head -1)"
    say "nvcc: $(nvcc --version 2>&1 | tail -1)"
fi
export FASHION_MNIST=$P/usr/share/datasets/fashion-mnist
if ! $MAKE -j"$(nproc)" train ckpt build/bench/make_folders $([ "$DRY" = 1 ] || echo libcnn_cuda.so) \
        > "$OUT/build.log" 2>&1; then
    say "build failed: see build.log"
    tail -30 "$OUT/build.log"
    exit 1
fi
say "build: ok"

F=$FASHION_MNIST
DATA="train=$F/train-images-idx3-ubyte.gz train_labels=$F/train-labels-idx1-ubyte.gz"
DATA="$DATA test=$F/t10k-images-idx3-ubyte.gz test_labels=$F/t10k-labels-idx1-ubyte.gz"
# name cfg args...: one run, its epoch lines in the summary.
run() {
    name=$1 cfg=$2
    shift 2
    ./train "$cfg" $DATA save="$RUNS/$name" $SHORT "$@" > "$OUT/$name.log" 2>&1
    rc=$?
    say "$name ($*): exit $rc"
    grep -E '^(epoch [0-9]|memory =|stopped)' "$OUT/$name.log" | sed 's/^/    /' | tee -a "$SUMMARY"
}
# The train_loss of a run's first epoch line.
first_loss() { grep -m1 '^epoch 1/' "$OUT/$1.log" | sed 's/.*train_loss \([0-9.]*\).*/\1/'; }

# A folder of Fashion-MNIST PNGs for the networks of photos (224x224 RGB from 28x28 gray):
# 50 batches of 64 (10 in a dry run).
PHOTOS=$([ "$DRY" = 1 ] && echo 640 || echo 3200)
photos() {
    [ -d "$RUNS/png28" ] || build/bench/make_folders "$RUNS/png28" png28 $PHOTOS > /dev/null
    echo "train=$RUNS/png28 train_labels=none test=none test_labels=none val_split=0 width=224 \
height=224 channels=3 mean=0.5 std=0.25 flip=0 cache=$RUNS/cache224"
}

for stage in $STAGES; do
    say "== $stage"
    case $stage in
    test)
        if [ "$DRY" = 1 ]; then
            make -s test-gpu-replay > "$OUT/test-gpu.log" 2>&1
        else
            $MAKE test-gpu > "$OUT/test-gpu.log" 2>&1
        fi
        say "make test-gpu: exit $? ($(grep -E '^\[  (PASSED|FAILED)  \] [0-9]+ test' "$OUT/test-gpu.log" | tr '\n' ' '))"
        grep -E '^\[  FAILED  \] test_|^ERROR|plan .* MB, device' "$OUT/test-gpu.log" | sed 's/^/    /' | tee -a "$SUMMARY"
        ;;
    sanitize)
        if [ "$DRY" = 1 ] || ! command -v compute-sanitizer > /dev/null; then
            say "compute-sanitizer: not here (DRY=1, or not on PATH)"
        else
            # racecheck of resnet-small did not finish 2 steps in 175 s on an H100: fashion.cfg only.
            IMG=$(photos)
            for v in "memcheck fashion models/fashion.cfg" \
                     "memcheck resnet-small models/resnet-small.cfg precision=fp16 checkpoint=sqrt" \
                     "memcheck mobilenet_v2 models/mobilenet_v2.cfg batch=8 precision=fp16 checkpoint=sqrt" \
                     "memcheck resnet-small-packed models/resnet-small.cfg precision=bf16 compress=2 optimizer_state=int8 checkpoint=sqrt" \
                     "racecheck fashion models/fashion.cfg"; do
                set -- $v
                tool=$1 name=$2 cfg=$3
                shift 3
                data=$([ "$name" = mobilenet_v2 ] && echo "$IMG" || echo "$DATA")
                compute-sanitizer --tool $tool --error-exitcode 99 ./train "$cfg" $data device=cuda \
                    stop_after=3 save="$RUNS/san-$tool-$name" "$@" > "$OUT/sanitize-$tool-$name.log" 2>&1
                say "compute-sanitizer --tool $tool $name ($*): exit $? (0: clean; 99: errors)"
                grep -E '^========= (ERROR|Invalid|Race|.*errors)' "$OUT/sanitize-$tool-$name.log" | head -8 |
                    sed 's/^/    /' | tee -a "$SUMMARY"
            done
        fi
        ;;
    train)
        run fashion-cpu-fp32 models/fashion.cfg epochs=1 device=cpu
        run fashion-cpu-fp32-1thread models/fashion.cfg epochs=1 device=cpu threads=1
        run fashion-gpu-fp32 models/fashion.cfg epochs=1 device=$GPU
        run fashion-gpu-fp32-tf32 models/fashion.cfg epochs=1 device=$GPU matmul=tf32
        run fashion-gpu-fp16 models/fashion.cfg epochs=1 device=$GPU precision=fp16
        # Issue 17 asks for the GPU's first-epoch loss within 1e-3 of the CPU's. An epoch of
        # Adadelta at lr 1 carries each product's rounding forward: here the CPU with 2
        # threads and with 1 differed by 1.5e-3 (0.5496, 0.5481), the host replay of the
        # CUDA kernels by 1.7e-3. The CPU's own spread is printed beside the GPU's.
        c=$(first_loss fashion-cpu-fp32) c1=$(first_loss fashion-cpu-fp32-1thread)
        g=$(first_loss fashion-gpu-fp32)
        say "first-epoch train_loss: cpu $c, cpu 1 thread $c1, gpu fp32 $g"
        say "    |gpu - cpu| = $(awk -v a="$g" -v b="$c" 'BEGIN { d = a - b; print (d < 0 ? -d : d) }')," \
            "|cpu 1 thread - cpu| = $(awk -v a="$c1" -v b="$c" 'BEGIN { d = a - b; print (d < 0 ? -d : d) }') (issue 17: <= 1e-3)"
        for v in "plain" "fp16 precision=fp16" "sqrt checkpoint=sqrt" "sqrt-fp16 checkpoint=sqrt precision=fp16" \
                 "bf16 precision=bf16" "compress2-int8 compress=2 optimizer_state=int8" \
                 "all checkpoint=sqrt precision=bf16 compress=2 optimizer_state=int8"; do
            set -- $v
            name=$1
            shift
            run "resnet-small-$name" models/resnet-small.cfg epochs=1 device=$GPU "$@"
        done
        ;;
    resume)
        # Both start from one checkpoint written at step 300 on each device; each goes on
        # one step on its own device and on the other: the two differ by one step's rounding
        # (a resume that lost state would differ by a whole update). Steps further on, the
        # difference grows past anything checkable: 300 steps of Adadelta at lr 1 took it to
        # 0.08 of a weight (an H100 against the CPU, either way round).
        for dev in cpu $GPU; do
            ./train models/fashion.cfg $DATA device=$dev epochs=1 stop_after=300 \
                save="$RUNS/start-$dev" > "$OUT/resume-start-$dev.log" 2>&1
            for to in cpu $GPU; do
                ./train resume="$RUNS/start-$dev/last.safetensors" device=$to stop_after=301 \
                    save="$RUNS/from-$dev-on-$to" > "$OUT/resume-$dev-on-$to.log" 2>&1
                say "resume: written on $dev at step 300, on $to to 301: exit $?"
            done
        done
        for dev in cpu $GPU; do
            other=$([ $dev = cpu ] && echo $GPU || echo cpu)
            ./ckpt diff "$RUNS/from-$dev-on-$dev/last.safetensors" \
                "$RUNS/from-$dev-on-$other/last.safetensors" > "$OUT/resume-diff-$dev.log" 2>&1
            say "ckpt diff, written on $dev: stayed against moved to $other (exit $?):"
            grep -v identical "$OUT/resume-diff-$dev.log" | head -20 | sed 's/^/    /' | tee -a "$SUMMARY"
        done
        ;;
    memory)
        IMG=$(photos)
        for b in 64 128 256; do
            for v in "fp32" "fp16 precision=fp16" "fp16-sqrt precision=fp16 checkpoint=sqrt"; do
                set -- $v
                name=$1
                shift
                ./train models/resnet18.cfg $IMG device=$GPU batch=$b memory=15G auto_fp16=1 "$@" \
                    --plan > "$OUT/plan-resnet18-$b-$name.log" 2>&1
                say "resnet18 batch $b $name memory=15G: exit $? $(grep -E '^memory =' "$OUT/plan-resnet18-$b-$name.log")"
                grep -E 'total on the GPU|GPU baseline|^  total|available' "$OUT/plan-resnet18-$b-$name.log" | sed 's/^/    /' | tee -a "$SUMMARY"
            done
        done
        ;;
    nets)
        IMG=$(photos)
        for net in mobilenet_v2 resnet34 resnet50; do
            for v in "fp32" "fp16-sqrt precision=fp16 checkpoint=sqrt"; do
                set -- $v
                name=$net-$1
                shift
                ./train models/$net.cfg $IMG device=$GPU batch=32 epochs=1 $SHORT save="$RUNS/$name" "$@" \
                    > "$OUT/$name.log" 2>&1
                say "$name: exit $?"
                grep -E '^(memory =|stopped|epoch [0-9])' "$OUT/$name.log" | sed 's/^/    /' | tee -a "$SUMMARY"
            done
        done
        ;;
    profile)
        IMG=$(photos)
        ./train models/resnet18.cfg $IMG device=$GPU batch=64 precision=fp16 epochs=1 \
            stop_after=$([ "$DRY" = 1 ] && echo 3 || echo 40) profile=1 save="$RUNS/profile" > "$OUT/profile-resnet18.log" 2>&1
        say "resnet18 fp16 batch 64 profile: exit $?"
        sed -n '/^stopped\|^epoch/,$p' "$OUT/profile-resnet18.log" | head -60 | sed 's/^/    /' | tee -a "$SUMMARY"
        # The H200 run's open question: fashion.cfg's img/s at batch 512 no higher than at 64.
        for b in 64 512; do
            ./train models/fashion.cfg $DATA device=$GPU batch=$b epochs=1 profile=1 \
                save="$RUNS/profile-fashion-$b" > "$OUT/profile-fashion-$b.log" 2>&1
            say "fashion.cfg batch $b profile: exit $?"
            sed -n '/^epoch/,$p' "$OUT/profile-fashion-$b.log" | head -40 | sed 's/^/    /' | tee -a "$SUMMARY"
        done
        ;;
    bench)
        if [ -f bench/gpu_bench.sh ]; then
            # Two rounds without torch.compile or the largest-batch search: what fits one call
            # of a borrowed GPU (the script's defaults took over 6 minutes for their first round).
            ROUNDS=${ROUNDS:-2} COMPILE=${COMPILE:-none} MAXBATCH=${MAXBATCH:-0} \
                sh bench/gpu_bench.sh "$OUT/bench" > "$OUT/bench.log" 2>&1
            say "bench/gpu_bench.sh: exit $?"
            tail -40 "$OUT/bench.log" | sed 's/^/    /' | tee -a "$SUMMARY"
        else
            say "bench/gpu_bench.sh: not here"
        fi
        ;;
    *)
        say "unknown stage $stage (test sanitize train resume memory nets profile bench)"
        ;;
    esac
done
