#!/usr/bin/env bash
# gpu_check.sh - everything that needs a GPU, in one run of under 8 minutes on
# a one-GPU (H200) machine that has gcc, make and nvcc but maybe neither
# Check nor OpenBLAS nor a package registry.
#
#   tools/gpu_check.sh [OUTDIR]        (default: $OUT, else ./gpu_check_out)
#
# Steps (each under `timeout`, all under one deadline):
#   1. toolchain versions (gcc, make, nvcc, the GPU);
#   2. Check/OpenBLAS: from pkg-config if present, else from the .debs in
#      third_party/debs/ (tools/fetch_gpu_debs.sh, run beforehand on a machine
#      with the registry), unpacked into third_party/root/ with dpkg-deb (or
#      ar + tar), with PKG_CONFIG_PATH / LD_LIBRARY_PATH pointed there and a
#      minimal pkg-config stand-in if the machine has no pkg-config;
#   3. build with CUDA=1 for sm_90 only;
#   4. build/tests/test_cuda: every cuda op against the cpu backend,
#      determinism, nccl/peer collectives, abort paths;
#   5. a tiny training run, cpu vs cuda (fp32 and bf16): per-step losses
#      within a tolerance;
#   6. 1 rank vs 4 virtual ranks on the GPU (--comm peer --ranks-per-device
#      4, same global batch, --deterministic): the same losses;
#   7. GPT-2 124M in bf16 at T=1024 on 1 rank and on 4 virtual ranks:
#      tokens/s and MFU from the metrics JSONL (median over steps >= 3).
# Every log and result goes to OUTDIR; a short table is printed last.
# Exit status: 0 when every check that ran passed.
set -u
cd "$(dirname "$0")/.." || exit 2
OUTDIR=${1:-${OUT:-gpu_check_out}}
mkdir -p "$OUTDIR"
OUTDIR=$(cd "$OUTDIR" && pwd)
exec > >(tee "$OUTDIR/gpu_check.log") 2>&1

START=$(date +%s)
DEADLINE=${GPU_CHECK_SECONDS:-465} # whole script, seconds
BUILD=${BUILD:-build}
ROWS=()
FAILED=0

row() { ROWS+=("$(printf '%-34s %-6s %s' "$1" "$2" "$3")"); [ "$2" = FAIL ] && FAILED=1; return 0; }

# Seconds left for a step that wants $1 (0: no time left for it).
budget() {
    local left=$((DEADLINE - ($(date +%s) - START) - 5))
    [ "$left" -lt 10 ] && { echo 0; return; }
    [ "$1" -lt "$left" ] && echo "$1" || echo "$left"
}

# ---- 1. toolchain ------------------------------------------------------------
echo "== toolchain"
for t in gcc make nvcc; do
    command -v "$t" >/dev/null || { [ "$t" = nvcc ] && [ -x /usr/local/cuda/bin/nvcc ]; } ||
        { echo "gpu_check: $t not found"; exit 2; }
done
NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
gcc --version | head -n 1
make --version | head -n 1
"$NVCC" --version | tail -n 2 | head -n 1
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
echo "cores: $(nproc)"

