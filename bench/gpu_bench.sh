#!/bin/sh
# Issue 18: cnn.c against PyTorch on the same GPU, speed and memory, for the same network,
# batch and precision (bench/gpu_torch.py is PyTorch's side).
#   sh bench/gpu_bench.sh OUTDIR        (gpu/run.sh's bench stage; ./train and
#                                        build/bench/make_folders must be built)
#   ROUNDS=3 ROWS="fashion:64 resnet18:256" COMPILE=plain MAXBATCH=1 LIMIT_GB=15 TF32=0
#   DRY=1: device=cpu on both sides (threads 2), resnet18 at batch 4 and 8, a few steps a run
#          and a 0.25 GiB limit (DRY_LIMIT_GB), to check the script where there is no GPU: the
#          numbers mean nothing (about 1.5 minutes on 2 cores)
# On an H200 (bench/RESULTS.md, "GPU: the fifth run") round 1 with torch.compile's rows took
# 350 s, so these defaults (three rounds, then MAXBATCH's search) need well over 10
# minutes: more than one call of a borrowed GPU. gpu/run.sh's bench stage runs ROUNDS=2
# COMPILE=none MAXBATCH=0 unless told otherwise.
# Rows (ROWS picks them by name:batch): the seed network (models/fashion.cfg) on
# Fashion-MNIST at batch 64 and 512, fp32 and fp16; models/resnet18.cfg at 224x224 RGB
# (torchvision's resnet18 on PyTorch's side, as bench/resnet_bench.sh) at batch 64 and 256,
# fp16, plain and checkpoint=sqrt (PyTorch: checkpoint_sequential over round(sqrt(16)) = 4
# segments). Each cnn.c run trains two epochs with device=cuda and quotes the second epoch's
# line (stop_after ends a run without one, hence whole epochs of small data sets): img/s and `gpu M MB (plan P MB)`, the device memory its allocations take (measured
# with cudaMemGetInfo, the CUDA context and cuBLAS's workspace not counted) and the plan's
# blocks. Its data: FASHION_PER_CLASS (2048) images of each class of the Fashion-MNIST IDX
# files in $FASHION (else $FASHION_MNIST, else /usr/share/datasets/fashion-mnist), and for
# resnet18 a folder of those images as PNGs, resized to 224x224 RGB through a decoded cache;
# cnn.c reads every batch through its loader (WORKERS=4 threads) and copies it to the GPU,
# so "wait" is the share of the epoch it waited for the loader. PyTorch trains one fixed
# random batch already on the GPU, eager (cuDNN benchmark mode, 5 warm-up steps, then
# steps between torch.cuda.synchronize() calls); TF32 (default 0) is the same on both
# sides (PyTorch's own default uses TF32 for fp32 convolutions; cnn.c's matmul = auto is fp32 in fp32 runs);
# fp16 is torch.autocast + GradScaler against cnn.c's precision=fp16. torch.compile runs in
# round 1 only, on the rows without checkpointing (COMPILE=all: also checkpoint=sqrt;
# none: never); its failures are listed under the table. Rounds alternate which side goes
# first; img/s are means with each round's in brackets, ratio = cnn.c / PyTorch eager.
# Memory (round 1): cnn.c's plan and measured MB; PyTorch's max_memory_allocated (its
# tensors), max_memory_reserved (what its caching allocator took) and the whole process's
# (nvidia-smi, context included; ~N: the whole GPU's use from cudaMemGetInfo where
# nvidia-smi does not list the process); memory = cnn.c measured / PyTorch allocated.
# MB are 10^6 bytes. Then (MAXBATCH=1) the largest batch of resnet18 at 224x224, fp16,
# checkpoint=sqrt whose training fits LIMIT_GB GiB of GPU memory in all, context included:
# cnn.c by doubling and bisection on `./train --plan memory=<LIMIT>` ("fits as configured":
# the plan's GPU blocks plus the GPU's baseline fit, nothing changed by the budget chooser),
# then trained for 2 batches of that size to check it (the epoch line's measured MB against
# the plan); PyTorch by doubling and bisection on
# training steps under torch.cuda.set_per_process_memory_fraction (gpu_torch.py
# --max-batch). A T4 sold as 16 GB reports 15,360 MiB: LIMIT_GB=15 is that card.
# Python: $PYTHON, else python3 (DRY: /usr/bin/python3, Debian's python3-torch).
set -u
OUTARG=${1:?usage: sh bench/gpu_bench.sh OUTDIR}
mkdir -p "$OUTARG" && OUT=$(cd "$OUTARG" && pwd)
cd "$(dirname "$0")/.." || exit 1
DRY=${DRY:-0}
ROUNDS=${ROUNDS:-3}
COMPILE=${COMPILE:-plain}
MAXBATCH=${MAXBATCH:-1}
LIMIT_GB=${LIMIT_GB:-15}
TF32=${TF32:-0}
WORKERS=${WORKERS:-4}
FASHION=${FASHION:-${FASHION_MNIST:-/usr/share/datasets/fashion-mnist}}
export FASHION_MNIST="$FASHION"  # build/bench/make_folders reads it
TORCH_ARGS=${TORCH_ARGS:-}       # more gpu_torch.py options for every timed run (--channels-last)
# name:batch cfg channels size cnn.c-batches-an-epoch(resnet18) PyTorch-steps variants [torchvision]
if [ "$DRY" = 1 ]; then
    DEV=cpu
    THREADS=${THREADS:-2}
    PYTHON=${PYTHON:-/usr/bin/python3}
    FASHION_PER_CLASS=${FASHION_PER_CLASS:-52}
    LIMIT_GB=${DRY_LIMIT_GB:-0.25}
    START=2 CAP=16
    ALL="fashion:64 models/fashion.cfg 1 28 - 4 fp32:none,fp16:none
