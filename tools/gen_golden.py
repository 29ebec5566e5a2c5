#!/usr/bin/env python3
"""gen_golden.py - golden files for tests/test_model.c from an independent
PyTorch GPT-2.

Why: the C model is checked against a second implementation written directly
in PyTorch (autograd for the backward, torch.optim.AdamW for the update), so
a mistake in the model wiring or an op shows up as a mismatch in logits, a
gradient or the loss curve.

What it writes (little-endian), one file per config:
    b"FSDPGOLD", int32 version (1), int32 record count, then records:
    uint16 name length, name (ASCII), uint8 kind (0 float32, 1 int32),
    uint32 element count, the elements.
Records:
    config       int32 [n_layer, n_head, n_embd, vocab, context, B, T, steps]
    adamw        float [lr, beta1, beta2, eps, weight_decay]
    tokens       int32 (B*T,)     targets  int32 (B*T,)
    param/NAME   float, HF GPT-2 names, linear weights (OC, C); wte is (V, C)
                 (unpadded: the C side fills padding rows itself)
    logits       float (B*T, V)   loss     float (1,)
    grad/NAME    float, d loss / d param for the initial weights
    step_losses  float (steps,): loss before each of `steps` AdamW updates on
                 the same batch (decay on wte and the linear weights only)

The weights come from torch's RNG (not fsdp's), with larger-than-GPT-2 scales
and random LayerNorm/bias values so every path carries signal. The math runs
in float64 and is stored as float32.

Usage: tools/gen_golden.py [OUTDIR]   (default tests/fixtures)
Needs PyTorch (Debian: python3-torch; run with /usr/bin/python3 there).
"""
import math
import os
import struct
import sys

import torch
import torch.nn.functional as F

LR, BETA1, BETA2, EPS, WD = 1e-3, 0.9, 0.95, 1e-8, 0.1
STEPS = 10

# name: (n_layer, n_head, n_embd, vocab, context, B, T, seed)
CONFIGS = {
    # the "tiny" preset of models/gpt2.c
    "gpt2_tiny_golden.bin": (2, 4, 32, 256, 64, 2, 16, 1234),
    # a vocabulary that is not a multiple of 128, so Vp > V (padding columns)
    "gpt2_pad_golden.bin": (1, 2, 16, 200, 16, 2, 8, 4321),
}


def param_shapes(L, C, V, maxT):
    """HF GPT-2 names and shapes, in the unit order of models/gpt2.h."""
    shapes = [("wte.weight", (V, C)), ("wpe.weight", (maxT, C)),
              ("ln_f.weight", (C,)), ("ln_f.bias", (C,))]
    for l in range(L):
        p = "h.%d." % l
        shapes += [
            (p + "ln_1.weight", (C,)), (p + "ln_1.bias", (C,)),
            (p + "attn.c_attn.weight", (3 * C, C)), (p + "attn.c_attn.bias", (3 * C,)),
            (p + "attn.c_proj.weight", (C, C)), (p + "attn.c_proj.bias", (C,)),
            (p + "ln_2.weight", (C,)), (p + "ln_2.bias", (C,)),
            (p + "mlp.c_fc.weight", (4 * C, C)), (p + "mlp.c_fc.bias", (4 * C,)),
            (p + "mlp.c_proj.weight", (C, 4 * C)), (p + "mlp.c_proj.bias", (C,)),
        ]
    return shapes


def decays(name):
    return name == "wte.weight" or (name.endswith(".weight") and ("c_attn" in name or
                                                                  "c_proj" in name or
                                                                  "c_fc" in name))


def make_params(L, C, V, maxT, gen):
    params = {}
    for name, shape in param_shapes(L, C, V, maxT):
        r = torch.randn(shape, generator=gen, dtype=torch.float64)
        if name.endswith("ln_1.weight") or name.endswith("ln_2.weight") or name == "ln_f.weight":
            t = 1.0 + 0.1 * r
        elif name.endswith(".bias"):
            t = 0.05 * r
        elif name in ("wte.weight", "wpe.weight"):
            t = 0.1 * r
        else:
            t = r / math.sqrt(shape[1])  # unit-variance outputs: attention is not uniform
        params[name] = t.clone().requires_grad_(True)
    return params


def layernorm(x, w, b):
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + 1e-5) * w + b


