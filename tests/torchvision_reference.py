#!/usr/bin/python3
"""torchvision's models as the reference of tests/test_torchvision.c.

MODEL: resnet18, resnet34, resnet50 or mobilenet_v2 (its classifier's dropout set to 0 for
the training forward, as the test sets its cfg's).

  torchvision_reference.py make DIR MODEL
      torchvision.models.MODEL(num_classes=10) after torch.manual_seed(0), with its
      batchnorm weights, biases and running statistics drawn at random (fresh ones are 1,
      0, 0 and 1, which would test nothing), and N = 2 random images. Writes, as plain
      safetensors (no metadata, as PyTorch users save them):
        DIR/weights.safetensors    its state_dict
        DIR/input.safetensors      x_eval (N, 3, 224, 224) and x_train (N, 3, S, S)
                                   F32, labels (N) I64
        DIR/reference.safetensors  eval_logits (N, 10): model.eval() on x_eval;
                                   train_logits (N, 10): model.train() on x_train;
                                   grad.<name>: the gradient of every parameter of the
                                   mean cross-entropy of the training forward;
                                   after.<name>: every buffer after that forward;
                                   step.<name>: every parameter after one step of
                                   SGD(lr=0.1, momentum=0.9, weight_decay=1e-4)
      The gradient of a ReLU network jumps where an input to a ReLU crosses 0 (a ReLU6's,
      0 or 6), and a batchnorm spreads such a jump over its whole channel: two float
      implementations then differ by far more than rounding. So x_train is the first of
      32 seeds whose training forward keeps every such input at least 1e-5 from its kinks
      (about 10 times the difference of the two forwards), at a size S where such seeds
      exist (128 for resnet18, smaller for the larger networks); the message says how far.
  torchvision_reference.py check DIR MODEL CHECKPOINT LOGITS
      Loads a plain state_dict that cnn.c wrote (./ckpt export of a checkpoint: no
      metadata, no optimizer state) as is into MODEL with load_state_dict(strict=True),
      evaluates x_train of DIR/input.safetensors and
      compares its logits with LOGITS (a safetensors file holding "logits", cnn.c's
      evaluation of the same images). Prints the largest difference; exits 1 if it
      exceeds 1e-4 of the largest logit (or of 1) or a prediction differs.

  torchvision_reference.py photos DIR
      What the README's fine-tuning commands expect in their folder: DIR/r18.safetensors,
      torchvision.models.resnet18()'s state_dict as the README's Python line saves it
      (weights=None: the same names and shapes as IMAGENET1K_V1's, which would need the
      internet), and DIR/photos/ and DIR/photos_test/, 3 classes of JPEG photos of a few
      sizes and aspects (each class its own colour and stripe).

Exit status 3: torch or torchvision is not installed (the test skips).
"""

import copy
import os
import sys

try:
    import torch
    import torch.nn.functional as F
    import torchvision
except ImportError as e:
    print(f"torchvision_reference: {e} (Debian: apt-get install python3-torch "
          "python3-torchvision; run with /usr/bin/python3)", file=sys.stderr)
    sys.exit(3)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))
import st_torch  # noqa: E402

N = 2
MARGIN = 1e-5
TRAIN_SIZE = {"resnet18": 128, "resnet34": 96, "resnet50": 64, "mobilenet_v2": 64}


def model(name):
    """The model with batchnorm weights in [0.5, 1.5), biases in [1, 2) (so that fewer ReLU
    inputs lie near 0) and running statistics of its own activations: the averages of
    training forwards of random images, so that an evaluation keeps the activations near
    their training scale, as in a trained network (random statistics let them grow layer
    after layer, to logits of thousands in resnet50)."""
    torch.manual_seed(0)
    m = getattr(torchvision.models, name)(num_classes=10)
    g = torch.Generator().manual_seed(1)
    bns = [mod for mod in m.modules() if isinstance(mod, torch.nn.BatchNorm2d)]
    with torch.no_grad():
        for mod in bns:
            c = mod.num_features
            mod.weight.copy_(torch.rand(c, generator=g) + 0.5)
            mod.bias.copy_(torch.rand(c, generator=g) + 1.0)
            mod.reset_running_stats()
            mod.momentum = None  # a cumulative average
        for mod in m.modules():
            if isinstance(mod, torch.nn.Dropout):
                mod.p = 0.0
        m.train()
        for _ in range(2):
            m(torch.randn(4, 3, 112, 112, generator=g))
        for mod in bns:
            mod.momentum = 0.1
            mod.num_batches_tracked.fill_(7)
    return m


