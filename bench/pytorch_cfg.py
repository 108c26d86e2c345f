#!/usr/bin/python3
"""Trains a cnn.c cfg network in PyTorch, as ./train trains it, for comparing the two.

The network is bench/cfg_torch.py's build of the cfg (the same layers, names and initial
weights, drawn after torch.manual_seed(seed)); the recipe is the cfg's [train]: the NLL
loss averaged over each batch (label_smoothing as CrossEntropyLoss's, clip_grad_norm as
clip_grad_norm_ before the step); the optimizer with cnn.c's defaults (adadelta: lr, rho,
eps; sgd: momentum, dampening, nesterov; adamw: betas, eps; weight_decay, without decay
for biases and batchnorm parameters with decay_skip_norm_bias = 1); the schedule: StepLR
(lr_gamma) stepped each epoch, or CosineAnnealingLR to lr_min over the run stepped each
batch, after `warmup` steps of LinearLR from warmup_start (SequentialLR), or OneCycleLR
(max_lr = lr; pct_start, div_factor, final_div_factor, cycle_momentum, base_momentum,
max_momentum) stepped each batch, or ReduceLROnPlateau (plateau_factor,
plateau_patience, min_lr = lr_min) stepped each epoch on the test loss; early stopping
(patience) on the test loss as ./train stops. The data is its
[data]: IDX files (raw or gzip), normalised as (x/255 - mean) / std, and the batches come
in cnn.c's order: the loader's seeded Fisher-Yates shuffle (data/loader.c) is replayed
here, so both see the same batches, and so are its crop_pad windows and flips (drawn per
epoch and sample from the same counter-based RNG): the same augmented images.

  pytorch_cfg.py CFG [key=value ...] [--epochs N] [--steps N] [--threads T]
                   [--init-out FILE] [--save FILE] [--double | --bf16] [--json]

key=value overrides a key of [train] (or of [data] for its keys), as ./train's do.
--double trains in float64 (--save writes F64 tensors then): the reference that says how
far float32 rounding alone moves the parameters. --bf16 runs the training forward under
torch.autocast("cpu", dtype=torch.bfloat16) (bf16 GEMMs and convolutions, float32
weights and updates), PyTorch's mixed precision on the CPU.

--init-out writes the initial weights as a plain safetensors state_dict before training:
./train CFG init=FILE then starts from exactly them. --steps stops after N optimizer steps
(as ./train's stop_after) and --save writes the state_dict at the end, to compare with
./train's checkpoint (./ckpt diff). Prints a line per epoch (train loss
and accuracy, test loss and accuracy, images per second of the training loop alone), with
--json as {"impl": "pytorch", "epoch": ..., "seconds": the training loop's, ...}, the
fields of ./train's metrics.jsonl. Run with /usr/bin/python3.
"""

import argparse
import gzip
import json
import os
import sys
import time
import warnings

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cfg_torch  # noqa: E402
import st_torch  # noqa: E402

M64 = (1 << 64) - 1


# ---- cnn.c's counter-based RNG (nn/rng.h) and the loader's shuffle (data/loader.c) -------

def mix64(x):
    x ^= x >> 30
    x = (x * 0xbf58476d1ce4e5b9) & M64
    x ^= x >> 27
    x = (x * 0x94d049bb133111eb) & M64
    return x ^ (x >> 31)


def rng_key(seed, stream, a, b):
    k = mix64(seed ^ 0x5851f42d4c957f2d)
    k = mix64(k ^ ((stream * 0xd6e8feb86659fd93) & M64))
    k = mix64(k ^ ((a + 0x9e3779b97f4a7c15) & M64))
    return mix64(k ^ ((b * 0xa0761d6478bd642f + 1) & M64))


def rng_u64(key, counter):
    return mix64((key + (counter + 1) * 0x9e3779b97f4a7c15) & M64)


def draw_below(key, i, n, rng):
    counter = i
    m = rng_u64(key, counter) * rng
    low = m & M64
    if low < rng:
        threshold = ((1 << 64) - rng) % rng
        while low < threshold:
            counter += n
            m = rng_u64(key, counter) * rng
            low = m & M64
    return m >> 64


AUG_FLIP, AUG_PAD_X, AUG_PAD_Y, AUG_COUNTERS = 0, 1, 2, 64  # data/transform.h
RNG_STREAM_AUGMENT = 4


