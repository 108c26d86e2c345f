#!/usr/bin/python3
"""Prints the reference values of tests/test_optim.c (torch 1.13, /usr/bin/python3).

The parameters p0 and the three gradients of the test, through torch.optim.SGD and
torch.optim.AdamW with the settings below: the parameters after each step, as exact
float bit patterns; and the learning rates of torch.optim.lr_scheduler's LinearLR +
CosineAnnealingLR (SequentialLR) and StepLR, as doubles (%.17g). Paste into the test.
"""
import struct

import torch

P0 = [1.5, -0.75, 0.25, 2.0]
GRADS = [[0.1, -0.2, 0.3, -0.4], [0.5, 0.5, -0.1, 0.0], [-1.0, 0.02, 0.3, 2.0]]


def bits(x):
    return struct.unpack("<I", struct.pack("<f", float(x)))[0]


def run(name, make):
    p = torch.nn.Parameter(torch.tensor(P0))
    opt = make([p])
    print(f"    // {name}")
    for g in GRADS:
        p.grad = torch.tensor(g)
        opt.step()
        print("    {" + ", ".join(f"0x{bits(v):08x}u" for v in p.detach()) + "},  // " +
              " ".join(f"{float(v):.9g}" for v in p.detach()))


run("SGD(lr=0.1, momentum=0.9, dampening=0.1, weight_decay=0.01)",
    lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, dampening=0.1, weight_decay=0.01))
run("SGD(lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01)",
    lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01))
run("SGD(lr=0.1)", lambda ps: torch.optim.SGD(ps, lr=0.1))
run("AdamW(lr=0.01, weight_decay=0.01)", lambda ps: torch.optim.AdamW(ps, lr=0.01))
run("AdamW(lr=0.01, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1)",
    lambda ps: torch.optim.AdamW(ps, lr=0.01, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1))

p = torch.nn.Parameter(torch.zeros(1))
opt = torch.optim.SGD([p], lr=0.5)
warm = torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.25, total_iters=3)
cos = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=7, eta_min=0.01)
sched = torch.optim.lr_scheduler.SequentialLR(opt, [warm, cos], milestones=[3])
lrs = []
for _ in range(10):
    lrs.append(opt.param_groups[0]["lr"])
    opt.step()
    sched.step()
print("    // LinearLR(start_factor=0.25, total_iters=3) then CosineAnnealingLR(T_max=7, "
      "eta_min=0.01), lr 0.5, steps 0..9")
print("    " + ", ".join(f"{v:.17g}" for v in lrs))
