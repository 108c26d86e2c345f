#!/bin/sh
# Runs every test binary given as an argument; prints a summary line and fails if any failed.
pass=0; fail=0; failed=""
for t in "$@"; do
    echo "== $t"
    if "$t"; then pass=$((pass + 1)); else fail=$((fail + 1)); failed="$failed $t"; fi
done
echo "suites: $pass passed, $fail failed"
[ $fail -eq 0 ] || { echo "failed:$failed"; exit 1; }
