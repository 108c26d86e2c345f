#!/bin/sh
# Several "hosts" on this one machine for data-parallel runs over a real network stack
# (issue 35): N network namespaces h0..h{N-1} (2 to 4) on a switch, each joined to it by
# its own link shaped to RATE, and mpirun with one process per host, over TCP between them.
#   sh bench/netns.sh up N RATE              # make the hosts (RATE: 1gbit, 200mbit, ... or none)
#   sh bench/netns.sh mpirun N -- ARGS...    # mpirun [its options] ARGS... across them
#   sh bench/netns.sh down N                 # remove them (and end what still runs in them)
#   sh bench/netns.sh run N RATE -- ARGS...  # up, mpirun, down
#   sh bench/netns.sh run 2 1gbit -- ./train models/fashion.cfg save=runs/netns
#   sh bench/netns.sh run 2 200mbit -- build/bench/allreduce_bench --broadcast 1 1000000
# `mpirun` and `run` exit with mpirun's status; `run` removes the hosts whatever happens
# (on exit, Ctrl-C or TERM; after a kill -9, `down` removes them). ARGS come after
# mpirun's own options, so they may start with more (-x VAR, --mca ...). NETNS_PREFIX
# (default h) names the hosts, the switch (PREFIXbr) and the links (PREFIXv0...), so two
# setups can live side by side; the hosts are 10.77.0.1 to 10.77.0.N/24 (each switch is a
# network of its own). Exits 77 (skip) where it cannot run: not root, no `ip netns`, no tbf.
#
# How: a Linux bridge in the root namespace is the switch; host i is a namespace with a
# veth pair, eth0 (10.77.0.i+1) inside, PREFIXvi on the bridge. A tbf qdisc on both ends
# of each veth (eth0 for what the host sends, PREFIXvi for what it receives) limits the
# host's link to RATE each way, as a NIC on a switch port. mpirun runs in h0 (it and rank
# 0 share that host) and starts an orted on each other host through an "rsh agent": this
# script's `agent` command, which OpenMPI calls as `agent HOST orted ARGS...` (HOST as the
# -H option names it, here the host's address) and which runs `sh -c "orted ARGS..."` in
# HOST's namespace. Each host also gets a hostname of its own (a UTS namespace: h0...), so
# OpenMPI's session directories and node names differ as on separate machines. Processes
# talk only over TCP on 10.77.0.0/24 (--mca btl tcp,self, btl_tcp_if_include,
# oob_tcp_if_include): no shared memory between hosts, not even between processes of one.
#
# What it does not model: the kernel here has no netem, so no latency is added (a
# round trip over a veth is some tens of microseconds, a LAN's is 100 us and more) and no
# loss or jitter; the hosts share this machine's CPUs, memory and caches (processes are
# not bound to cores: --bind-to none, since every host would put its rank on core 0), and
# moving bytes over a veth costs CPU time that a NIC would not take from the training;
# tbf shapes the bandwidth only, and lets a burst through at the veth's speed after a
# pause: BURST bytes (an environment variable, in tc's units), by default 2 ms of RATE
# and at least 64 KiB (a TSO segment; 64 KiB at 1gbit gave 10% less than 256 KiB).
set -e
PREFIX=${NETNS_PREFIX:-h}
NET=10.77.0
SELF=$(cd "$(dirname "$0")" && pwd)/$(basename "$0")

usage() {
    sed -n '2,16p' "$SELF" | sed 's/^# \{0,1\}//' >&2
    exit 2
}
skip() {
    echo "bench/netns.sh: $*; skipped" >&2
    exit 77
}

# can: whether this machine lets us make namespaces, bridges and tbf qdiscs at all
can() {
    [ "$(id -u)" = 0 ] || skip "needs root (network namespaces, a bridge and tc)"
    if ! command -v ip > /dev/null || ! command -v tc > /dev/null; then
        skip "needs ip and tc (Debian: iproute2)"
    fi
    command -v unshare > /dev/null || skip "needs unshare (Debian: util-linux)"
    probe=${PREFIX}probe$$
    ip netns add "$probe" 2> /dev/null || skip "ip netns add fails here (no network namespaces?)"
    ok=0
    ip -n "$probe" link add p0 type veth peer name p1 2> /dev/null &&
        ip -n "$probe" link add b0 type bridge 2> /dev/null &&
        tc -n "$probe" qdisc add dev p0 root tbf rate 1gbit burst 256kb latency 20ms 2> /dev/null && ok=1
    ip netns del "$probe"
    [ $ok = 1 ] || skip "no veth, bridge or tc tbf in this kernel"
}

# down N: end what runs in the hosts, remove them and the switch; quiet about what is not there
down() {
    for i in $(seq 0 $(($1 - 1))); do
        ns=$PREFIX$i
        ip netns list | grep -q "^$ns\b" || continue
        pids=$(ip netns pids "$ns" 2> /dev/null || true)
        if [ -n "$pids" ]; then
            kill $pids 2> /dev/null || true
            sleep 0.5
            kill -9 $(ip netns pids "$ns" 2> /dev/null) 2> /dev/null || true
        fi
        ip netns del "$ns" 2> /dev/null || true
    done
    ip link del "${PREFIX}br" 2> /dev/null || true
    # A namespace's veth goes away a moment after the namespace: wait, so that `up` may follow.
    for _ in $(seq 50); do
        ip -o link show | grep -q ": ${PREFIX}v[0-9]" || return 0
        sleep 0.1
    done
}

