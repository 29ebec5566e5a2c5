#!/usr/bin/env bash
# gpu_check.sh - everything that needs a GPU, in stages that each fit one
# short call on a one-GPU (H200) machine that has gcc, make and nvcc but
# maybe no NCCL install, no Check or OpenBLAS, and no package registry.
#
#   tools/gpu_check.sh [--stage N]... [OUTDIR]   (default: every stage; OUTDIR: $OUT, else
#                                                 ./gpu_check_out)
#
#   stage 1 (~3 min): environment report (GPU, driver, runtime, nvcc, where
#           NCCL, cuBLAS, compute-sanitizer, Check and OpenBLAS were found);
#           build for sm_90 only (MPI=0); every CUDA suite (tests/test_cuda*.c:
#           test_cuda, test_cuda_comm, test_cuda_llama, test_cuda_ops, ...);
#           compute-sanitizer --tool memcheck over them, test_cuda first,
#           as long as the stage's time lasts.
#   stage 2 (~2 min): tiny training, cpu vs cuda (fp32, bf16): per-step
#           losses within a tolerance, the cuda peak equal to `fsdp plan`'s
#           to the byte; the same for llama-tiny when this build has it
#           (`fsdp train --model llama-tiny` runs on cpu; else a row says it
#           is absent); 1 rank vs 4 virtual ranks (peer, --deterministic):
#           bit-identical losses and gradient norms; hybrid sharding on 2
#           simulated nodes x 2 virtual ranks (peer's group communicators)
#           vs full sharding on 4: bit-identical too.
#   stage 3 (~3 min): GPT-2 124M, bf16, T 1024, --eval 0, on 1 rank and on 4
#           virtual ranks: tokens/s, step time, MFU, peak vs the planner.
#
# Each stage runs alone (it builds what it needs; make is incremental) and
# leaves two files in OUTDIR: stageN.txt (results and where the time went)
# and stageN-logs.tar.gz (every log); the device tool brings back at most 8
# files. Logs are written under $BUILD/gpu_check/ first.
#
# Nothing here calls apt or any registry, and MPI is left out (MPI=0). NCCL is looked for in
# $NCCL_HOME, $CUDA_HOME, /usr and the Python wheel (import nvidia.nccl,
# a namespace package: its __path__, not __file__); without it CUDA is built
# with NCCL=0 (peer collectives only). cuBLAS and cudart come from
# $CUDA_HOME or, failing that, the Python wheels (nvidia/cu13), linked
# through symlinks in $BUILD/gpu_check/lib. Check and OpenBLAS come from
# pkg-config or from .debs carried in third_party/debs
# (tools/fetch_gpu_debs.sh; carry third_party with the call).
#
# Without a GPU (or with GPU_CHECK_DRY=1) every stage still runs: the build,
# the suites (their GPU tests skip), and the training commands with the cpu
# backend standing in for cuda (host collectives for nccl/peer, the tiny
# model for GPT-2), so the script's own logic is exercised before the first
# real run. Other knobs: GPU_CHECK_SECONDS (per-stage deadline),
# GPU_CHECK_NCCL=none (build without NCCL), GPU_CHECK_FORCE_DEBS=1,
# GPU_CHECK_FAKE_PKGCONFIG=1 (test the carried-dependency path),
# GPU_CHECK_NCCL=wheel and GPU_CHECK_CUBLAS=wheel (take those from the
# Python wheels even when the toolkit has them), BUILD.
# Exit status: 0 when every check that ran passed.
set -u
cd "$(dirname "$0")/.." || exit 2
ROOT=$PWD

STAGES=()
OUTDIR=
while [ $# -gt 0 ]; do
    case $1 in
    --stage | -s) STAGES+=("$2"); shift 2 ;;
    --stage=*) STAGES+=("${1#--stage=}"); shift ;;
    -h | --help) sed -n '2,/^set -u/p' "$0" | sed 's/^# \{0,1\}//; /^set -u/d'; exit 0 ;;
    *) OUTDIR=$1; shift ;;
    esac
done
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