# ---- 2. Check and OpenBLAS ------------------------------------------------
echo "== dependencies"
deps_from_debs() {
    local root=$PWD/third_party/root debs=(third_party/debs/*.deb)
    [ -e "${debs[0]}" ] || { echo "no .debs in third_party/debs: run tools/fetch_gpu_debs.sh on a machine with the Debian registry and carry third_party/"; return 1; }
    rm -rf "$root" && mkdir -p "$root/pkgconfig" "$root/bin"
    for d in "${debs[@]}"; do
        if command -v dpkg-deb >/dev/null; then
            dpkg-deb -x "$d" "$root" || return 1
        else
            local tmp; tmp=$(mktemp -d)
            (cd "$tmp" && ar x "$OLDPWD/$d" && tar -xf data.tar.* -C "$root") || return 1
            rm -rf "$tmp"
        fi
    done
    local ml=usr/lib/x86_64-linux-gnu
    # .pc files name /usr: point them at the unpacked tree (openblas.pc is an
    # alternatives link on Debian, so take the pthread flavour's own file)
    sed "s|/usr|$root/usr|g" "$root/$ml/pkgconfig/check.pc" > "$root/pkgconfig/check.pc"
    sed "s|/usr|$root/usr|g" "$root/$ml/pkgconfig/libsubunit.pc" > "$root/pkgconfig/libsubunit.pc"
    sed "s|/usr|$root/usr|g" "$root/$ml/openblas-pthread/pkgconfig/openblas.pc" > "$root/pkgconfig/openblas.pc"
    sed "s|/usr|$root/usr|g" "$root/$ml/pkgconfig/libxxhash.pc" > "$root/pkgconfig/libxxhash.pc"
    export PKG_CONFIG_PATH="$root/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
    export LD_LIBRARY_PATH="$root/$ml:$root/$ml/openblas-pthread${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    if ! command -v pkg-config >/dev/null || [ -n "${GPU_CHECK_FAKE_PKGCONFIG:-}" ]; then
        # The Makefile only asks --exists/--cflags/--libs of check, openblas and libxxhash.
        cat > "$root/bin/pkg-config" <<EOF
#!/bin/sh
cflags=""; libs=""; ok=1
mode=\$1; shift
for p in "\$@"; do
  case \$p in
    check) cflags="\$cflags -I$root/usr/include -pthread"; libs="\$libs -L$root/$ml -lcheck_pic -lrt -lm -lsubunit";;
    openblas) cflags="\$cflags -I$root/usr/include/x86_64-linux-gnu/openblas-pthread"; libs="\$libs -L$root/$ml/openblas-pthread -lopenblas";;
    libxxhash) cflags="\$cflags -I$root/usr/include"; libs="\$libs -L$root/$ml -lxxhash";;
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
        echo "pkg-config: none on this machine; using a stand-in for check and openblas"
    fi
    pkg-config --exists check openblas libxxhash
}
if pkg-config --exists check openblas libxxhash 2>/dev/null && [ -z "${GPU_CHECK_FORCE_DEBS:-}" ]; then
    echo "check and openblas: found by pkg-config"
    row "dependencies" ok "system pkg-config"
elif deps_from_debs; then
    echo "check and openblas: unpacked from third_party/debs into third_party/root"
    row "dependencies" ok "third_party/debs unpacked"
else
    row "dependencies" FAIL "Check/OpenBLAS missing (see $OUTDIR/gpu_check.log)"
fi

# ---- 3. build -------------------------------------------------------------------
echo "== build"
BIN=$BUILD/fsdp
TB=$BUILD/tests/test_cuda
t=$(budget 300)
if [ "$t" -gt 0 ] && timeout "$t" make -j"$(nproc)" BUILD="$BUILD" CUDA=1 \
        CUDA_ARCH="-gencode arch=compute_90,code=sm_90" all "$TB" > "$OUTDIR/build.log" 2>&1; then
    row "build (CUDA=1, sm_90)" ok "$(grep -c -i 'warning' "$OUTDIR/build.log") warning lines"
else
    tail -n 30 "$OUTDIR/build.log"
    row "build (CUDA=1, sm_90)" FAIL "see build.log"
fi

# ---- 4. test_cuda -------------------------------------------------------------
echo "== test_cuda"
t=$(budget 150)
if [ -x "$TB" ] && [ "$t" -gt 0 ]; then
    timeout "$t" "$TB" > "$OUTDIR/test_cuda.log" 2>&1; rc=$?
    grep -v '^SKIP' "$OUTDIR/test_cuda.log" | tail -n 25
    line=$(grep -E '^[0-9]+%: Checks' "$OUTDIR/test_cuda.log" | tail -n 1)
    skips=$(grep -c '^SKIP: ' "$OUTDIR/test_cuda.log")
    if [ "$rc" -eq 0 ]; then
        row "test_cuda" ok "$line, $skips skipped"
    else
        row "test_cuda" FAIL "exit $rc: ${line:-no summary (timeout?)}"
    fi
else
    row "test_cuda" FAIL "not built or no time left"
fi

# losses of a metrics JSONL, one per line
losses() { sed -nE 's/.*"loss":([^,}]*).*/\1/p' "$1"; }
# median of a field over steps >= 3
field_median() {
    sed -nE "s/.*\"step\":([0-9]+).*\"$2\":([^,}]*).*/\1 \2/p" "$1" |
        awk '$1 >= 3 && $2 != "null" {print $2}' | sort -g |
        awk '{v[NR]=$1} END {if (NR) print (NR % 2 ? v[(NR+1)/2] : (v[NR/2] + v[NR/2+1]) / 2); else print "n/a"}'
}
# compare two loss files: prints "steps maxrel identical"
compare_losses() {
    paste <(losses "$1") <(losses "$2") | awk '
        { n++; d = $1 - $2; if (d < 0) d = -d; s = $2 < 0 ? -$2 : $2; r = d / (s > 1e-30 ? s : 1e-30);
          if (r > m) m = r; if ($1 != $2) same = 0 }
        BEGIN { m = 0; same = 1 }
        END { printf "%d %.3g %s\n", n, m, (n && same) ? "yes" : "no" }'
}

train() { # name timeout args...
    local name=$1 want=$2; shift 2
    local t; t=$(budget "$want")
    [ "$t" -gt 0 ] || { echo "$name: no time left"; return 124; }
    echo "\$ fsdp train $*" > "$OUTDIR/$name.log"
    timeout "$t" "$BIN" train "$@" --log "$OUTDIR/$name.jsonl" >> "$OUTDIR/$name.log" 2>&1
    local rc=$?
    tail -n 3 "$OUTDIR/$name.log"
    return $rc
}

# ---- 5. tiny: cpu vs cuda -------------------------------------------------------
TINY=(--model tiny --devices 1 --steps 8 --batch 4 --seq 64 --deterministic --quiet)
for prec in fp32 bf16; do
    echo "== tiny cpu vs cuda ($prec)"
    tol=$([ $prec = fp32 ] && echo 1e-3 || echo 3e-2)
    if train "tiny_cpu_$prec" 60 --backend cpu --precision $prec "${TINY[@]}" &&
       train "tiny_cuda_$prec" 60 --backend cuda --comm nccl --precision $prec "${TINY[@]}"; then
        read -r n m same < <(compare_losses "$OUTDIR/tiny_cuda_$prec.jsonl" "$OUTDIR/tiny_cpu_$prec.jsonl")
        ok=$(awk -v m="$m" -v t="$tol" -v n="$n" 'BEGIN { print (n > 0 && m <= t) ? "ok" : "FAIL" }')
        row "tiny loss cpu vs cuda ($prec)" "$ok" "$n steps, max rel diff $m (tol $tol)"
    else
        row "tiny loss cpu vs cuda ($prec)" FAIL "a run failed: see tiny_*_$prec.log"
    fi
done

# ---- 6. 1 rank vs 4 virtual ranks ----------------------------------------------
echo "== 1 rank vs 4 virtual ranks (peer)"
VR=(--backend cuda --model tiny --steps 8 --seq 64 --batch 2 --deterministic --quiet)
if train vr1 60 "${VR[@]}" --devices 1 --comm peer --grad-accum 4 &&
   train vr4 60 "${VR[@]}" --devices 4 --ranks-per-device 4 --comm peer --grad-accum 1; then
    read -r n m same < <(compare_losses "$OUTDIR/vr4.jsonl" "$OUTDIR/vr1.jsonl")
    ok=$(awk -v m="$m" -v n="$n" 'BEGIN { print (n > 0 && m <= 1e-5) ? "ok" : "FAIL" }')
    row "1 vs 4 virtual ranks (peer)" "$ok" "$n steps, bit-identical: $same, max rel diff $m"
else
    row "1 vs 4 virtual ranks (peer)" FAIL "a run failed: see vr1.log / vr4.log"
fi

# ---- 7. GPT-2 124M throughput --------------------------------------------------
G=(--backend cuda --model gpt2 --precision bf16 --seq 1024 --steps 8 --warmup 2 --quiet)
echo "== GPT-2 124M, 1 rank"
if train gpt2_1rank 100 "${G[@]}" --devices 1 --batch 8; then
    row "gpt2 bf16 T=1024 B=8, 1 rank" ok "tok/s $(field_median "$OUTDIR/gpt2_1rank.jsonl" tokens_per_s), mfu $(field_median "$OUTDIR/gpt2_1rank.jsonl" mfu)"
else
    row "gpt2 bf16 T=1024 B=8, 1 rank" FAIL "see gpt2_1rank.log"
fi
echo "== GPT-2 124M, 4 virtual ranks"
if train gpt2_4vr 100 "${G[@]}" --devices 4 --ranks-per-device 4 --comm peer --batch 2; then
    mfu4=$(field_median "$OUTDIR/gpt2_4vr.jsonl" mfu)
    # the trainer divides by the number of ranks; here 4 ranks share 1 GPU
    mfu_gpu=$(awk -v m="$mfu4" 'BEGIN { if (m == "n/a") print "n/a"; else printf "%.4g", 4 * m }')
    row "gpt2 bf16 T=1024 2x4 virtual ranks" ok "tok/s $(field_median "$OUTDIR/gpt2_4vr.jsonl" tokens_per_s), mfu of the GPU $mfu_gpu (logged per-rank $mfu4)"
else
    row "gpt2 bf16 T=1024 2x4 virtual ranks" FAIL "see gpt2_4vr.log"
fi

# ---- summary ---------------------------------------------------------------------
{
    echo
    echo "== gpu_check summary ($(( $(date +%s) - START )) s; logs in $OUTDIR)"
    printf '%s\n' "${ROWS[@]}"
} | tee "$OUTDIR/results.txt"
exit $FAILED