def augment(raw, idx, seed, epoch, pad, flip):
    """raw (N, H, W) bytes' samples idx as the loader augments them in this epoch:
    crop_pad's window (torchvision's RandomCrop(padding=pad): x[y][x] = raw[y + dy][x + dx],
    zero outside), then the horizontal flip, each drawn as data/loader.c draws it from
    rng_key(seed, RNG_STREAM_AUGMENT, epoch, sample)."""
    H, W = raw.shape[1], raw.shape[2]
    padded = torch.nn.functional.pad(raw[idx], (pad, pad, pad, pad)) if pad else raw[idx]
    out = torch.empty((len(idx), H, W), dtype=torch.uint8)
    for j, i in enumerate(idx.tolist()):
        key = rng_key(seed, RNG_STREAM_AUGMENT, epoch, i)
        dx = draw_below(key, AUG_PAD_X, AUG_COUNTERS, 2 * pad + 1) - pad if pad else 0
        dy = draw_below(key, AUG_PAD_Y, AUG_COUNTERS, 2 * pad + 1) - pad if pad else 0
        w = padded[j, pad + dy:pad + dy + H, pad + dx:pad + dx + W]
        out[j] = w.flip(1) if flip and rng_u64(key, AUG_FLIP) >> 63 else w
    return out


def shuffle(n, seed, epoch):
    order = list(range(n))
    key = rng_key(seed, 3, epoch, 0)  # RNG_STREAM_SHUFFLE
    for i in range(n - 1, 0, -1):
        j = draw_below(key, i, n, i + 1)
        order[i], order[j] = order[j], order[i]
    return order


# ---- data -------------------------------------------------------------------------------

def read_idx(path, magic, ndim):
    with open(path, "rb") as f:
        raw = f.read()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    if int.from_bytes(raw[:4], "big") != magic:
        sys.exit(f"pytorch_cfg: {path}: not an IDX file with magic {magic:#010x}")
    dims = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return torch.frombuffer(bytearray(raw[4 + 4 * ndim:]), dtype=torch.uint8).reshape(dims)


def floats(text, n=3):
    v = [float(x) for x in text.split(",")]
    return v * n if len(v) == 1 else v


def normalise(raw, data):
    """(N, H, W) bytes as (N, 1, H, W) floats, (x / 255 - mean) / std."""
    mean, std = floats(data.get("mean", "0"), 1)[0], floats(data.get("std", "1"), 1)[0]
    return raw.float().div_(255).sub_(mean).div_(std).unsqueeze(1).contiguous()


def load(data, split):
    """The split's bytes (N, H, W) and labels."""
    if os.path.isdir(data.get(split, "")):
        sys.exit("pytorch_cfg: image folders are not read here; give IDX files")
    return read_idx(data[split], 0x803, 3), read_idx(data[split + "_labels"], 0x801, 1).long()


DATA_KEYS = {"train", "train_labels", "test", "test_labels", "val_split", "width", "height",
             "channels", "mean", "std", "shuffle", "drop_last", "workers", "prefetch",
             "resize", "short_side", "center_crop", "skip_bad", "cache", "crop_pad",
             "crop_scale", "crop_ratio", "flip", "jitter"}


def make_optimizer(net, tr):
    """torch.optim's optimizer for [train], with cnn.c's defaults (train.c)."""
    kind = tr.get("optimizer", "adadelta")
    lr = float(tr.get("lr", {"adadelta": 1.0, "sgd": 0.01, "adamw": 0.001}[kind]))
    wd = float(tr.get("weight_decay", 0.01 if kind == "adamw" else 0))
    params = list(net.parameters())
    if tr.get("decay_skip_norm_bias", "0") == "1":  # biases and batchnorm: ndim <= 1
        params = [{"params": [q for q in params if q.dim() > 1], "weight_decay": wd},
                  {"params": [q for q in params if q.dim() <= 1], "weight_decay": 0.0}]
    if kind == "adadelta":
        return torch.optim.Adadelta(params, lr=lr, rho=float(tr.get("rho", 0.9)),
                                    eps=float(tr.get("eps", 1e-6)), weight_decay=wd)
    if kind == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=float(tr.get("momentum", 0)),
                               dampening=float(tr.get("dampening", 0)),
                               nesterov=tr.get("nesterov", "0") == "1", weight_decay=wd)
    if kind == "adamw":
        return torch.optim.AdamW(params, lr=lr, betas=tuple(floats(tr.get("betas", "0.9, 0.999"), 1)),
                                 eps=float(tr.get("eps", 1e-8)), weight_decay=wd)
    sys.exit(f"pytorch_cfg: optimizer {kind} is not known here")


