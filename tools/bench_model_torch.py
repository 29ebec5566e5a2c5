#!/usr/bin/env python3
"""bench_model_torch.py - the PyTorch side of tools/bench_model.c.

Why: bench_model compares the C model's forward+backward throughput on one
rank with the same model in PyTorch on the CPU, with the same thread count,
batch, sequence length and padded vocabulary (the C head computes Vp logit
columns, so this one does too; the loss uses the first V). --dtype bf16
runs the model under torch.autocast (bf16 matmuls, fp32 weights), the
closest PyTorch counterpart of fsdp's bf16 compute dtype.

Models: GPT-2 (the default), and with --family llama the Llama of
models/llama.c written as PyTorch eager code the way transformers' eager
path computes it (RMSNorm in fp32, rotate-half rotary embeddings, k/v heads
repeated for grouped-query attention, softmax attention with a causal mask,
SwiGLU), with q|k|v and gate|up each one nn.Linear as fsdp fuses them (no
biases, default rope; untied head unless --tied).

Prints one line: "tokens_per_s X fwd_ms F bwd_ms B" (means over --iters
timed iterations after --warmup untimed ones; with --stat best, the fastest
of them).

Usage: bench_model_torch.py [--family gpt2|llama] --layers L --heads H --channels C
       --vocab V --padded-vocab Vp --context T --batch B --seq T [--iters N] [--warmup N]
       [--threads N] [--dtype fp32|bf16] [--stat mean|best]
       llama: --kv-heads K --intermediate I --head-dim D [--rope-theta X] [--eps E] [--tied]
"""
import argparse
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, C, NH):
        super().__init__()
        self.NH = NH
        self.ln_1 = nn.LayerNorm(C)
        self.c_attn = nn.Linear(C, 3 * C)
        self.attn_proj = nn.Linear(C, C)
        self.ln_2 = nn.LayerNorm(C)
        self.c_fc = nn.Linear(C, 4 * C)
        self.mlp_proj = nn.Linear(4 * C, C)

    def forward(self, x, mask):
        B, T, C = x.shape
        hs = C // self.NH
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q = q.view(B, T, self.NH, hs).transpose(1, 2)
        k = k.view(B, T, self.NH, hs).transpose(1, 2)
        v = v.view(B, T, self.NH, hs).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
        att = torch.softmax(att.masked_fill(mask[:T, :T], float("-inf")), dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + self.attn_proj(y)
        h = F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh")
        return x + self.mlp_proj(h)


class GPT(nn.Module):
    def __init__(self, L, NH, C, V, Vp, maxT):
        super().__init__()
        self.V = V
        self.wte = nn.Embedding(Vp, C)
        self.wpe = nn.Embedding(maxT, C)
        self.h = nn.ModuleList([Block(C, NH) for _ in range(L)])
        self.ln_f = nn.LayerNorm(C)
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)
        self.register_buffer("mask", torch.ones(maxT, maxT, dtype=torch.bool).triu(1))

    def forward(self, idx, targets):
        B, T = idx.shape
        x = self.wte(idx) + self.wpe(torch.arange(T))
        for blk in self.h:
            x = blk(x, self.mask)
        logits = self.ln_f(x) @ self.wte.weight.t()  # tied head, Vp columns
        return F.cross_entropy(logits[..., : self.V].reshape(-1, self.V), targets.reshape(-1))


class RMSNorm(nn.Module):
    def __init__(self, C, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(C))
        self.eps = eps

    def forward(self, x):
        var = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(var + self.eps))


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


