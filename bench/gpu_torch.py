#!/usr/bin/env python3
"""PyTorch's side of bench/gpu_bench.sh (issue 18): trains a network on one GPU for a fixed
number of steps and prints images/s and the GPU memory it took; or, with --max-batch, the
largest batch whose training step fits a memory limit.

  gpu_torch.py [CFG] --size S --batch B --steps N [--channels C] [--warmup W]
               [--precision fp32|fp16] [--segments K|sqrt] [--compile] [--torchvision]
               [--device cuda|cpu] [--tf32 0|1] [--cudnn-benchmark 0|1] [--channels-last]
  gpu_torch.py [CFG] --size S --max-batch --limit-gb G [--start-batch B] [--max-batch-cap M] ...

The network is CFG's, built by bench/cfg_torch.py (the same layers, names and
initialisation as cnn.c; models/fashion.cfg is the seed network at 1x28x28), or with
--torchvision torchvision.models.resnet18(num_classes=10) at 3x224x224 by default
(bench/resnet_torch.py's layers_of builds both). The recipe is cnn.c's and
resnet_torch.py's: NLL loss of log_softmax, mean over the batch, Adadelta (lr 1.0, rho 0.9,
eps 1e-6); zero_grad(set_to_none=True). The data is one fixed batch of random normal
images and random labels of 10 classes, made on the device once: data loading is not
measured (cnn.c's side reads its batches through its loader and copies them to the GPU).

--precision fp16 runs forward and loss under torch.autocast(device_type='cuda',
dtype=torch.float16) with a GradScaler (on --device cpu: bfloat16 autocast and no scaler,
which is all a CPU build offers; the dry run only). --segments K > 1 runs the forward
through torch.utils.checkpoint.checkpoint_sequential over the top-level layers in K
segments (sqrt: round(sqrt(layers)), as cnn.c's checkpoint=sqrt), non-reentrant where
this torch has use_reentrant (2.x), reentrant otherwise (1.x, as resnet_torch.py).
--compile runs the network through torch.compile (default mode); a failure, also at the
first call, is printed as the JSON line's "error" with img_per_s null, exit 0.
--tf32 sets both torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
(default 0: no TF32 in fp32 runs, as cnn.c's matmul = auto; PyTorch's own default has TF32 on
for cuDNN convolutions). --cudnn-benchmark 1 (the default for timed runs) lets cuDNN pick
its fastest algorithms during the warm-up steps.

Timed runs: W warm-up steps (default 5; compilation and cuDNN's search happen there),
then the allocator's cache is emptied and its peak counters reset, one more untimed step,
then N steps between torch.cuda.synchronize() calls. Prints one JSON line:
  {"impl": "pytorch" | "pytorch-compile", "img_per_s", "peak_alloc_mb"
   (torch.cuda.max_memory_allocated: the tensors), "peak_reserved_mb"
   (max_memory_reserved: what the caching allocator took from the driver), "process_mb"
   (this process's whole GPU memory, context included, from nvidia-smi
   --query-compute-apps, null where nvidia-smi is missing or does not list this pid, as in
   a container with its own pid namespace), "device_used_mb" (the whole GPU's use from
   cudaMemGetInfo: this process's where it runs alone), "gpu", ...}
MB are 10^6 bytes, as cnn.c's plan and epoch line; limits (--limit-gb) are GiB, as
cnn.c's memory = 16G.

--max-batch: the largest batch (from --start-batch, doubling until a step fails, then
bisecting to 1) for which two training steps run within --limit-gb GiB. On CUDA the limit
is the whole process's, as cnn.c's memory = key counts its blocks plus the GPU baseline:
after one step at batch 1 what the process holds outside the caching allocator (context,
cuDNN and cuBLAS handles; nvidia-smi, else the GPU's use from cudaMemGetInfo) is taken off
the limit and the rest is given to torch.cuda.set_per_process_memory_fraction; a batch
fits when no torch.cuda.OutOfMemoryError is raised (after one, the cache is emptied and a
new GradScaler made). So a larger GPU shows what fits a 16 GB T4 (whose 15,360 MiB would
be --limit-gb 15). cuDNN's benchmark mode is off there (its algorithm search allocates
workspaces of its own). On --device cpu (a dry run of the search) a step's memory is a
stand-in: parameters, gradients, Adadelta's state and the tensors autograd saves for
backward. Prints one JSON line with "max_batch", "cap_mb", "outside_mb", the peaks at
max_batch and every trial.
"""

