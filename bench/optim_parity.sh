#!/bin/sh
# Optimizer and schedule parity with PyTorch (issues 16 and 33): a smooth network trains 20 steps
# from the same initial weights on the same batches in cnn.c and in PyTorch
# (bench/pytorch_cfg.py, in float32 and in float64), with sgd (momentum 0.9, nesterov,
# weight_decay 5e-4), adamw (its defaults, weight_decay 0.01) and sgd again with label
# smoothing 0.1 and gradient clipping to norm 0.5 (sgdlc), and with crop_pad = 2 and flip
# (sgdaug: the loader's augmentation, which pytorch_cfg.py replays), each under a cosine schedule
# after 5 warmup steps; then the schedules that span epochs, over 5 epochs of 4 batches
# (256 training images): OneCycleLR with sgd (its momentum cycled: sgd1c) and
# with adamw (beta1 cycled: adamw1c), and ReduceLROnPlateau (factor 0.5, patience 0) with
# sgd (sgdpl) on a validation set that grows worse as the network learns (the same
# images, each labelled as the next digit), so that the lr halves after every epoch but
# the first. After 10 and 20 steps it prints, per optimizer, the
# largest relative difference of any parameter tensor, element-wise (max |a - b| / max |b|,
# b the PyTorch tensor) and in norm (|a - b| / |b|): cnn.c against PyTorch float32, cnn.c
# against float64, and PyTorch float32 against float64, the floor that rounding alone
# sets. (AdamW divides each gradient by its own running size, so an element whose
# gradient is near zero moves by up to lr in a direction its rounding decides: its
# element-wise floor is far above sgd's.)
# The network is models/mnist.cfg's layers without ReLU, max pooling and dropout (average
# pooling instead): at a ReLU or a max, two float implementations' gradients jump apart
# whenever an input sits within rounding of the kink, and dropout masks come from
# different generators; a smooth network shows the optimizers' arithmetic alone.
#   THREADS=2 sh bench/optim_parity.sh        (needs make data and python3-torch)
set -e
cd "$(dirname "$0")/.."
THREADS=${THREADS:-2}
OUT=bench/out/optim_parity
rm -rf "$OUT"
mkdir -p "$OUT"
cat > "$OUT/parity.cfg" <<EOF
[train]
epochs = 1
batch = 64
seed = 1
[data]
train = data/mnist/train-images-idx3-ubyte
train_labels = data/mnist/train-labels-idx1-ubyte
mean = 0.1307
std = 0.3081
[conv]
name = conv1
filters = 32
size = 3
[conv]
name = conv2
filters = 64
size = 3
[avgpool]
size = 2
[flatten]
[linear]
name = fc1
outputs = 64
[linear]
name = fc2
outputs = 10
[log_softmax]
EOF
run() {  # name overrides...
    name=$1
    shift
    /usr/bin/python3 bench/pytorch_cfg.py "$OUT/parity.cfg" "$@" --threads "$THREADS" \
        --init-out "$OUT/init.safetensors" --steps 1 > /dev/null
    for steps in 10 20; do
        /usr/bin/python3 bench/pytorch_cfg.py "$OUT/parity.cfg" "$@" --threads "$THREADS" \
            --steps $steps --save "$OUT/$name-pt32-$steps.safetensors" > /dev/null
        /usr/bin/python3 bench/pytorch_cfg.py "$OUT/parity.cfg" "$@" --threads "$THREADS" \
            --steps $steps --double --save "$OUT/$name-pt64-$steps.safetensors" > /dev/null
        ./train "$OUT/parity.cfg" "$@" threads="$THREADS" init="$OUT/init.safetensors" \
            stop_after=$steps save="$OUT/$name-cnn-$steps" > "$OUT/$name-cnn-$steps.log"
    done
    /usr/bin/python3 - "$OUT" "$name" <<'EOF'
import os, sys
sys.path.insert(0, "bench")
import st_torch
out, name = sys.argv[1], sys.argv[2]
def read(path):
    return {k: v.double() for k, v in st_torch.read(path)[0].items() if not k.startswith("optimizer.")}
def rel(a, b):  # over tensors, the largest max |a - b| / max |b| and |a - b| / |b| (2-norms)
    return (max(((a[k] - b[k]).abs().max() / b[k].abs().max()).item() for k in b),
            max(((a[k] - b[k]).norm() / b[k].norm()).item() for k in b))
for steps in (10, 20):
    cnn = read(f"{out}/{name}-cnn-{steps}/last.safetensors")
    pt32 = read(f"{out}/{name}-pt32-{steps}.safetensors")
    pt64 = read(f"{out}/{name}-pt64-{steps}.safetensors")
    pairs = [("cnn.c vs PyTorch f32", rel(cnn, pt32)), ("cnn.c vs PyTorch f64", rel(cnn, pt64)),
             ("PyTorch f32 vs f64", rel(pt32, pt64))]
    print(f"{name:5s} after {steps} steps, max-element (norm):  " +
          "   ".join(f"{what} {m:.2e} ({n:.1e})" for what, (m, n) in pairs))
EOF
}
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), threads $THREADS"
run sgd optimizer=sgd lr=0.01 momentum=0.9 nesterov=1 weight_decay=5e-4 schedule=cosine warmup=5
run adamw optimizer=adamw schedule=cosine warmup=5
# Label smoothing and gradient clipping (issue 33), under the same sgd and schedule.
run sgdlc optimizer=sgd lr=0.01 momentum=0.9 nesterov=1 weight_decay=5e-4 schedule=cosine \
    warmup=5 label_smoothing=0.1 clip_grad_norm=0.5
