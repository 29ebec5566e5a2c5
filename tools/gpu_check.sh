#!/usr/bin/env bash
# gpu_check.sh - everything that needs a GPU, in stages that each fit one
# short call on a one-GPU (H200) machine that has gcc and nvcc but maybe no
# make, no NCCL install, no Check or OpenBLAS, and no package registry.
#
#   tools/gpu_check.sh [--stage N]... [OUTDIR]   (default: every stage; OUTDIR: $OUT, else
#                                                 ./gpu_check_out)
#   tools/gpu_check.sh --detect                  (only whether there is a GPU, and how it
#                                                 was found: exit 0 yes, 1 no)
#
# On the device machine, run it with GPU_CHECK_REQUIRE_GPU=1 and carry
# third_party (tools/fetch_gpu_debs.sh fills it here), e.g.
#   GPU_CHECK_REQUIRE_GPU=1 tools/gpu_check.sh --stage 1      carry ["third_party"]
#
# Before any stage (both written to OUTDIR/preflight.txt):
#   the GPU: nvidia-smi -L, from PATH or the driver's usual folders
#           (/usr/local/nvidia/bin, /usr/bin, /usr/local/bin, /opt/nvidia/bin),
#           else a device node /dev/nvidiaN; and the driver's libcuda.so.1 (a
#           folder the loader does not search, /usr/local/nvidia/lib64 say,
#           joins LD_LIBRARY_PATH). With GPU_CHECK_REQUIRE_GPU=1 and no GPU
#           the script stops at once, exit 3, before building anything.
#   preflight: make (else the make .deb carried in third_party/debs,
#           unpacked into third_party/root), a C compiler that links, gcc's
#           C++ front end (nvcc's host compiler), ar, nvcc, and Check and
#           OpenBLAS (pkg-config's, else the carried .debs, with a pkg-config
#           stand-in when there is none). Anything missing stops the script,
#           exit 4, its line saying what to carry.
#
#   stage 1 (~3 min): environment report (GPU, driver, runtime, nvcc, where
#           NCCL, cuBLAS, compute-sanitizer, Check and OpenBLAS were found);
#           build for sm_90 only (MPI=0); every CUDA suite (tests/test_cuda*.c:
#           test_cuda, test_cuda_comm, test_cuda_llama, test_cuda_ops, ...;
#           with a GPU, a suite that skips a test for want of one fails);
#           compute-sanitizer --tool memcheck over them, test_cuda first,
#           as long as the stage's time lasts.
#   stage 2 (~2 min): tiny training, cpu vs cuda (fp32, bf16): per-step
#           losses within a tolerance, the cuda peak equal to `fsdp plan`'s
#           to the byte; the same for llama-tiny when this build has it
#           (`fsdp train --model llama-tiny` runs on cpu; else a row says it
#           is absent); 1 rank vs 4 virtual ranks (peer, --deterministic):
#           bit-identical losses and gradient norms; hybrid sharding on 2
#           simulated nodes x 2 virtual ranks (peer's group communicators)
#           vs full sharding on 4: bit-identical too; the 4-virtual-rank run
#           again under CUDA_LAUNCH_BLOCKING=1: bit-identical to the default
#           run (every launch then finishes before the next is issued, so a
#           missing event between streams, a race in the default run, shows).
#   stage 3 (~3 min): GPT-2 124M, bf16, T 1024, --eval 0, on 1 rank and on 4
#           virtual ranks: tokens/s, step time, MFU, peak vs the planner.
#
# Each stage runs alone (it builds what it needs; make is incremental) and
# leaves two files in OUTDIR: stageN.txt (results and where the time went)
# and stageN-logs.tar.gz (every log); with preflight.txt that is at most 7 of
# the 8 files the device tool brings back. Logs are written under
# $BUILD/gpu_check/ first.
#
# Nothing here calls apt or any registry, and MPI is left out (MPI=0).
# Where the rest comes from (tools/gpu_check_env.sh): NCCL from $NCCL_HOME,
# $CUDA_HOME, /usr, /usr/local, then the nvidia wheels (nvidia/nccl) of every
# site-packages found: $PYTHON's and python3's, and by path the usual venvs
# (/opt/*/.venv, $VIRTUAL_ENV, ...), so the image's venv counts even when
# python3 on PATH is another Python; without NCCL the build has NCCL=0 (peer
# collectives only). cudart, cuBLAS and cuBLASLt from the toolkit when it
# has the unversioned lib<name>.so; else (versioned files alone, such as
# libcublas.so.13, or no toolkit libraries) through a folder of links with
# both names, $BUILD/gpu_check/lib, to the toolkit's files or the wheels'
# (nvidia/cu13/lib). NCCL_DEBUG is WARN unless set.
#
# Without a GPU (or with GPU_CHECK_DRY=1) every stage still runs: the build,
# the suites (their GPU tests skip), and the training commands with the cpu
# backend standing in for cuda (host collectives for nccl/peer, the tiny
# model for GPT-2), so the script's own logic is exercised before the first
# real run; its last line then says it was a dry run, never that every check
# passed. Other knobs: GPU_CHECK_SECONDS (per-stage deadline),
# GPU_CHECK_NCCL=none (build without NCCL), GPU_CHECK_NCCL=wheel and
# GPU_CHECK_CUBLAS=wheel (take those from the wheels even when the toolkit
# has them), GPU_CHECK_CUDA_LIBDIR (the toolkit's library folder),
# BUILD, PYTHON; to exercise the carried paths here: GPU_CHECK_FORCE_DEBS=1,
# GPU_CHECK_FAKE_PKGCONFIG=1, GPU_CHECK_MAKE_FROM_DEBS=1 (the carried make
# even when there is one), and GPU_CHECK_SYSROOT=DIR with --detect (look for
# nvidia-smi, /dev/nvidiaN and libcuda.so.1 under DIR, never on PATH).
# Exit status: 0 every check that ran passed, 1 a check failed, 2 usage,
# 3 GPU_CHECK_REQUIRE_GPU=1 and no GPU, 4 the preflight failed.
set -u
cd "$(dirname "$0")/.." || exit 2
ROOT=$PWD

