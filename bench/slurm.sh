#!/bin/sh
# The trainer started by Slurm's srun (issue 35, point 4), against mpirun:
#   sh bench/slurm.sh            (KEEP=1 leaves the Slurm it started running)
# 1. A Slurm to run on: the one srun reaches already (srun -n 2 --mpi=pmix /bin/true works),
#    or, as root with Debian's slurmctld, slurmd, slurm-client and munge installed, one node
#    on this machine (localhost, 2 CPUs; SlurmdParameters=config_overrides lets a 1-CPU
#    machine have them) set up in $SLURM_DIR (/tmp/cnn-slurm-UID) with its own slurm.conf
#    (SLURM_CONF: nothing in /etc/slurm changes) and stopped at the end.
# 2. 5 steps of a small network (8x8 "squares", made here) with srun -n 2 --mpi=pmix and
#    with mpirun -np 2, into the same save folder one after the other: last.safetensors
#    must be the same bytes (cmp). OpenMPI finds srun's tasks through PMIx, which Debian's
#    Slurm has (srun --mpi=list: pmix, pmix_v4); Debian's OpenMPI takes no PMI-2.
# 3. srun without PMIx (--mpi=none): ./train stops at once and says to use --mpi=pmix.
# 4. Stops: srun -X (--disable-status) passes one Ctrl-C on as SIGINT, and scancel sends
#    SIGTERM (SIGKILL KillWait = 30 s later): both end in a checkpoint, a message that
#    names the signal, and srun's exit status 130 (the tasks').
# Exits with 0 when all of it holds, 1 when something does not, 77 (skipped) when ./train
# has no MPI, mpirun or python3 is missing, or no Slurm can be reached or set up.
cd "$(dirname "$0")/.."
OUT=bench/out/slurm
SLURM_DIR=${SLURM_DIR:-/tmp/cnn-slurm-$(id -u)}
skip() { echo "bench/slurm.sh: skipped: $*"; exit 77; }
fail() { echo "bench/slurm.sh: FAILED: $*"; exit 1; }

make -s train ckpt > /dev/null 2>&1 || fail "make train ckpt failed"
command -v mpirun > /dev/null || skip "no mpirun (apt-get install libopenmpi-dev openmpi-bin)"
command -v python3 > /dev/null || skip "no python3 (it writes the data)"
rm -rf "$OUT" && mkdir -p "$OUT" || fail "cannot make $OUT"
OUT=$(cd "$OUT" && pwd)
MPIRUN="mpirun --allow-run-as-root --oversubscribe -np 2"

# ---- a Slurm -------------------------------------------------------------------------------
started=""
stop_slurm() {
    for d in slurmd slurmctld munged; do
        case " $started " in *" $d "*) ;; *) continue ;; esac
        pidfile="$SLURM_DIR/$d.pid"
        [ $d = munged ] && pidfile=/run/munge/munged.pid
        [ -s "$pidfile" ] && kill "$(cat "$pidfile")" 2> /dev/null
    done
}
srun_works() { timeout 20 srun -n 2 --mpi=pmix /bin/true > "$OUT/probe.txt" 2>&1; }

if srun_works; then
    echo "slurm: using the one srun reaches (${SLURM_CONF:-/etc/slurm/slurm.conf})"
elif [ -z "$SLURM_CONF" ] && [ -f "$SLURM_DIR/slurm.conf" ] && SLURM_CONF="$SLURM_DIR/slurm.conf" srun_works; then
    export SLURM_CONF="$SLURM_DIR/slurm.conf"
    echo "slurm: using the one an earlier KEEP=1 run left (SLURM_CONF=$SLURM_CONF)"