# ---- the GPU, or a dry run ------------------------------------------------------
GPU=0
if [ "${GPU_CHECK_DRY:-0}" != 1 ] && command -v nvidia-smi >/dev/null &&
    nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
    GPU=1
fi
dry_note() { [ $GPU = 1 ] || echo " (dry run: no GPU)"; }

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
    ROWS+=("$(printf '%-40s %-5s %s' "$1" "$2" "$3")")
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

# ---- toolchain: nvcc, cuBLAS, NCCL, Check, OpenBLAS ------------------------------
find_nvcc() {
    local c
    for c in ${CUDA_HOME:+"$CUDA_HOME/bin/nvcc"} "$(command -v nvcc 2>/dev/null)" \
        /usr/local/cuda/bin/nvcc /usr/local/cuda-*/bin/nvcc /usr/bin/nvcc; do
        [ -n "$c" ] && [ -x "$c" ] && { echo "$c"; return 0; }
    done
    return 1
}

# The Python wheels' folder (site-packages/nvidia), if any.
wheel_dir() {
    local py=${PYTHON:-python3}
    command -v "$py" >/dev/null || return 1
    "$py" -c 'import nvidia, sys; print(list(nvidia.__path__)[0])' 2>/dev/null
}

# NCCL: prints "HOME LIB" (LIB empty: -lnccl from HOME/lib) or fails.
find_nccl() {
    local h lib homes=(${NCCL_HOME:+"$NCCL_HOME"} "$CUDA_HOME" /usr /usr/local)
    case ${GPU_CHECK_NCCL:-} in
    none) return 1 ;;
    wheel) homes=() ;;
    esac
    for h in "${homes[@]}"; do
        [ -f "$h/include/nccl.h" ] || continue
        for lib in "$h/lib/libnccl.so" "$h/lib64/libnccl.so" "$h/lib/x86_64-linux-gnu/libnccl.so"; do
            [ -e "$lib" ] && { echo "$h $lib"; return 0; }
        done
        for lib in "$h"/lib/libnccl.so.2 "$h"/lib64/libnccl.so.2 "$h"/lib/x86_64-linux-gnu/libnccl.so.2; do
            [ -e "$lib" ] && { echo "$h $lib"; return 0; }
        done
    done
    local py=${PYTHON:-python3}
    h=$("$py" -c 'import nvidia.nccl as n; print(list(n.__path__)[0])' 2>/dev/null) || return 1
    [ -f "$h/include/nccl.h" ] && [ -e "$h/lib/libnccl.so.2" ] && { echo "$h $h/lib/libnccl.so.2"; return 0; }
    return 1
}

# The folder holding the newest file matching lib$1.so* under the given folders.
find_lib() {
    local name=$1 d f
    shift
    for d in "$@"; do
        f=$(ls "$d"/lib"$name".so* 2>/dev/null | sort -V | tail -n 1)
        [ -n "$f" ] && { echo "$f"; return 0; }
    done
    return 1
}

