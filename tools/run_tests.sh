#!/usr/bin/env bash
# Run Check suites and print one closing line: "N passed, N failed, N skipped".
# Each suite prints Check's own summary and then "-- SUITE: SECONDS s" (its
# wall time, for finding the slow ones); skipped tests (CUDA without a GPU)
# print lines "SKIP: ..." that are counted here.
#
#   tools/run_tests.sh SUITE... [--async SEED SUITE...]
#
# Suites after --async SEED run again with the cpu backend's asynchronous
# streams and random delays from SEED (FSDP_CPU_STREAMS=async,
# FSDP_CPU_STREAM_JITTER=SEED): a missing event wait between a device's
# streams fails there. ASYNC_EXCLUDE (environment: test case names, space
# separated) leaves those cases out of the asynchronous pass only.
set -u
pass=0 fail=0 skip=0 bad_suites=() env=() tag= failures=
while [ $# -gt 0 ]; do
    t=$1; shift
    if [ "$t" = --async ]; then
        env=(FSDP_CPU_STREAMS=async "FSDP_CPU_STREAM_JITTER=$1"); tag=" (async streams, jitter $1)"
        if [ -n "${ASYNC_EXCLUDE:-}" ]; then
            env+=("CK_EXCLUDE_TAGS=$ASYNC_EXCLUDE"); tag+=", without cases: $ASYNC_EXCLUDE"
        fi
        shift; continue
    fi
    echo "== ${t##*/}$tag"
    t0=$(date +%s%N)
    out=$(env "${env[@]}" "$t" 2>&1); rc=$?
    printf '%s\n' "$out"
    ms=$((($(date +%s%N) - t0) / 1000000))
    printf -- '-- %s%s: %d.%d s\n' "${t##*/}" "$tag" $((ms / 1000)) $((ms % 1000 / 100))
    line=$(printf '%s\n' "$out" | grep -E '^[0-9]+%: Checks: ' | tail -n 1)
    if [ -z "$line" ]; then
        fail=$((fail + 1)); bad_suites+=("${t##*/}$tag (no summary, exit $rc)"); continue
    fi
    n=$(sed -E 's/.*Checks: ([0-9]+).*/\1/' <<<"$line")
    f=$(sed -E 's/.*Failures: ([0-9]+).*/\1/' <<<"$line")
    e=$(sed -E 's/.*Errors: ([0-9]+).*/\1/' <<<"$line")
    s=$(printf '%s\n' "$out" | grep -c '^SKIP: ')
    pass=$((pass + n - f - e - s)); fail=$((fail + f + e)); skip=$((skip + s))
    [ "$rc" -ne 0 ] && [ $((f + e)) -eq 0 ] && { fail=$((fail + 1)); bad_suites+=("${t##*/}$tag (exit $rc)"); }
    if [ $((f + e)) -gt 0 ]; then
        bad_suites+=("${t##*/}$tag")
        # Check prints each failure after its summary line: keep them (60
        # lines a suite) to repeat at the end, where a CI log's tail shows them
        failures+=$(printf '%s\n' "$out" | sed -n '/^[0-9]*%: Checks: /,$p' | sed 1d | head -n 60)
        failures+=$'\n'
    fi
done
echo
if [ ${#bad_suites[@]} -gt 0 ]; then
    printf 'failures, again:\n%s' "$failures"
    echo "failing suites: ${bad_suites[*]}"
fi
echo "$pass passed, $fail failed, $skip skipped"
[ "$fail" -eq 0 ]
