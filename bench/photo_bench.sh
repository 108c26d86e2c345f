#!/bin/sh
# The photo pipeline (issue 21): 600x600 JPEGs (data/photos, make photos) into batches of
# 64x64 and 224x224 RGB, the loader alone (no network), in ROUNDS alternating rounds:
#   stb      the path before libjpeg-turbo: stb_image at full size, the same resize and
#            normalisation, on WORKERS threads (loader_bench --stb)
#   cnn.c    the loader: libjpeg-turbo at a DCT scale, WORKERS worker threads
#   pytorch  torchvision ImageFolder + PIL (Image.draft) + DataLoader, WORKERS processes
# Each prints the best epoch after the first; then ./train models/folder.cfg on the raw
# JPEGs (no cache) for EPOCHS, and the share of the time it waited for data.
#   WORKERS=2 ROUNDS=2 EPOCHS=2 sh bench/photo_bench.sh
set -e
cd "$(dirname "$0")/.."
WORKERS=${WORKERS:-2}
ROUNDS=${ROUNDS:-2}
EPOCHS=${EPOCHS:-2}
make -s photos build/bench/loader_bench train
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores, workers $WORKERS; $(uptime | sed 's/.*load/load/')"
for r in $(seq "$ROUNDS"); do
    for size in 64 224; do
        keys="width=$size height=$size workers=$WORKERS val_split=0 crop_pad=0 flip=0"
        stb=$(build/bench/loader_bench models/folder.cfg $keys --stb --epochs 3 | tail -n 1)
        cnn=$(build/bench/loader_bench models/folder.cfg $keys --epochs 3 | tail -n 1)
        pt=$(/usr/bin/python3 bench/pytorch_loader.py data/photos --size "$size" --workers "$WORKERS" --epochs 3 | tail -n 1)
        echo "round $r, ${size}x$size:  stb $(echo "$stb" | grep -o '[0-9]* img/s')  cnn.c $(echo "$cnn" | grep -o '[0-9]* img/s')  pytorch $(echo "$pt" | grep -o '[0-9]* img/s')"
    done
done
echo "training models/folder.cfg on the raw JPEGs (64x64, workers $WORKERS, no cache):"
./train models/folder.cfg epochs="$EPOCHS" save=bench/out/photo_bench | grep '^epoch'