STAGES=()
OUTDIR=
DETECT=0
while [ $# -gt 0 ]; do
    case $1 in
    --detect) DETECT=1; shift ;;
    --stage | -s) STAGES+=("$2"); shift 2 ;;
    --stage=*) STAGES+=("${1#--stage=}"); shift ;;
    -h | --help) sed -n '2,/^set -u/p' "$0" | sed 's/^# \{0,1\}//; /^set -u/d'; exit 0 ;;
    *) OUTDIR=$1; shift ;;
    esac
done
# shellcheck source=tools/gpu_check_env.sh
. "$ROOT/tools/gpu_check_env.sh" || exit 2
if [ $DETECT = 1 ]; then
    gpu_detect
    echo "gpu: $([ $GPU = 1 ] && echo found || echo none): $GPU_HOW"
    gpu_driver_lib
    exit $((1 - GPU))
fi
[ ${#STAGES[@]} -gt 0 ] || STAGES=(1 2 3)
for s in "${STAGES[@]}"; do
    case $s in 1 | 2 | 3) ;; *) echo "gpu_check: no stage '$s' (1, 2 or 3)"; exit 2 ;; esac
done
OUTDIR=${OUTDIR:-${OUT:-gpu_check_out}}
mkdir -p "$OUTDIR" && OUTDIR=$(cd "$OUTDIR" && pwd) || exit 2
BUILD=${BUILD:-build-gpu}
WORKROOT=$ROOT/$BUILD/gpu_check
# what the Makefile asks pkg-config for (its PKGS)
DEP_PKGS="check openblas libpcre2-8 libutf8proc libxxhash"
mkdir -p "$WORKROOT"
NPROC=$(nproc 2>/dev/null || echo 4)
FAILED=0
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}

