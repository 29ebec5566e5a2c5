# gpu_check_env.sh - what tools/gpu_check.sh needs to know about the machine
# before it builds anything: whether there is a GPU, whether the build can
# start (preflight), and where nvcc, cuBLAS, NCCL, Check and OpenBLAS are.
# Sourced by gpu_check.sh (not run alone); it reads ROOT, WORKROOT, BUILD and
# DEP_PKGS and sets the variables each function names.
#
# The GPU machine this is written for (.library/device/KINDS.md) has CUDA 13
# (nvcc, cuBLAS, compute-sanitizer), a Python 3.12 venv (/opt/torch/.venv)
# with torch and the nvidia-nccl wheel, CMake and ninja, maybe no make, no
# Check or OpenBLAS, and no package registry. What it lacks comes from .debs
# fetched elsewhere by tools/fetch_gpu_debs.sh and carried in
# third_party/debs; they are unpacked into third_party/root, a local prefix
# whose bin/ goes first on PATH.
#
# Detection reads the machine's own paths; GPU_CHECK_SYSROOT=DIR reads them
# under DIR instead and ignores PATH, so that every path of gpu_detect can be
# exercised without a GPU (with gpu_check.sh --detect).

# ---- the GPU -------------------------------------------------------------------
# gpu_detect: sets GPU (1 or 0), GPU_HOW (how it was found, or why not) and
# NVSMI (the nvidia-smi that answered, else empty); returns 0 when a GPU is
# there. A GPU is there when nvidia-smi (on PATH or in the driver's usual
# folders: the device image mounts the driver at /usr/local/nvidia) lists
# one, or else when a device node /dev/nvidiaN exists (nvidia-smi missing or
# broken: the CUDA suites then tell whether CUDA sees it). GPU_CHECK_DRY=1:
# no GPU, whatever is there.
gpu_detect() {
    local root=${GPU_CHECK_SYSROOT:-} c list n smi_note= nodes
    local places="no nvidia-smi on PATH or in /usr/local/nvidia/bin, /usr/bin, /usr/local/bin,"
    places+=" /opt/nvidia/bin"
    GPU=0
    NVSMI=
    if [ "${GPU_CHECK_DRY:-0}" = 1 ]; then
        GPU_HOW="GPU_CHECK_DRY=1 (a dry run, whatever the machine has)"
        return 1
    fi
    c=
    [ -n "$root" ] || c=$(command -v nvidia-smi 2>/dev/null)
    for c in "$c" "$root"/usr/local/nvidia/bin/nvidia-smi "$root"/usr/bin/nvidia-smi \
        "$root"/usr/local/bin/nvidia-smi "$root"/opt/nvidia/bin/nvidia-smi; do
        [ -n "$c" ] && [ -x "$c" ] && { NVSMI=$c; break; }
    done
    if [ -n "$NVSMI" ]; then
        list=$(timeout 30 "$NVSMI" -L 2>&1)
        n=$(grep -c '^GPU ' <<<"$list")
        if [ "$n" -gt 0 ]; then
            GPU=1
            GPU_HOW="$NVSMI -L: $(grep -m1 '^GPU ' <<<"$list" | cut -c1-100)"
            [ "$n" -gt 1 ] && GPU_HOW+=" (and $((n - 1)) more)"
            return 0
        fi
        smi_note="$NVSMI -L lists no GPU ($(head -n 1 <<<"$list" | cut -c1-100))"
    fi
    nodes=$(ls -d "$root"/dev/nvidia[0-9]* 2>/dev/null | tr '\n' ' ')
    if [ -n "$nodes" ]; then
        GPU=1
        GPU_HOW="device node(s) ${nodes% }; ${smi_note:-$places}"
        return 0
    fi
    GPU_HOW="${smi_note:-$places}; no /dev/nvidia[0-9]* device node"
    return 1
}

