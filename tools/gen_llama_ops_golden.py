#!/usr/bin/env python3
"""gen_llama_ops_golden.py - PyTorch golden file for the Llama-family ops
(tests/test_ops_llama.c): RMSNorm, rotary embeddings and their inverse-
frequency tables, SwiGLU, grouped-query causal attention.

Why: each cpu op is checked against an independent implementation, here
Hugging Face transformers' own Llama pieces where they exist
(LlamaRMSNorm's formula, LlamaRotaryEmbedding and apply_rotary_pos_emb,
ROPE_INIT_FUNCTIONS, eager_attention_forward with repeat_kv) and autograd
for every backward. Inputs are random fp32 values; the math runs in
float64 (rope's cos/sin are HF's fp32 ones, widened) and is stored fp32.

Output: one safetensors file (readable by fsdp's own parser, src/ckpt/
safetensors.h, and by the `safetensors` package). Tensor names are
CASE/FIELD; every tensor is F32 unless marked I32. Every op case has inp
(the input), out, dout (a random cotangent) and dinp (the gradient of
sum(out * dout) with respect to inp); layouts are the fsdp op layouts of
src/ops/ops.h, row-major:

  rmsnorm, rmsnorm_eps (inputs ~ sqrt(eps))
                     shape I32 [N, C]   eps (1,)
                     inp (N, C)  w (C,)  out (N, C)  rstd (N,)
                     dout (N, C)  dinp (N, C)  dw (C,)
  rope, rope_pos     shape I32 [B, T, NH, NKV, hd]   inv_freq (hd/2,)
                     pos I32 (B*T,) (rope_pos only: packed documents)
                     inp (B, T, (NH+2NKV) hd)   out: inp after rope on q and k
                     dout (same)  dinp: dout rotated back (q and k parts; the
                     v part equals dout)
  rope_table/LABEL   spec [theta, factor, low_freq_factor, high_freq_factor,
                     original_max_position_embeddings, head_dim]
                     type I32 [0 default | 1 linear | 2 llama3]
                     inv_freq (hd/2,) from transformers' ROPE_INIT_FUNCTIONS
  swiglu             shape I32 [N, IC]   inp (N, 2 IC) = [gate | up]
                     out (N, IC)  dout (N, IC)  dinp (N, 2 IC)
  attn_gqa, attn_mqa, attn_mha, attn_packed
                     shape I32 [B, T, NH, NKV, hd]
                     pos I32 (B*T,) (attn_packed only)
                     inp (B, T, (NH+2NKV) hd) = qkv  out (B, T, NH hd)
                     att (B, NH, T, T) softmax, 0 outside the mask
                     dout (B, T, NH hd)  dinp (B, T, (NH+2NKV) hd)

The attention mask: token t sees t' in [t - pos[t], t] (pos = t when
absent), the contract of attention_gqa_fwd.

Usage: tools/gen_llama_ops_golden.py [OUT]
       (default tests/fixtures/llama_ops_golden.safetensors)
Needs torch, transformers and safetensors (pip).
"""
import math
import os
import sys

import torch
from safetensors.torch import save_file
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.llama import modeling_llama as hf_llama

SEED = 20240612
ROPE_TYPES = ["default", "linear", "llama3"]

gen = torch.Generator().manual_seed(SEED)
out = {}


def randn(*shape, scale=1.0):
    """fp32 random values, returned as float64 (exactly representable)."""
    return (scale * torch.randn(*shape, generator=gen, dtype=torch.float32)).double()


def put(name, t):
    if t.dtype in (torch.int32, torch.int64):
        out[name] = t.to(torch.int32).contiguous()
    else:
        out[name] = t.detach().to(torch.float32).contiguous()


def shape_rec(name, dims):
    put(name, torch.tensor(dims, dtype=torch.int32))


# ---- RMSNorm ---------------------------------------------------------------