# ---- the GPU, or a dry run; the preflight ------------------------------------------
gpu_detect
dry_note() { [ $GPU = 1 ] || echo " (dry run: no GPU)"; }
gpu_driver_lib >"$WORKROOT/driver.txt" # here, not in $(): it may set LD_LIBRARY_PATH
if [ "${GPU_CHECK_REQUIRE_GPU:-0}" = 1 ] && [ $GPU = 0 ]; then
    {
        echo "gpu_check: GPU_CHECK_REQUIRE_GPU=1 but there is no GPU: $GPU_HOW"
        cat "$WORKROOT/driver.txt"
        echo "gpu_check: stopped before the preflight and the stages: nothing was built or checked"
    } | tee "$OUTDIR/preflight.txt" >&2
    exit 3
fi
preflight
PRE_RC=$?
{
    echo "== gpu_check preflight$(dry_note), $(date -u '+%F %T') UTC"
    echo "gpu: $([ $GPU = 1 ] && echo found || echo none): $GPU_HOW"
    cat "$WORKROOT/driver.txt"
    printf '%s\n' "${PRE_LINES[@]}"
    echo "NCCL_DEBUG=$NCCL_DEBUG"
} | tee "$OUTDIR/preflight.txt"
if [ $PRE_RC != 0 ]; then
    echo "gpu_check: the preflight failed (see above): nothing was built or run" | tee -a "$OUTDIR/preflight.txt"
    exit 4
fi

# ---- per-stage bookkeeping ---------------------------------------------------
# A stage's rows (check, verdict, detail) and where its time went.
stage_begin() {
    STAGE=$1
    WORK=$WORKROOT/stage$1
    rm -rf "$WORK" && mkdir -p "$WORK"
    ROWS=()
    TIMES=()
    STAGE_T0=$(date +%s)
    DEADLINE=${GPU_CHECK_SECONDS:-$2}
    exec 3>&1 4>&2
    exec > >(tee "$WORK/console.log") 2>&1
    echo "== gpu_check stage $1$(dry_note), deadline ${DEADLINE} s, $(date -u '+%F %T') UTC"
}

row() {
    ROWS+=("$(printf '%-48s %-5s %s' "$1" "$2" "$3")")
    [ "$2" = FAIL ] && FAILED=1
    return 0
}

# Seconds left for a step that wants $1 (0: none left).
budget() {
    local left=$((DEADLINE - ($(date +%s) - STAGE_T0) - 5))
    [ "$left" -lt 10 ] && { echo 0; return; }
    [ "$1" -lt "$left" ] && echo "$1" || echo "$left"
}

# timed NAME CMD...: run CMD, note how long it took under NAME.
timed() {
    local name=$1 t0 rc
    shift
    t0=$(date +%s.%N)
    "$@"
    rc=$?
    TIMES+=("$(awk -v n="$name" -v a="$(date +%s.%N)" -v b="$t0" 'BEGIN { printf "%-40s %7.1f s", n, a - b }')")
    return $rc
}

stage_end() {
    local total=$(($(date +%s) - STAGE_T0))
    {
        echo
        echo "== gpu_check stage $STAGE results$(dry_note)"
        printf '%s\n' "${ROWS[@]}"
        echo
        echo "== where stage $STAGE's ${total} s went (deadline $DEADLINE s)"
        printf '%s\n' "${TIMES[@]}"
    } | tee "$WORK/results.txt"
    exec 1>&3 2>&4 3>&- 4>&-
    sleep 0.2 # let tee finish the console log
    cp "$WORK/results.txt" "$OUTDIR/stage$STAGE.txt"
    tar -czf "$OUTDIR/stage$STAGE-logs.tar.gz" -C "$WORKROOT" "stage$STAGE" 2>/dev/null ||
        echo "gpu_check: could not pack the logs of stage $STAGE"
}

