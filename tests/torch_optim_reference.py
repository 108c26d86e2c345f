#!/usr/bin/python3
"""Prints the reference values of tests/test_optim.c (torch 1.13, /usr/bin/python3).

The parameters p0 and the three gradients of the test, through torch.optim.SGD and
torch.optim.AdamW with the settings below: the parameters after each step, as exact
float bit patterns, also under OneCycleLR (its lr and cycled momentum or beta1); and the
learning rates (and OneCycleLR's momenta) of torch.optim.lr_scheduler's LinearLR +
CosineAnnealingLR (SequentialLR), OneCycleLR and ReduceLROnPlateau (on a fixed sequence
of losses), as doubles (%.17g). Paste into the test.
"""
import struct

import torch

P0 = [1.5, -0.75, 0.25, 2.0]
GRADS = [[0.1, -0.2, 0.3, -0.4], [0.5, 0.5, -0.1, 0.0], [-1.0, 0.02, 0.3, 2.0]]


def bits(x):
    return struct.unpack("<I", struct.pack("<f", float(x)))[0]


def run(name, make, schedule=None):
    p = torch.nn.Parameter(torch.tensor(P0))
    opt = make([p])
    sched = schedule(opt) if schedule else None
    print(f"    // {name}")
    for g in GRADS:
        p.grad = torch.tensor(g)
        opt.step()
        if sched:
            sched.step()
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

# OneCycleLR over the three steps: SGD's momentum and AdamW's beta1 cycled (replacing the
# optimizer's own, as OneCycleLR does).
run("SGD(lr=0.1, momentum=0.9, weight_decay=0.01) under OneCycleLR(max_lr=0.1, total_steps=3, "
    "pct_start=0.5)",
    lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=0.01),
    lambda o: torch.optim.lr_scheduler.OneCycleLR(o, max_lr=0.1, total_steps=3, pct_start=0.5))
run("AdamW(lr=0.01) under OneCycleLR(max_lr=0.01, total_steps=3, pct_start=0.5)",
    lambda ps: torch.optim.AdamW(ps, lr=0.01),
    lambda o: torch.optim.lr_scheduler.OneCycleLR(o, max_lr=0.01, total_steps=3, pct_start=0.5))


def onecycle(total, **kw):
    """OneCycleLR's lr and momentum at steps 0 .. total - 1 (SGD with momentum)."""
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0, momentum=0.5)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, total_steps=total, **kw)
    lrs, moms = [], []
    for _ in range(total):
        lrs.append(opt.param_groups[0]["lr"])
        moms.append(opt.param_groups[0]["momentum"])
        opt.step()
        sched.step()
    print(f"    // OneCycleLR(total_steps={total}, " + ", ".join(f"{k}={v}" for k, v in kw.items()) +
          "): lr, then momentum, steps 0.." + str(total - 1))
    print("    " + ", ".join(f"{v:.17g}" for v in lrs))
    print("    " + ", ".join(f"{v:.17g}" for v in moms))


onecycle(10, max_lr=0.5)
onecycle(7, max_lr=0.1, pct_start=0.25, div_factor=10.0, final_div_factor=100.0,
         base_momentum=0.8, max_momentum=0.9)

PLATEAU_LOSSES = [1.0, 0.9, 0.95, 0.9, 0.89995, 0.91, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.2]
opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.5)
sched = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, factor=0.3, patience=1, min_lr=0.01)
lrs = []
for loss in PLATEAU_LOSSES:
    opt.step()
    sched.step(loss)
    lrs.append(opt.param_groups[0]["lr"])
print("    // ReduceLROnPlateau(factor=0.3, patience=1, min_lr=0.01), lr 0.5: the lr after "
      "each step on the losses " + ", ".join(str(v) for v in PLATEAU_LOSSES))
print("    " + ", ".join(f"{v:.17g}" for v in lrs))