class LlamaLayer(nn.Module):
    def __init__(self, C, NH, NKV, hd, IC, eps):
        super().__init__()
        self.NH, self.NKV, self.hd, self.IC = NH, NKV, hd, IC
        self.input_layernorm = RMSNorm(C, eps)
        self.qkv_proj = nn.Linear(C, (NH + 2 * NKV) * hd, bias=False)
        self.o_proj = nn.Linear(NH * hd, C, bias=False)
        self.post_attention_layernorm = RMSNorm(C, eps)
        self.gate_up_proj = nn.Linear(C, 2 * IC, bias=False)
        self.down_proj = nn.Linear(IC, C, bias=False)

    def forward(self, x, cos, sin, mask):
        B, T, _ = x.shape
        NH, NKV, hd = self.NH, self.NKV, self.hd
        q, k, v = self.qkv_proj(self.input_layernorm(x)).split([NH * hd, NKV * hd, NKV * hd], -1)
        q = q.view(B, T, NH, hd).transpose(1, 2)
        k = k.view(B, T, NKV, hd).transpose(1, 2)
        v = v.view(B, T, NKV, hd).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = k.repeat_interleave(NH // NKV, dim=1)
        v = v.repeat_interleave(NH // NKV, dim=1)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
        att = torch.softmax(att.masked_fill(mask[:T, :T], float("-inf")), dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, NH * hd)
        x = x + self.o_proj(y)
        gate, up = self.gate_up_proj(self.post_attention_layernorm(x)).split(self.IC, -1)
        return x + self.down_proj(F.silu(gate) * up)


class Llama(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.V = a.vocab
        self.embed_tokens = nn.Embedding(a.padded_vocab, a.channels)
        self.layers = nn.ModuleList([LlamaLayer(a.channels, a.heads, a.kv_heads, a.head_dim,
                                                a.intermediate, a.eps) for _ in range(a.layers)])
        self.norm = RMSNorm(a.channels, a.eps)
        self.lm_head = None if a.tied else nn.Linear(a.channels, a.padded_vocab, bias=False)
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)
        inv = 1.0 / (a.rope_theta ** (torch.arange(0, a.head_dim, 2).float() / a.head_dim))
        ang = torch.outer(torch.arange(a.context).float(), inv)
        emb = torch.cat((ang, ang), dim=-1)
        self.register_buffer("cos", emb.cos())
        self.register_buffer("sin", emb.sin())
        self.register_buffer("mask", torch.ones(a.context, a.context, dtype=torch.bool).triu(1))

    def forward(self, idx, targets):
        B, T = idx.shape
        x = self.embed_tokens(idx)
        cos, sin = self.cos[:T], self.sin[:T]
        for layer in self.layers:
            x = layer(x, cos, sin, self.mask)
        w = self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        logits = self.norm(x) @ w.t()  # Vp columns
        return F.cross_entropy(logits[..., : self.V].reshape(-1, self.V), targets.reshape(-1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--family", choices=("gpt2", "llama"), default="gpt2")
    for k in ("layers", "heads", "channels", "vocab", "padded-vocab", "context", "batch", "seq"):
        ap.add_argument("--" + k, type=int, required=True)
    for k in ("kv-heads", "intermediate", "head-dim"):
        ap.add_argument("--" + k, type=int)
    ap.add_argument("--rope-theta", type=float, default=10000.0)
    ap.add_argument("--eps", type=float, default=1e-5)
    ap.add_argument("--tied", action="store_true")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--stat", choices=("mean", "best"), default="mean",
                    help="best: the fastest iteration (bench_model --best)")
    ap.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    if a.family == "llama":
        if None in (a.kv_heads, a.intermediate, a.head_dim):
            ap.error("--family llama needs --kv-heads, --intermediate and --head-dim")
        model = Llama(a)
    else:
        model = GPT(a.layers, a.heads, a.channels, a.vocab, a.padded_vocab, a.context)
    idx = torch.randint(0, a.vocab, (a.batch, a.seq))
    tgt = torch.randint(0, a.vocab, (a.batch, a.seq))
    fwd = bwd = 0.0
    times = []
    for i in range(a.warmup + a.iters):
        model.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.dtype == "bf16"):
            loss = model(idx, tgt)
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        if i >= a.warmup:
            fwd += t1 - t0
            bwd += t2 - t1
            times.append((t1 - t0, t2 - t1))
    n = a.iters
    if a.stat == "best":
        fwd, bwd = min(times, key=sum)
        n = 1
    print("tokens_per_s %.1f fwd_ms %.2f bwd_ms %.2f" %
          (a.batch * a.seq * n / (fwd + bwd), 1e3 * fwd / n, 1e3 * bwd / n))


if __name__ == "__main__":
    main()
