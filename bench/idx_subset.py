#!/usr/bin/env python3
"""Writes a subset of an IDX data set (MNIST's format, raw or gzip) as raw IDX files.

  idx_subset.py IMAGES LABELS OUT --classes 5,6,7,8,9 [--per-class N] [--seed S]
                [--relabel]

keeps the samples of the listed classes (all of them, or the first N of each class in
an order shuffled with --seed), in the file's order, and writes OUT-images-idx3-ubyte
and OUT-labels-idx1-ubyte. --relabel numbers the kept classes 0, 1, ... in the order
given (a 5-class set from Fashion-MNIST's classes 5-9). Standard library only.
"""

import argparse
import gzip
import random
import struct
import sys


def read_idx(path, magic):
    with open(path, "rb") as f:
        raw = f.read()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    if struct.unpack(">I", raw[:4])[0] != magic:
        sys.exit(f"idx_subset: {path}: not an IDX file with magic {magic:#010x}")
    ndim = magic & 0xFF
    dims = struct.unpack(f">{ndim}I", raw[4:4 + 4 * ndim])
    return dims, raw[4 + 4 * ndim:]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("images")
    p.add_argument("labels")
    p.add_argument("out", help="prefix of the two files written")
    p.add_argument("--classes", required=True, help="comma-separated class numbers")
    p.add_argument("--per-class", type=int, default=0, help="samples kept per class (0: all)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--relabel", action="store_true", help="number the kept classes 0, 1, ...")
    a = p.parse_args()
    classes = [int(c) for c in a.classes.split(",")]
    (count, rows, cols), pixels = read_idx(a.images, 0x803)
    (nlabels,), labels = read_idx(a.labels, 0x801)
    if nlabels != count:
        sys.exit(f"idx_subset: {a.images} has {count} images but {a.labels} {nlabels} labels")
    size = rows * cols
    keep = []
    for c in classes:
        idx = [i for i in range(count) if labels[i] == c]
        if a.per_class:
            if len(idx) < a.per_class:
                sys.exit(f"idx_subset: class {c} has {len(idx)} samples, fewer than {a.per_class}")
            random.Random(a.seed * 1000 + c).shuffle(idx)
            idx = idx[:a.per_class]
        keep += idx
    keep.sort()
    new_label = {c: (k if a.relabel else c) for k, c in enumerate(classes)}
    with open(a.out + "-images-idx3-ubyte", "wb") as f:
        f.write(struct.pack(">4I", 0x803, len(keep), rows, cols))
        for i in keep:
            f.write(pixels[i * size:(i + 1) * size])
    with open(a.out + "-labels-idx1-ubyte", "wb") as f:
        f.write(struct.pack(">2I", 0x801, len(keep)))
        f.write(bytes(new_label[labels[i]] for i in keep))
    print(f"{a.out}: {len(keep)} samples of classes {a.classes}"
          f"{' relabelled 0..%d' % (len(classes) - 1) if a.relabel else ''}")


if __name__ == "__main__":
    main()
