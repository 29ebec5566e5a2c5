#!/usr/bin/env bash
# Install what fsdp needs to build and test on Debian/Ubuntu (run as root).
# Check (unit tests), OpenBLAS (cpu backend), pkg-config. The CUDA toolkit
# and NCCL are optional and not installed here.
set -euo pipefail
pkgs=(build-essential pkg-config check libsubunit-dev libopenblas-dev python3)
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
