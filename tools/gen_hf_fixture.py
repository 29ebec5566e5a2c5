#!/usr/bin/env python3
"""gen_hf_fixture.py - a tiny GPT-2 Hugging Face directory, written by
transformers itself, for tests/test_hfdir.c.

Why: fsdp reads and writes Hugging Face directories; this one is the
reference's own output (GPT2LMHeadModel.save_pretrained: config.json,
model.safetensors with "transformer.*" names, the tied lm_head left out),
so the test can check that fsdp reads what transformers writes, computes
the same logits from it, and writes model.safetensors back byte for byte.

  tests/fixtures/hf_gpt2/config.json, generation_config.json,
                         model.safetensors      save_pretrained's output (fp32)
  tests/fixtures/hf_gpt2/golden.safetensors     transformers' greedy decoding:
      prompt  I32 (P,)         the prompt's token ids
      tokens  I32 (N,)         the N tokens greedy decoding appends
      logits  F32 (N, V)       the logits each of them was chosen from

Parameters are drawn from torch's RNG at scales that carry signal and
give a varied greedy sequence (wte N(0, 0.1), other weights N(0, 0.5),
norm weights 1 + 0.1 N), and the forward runs in float64, stored as
float32. Usage: tools/gen_hf_fixture.py [OUTDIR]  (default
tests/fixtures/hf_gpt2). Needs torch, transformers, safetensors (pip).
"""
import os
import sys

import torch
from safetensors.torch import save_file
from transformers import GPT2Config, GPT2LMHeadModel

V, C, L, H, T = 96, 16, 2, 2, 32
PROMPT = [5, 17, 42, 7, 88, 3]
N = 8


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/hf_gpt2"
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(1234)
    cfg = GPT2Config(vocab_size=V, n_embd=C, n_layer=L, n_head=H, n_positions=T,
                     bos_token_id=V - 1, eos_token_id=V - 1, attn_pdrop=0.0,
                     embd_pdrop=0.0, resid_pdrop=0.0)
    model = GPT2LMHeadModel(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".ln_" in name and name.endswith("weight"):
                p.copy_(1 + 0.1 * torch.randn_like(p))
            elif "wte" in name:
                p.copy_(0.1 * torch.randn_like(p))
            else:
                p.copy_(0.5 * torch.randn_like(p))
    model.save_pretrained(out)
    model = model.double().eval()
    ids = list(PROMPT)
    tokens, logits = [], []
    with torch.no_grad():
        for _ in range(N):
            row = model(torch.tensor([ids])).logits[0, -1]
            nxt = int(torch.argmax(row))
            logits.append(row.float())
            tokens.append(nxt)
            ids.append(nxt)
    save_file({"prompt": torch.tensor(PROMPT, dtype=torch.int32),
               "tokens": torch.tensor(tokens, dtype=torch.int32),
               "logits": torch.stack(logits).contiguous()},
              os.path.join(out, "golden.safetensors"))
    print("wrote", out, "greedy tokens", tokens)


if __name__ == "__main__":
    main()