# every CUDA suite, test_cuda first (memcheck takes them in this order)
TESTS=()
for t in tests/test_cuda*.c; do
    t=${t#tests/}
    TESTS+=("${t%.c}")
done
BIN=$BUILD/fsdp

# Build the library, the command and the CUDA suites (incremental).
build() {
    local t
    t=$(budget "$1")
    [ "$t" -gt 0 ] || { row "build (CUDA=1, sm_90)" FAIL "no time left"; return 1; }
    local targets=(all)
    for x in "${TESTS[@]}"; do targets+=("$BUILD/tests/$x"); done
    # make does not track flags: a build made with other settings starts over
    local stamp=$WORKROOT/make_args
    if [ "$(cat "$stamp" 2>/dev/null)" != "${MAKE_ARGS[*]}" ]; then
        rm -rf "${BUILD:?}/obj" "$BUILD/tests" "$BUILD/fsdp" "$BUILD/libfsdp.a"
        printf '%s' "${MAKE_ARGS[*]}" >"$stamp"
    fi
    echo "\$ make -j$NPROC ${MAKE_ARGS[*]} ${targets[*]}" >"$WORK/build.log"
    if timeout "$t" make -j"$NPROC" "${MAKE_ARGS[@]}" "${targets[@]}" >>"$WORK/build.log" 2>&1; then
        row "build (CUDA=1, sm_90)" ok "$(grep -ci 'warning' "$WORK/build.log") warning lines; $(grep -m1 '^fsdp: cc' "$WORK/build.log")"
        return 0
    fi
    tail -n 30 "$WORK/build.log"
    row "build (CUDA=1, sm_90)" FAIL "see build.log"
    return 1
}

toolchain_and_build() {
    if ! setup_toolchain; then
        printf '  %s\n' "${TOOL_LINES[@]}"
        row "toolchain" FAIL "$(printf '%s; ' "${TOOL_LINES[@]}")"
        return 1
    fi
    printf '  %s\n' "${TOOL_LINES[@]}"
    timed "build" build "$1"
}

# ---- stage 1 ---------------------------------------------------------------------
env_report() {
    {
        echo "host: $(uname -srm), $NPROC cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo) RAM, $(. /etc/os-release 2>/dev/null && echo "$PRETTY_NAME")"
        case $(uname -r) in
        4.4.0) echo "runtime: gVisor (kernel 4.4.0): compute-sanitizer and ncu are not expected to work" ;;
        *-fc-*) echo "runtime: Firecracker ($(uname -r))" ;;
        *) echo "runtime: kernel $(uname -r)" ;;
        esac
        echo "gpu: $([ $GPU = 1 ] && echo found || echo none): $GPU_HOW"
        if [ -n "$NVSMI" ]; then
            timeout 30 "$NVSMI" --query-gpu=index,name,memory.total,driver_version,clocks.sm,clocks.max.sm,power.limit \
                --format=csv 2>&1 | sed 's/^/gpu: /'
        fi
        cat "$WORKROOT/driver.txt"
        echo "gcc: $(gcc --version | head -n 1)"
        echo "make: $(command -v make) ($(make --version | head -n 1))"
        echo "python3: $(command -v python3 || echo none) $(python3 -c 'import sys; print(sys.version.split()[0])' 2>/dev/null)"
        echo "NCCL_DEBUG=$NCCL_DEBUG"
        echo "compute-sanitizer: ${SANITIZER:-NOT FOUND}"
    } | tee "$WORK/env.txt"
}

find_sanitizer() {
    local c
    for c in "$(command -v compute-sanitizer 2>/dev/null)" "$CUDA_HOME/bin/compute-sanitizer" \
        "$CUDA_HOME/compute-sanitizer/compute-sanitizer"; do
        [ -n "$c" ] && [ -x "$c" ] && { echo "$c"; return 0; }
    done
    c=$(find /usr/local /opt -maxdepth 6 -name compute-sanitizer -type f -perm -u+x 2>/dev/null | head -n 1)
    [ -n "$c" ] && { echo "$c"; return 0; }
    return 1
}

# suite NAME [wrapper...]: run one Check suite; prints a summary, returns its status.
suite_line() {
    local log=$1 line skips
    line=$(grep -E '^[0-9]+%: Checks' "$log" | tail -n 1)
    skips=$(grep -c '^SKIP: ' "$log")
    echo "${line:-no Check summary}, $skips skipped"
}

