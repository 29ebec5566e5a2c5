#!/usr/bin/env bash
# Install what fsdp needs on Debian/Ubuntu (run as root): a C toolchain,
# pkg-config, Check (unit tests), OpenBLAS (the cpu backend's fp32 GEMMs,
# loaded at run time) and oneDNN (its bf16 GEMMs on CPUs with bf16 dot
# products; optional: without it the Makefile builds the fp32 fallback). With --fuzz,
# also clang and its libFuzzer runtime (make fuzz). The CUDA toolkit and
# NCCL are optional and not installed here.
set -euo pipefail
pkgs=(build-essential pkg-config check libsubunit-dev libopenblas-dev libdnnl-dev)
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
