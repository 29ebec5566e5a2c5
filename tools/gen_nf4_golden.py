#!/usr/bin/env python3
"""gen_nf4_golden.py - bitsandbytes' NF4 dequantization, the reference the
nf4_dequant op (src/ops/ops.h; format in src/ops/nf4.h) is checked against
bit for bit by tests/test_ops_nf4.c.

Why: a frozen NF4 parameter is dequantized on the device after its gather,
and the values must be bitsandbytes' dequantize_4bit output exactly (fp32),
so that a QLoRA run sees the weights PyTorch + bitsandbytes see. This script
quantizes a few small fp32 tensors with bitsandbytes' CPU path
(quantize_4bit(blocksize=64, quant_type="nf4", compress_statistics=False):
plain fp32 absmax, one per 64-element block) and writes what it gives back.

Output: tests/fixtures/nf4/golden.safetensors (about 14 KiB):
  quant_map          F32 (16,)   bitsandbytes' NF4 code values (quant_state.code)
  even_nibble_high   U8  (1,)    1 when the even element of a byte is its high
                                 nibble (checked here against the quantizer's
                                 own output: element 0 of the first case)
  <case>/codes       U8  (n/2,)  the packed codes quantize_4bit returns
  <case>/absmax      F32 (n/64,) its absmax (fp32, one per block)
  <case>/fp32        F32 (n,)    dequantize_4bit(codes, state), dtype float32
  <case>/bf16        BF16 (n,)   the same with quant_state.dtype = bfloat16
                                 (bitsandbytes' own bf16 output)
Cases: len64 (random normal), len384 (3 x 128: a block of zeros, absmax 0;
values at the exact midpoints between code values; +-3e38 and +-1e-30
neighbours; subnormals, alone and beside normal values), len1600 (25 blocks of
random normal with varied scales).

Run from the repository root: python3 tools/gen_nf4_golden.py
Needs: torch, bitsandbytes (pip install bitsandbytes; its CPU path).
"""
import os
import sys

import torch
import bitsandbytes.functional as F
from safetensors.torch import save_file

OUT = "tests/fixtures/nf4/golden.safetensors"
BLOCK = 64


def quantize(x):
    q, st = F.quantize_4bit(x, blocksize=BLOCK, quant_type="nf4", compress_statistics=False)
    return q, st


def dequantize(q, st, dtype):
    st.dtype = dtype
    return F.dequantize_4bit(q, st)


def special_case(code):
    """384 elements: blocks of zeros, midpoints, extremes and subnormals."""
    blocks = []
    blocks.append(torch.zeros(BLOCK))  # absmax 0
    # midpoints between neighbouring code values, scaled by an absmax of 1
    mids = ((code[:-1] + code[1:]) / 2).to(torch.float32)
    b = torch.cat([torch.tensor([1.0]), mids, -mids, mids * 0.999, mids * 1.001])[:BLOCK]
    blocks.append(torch.cat([b, torch.zeros(BLOCK - b.numel())]))
    # extremes: +-3e38 with tiny and mid-sized neighbours
    g = torch.Generator().manual_seed(7)
    e = torch.randn(BLOCK, generator=g) * 1e37
    e[0], e[5], e[9], e[33] = 3e38, -3e38, 1e-30, -1e-30
    blocks.append(e)
    # subnormal values alone (absmax subnormal), and beside a normal one
    s = torch.randn(BLOCK, generator=g) * 1e-39
    blocks.append(s)
    t = torch.randn(BLOCK, generator=g) * 1e-40
    t[17] = 2.5e-38
    blocks.append(t)
    # a block with an exact code value pattern (absmax 2): every code once, x4
    blocks.append((code.repeat(4) * 2.0).to(torch.float32))
    return torch.cat(blocks).to(torch.float32)


def main():
    if not os.path.isdir("tests/fixtures"):
        sys.exit("run from the repository root")
    torch.manual_seed(1234)
    g = torch.Generator().manual_seed(2718)
    code = F.get_4bit_type("nf4", device="cpu").to(torch.float32)
    cases = {
        "len64": torch.randn(64, generator=g),
        "len384": None,
        "len1600": torch.randn(1600, generator=g)
        * torch.logspace(-3, 3, 25).repeat_interleave(BLOCK),
    }
    cases["len384"] = special_case(code)
    assert cases["len384"].numel() == 384
    tensors = {}
    quant_map = None
    even_high = None
    for name, x in cases.items():
        x = x.to(torch.float32).contiguous()
        q, st = quantize(x)
        codes = q.flatten().to(torch.uint8)
        if quant_map is None:
            quant_map = st.code.to(torch.float32).clone()
            # which nibble holds element 0: recompute its code by nearest value
            a0 = st.absmax[0].item()
            want = int(torch.argmin((x[0] / a0 - quant_map).abs())) if a0 else 7
            hi, lo = codes[0].item() >> 4, codes[0].item() & 15
            assert (hi == want) != (lo == want) or hi == lo, "nibble order unclear"
            even_high = 1 if hi == want else 0
        assert torch.equal(st.code.to(torch.float32), quant_map)
        fp32 = dequantize(q, st, torch.float32).flatten()
        bf16 = dequantize(q, st, torch.bfloat16).flatten()
        assert fp32.dtype == torch.float32 and bf16.dtype == torch.bfloat16
        assert fp32.numel() == x.numel()
        same = torch.equal(fp32.to(torch.bfloat16).view(torch.int16), bf16.view(torch.int16))
        print(f"{name}: n {x.numel()}, blocks {st.absmax.numel()}, "
              f"bnb bf16 == fp32 rounded: {same}")
        tensors[f"{name}/codes"] = codes.contiguous()
        tensors[f"{name}/absmax"] = st.absmax.to(torch.float32).contiguous()
        tensors[f"{name}/fp32"] = fp32.contiguous()
        tensors[f"{name}/bf16"] = bf16.contiguous()
    tensors["quant_map"] = quant_map
    tensors["even_nibble_high"] = torch.tensor([even_high], dtype=torch.uint8)
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    save_file(tensors, OUT, metadata={"tool": "tools/gen_nf4_golden.py",
                                      "bitsandbytes": __import__("bitsandbytes").__version__})
    print(f"wrote {OUT} ({os.path.getsize(OUT)} bytes); even element in the "
          f"{'high' if even_high else 'low'} nibble")


if __name__ == "__main__":
    main()