run_suites() {
    local t name log rc
    for name in "${TESTS[@]}"; do
        t=$(budget 150)
        [ "$t" -gt 0 ] || { row "$name" FAIL "no time left"; continue; }
        log=$WORK/$name.log
        timeout "$t" "$BUILD/tests/$name" >"$log" 2>&1
        rc=$?
        grep -E '^[0-9]+%: Checks|:[FE]:' "$log" | head -n 20
        if [ $rc -eq 0 ] && [ $GPU = 1 ] && grep -q '^SKIP: .*no CUDA device' "$log"; then
            row "$name" FAIL "a GPU was found but the tests see none (libcuda.so.1? CUDA_VISIBLE_DEVICES?): $(suite_line "$log")"
        elif [ $rc -eq 0 ]; then
            row "$name" ok "$(suite_line "$log")"
        else
            row "$name" FAIL "exit $rc: $(suite_line "$log")"
        fi
    done
}

memcheck() {
    local name t log rc errs
    if [ $GPU = 0 ]; then
        row "memcheck" skip "no GPU"
        return 0
    fi
    [ -n "${SANITIZER:-}" ] || { row "memcheck" FAIL "compute-sanitizer not found"; return 0; }
    for name in "${TESTS[@]}"; do
        t=$(budget 120)
        [ "$t" -gt 0 ] || { row "memcheck $name" skip "no time left in the stage"; continue; }
        log=$WORK/memcheck_$name.log
        # One process (CK_FORK=no): one CUDA context instead of one per test.
        CK_FORK=no timeout "$t" "$SANITIZER" --tool memcheck --target-processes all \
            --error-exitcode 86 --print-limit 30 "$BUILD/tests/$name" >"$log" 2>&1
        rc=$?
        errs=$(grep -E '========= ERROR SUMMARY' "$log" | tail -n 1 | sed 's/=* *//')
        if grep -qiE 'device not supported|unable to (initialize|connect)|Target application terminated before first instrumented' "$log"; then
            row "memcheck $name" n/a "compute-sanitizer cannot run here: $(grep -m1 -iE 'error|not supported' "$log" | cut -c1-120)"
        elif [ $rc -eq 0 ]; then
            row "memcheck $name" ok "${errs:-no summary}; $(suite_line "$log")"
        elif [ $rc -eq 124 ]; then
            row "memcheck $name" FAIL "timed out after $t s"
        else
            grep -E '^========= (Invalid|Program hit|Uninitialized|ERROR SUMMARY)' "$log" | head -n 10
            row "memcheck $name" FAIL "exit $rc, ${errs:-no summary}; $(suite_line "$log")"
        fi
    done
}

stage1() {
    stage_begin 1 200
    SANITIZER=
    if toolchain_and_build 150; then
        SANITIZER=$(find_sanitizer) || SANITIZER=
        timed "environment report" env_report
        printf '%s\n' "${TOOL_LINES[@]}" >>"$WORK/env.txt"
        timed "CUDA suites" run_suites
        timed "memcheck" memcheck
    else
        timed "environment report" env_report
    fi
    stage_end
}

# ---- training runs (stages 2 and 3) ------------------------------------------------
# The field of a metrics JSONL, one value per line.
field() { sed -nE "s/.*\"$2\":\\[?([^],}]*).*/\\1/p" "$1"; }
# median of a field over steps >= 3
field_median() {
    paste <(field "$1" step) <(field "$1" "$2") |
        awk '$1 >= 3 && $2 != "null" { print $2 }' | sort -g |
        awk '{ v[NR] = $1 } END { if (NR) print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2); else print "n/a" }'
}
# compare a field of two runs: prints "steps maxrel identical"
compare_field() {
    paste <(field "$1" "$3") <(field "$2" "$3") | awk '
        BEGIN { m = 0; same = 1 }
        { n++; d = $1 - $2; if (d < 0) d = -d; s = $2 < 0 ? -$2 : $2; r = d / (s > 1e-30 ? s : 1e-30);
          if (r > m) m = r; if ($1 != $2) same = 0 }
        END { printf "%d %.3g %s\n", n, m, (n && same) ? "yes" : "no" }'
}

