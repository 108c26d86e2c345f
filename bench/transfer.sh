#!/bin/sh
# Transfer learning with init_skip and freeze (issue 16), measured: models/resnet-small.cfg
# pretrains on Fashion-MNIST's classes 0-4 (T-shirt, trouser, pullover, dress, coat; all
# 30,000 training images), then learns classes 5-9 (sandal, shirt, sneaker, bag, ankle
# boot) from 100 training images per class in two ways with the same recipe and steps:
#   fine-tuned   init = the pretrained weights, init_skip = fc (a fresh 5-class head),
#                freeze = conv1, bn1, layer1 (the stem and first stage stay as learned)
#   scratch      the same network from its fresh initialisation
# Both are evaluated on all 5,000 test images of classes 5-9, for SEEDS (each seed picks
# other 100 images per class and another initialisation and order).
#   PRE_EPOCHS=3 FT_EPOCHS=15 SEEDS="1 2 3" THREADS=2 sh bench/transfer.sh
# MODEL picks another network, with its head (HEAD, for init_skip), the layers FREEZE
# keeps, and ARGS for keys of every run; MobileNetV2 on the 28x28 images (one channel):
#   MODEL=mobilenet_v2 HEAD=classifier FREEZE=features.0,features.1,features.2,features.3 \
#   ARGS="width=28 height=28 channels=1 mean=0.2860 std=0.3530 flip=0 val_split=0" \
#   sh bench/transfer.sh
set -e
cd "$(dirname "$0")/.."
MODEL=${MODEL:-resnet-small}
HEAD=${HEAD:-fc}
FREEZE=${FREEZE:-conv1,bn1,layer1}
ARGS=${ARGS:-}
PRE_EPOCHS=${PRE_EPOCHS:-3}
FT_EPOCHS=${FT_EPOCHS:-15}
SEEDS=${SEEDS:-"1 2 3"}
THREADS=${THREADS:-2}
FASHION=/usr/share/datasets/fashion-mnist
OUT=bench/out/transfer-$MODEL
[ -f $FASHION/train-images-idx3-ubyte.gz ] || { echo "transfer.sh: needs Debian's dataset-fashion-mnist (make deps)" >&2; exit 1; }
rm -rf "$OUT"
mkdir -p "$OUT"
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), threads $THREADS; models/$MODEL.cfg"
subset() {  # split out classes [per-class seed]
    python3 bench/idx_subset.py $FASHION/$1-images-idx3-ubyte.gz $FASHION/$1-labels-idx1-ubyte.gz \
        "$OUT/$2" --classes "$3" --relabel ${4:+--per-class $4 --seed $5}
}
subset train pre-train 0,1,2,3,4
subset t10k pre-test 0,1,2,3,4
subset t10k new-test 5,6,7,8,9
data() {  # the [data] overrides for a subset pair
    echo "train=$OUT/$1-images-idx3-ubyte train_labels=$OUT/$1-labels-idx1-ubyte" \
         "test=$OUT/$2-images-idx3-ubyte test_labels=$OUT/$2-labels-idx1-ubyte"
}
./train models/$MODEL.cfg $(data pre-train pre-test) epochs="$PRE_EPOCHS" \
    threads="$THREADS" $ARGS save="$OUT/pretrained" > "$OUT/pretrained.log"
echo "pretrained on classes 0-4: $(grep '^epoch' "$OUT/pretrained.log" | tail -n 1 | sed 's/  [0-9]* img.*//')"
recipe="epochs=$FT_EPOCHS batch=32 threads=$THREADS"
for seed in $SEEDS; do
    subset train new-train-$seed 5,6,7,8,9 100 "$seed" > /dev/null
    ./train models/$MODEL.cfg $(data new-train-$seed new-test) $recipe $ARGS seed="$seed" \
        init="$OUT/pretrained/best.safetensors" init_skip="$HEAD" freeze="$FREEZE" \
        save="$OUT/finetuned-$seed" > "$OUT/finetuned-$seed.log"
    ./train models/$MODEL.cfg $(data new-train-$seed new-test) $recipe $ARGS seed="$seed" \
        save="$OUT/scratch-$seed" > "$OUT/scratch-$seed.log"
    for arm in finetuned scratch; do
        acc=$(./train --eval "$OUT/$arm-$seed/last.safetensors" | sed -n 's/.*  acc \([0-9.]*%\).*/\1/p')
        printf 'seed %s  %-10s test accuracy on classes 5-9 after %s epochs of 500 images: %s\n' \
            "$seed" "$arm" "$FT_EPOCHS" "$acc"
    done
done
