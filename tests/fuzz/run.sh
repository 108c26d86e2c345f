#!/bin/sh
# make fuzz: runs each fuzz target (build/fuzz/fuzz_TARGET, libFuzzer + ASan + UBSan) for
# SECONDS on its corpus (build/fuzz/corpus/TARGET, grown run after run), its seeds
# (written by SEEDS) and the crashes found before (tests/fuzz/regress/TARGET). Prints the
# executions and the edges covered per target. A crash, a leak, a timeout or an
# out-of-memory stops it with exit status 1 and the reproducer's path.
#   sh tests/fuzz/run.sh SECONDS SEEDS TARGET...
set -e
seconds=$1
seeds_bin=$2
shift 2
cd "$(dirname "$0")/../.."
out=build/fuzz
"$seeds_bin" "$out/seeds" models/*.cfg > /dev/null
for t in "$@"; do
    mkdir -p "$out/corpus/$t" "$out/crashes"
    dict=""
    [ -f "tests/fuzz/$t.dict" ] && dict="-dict=tests/fuzz/$t.dict"
    log="$out/$t.log"
    set +e
    "$out/fuzz_$t" "$out/corpus/$t" "$out/seeds/$t" $( [ -d "tests/fuzz/regress/$t" ] && echo "tests/fuzz/regress/$t" ) \
        $dict -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
        -print_final_stats=1 -artifact_prefix="$out/crashes/$t-" > "$log" 2>&1
    rc=$?
    set -e
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
    cov=$(grep -o 'cov: [0-9]*' "$log" | tail -n 1 | cut -d' ' -f2)
    ft=$(grep -o 'ft: [0-9]*' "$log" | tail -n 1 | cut -d' ' -f2)
    corpus=$(ls "$out/corpus/$t" | wc -l)
    if [ $rc -ne 0 ]; then
        crash=$(sed -n 's/.*Test unit written to \(.*\)/\1/p' "$log" | tail -n 1)
        grep -m 1 -E 'ERROR: |runtime error|SUMMARY' "$log" || true
        echo "fuzz $t: FAILED after ${runs:-?} executions; reproducer: ${crash:-see $log}" >&2
        echo "  reproduce: make build/tests/fuzz_replay_$t && build/tests/fuzz_replay_$t ${crash:-FILE}" >&2
        echo "  once fixed, keep it: cp ${crash:-FILE} tests/fuzz/regress/$t/" >&2
        exit 1
    fi
    printf 'fuzz %-12s %6s s: %9s executions, %5s edges (cov), %6s features, corpus %s\n' \
        "$t" "$seconds" "$runs" "$cov" "$ft" "$corpus"
done
