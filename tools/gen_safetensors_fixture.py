#!/usr/bin/env python3
"""Write the tiny GPT-2 fixtures of tests/test_convert.c, with nothing but
the standard library (no torch, numpy or safetensors needed):

  tests/fixtures/tiny_gpt2.safetensors   Hugging Face layout: HF GPT-2 names,
      Conv1D weights stored (in, out), wte unpadded (V, C), the causal-mask
      buffers h.N.attn.bias a real GPT-2 file carries, metadata n_head;
      tensors sorted by name as the safetensors writer sorts them.
  tests/fixtures/tiny_gpt2.bin           the same weights as an llm.c fp32
      model file (version 3): linear weights (OC, C), wte padded to Vp rows
      with zeros, tensors stacked over layers in llm.c's order.

Every value is (k % 4001 - 2000) / 1024 for a hash k of (tensor, element),
exact in fp32 and different between neighbours, so a missed transpose or
a shifted offset shows up as a mismatch. Run from the repository root:
    python3 tools/gen_safetensors_fixture.py
"""
import json
import os
import struct

# the fixture's GPT-2: layers, heads, channels, vocab, context
FIXTURE = (2, 2, 16, 200, 8)


def block(C):
    """Per-layer tensors: fsdp / llm.c shapes (rows, cols); cols 0 means a vector."""
    return [
        ("ln_1.weight", C, 0), ("ln_1.bias", C, 0),
        ("attn.c_attn.weight", 3 * C, C), ("attn.c_attn.bias", 3 * C, 0),
        ("attn.c_proj.weight", C, C), ("attn.c_proj.bias", C, 0),
        ("ln_2.weight", C, 0), ("ln_2.bias", C, 0),
        ("mlp.c_fc.weight", 4 * C, C), ("mlp.c_fc.bias", 4 * C, 0),
        ("mlp.c_proj.weight", C, 4 * C), ("mlp.c_proj.bias", C, 0),
    ]


CONV1D = {"attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight"}


def value(name, i):
    h = 2166136261
    for ch in name.encode():
        h = ((h ^ ch) * 16777619) & 0xFFFFFFFF
    k = (h + i * 2654435761) & 0xFFFFFFFF
    k ^= k >> 15
    k = (k * 2246822519) & 0xFFFFFFFF
    k ^= k >> 13
    return (k % 4001 - 2000) / 1024.0


def tensor(name, rows, cols):
    """fsdp-layout values, row-major."""
    n = rows * (cols or 1)
    return [value(name, i) for i in range(n)]


def f32(vals):
    return struct.pack("<%df" % len(vals), *vals)


def bf16(vals):
    """Truncated bf16 (the fuzz seeds only need valid bytes)."""
    raw = f32(vals)
    return b"".join(raw[i + 2:i + 4] for i in range(0, len(raw), 4))


def params(cfg):
    """(name, rows, cols, values) in fsdp's own orientation."""
    L, NH, C, V, T = cfg
    out = [("wte.weight", V, C, tensor("wte.weight", V, C)),
           ("wpe.weight", T, C, tensor("wpe.weight", T, C))]
    for l in range(L):
        for suffix, r, c in block(C):
            name = "h.%d.%s" % (l, suffix)
            out.append((name, r, c, tensor(name, r, c)))
    out += [("ln_f.weight", C, 0, tensor("ln_f.weight", C, 0)),
            ("ln_f.bias", C, 0, tensor("ln_f.bias", C, 0))]
    return out


def write_safetensors(path, ps, cfg, dtype="F32"):
    L, NH, C, V, T = cfg
    entries = {}
    for name, r, c, vals in ps:
        suffix = name.split(".", 2)[2] if name.startswith("h.") else name
        if suffix in CONV1D:  # HF Conv1D: (in, out) = transpose of (OC, C)
            vals = [vals[o * c + i] for i in range(c) for o in range(r)]
            shape = [c, r]
        else:
            shape = [r, c] if c else [r]
        entries[name] = (shape, vals)
    for l in range(L):  # the causal mask buffer real GPT-2 files carry
        mask = [1.0 if j <= i else 0.0 for i in range(T) for j in range(T)]
        entries["h.%d.attn.bias" % l] = ([1, 1, T, T], mask)
    header = {"__metadata__": {"format": "pt", "n_head": str(NH)}}
    data, at = [], 0
    for name in sorted(entries):
        shape, vals = entries[name]
        raw = f32(vals) if dtype == "F32" else bf16(vals)
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [at, at + len(raw)]}
        data.append(raw)
        at += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for raw in data:
            f.write(raw)


def write_llmc(path, ps, cfg):
    L, NH, C, V, T = cfg
    VP = (V + 127) // 128 * 128
    by_name = {name: vals for name, _, _, vals in ps}
    header = [0] * 256
    header[:8] = [20240326, 3, T, V, L, NH, C, VP]
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *header))
        f.write(f32(by_name["wte.weight"] + [0.0] * ((VP - V) * C)))
        f.write(f32(by_name["wpe.weight"]))
        for suffix, _, _ in block(C):
            for l in range(L):
                f.write(f32(by_name["h.%d.%s" % (l, suffix)]))
        f.write(f32(by_name["ln_f.weight"]))
        f.write(f32(by_name["ln_f.bias"]))


def main():
    os.makedirs("tests/fixtures", exist_ok=True)
    ps = params(FIXTURE)
    write_safetensors("tests/fixtures/tiny_gpt2.safetensors", ps, FIXTURE)
    write_llmc("tests/fixtures/tiny_gpt2.bin", ps, FIXTURE)
    print("wrote tests/fixtures/tiny_gpt2.safetensors and tests/fixtures/tiny_gpt2.bin "
          "(L=%d NH=%d C=%d V=%d maxT=%d)" % FIXTURE)


if __name__ == "__main__":
    main()
