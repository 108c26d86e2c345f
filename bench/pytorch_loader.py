#!/usr/bin/python3
"""PyTorch's data pipeline on an image folder, for bench/photo_bench.sh: torchvision's
ImageFolder read by PIL (Debian's python3-pil), with Image.draft so that PIL's JPEG decoder
also decodes at a DCT scale, Resize((H, W), antialias), ToTensor, Normalize, through a
DataLoader of `--workers` worker processes, shuffled, batches of `--batch`. Prints
images/s per epoch and the best after the first, as bench/loader_bench.c does.

  pytorch_loader.py FOLDER --size 64 [--workers 2] [--batch 64] [--epochs 3] [--threads 1]
"""

import argparse
import time

import torch
import torchvision
from PIL import Image
from torchvision import transforms


def load(path, size):
    im = Image.open(path)
    im.draft("RGB", (size, size))  # JPEG: decode at the smallest DCT scale that covers size
    return im.convert("RGB")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("folder")
    p.add_argument("--size", type=int, default=64)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    tf = transforms.Compose([transforms.Resize((a.size, a.size), antialias=True), transforms.ToTensor(),
                             transforms.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))])
    ds = torchvision.datasets.ImageFolder(a.folder, transform=tf, loader=lambda f: load(f, a.size))
    dl = torch.utils.data.DataLoader(ds, batch_size=a.batch, shuffle=True, num_workers=a.workers,
                                     persistent_workers=a.workers > 0)
    best = 0
    for e in range(a.epochs):
        t0, n = time.perf_counter(), 0
        for x, _ in dl:
            n += x.shape[0]
        secs = time.perf_counter() - t0
        print(f"pytorch epoch {e + 1}: {n} images in {secs:.2f} s = {n / secs:.0f} img/s", flush=True)
        if e > 0:
            best = max(best, n / secs)
    print(f"best epoch after the first: {best:.0f} img/s (PyTorch DataLoader + PIL)")


if __name__ == "__main__":
    main()