def make_schedule(opt, tr, total):
    """(scheduler, per_batch): [train]'s schedule over `total` steps (per_batch None:
    ReduceLROnPlateau, stepped each epoch on the test loss)."""
    warmup = int(tr.get("warmup", 0))
    kind = tr.get("schedule", "step")
    if kind in ("onecycle", "plateau") and warmup:
        sys.exit(f"pytorch_cfg: warmup does not go with schedule = {kind}")
    if kind == "onecycle":
        return torch.optim.lr_scheduler.OneCycleLR(
            opt, max_lr=opt.param_groups[0]["lr"], total_steps=total,
            pct_start=float(tr.get("pct_start", 0.3)), div_factor=float(tr.get("div_factor", 25)),
            final_div_factor=float(tr.get("final_div_factor", 1e4)),
            cycle_momentum=tr.get("cycle_momentum", "1") == "1",
            base_momentum=float(tr.get("base_momentum", 0.85)),
            max_momentum=float(tr.get("max_momentum", 0.95))), True
    if kind == "plateau":
        return torch.optim.lr_scheduler.ReduceLROnPlateau(
            opt, factor=float(tr.get("plateau_factor", 0.1)),
            patience=int(tr.get("plateau_patience", 10)), min_lr=float(tr.get("lr_min", 0))), None
    if kind == "cosine":
        main = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(total - warmup, 1),
                                                          eta_min=float(tr.get("lr_min", 0)))
        per_batch = True
    else:
        if warmup:
            sys.exit("pytorch_cfg: warmup with the step schedule is not replayed here")
        main = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=float(tr.get("lr_gamma", 0.7)))
        per_batch = False
    if not warmup:
        return main, per_batch
    warm = torch.optim.lr_scheduler.LinearLR(opt, start_factor=float(tr.get("warmup_start", 1 / 3)),
                                             total_iters=warmup)
    return torch.optim.lr_scheduler.SequentialLR(opt, [warm, main], milestones=[warmup]), per_batch