# shape DEV [NS]: tbf at RATE on DEV's egress (in namespace NS), its queue 2 ms of RATE
# beyond the burst (tbf's `latency`: the longest a packet may wait). With 20 ms the ACKs of
# one direction waited behind the other's data, and the 2-process sum (both directions at
# once) moved 16 MB at 1gbit in 150-260 ms instead of 136.
shape() {
    [ "$RATE" = none ] && return 0
    tc ${2:+-n "$2"} qdisc add dev "$1" root tbf rate "$RATE" burst "$BURST" latency 2ms
}

up() {
    for i in $(seq 0 $(($1 - 1))); do
        if ip netns list | grep -q "^$PREFIX$i\b"; then
            echo "bench/netns.sh: $PREFIX$i is already there: sh bench/netns.sh down $1 first" >&2
            exit 1
        fi
    done
    ip link add "${PREFIX}br" type bridge
    ip link set "${PREFIX}br" up
    for i in $(seq 0 $(($1 - 1))); do
        ns=$PREFIX$i
        ip netns add "$ns"
        ip link add "${PREFIX}v$i" type veth peer name eth0 netns "$ns"
        ip link set "${PREFIX}v$i" master "${PREFIX}br" up
        ip -n "$ns" addr add "$NET.$((i + 1))/24" dev eth0
        ip -n "$ns" link set eth0 up
        ip -n "$ns" link set lo up
        shape eth0 "$ns"
        shape "${PREFIX}v$i"
    done
}

[ $# -ge 1 ] || usage
cmd=$1
shift
case $cmd in
agent)  # OpenMPI's rsh agent: agent HOST COMMAND... (HOST an address of ours)
    host=$1
    shift
    case $host in
    "$NET".*) ns=$PREFIX$((${host##*.} - 1)) ;;
    *) ns=$host ;;
    esac
    exec ip netns exec "$ns" unshare --uts sh -c 'hostname "$0" && eval "$1"' "$ns" "$*"
    ;;
up | mpirun | run | down) ;;
*) usage ;;
esac

N=${1:-}
case $N in
2 | 3 | 4) ;;
*) echo "bench/netns.sh: N must be 2, 3 or 4, not '$N'" >&2; usage ;;
esac
shift
[ "$(id -u)" = 0 ] || skip "needs root (network namespaces, a bridge and tc)"
case $SELF in
*[[:space:]]*)  # OpenMPI splits its plm_rsh_agent at spaces
    echo "bench/netns.sh: run it from a path without spaces, not $SELF" >&2
    exit 1
    ;;
esac
export NETNS_PREFIX="$PREFIX"

# across N ARGS...: mpirun, one process on each of the N hosts, in the background (so
# that a signal to this script runs its traps at once: they end it), then waits for it
mpirun_pid=
stop() {
    if [ -n "$mpirun_pid" ] && kill "$mpirun_pid" 2> /dev/null; then
        wait "$mpirun_pid" || true  # mpirun ends its processes on every host (a second or two)
    fi
    exit "$1"
}
trap 'stop 130' INT
trap 'stop 143' TERM
across() {
    n=$1
    shift
    [ "${1:-}" = -- ] && shift
    [ $# -ge 1 ] || usage
    ip netns list | grep -q "^$PREFIX$((n - 1))\b" ||
        { echo "bench/netns.sh: no host $PREFIX$((n - 1)): sh bench/netns.sh up $n RATE first" >&2; exit 1; }
    # in h0 under its own hostname; each command execs the next, so $! is mpirun's pid
    ip netns exec "${PREFIX}0" unshare --uts sh -c 'hostname "$0" && exec "$@"' "${PREFIX}0" \
        mpirun --allow-run-as-root -np "$n" -H "$(seq -s, -f "$NET.%g" 1 "$n")" \
        --bind-to none --mca plm_rsh_agent "sh $SELF agent" --mca plm_rsh_no_tree_spawn 1 \
        --mca btl tcp,self --mca btl_tcp_if_include "$NET.0/24" --mca oob_tcp_if_include "$NET.0/24" \
        "$@" &
    mpirun_pid=$!
    status=0
    wait $mpirun_pid || status=$?
    return $status
}

case $cmd in
down)
    down "$N"
    exit 0
    ;;
mpirun)
    status=0
    across "$N" "$@" || status=$?
    exit $status
    ;;
esac
RATE=${1:-}
[ -n "$RATE" ] || usage
case $RATE in
none | *[0-9]bit | *[0-9][kmgt]bit | *[0-9]bps | *[0-9][kmgt]bps) ;;
*) echo "bench/netns.sh: RATE is a tc rate (1gbit, 200mbit, ...) or none, not '$RATE'" >&2; exit 2 ;;
esac
shift
# BURST: 2 ms of RATE in bytes, at least 64 KiB (bps in tc is bytes per second)
[ "$RATE" = none ] || BURST=${BURST:-$(echo "$RATE" | awk '{
    n = $0 + 0; u = substr($0, length(n "") + 1)
    m = u ~ /^k/ ? 1e3 : u ~ /^m/ ? 1e6 : u ~ /^g/ ? 1e9 : u ~ /^t/ ? 1e12 : 1
    b = n * m * (u ~ /bps$/ ? 1 : 1 / 8) * 0.002
    printf "%d\n", (b > 65536 ? b : 65536) }')}
can

if [ "$cmd" = up ]; then
    trap 'down "$N"' EXIT
    up "$N"
    trap - EXIT
    echo "hosts $PREFIX""0..$PREFIX$((N - 1)) at $NET.1..$NET.$N, links at $RATE; then" \
        "sh bench/netns.sh mpirun $N -- ARGS..., and sh bench/netns.sh down $N"
    exit 0
fi
trap 'down "$N"' EXIT
up "$N"
status=0
across "$N" "$@" || status=$?
exit $status
