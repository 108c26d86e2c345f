#!/usr/bin/python3
"""PyTorch reference benchmark for cnn.c.

Trains the seed network of cnn.c -- the network of PyTorch's classic
examples/mnist/main.py, but with fc1 = Linear(9216, 64), 609,354 parameters --
on Fashion-MNIST (or MNIST) on the CPU in fp32, with the same recipe:
F.nll_loss (mean), Adadelta(lr=1.0, rho=0.9, eps=1e-6), StepLR(step_size=1,
gamma=0.7) stepped once per epoch, inputs normalised as (x/255 - 0.1307)/0.3081,
shuffled training batches (seeded torch.Generator), drop_last=False.

Must run under Debian's /usr/bin/python3 (python3-torch); other interpreters on
PATH may lack torch.

Usage:
  bench/pytorch_ref.py [--data DIR] [--epochs N] [--batch B] [--threads T]
                       [--seed S] [--train-limit N] [--json]

Per epoch it prints
  pytorch epoch E: train_loss .. train_acc ..% test_loss .. test_acc ..% img/s ..
                   (N images in S s, T threads)
and with --json a final line
  {"impl":"pytorch","img_per_s":..,"test_acc":..,"test_loss":..,"epochs":..,
   "batch":..,"threads":..,"torch":"..","train_images":..}
(img_per_s of the last epoch, test_acc in percent).

What is timed: only each epoch's training loop (wall clock, time.perf_counter):
per batch the index gather from the pre-normalised tensor, zero_grad, forward,
loss, backward and optimizer step, plus the (tiny) bookkeeping of train
loss/accuracy. Reading, gunzipping and normalising the data is done once before
any timing and is NOT timed: data loading is not what we benchmark. No
DataLoader and no worker processes: with 2 cores, batches are slices of a
permuted index into one in-memory tensor, which is the fairest comparison with
a single-process C trainer. Evaluation on the test set is not timed either.
"""

import argparse
import gzip
import json
import os
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

DEFAULT_DATA = "/usr/share/datasets/fashion-mnist"
MEAN, STD = 0.1307, 0.3081
N_PARAMS = 609354

IDX_IMAGES_MAGIC = 2051  # 0x00000803: unsigned byte, 3 dimensions
IDX_LABELS_MAGIC = 2049  # 0x00000801: unsigned byte, 1 dimension


