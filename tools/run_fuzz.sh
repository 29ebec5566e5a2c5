#!/usr/bin/env bash
# Run libFuzzer targets, PARALLEL of them at a time, each for SECONDS on its
# seed corpus tests/fuzz/corpus/<target>/ (new inputs go to DIR/corpus/
# <target>/, failing ones to DIR/crash-* etc.). Each target's summary lines
# are printed when it ends, in the order given; exit 1 when any target
# found a failing input or did not run.
#
#   tools/run_fuzz.sh DIR SECONDS JOBS PARALLEL TARGET...
#
# JOBS > 1 runs each target with -fork=JOBS (libFuzzer's own processes).
set -u
dir=$1 seconds=$2 jobs=$3 parallel=$4
shift 4
[ "$parallel" -ge 1 ] 2>/dev/null || parallel=1
logs=$(mktemp -d) || exit 1
trap 'rm -rf "$logs"' EXIT

one() { # target -> $logs/<name>.log, exit status in $logs/<name>.rc
    local t=$1 n=${1##*/} fork=()
    [ "$jobs" != 1 ] && fork=(-fork="$jobs")
    mkdir -p "$dir/corpus/$n"
    "$t" -max_total_time="$seconds" -max_len=65536 -timeout=20 -rss_limit_mb=2048 "${fork[@]}" \
        -print_final_stats=1 -artifact_prefix="$dir/$n-" "$dir/corpus/$n" \
        "tests/fuzz/corpus/$n" >"$logs/$n.log" 2>&1
    echo $? >"$logs/$n.rc"
}

running=0
for t in "$@"; do
    one "$t" &
    running=$((running + 1))
    if [ "$running" -ge "$parallel" ]; then
        wait -n
        running=$((running - 1))
    fi
done
wait

bad=0
for t in "$@"; do
    n=${t##*/}
    echo "== $n: $seconds s"
    grep -E '^(#[0-9]+ +DONE|stat::number_of_executed_units|stat::new_units_added|==[0-9]+==ERROR|SUMMARY|INFO: seed corpus)' "$logs/$n.log"
    found=$(ls "$dir/$n"-crash-* "$dir/$n"-leak-* "$dir/$n"-timeout-* "$dir/$n"-oom-* 2>/dev/null)
    rc=$(cat "$logs/$n.rc" 2>/dev/null || echo 1)
    if [ -n "$found" ] || [ "$rc" != 0 ]; then
        echo "fuzz: $n failed (exit $rc)${found:+; failing input(s):}"
        [ -n "$found" ] && echo "$found"
        [ -z "$found" ] && tail -n 20 "$logs/$n.log"
        bad=1
    fi
done
[ "$bad" = 0 ] && echo "fuzz: every target ran $seconds s without a failure"
exit "$bad"