def rmsnorm_case(name, N, C, eps, scale):
    x = randn(N, C, scale=scale).requires_grad_(True)
    w = (1.0 + randn(C, scale=0.3)).requires_grad_(True)
    # LlamaRMSNorm.forward, in float64
    variance = x.pow(2).mean(-1, keepdim=True)
    rstd = torch.rsqrt(variance + eps)
    y = w * (x * rstd)
    dy = randn(N, C)
    y.backward(dy)
    shape_rec(name + "/shape", [N, C])
    put(name + "/eps", torch.tensor([eps]))
    for k, v in [("inp", x), ("w", w), ("out", y), ("rstd", rstd.squeeze(-1)), ("dout", dy),
                 ("dinp", x.grad), ("dw", w.grad)]:
        put(name + "/" + k, v)


# ---- rotary embeddings -------------------------------------------------------

def llama_config(hidden, heads, kv_heads, head_dim, rope):
    cfg = LlamaConfig(hidden_size=hidden, num_attention_heads=heads,
                      num_key_value_heads=kv_heads, head_dim=head_dim,
                      intermediate_size=4 * hidden, num_hidden_layers=1, vocab_size=32,
                      max_position_embeddings=131072, rope_parameters=dict(rope))
    return cfg


def rope_case(name, B, T, NH, NKV, hd, rope, pos=None):
    cfg = llama_config(NH * hd, NH, NKV, hd, rope)
    rot = hf_llama.LlamaRotaryEmbedding(cfg)
    QS = (NH + 2 * NKV) * hd
    qkv = randn(B, T, QS).requires_grad_(True)
    position_ids = (torch.arange(T).expand(B, T) if pos is None
                    else torch.tensor(pos, dtype=torch.int64).view(B, T))
    # HF's cos/sin are fp32 (computed from the fp32 angle); widen them.
    cos, sin = rot(torch.zeros(1, dtype=torch.float32), position_ids)
    cos, sin = cos.double(), sin.double()
    q = qkv[..., :NH * hd].view(B, T, NH, hd).transpose(1, 2)
    k = qkv[..., NH * hd:(NH + NKV) * hd].view(B, T, NKV, hd).transpose(1, 2)
    v = qkv[..., (NH + NKV) * hd:]
    qe, ke = hf_llama.apply_rotary_pos_emb(q, k, cos, sin)
    y = torch.cat([qe.transpose(1, 2).reshape(B, T, NH * hd),
                   ke.transpose(1, 2).reshape(B, T, NKV * hd), v], dim=-1)
    dy = randn(B, T, QS)
    y.backward(dy)
    shape_rec(name + "/shape", [B, T, NH, NKV, hd])
    put(name + "/inv_freq", rot.inv_freq)
    if pos is not None:
        put(name + "/pos", position_ids.reshape(-1))
    for k_, v_ in [("inp", qkv), ("out", y), ("dout", dy), ("dinp", qkv.grad)]:
        put(name + "/" + k_, v_)


def rope_table(label, rope, head_dim, heads=4):
    cfg = llama_config(heads * head_dim, heads, heads, head_dim, rope)
    rtype = rope.get("rope_type", "default")
    if rtype == "default":
        inv, _ = hf_llama.LlamaRotaryEmbedding.compute_default_rope_parameters(cfg)
    else:
        inv, _ = ROPE_INIT_FUNCTIONS[rtype](cfg, "cpu")
    spec = [rope["rope_theta"], rope.get("factor", 0.0), rope.get("low_freq_factor", 0.0),
            rope.get("high_freq_factor", 0.0), rope.get("original_max_position_embeddings", 0),
            head_dim]
    put("rope_table/%s/spec" % label, torch.tensor(spec, dtype=torch.float64))
    put("rope_table/%s/type" % label, torch.tensor([ROPE_TYPES.index(rtype)]))
    put("rope_table/%s/inv_freq" % label, inv)


# ---- SwiGLU ------------------------------------------------------------------

def swiglu_case(name, N, IC):
    x = randn(N, 2 * IC, scale=3.0).requires_grad_(True)
    g, u = x[:, :IC], x[:, IC:]
    y = torch.nn.functional.silu(g) * u  # LlamaMLP: act_fn(gate_proj(x)) * up_proj(x)
    dy = randn(N, IC)
    y.backward(dy)
    shape_rec(name + "/shape", [N, IC])
    for k, v in [("inp", x), ("out", y), ("dout", dy), ("dinp", x.grad)]:
        put(name + "/" + k, v)


