#!/usr/bin/env bash
# Install what fsdp needs on Debian/Ubuntu (run as root): a C toolchain,
# pkg-config, Check (unit tests), OpenBLAS (the cpu backend's fp32 GEMMs,
# loaded at run time), oneDNN (its bf16 GEMMs on CPUs with bf16 dot products;
# optional: without it the Makefile builds the fp32 fallback), PCRE2 (the
# tokenizers' split patterns), utf8proc (their NFC normalizer), xxHash
# (checkpoint checksums) and Open MPI (jobs of several processes: mpirun, and
# the 2-process tests `make test` runs; the build works without it, MPI=0).
# With --fuzz, also clang and its libFuzzer runtime (make fuzz). The CUDA
# toolkit and NCCL are optional and not installed here.
set -euo pipefail
pkgs=(build-essential pkg-config check libsubunit-dev libopenblas-dev libdnnl-dev libpcre2-dev
      libutf8proc-dev libxxhash-dev libopenmpi-dev openmpi-bin)
if [ "${1:-}" = "--fuzz" ]; then
    pkgs+=(clang libclang-rt-14-dev)
fi
missing=()
for p in "${pkgs[@]}"; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
    echo "install-deps: all present"
    exit 0
fi
if [ "$(id -u)" != 0 ]; then
    echo "install-deps: missing ${missing[*]}; run as root: apt-get install -y ${missing[*]}" >&2
    exit 1
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq "${missing[@]}"