import argparse
import gc
import inspect
import json
import math
import os
import shutil
import subprocess
import sys
import time
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint_sequential

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import resnet_torch  # noqa: E402  (layers_of: the cfg's network via cfg_torch, or torchvision's resnet18)

MB = 1e6
REENTRANT = "use_reentrant" not in inspect.signature(checkpoint_sequential).parameters


def is_oom(e):
    """Out of memory: the allocator's error, or cuBLAS's or cuDNN's failing to allocate."""
    text = str(e)
    return isinstance(e, RuntimeError) and ("out of memory" in text.lower() or any(
        s in text for s in ("CUBLAS_STATUS_ALLOC_FAILED", "CUDNN_STATUS_ALLOC_FAILED",
                            "CUDNN_STATUS_NOT_ENOUGH_WORKSPACE")))


class Net(nn.Module):
    """The top-level layers in order, through checkpoint_sequential when segments > 1."""

    def __init__(self, layers, segments):
        super().__init__()
        self.seq = nn.Sequential(*layers)
        self.segments = segments

    def forward(self, x):
        if self.segments > 1:
            if REENTRANT:
                return checkpoint_sequential(self.seq, self.segments, x)
            return checkpoint_sequential(self.seq, self.segments, x, use_reentrant=False)
        return self.seq(x)