# gpu_driver_lib: prints where the driver's libcuda.so.1 is; a folder the
# loader does not search (the driver's mount) is added to LD_LIBRARY_PATH.
# Never the toolkit's compat/ folder: that library must match the kernel
# driver, which it may not. Returns 1 (with a note) when none is found.
gpu_driver_lib() {
    local root=${GPU_CHECK_SYSROOT:-} d ldc
    ldc=$(command -v ldconfig 2>/dev/null || echo /sbin/ldconfig)
    if [ -z "$root" ] && "$ldc" -p 2>/dev/null | grep -q 'libcuda\.so\.1 '; then
        echo "libcuda.so.1: in the loader's cache ($("$ldc" -p | awk '/libcuda\.so\.1 / { print $NF; exit }'))"
        return 0
    fi
    for d in "$root"/usr/local/nvidia/lib64 "$root"/usr/local/nvidia/lib; do
        if [ -e "$d/libcuda.so.1" ]; then
            case ":${LD_LIBRARY_PATH:-}:" in
            *":$d:"*) ;;
            *) export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" ;;
            esac
            echo "libcuda.so.1: $d (added to LD_LIBRARY_PATH)"
            return 0
        fi
    done
    for d in "$root"/usr/lib/x86_64-linux-gnu "$root"/usr/lib64 "$root"/lib/x86_64-linux-gnu; do
        [ -e "$d/libcuda.so.1" ] && { echo "libcuda.so.1: $d"; return 0; }
    done
    echo "libcuda.so.1: not found (the driver's library: without it CUDA sees no GPU)"
    return 1
}

# ---- Python's site-packages: the nvidia wheels ------------------------------------
# Every site-packages folder that may hold the nvidia wheels, each once:
# $PYTHON's and python3's own, then the usual venv and system places by
# path, so that the venv's wheels are found when python3 on PATH is another
# Python (the device image's venv is /opt/torch/.venv).
site_dirs() {
    local py pat d
    {
        for py in ${PYTHON:+"$PYTHON"} python3; do
            command -v "$py" >/dev/null 2>&1 || continue
            "$py" -c 'import sys; print("\n".join(p for p in sys.path if p.endswith("-packages")))' \
                2>/dev/null
        done
        # globs, expanded unquoted on purpose (a venv path with spaces is not looked for)
        for pat in "${VIRTUAL_ENV:-/nonexistent}/lib/python3*/site-packages" \
            '/opt/*/.venv/lib/python3*/site-packages' '/opt/*/venv/lib/python3*/site-packages' \
            '/opt/*/lib/python3*/site-packages' '/opt/venv*/lib/python3*/site-packages' \
            '/usr/local/lib/python3*/dist-packages' '/usr/local/lib/python3*/site-packages' \
            /usr/lib/python3/dist-packages; do
            for d in $pat; do
                [ -d "$d" ] && echo "$d"
            done
        done
    } | awk 'length && !seen[$0]++'
}

# The wheels' nvidia/ folders (site-packages/nvidia), one a line.
wheel_dirs() {
    local d
    site_dirs | while read -r d; do
        [ -d "$d/nvidia" ] && echo "$d/nvidia"
    done
}

# ---- nvcc, cuBLAS, NCCL ------------------------------------------------------------
find_nvcc() {
    local c
    for c in ${CUDA_HOME:+"$CUDA_HOME/bin/nvcc"} "$(command -v nvcc 2>/dev/null)" \
        /usr/local/cuda/bin/nvcc /usr/local/cuda-*/bin/nvcc /usr/bin/nvcc; do
        [ -n "$c" ] && [ -x "$c" ] && { echo "$c"; return 0; }
    done
    return 1
}

# NCCL: prints "HOME LIB" (the folder holding include/nccl.h, the library
# to link by full path) or fails. Looked for in $NCCL_HOME, $CUDA_HOME, /usr,
# /usr/local, then the wheels (nvidia/nccl/, or nvidia/cu13/ should a wheel
# put it there).
find_nccl() {
    local h lib w homes=(${NCCL_HOME:+"$NCCL_HOME"} "$CUDA_HOME" /usr /usr/local)
    case ${GPU_CHECK_NCCL:-} in
    none) return 1 ;;
    wheel) homes=() ;;
    esac
    while read -r w; do
        homes+=("$w/nccl" "$w/cu13")
    done < <(wheel_dirs)
    for h in "${homes[@]}"; do
        [ -f "$h/include/nccl.h" ] || continue
        for lib in "$h"/lib/libnccl.so "$h"/lib64/libnccl.so "$h"/lib/x86_64-linux-gnu/libnccl.so \
            "$h"/lib/libnccl.so.2 "$h"/lib64/libnccl.so.2 "$h"/lib/x86_64-linux-gnu/libnccl.so.2; do
            [ -e "$lib" ] && { echo "$h $lib"; return 0; }
        done
    done
    return 1
}