class Net(nn.Module):
    """examples/mnist/main.py's Net, with fc1 9216 -> 64 (cnn.c's seed network)."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        x = self.conv1(x)
        x = F.relu(x)
        x = self.conv2(x)
        x = F.relu(x)
        x = F.max_pool2d(x, 2)
        x = self.dropout1(x)
        x = torch.flatten(x, 1)
        x = self.fc1(x)
        x = F.relu(x)
        x = self.dropout2(x)
        x = self.fc2(x)
        return F.log_softmax(x, dim=1)


def read_idx_bytes(data_dir, name):
    """Return the raw bytes of data_dir/name, or of data_dir/name.gz, gunzipped."""
    plain = os.path.join(data_dir, name)
    gz = plain + ".gz"
    if os.path.isfile(plain):
        with open(plain, "rb") as f:
            return f.read()
    if os.path.isfile(gz):
        with gzip.open(gz, "rb") as f:
            return f.read()
    sys.exit(f"pytorch_ref: neither {plain} nor {gz} exists")


def load_idx(data_dir, name, magic, ndim):
    """Load one IDX file as a uint8 torch tensor, checking magic and size."""
    raw = read_idx_bytes(data_dir, name)
    header = 4 + 4 * ndim
    if len(raw) < header:
        sys.exit(f"pytorch_ref: {name}: file too short for an IDX header")
    got = int.from_bytes(raw[0:4], "big")
    if got != magic:
        sys.exit(f"pytorch_ref: {name}: bad magic {got:#010x}, expected {magic:#010x}")
    dims = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    count = int(np.prod(dims))
    if len(raw) != header + count:
        sys.exit(f"pytorch_ref: {name}: {len(raw) - header} data bytes, expected {count}")
    arr = np.frombuffer(raw, dtype=np.uint8, count=count, offset=header).reshape(dims)
    return torch.from_numpy(arr.copy())


def load_split(data_dir, prefix):
    images = load_idx(data_dir, f"{prefix}-images-idx3-ubyte", IDX_IMAGES_MAGIC, 3)
    labels = load_idx(data_dir, f"{prefix}-labels-idx1-ubyte", IDX_LABELS_MAGIC, 1)
    if images.shape[0] != labels.shape[0]:
        sys.exit(f"pytorch_ref: {prefix}: {images.shape[0]} images but {labels.shape[0]} labels")
    if tuple(images.shape[1:]) != (28, 28):
        sys.exit(f"pytorch_ref: {prefix}: images are {tuple(images.shape[1:])}, expected 28x28")
    return images, labels


def normalise(images_u8):
    """uint8 [N,28,28] -> float32 [N,1,28,28], (x/255 - mean)/std, done once."""
    x = images_u8.to(torch.float32).div_(255.0).sub_(MEAN).div_(STD)
    return x.unsqueeze(1).contiguous()


def train_epoch(model, optimizer, x, y, batch, gen):
    """One epoch over (x, y) in shuffled batches; returns (loss, acc%, seconds)."""
    model.train()
    n = x.shape[0]
    loss_sum = 0.0
    correct = 0
    t0 = time.perf_counter()
    perm = torch.randperm(n, generator=gen)
    for start in range(0, n, batch):  # drop_last=False: last batch may be short
        idx = perm[start:start + batch]
        data = x.index_select(0, idx)
        target = y.index_select(0, idx)
        optimizer.zero_grad()
        output = model(data)
        loss = F.nll_loss(output, target)
        loss.backward()
        optimizer.step()
        loss_sum += loss.item() * idx.numel()
        correct += (output.argmax(dim=1) == target).sum().item()
    seconds = time.perf_counter() - t0
    return loss_sum / n, 100.0 * correct / n, seconds


@torch.no_grad()
def evaluate(model, x, y, batch=1000):
    model.eval()
    n = x.shape[0]
    loss_sum = 0.0
    correct = 0
    for start in range(0, n, batch):
        data = x[start:start + batch]
        target = y[start:start + batch]
        output = model(data)
        loss_sum += F.nll_loss(output, target, reduction="sum").item()
        correct += (output.argmax(dim=1) == target).sum().item()
    return loss_sum / n, 100.0 * correct / n


def main():
    p = argparse.ArgumentParser(
        description="PyTorch (CPU, fp32) reference benchmark of cnn.c's seed network")
    p.add_argument("--data", default=DEFAULT_DATA,
                   help="folder with {train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz] "
                        f"(default {DEFAULT_DATA})")
    p.add_argument("--epochs", type=int, default=1, help="epochs (default 1)")
    p.add_argument("--batch", type=int, default=64, help="training batch size (default 64)")
    p.add_argument("--threads", type=int, default=2,
                   help="torch intra-op and inter-op threads (default 2)")
    p.add_argument("--seed", type=int, default=1, help="random seed (default 1)")
    p.add_argument("--train-limit", type=int, default=0, metavar="N",
                   help="use only the first N training images (default: all)")
    p.add_argument("--json", action="store_true",
                   help="print one JSON summary line at the end")
    args = p.parse_args()
    if args.epochs < 1 or args.batch < 1 or args.threads < 1 or args.train_limit < 0:
        p.error("--epochs, --batch and --threads must be >= 1, --train-limit >= 0")

    # Thread settings first: set_num_interop_threads must precede any parallel work.
    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(args.threads)
    torch.manual_seed(args.seed)  # weight init and dropout masks
    gen = torch.Generator().manual_seed(args.seed)  # training-batch shuffling

    # Data loading and normalisation: once, before and outside any timing.
    train_u8, train_y = load_split(args.data, "train")
    test_u8, test_y = load_split(args.data, "t10k")
    if args.train_limit:
        train_u8, train_y = train_u8[:args.train_limit], train_y[:args.train_limit]
    train_x, test_x = normalise(train_u8), normalise(test_u8)
    train_y, test_y = train_y.long(), test_y.long()
    del train_u8, test_u8

    model = Net()
    n_params = sum(t.numel() for t in model.parameters())
    assert n_params == N_PARAMS, f"model has {n_params} parameters, expected {N_PARAMS}"
    optimizer = torch.optim.Adadelta(model.parameters(), lr=1.0, rho=0.9, eps=1e-6)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.7)

    n_train = train_x.shape[0]
    img_per_s = test_loss = test_acc = None
    for epoch in range(1, args.epochs + 1):
        train_loss, train_acc, seconds = train_epoch(
            model, optimizer, train_x, train_y, args.batch, gen)
        scheduler.step()
        img_per_s = n_train / seconds
        test_loss, test_acc = evaluate(model, test_x, test_y)
        print(f"pytorch epoch {epoch}: train_loss {train_loss:.4f} train_acc {train_acc:.2f}% "
              f"test_loss {test_loss:.4f} test_acc {test_acc:.2f}% img/s {img_per_s:.1f} "
              f"({n_train} images in {seconds:.1f} s, {torch.get_num_threads()} threads)",
              flush=True)

    if args.json:
        print(json.dumps({
            "impl": "pytorch",
            "img_per_s": round(img_per_s, 2),
            "test_acc": round(test_acc, 2),
            "test_loss": round(test_loss, 4),
            "epochs": args.epochs,
            "batch": args.batch,
            "threads": args.threads,
            "torch": torch.__version__,
            "train_images": n_train,
        }, separators=(",", ":")), flush=True)


if __name__ == "__main__":
    main()
