#!/bin/sh
# make bench, deep networks (issue 15): cnn.c against PyTorch (Debian's python3-torch,
# bench/resnet_torch.py) on the same cores in the same run, for models/deep.cfg,
# models/resnet-small.cfg at 64x64 RGB and models/resnet18.cfg, resnet34.cfg, resnet50.cfg
# and mobilenet_v2.cfg at 224x224 (torchvision's models on PyTorch's side), plain and with
# activation checkpointing, fp32 and fp16.
#   THREADS=2 ROUNDS=3 ROWS="resnet-small:64" sh bench/resnet_bench.sh
# ROWS picks rows by name:batch (all of them by default). Each cnn.c run trains two epochs
# of STEPS batches of a folder of Fashion-MNIST PNGs resized to the row's size (decoded
# once into a cache), and its second epoch's img/s and the process's peak RSS are quoted;
# PyTorch trains on one fixed random batch, one warm-up step and STEPS timed ones. PyTorch
# has no fp16 on the CPU: its fp32 runs are the reference for both precisions, and
# checkpoint_sequential over round(sqrt(layers)) segments for checkpoint=sqrt. Each
# PyTorch run lies next to the cnn.c runs it is compared with (this machine's speed swings
# by 30-50% over tens of seconds); rounds alternate which side goes first; the ratio is of
# the means. VARIANTS picks cnn.c's precision:checkpoint pairs (all four by default);
# CNN_ARGS adds keys to every cnn.c run and TORCH_ARGS flags to every PyTorch run, e.g. the
# lossy savers against PyTorch's plain SGD (--sgd: lr 0.01, momentum 0.9):
#   ROWS=resnet18:32 VARIANTS=fp32:none TORCH_ARGS=--sgd CNN_ARGS="optimizer=sgd lr=0.01
#   momentum=0.9 fused_update=1 prefetch=1 compress=2 optimizer_state=int8" sh bench/resnet_bench.sh
set -e
cd "$(dirname "$0")/.."
THREADS=${THREADS:-2}
ROUNDS=${ROUNDS:-3}
# name:batch cfg channels size steps [torchvision [sgd]] (sgd: the cfg's optimizer is SGD
# with momentum, and PyTorch's is too)
ALL="deep:64 models/deep.cfg 1 28 20
resnet-small:64 models/resnet-small.cfg 3 64 10
resnet18:16 models/resnet18.cfg 3 224 4 torchvision
resnet18:32 models/resnet18.cfg 3 224 3 torchvision
resnet34:32 models/resnet34.cfg 3 224 3 torchvision
resnet50:16 models/resnet50.cfg 3 224 6 torchvision
mobilenet_v2:32 models/mobilenet_v2.cfg 3 224 3 torchvision sgd"
ROWS=${ROWS:-$(echo "$ALL" | cut -d' ' -f1)}
VARIANTS=${VARIANTS:-fp32:none fp16:none fp32:sqrt fp16:sqrt}
OUT=bench/out/resnet
make -s train build/bench/sgemm build/bench/make_folders
rm -rf "$OUT/runs"
mkdir -p "$OUT/runs"
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores, threads $THREADS; $(uptime | sed 's/.*load/load/')"
build/bench/sgemm "$THREADS" > "$OUT/sgemm.log"
tail -n 1 "$OUT/sgemm.log"

row() { echo "$ALL" | awk -v r="$1" '$1 == r'; }

