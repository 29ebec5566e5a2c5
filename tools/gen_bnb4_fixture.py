#!/usr/bin/env python3
"""gen_bnb4_fixture.py - a tiny Llama as a bf16 Hugging Face directory and as
the bnb-4bit directory transformers + bitsandbytes make of it, for
tests/test_bnb4.c (src/ops/nf4.c, src/ckpt/bnb4.c, fsdp convert --quantize).

  tests/fixtures/bnb4/bf16/      save_pretrained of a LlamaForCausalLM in
                                 bf16 (config.json, model.safetensors)
  tests/fixtures/bnb4/nf4/       the same directory loaded with
      BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
      bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=bfloat16) on
      CPU and written back by save_pretrained: what a user downloads as a
      "bnb-4bit" checkpoint
  tests/fixtures/bnb4/nf4_sharded/  the same quantized model written by
      save_pretrained(max_shard_size="30KB"): model.safetensors.index.json
      and three files, a weight's six tensors split over two of them
      (--sharded writes only this one, from the bf16/ already there)
  tests/fixtures/bnb4/golden.safetensors
      nf4_code        F32 (16,)   bitsandbytes' NF4 table
      dynamic_map     F32 (256,)  create_dynamic_map(signed=True)
      <name>          F32 (shape) dequantize_4bit of layer 0's quantized weights
      x               BF16 (N,)   a vector with odd blocks (ties, zeros, a
                                  short last block; 2 nested blocks) and, from
                                  quantize_4bit(x, 64, nf4, compress_statistics):
      x.codes U8, x.absmax F32 (before double quantization), x.qabsmax U8,
      x.nested F32, x.offset F32 (1,)

Hidden 64, intermediate 128, 2 layers, 4 heads of 16 with 2 KV heads,
vocab 96: every linear weight is a multiple of 64 elements. Usage:
  tools/gen_bnb4_fixture.py [OUTDIR]   (default tests/fixtures/bnb4)
  tools/gen_bnb4_fixture.py --sharded [OUTDIR]
  tools/gen_bnb4_fixture.py --tables   the C literals of src/ops/nf4.c
Needs torch, transformers, accelerate, safetensors, bitsandbytes (pip).
"""
import copy
import os
import sys

import numpy as np
import torch
import bitsandbytes.functional as F
from safetensors.torch import save_file
from transformers import (AutoModelForCausalLM, BitsAndBytesConfig, LlamaConfig,
                          LlamaForCausalLM)


def tables():
    def lit(v):
        s = "%.9g" % v
        if "." not in s and "e" not in s:
            s += ".0"
        return s + "f"
    for name, t in (("fsdp_nf4_code", F.get_4bit_type("nf4", device="cpu")),
                    ("fsdp_nf4_dynamic_map", F.create_dynamic_map())):
        v = t.numpy().astype(np.float32)
        print("const float %s[%d] = {" % (name, v.size))
        for i in range(0, v.size, 4):
            print("    " + ", ".join(lit(x) for x in v[i:i + 4]) + ",")
        print("};")


def exact_nearest_disagrees(x):
    """Whether bitsandbytes' absmax codes for x differ from the exact nearest
    dynamic-map entries anywhere (its CPU quantize_blockwise bins values
    into a 65536-entry table, which is not exact near midpoints)."""
    _, st = F.quantize_4bit(x, blocksize=64, compress_statistics=True, quant_type="nf4")
    _, st0 = F.quantize_4bit(x, blocksize=64, compress_statistics=False, quant_type="nf4")
    dyn = F.create_dynamic_map().numpy()
    am, q = st0.absmax.numpy(), st.absmax.numpy()
    nested, off = st.state2.absmax.numpy(), np.float32(st.offset.item())
    v = ((am - off) / np.repeat(nested, 256)[:am.size]).astype(np.float32)
    return bool((np.abs(v[:, None] - dyn[None, :]).argmin(1) != q).any())


def probe_vector():
    """Blocks that exercise the quantizer's edges, then random ones; the
    first seed whose absmax codes tell the binned search from an exact one."""
    code = F.get_4bit_type("nf4", device="cpu")
    mids = (code[:-1] + code[1:]) / 2
    for seed in range(7, 1000):
        g = torch.Generator().manual_seed(seed)
        blocks = [torch.cat([torch.tensor([1.0]), mids, -mids, code,
                             torch.zeros(64 - 1 - 15 - 15 - 16)]),
                  torch.zeros(64),
                  torch.full((64,), -0.25)]
        blocks += [torch.randn(64, generator=g) * (0.01 + i) for i in range(300)]
        blocks.append(torch.randn(37, generator=g))  # a short last block
        x = torch.cat(blocks).bfloat16().float()
        if exact_nearest_disagrees(x):
            return x
    raise SystemExit("no seed tells the binned absmax search from an exact one")


def bnb4_config():
    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                              bnb_4bit_use_double_quant=True,
                              bnb_4bit_compute_dtype=torch.bfloat16)


def load_nf4(out):
    return AutoModelForCausalLM.from_pretrained(os.path.join(out, "bf16"),
                                                quantization_config=bnb4_config(),
                                                dtype=torch.bfloat16, device_map="cpu")


def sharded(out):
    load_nf4(out).save_pretrained(os.path.join(out, "nf4_sharded"), max_shard_size="30KB")


def main():
    if sys.argv[1:] == ["--tables"]:
        tables()
        return
    if sys.argv[1:2] == ["--sharded"]:
        sharded(sys.argv[2] if len(sys.argv) > 2 else "tests/fixtures/bnb4")
        return
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/bnb4"
    torch.manual_seed(2027)
    cfg = LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=128,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=64, rms_norm_eps=1e-5, tie_word_embeddings=False,
                      bos_token_id=1, eos_token_id=2)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.1 * torch.randn_like(p))
            else:
                p.copy_(0.05 * torch.randn_like(p))
    model = model.to(torch.bfloat16)
    model.save_pretrained(os.path.join(out, "bf16"))

    m4 = load_nf4(out)
    m4.save_pretrained(os.path.join(out, "nf4"))
    sharded(out)

    golden = {"nf4_code": F.get_4bit_type("nf4", device="cpu").float().contiguous(),
              "dynamic_map": F.create_dynamic_map().float().contiguous()}
    for name, mod in m4.named_modules():
        w = getattr(mod, "weight", None)
        if (w is not None and getattr(w, "quant_state", None) is not None
                and name.startswith("model.layers.0.")):
            qs = copy.copy(w.quant_state)
            qs.dtype = torch.float32  # fp32 out: the values before any rounding to bf16
            golden[name + ".weight"] = F.dequantize_4bit(w.data, qs).contiguous()
    x = probe_vector()
    codes, st = F.quantize_4bit(x, blocksize=64, compress_statistics=True, quant_type="nf4")
    _, st0 = F.quantize_4bit(x, blocksize=64, compress_statistics=False, quant_type="nf4")
    golden.update({"x": x.bfloat16(), "x.codes": codes.reshape(-1).contiguous(),
                   "x.absmax": st0.absmax.contiguous(), "x.qabsmax": st.absmax.contiguous(),
                   "x.nested": st.state2.absmax.contiguous(),
                   "x.offset": st.offset.reshape(1).float().contiguous()})
    save_file(golden, os.path.join(out, "golden.safetensors"))


if __name__ == "__main__":
    main()
