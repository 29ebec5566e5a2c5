#!/usr/bin/env python3
"""gen_qlora_golden.py - the reference for QLoRA fine-tuning: PEFT adapters
trained in float64 on a base whose linear weights went through bitsandbytes'
NF4 (quantize_4bit, blocksize 64, double quantization) and back
(dequantize_4bit, fp32).

Why: `fsdp train --quantize nf4` stores the frozen linear weights of the
base in NF4 and dequantizes each unit after its all-gather; its trajectory
must be PEFT's on exactly those dequantized weights. This is
tools/gen_lora_golden.py's lora_gqa run (the same targets, adapters,
data, schedule and checks: read its docstring for the files and the fsdp
command) on the quantized base:

  tests/fixtures/qlora_gqa/    base llama_gqa with every block linear layer
                               (q, k, v, o, gate, up, down; not the head or
                               the embedding, as transformers quantizes) in
                               NF4; target_modules [q_proj, v_proj,
                               down_proj], r 4, alpha 8

The fsdp run adds `--quantize nf4` to lora_gqa's command. The golden's
`nf4_max_change` (F32 scalar) is the largest |W - dequant(quant(W))| over
the quantized weights: the quantization is not a no-op.

Usage: tools/gen_qlora_golden.py [OUTDIR]   (default tests/fixtures)
Needs torch, transformers, peft, safetensors, bitsandbytes (pip).
"""
import os
import sys
import warnings

import torch
import bitsandbytes.functional as bnbf
from safetensors.torch import load_file, save_file

import gen_lora_golden as lg

NAME, LIKE = "qlora_gqa", "lora_gqa"
PLAIN_BASE = lg.base_model  # before main() routes generate() through quantized_base
LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def nf4_roundtrip(w):
    """bitsandbytes' NF4 with double quantization and back, in fp32, on the flattened
    tensor. Flattened because the format's blocks are 64 consecutive elements of the
    flattened weight (quantize_4bit makes the same codes and absmax for the 2-D weight), but
    bitsandbytes' CPU dequantize_4bit, given a 2-D shape whose rows are not a multiple of 64
    long (this fixture's 48 and 80), maps elements to blocks row by row and returns other
    values than its own flat (and its GPU) dequantization of the same codes; measured with
    bitsandbytes 0.50.2 on q_proj: up to 0.17 apart."""
    q, state = bnbf.quantize_4bit(w.float().reshape(-1).contiguous(), blocksize=64,
                                  quant_type="nf4", compress_statistics=True)
    return bnbf.dequantize_4bit(q, state).reshape(w.shape)


def quantized_base(path):
    """lg.base_model with every block linear weight replaced by its NF4 round trip."""
    m = PLAIN_BASE(path)
    worst = 0.0
    with torch.no_grad():
        for name, mod in m.named_modules():
            if isinstance(mod, torch.nn.Linear) and name.split(".")[-1] in LINEAR:
                w = nf4_roundtrip(mod.weight.data.float())
                worst = max(worst, (w.double() - mod.weight.data).abs().max().item())
                mod.weight.data.copy_(w.double())
    quantized_base.worst = worst
    return m


def main():
    outdir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(lg.repo_root(), "tests",
                                                                 "fixtures")
    torch.use_deterministic_algorithms(True)
    warnings.filterwarnings("ignore", module="peft")
    lg.FIXTURES[NAME] = lg.FIXTURES[LIKE]
    lg.base_model = quantized_base  # generate() builds its base through this
    lg.generate(outdir, NAME)
    path = os.path.join(outdir, NAME, "golden.safetensors")
    golden = load_file(path)
    golden["nf4_max_change"] = torch.tensor([quantized_base.worst], dtype=torch.float32)
    save_file(golden, path, metadata={"generator": "tools/gen_qlora_golden.py"})
    print("%s: the NF4 round trip moved a weight by up to %.4g" % (NAME, quantized_base.worst))


if __name__ == "__main__":
    main()
