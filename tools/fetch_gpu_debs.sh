#!/usr/bin/env bash
# fetch_gpu_debs.sh - download, here (a machine with the Debian registry),
# the .deb packages that tools/gpu_check.sh unpacks on a GPU machine that has
# gcc and nvcc but maybe no make, neither Check nor OpenBLAS, and no package
# registry.
#
#   tools/fetch_gpu_debs.sh          -> third_party/debs/*.deb  (git-ignored)
#
# Then carry third_party/ to the GPU machine with the working tree (for the
# device tool: carry ["third_party"]). The list is Check and OpenBLAS
# (pthread flavour) with their run-time dependencies that a bare
# gcc/CUDA image may lack (apt-cache depends: check -> libsubunit-dev ->
# libsubunit0; libopenblas-pthread-dev -> libopenblas0-pthread ->
# libgfortran5 -> libquadmath0), xxHash (libxxhash-dev -> libxxhash0, the
# checkpoint checksums), PCRE2 and utf8proc (the tokenizers), and make
# (needing libc6 alone; gpu_check.sh uses it only where the machine has no
# make: the device image lists CMake and ninja, not make). The packages must
# suit the GPU machine's release and architecture (this one: see
# /etc/os-release; gpu_check's stage 1 prints the GPU machine's): Debian
# 12's need glibc 2.34 or newer, which newer Debian and Ubuntu releases
# have. About 14 MB to carry.
set -euo pipefail
cd "$(dirname "$0")/.."
PKGS=(check libsubunit0 libsubunit-dev libopenblas0-pthread libopenblas-pthread-dev
      libgfortran5 libquadmath0 libxxhash0 libxxhash-dev libpcre2-8-0 libpcre2-dev
      libpcre2-16-0 libpcre2-32-0 libpcre2-posix3 libutf8proc2 libutf8proc-dev make)
mkdir -p third_party/debs
cd third_party/debs
if ! apt-get download "${PKGS[@]}" 2>/dev/null; then
    echo "fetch_gpu_debs: apt-get download failed; running 'apt-get update' once and retrying" >&2
    apt-get update -qq
    apt-get download "${PKGS[@]}"
fi
ls -l ./*.deb
echo "fetch_gpu_debs: $(ls ./*.deb | wc -l) packages in third_party/debs ($(. /etc/os-release; echo "$PRETTY_NAME"), $(dpkg --print-architecture))"
