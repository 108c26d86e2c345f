#!/usr/bin/python3
"""Loads a cnn.c checkpoint into PyTorch and evaluates it there.

The proof that cnn.c's checkpoints are PyTorch state_dicts: the model tensors of a
checkpoint (every key but "optimizer.*") go into the seed network -- PyTorch's
examples/mnist Net with fc1 = Linear(9216, 64): conv1 Conv2d(1, 32, 3), conv2
Conv2d(32, 64, 3), fc1 Linear(9216, 64), fc2 Linear(64, 10) -- with
load_state_dict(strict=True), and the network is evaluated on a test set of IDX files
(raw or gzip). The loss and accuracy it prints should match cnn.c's own evaluation of
the same checkpoint (to 0.1 points of accuracy; the loss to about 1e-5).

The file is read by bench/st_torch.py (torch alone): Debian's python3-torch comes
without the `safetensors` package. Run it with /usr/bin/python3 (other interpreters on
PATH may lack torch). Without torch it prints "skipped" and exits 0.

Usage:
  bench/torch_check.py CHECKPOINT [--images F] [--labels F] [--mean M] [--std S]
                       [--batch B] [--threads T] [--expect-acc PCT] [--tolerance P]
                       [--dump N FILE] [--json]

The test set defaults to the [data] test/test_labels/mean/std of the cfg stored in the
checkpoint, where they are set and the files exist, else Fashion-MNIST's t10k files
from /usr/share/datasets/fashion-mnist and mean 0.1307, std 0.3081.

Prints
  pytorch: test_loss L test_acc A% (C/N)
and with --json a final line {"impl":"pytorch","test_loss":..,"test_acc":..,...}.
--expect-acc PCT exits 1 if the accuracy differs from PCT by more than --tolerance
(0.1 points). --dump N FILE writes the log-probabilities of the first N test images,
one image per line, for an element-wise comparison with cnn.c's output.
Exit status: 0 ok (or skipped), 1 accuracy outside the tolerance, 2 an error.
"""

import argparse
import gzip
import json
import os
import sys

try:
    import torch
    import torch.nn.functional as F
except ImportError:
    print("torch_check: skipped: PyTorch is not installed (Debian: apt-get install "
          "python3-torch, then run with /usr/bin/python3)")
    sys.exit(0)

import st_torch  # noqa: E402

FASHION = "/usr/share/datasets/fashion-mnist"
DEFAULT_IMAGES = os.path.join(FASHION, "t10k-images-idx3-ubyte.gz")
DEFAULT_LABELS = os.path.join(FASHION, "t10k-labels-idx1-ubyte.gz")
MEAN, STD = 0.1307, 0.3081
OPTIMIZER_PREFIX = "optimizer."

from pytorch_ref import Net  # the seed network, as the benchmark trains it


def fail(msg):
    print(f"torch_check: {msg}", file=sys.stderr)
    sys.exit(2)


def read_safetensors(path):
    """Returns ({name: tensor}, {metadata}) of a safetensors file, or exits with a message."""
    try:
        return st_torch.read(path)
    except OSError as e:
        fail(f"{path}: {e.strerror}")
    except st_torch.FormatError as e:
        fail(str(e))


def cfg_data(cfg_text):
    """The [data] section of a cfg text as a dict (comments stripped), or {}."""
    section, out = None, {}
    for line in (cfg_text or "").splitlines():
        line = line.split("#", 1)[0].strip()
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1].strip()
        elif "=" in line and section == "data":
            k, v = line.split("=", 1)
            out[k.strip()] = v.strip()
    return out