# ---- attention ---------------------------------------------------------------

class _Attn(torch.nn.Module):
    """What eager_attention_forward reads from its module."""

    def __init__(self, groups):
        super().__init__()
        self.num_key_value_groups = groups
        self.training = False


def attention_case(name, B, T, NH, NKV, hd, pos=None):
    QS = (NH + 2 * NKV) * hd
    qkv = randn(B, T, QS, scale=1.5).requires_grad_(True)
    q = qkv[..., :NH * hd].view(B, T, NH, hd).transpose(1, 2)
    k = qkv[..., NH * hd:(NH + NKV) * hd].view(B, T, NKV, hd).transpose(1, 2)
    v = qkv[..., (NH + NKV) * hd:].view(B, T, NKV, hd).transpose(1, 2)
    p = (torch.arange(T).expand(B, T) if pos is None
         else torch.tensor(pos, dtype=torch.int64).view(B, T))
    t = torch.arange(T).view(1, T, 1)
    j = torch.arange(T).view(1, 1, T)
    allowed = (j <= t) & (j >= t - p.view(B, T, 1))
    mask = torch.zeros(B, 1, T, T, dtype=torch.float64)
    mask.masked_fill_(~allowed.unsqueeze(1), float("-inf"))
    o, att = hf_llama.eager_attention_forward(_Attn(NH // NKV), q, k, v, mask,
                                              scaling=1.0 / math.sqrt(hd), dropout=0.0)
    y = o.reshape(B, T, NH * hd)
    dy = randn(B, T, NH * hd)
    y.backward(dy)
    shape_rec(name + "/shape", [B, T, NH, NKV, hd])
    if pos is not None:
        put(name + "/pos", p.reshape(-1))
    for k_, v_ in [("inp", qkv), ("out", y), ("att", att), ("dout", dy), ("dinp", qkv.grad)]:
        put(name + "/" + k_, v_)


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures",
        "llama_ops_golden.safetensors")
    torch.manual_seed(SEED)

    rmsnorm_case("rmsnorm", 7, 45, 1e-5, 2.0)
    # inputs small enough that eps is half the mean square (Qwen2's eps)
    rmsnorm_case("rmsnorm_eps", 3, 16, 1e-6, 1e-3)

    # Small original context so the llama3 ramp covers all three regimes
    # (kept, blended, divided) at head_dim 16.
    small_llama3 = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 4.0,
                    "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 32}
    rope_case("rope", 2, 9, 4, 2, 16, small_llama3)
    packed = list(range(5)) + list(range(4)) + list(range(9))
    rope_case("rope_pos", 2, 9, 2, 1, 8, {"rope_type": "default", "rope_theta": 10000.0},
              pos=packed)

    rope_table("llama3.1-8b", {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                               "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                               "original_max_position_embeddings": 8192}, 128)
    rope_table("llama3.2-1b", {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0,
                               "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                               "original_max_position_embeddings": 8192}, 64)
    rope_table("small-llama3", small_llama3, 16)
    rope_table("qwen2.5", {"rope_type": "default", "rope_theta": 1000000.0}, 128)
    rope_table("llama2", {"rope_type": "default", "rope_theta": 10000.0}, 64)
    rope_table("linear", {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}, 32)

    swiglu_case("swiglu", 5, 37)

    attention_case("attn_gqa", 2, 11, 4, 2, 8)
    attention_case("attn_mqa", 1, 7, 3, 1, 12)
    attention_case("attn_mha", 2, 6, 2, 2, 8)
    attention_case("attn_packed", 2, 10, 4, 2, 8,
                   pos=list(range(4)) + list(range(6)) + list(range(3)) + list(range(2)) +
                   list(range(5)))

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    # one metadata entry: safetensors orders several at random, and the
    # fixture should be byte-identical when regenerated
    save_file(out, path, metadata={"generator": "tools/gen_llama_ops_golden.py seed %d" % SEED})
    print("wrote %s (%d tensors, %d bytes)" % (path, len(out), os.path.getsize(path)))


if __name__ == "__main__":
    main()