# Rewrite a cuda command line for a dry run: cpu backend, host collectives,
# no virtual ranks, the tiny model at a short sequence for GPT-2.
dry_args() {
    local out=() skip=0 a
    for a in "$@"; do
        if [ $skip = 1 ]; then
            skip=0
            continue
        fi
        case $a in
        cuda) out+=(cpu) ;;
        nccl | peer) out+=(host) ;;
        gpt2) out+=(tiny) ;;
        1024) out+=(64) ;;
        --ranks-per-device) skip=1 ;;
        *) out+=("$a") ;;
        esac
    done
    printf '%s\n' "${out[@]}"
}

# train [VAR=VALUE]... NAME WANT_SECONDS ARGS...: run `fsdp train ARGS --log
# NAME.jsonl`, with those variables in its environment.
train() {
    local envs=() name want t rc
    while [[ $1 == *=* ]]; do
        envs+=("$1")
        shift
    done
    name=$1 want=$2
    shift 2
    local args=("$@")
    [ $GPU = 1 ] || mapfile -t args < <(dry_args "$@")
    t=$(budget "$want")
    [ "$t" -gt 0 ] || { echo "$name: no time left"; return 124; }
    echo "\$ ${envs[*]}${envs[*]:+ }fsdp train ${args[*]} --log $name.jsonl" >"$WORK/$name.log"
    timed "train $name" timeout "$t" env ${envs[@]+"${envs[@]}"} "$BIN" train "${args[@]}" \
        --log "$WORK/$name.jsonl" >>"$WORK/$name.log" 2>&1
    rc=$?
    tail -n 2 "$WORK/$name.log"
    return $rc
}

# plan_peak ARGS...: the planner's largest per-device peak for the same run.
plan_peak() {
    local args=() skip=0 a
    for a in "$@"; do # the planner takes no backend, comm or virtual ranks
        if [ $skip = 1 ]; then
            skip=0
            continue
        fi
        case $a in
        --backend | --comm | --ranks-per-device | --steps | --eval | --lr | --warmup) skip=1 ;;
        --quiet | --deterministic) ;;
        *) args+=("$a") ;;
        esac
    done
    [ $GPU = 1 ] || mapfile -t args < <(dry_args "${args[@]}")
    "$BIN" plan "${args[@]}" --json 2>"$WORK/plan.err" | sed -nE 's/.*"max_peak_bytes":([0-9]+).*/\1/p'
}

# peak_vs_plan NAME JSONL ARGS...: the run's largest per-step, per-device
# peak equals the plan's (the planner runs the meta backend, which counts
# what the cpu backend allocates to the byte; cuda counts the same bytes in
# use and keeps its cache, rounding and own buffers out, as reserved).
peak_vs_plan() {
    local name=$1 jsonl=$2 run plan
    shift 2
    run=$(sed -nE 's/.*"peak_bytes":\[([0-9,]*)\].*/\1/p' "$jsonl" | tr ',' '\n' | sort -n | tail -n 1)
    plan=$(plan_peak "$@")
    if [ -n "$run" ] && [ "$run" = "$plan" ]; then
        row "$name" ok "$run bytes, as planned"
    else
        row "$name" FAIL "run ${run:-?} bytes vs plan ${plan:-?} ($(head -c 200 "$WORK/plan.err"))"
    fi
}

COMM1=peer