def read_idx(path, magic, ndim):
    """An IDX file (raw or gzip) as a uint8 tensor of its dimensions."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
    except OSError as e:
        fail(f"{path}: {e.strerror or e}")
    header = 4 + 4 * ndim
    if len(raw) < header or int.from_bytes(raw[:4], "big") != magic:
        fail(f"{path}: not an IDX file with magic {magic:#010x}")
    dims = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    count = 1
    for d in dims:
        count *= d
    if len(raw) != header + count:
        fail(f"{path}: {len(raw) - header} data bytes, expected {count}")
    return torch.frombuffer(bytearray(raw[header:]), dtype=torch.uint8).reshape(dims)


def main():
    p = argparse.ArgumentParser(
        description="Evaluate a cnn.c checkpoint in PyTorch (the seed network, CPU, fp32)")
    p.add_argument("checkpoint", help="a .safetensors checkpoint written by ./train")
    p.add_argument("--images", help="test images, IDX (default: the checkpoint's cfg, "
                                    "else Fashion-MNIST t10k)")
    p.add_argument("--labels", help="test labels, IDX")
    p.add_argument("--mean", type=float, help=f"normalisation mean (default: cfg, else {MEAN})")
    p.add_argument("--std", type=float, help=f"normalisation std (default: cfg, else {STD})")
    p.add_argument("--batch", type=int, default=1000, help="evaluation batch (default 1000)")
    p.add_argument("--threads", type=int, default=0, help="torch threads (default: all cores)")
    p.add_argument("--expect-acc", type=float, metavar="PCT",
                   help="exit 1 unless the accuracy is within --tolerance of PCT")
    p.add_argument("--tolerance", type=float, default=0.1, help="points (default 0.1)")
    p.add_argument("--dump", nargs=2, metavar=("N", "FILE"),
                   help="write the log-probabilities of the first N images to FILE")
    p.add_argument("--json", action="store_true", help="print a JSON summary line")
    args = p.parse_args()
    if args.batch < 1 or args.threads < 0:
        p.error("--batch must be >= 1 and --threads >= 0")
    torch.set_num_threads(args.threads or os.cpu_count() or 1)

    tensors, meta = read_safetensors(args.checkpoint)
    fmt = meta.get("format")
    if fmt is None:
        print(f"torch_check: note: {args.checkpoint} has no \"format\" metadata: not written "
              "by cnn.c; trying it as a state_dict anyway")
    model_sd = {k: v for k, v in tensors.items() if not k.startswith(OPTIMIZER_PREFIX)}
    dropped = len(tensors) - len(model_sd)

    model = Net()
    try:
        model.load_state_dict(model_sd, strict=True)
    except RuntimeError as e:
        fail(f"{args.checkpoint} does not load into the seed network: {e}")
    nparams = sum(v.numel() for v in model_sd.values())
    print(f"torch_check: {args.checkpoint} ({fmt or 'no format'}, epoch {meta.get('epoch', '?')}, "
          f"step {meta.get('step', '?')}): {len(model_sd)} model tensors, {nparams} parameters, "
          f"loaded with load_state_dict(strict=True); {dropped} optimizer tensors dropped")

    # The test set: the command line, else the stored cfg's [data], else Fashion-MNIST.
    data = cfg_data(meta.get("cfg"))
    images, labels = args.images, args.labels
    if images is None and labels is None and os.path.isfile(data.get("test", "")) and \
            os.path.isfile(data.get("test_labels", "")):
        images, labels = data["test"], data["test_labels"]
    images, labels = images or DEFAULT_IMAGES, labels or DEFAULT_LABELS

    def cfg_float(key, default):
        try:
            return float(data[key])
        except (KeyError, ValueError):
            return default
    mean = args.mean if args.mean is not None else cfg_float("mean", MEAN)
    std = args.std if args.std is not None else cfg_float("std", STD)

    x_u8 = read_idx(images, 0x00000803, 3)
    y = read_idx(labels, 0x00000801, 1).long()
    if x_u8.shape[0] != y.shape[0]:
        fail(f"{images} holds {x_u8.shape[0]} images but {labels} {y.shape[0]} labels")
    if tuple(x_u8.shape[1:]) != (28, 28):
        fail(f"{images}: images are {tuple(x_u8.shape[1:])}; the seed network takes 28x28")
    # Exactly cnn.c's loader (and torchvision's ToTensor + Normalize) in fp32.
    x = x_u8.to(torch.float32).div_(255.0).sub_(mean).div_(std).unsqueeze(1).contiguous()
    n = x.shape[0]
    print(f"torch_check: test set {images}: {n} images, mean {mean} std {std}")

    model.eval()
    loss_sum, correct, first = 0.0, 0, []
    with torch.no_grad():
        for start in range(0, n, args.batch):
            out = model(x[start:start + args.batch])
            target = y[start:start + args.batch]
            loss_sum += F.nll_loss(out.double(), target, reduction="sum").item()
            correct += (out.argmax(dim=1) == target).sum().item()
            if args.dump and sum(len(f) for f in first) < int(args.dump[0]):
                first.append(out[:int(args.dump[0])])
    loss, acc = loss_sum / n, 100.0 * correct / n
    print(f"pytorch: test_loss {loss:.6f} test_acc {acc:.2f}% ({correct}/{n})")

    if args.dump:
        rows = torch.cat(first)[:int(args.dump[0])] if first else torch.empty(0, 10)
        with open(args.dump[1], "w") as f:
            for r in rows:
                f.write(" ".join(f"{v:.9g}" for v in r.tolist()) + "\n")
    if args.json:
        print(json.dumps({"impl": "pytorch", "test_loss": loss, "test_acc": acc,
                          "correct": correct, "images": n, "checkpoint": args.checkpoint,
                          "torch": torch.__version__}))
    if args.expect_acc is not None:
        d = acc - args.expect_acc
        verdict = "within" if abs(d) <= args.tolerance else "OUTSIDE"
        print(f"torch_check: accuracy {acc:.2f}% vs expected {args.expect_acc:.2f}%: "
              f"difference {d:+.2f} points, {verdict} the tolerance {args.tolerance}")
        if abs(d) > args.tolerance:
            sys.exit(1)


if __name__ == "__main__":
    main()
