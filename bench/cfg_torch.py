"""A cnn.c cfg file as a PyTorch nn.Module: the same layers, state_dict names and
initialisation, for comparing cnn.c with PyTorch on any network the cfg describes.

  net = cfg_torch.build(cfg_torch.parse(text), in_shape=(C, H, W), classes=10, seed=1)

The modules are built in the cfg's order after torch.manual_seed(seed), so Conv2d and
Linear draw their default initialisation exactly as cnn.c's net_init_params does (a
[residual] block builds conv1, bn1, conv2, bn2, then its downsample). A layer named
"layer1.0" is module "0" of a container "layer1", so state_dict keys are cnn.c's
("layer1.0.conv1.weight") and torchvision's. The forward runs the layers in order; conv,
linear and batchnorm apply their `activation`.

Run with /usr/bin/python3 (Debian's python3-torch).
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

LAYERS = ("conv", "linear", "batchnorm", "relu", "relu6", "maxpool", "avgpool", "global_avgpool",
          "dropout", "flatten", "residual", "log_softmax")


def parse(text):
    """[(section, {key: value})] of a cfg text, in order; comments and blank lines dropped."""
    sections = []
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        if line.startswith("[") and line.endswith("]"):
            sections.append((line[1:-1].strip(), {}))
        elif "=" in line and sections:
            k, v = line.split("=", 1)
            sections[-1][1][k.strip()] = v.strip()
    return sections


def section(sections, name):
    for s, keys in sections:
        if s == name:
            return keys
    return {}


class BasicBlock(nn.Module):
    """cnn.c's [residual]: torchvision's BasicBlock."""

    def __init__(self, inplanes, planes, stride, downsample):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = nn.Sequential(nn.Conv2d(inplanes, planes, 1, stride, bias=False),
                                        nn.BatchNorm2d(planes)) if downsample else None

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + (self.downsample(x) if self.downsample is not None else x))


ACTIVATIONS = {"none": lambda x: x, "relu": F.relu, "relu6": F.relu6}


class Act(nn.Module):
    """A layer followed by cnn.c's `activation` (none, relu or relu6)."""

    def __init__(self, layer, act):
        super().__init__()
        self.layer, self.act = layer, ACTIVATIONS[act]

    def forward(self, x):
        return self.act(self.layer(x))


class Func(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


class CfgNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.order = []  # (module path, module): the forward, in cfg order

    def forward(self, x):
        for _, m in self.order:
            x = m(x)
        return x


def _attach(root, path, module):
    """Registers module at the dotted path, creating plain containers on the way."""
    parts = path.split(".")
    parent = root
    for p in parts[:-1]:
        if not hasattr(parent, p) or getattr(parent, p) is None:
            parent.add_module(p, nn.Module())
        parent = getattr(parent, p)
    parent.add_module(parts[-1], module)


def build(sections, in_shape, classes, seed):
    """The network of the cfg's layer sections for inputs of in_shape (C, H, W)."""
    torch.manual_seed(seed)
    net = CfgNet()
    c, h, w = in_shape
    flat = False
    counts = {}
    for name, keys in sections:
        if name in ("train", "data"):
            continue
        if name not in LAYERS:
            raise ValueError(f"cfg_torch: unknown section [{name}]")
        counts[name] = counts.get(name, 0) + 1
        path = keys.get("name", f"{name}{counts[name]}")
        act = keys.get("activation", "none")
        if name == "conv":
            k, s, p = int(keys["size"]), int(keys.get("stride", 1)), int(keys.get("pad", 0))
            f = int(keys["filters"])
            conv = nn.Conv2d(c, f, k, s, p, bias=keys.get("bias", "1") != "0")
            _attach(net, path, conv)
            m = Act(conv, act)
            c, h, w = f, (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1
        elif name == "linear":
            out = classes if keys["outputs"] == "classes" else int(keys["outputs"])
            lin = nn.Linear(c, out)
            _attach(net, path, lin)
            m = Act(lin, act)
            c = out
        elif name == "batchnorm":
            cls = nn.BatchNorm1d if flat else nn.BatchNorm2d
            bn = cls(c, eps=float(keys.get("eps", 1e-5)), momentum=float(keys.get("momentum", 0.1)))
            _attach(net, path, bn)
            m = Act(bn, act)
        elif name == "residual":
            f, s = int(keys["filters"]), int(keys.get("stride", 1))
            ds = keys.get("downsample", "auto")
            block = BasicBlock(c, f, s, ds == "1" or (ds == "auto" and (s != 1 or f != c)))
            _attach(net, path, block)
            m = block
            c, h, w = f, (h - 1) // s + 1, (w - 1) // s + 1
        elif name in ("maxpool", "avgpool"):
            k = int(keys.get("size", 2))
            s, p = int(keys.get("stride", k)), int(keys.get("pad", 0))
            m = nn.MaxPool2d(k, s, p) if name == "maxpool" else nn.AvgPool2d(k, s, p)
            h, w = (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1
        elif name == "global_avgpool":
            m = nn.AdaptiveAvgPool2d(1)
            h = w = 1
        elif name == "relu":
            m = nn.ReLU()
        elif name == "relu6":
            m = nn.ReLU6()
        elif name == "dropout":
            m = nn.Dropout(float(keys.get("p", 0.5)))
        elif name == "flatten":
            m = nn.Flatten()
            c, h, w, flat = c * h * w, 1, 1, True
        else:  # log_softmax
            m = Func(lambda x: F.log_softmax(x, dim=1))
        net.order.append((path, m))
    return net