else
    for c in slurmctld slurmd srun sinfo munge munged; do
        PATH=$PATH:/usr/sbin command -v $c > /dev/null ||
            skip "no $c: install Slurm (apt-get install slurmctld slurmd slurm-client munge), or run where srun works"
    done
    [ "$(id -u)" = 0 ] || skip "no Slurm answers, and setting one up here takes root (slurmd)"
    PATH=$PATH:/usr/sbin
    [ "$KEEP" = 1 ] || trap stop_slurm EXIT
    if ! munge -n 2> /dev/null | unmunge > /dev/null 2>&1; then
        [ -r /etc/munge/munge.key ] || skip "munge has no key (/etc/munge/munge.key; Debian's package makes one)"
        mkdir -p /run/munge && chown munge:munge /run/munge && chmod 755 /run/munge
        runuser -u munge -- munged || skip "munged does not start"
        started="$started munged"
        sleep 1
        munge -n | unmunge > /dev/null 2>&1 || skip "munge does not answer"
    fi
    rm -rf "$SLURM_DIR" && mkdir -p "$SLURM_DIR/state" "$SLURM_DIR/spool" || fail "cannot make $SLURM_DIR"
    cpus=$(nproc); [ "$cpus" -ge 2 ] || cpus=2
    cat > "$SLURM_DIR/slurm.conf" << EOF
# A Slurm of one node, this machine, for bench/slurm.sh.
ClusterName=cnnc
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=2
StateSaveLocation=$SLURM_DIR/state
SlurmdSpoolDir=$SLURM_DIR/spool
SlurmctldPidFile=$SLURM_DIR/slurmctld.pid
SlurmdPidFile=$SLURM_DIR/slurmd.pid
SlurmctldLogFile=$SLURM_DIR/slurmctld.log
SlurmdLogFile=$SLURM_DIR/slurmd.log
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
NodeName=localhost NodeAddr=127.0.0.1 CPUs=$cpus State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
EOF
    export SLURM_CONF="$SLURM_DIR/slurm.conf"
    slurmctld -f "$SLURM_CONF" || skip "slurmctld does not start ($SLURM_DIR/slurmctld.log)"
    started="$started slurmctld"
    slurmd -f "$SLURM_CONF" -N localhost || skip "slurmd does not start ($SLURM_DIR/slurmd.log)"
    started="$started slurmd"
    i=0
    until [ "$(sinfo -h -o %t 2> /dev/null)" = idle ]; do
        i=$((i + 1)); [ $i -gt 100 ] && skip "the node is not idle after 20 s: $(sinfo 2>&1)"
        sleep 0.2
    done
    srun_works || skip "srun -n 2 --mpi=pmix /bin/true fails: $(cat "$OUT/probe.txt")"
    echo "slurm: one node on this machine, $cpus CPUs (SLURM_CONF=$SLURM_CONF)"
    [ "$KEEP" = 1 ] && echo "slurm: left running (KEEP=1); export SLURM_CONF=$SLURM_CONF to use it"
fi
echo "srun --mpi=list: $(srun --mpi=list 2>&1 | tr '\n\t' '  ' | sed 's/  */ /g')"