def gelu_tanh(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def attention(x, p, NH):
    B, T, C = x.shape
    hs = C // NH
    qkv = F.linear(x, p["attn.c_attn.weight"], p["attn.c_attn.bias"])
    q, k, v = qkv.split(C, dim=2)
    q = q.view(B, T, NH, hs).transpose(1, 2)
    k = k.view(B, T, NH, hs).transpose(1, 2)
    v = v.view(B, T, NH, hs).transpose(1, 2)
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    scores = scores.masked_fill(~causal, float("-inf"))
    y = torch.softmax(scores, dim=-1) @ v
    y = y.transpose(1, 2).reshape(B, T, C)
    return F.linear(y, p["attn.c_proj.weight"], p["attn.c_proj.bias"])


def forward(params, tokens, L, NH):
    B, T = tokens.shape
    x = params["wte.weight"][tokens] + params["wpe.weight"][:T].unsqueeze(0)
    for l in range(L):
        p = {k[len("h.%d." % l):]: v for k, v in params.items() if k.startswith("h.%d." % l)}
        x = x + attention(layernorm(x, p["ln_1.weight"], p["ln_1.bias"]), p, NH)
        h = layernorm(x, p["ln_2.weight"], p["ln_2.bias"])
        h = gelu_tanh(F.linear(h, p["mlp.c_fc.weight"], p["mlp.c_fc.bias"]))
        x = x + F.linear(h, p["mlp.c_proj.weight"], p["mlp.c_proj.bias"])
    x = layernorm(x, params["ln_f.weight"], params["ln_f.bias"])
    return x @ params["wte.weight"].t()  # tied head: (B, T, V)


def write_fixture(path, records):
    with open(path, "wb") as f:
        f.write(b"FSDPGOLD")
        f.write(struct.pack("<ii", 1, len(records)))
        for name, kind, values in records:
            t = values.detach().reshape(-1)
            data = (t.to(torch.int32) if kind == 1 else t.to(torch.float32)).numpy().tobytes()
            nb = name.encode("ascii")
            f.write(struct.pack("<H", len(nb)) + nb + struct.pack("<BI", kind, t.numel()))
            f.write(data)


def generate(path, L, NH, C, V, maxT, B, T, seed):
    gen = torch.Generator().manual_seed(seed)
    params = make_params(L, C, V, maxT, gen)
    tokens = torch.randint(0, V, (B, T), generator=gen)
    targets = torch.randint(0, V, (B, T), generator=gen)

    logits = forward(params, tokens, L, NH)
    loss = F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1))
    loss.backward()

    records = [
        ("config", 1, torch.tensor([L, NH, C, V, maxT, B, T, STEPS])),
        ("adamw", 0, torch.tensor([LR, BETA1, BETA2, EPS, WD], dtype=torch.float64)),
        ("tokens", 1, tokens),
        ("targets", 1, targets),
    ]
    records += [("param/" + n, 0, t.detach().clone()) for n, t in params.items()]
    records += [("logits", 0, logits), ("loss", 0, loss.reshape(1))]
    records += [("grad/" + n, 0, t.grad.detach().clone()) for n, t in params.items()]

    decay = [t for n, t in params.items() if decays(n)]
    no_decay = [t for n, t in params.items() if not decays(n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WD},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=LR, betas=(BETA1, BETA2), eps=EPS)
    losses = []
    for _ in range(STEPS):
        opt.zero_grad(set_to_none=True)
        step_loss = F.cross_entropy(forward(params, tokens, L, NH).reshape(-1, V),
                                    targets.reshape(-1))
        losses.append(step_loss.item())
        step_loss.backward()
        opt.step()
    records.append(("step_losses", 0, torch.tensor(losses, dtype=torch.float64)))

    write_fixture(path, records)
    print("%s: loss %.6f -> %.6f after %d AdamW steps, %d bytes" %
          (path, losses[0], losses[-1], STEPS, os.path.getsize(path)))


def main():
    outdir = sys.argv[1] if len(sys.argv) > 1 else os.path.relpath(os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures"))
    os.makedirs(outdir, exist_ok=True)
    torch.set_num_threads(1)
    for fname, (L, NH, C, V, maxT, B, T, seed) in CONFIGS.items():
        generate(os.path.join(outdir, fname), L, NH, C, V, maxT, B, T, seed)


if __name__ == "__main__":
    main()