cnn() {  # row precision checkpoint round
    set -- $(row "$1") "$2" "$3" "$4"
    name=$1 cfg=$2 ch=$3 size=$4 steps=$5; shift 5
    [ "$1" = torchvision ] && shift
    [ "$1" = sgd ] && shift
    batch=${name#*:} p=$1 c=$2 r=$3
    folder=$OUT/png28_$((steps * batch))
    [ -d "$folder" ] || build/bench/make_folders "$folder" png28 $((steps * batch)) > /dev/null
    run="$OUT/runs/cnn-${name%:*}-$batch-$p-$c-$r"
    ./train "$cfg" train="$folder" train_labels=none test=none test_labels=none val_split=0 \
        width="$size" height="$size" channels="$ch" mean=0.5 std=0.25 flip=0 batch="$batch" \
        epochs=2 precision="$p" checkpoint="$c" threads="$THREADS" \
        cache="$OUT/cache-$size-$ch-$((steps * batch))" save="$run" $CNN_ARGS > "$run.log"
    echo "cnn.c   $name $p checkpoint=$c: $(grep '^epoch 2/2' "$run.log")"
}

torch() {  # row checkpoint round
    set -- $(row "$1") "$2" "$3"
    name=$1 cfg=$2 ch=$3 size=$4 steps=$5; shift 5
    tv=; [ "$1" = torchvision ] && tv=--torchvision && shift
    [ "$1" = sgd ] && tv="$tv --sgd" && shift
    seg=1; [ "$1" = sqrt ] && seg=sqrt
    run="$OUT/runs/torch-${name%:*}-${name#*:}-$1-$2.json"
    /usr/bin/python3 bench/resnet_torch.py "$cfg" $tv --channels "$ch" --size "$size" \
        --batch "${name#*:}" --steps "$steps" --threads "$THREADS" --segments "$seg" $TORCH_ARGS > "$run"
    echo "PyTorch $name checkpoint=$1: $(cat "$run")"
}

for r in $(seq "$ROUNDS"); do
    for name in $ROWS; do
        [ -n "$(row "$name")" ] || { echo "resnet_bench.sh: no row $name; rows: $(echo "$ALL" | cut -d' ' -f1 | tr '\n' ' ')" >&2; exit 2; }
        for c in none sqrt; do  # each PyTorch run next to the cnn.c runs it is the reference of
            case " $VARIANTS " in *":$c "*) ;; *) continue ;; esac
            if [ $((r % 2)) -eq 0 ]; then torch "$name" $c "$r"; fi
            for p in fp32 fp16; do
                case " $VARIANTS " in *" $p:$c "*) cnn "$name" $p $c "$r" ;; esac
            done
            if [ $((r % 2)) -eq 1 ]; then torch "$name" $c "$r"; fi
        done
    done
done

/usr/bin/python3 - "$OUT" "$ROUNDS" "$ROWS" "$VARIANTS" <<'PY'
import json, sys
out, rounds, rows, variants = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(), sys.argv[4].split()
ceiling = json.loads(open(out + "/sgemm.log").read().splitlines()[-1])["sgemm_ceiling_gflops"]

def cnn(name, p, c, r):
    n, b = name.split(":")
    return [json.loads(l) for l in open("%s/runs/cnn-%s-%s-%s-%s-%d/metrics.jsonl" % (out, n, b, p, c, r))][-1]

def torch(name, c, r):
    n, b = name.split(":")
    return json.loads(open("%s/runs/torch-%s-%s-%s-%d.json" % (out, n, b, c, r)).read())

mean = lambda v: sum(v) / len(v)
each = lambda v, f: "%s [%s]" % (f % mean(v), " ".join(f % x for x in v))
print()
print("sgemm ceiling %.1f GFLOP/s; means of %d round(s), each round's in brackets; peak RSS of "
      "round 1; GFLOP/s from the step's GEMM work" % (ceiling, rounds))
print("%-16s %-11s %22s %22s %7s %9s %7s %9s %9s %7s" % ("network:batch", "cnn.c", "cnn.c img/s",
      "PyTorch img/s", "ratio", "GFLOP/s", "ceiling", "cnn.c MB", "torch MB", "memory"))
for name in rows:
    gflop = torch(name, "none", 1)["gflop_per_image"]
    for v in variants:
        p, c = v.split(":")
        mine = [cnn(name, p, c, r)["img_per_s"] for r in range(1, rounds + 1)]
        ref = [torch(name, c, r)["img_per_s"] for r in range(1, rounds + 1)]
        fmt = "%.1f" if mean(ref) < 100 else "%.0f"
        mb, tmb = cnn(name, p, c, 1)["peak_rss_mb"], torch(name, c, 1)["peak_rss_mb"]
        print("%-16s %-11s %22s %22s %6.2fx %9.1f %6.0f%% %9.0f %9.0f %6.2fx" % (
            name, "%s %s" % (p, c), each(mine, fmt), each(ref, fmt), mean(mine) / mean(ref),
            mean(mine) * gflop, 100 * mean(mine) * gflop / ceiling, mb, tmb, mb / tmb))
PY