def main():
    # SequentialLR steps its second schedule with an epoch argument (torch 1.13), which
    # warns; the closed form it then uses is the one cnn.c computes.
    warnings.filterwarnings("ignore", message="The epoch parameter")
    p = argparse.ArgumentParser(description="Train a cnn.c cfg network in PyTorch")
    p.add_argument("cfg")
    p.add_argument("overrides", nargs="*", help="key=value: a key of [train] or [data]")
    p.add_argument("--double", action="store_true", help="train in float64")
    p.add_argument("--bf16", action="store_true", help="the training forward under bf16 autocast")
    p.add_argument("--epochs", type=int)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--steps", type=int, default=0, help="stop after this many steps")
    p.add_argument("--init-out", help="write the initial weights (plain safetensors) here")
    p.add_argument("--save", help="write the final state_dict (plain safetensors) here")
    p.add_argument("--json", action="store_true", help="a JSON line per epoch")
    args = p.parse_args()
    if args.double and args.bf16:
        sys.exit("pytorch_cfg: --double or --bf16, not both")
    torch.set_num_threads(args.threads or os.cpu_count() or 1)
    with open(args.cfg) as f:
        sections = cfg_torch.parse(f.read())
    tr, data = cfg_torch.section(sections, "train"), cfg_torch.section(sections, "data")
    for o in args.overrides:
        key, eq, value = o.partition("=")
        if not eq:
            sys.exit(f"pytorch_cfg: '{o}' is not key=value")
        (data if key in DATA_KEYS else tr)[key] = value
    epochs = args.epochs or int(tr.get("epochs", 14))
    batch, seed = int(tr.get("batch", 64)), int(tr.get("seed", 1))
    raw, y = load(data, "train")
    x = normalise(raw, data)
    xt, yt = load(data, "test") if data.get("test") else (None, None)
    xt = normalise(xt, data) if xt is not None else None
    # Augmentation as the loader's (crop_pad and flip; the other transforms are for folders).
    pad, flip = int(data.get("crop_pad", 0)), data.get("flip", "0") == "1"
    for key in ("crop_scale", "jitter"):
        if key in data:
            sys.exit(f"pytorch_cfg: {key} is not replayed here")
    classes = int(max(y.max(), yt.max() if yt is not None else 0)) + 1
    net = cfg_torch.build(sections, tuple(x.shape[1:]), classes, seed)
    if args.init_out:
        st_torch.write(args.init_out, net.state_dict())
    if args.double:
        net, x = net.double(), x.double()
        xt = xt.double() if xt is not None else None
    n, steps = x.shape[0], 0
    drop_last = data.get("drop_last", "0") == "1"
    batches = n // batch if drop_last else -(-n // batch)
    opt = make_optimizer(net, tr)
    sched, per_batch = make_schedule(opt, tr, epochs * batches)
    # The loss and the step as [train] asks: label smoothing as CrossEntropyLoss's (on the
    # network's log-probabilities), clip_grad_norm as torch.nn.utils.clip_grad_norm_.
    smoothing = float(tr.get("label_smoothing", 0))
    clip = float(tr.get("clip_grad_norm", 0))
    shuffled = data.get("shuffle", "1") != "0"
    patience, best_loss, best_epoch = int(tr.get("patience", 0)), float("inf"), 0
    for epoch in range(epochs):
        order = torch.tensor(shuffle(n, seed, epoch) if shuffled else list(range(n)))
        net.train()
        loss_sum, correct, seen, t0 = 0.0, 0, 0, time.perf_counter()
        for b0 in range(0, batches * batch, batch):
            idx = order[b0:b0 + batch]
            xb = normalise(augment(raw, idx, seed, epoch, pad, flip), data) if pad or flip else x[idx]
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
                out = net(xb.double() if args.double else xb)
            out = out.float() if args.bf16 else out
            loss = F.nll_loss(out, y[idx])
            if smoothing:
                loss = (1 - smoothing) * loss + smoothing * (-out.mean(1)).mean()
            opt.zero_grad()
            loss.backward()
            if clip:
                torch.nn.utils.clip_grad_norm_(net.parameters(), clip)
            opt.step()
            if per_batch:
                sched.step()
            loss_sum += loss.item() * len(idx)
            correct += (out.argmax(1) == y[idx]).sum().item()
            seen += len(idx)
            steps += 1
            if steps == args.steps:
                break
        seconds = time.perf_counter() - t0
        if per_batch is False:
            sched.step()
        line = {"impl": "pytorch", "epoch": epoch + 1, "train_loss": loss_sum / seen,
                "train_acc": 100.0 * correct / seen, "img_per_s": seen / seconds, "seconds": seconds}
        if xt is not None:
            net.eval()
            with torch.no_grad():
                tl, tc = 0.0, 0
                for b0 in range(0, xt.shape[0], 1000):
                    out = net(xt[b0:b0 + 1000])
                    tl += F.nll_loss(out, yt[b0:b0 + 1000], reduction="sum").item()
                    tc += (out.argmax(1) == yt[b0:b0 + 1000]).sum().item()
            line.update(val_loss=tl / xt.shape[0], val_acc=100.0 * tc / xt.shape[0])
            if per_batch is None:
                sched.step(line["val_loss"])
            if line["val_loss"] < best_loss:
                best_loss, best_epoch = line["val_loss"], epoch + 1
        if args.json:
            print(json.dumps(line), flush=True)
        else:
            print(f"pytorch epoch {line['epoch']}/{epochs}  train_loss {line['train_loss']:.4f}  "
                  f"train_acc {line['train_acc']:.2f}%" +
                  (f"  val_loss {line['val_loss']:.4f}  val_acc {line['val_acc']:.2f}%" if xt is not None else "") +
                  f"  {line['img_per_s']:.0f} img/s", flush=True)
        if steps == args.steps or (patience and xt is not None and epoch + 1 - best_epoch >= patience):
            break
    if args.save:
        st_torch.write(args.save, net.state_dict())


if __name__ == "__main__":
    main()