fashion:512 models/fashion.cfg 1 28 - 2 fp32:none,fp16:none
resnet18:4 models/resnet18.cfg 3 224 6 2 fp16:none,fp16:sqrt torchvision
resnet18:8 models/resnet18.cfg 3 224 3 2 fp16:none,fp16:sqrt torchvision"
    WARMUP=1
else
    DEV=cuda
    THREADS=${THREADS:-0}
    PYTHON=${PYTHON:-python3}
    FASHION_PER_CLASS=${FASHION_PER_CLASS:-2048}
    START=64 CAP=65536
    ALL="fashion:64 models/fashion.cfg 1 28 - 300 fp32:none,fp16:none
fashion:512 models/fashion.cfg 1 28 - 60 fp32:none,fp16:none
resnet18:64 models/resnet18.cfg 3 224 20 30 fp16:none,fp16:sqrt torchvision
resnet18:256 models/resnet18.cfg 3 224 8 12 fp16:none,fp16:sqrt torchvision"
    WARMUP=5
fi
ROWS=${ROWS:-$(echo "$ALL" | cut -d' ' -f1)}
LIMIT_MIB=$(awk -v g="$LIMIT_GB" 'BEGIN { printf "%d", g * 1024 }')
TDEV="--device $DEV"
[ "$THREADS" != 0 ] && TTHR="--threads $THREADS" || TTHR=
TIMEOUT=; command -v timeout > /dev/null && TIMEOUT="timeout ${COMPILE_TIMEOUT:-300}"

row() { echo "$ALL" | awk -v r="$1" '$1 == r'; }
for name in $ROWS; do
    [ -n "$(row "$name")" ] || { echo "gpu_bench.sh: no row $name; rows: $(echo "$ALL" | cut -d' ' -f1 | tr '\n' ' ')" >&2; exit 2; }
done
for f in ./train build/bench/make_folders; do
    [ -x "$f" ] || { echo "gpu_bench.sh: no $f: build it first (make train build/bench/make_folders; on the GPU machine sh gpu/run.sh OUT bench builds and runs this)" >&2; exit 2; }
done
rm -rf "$OUT/runs"
mkdir -p "$OUT/runs" "$OUT/data"
T0=$(date +%s)
elapsed() { echo "$(( $(date +%s) - T0 )) s"; }
{
    echo "cnn.c $(git rev-parse --short HEAD 2>/dev/null || echo '(no git)')$(git status --porcelain 2>/dev/null | grep -q . && echo ' + local changes'); $(date -u '+%Y-%m-%d %H:%M UTC')"
    if [ "$DRY" = 1 ]; then
        echo "DRY=1: device=cpu on both sides, threads $THREADS, tiny runs (the numbers mean nothing)"
    else
        echo "GPU: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | head -1)"
    fi
    echo "PyTorch: $("$PYTHON" -c 'import torch; print(torch.__version__, "CUDA", torch.version.cuda, "cuDNN", torch.backends.cudnn.version())' 2>&1 | tail -1) ($PYTHON)"
    echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores"
} | tee "$OUT/machine.txt"

