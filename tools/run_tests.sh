#!/usr/bin/env bash
# Run Check suites and print one closing line: "N passed, N failed, N skipped".
# Each suite prints Check's own summary; skipped tests (CUDA without a GPU)
# print lines "SKIP: ..." that are counted here.
set -u
pass=0 fail=0 skip=0 bad_suites=()
for t in "$@"; do
    echo "== ${t##*/}"
    out=$("$t" 2>&1); rc=$?
    printf '%s\n' "$out"
    line=$(printf '%s\n' "$out" | grep -E '^[0-9]+%: Checks: ' | tail -n 1)
    if [ -z "$line" ]; then
        fail=$((fail + 1)); bad_suites+=("${t##*/} (no summary, exit $rc)"); continue
    fi
    n=$(sed -E 's/.*Checks: ([0-9]+).*/\1/' <<<"$line")
    f=$(sed -E 's/.*Failures: ([0-9]+).*/\1/' <<<"$line")
    e=$(sed -E 's/.*Errors: ([0-9]+).*/\1/' <<<"$line")
    s=$(printf '%s\n' "$out" | grep -c '^SKIP: ')
    pass=$((pass + n - f - e - s)); fail=$((fail + f + e)); skip=$((skip + s))
    [ "$rc" -ne 0 ] && [ $((f + e)) -eq 0 ] && { fail=$((fail + 1)); bad_suites+=("${t##*/} (exit $rc)"); }
    [ $((f + e)) -gt 0 ] && bad_suites+=("${t##*/}")
done
echo
[ ${#bad_suites[@]} -gt 0 ] && echo "failing suites: ${bad_suites[*]}"
echo "$pass passed, $fail failed, $skip skipped"
[ "$fail" -eq 0 ]