# ---- the data and the network ---------------------------------------------------------------
python3 - "$OUT" << 'EOF' || fail "python3 could not write the data"
import random, struct, sys
# 512 8x8 images of 4 classes: a bright 3x3 square in one of the quarters (tests/testutil.c).
r, n = random.Random(1), 512
im = bytearray(struct.pack('>IIII', 0x803, n, 8, 8))
lb = bytearray(struct.pack('>II', 0x801, n))
for i in range(n):
    k = r.randrange(4)
    px = [r.randrange(80) for _ in range(64)]
    r0, c0 = (k // 2) * 4 + r.randrange(2), (k % 2) * 4 + r.randrange(2)
    for y in range(r0, r0 + 3):
        for x in range(c0, c0 + 3):
            px[y * 8 + x] = 180 + r.randrange(76)
    im += bytes(px)
    lb.append(k)
open(sys.argv[1] + '/images', 'wb').write(im)
open(sys.argv[1] + '/labels', 'wb').write(lb)
big = bytearray(struct.pack('>IIII', 0x803, 40 * n, 8, 8)) + im[16:] * 40
open(sys.argv[1] + '/big-images', 'wb').write(big)
open(sys.argv[1] + '/big-labels', 'wb').write(bytearray(struct.pack('>II', 0x801, 40 * n)) + lb[8:] * 40)
EOF
cat > "$OUT/net.cfg" << EOF
[train]
epochs = 1
batch = 32
seed = 3
threads = 1
[data]
train = $OUT/images
train_labels = $OUT/labels
mean = 0.25
std = 0.35
[conv]
name = conv1
filters = 8
size = 3
pad = 1
activation = relu
[maxpool]
[dropout]
p = 0.3
[flatten]
[linear]
name = fc1
outputs = 16
activation = relu
[linear]
name = fc2
outputs = 4
[log_softmax]
EOF

# ---- 2. srun against mpirun ------------------------------------------------------------------
$MPIRUN ./train "$OUT/net.cfg" stop_after=5 save="$OUT/run" > "$OUT/mpirun.txt" 2>&1 ||
    fail "mpirun -np 2 ./train: status $? ($OUT/mpirun.txt)"
mv "$OUT/run" "$OUT/mpirun"
t0=$(date +%s.%N)
timeout 120 srun -n 2 --mpi=pmix ./train "$OUT/net.cfg" stop_after=5 save="$OUT/run" > "$OUT/srun.txt" 2>&1
rc=$?
t1=$(date +%s.%N)
[ $rc = 0 ] || fail "srun -n 2 --mpi=pmix ./train: status $rc: $(cat "$OUT/srun.txt")"
grep -q "over 2 processes (16 samples each)" "$OUT/srun.txt" || fail "srun's run is not 2 processes: $(head -n 1 "$OUT/srun.txt")"
cmp "$OUT/run/last.safetensors" "$OUT/mpirun/last.safetensors" ||
    fail "srun's checkpoint differs from mpirun's"
grep -q "$(printf '\r')" "$OUT/srun.txt" && fail "srun's redirected log holds progress lines"
echo "srun -n 2 --mpi=pmix, 5 steps: $(awk "BEGIN { printf \"%.2f\", $t1 - $t0 }") s; last.safetensors" \
     "($(wc -c < "$OUT/run/last.safetensors") bytes) the same bytes as mpirun -np 2's"

# ---- 3. srun without PMIx --------------------------------------------------------------------
timeout 60 srun -n 2 --mpi=none ./train "$OUT/net.cfg" stop_after=5 save="$OUT/nopmi" > "$OUT/nopmi.txt" 2>&1
rc=$?
[ $rc = 1 ] && grep -q "srun --mpi=pmix" "$OUT/nopmi.txt" ||
    fail "srun --mpi=none: status $rc, expected 1 and a word on --mpi=pmix: $(cat "$OUT/nopmi.txt")"
echo "srun --mpi=none: status 1, $(grep -m1 "srun --mpi=pmix" "$OUT/nopmi.txt" | cut -c1-90)..."

# ---- 4. stops ----------------------------------------------------------------------------------
# stop NAME SIGNAL HOW SRUN-OPTIONS: trains the big set with a checkpoint after every batch;
# once the first is written, HOW sends the signal (ctrl-c: SIGINT to srun; scancel: the job
# cancelled, SIGTERM; scancel-signal: scancel --signal), then srun must end with 130 and
# the log name the signal.
stop() {
    name=$1 sig=$2 how=$3; shift 3
    srun -n 2 --mpi=pmix --job-name="cnn-$name-$$" "$@" ./train "$OUT/net.cfg" \
        train="$OUT/big-images" train_labels="$OUT/big-labels" epochs=100 save_every=1 \
        save="$OUT/$name" > "$OUT/$name.txt" 2>&1 &
    pid=$!
    i=0
    while [ ! -e "$OUT/$name/last.safetensors" ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i + 1)); done
    case $how in
        ctrl-c) kill -INT $pid ;;
        scancel) scancel --name="cnn-$name-$$" ;;
        scancel-signal) scancel --signal="$sig" --name="cnn-$name-$$" ;;
    esac
    wait $pid
    rc=$?
    [ $rc = 130 ] || fail "$name: srun's status $rc, expected 130: $(tr '\r' '\n' < "$OUT/$name.txt" | tail -n 8)"
    grep -q "stopped by $sig in epoch 1" "$OUT/$name.txt" || fail "$name: no 'stopped by $sig': $(cat "$OUT/$name.txt")"
    ./ckpt ls "$OUT/$name/last.safetensors" > /dev/null || fail "$name: the checkpoint does not load"
    echo "$name: srun's status 130, $(grep -o "stopped by $sig in epoch 1 after batch [0-9/]*" "$OUT/$name.txt")"
}
stop ctrl-c SIGINT ctrl-c -X
stop scancel-int SIGINT scancel-signal
stop scancel SIGTERM scancel
echo "bench/slurm.sh: all held"