def process_mb():
    """This process's GPU memory (MB) from nvidia-smi, or None."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return None
    try:
        out = subprocess.run([exe, "--query-compute-apps=pid,used_memory",
                              "--format=csv,noheader,nounits"], capture_output=True,
                             text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0] == str(os.getpid()):
            try:
                return float(parts[1]) * 1048576 / MB  # MiB
            except ValueError:
                return None
    return None


def device_used_mb(dev):
    if dev.type != "cuda":
        return None
    free, total = torch.cuda.mem_get_info(dev)
    return (total - free) / MB


class Trainer:
    def __init__(self, args, dev):
        self.args, self.dev = args, dev
        layers = resnet_torch.layers_of(args)
        if args.segments == "sqrt":
            self.segments = round(math.sqrt(len(layers)))
        else:
            self.segments = int(args.segments)
        self.net = Net(layers, self.segments).to(dev)
        if args.channels_last:
            self.net = self.net.to(memory_format=torch.channels_last)
        self.gflop = None
        try:
            x1 = torch.randn(1, args.channels, args.size, args.size, device=dev)
            self.gflop = resnet_torch.gemm_gflop(self.net.seq, x1)
        except Exception:  # noqa: BLE001  (a figure for the JSON, not worth failing for)
            pass
        self.opt = torch.optim.Adadelta(self.net.parameters(), lr=1.0, rho=0.9, eps=1e-6)
        self.fp16 = args.precision == "fp16"
        self.amp_dtype = torch.float16 if dev.type == "cuda" else torch.bfloat16
        self.new_scaler()
        self.forward = self.net
        self.compile_error = None
        if args.compile:
            if not hasattr(torch, "compile"):
                self.compile_error = "torch.compile: not in torch %s" % torch.__version__
            else:
                try:
                    self.forward = torch.compile(self.net)
                except Exception as e:  # noqa: BLE001
                    self.compile_error = "torch.compile: %s: %s" % (type(e).__name__, e)

    def new_scaler(self):
        self.scaler = None
        if self.fp16 and self.dev.type == "cuda":
            if hasattr(torch, "amp") and hasattr(torch.amp, "GradScaler"):
                self.scaler = torch.amp.GradScaler("cuda")
            else:
                self.scaler = torch.cuda.amp.GradScaler()

    def batch(self, b):
        gen = torch.Generator(device=self.dev).manual_seed(1)  # made where it is used: no host copy
        x = torch.randn(b, self.args.channels, self.args.size, self.args.size, generator=gen, device=self.dev)
        y = torch.randint(0, 10, (b,), generator=gen, device=self.dev)
        if self.args.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        if self.segments > 1 and REENTRANT:
            x.requires_grad_(True)  # the reentrant checkpoint needs an input that wants a gradient
        return x, y

    def step(self, x, y):
        self.opt.zero_grad(set_to_none=True)
        with torch.autocast(device_type=self.dev.type, dtype=self.amp_dtype, enabled=self.fp16):
            loss = F.nll_loss(self.forward(x), y)
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
            self.scaler.step(self.opt)
            self.scaler.update()
        else:
            loss.backward()
            self.opt.step()

    def sync(self):
        if self.dev.type == "cuda":
            torch.cuda.synchronize(self.dev)


def info(args, dev, tr):
    return {"gpu": torch.cuda.get_device_name(dev) if dev.type == "cuda" else None,
            "device": dev.type, "precision": args.precision, "size": args.size,
            "channels": args.channels, "segments": tr.segments,
            "checkpoint": ("reentrant" if REENTRANT else "non-reentrant") if tr.segments > 1 else None,
            "torchvision": args.torchvision, "cfg": None if args.torchvision else args.cfg,
            "tf32": args.tf32, "channels_last": args.channels_last,
            "gflop_per_image": tr.gflop, "torch": torch.__version__}


def timed(args, dev):
    tr = Trainer(args, dev)
    out = {"impl": "pytorch-compile" if args.compile else "pytorch", "img_per_s": None,
           "batch": args.batch, "steps": args.steps, "warmup": args.warmup,
           "cudnn_benchmark": args.cudnn_benchmark}
    out.update(info(args, dev, tr))
    if tr.compile_error:
        out["error"] = tr.compile_error
        return out
    x, y = tr.batch(args.batch)
    try:
        for _ in range(args.warmup):
            tr.step(x, y)
        tr.sync()
        if dev.type == "cuda":
            torch.cuda.empty_cache()  # cuDNN's search and compilation are not the run's memory
            torch.cuda.reset_peak_memory_stats(dev)
        tr.step(x, y)
        tr.sync()
        t0 = time.perf_counter()
        for _ in range(args.steps):
            tr.step(x, y)
        tr.sync()
        seconds = time.perf_counter() - t0
    except Exception as e:  # noqa: BLE001  (compile errors surface at the first call; OOM)
        out["error"] = "%s: %s" % (type(e).__name__, str(e).strip().splitlines()[0] if str(e).strip() else "")
        return out
    out["img_per_s"] = args.batch * args.steps / seconds
    out["seconds"] = seconds
    if dev.type == "cuda":
        out["peak_alloc_mb"] = torch.cuda.max_memory_allocated(dev) / MB
        out["peak_reserved_mb"] = torch.cuda.max_memory_reserved(dev) / MB
        out["process_mb"] = process_mb()
        out["device_used_mb"] = device_used_mb(dev)
    else:
        out["peak_alloc_mb"] = out["peak_reserved_mb"] = out["process_mb"] = out["device_used_mb"] = None
    return out


def cpu_step_bytes(tr, x, y):
    """The dry run's stand-in for a step's memory on the CPU (see the module's docstring)."""
    saved = {}

    def pack(t):
        saved[(t.data_ptr(), t.dtype, tuple(t.shape))] = t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        tr.step(x, y)
    params = sum(p.numel() * p.element_size() for p in tr.net.parameters())
    return 4 * params + sum(saved.values()) + x.numel() * x.element_size()


def max_batch(args, dev):
    if dev.type == "cuda":
        torch.backends.cudnn.benchmark = False
    tr = Trainer(args, dev)
    limit = args.limit_gb * 2**30
    out = {"impl": "pytorch", "mode": "max_batch", "limit_gb": args.limit_gb}
    out.update(info(args, dev, tr))
    cap = limit
    if dev.type == "cuda":
        x, y = tr.batch(1)
        tr.step(x, y)
        tr.sync()
        del x, y
        reserved = torch.cuda.memory_reserved(dev)
        whole = process_mb()
        out["outside_from"] = "nvidia-smi" if whole is not None else "cudaMemGetInfo"
        if whole is None:
            whole = device_used_mb(dev)
        outside = max(0.0, whole * MB - reserved)
        total = torch.cuda.get_device_properties(dev).total_memory
        cap = limit - outside
        out["outside_mb"] = outside / MB
        out["total_mb"] = total / MB
        if cap <= 0:
            out["error"] = "the limit is less than what the process holds outside the allocator"
            return out
        torch.cuda.set_per_process_memory_fraction(min(1.0, cap / total), dev)
        torch.cuda.empty_cache()
    out["cap_mb"] = cap / MB
    trials, peaks = [], {}

    def fits(b):
        failed, peak, x, y = False, None, None, None
        try:
            x, y = tr.batch(b)
            if dev.type == "cuda":
                torch.cuda.reset_peak_memory_stats(dev)
                for _ in range(2):
                    tr.step(x, y)
                tr.sync()
                peak = (torch.cuda.max_memory_allocated(dev) / MB, torch.cuda.max_memory_reserved(dev) / MB)
            else:
                est = cpu_step_bytes(tr, x, y)
                failed = est > cap
                peak = (est / MB, None)
        except Exception as e:  # noqa: BLE001
            if not is_oom(e):
                raise
            failed = True
        # Out of the except block: the traceback's frames and the tensors they held are gone.
        x = y = None
        if failed:
            tr.opt.zero_grad(set_to_none=True)
            gc.collect()
            if dev.type == "cuda":
                torch.cuda.empty_cache()
            tr.new_scaler()  # a step cut short can leave the scaler between unscale_ and update
        trials.append({"batch": b, "fits": not failed,
                       "peak_alloc_mb": None if failed else peak[0],
                       "peak_reserved_mb": None if failed else peak[1]})
        if not failed:
            peaks[b] = peak
        print("  batch %d: %s" % (b, "fits" if not failed else "does not fit"), file=sys.stderr, flush=True)
        return not failed

    lo, hi = 0, None  # lo fits (0: none yet), hi does not
    b = args.start_batch
    while True:  # halving below the start, doubling above it
        if fits(b):
            lo = b
            if lo >= args.max_batch_cap:
                break
            if hi is not None:
                break
            b = min(2 * b, args.max_batch_cap)
        else:
            hi = b
            if lo or b == 1:
                break
            b //= 2
    while hi is not None and hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    out["max_batch"] = lo
    out["capped"] = hi is None
    if lo in peaks:
        out["peak_alloc_mb"], out["peak_reserved_mb"] = peaks[lo]
    out["trials"] = trials
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("cfg", nargs="?", help="a cnn.c cfg (not with --torchvision)")
    p.add_argument("--torchvision", action="store_true", help="torchvision's resnet18(num_classes=10)")
    p.add_argument("--size", type=int, help="image height and width (28 for a cfg, 224 with --torchvision)")
    p.add_argument("--channels", type=int, help="1 for a cfg, 3 with --torchvision")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--precision", choices=("fp32", "fp16"), default="fp32")
    p.add_argument("--segments", default="1", help="K, or sqrt")
    p.add_argument("--compile", action="store_true")
    p.add_argument("--device", default="cuda")
    p.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: torch's default)")
    p.add_argument("--tf32", type=int, choices=(0, 1), default=0)
    p.add_argument("--cudnn-benchmark", type=int, choices=(0, 1), default=1)
    p.add_argument("--channels-last", action="store_true")
    p.add_argument("--max-batch", action="store_true", help="find the largest batch within --limit-gb")
    p.add_argument("--limit-gb", type=float, default=16.0, help="GiB, the whole process's (CUDA)")
    p.add_argument("--start-batch", type=int, default=16)
    p.add_argument("--max-batch-cap", type=int, default=1 << 16)
    args = p.parse_args()
    if not args.torchvision and not args.cfg:
        p.error("a cfg file or --torchvision")
    if args.size is None:
        args.size = 224 if args.torchvision else 28
    if args.channels is None:
        args.channels = 3 if args.torchvision else 1
    if args.threads:
        torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")  # checkpoint's use_reentrant notice, GradScaler's deprecation
    dev = torch.device(args.device)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            sys.exit("gpu_torch.py: this torch (%s) sees no CUDA GPU; --device cpu for a dry run" % torch.__version__)
        if dev.index is None:  # set_per_process_memory_fraction and others want an index
            dev = torch.device("cuda", torch.cuda.current_device())
        torch.backends.cuda.matmul.allow_tf32 = bool(args.tf32)
        torch.backends.cudnn.allow_tf32 = bool(args.tf32)
        torch.backends.cudnn.benchmark = bool(args.cudnn_benchmark)
    out = max_batch(args, dev) if args.max_batch else timed(args, dev)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