THR=; [ "$THREADS" != 0 ] && THR="threads=$THREADS"

# The data: a Fashion-MNIST subset as IDX files, and PNG folders with their caches.
SUB=$OUT/data/fashion-$FASHION_PER_CLASS
if [ ! -f "$SUB-labels-idx1-ubyte" ]; then
    "$PYTHON" bench/idx_subset.py "$FASHION/train-images-idx3-ubyte.gz" "$FASHION/train-labels-idx1-ubyte.gz" \
        "$SUB" --classes 0,1,2,3,4,5,6,7,8,9 --per-class "$FASHION_PER_CLASS" > /dev/null ||
        { echo "gpu_bench.sh: no Fashion-MNIST in $FASHION (FASHION=DIR)" >&2; exit 1; }
fi
FAILED=0
data_args() {  # cfg channels size images: the cnn.c data keys of a row
    if [ "$4" = - ]; then
        echo "train=$SUB-images-idx3-ubyte train_labels=$SUB-labels-idx1-ubyte test=none test_labels=none val_split=0"
    else
        folder=$OUT/data/png28_$4
        [ -d "$folder" ] || build/bench/make_folders "$folder" png28 "$4" > /dev/null || return 1
        echo "train=$folder train_labels=none test=none test_labels=none val_split=0 width=$3 height=$3 \
channels=$2 mean=0.5 std=0.25 flip=0 cache=$OUT/data/cache-$3-$2-$4"
    fi
}