def kink_margin(m, x):
    """The smallest distance of any ReLU's input from 0 (a ReLU6's from 0 and 6) in a
    training forward of a copy of m on x."""
    m = copy.deepcopy(m)
    m.train()
    smallest = [float("inf")]

    def hook(mod, inp, out):
        d = inp[0].detach().abs()
        if isinstance(mod, torch.nn.ReLU6):
            d = torch.minimum(d, (inp[0].detach() - 6).abs())
        smallest[0] = min(smallest[0], float(d.min()))
    for mod in m.modules():
        if isinstance(mod, (torch.nn.ReLU, torch.nn.ReLU6)):
            mod.inplace = False
            mod.register_forward_hook(hook)
    with torch.no_grad():
        m(x)
    return smallest[0]


def make(out, name):
    torch.set_num_threads(2)
    m = model(name)
    st_torch.write(os.path.join(out, "weights.safetensors"), m.state_dict())
    x_eval = torch.randn(N, 3, 224, 224, generator=torch.Generator().manual_seed(2))
    size = TRAIN_SIZE[name]
    for seed in range(32):
        x = torch.randn(N, 3, size, size, generator=torch.Generator().manual_seed(100 + seed))
        margin = kink_margin(m, x)
        if margin >= MARGIN:
            break
    else:
        sys.exit(f"torchvision_reference: {name}: no input of 32 keeps the ReLU inputs {MARGIN} "
                 "from their kinks")
    print(f"torchvision_reference: {name}: training input {size}x{size} seed {100 + seed}: every "
          f"ReLU input is at least {margin:.3g} from its kinks")
    labels = torch.tensor([3, 8])
    st_torch.write(os.path.join(out, "input.safetensors"),
                   {"x_eval": x_eval, "x_train": x, "labels": labels})
    ref = {}
    m.eval()
    with torch.no_grad():
        ref["eval_logits"] = m(x_eval)
    m.train()
    logits = m(x)
    F.cross_entropy(logits, labels).backward()
    ref["train_logits"] = logits.detach()
    for pname, p in m.named_parameters():
        ref["grad." + pname] = p.grad.clone()
    for bname, b in m.named_buffers():
        ref["after." + bname] = b.clone()
    torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4).step()
    for pname, p in m.named_parameters():
        ref["step." + pname] = p.detach().clone()
    st_torch.write(os.path.join(out, "reference.safetensors"), ref)


def check(out, name, checkpoint, logits_path):
    state, meta = st_torch.read(checkpoint)
    if meta:
        print(f"torchvision: {checkpoint} has metadata {sorted(meta)}: not a plain state_dict")
        return 1
    m = getattr(torchvision.models, name)(num_classes=10)
    m.load_state_dict(state, strict=True)
    m.eval()
    x = st_torch.read(os.path.join(out, "input.safetensors"))[0]["x_train"]
    with torch.no_grad():
        logits = m(x)
    theirs = st_torch.read(logits_path)[0]["logits"]
    diff = (logits - theirs).abs().max().item()
    big = max(1.0, logits.abs().max().item())
    same = bool((logits.argmax(1) == theirs.argmax(1)).all())
    print(f"torchvision: {name}: {checkpoint} loaded as is with strict=True ({len(state)} "
          f"tensors); eval logits max |torchvision - cnn.c| = {diff:.3g} (logits up to "
          f"{big:.3g}); predictions {'equal' if same else 'DIFFER'}")
    return 0 if diff <= 1e-4 * big and same else 1


def photos(out):
    from PIL import Image

    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)
    st_torch.write(os.path.join(out, "r18.safetensors"), torchvision.models.resnet18().state_dict())
    g = torch.Generator().manual_seed(1)
    colours = {"cat": (200, 80, 40), "dog": (40, 160, 90), "fox": (60, 70, 210)}
    sizes = [(320, 240), (240, 320), (300, 300), (500, 375)]
    for folder, count in (("photos", 5), ("photos_test", 4)):
        for k, (name, rgb) in enumerate(colours.items()):
            os.makedirs(os.path.join(out, folder, name), exist_ok=True)
            for i in range(count):
                w, h = sizes[i % len(sizes)]
                px = torch.randint(0, 60, (h, w, 3), generator=g, dtype=torch.int32)
                px += torch.tensor(rgb, dtype=torch.int32) // 2
                px[:, (k + 1) * w // 5:(k + 1) * w // 5 + w // 10] += 90
                img = Image.fromarray(px.clamp(0, 255).to(torch.uint8).numpy())
                img.save(os.path.join(out, folder, name, f"{i:02d}.jpg"), quality=90)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "make" and sys.argv[3] in TRAIN_SIZE:
        make(sys.argv[2], sys.argv[3])
    elif len(sys.argv) == 3 and sys.argv[1] == "photos":
        photos(sys.argv[2])
    elif len(sys.argv) == 6 and sys.argv[1] == "check" and sys.argv[3] in TRAIN_SIZE:
        sys.exit(check(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5]))
    else:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
