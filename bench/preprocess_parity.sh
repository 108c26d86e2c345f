#!/bin/sh
# bench/preprocess_parity.sh: cnn.c's evaluation preprocessing against torchvision's
# (issue 33): resize = shorter, short_side = 256, center_crop = 224 against
# transforms.Resize(256) + transforms.CenterCrop(224) on PIL images (torchvision's
# ImageNet recipe, ResNet-18's weights.transforms()).
#
#   sh bench/preprocess_parity.sh          COUNT = 50 photos of each size (about a minute)
#
# For photo sizes 500x375, 640x480 and 1024x768: COUNT JPEGs (quality 90) written by
# build/bench/make_folders into bench/out/parity_jpgWxH (once), the reference bytes of each
# by tests/preprocess_reference.py (/usr/bin/python3 with torchvision and PIL), then the
# largest and mean absolute byte difference over every image (bench/preprocess_parity.c):
#   jpeg  the JPEG as cnn.c reads it, decoded by libjpeg-turbo at the smallest DCT scale
#         that still covers the 341 x 256 resized image (PIL decodes it at full size);
#   png   the same JPEG decoded at full size by PIL and stored as PNG: the resize and the
#         crop alone, the two decodes being the same.
set -e
cd "$(dirname "$0")/.."
OUT=bench/out
COUNT=${COUNT:-50}
PY=/usr/bin/python3
make -s build/bench/make_folders build/bench/preprocess_parity
mkdir -p $OUT
$PY -c 'import torchvision, PIL' 2> /dev/null ||
    { echo "preprocess_parity: needs python3-torchvision and python3-pil for $PY" >&2; exit 1; }
for size in 500x375 640x480 1024x768; do
    dir=$OUT/parity_jpg$size
    build/bench/make_folders $dir jpg$size "$COUNT" > /dev/null
    jpgs=$(find $dir -name '*.jpg' | sort)
    $PY tests/preprocess_reference.py png $jpgs
    $PY tests/preprocess_reference.py resize 256 224 $jpgs $(for f in $jpgs; do echo "$f.png"; done)
    echo "$size jpeg: $(build/bench/preprocess_parity 256 224 $jpgs)"
    echo "$size png:  $(build/bench/preprocess_parity 256 224 $(for f in $jpgs; do echo "$f.png"; done))"
done
echo "($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), $(nproc) cores;" \
     "$($PY -c 'import torchvision, PIL; print("torchvision", torchvision.__version__, "PIL", PIL.__version__)'))"