# cpu_vs_cuda NAME MODEL: 8 steps of MODEL on cpu and on cuda, fp32 and
# bf16: per-step losses within a tolerance, the cuda peak equal to the plan's.
cpu_vs_cuda() {
    local name=$1 model=$2 prec tol n m
    local RUN=(--model "$model" --devices 1 --steps 8 --batch 4 --seq 64 --deterministic --eval 0 --quiet)
    for prec in fp32 bf16; do
        echo "== $name cpu vs cuda ($prec)"
        tol=$([ $prec = fp32 ] && echo 1e-3 || echo 3e-2)
        if train "${name}_cpu_$prec" 60 --backend cpu --precision $prec "${RUN[@]}" &&
            train "${name}_cuda_$prec" 60 --backend cuda --comm $COMM1 --precision $prec "${RUN[@]}"; then
            read -r n m _ < <(compare_field "$WORK/${name}_cuda_$prec.jsonl" "$WORK/${name}_cpu_$prec.jsonl" loss)
            row "$name loss cpu vs cuda ($prec, $COMM1)" \
                "$(awk -v m="$m" -v t="$tol" -v n="$n" 'BEGIN { print (n >= 8 && m <= t) ? "ok" : "FAIL" }')" \
                "$n steps, max rel diff $m (tol $tol)"
            peak_vs_plan "$name cuda peak = plan ($prec)" "$WORK/${name}_cuda_$prec.jsonl" \
                --precision $prec "${RUN[@]}"
        else
            row "$name loss cpu vs cuda ($prec)" FAIL "a run failed: see ${name}_*_$prec.log"
        fi
    done
}

# bit_identical ROW A B: a row saying whether runs A and B (their metrics)
# have the same losses and gradient norms, bit for bit, over >= 8 steps.
bit_identical() {
    local n m same mg same_g
    read -r n m same < <(compare_field "$WORK/$2.jsonl" "$WORK/$3.jsonl" loss)
    read -r _ mg same_g < <(compare_field "$WORK/$2.jsonl" "$WORK/$3.jsonl" grad_norm)
    row "$1" "$([ "$same" = yes ] && [ "$same_g" = yes ] && [ "$n" -ge 8 ] && echo ok || echo FAIL)" \
        "$n steps: losses identical $same (max rel $m), grad norms identical $same_g (max rel $mg)"
}

# Whether this build trains MODEL (one short cpu step); prints why not.
model_trains() {
    local out
    out=$(timeout 60 "$BIN" train --model "$1" --backend cpu --devices 1 --steps 1 --batch 1 \
        --seq 16 --eval 0 --quiet 2>&1) && return 0
    echo "$out" | tail -n 1 | cut -c1-160
    return 1
}

stage2() {
    stage_begin 2 150
    if toolchain_and_build 120; then
        [ "$NCCL_FOUND" = 1 ] && COMM1=nccl
        cpu_vs_cuda tiny tiny
        local why
        if why=$(model_trains llama-tiny); then
            cpu_vs_cuda llama llama-tiny
        else
            echo "== llama-tiny: absent from this build ($why)"
            row "llama-tiny cpu vs cuda" skip "absent: fsdp train --model llama-tiny: $why"
        fi
        echo "== 1 rank vs 4 virtual ranks (peer)"
        local VR=(--backend cuda --model tiny --steps 8 --seq 64 --batch 2 --deterministic --eval 0 --quiet)
        if train vr1 60 "${VR[@]}" --devices 1 --comm peer --grad-accum 4 &&
            train vr4 60 "${VR[@]}" --devices 4 --ranks-per-device 4 --comm peer --grad-accum 1; then
            bit_identical "1 vs 4 virtual ranks: bit-identical" vr4 vr1
        else
            row "1 vs 4 virtual ranks" FAIL "a run failed: see vr1.log / vr4.log"
        fi
        echo "== hybrid: 2 simulated nodes x 2 virtual ranks (peer groups) vs full on 4"
        if [ -s "$WORK/vr4.jsonl" ] &&
            train hyb4 60 "${VR[@]}" --devices 2 --nodes 2 --shard hybrid --ranks-per-device 4 \
                --comm peer --grad-accum 1; then
            bit_identical "hybrid 2x2 vs full 4: bit-identical" hyb4 vr4
        else
            row "hybrid 2x2 vs full 4" FAIL "a run failed: see hyb4.log (and vr4.log)"
        fi
        echo "== 4 virtual ranks (peer) under CUDA_LAUNCH_BLOCKING=1 vs the default run"
        if [ -s "$WORK/vr4.jsonl" ] &&
            train CUDA_LAUNCH_BLOCKING=1 vr4_blocking 60 "${VR[@]}" --devices 4 --ranks-per-device 4 \
                --comm peer --grad-accum 1; then
            bit_identical "CUDA_LAUNCH_BLOCKING=1 vs default: bit-identical" vr4_blocking vr4
        else
            row "CUDA_LAUNCH_BLOCKING=1 vs default" FAIL "a run failed: see vr4_blocking.log (and vr4.log)"
        fi
    fi
    stage_end
}