# A row's fields: R_NAME R_CFG R_CH R_SIZE R_NB (cnn.c batches an epoch, - for the IDX
# subset) R_STEPS (PyTorch's) R_TV (--torchvision or empty) R_BATCH.
fields() {
    set -- $(row "$1")
    R_NAME=$1 R_CFG=$2 R_CH=$3 R_SIZE=$4 R_NB=$5 R_STEPS=$6 R_TV=
    [ "${8:-}" = torchvision ] && R_TV=--torchvision
    R_BATCH=${1#*:}
}

cnn() {  # row precision checkpoint round
    fields "$1"
    images=-; [ "$R_NB" != - ] && images=$((R_NB * R_BATCH))
    run="$OUT/runs/cnn-${R_NAME%:*}-$R_BATCH-$2-$3-$4"
    if ! d=$(data_args "$R_CFG" "$R_CH" "$R_SIZE" "$images"); then
        echo "gpu_bench.sh: make_folders failed" >&2; FAILED=$((FAILED + 1)); return
    fi
    ./train "$R_CFG" $d device=$DEV batch="$R_BATCH" precision="$2" checkpoint="$3" epochs=2 \
        matmul="$([ "$TF32" = 1 ] && echo tf32 || echo auto)" workers="$WORKERS" $THR save="$run" > "$run.log" 2>&1
    rc=$?
    if [ $rc -ne 0 ]; then
        FAILED=$((FAILED + 1))
        echo "cnn.c   $R_NAME $2 checkpoint=$3: FAILED (exit $rc), $run.log:"
        tail -3 "$run.log" | sed 's/^/    /'
        return
    fi
    echo "cnn.c   $R_NAME $2 checkpoint=$3: $(grep '^epoch 2/2' "$run.log")"
}

torch() {  # row precision checkpoint round [compile]
    fields "$1"
    seg=1; [ "$3" = sqrt ] && seg=sqrt
    if [ -n "${5:-}" ]; then
        run="$OUT/runs/torchc-${R_NAME%:*}-$R_BATCH-$2-$3-$4.json" flag=--compile to=$TIMEOUT
    else
        run="$OUT/runs/torch-${R_NAME%:*}-$R_BATCH-$2-$3-$4.json" flag= to=
    fi
    $to "$PYTHON" bench/gpu_torch.py "$R_CFG" $R_TV --channels "$R_CH" --size "$R_SIZE" \
        --batch "$R_BATCH" --steps "$R_STEPS" --warmup "$WARMUP" --precision "$2" \
        --segments "$seg" --tf32 "$TF32" $flag $TDEV $TTHR $TORCH_ARGS > "$run" 2> "${run%.json}.err"
    rc=$?
    if [ $rc -ne 0 ] || ! grep -q '^{' "$run"; then
        [ -n "$flag" ] || FAILED=$((FAILED + 1))
        msg="exit $rc$([ $rc = 124 ] && echo ', timed out'): $(grep -v '^ *$' "${run%.json}.err" | tail -1)"
        printf '{"impl": "pytorch%s", "img_per_s": null, "error": "%s"}\n' "${flag:+-compile}" \
            "$(echo "$msg" | tr -d '"\\' | cut -c1-300)" > "$run"
    fi
    echo "PyTorch${flag:+ compile} $R_NAME $2 checkpoint=$3: $(cat "$run")"
}

# The order of a round: each variant's PyTorch run next to its cnn.c run, rounds alternating
# which goes first (the compiled run, round 1 only, after both).
for r in $(seq "$ROUNDS"); do
    echo "== round $r ($(elapsed))"
    for name in $ROWS; do
        for v in $(row "$name" | cut -d' ' -f7 | tr ',' ' '); do
            p=${v%:*} c=${v#*:}
            if [ $((r % 2)) -eq 0 ]; then torch "$name" "$p" "$c" "$r"; fi
            cnn "$name" "$p" "$c" "$r"
            if [ $((r % 2)) -eq 1 ]; then torch "$name" "$p" "$c" "$r"; fi
            if [ "$r" = 1 ] && { [ "$COMPILE" = all ] || { [ "$COMPILE" = plain ] && [ "$c" = none ]; }; }; then
                torch "$name" "$p" "$c" "$r" compile
            fi
        done
    done
done

# The largest batch within LIMIT_GB: resnet18, 224x224, fp16, checkpoint=sqrt.
if [ "$MAXBATCH" = 1 ]; then
    echo "== largest batch within $LIMIT_GB GiB ($(elapsed))"
    IMG=$(data_args models/resnet18.cfg 3 224 64)
    MAXD="$OUT/runs/maxbatch"
    mkdir -p "$MAXD"
    fits() {  # batch: the plan fits the budget as configured
        ./train models/resnet18.cfg $IMG device=$DEV batch="$1" precision=fp16 checkpoint=sqrt \
            memory="${LIMIT_MIB}M" $THR --plan > "$MAXD/plan-$1.log" 2>&1 &&
            grep -q 'fits as configured' "$MAXD/plan-$1.log"
        ok=$?
        echo "  cnn.c batch $1: $([ $ok = 0 ] && echo fits || echo 'does not fit'): $(head -1 "$MAXD/plan-$1.log")"
        return $ok
    }
    lo=0 hi= b=$START
    while :; do  # halving below START, doubling above it, then bisection
        if fits "$b"; then
            lo=$b
            [ "$lo" -ge "$CAP" ] || [ -n "$hi" ] && break
            b=$((2 * b)); [ "$b" -gt "$CAP" ] && b=$CAP
        else
            hi=$b
            [ "$lo" -gt 0 ] || [ "$b" = 1 ] && break
            b=$((b / 2))
        fi
    done
    while [ -n "$hi" ] && [ $((hi - lo)) -gt 1 ]; do
        mid=$(((lo + hi) / 2))
        if fits "$mid"; then lo=$mid; else hi=$mid; fi
    done
    echo "$lo ${hi:-capped}" > "$MAXD/cnn-max.txt"
    if [ "$lo" -gt 0 ]; then
        ./train models/resnet18.cfg $IMG device=$DEV batch="$lo" precision=fp16 checkpoint=sqrt \
            memory="${LIMIT_MIB}M" $THR --plan --json > "$MAXD/plan-max.json" 2> "$MAXD/plan-max.err"
        # Checked: one epoch of 2 batches of that size trained (more where 2 batches are fewer
        # than the 24 images that the folder needs for a file in every class).
        nv=2; [ $((2 * lo)) -lt 24 ] && nv=$(((24 + lo - 1) / lo))
        echo "$nv" > "$MAXD/verify-batches.txt"
        VIMG=$(data_args models/resnet18.cfg 3 224 $((nv * lo)))
        if ./train models/resnet18.cfg $VIMG device=$DEV batch="$lo" precision=fp16 checkpoint=sqrt \
                memory="${LIMIT_MIB}M" epochs=1 workers="$WORKERS" $THR save="$MAXD/verify" > "$MAXD/verify.log" 2>&1; then
            echo "  cnn.c trained $nv batches of $lo: $(grep -E '^memory =' "$MAXD/verify.log")"
            echo "    $(grep '^epoch 1/1' "$MAXD/verify.log")"
        else
            FAILED=$((FAILED + 1))
            echo "  cnn.c trained $nv batches of $lo: FAILED, $MAXD/verify.log:"
            tail -3 "$MAXD/verify.log" | sed 's/^/    /'
        fi
    fi
    "$PYTHON" bench/gpu_torch.py --torchvision --precision fp16 --segments sqrt --max-batch \
        --limit-gb "$LIMIT_GB" --start-batch "$START" --max-batch-cap "$CAP" $TDEV $TTHR \
        > "$MAXD/torch.json" 2> "$MAXD/torch.err" ||
        { FAILED=$((FAILED + 1)); echo "  PyTorch --max-batch: FAILED, $MAXD/torch.err:"; tail -3 "$MAXD/torch.err"; }
    sed 's/^/  PyTorch/' "$MAXD/torch.err" | grep 'batch'
fi
echo "== done ($(elapsed))"

"$PYTHON" - "$OUT" "$ROUNDS" "$ROWS" "$ALL" "$MAXBATCH" "$LIMIT_GB" <<'PY'
import json, os, re, sys
out, rounds, rows, table, maxbatch, limit = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(), sys.argv[4], sys.argv[5], sys.argv[6]
spec = {l.split()[0]: l.split() for l in table.splitlines()}
runs = out + "/runs"

def cnn(name, p, c, r):
    n, b = name.split(":")
    try:
        text = open("%s/cnn-%s-%s-%s-%s-%d.log" % (runs, n, b, p, c, r)).read()
    except OSError:
        return {}
    line = [l for l in text.splitlines() if l.startswith("epoch 2/2")]
    if not line:
        return {}
    line = line[-1]
    m = re.search(r"\s([0-9.]+) img/s", line)
    g = re.search(r"gpu ([0-9.]+) MB \(plan ([0-9.]+) MB\)", line)
    w = re.search(r"data wait [0-9.]+ s \(([0-9]+)%\)", line)
    return {"img_per_s": float(m.group(1)) if m else None,
            "gpu_mb": float(g.group(1)) if g else None, "plan_mb": float(g.group(2)) if g else None,
            "wait": int(w.group(1)) if w else None}

def torch(name, p, c, r, compiled=False):
    n, b = name.split(":")
    try:
        return json.loads(open("%s/torch%s-%s-%s-%s-%s-%d.json" % (runs, "c" if compiled else "", n, b, p, c, r)).read())
    except (OSError, ValueError):
        return None

mean = lambda v: sum(v) / len(v)
num = lambda x, f="%.0f": "-" if x is None else f % x

def each(v):
    if not v or any(x is None for x in v):
        return "fail" if v else "-"
    f = "%.1f" if mean(v) < 100 else "%.0f"
    return "%s [%s]" % (f % mean(v), " ".join(f % x for x in v))

print()
print(open(out + "/machine.txt").read().rstrip())
print("img/s: means of %d round(s), each round's in brackets; ratio = cnn.c / PyTorch eager; "
      "memory of round 1 in MB (10^6 bytes): cnn.c's plan and measured use, PyTorch's "
      "max_memory_allocated, max_memory_reserved and process (~: the whole GPU's); "
      "memory = cnn.c measured / PyTorch allocated; wait: cnn.c's loader wait" % rounds)
hdr = ("row", "cnn.c img/s", "PyTorch img/s", "ratio", "compile", "plan", "cnn.c", "alloc", "reserved", "process", "memory", "wait")
fmt = "%-22s %24s %24s %6s %8s %7s %7s %7s %8s %8s %6s %5s"
print(fmt % hdr)
errors = []
for name in rows:
    for v in spec[name][6].split(","):
        p, c = v.split(":")
        mine = [cnn(name, p, c, r).get("img_per_s") for r in range(1, rounds + 1)]
        refs = [torch(name, p, c, r) for r in range(1, rounds + 1)]
        ref = [t.get("img_per_s") if t else None for t in refs]
        ratio = "-" if None in mine or None in ref else "%.2fx" % (mean(mine) / mean(ref))
        comp = torch(name, p, c, 1, True)
        if comp is None:
            cs = "-"
        elif comp.get("img_per_s") is None:
            cs = "error"
            errors.append("%s %s %s: %s" % (name, p, c, comp.get("error")))
        else:
            cs = "%.0f" % comp["img_per_s"]
        for t in refs:
            if t and t.get("error"):
                errors.append("%s %s %s eager: %s" % (name, p, c, t["error"]))
        m1, t1 = cnn(name, p, c, 1), refs[0] or {}
        proc = num(t1.get("process_mb"))
        if t1.get("process_mb") is None and t1.get("device_used_mb") is not None:
            proc = "~%.0f" % t1["device_used_mb"]
        mem = "-"
        if m1.get("gpu_mb") is not None and t1.get("peak_alloc_mb"):
            mem = "%.2fx" % (m1["gpu_mb"] / t1["peak_alloc_mb"])
        print(fmt % ("%s %s %s" % (name, p, c), each(mine), each(ref), ratio, cs, num(m1.get("plan_mb")),
                     num(m1.get("gpu_mb")), num(t1.get("peak_alloc_mb")), num(t1.get("peak_reserved_mb")),
                     proc, mem, num(m1.get("wait"), "%d%%")))
for e in errors:
    print("  " + e)

if maxbatch == "1":
    d = runs + "/maxbatch"
    print()
    print("largest batch within %s GiB of GPU memory, context included: resnet18 224x224, fp16, checkpoint=sqrt" % limit)
    best = {}
    try:
        lo, hi = open(d + "/cnn-max.txt").read().split()
        best["cnn"] = int(lo)
        s = "  cnn.c   %6s" % lo
        if hi == "capped":
            s += "  (the search's cap)"
        elif lo != "0":
            s += "  (%s does not fit)" % hi
        try:
            plan = json.loads(open(d + "/plan-max.json").read().splitlines()[-1])
            s += "; plan %.0f MB on the %s + baseline %.0f MB" % (plan["on_device"] / 1e6, "GPU" if plan["device"] != "cpu" else "CPU", plan["baseline"] / 1e6)
        except (OSError, ValueError, KeyError, IndexError):
            pass
        try:
            v = [l for l in open(d + "/verify.log").read().splitlines() if l.startswith("epoch 1/1")]
            g = re.search(r"gpu ([0-9.]+) MB \(plan ([0-9.]+) MB\)", v[-1]) if v else None
            s += "; trained %s batches: %s" % (open(d + "/verify-batches.txt").read().strip(), ("gpu %s MB (plan %s MB)" % g.groups()) if g else
                                             ("ok, peak %s" % re.search(r"peak ([0-9]+ MB)", v[-1]).group(1)) if v else "FAILED")
        except OSError:
            pass
        print(s)
    except (OSError, ValueError):
        print("  cnn.c   -")
    try:
        t = json.loads(open(d + "/torch.json").read().splitlines()[-1])
        s = "  PyTorch %6s" % t.get("max_batch", "-")
        best["torch"] = t.get("max_batch")
        if t.get("error"):
            s += "  error: %s" % t["error"]
        else:
            fails = [x["batch"] for x in t["trials"] if not x["fits"]]
            s += "  (%s)" % ("the search's cap" if t.get("capped") else "%d does not fit" % min(x for x in fails if x > t["max_batch"]))
            s += "; allocator cap %.0f MB" % t["cap_mb"]
            if t.get("outside_mb") is not None:
                s += " = the limit less %.0f MB outside the allocator (%s)" % (t["outside_mb"], t["outside_from"])
            s += "; at the batch: allocated %s MB, reserved %s MB" % (num(t.get("peak_alloc_mb")), num(t.get("peak_reserved_mb")))
            if t["device"] == "cpu":
                s += " (cpu: the dry run's stand-in)"
        print(s)
    except (OSError, ValueError, IndexError, KeyError):
        print("  PyTorch -")
    if best.get("cnn") and best.get("torch"):
        print("  cnn.c / PyTorch %.2fx" % (best["cnn"] / best["torch"]))
PY
[ "$FAILED" = 0 ] || { echo "gpu_bench.sh: $FAILED run(s) failed (logs in $OUT/runs)"; exit 1; }
