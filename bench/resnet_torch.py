#!/usr/bin/python3
"""PyTorch's side of bench/resnet_bench.sh: trains a ResNet for a fixed number of steps
on the CPU and prints images/s, peak RSS and the GEMM work of a step.

  resnet_torch.py CFG --size S --batch B --steps N [--channels C] [--threads T] [--segments K]
                  [--torchvision] [--sgd]

The network is CFG's, built by bench/cfg_torch.py (the same layers, names and
initialisation as cnn.c), or with --torchvision torchvision's model of CFG's name
(torchvision.models.resnet18(num_classes=10) for models/resnet18.cfg; also resnet34,
resnet50 and mobilenet_v2: its in-place ReLUs keep less than cfg_torch's, so it is
PyTorch at its leanest); the
recipe is cnn.c's: NLL loss of log_softmax, mean over the batch, the cfg's Adadelta
(lr 1.0, rho 0.9, eps 1e-6), or with --sgd SGD with momentum 0.9 (lr 0.01), which keeps
one state tensor per parameter where Adadelta keeps two. The data is one fixed batch of random normal images of
C x S x S (C = 3 by default) and random labels of 10 classes: data loading is not what is measured.
--segments K > 1 runs the forward through torch.utils.checkpoint.checkpoint_sequential
over the top-level layers in K segments; --segments sqrt takes round(sqrt(layers)), as
cnn.c's checkpoint=sqrt does.

One warm-up step is not timed; the next N are. Prints one JSON line:
  {"impl": "pytorch", "img_per_s": .., "peak_rss_mb": .., "gflop_per_image": .., ...}
gflop_per_image is the multiply-adds of every convolution and linear layer, times 2 for
FLOPs, times 3 for the forward and the two gradients, less the input gradient of the
first layer, which nobody needs: the work a GEMM-based step does, for the share of the
sgemm ceiling. Run with /usr/bin/python3 (Debian's python3-torch).
"""

import argparse
import json
import math
import os
import resource
import sys
import time
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint_sequential

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cfg_torch  # noqa: E402


def layers_of(args):
    """The network as the list of its top-level layers, ending in log_softmax."""
    if args.torchvision:
        import torchvision
        torch.manual_seed(1)
        name = os.path.splitext(os.path.basename(args.cfg))[0]
        m = getattr(torchvision.models, name)(num_classes=10)
        log_softmax = cfg_torch.Func(lambda x: F.log_softmax(x, dim=1))
        if name.startswith("resnet"):
            return [m.conv1, m.bn1, m.relu, m.maxpool, *m.layer1, *m.layer2, *m.layer3,
                    *m.layer4, m.avgpool, nn.Flatten(), m.fc, log_softmax]
        return [*m.features, nn.AdaptiveAvgPool2d(1), nn.Flatten(), *m.classifier, log_softmax]
    net = cfg_torch.build(cfg_torch.parse(open(args.cfg).read()), (args.channels, args.size, args.size), 10, 1)
    return [m for _, m in net.order]


def gemm_gflop(model, x):
    """GFLOP of a GEMM-based training step per image (see the module's docstring)."""
    macs = []

    def hook(m, inp, out):
        w = m.weight
        per_out = w[0].numel()  # C*K*K (conv) or in_features (linear)
        macs.append(out[0].numel() * per_out)

    handles = [m.register_forward_hook(hook) for m in model.modules()
               if isinstance(m, (nn.Conv2d, nn.Linear))]
    with torch.no_grad():
        model.eval()
        model(x[:1])
        model.train()
    for h in handles:
        h.remove()
    return (3 * sum(macs) - macs[0]) * 2 / 1e9


def main():
    p = argparse.ArgumentParser()
    p.add_argument("cfg")
    p.add_argument("--size", type=int, required=True)
    p.add_argument("--batch", type=int, required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--channels", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--segments", default="1")
    p.add_argument("--torchvision", action="store_true")
    p.add_argument("--sgd", action="store_true")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")  # checkpoint's use_reentrant notice
    layers = layers_of(args)
    args.segments = round(math.sqrt(len(layers))) if args.segments == "sqrt" else int(args.segments)
    model = nn.Sequential(*layers)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(args.batch, args.channels, args.size, args.size, generator=gen)
    y = torch.randint(0, 10, (args.batch,), generator=gen)
    gflop = gemm_gflop(model, x)
    if args.sgd:
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    else:
        opt = torch.optim.Adadelta(model.parameters(), lr=1.0, rho=0.9, eps=1e-6)
    if args.segments > 1:
        x.requires_grad_(True)  # checkpoint_sequential needs an input that wants a gradient

    def step():
        opt.zero_grad()
        if args.segments > 1:
            out = checkpoint_sequential(model, args.segments, x)
        else:
            out = model(x)
        F.nll_loss(out, y).backward()
        opt.step()

    step()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        step()
    seconds = time.perf_counter() - t0
    print(json.dumps({"impl": "pytorch", "img_per_s": args.batch * args.steps / seconds,
                      "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e6,
                      "gflop_per_image": gflop, "batch": args.batch, "size": args.size,
                      "steps": args.steps, "segments": args.segments, "threads": args.threads,
                      "optimizer": "sgd" if args.sgd else "adadelta",
                      "torch": torch.__version__}))


if __name__ == "__main__":
    main()