# The newest file matching lib$1.so* in the first of the given folders that
# has one.
find_lib() {
    local name=$1 d f
    shift
    for d in "$@"; do
        f=$(ls "$d"/lib"$name".so* 2>/dev/null | sort -V | tail -n 1)
        [ -n "$f" ] && { echo "$f"; return 0; }
    done
    return 1
}

# cudart, cuBLAS and cuBLASLt: the linker wants lib<name>.so, the program
# then loads the versioned name (libcublas.so.13) from the rpath. Sets
# CUDA_LIBDIR_USED: the toolkit's folder when it has all three unversioned
# names; else $WORKROOT/lib, a folder of links holding both names, to the
# toolkit's versioned files or, failing those, the wheels'. Adds to TOOL_LINES.
CUDA_LIBS="cudart cublas cublasLt"
setup_cuda_libs() {
    local libdirs=("$CUDA_HOME/lib64" "$CUDA_HOME/lib" "$CUDA_HOME/targets/x86_64-linux/lib")
    [ -n "${GPU_CHECK_CUDA_LIBDIR:-}" ] && libdirs=("$GPU_CHECK_CUDA_LIBDIR")
    [ "${GPU_CHECK_CUBLAS:-}" = wheel ] && libdirs=()
    local d lib ok
    for d in "${libdirs[@]}"; do
        ok=1
        for lib in $CUDA_LIBS; do
            [ -e "$d/lib$lib.so" ] || ok=0
        done
        if [ $ok = 1 ]; then
            CUDA_LIBDIR_USED=$d
            for lib in $CUDA_LIBS; do
                TOOL_LINES+=("lib$lib: $(find_lib "$lib" "$d")")
            done
            return 0
        fi
    done
    local wheels=() w found f linkdir=$WORKROOT/lib
    while read -r w; do
        wheels+=("$w/cu13/lib" "$w/cublas/lib" "$w/cuda_runtime/lib")
    done < <(wheel_dirs)
    rm -rf "$linkdir" && mkdir -p "$linkdir"
    for lib in $CUDA_LIBS; do
        if ! found=$(find_lib "$lib" "${libdirs[@]}" "${wheels[@]}"); then
            TOOL_LINES+=("lib$lib: NOT FOUND (toolkit: ${libdirs[*]:-skipped}; wheels: ${wheels[*]:-none})")
            return 1
        fi
        for f in "$(dirname "$found")"/lib"$lib".so.*; do
            ln -sf "$f" "$linkdir/$(basename "$f")"
        done
        ln -sf "$found" "$linkdir/lib$lib.so"
        TOOL_LINES+=("lib$lib: $found (no lib$lib.so beside it: linked through $linkdir)")
    done
    CUDA_LIBDIR_USED=$linkdir
    return 0
}

# ---- what the carried .debs provide ---------------------------------------------
DEBS_ROOT=$ROOT/third_party/root

