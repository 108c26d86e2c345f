#!/usr/bin/python3
"""torchvision's ResNet-18 as the reference of tests/test_torchvision.c.

  torchvision_reference.py make DIR
      torchvision.models.resnet18(num_classes=10) after torch.manual_seed(0), with its
      batchnorm weights, biases and running statistics drawn at random (fresh ones are 1,
      0, 0 and 1, which would test nothing), and N = 2 random images. Writes, as plain
      safetensors (no metadata, as PyTorch users save them):
        DIR/weights.safetensors    its state_dict
        DIR/input.safetensors      x_eval (N, 3, 224, 224) and x_train (N, 3, 128, 128)
                                   F32, labels (N) I64
        DIR/reference.safetensors  eval_logits (N, 10): model.eval() on x_eval;
                                   train_logits (N, 10): model.train() on x_train;
                                   grad.<name>: the gradient of every parameter of the
                                   mean cross-entropy of the training forward;
                                   after.<name>: every buffer after that forward
      The gradient of a ReLU network jumps where an input to a ReLU crosses 0, and a
      batchnorm spreads such a jump over its whole channel: two float implementations
      then differ by far more than rounding. So x_train is the first of 32 seeds whose
      training forward keeps every ReLU input at least 1e-5 from 0 (about 10 times the
      difference of the two forwards), at 128x128 where such seeds exist; the message
      says how far.
  torchvision_reference.py check DIR CHECKPOINT LOGITS
      Loads a plain state_dict that cnn.c wrote (./ckpt export of a checkpoint: no
      metadata, no optimizer state) as is into resnet18 with load_state_dict(strict=True), evaluates x_train of DIR/input.safetensors and
      compares its logits with LOGITS (a safetensors file holding "logits", cnn.c's
      evaluation of the same images). Prints the largest difference; exits 1 if it
      exceeds 1e-4 or a prediction differs.

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


def model():
    """resnet18 with batchnorm weights in [0.5, 1.5), biases in [1, 2) (so that fewer ReLU
    inputs lie near 0) and random running statistics."""
    torch.manual_seed(0)
    m = torchvision.models.resnet18(num_classes=10)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for mod in m.modules():
            if isinstance(mod, torch.nn.BatchNorm2d):
                c = mod.num_features
                mod.weight.copy_(torch.rand(c, generator=g) + 0.5)
                mod.bias.copy_(torch.rand(c, generator=g) + 1.0)
                mod.running_mean.copy_(torch.rand(c, generator=g) * 0.2 - 0.1)
                mod.running_var.copy_(torch.rand(c, generator=g) + 0.5)
                mod.num_batches_tracked.fill_(7)
    return m


def relu_margin(m, x):
    """The smallest |input| of any ReLU in a training forward of a copy of m on x."""
    m = copy.deepcopy(m)
    m.train()
    smallest = [float("inf")]

    def hook(mod, inp, out):
        smallest[0] = min(smallest[0], float(inp[0].detach().abs().min()))
    for mod in m.modules():
        if isinstance(mod, torch.nn.ReLU):
            mod.inplace = False
            mod.register_forward_hook(hook)
    with torch.no_grad():
        m(x)
    return smallest[0]


def make(out):
    torch.set_num_threads(2)
    m = model()
    st_torch.write(os.path.join(out, "weights.safetensors"), m.state_dict())
    x_eval = torch.randn(N, 3, 224, 224, generator=torch.Generator().manual_seed(2))
    for seed in range(32):
        x = torch.randn(N, 3, 128, 128, generator=torch.Generator().manual_seed(100 + seed))
        margin = relu_margin(m, x)
        if margin >= MARGIN:
            break
    else:
        sys.exit(f"torchvision_reference: no input of 32 keeps the ReLU inputs {MARGIN} from 0")
    print(f"torchvision_reference: training input seed {100 + seed}: every ReLU input is at "
          f"least {margin:.3g} from 0")
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
    for name, p in m.named_parameters():
        ref["grad." + name] = p.grad
    for name, b in m.named_buffers():
        ref["after." + name] = b
    st_torch.write(os.path.join(out, "reference.safetensors"), ref)


def check(out, checkpoint, logits_path):
    state, meta = st_torch.read(checkpoint)
    if meta:
        print(f"torchvision: {checkpoint} has metadata {sorted(meta)}: not a plain state_dict")
        return 1
    m = torchvision.models.resnet18(num_classes=10)
    m.load_state_dict(state, strict=True)
    m.eval()
    x = st_torch.read(os.path.join(out, "input.safetensors"))[0]["x_train"]
    with torch.no_grad():
        logits = m(x)
    theirs = st_torch.read(logits_path)[0]["logits"]
    diff = (logits - theirs).abs().max().item()
    same = bool((logits.argmax(1) == theirs.argmax(1)).all())
    print(f"torchvision: {checkpoint} loaded as is with strict=True ({len(state)} tensors); "
          f"eval logits max |torchvision - cnn.c| = {diff:.3g}; "
          f"predictions {'equal' if same else 'DIFFER'}")
    return 0 if diff <= 1e-4 and same else 1


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "make":
        make(sys.argv[2])
    elif len(sys.argv) == 5 and sys.argv[1] == "check":
        sys.exit(check(sys.argv[2], sys.argv[3], sys.argv[4]))
    else:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
