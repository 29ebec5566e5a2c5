#!/usr/bin/env python3
"""check_layers.py - import circles and layer-crossing includes of the library.

Why: STYLE.md asks that dependencies point down, never in a circle. This
counts how far the tree is from that, so the figure can be measured again
after any change:

    make -j2 && tools/check_layers.py [--build DIR] [--list]

It reads src/, models/ and include/ (tests and tools may use anything) and
the objects of a build (nm, readelf), and prints the figures, then, with --list (or
when a figure is not 0), every offending pair or include.

Files and modules. A module is a .c/.cu file together with the .h/.cuh of
the same name; `X_internal.h` belongs to module X too (the internal half of
X's header).

Import circle: two modules that depend on each other, in either of two
ways. Include circle: a file of each includes the other's header directly
(#include "..."). Call circle: the code of each calls a function the
other's object defines (a relocation in .text against the other's symbol;
nm and readelf on the build's objects). A reference from a data section
does not count: a table of function pointers or of entries (the op tables,
models/registry.c, the format and placement tables) is how STYLE.md wants
interchangeable parts named, and the entries may call the table's helpers.
The two ways are not mixed: a file that includes another's header for its
types or for the declarations of its own functions, while that other calls
it, is one module split over two files, not a circle.

Layers, top to bottom (an include may point down any number of layers):

    1  src/cli
    2  src/report         renders what train computes (plan, fit): includes train/
    3  src/train
    4  src/engine
    5  src/ckpt           reads and writes a model's weights: includes models/
    6  src/optim  src/data  models
    7  src/ops  src/comm  (src/ops/cpu and src/ops/cuda are ops' backends)
    8  src/device
    9  src/core
   10  include/fsdp       the public header

DESIGN.md draws train and report side by side, and optim, ckpt, data and
models side by side; the real arrows between them go one way (report ->
train, ckpt -> models), so the order above splits those rows where they do.

Layer-crossing includes, counted apart:
  upward    a file includes a header of a layer above its own;
  sideways  between two folders of one layer (they do not know each other);
  past an interface: a model includes src/comm (a model computes one rank's
            share; only the engine communicates), or a file outside src/ops
            includes a backend's own header under src/ops/cpu or
            src/ops/cuda (the rest of fsdp reaches kernels through the op
            table, ops/ops.h).
"""
import argparse
import collections
import glob
import os
import re
import subprocess
import sys

LAYERS = [
    ["src/cli"],
    ["src/report"],
    ["src/train"],
    ["src/engine"],
    ["src/ckpt"],
    ["src/optim", "src/data", "models"],
    ["src/ops", "src/comm"],
    ["src/device"],
    ["src/core"],
    ["include"],
]

# (from folder, to folder prefix, allowed-from prefix or None, reason)
PAST_INTERFACE = [
    ("models", "src/comm/", None, "a model computes; only the engine communicates"),
    (None, "src/ops/cpu/", "src/ops/", "a cpu kernel header outside src/ops"),
    (None, "src/ops/cuda/", "src/ops/", "a cuda kernel header outside src/ops"),
]

SOURCE_EXT = (".c", ".cu")
HEADER_EXT = (".h", ".cuh")
INCLUDE_RE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def tree_files():
    out = []
    for top in ("src", "models", "include"):
        for f in glob.glob(top + "/**/*", recursive=True):
            if f.endswith(SOURCE_EXT + HEADER_EXT):
                out.append(os.path.normpath(f))
    return sorted(out)


def module_of(path):
    stem = os.path.splitext(path)[0]
    return stem[: -len("_internal")] if stem.endswith("_internal") else stem


def folder_of(path):
    best = None
    for row in LAYERS:
        for d in row:
            if path.startswith(d + "/") and (best is None or len(d) > len(best)):
                best = d
    return best


def layer_of(folder):
    for i, row in enumerate(LAYERS):
        if folder in row:
            return i
    return None


def resolve(name, including):
    """The file an #include "name" of `including` reads, as the Makefile's
    -I. -Iinclude -Isrc -Imodels and the including folder find it."""
    here = os.path.dirname(including)
    for cand in (os.path.join(here, name), name, "include/" + name, "src/" + name,
                 "models/" + name):
        if os.path.isfile(cand):
            return os.path.normpath(cand)
    return None


