#!/bin/sh
# bench/data_bench.sh: the data pipeline's benchmark (issue 3).
#
#   sh bench/data_bench.sh            everything below (about 10 minutes on 2 cores)
#   STEPS=50 sh bench/data_bench.sh   shorter trainer runs for the memory measurement
#
# 1. Writes image folders from Fashion-MNIST into bench/out/ (once; bench/make_folders.c):
#    png28_t10k (Fashion-MNIST's 10,000 test images: the same images as its t10k IDX files),
#    png28_100k (28x28 gray PNG, all files distinct) and jpg600_10k,
#    jpg600_100k (600x600 RGB JPEG, upscaled and coloured; the 100k folder holds 10,000
#    distinct files, each under ten names by hard links: 100,000 distinct 85 KB JPEGs
#    would take 8.5 GB and an hour to write, and decoding costs the same either way).
# 2. The loader alone (bench/loader_bench.c, no training): images/s for workers = 0, 1, 2
#    and from the cache, against the IDX loader on Fashion-MNIST.
# 3. The trainer (./train models/folder.cfg, 64x64 RGB, batch 64): peak RSS (VmHWM) on
#    jpg600_10k and jpg600_100k, each stopped after STEPS batches (default 150).
# 4. The trainer on png28_t10k at 28x28: images/s and the time it waited for data, for
#    workers = 0, 1, 2 and with the cache, against IDX files of the same images; the
#    trainer's epoch line shows the time it waited for data (loader_stats).
#    (bench/loader_bench.c --compute-ms X simulates a trainer of X ms a batch, for the
#    loader alone.)
#
# Timings depend on what else runs on the machine: the script prints the load average.
set -e
cd "$(dirname "$0")/.."
OUT=bench/out
BIN=build/bench
STEPS=${STEPS:-150}
FM=/usr/share/datasets/fashion-mnist

echo "== building (through the Makefile: the tools link build/libcnn.a)"
make -s train $BIN/make_folders $BIN/loader_bench

echo "== image folders (bench/out; delete one to write it again)"
$BIN/make_folders $OUT/png28_t10k png28 10000 60000
$BIN/make_folders $OUT/png28_100k png28 100000
$BIN/make_folders $OUT/jpg600_10k jpg600 10000
$BIN/make_folders $OUT/jpg600_100k jpg600 100000 10000 $OUT/jpg600_10k
df -h $OUT | tail -1
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores"

# The same 10,000 images as a folder of PNGs and as IDX; 9,000 train, 1,000 validate.
P28="train=$OUT/png28_t10k width=28 height=28 channels=1 mean=0.286 std=0.353"
IDX="train=$FM/t10k-images-idx3-ubyte.gz train_labels=$FM/t10k-labels-idx1-ubyte.gz \
width=28 height=28 channels=1 mean=0.286 std=0.353"
CACHE=$OUT/cache
rm -rf $CACHE

echo "== the loader alone: the best epoch after the first (folder.cfg's flip and crop_pad on)"
for w in 0 1 2; do
    printf "png28 folder, workers=%s:  " $w
    $BIN/loader_bench models/folder.cfg $P28 workers=$w --epochs 4 | tail -1
done
for w in 0 2; do
    printf "png28 folder + cache, workers=%s:  " $w
    $BIN/loader_bench models/folder.cfg $P28 workers=$w cache=$CACHE --epochs 8 | tail -1
done
for w in 0 2; do
    printf "IDX, the same images, workers=%s:  " $w
    $BIN/loader_bench models/folder.cfg $IDX workers=$w --epochs 8 | tail -1
done
for w in 0 1 2; do
    printf "jpg600 -> 64x64x3, workers=%s (40 batches):  " $w
    $BIN/loader_bench models/folder.cfg train=$OUT/jpg600_10k workers=$w --epochs 1 \
        --max-batches 40 | tail -1
done

# Runs ./train with the given overrides for STEPS batches (stop_after) and prints its peak
# RSS (GNU time's maximum resident set size).
peak_rss() {
    /usr/bin/time -f %M -o $OUT/rss.txt ./train models/folder.cfg epochs=1 stop_after=$STEPS \
        save=$OUT/runs "$@" > $OUT/train.log 2>&1 || true
    echo "peak RSS $(($(tail -1 $OUT/rss.txt) / 1024)) MB after $STEPS batches" \
         "($(grep -o 'cnn.c: .* images' $OUT/train.log | sed 's/.*, //'); memory plan" \
         "$(awk '/^  total/ {print $2}' $OUT/train.log) MB)"
}

echo "== the trainer: peak RSS, 600x600 JPEG -> 64x64 RGB, batch 64, workers 2, $STEPS batches"
printf "jpg600_10k:   "
peak_rss train=$OUT/jpg600_10k
printf "jpg600_100k:  "
peak_rss train=$OUT/jpg600_100k
echo "== the same at 28x28 gray PNG"
printf "png28_t10k:   "
peak_rss $P28
printf "png28_100k:   "
peak_rss $P28 train=$OUT/png28_100k

echo "== the trainer on png28_t10k at 28x28: one epoch each"
for w in 0 1 2; do
    printf "workers=%s:  " $w
    ./train models/folder.cfg epochs=1 save=$OUT/runs $P28 workers=$w | grep '^epoch'
done
printf "workers=2, cache:  "
./train models/folder.cfg epochs=2 save=$OUT/runs $P28 workers=2 cache=$CACHE | grep '^epoch' |
    tail -1
printf "IDX, workers=2:  "
./train models/folder.cfg epochs=1 save=$OUT/runs $IDX workers=2 | grep '^epoch'