deps_from_debs() {
    local root=$ROOT/third_party/root debs=("$ROOT"/third_party/debs/*.deb)
    [ -e "${debs[0]}" ] || {
        echo "no .debs in third_party/debs: run tools/fetch_gpu_debs.sh on a machine with the Debian registry and carry third_party/"
        return 1
    }
    rm -rf "$root" && mkdir -p "$root/pkgconfig" "$root/bin"
    for d in "${debs[@]}"; do
        if command -v dpkg-deb >/dev/null; then
            dpkg-deb -x "$d" "$root" || return 1
        else
            local tmp
            tmp=$(mktemp -d)
            (cd "$tmp" && ar x "$d" && tar -xf data.tar.* -C "$root") || return 1
            rm -rf "$tmp"
        fi
    done
    local ml=usr/lib/x86_64-linux-gnu
    # .pc files name /usr: point them at the unpacked tree (openblas.pc is an
    # alternatives link on Debian, so take the pthread flavour's own file)
    local pc
    for pc in check libsubunit libxxhash libpcre2-8 libutf8proc; do
        sed "s|/usr|$root/usr|g" "$root/$ml/pkgconfig/$pc.pc" >"$root/pkgconfig/$pc.pc" || return 1
    done
    sed "s|/usr|$root/usr|g" "$root/$ml/openblas-pthread/pkgconfig/openblas.pc" >"$root/pkgconfig/openblas.pc" ||
        return 1
    export PKG_CONFIG_PATH="$root/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
    export LD_LIBRARY_PATH="$root/$ml:$root/$ml/openblas-pthread${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    if ! command -v pkg-config >/dev/null || [ -n "${GPU_CHECK_FAKE_PKGCONFIG:-}" ]; then
        # The Makefile only asks --exists/--cflags/--libs of $DEP_PKGS.
        cat >"$root/bin/pkg-config" <<EOF
#!/bin/sh
cflags=""; libs=""; ok=1
mode=\$1; shift
for p in "\$@"; do
  case \$p in
    check) cflags="\$cflags -I$root/usr/include -pthread"; libs="\$libs -L$root/$ml -lcheck_pic -lrt -lm -lsubunit";;
    openblas) cflags="\$cflags -I$root/usr/include/x86_64-linux-gnu/openblas-pthread"; libs="\$libs -L$root/$ml/openblas-pthread -lopenblas";;
    libxxhash) cflags="\$cflags -I$root/usr/include"; libs="\$libs -L$root/$ml -lxxhash";;
    libpcre2-8) cflags="\$cflags -I$root/usr/include"; libs="\$libs -L$root/$ml -lpcre2-8";;
    libutf8proc) cflags="\$cflags -I$root/usr/include"; libs="\$libs -L$root/$ml -lutf8proc";;
    *) ok=0;;
  esac
done
case \$mode in
  --exists) [ \$ok = 1 ];;
  --cflags) echo "\$cflags";;
  --libs) echo "\$libs";;
  --modversion) echo 0;;
  *) exit 1;;
esac
EOF
        chmod +x "$root/bin/pkg-config"
        export PATH="$root/bin:$PATH"
        echo "pkg-config: using a stand-in for $DEP_PKGS"
    fi
    pkg-config --exists $DEP_PKGS
}

# Sets MAKE_ARGS and the TOOL_* report lines; returns 1 if the build cannot
# even be attempted.
setup_toolchain() {
    TOOL_LINES=()
    MAKE_ARGS=(BUILD="$BUILD" CUDA=1 MPI=0 INSTALL_DEPS=0 CUDA_ARCH="-gencode arch=compute_90,code=sm_90")
    local nvcc
    nvcc=$(find_nvcc) || { TOOL_LINES+=("nvcc: NOT FOUND (set CUDA_HOME)"); return 1; }
    CUDA_HOME=$(cd "$(dirname "$nvcc")/.." && pwd)
    MAKE_ARGS+=(CUDA_HOME="$CUDA_HOME" NVCC="$nvcc")
    TOOL_LINES+=("nvcc: $nvcc ($("$nvcc" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p'))")
    local wheels
    wheels=$(wheel_dir) || wheels=
    # cuBLAS, cuBLASLt and cudart: the toolkit's, else the wheels'
    local libdirs=("$CUDA_HOME/lib64" "$CUDA_HOME/lib" "$CUDA_HOME/targets/x86_64-linux/lib")
    [ "${GPU_CHECK_CUBLAS:-}" = wheel ] && libdirs=(/nonexistent)
    local lib need_links=0 found
    for lib in cudart cublas cublasLt; do
        if ! found=$(find_lib "$lib" "${libdirs[@]}"); then
            need_links=1
        fi
    done
    if [ $need_links = 1 ] && [ -n "$wheels" ]; then
        local linkdir=$WORKROOT/lib
        rm -rf "$linkdir" && mkdir -p "$linkdir"
        for lib in cudart cublas cublasLt; do
            found=$(find_lib "$lib" "${libdirs[@]}" "$wheels/cu13/lib" "$wheels/cublas/lib" \
                "$wheels/cuda_runtime/lib") || { TOOL_LINES+=("lib$lib: NOT FOUND"); return 1; }
            ln -sf "$found" "$linkdir/lib$lib.so"
            ln -sf "$found" "$linkdir/$(basename "$found")"
            TOOL_LINES+=("lib$lib: $found (linked through $linkdir)")
        done
        MAKE_ARGS+=(CUDA_LIBDIR="$linkdir")
        if [ ! -f "$CUDA_HOME/include/cublas_v2.h" ] && [ -f "$wheels/cu13/include/cublas_v2.h" ]; then
            MAKE_ARGS+=(EXTRA_CFLAGS="-I$wheels/cu13/include" EXTRA_NVFLAGS="-I$wheels/cu13/include")
            TOOL_LINES+=("cublas_v2.h: $wheels/cu13/include")
        fi
    else
        for lib in cudart cublas cublasLt; do
            TOOL_LINES+=("lib$lib: $(find_lib "$lib" "${libdirs[@]}" || echo 'NOT FOUND')")
        done
        local d
        for d in "${libdirs[@]}"; do
            [ -e "$d/libcublas.so" ] && { MAKE_ARGS+=(CUDA_LIBDIR="$d"); break; }
        done
    fi
    # NCCL
    local nccl
    if nccl=$(find_nccl); then
        local home=${nccl%% *} so=${nccl#* }
        MAKE_ARGS+=(NCCL=1 NCCL_HOME="$home" NCCL_LIB="$so")
        local ver
        ver=$(awk '/#define NCCL_(MAJOR|MINOR|PATCH) /{printf "%s%s", sep, $3; sep="."}' "$home/include/nccl.h")
        TOOL_LINES+=("nccl: $so (nccl.h $ver in $home/include)")
        NCCL_FOUND=1
    else
        MAKE_ARGS+=(NCCL=0)
        TOOL_LINES+=("nccl: NOT FOUND: building with NCCL=0 (--comm peer only)")
        NCCL_FOUND=0
    fi
    # Check and OpenBLAS
    if [ -z "${GPU_CHECK_FORCE_DEBS:-}" ] && pkg-config --exists $DEP_PKGS 2>/dev/null; then
        TOOL_LINES+=("$DEP_PKGS: pkg-config ($(pkg-config --modversion $DEP_PKGS | tr '\n' ' '))")
    elif deps_from_debs >"$WORKROOT/deps.log" 2>&1; then
        TOOL_LINES+=("$DEP_PKGS: unpacked from third_party/debs into third_party/root")
    else
        TOOL_LINES+=("$DEP_PKGS: MISSING ($(tail -n 1 "$WORKROOT/deps.log"))")
        return 1
    fi
    return 0
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
        if command -v nvidia-smi >/dev/null; then
            nvidia-smi --query-gpu=index,name,memory.total,driver_version,clocks.sm,clocks.max.sm,power.limit \
                --format=csv 2>&1 | sed 's/^/gpu: /'
        else
            echo "gpu: nvidia-smi not found"
        fi
        echo "gcc: $(gcc --version | head -n 1)"
        echo "make: $(make --version | head -n 1)"
        echo "python3: $(command -v python3 || echo none) $(python3 -c 'import sys; print(sys.version.split()[0])' 2>/dev/null)"
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
        if [ $rc -eq 0 ]; then
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

# train NAME WANT_SECONDS ARGS...: run `fsdp train ARGS --log NAME.jsonl`.
train() {
    local name=$1 want=$2 t rc
    shift 2
    local args=("$@")
    [ $GPU = 1 ] || mapfile -t args < <(dry_args "$@")
    t=$(budget "$want")
    [ "$t" -gt 0 ] || { echo "$name: no time left"; return 124; }
    echo "\$ fsdp train ${args[*]} --log $name.jsonl" >"$WORK/$name.log"
    timed "train $name" timeout "$t" "$BIN" train "${args[@]}" --log "$WORK/$name.jsonl" >>"$WORK/$name.log" 2>&1
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
echo "gpu_check: stages ${STAGES[*]}$(dry_note): $([ $FAILED = 0 ] && echo 'every check passed' || echo 'FAILURES, see above'); results in $OUTDIR"
exit $FAILED