def includes(files):
    """[(file, header)] for every #include "..." that resolves inside the tree."""
    out = []
    for f in files:
        with open(f, encoding="utf-8", errors="replace") as fh:
            text = fh.read()
        for name in INCLUDE_RE.findall(text):
            h = resolve(name, f)
            if h:
                out.append((f, h))
    return out


def object_calls(build, files):
    """module -> {module whose functions its code calls: a symbol it calls}.
    A call is a relocation in a code section (.text*) against a function
    another object defines; relocations in data sections (a table of
    function pointers) are the registry pattern and do not count."""
    objs = {}
    for f in files:
        if f.endswith(SOURCE_EXT):
            o = os.path.join(build, "obj", f + ".o" if f.endswith(".cu") else f[:-2] + ".o")
            if os.path.isfile(o):
                objs[module_of(f)] = o
    if not objs:
        sys.exit("check_layers: no objects under %s/obj: build first (make -j2)" % build)
    defined, called = {}, collections.defaultdict(set)
    for mod, o in objs.items():
        nm = subprocess.run(["nm", "--defined-only", o], capture_output=True, text=True,
                            check=True).stdout
        for line in nm.splitlines():
            parts = line.split()
            if len(parts) == 3 and parts[1] == "T":
                defined.setdefault(parts[2], mod)
        rel = subprocess.run(["readelf", "-rW", o], capture_output=True, text=True,
                             check=True).stdout
        in_code = False
        for line in rel.splitlines():
            head = re.match(r"Relocation section '([^']+)'", line)
            if head:
                in_code = head.group(1).startswith(".rela.text")
                continue
            parts = line.split()
            if in_code and len(parts) >= 5 and re.match(r"[0-9a-f]{8,}$", parts[0]):
                called[mod].add(parts[4])
    uses = collections.defaultdict(dict)
    for mod, syms in called.items():
        for s in sorted(syms):
            owner = defined.get(s)
            if owner and owner != mod:
                uses[mod].setdefault(owner, s)
    return uses, len(objs)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default="build", help="the build folder (default: build)")
    ap.add_argument("--list", action="store_true", help="list every pair and include")
    args = ap.parse_args()
    os.chdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

    files = tree_files()
    incs = includes(files)
    by_include = collections.defaultdict(dict)  # a -> b -> why
    for f, h in incs:
        a, b = module_of(f), module_of(h)
        if a != b and h.endswith(HEADER_EXT):
            by_include[a].setdefault(b, "%s includes %s" % (f, h))
    by_call, n_objs = object_calls(args.build, files)

    circles = collections.OrderedDict()  # (a, b) -> [reasons]
    for kind, uses in (("include", by_include), ("call", by_call)):
        for a in sorted(uses):
            for b in sorted(uses[a]):
                if a < b and a in uses.get(b, {}):
                    why_ab, why_ba = uses[a][b], uses[b][a]
                    if kind == "call":
                        why_ab = "%s calls %s" % (a, why_ab)
                        why_ba = "%s calls %s" % (b, why_ba)
                    circles.setdefault((a, b), []).append("%s; %s" % (why_ab, why_ba))

    upward, sideways, past = [], [], []
    for f, h in incs:
        ff, fh = folder_of(f), folder_of(h)
        if ff is None or fh is None or ff == fh:
            continue
        lf, lh = layer_of(ff), layer_of(fh)
        if lh < lf:
            upward.append((f, h))
        elif lh == lf:
            sideways.append((f, h))
    for f, h in incs:
        for src, dst, allowed, why in PAST_INTERFACE:
            if (src is None or folder_of(f) == src) and h.startswith(dst) and not (
                    allowed and f.startswith(allowed)):
                past.append((f, h, why))

    print("check_layers: %d files, %d objects (%s)" % (len(files), n_objs, args.build))
    print("import circles: %d" % len(circles))
    print("upward includes: %d" % len(upward))
    print("sideways includes: %d" % len(sideways))
    print("includes past an interface: %d" % len(past))
    if args.list or circles:
        for (a, b), why in sorted(circles.items()):
            print("  circle %s <-> %s: %s" % (a, b, "; ".join(why)))
    if args.list or upward or sideways:
        for f, h in upward:
            print("  up %s -> %s" % (f, h))
        for f, h in sideways:
            print("  sideways %s -> %s" % (f, h))
    if args.list or past:
        for f, h, why in past:
            print("  past %s -> %s (%s)" % (f, h, why))
    return 0


if __name__ == "__main__":
    sys.exit(main())