# Unpack every .deb in third_party/debs into $DEBS_ROOT, once per run, and
# put $DEBS_ROOT/bin (links to what is used from it) first on PATH.
debs_unpack() {
    local debs=("$ROOT"/third_party/debs/*.deb) d tmp
    [ -n "${DEBS_UNPACKED:-}" ] && return 0
    [ -e "${debs[0]}" ] || {
        echo "no .debs in third_party/debs: run tools/fetch_gpu_debs.sh on a machine with the Debian registry and carry third_party/"
        return 1
    }
    rm -rf "$DEBS_ROOT" && mkdir -p "$DEBS_ROOT/pkgconfig" "$DEBS_ROOT/bin"
    for d in "${debs[@]}"; do
        if command -v dpkg-deb >/dev/null; then
            dpkg-deb -x "$d" "$DEBS_ROOT" || return 1
        else
            tmp=$(mktemp -d)
            (cd "$tmp" && ar x "$d" && tar -xf data.tar.* -C "$DEBS_ROOT") || return 1
            rm -rf "$tmp"
        fi
    done
    export PATH="$DEBS_ROOT/bin:$PATH"
    DEBS_UNPACKED=1
}

# make from the carried make_*.deb (Debian's make needs libc6 alone).
make_from_debs() {
    ls "$ROOT"/third_party/debs/make_*.deb >/dev/null 2>&1 || return 1
    debs_unpack >"$WORKROOT/debs.log" 2>&1 || return 1
    [ -x "$DEBS_ROOT/usr/bin/make" ] || return 1
    ln -sf "$DEBS_ROOT/usr/bin/make" "$DEBS_ROOT/bin/make"
    hash -r
    make --version >>"$WORKROOT/debs.log" 2>&1
}

# Check, OpenBLAS, PCRE2, utf8proc and xxHash from the carried .debs, found
# through pkg-config (a stand-in when there is none). Once per run.
deps_from_debs() {
    [ -n "${DEPS_FROM_DEBS:-}" ] && return 0
    debs_unpack || return 1
    local root=$DEBS_ROOT ml=usr/lib/x86_64-linux-gnu pc
    # .pc files name /usr: point them at the unpacked tree (openblas.pc is an
    # alternatives link on Debian, so take the pthread flavour's own file)
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
        hash -r
        echo "pkg-config: using a stand-in for $DEP_PKGS"
    fi
    pkg-config --exists $DEP_PKGS && DEPS_FROM_DEBS=1
}

# ---- preflight -------------------------------------------------------------------
# What the build needs before any stage runs: make, a C compiler that links,
# nvcc's host C++ compiler (nvcc runs `gcc -x c++`), ar, nvcc, and Check and
# OpenBLAS (pkg-config's, or the carried .debs'). Sets PRE_LINES and
# PRE_MAKE_ARGS (CC= when cc is missing but gcc is there); returns 1 when
# the build cannot start, each missing piece's line saying what to carry.
PRE_CARRY='run tools/fetch_gpu_debs.sh on a machine with the Debian registry, then carry'
PRE_CARRY+=' third_party with the call (device tool: carry ["third_party"])'
preflight() {
    local bad=0 c cc= probe=$WORKROOT/preflight
    PRE_LINES=()
    PRE_MAKE_ARGS=()
    mkdir -p "$probe"
    # make
    if [ -z "${GPU_CHECK_MAKE_FROM_DEBS:-}" ] && command -v make >/dev/null; then
        PRE_LINES+=("make: $(command -v make) ($(make --version | head -n 1))")
    elif make_from_debs; then
        PRE_LINES+=("make: $(command -v make) ($(make --version | head -n 1)), unpacked from third_party/debs")
    elif ls "$ROOT"/third_party/debs/make_*.deb >/dev/null 2>&1; then
        PRE_LINES+=("make: MISSING, and the carried make .deb does not run here"
            "  ($(tail -n 1 "$WORKROOT/debs.log" 2>/dev/null))")
        bad=1
    elif ls "$ROOT"/third_party/debs/*.deb >/dev/null 2>&1; then
        PRE_LINES+=("make: MISSING, and third_party/debs has no make_*.deb (an older"
            "  fetch_gpu_debs.sh filled it): $PRE_CARRY")
        bad=1
    else
        PRE_LINES+=("make: MISSING: $PRE_CARRY (it fetches make's .deb too)")
        bad=1
    fi
    # the C compiler, and gcc's C++ front end for nvcc
    for c in ${CC:+"$CC"} cc gcc; do
        command -v "$c" >/dev/null && { cc=$c; break; }
    done
    if [ -z "$cc" ]; then
        PRE_LINES+=("C compiler: MISSING (cc, gcc): no carried package replaces a toolchain;"
            "  use an image with gcc")
        bad=1
    elif ! printf 'int main(void) { return 0; }\n' | "$cc" -x c - -o "$probe/a.out" >"$probe/cc.log" 2>&1; then
        PRE_LINES+=("C compiler: $cc cannot link a program ($(tail -n 1 "$probe/cc.log" | cut -c1-120))")
        bad=1
    else
        PRE_LINES+=("C compiler: $(command -v "$cc") ($("$cc" --version 2>&1 | head -n 1))")
        [ "$cc" = cc ] || PRE_MAKE_ARGS+=(CC="$cc")
    fi
    if ! command -v gcc >/dev/null; then
        PRE_LINES+=("nvcc's host compiler: gcc MISSING (nvcc compiles the host side of .cu"
            "  files with gcc -x c++)")
        bad=1
    elif ! printf '#include <cstddef>\nint main() { return 0; }\n' |
        gcc -x c++ -c - -o "$probe/a.o" >"$probe/cxx.log" 2>&1; then
        PRE_LINES+=("nvcc's host compiler: gcc -x c++ fails: g++ missing?"
            "  ($(tail -n 1 "$probe/cxx.log" | cut -c1-120))")
        bad=1
    else
        PRE_LINES+=("nvcc's host compiler: gcc -x c++ compiles")
    fi
    if ! command -v ar >/dev/null; then
        PRE_LINES+=("ar: MISSING (binutils: the Makefile archives libfsdp.a with it)")
        bad=1
    fi
    # nvcc
    if c=$(find_nvcc); then
        PRE_LINES+=("nvcc: $c ($("$c" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p'))")
    else
        PRE_LINES+=("nvcc: MISSING (looked in \$CUDA_HOME/bin, PATH, /usr/local/cuda*/bin,"
            "  /usr/bin; set CUDA_HOME)")
        bad=1
    fi
    # Check, OpenBLAS and the rest of the Makefile's packages
    if [ -z "${GPU_CHECK_FORCE_DEBS:-}" ] && command -v pkg-config >/dev/null &&
        pkg-config --exists $DEP_PKGS 2>/dev/null; then
        PRE_LINES+=("$DEP_PKGS: pkg-config finds them")
    elif ls "$ROOT"/third_party/debs/*.deb >/dev/null 2>&1; then
        if ! command -v dpkg-deb >/dev/null && ! command -v ar >/dev/null; then
            PRE_LINES+=("$DEP_PKGS: carried, but neither dpkg-deb nor ar is here to unpack a .deb")
            bad=1
        else
            c=$([ -z "${GPU_CHECK_FAKE_PKGCONFIG:-}" ] && command -v pkg-config) || c="a stand-in"
            PRE_LINES+=("$DEP_PKGS: from the $(ls "$ROOT"/third_party/debs/*.deb | wc -l) carried .debs; pkg-config: $c")
        fi
    else
        PRE_LINES+=("$DEP_PKGS: MISSING (pkg-config: $(command -v pkg-config || echo none)): $PRE_CARRY")
        bad=1
    fi
    # informative: where the wheels are (NCCL, cuBLAS without a toolkit)
    PRE_LINES+=("python3: $(command -v python3 || echo none); wheels: $(wheel_dirs | tr '\n' ' ')")
    return $bad
}

# ---- the toolchain for one stage's build -------------------------------------------
# Sets MAKE_ARGS, NCCL_FOUND and the TOOL_* report lines; returns 1 if the
# build cannot even be attempted.
setup_toolchain() {
    TOOL_LINES=()
    MAKE_ARGS=(BUILD="$BUILD" CUDA=1 MPI=0 INSTALL_DEPS=0 CUDA_ARCH="-gencode arch=compute_90,code=sm_90"
        ${PRE_MAKE_ARGS[@]+"${PRE_MAKE_ARGS[@]}"})
    local nvcc
    nvcc=$(find_nvcc) || { TOOL_LINES+=("nvcc: NOT FOUND (set CUDA_HOME)"); return 1; }
    CUDA_HOME=$(cd "$(dirname "$nvcc")/.." && pwd)
    MAKE_ARGS+=(CUDA_HOME="$CUDA_HOME" NVCC="$nvcc")
    TOOL_LINES+=("nvcc: $nvcc ($("$nvcc" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p'))")
    setup_cuda_libs || return 1
    MAKE_ARGS+=(CUDA_LIBDIR="$CUDA_LIBDIR_USED")
    if [ ! -f "$CUDA_HOME/include/cublas_v2.h" ]; then
        local w inc=
        while read -r w; do
            [ -f "$w/cu13/include/cublas_v2.h" ] && { inc=$w/cu13/include; break; }
        done < <(wheel_dirs)
        if [ -n "$inc" ]; then
            MAKE_ARGS+=(EXTRA_CFLAGS="-I$inc" EXTRA_NVFLAGS="-I$inc")
            TOOL_LINES+=("cublas_v2.h: $inc")
        fi
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
    elif deps_from_debs >>"$WORKROOT/deps.log" 2>&1; then
        TOOL_LINES+=("$DEP_PKGS: unpacked from third_party/debs into third_party/root")
    else
        TOOL_LINES+=("$DEP_PKGS: MISSING ($(tail -n 1 "$WORKROOT/deps.log"))")
        return 1
    fi
    return 0
}