# Augmentation (issue 34): crop_pad's windows and flips replayed in PyTorch from the same
# counter-based RNG, under the same sgd and schedule: the same images, so the same floor.
run sgdaug optimizer=sgd lr=0.01 momentum=0.9 nesterov=1 weight_decay=5e-4 schedule=cosine \
    warmup=5 crop_pad=2 flip=1
# OneCycleLR and ReduceLROnPlateau (issue 33): 5 epochs of 4 batches on 256 images spread over
# the set, tested on the same images labelled as the next digit (its loss rises as the net
# learns).
/usr/bin/python3 - data/mnist/train-images-idx3-ubyte data/mnist/train-labels-idx1-ubyte "$OUT" <<'EOF'
import sys
images, labels, out = sys.argv[1:]
n = 256
with open(images, "rb") as f:
    im = f.read()
with open(labels, "rb") as f:
    lb = f.read()
every = int.from_bytes(lb[4:8], "big") // n  # evenly spread: the files go class by class
keep = [i * every for i in range(n)]
count = n.to_bytes(4, "big")
with open(f"{out}/small-images", "wb") as f:
    f.write(im[:4] + count + im[8:16] + b"".join(im[16 + i * 784:16 + (i + 1) * 784] for i in keep))
with open(f"{out}/small-labels", "wb") as f:
    f.write(lb[:4] + count + bytes(lb[8 + i] for i in keep))
with open(f"{out}/shifted-labels", "wb") as f:
    f.write(lb[:4] + count + bytes((lb[8 + i] + 1) % 10 for i in keep))
EOF
small="epochs=5 train=$OUT/small-images train_labels=$OUT/small-labels test=$OUT/small-images \
    test_labels=$OUT/shifted-labels"
run sgd1c optimizer=sgd lr=0.01 momentum=0.9 nesterov=1 weight_decay=5e-4 schedule=onecycle $small
run adamw1c optimizer=adamw schedule=onecycle $small
run sgdpl optimizer=sgd lr=0.01 momentum=0.9 nesterov=1 weight_decay=5e-4 schedule=plateau \
    plateau_factor=0.5 plateau_patience=0 $small
grep -h "^plateau:" "$OUT"/sgdpl-cnn-20.log