# ---- stage 3 ---------------------------------------------------------------------
# GPT-2 124M: 12 layers, 768 channels. FLOPs per token, forward and backward:
# 6 N + 12 L C T (llm.c's count, as the trainer's). Peak: H100/H200 SXM dense
# bf16 (the trainer uses the same; KINDS.md measured 788 TFLOP/s for a large
# PyTorch bf16 GEMM on this machine). The trainer's MFU is per GPU (virtual
# ranks share one); it is recomputed here from tokens/s as a cross-check.
PEAK_FLOPS=989e12
gpt2_row() {
    local name=$1 jsonl=$2 params tps ms mfu_log mfu
    params=$(plan_peak_params)
    tps=$(field_median "$jsonl" tokens_per_s)
    ms=$(field_median "$jsonl" step_ms)
    mfu_log=$(field_median "$jsonl" mfu)
    mfu=$(awk -v tps="$tps" -v p="$params" -v peak=$PEAK_FLOPS -v T="$SEQ3" 'BEGIN {
        if (tps == "n/a" || p == "") { print "n/a"; exit }
        printf "%.2f%%", 100 * tps * (6 * p + 12 * 12 * 768 * T) / peak }')
    row "$name" ok "median over steps >= 3: $tps tokens/s, $ms ms/step, MFU $mfu (trainer: $mfu_log)"
}

plan_peak_params() {
    local args=(--model gpt2 --devices 1 --batch 1 --seq 64)
    [ $GPU = 1 ] || mapfile -t args < <(dry_args "${args[@]}")
    "$BIN" plan "${args[@]}" --json 2>/dev/null | sed -nE 's/^\{"model":"[^"]*","params":([0-9]+).*/\1/p'
}

stage3() {
    stage_begin 3 200
    if toolchain_and_build 120; then
        [ "$NCCL_FOUND" = 1 ] && COMM1=nccl
        SEQ3=1024
        [ $GPU = 1 ] || SEQ3=64
        local G=(--backend cuda --model gpt2 --precision bf16 --seq 1024 --steps 12 --eval 0 --quiet)
        echo "== GPT-2 124M, 1 rank ($COMM1)"
        if train gpt2_1rank 120 "${G[@]}" --devices 1 --comm $COMM1 --batch 8; then
            gpt2_row "gpt2 bf16 T=1024 B=8, 1 rank" "$WORK/gpt2_1rank.jsonl"
            peak_vs_plan "gpt2 1 rank peak = plan" "$WORK/gpt2_1rank.jsonl" "${G[@]}" --devices 1 --batch 8
        else
            row "gpt2 bf16 T=1024 B=8, 1 rank" FAIL "see gpt2_1rank.log"
        fi
        echo "== GPT-2 124M, 4 virtual ranks (peer)"
        if train gpt2_4vr 120 "${G[@]}" --devices 4 --ranks-per-device 4 --comm peer --batch 2; then
            gpt2_row "gpt2 bf16 T=1024 4 ranks x B=2, 1 GPU" "$WORK/gpt2_4vr.jsonl"
            peak_vs_plan "gpt2 4 virtual ranks peak = plan" "$WORK/gpt2_4vr.jsonl" "${G[@]}" --devices 4 --batch 2
        else
            row "gpt2 bf16 T=1024 4 virtual ranks" FAIL "see gpt2_4vr.log"
        fi
    fi
    stage_end
}

for s in "${STAGES[@]}"; do
    "stage$s"
done
if [ $FAILED = 1 ]; then
    verdict="FAILURES, see above"
elif [ $GPU = 1 ]; then
    verdict="every check passed"
else
    verdict="the dry run passed (the cpu backend stood in for cuda: nothing ran on a GPU)"
fi
echo "gpu_check: stages ${STAGES[*]}$(dry_note): $verdict; results in $OUTDIR"
exit $FAILED
