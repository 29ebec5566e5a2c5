#!/usr/bin/env python3
"""gen_llama_golden.py - model-level golden fixtures for the Llama family,
computed by Hugging Face transformers (LlamaForCausalLM, Qwen2ForCausalLM).

Why: models/llama.c (with the ops of tests/test_ops_llama.c) must reproduce
transformers on the architectures people fine-tune: logits and loss to
1e-5 relative in fp32, every parameter gradient to 1e-4, and an AdamW
trajectory with gradient clipping step by step. These files are that
reference, small enough to commit.

Fixtures (one directory each, a Hugging Face model directory that
`AutoModelForCausalLM.from_pretrained` loads and `fsdp --model DIR` will):
  tests/fixtures/llama_gqa/    Llama 3 style: 4 query / 2 kv heads, head_dim
                               16 != hidden/heads, llama3 rope scaling with all
                               three frequency regimes, untied lm_head, no biases
  tests/fixtures/llama_qwen2/  Qwen2 style: 6 query / 2 kv heads, q/k/v
                               biases, tied embeddings, rope_theta 1e6, eps 1e-6

Each directory holds:
  config.json         in the format of released checkpoints (rope_theta and
                      rope_scaling at top level, as Llama 3.2 and Qwen2.5 ship)
  model.safetensors   the initial parameters, F32, by HF name (a tied model
                      has no lm_head.weight, as transformers saves it)
  golden.safetensors  (F32 unless marked; row-major):
    tokens  I32 (B, T)        the input batch
    targets I32 (B, T)        next tokens (loss on every position)
    logits  (B, T, V)         from the initial parameters
    loss    (1,)              mean cross-entropy over the B*T positions
    grad/NAME                 d loss / d parameter NAME, same shape as it
    adamw   (6,)              [lr, beta1, beta2, eps, weight_decay, clip]
    step_losses (STEPS,)      loss before each AdamW step, same batch every step
    step_grad_norms (STEPS,)  global gradient norm before clipping
    final/NAME                parameters after STEPS steps

The trajectory: g = grad; if clip > 0 and |g| > clip, g *= clip / (|g| +
1e-6) (torch's clip_grad_norm_, fsdp's engine); torch.optim.AdamW with
weight decay on parameters of two or more dimensions (embeddings, linear
weights, lm_head), none on norms and biases.

Parameters are drawn in fp32 from torch's RNG at scales that carry signal
(norm weights 1 + 0.1 N, biases 0.1 N, linear weights N / sqrt(fan_in),
embeddings 0.2 N); all math runs in float64 and is stored as float32.

Usage: tools/gen_llama_golden.py [--check] [OUTDIR]   (default tests/fixtures)
  --check  reload every fixture with AutoModelForCausalLM.from_pretrained and
           verify it against itself: shapes and names, logits, loss and
           gradients recomputed, the trajectory replayed, the rope type
           transformers reads from config.json. Exit 1 on any mismatch.
Needs torch, transformers, safetensors (pip).
"""
import json
import math
import os
import sys

import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import AutoConfig, AutoModelForCausalLM

B, T, STEPS = 2, 16, 8
LR, BETA1, BETA2, EPS, WD, CLIP = 1e-2, 0.9, 0.95, 1e-8, 0.1, 1.0

CONFIGS = {
    "llama_gqa": ({
        "architectures": ["LlamaForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "head_dim": 16,
        "hidden_act": "silu",
        "hidden_size": 48,
        "initializer_range": 0.02,
        "intermediate_size": 80,
        "max_position_embeddings": 256,
        "mlp_bias": False,
        "model_type": "llama",
        "num_attention_heads": 4,
        "num_hidden_layers": 2,
        "num_key_value_heads": 2,
        "pretraining_tp": 1,
        "rms_norm_eps": 1e-05,
        # wavelengths 2 pi 5e5^(2i/16): i = 0 below 64/4 (kept), i = 1 between
        # (blended), i >= 2 above 64 (divided by 8)
        "rope_scaling": {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                         "original_max_position_embeddings": 64, "rope_type": "llama3"},
        "rope_theta": 500000.0,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "use_cache": True,
        "vocab_size": 128,
    }, 1234),
    "llama_qwen2": ({
        "architectures": ["Qwen2ForCausalLM"],
        "attention_dropout": 0.0,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "hidden_act": "silu",
        "hidden_size": 48,
        "initializer_range": 0.02,
        "intermediate_size": 96,
        "max_position_embeddings": 256,
        "max_window_layers": 2,
        "model_type": "qwen2",
        "num_attention_heads": 6,
        "num_hidden_layers": 2,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-06,
        "rope_theta": 1000000.0,
        "sliding_window": 256,
        "tie_word_embeddings": True,
        "torch_dtype": "float32",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": 128,
    }, 4321),
}


def named_params(model):
    """HF name -> parameter; a tied lm_head appears once, as embed_tokens."""
    return dict(model.named_parameters(remove_duplicate=True))


def init_params(model, gen):
    with torch.no_grad():
        for name, p in named_params(model).items():
            r = torch.randn(p.shape, generator=gen, dtype=torch.float32)
            if name.endswith("norm.weight"):
                v = 1.0 + 0.1 * r
            elif name.endswith(".bias"):
                v = 0.1 * r
            elif name.endswith("embed_tokens.weight"):
                v = 0.2 * r
            else:
                v = r / math.sqrt(p.shape[1])
            p.copy_(v.double())


def load_model(config):
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float64,
                                             attn_implementation="eager")
    return model.double().eval()


def forward_loss(model, tokens, targets):
    logits = model(input_ids=tokens).logits
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
    return logits, loss


def trajectory(model, tokens, targets):
    """STEPS AdamW steps with clipping; losses, pre-clip norms, final params."""
    params = named_params(model)
    decay = [p for p in params.values() if p.dim() >= 2]
    no_decay = [p for p in params.values() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WD},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=LR, betas=(BETA1, BETA2), eps=EPS)
    losses, norms = [], []
    for _ in range(STEPS):
        opt.zero_grad(set_to_none=True)
        _, loss = forward_loss(model, tokens, targets)
        loss.backward()
        norm = torch.sqrt(sum((p.grad ** 2).sum() for p in params.values()))
        if CLIP > 0 and norm > CLIP:
            for p in params.values():
                p.grad.mul_(CLIP / (norm + 1e-6))
        opt.step()
        losses.append(loss.item())
        norms.append(norm.item())
    return losses, norms, {n: p.detach().clone() for n, p in params.items()}


def f32(t):
    return t.detach().to(torch.float32).contiguous()


def generate(outdir, name, cfg_json, seed):
    d = os.path.join(outdir, name)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg_json, f, indent=2, sort_keys=True)
        f.write("\n")
    config = AutoConfig.from_pretrained(d)
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    model = load_model(config)
    init_params(model, gen)
    V = config.vocab_size
    seq = torch.randint(0, V, (B, T + 1), generator=gen)
    tokens, targets = seq[:, :T].contiguous(), seq[:, 1:].contiguous()

    params = named_params(model)
    save_file({n: f32(p) for n, p in params.items()}, os.path.join(d, "model.safetensors"),
              metadata={"format": "pt"})
    logits, loss = forward_loss(model, tokens, targets)
    loss.backward()
    golden = {"tokens": tokens.to(torch.int32), "targets": targets.to(torch.int32),
              "logits": f32(logits), "loss": f32(loss.reshape(1)),
              "adamw": torch.tensor([LR, BETA1, BETA2, EPS, WD, CLIP], dtype=torch.float32)}
    for n, p in params.items():
        golden["grad/" + n] = f32(p.grad)
    model.zero_grad(set_to_none=True)
    losses, norms, final = trajectory(model, tokens, targets)
    golden["step_losses"] = torch.tensor(losses, dtype=torch.float32)
    golden["step_grad_norms"] = torch.tensor(norms, dtype=torch.float32)
    for n, p in final.items():
        golden["final/" + n] = f32(p)
    save_file(golden, os.path.join(d, "golden.safetensors"),
              metadata={"generator": "tools/gen_llama_golden.py seed %d" % seed})
    sizes = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))
    print("%s: loss %.6f, grad norms %s, clipped in %d of %d steps, %d bytes" %
          (d, loss.item(), " ".join("%.3g" % x for x in norms), sum(x > CLIP for x in norms),
           STEPS, sizes))


# ---- --check ----------------------------------------------------------------

def read_st(path):
    with safe_open(path, "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def close(what, got, want, rtol, errors):
    got, want = got.double(), want.double()
    if got.shape != want.shape:
        errors.append("%s: shape %s, expected %s" % (what, tuple(got.shape), tuple(want.shape)))
        return
    scale = want.pow(2).mean().sqrt()
    err = ((got - want).abs() / (want.abs() + scale)).max().item()
    if not err <= rtol:
        errors.append("%s: relative error %.3g > %g" % (what, err, rtol))


def check(outdir, name):
    d = os.path.join(outdir, name)
    errors = []
    cfg = json.load(open(os.path.join(d, "config.json")))
    model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float64,
                                                 attn_implementation="eager").double().eval()
    rope = model.model.rotary_emb.rope_type
    want_rope = cfg.get("rope_scaling", {}).get("rope_type", "default")
    if rope != want_rope:
        errors.append("rope type %s, config.json says %s" % (rope, want_rope))
    g = read_st(os.path.join(d, "golden.safetensors"))
    weights = read_st(os.path.join(d, "model.safetensors"))
    params = named_params(model)
    tied = cfg["tie_word_embeddings"]
    if tied != ("lm_head.weight" not in weights):
        errors.append("tie_word_embeddings %s but lm_head.weight %s" %
                      (tied, "absent" if tied else "present"))
    if set(weights) != set(params):
        errors.append("model.safetensors names differ from the model's: %s" %
                      sorted(set(weights) ^ set(params)))
    for n, p in params.items():
        if n in weights and not torch.equal(p.detach().float(), weights[n]):
            errors.append("%s: from_pretrained did not load the stored values" % n)
        for pre in ("grad/", "final/"):
            if pre + n not in g or g[pre + n].shape != p.shape:
                errors.append("golden lacks %s%s of shape %s" % (pre, n, tuple(p.shape)))
    tokens, targets = g["tokens"].long(), g["targets"].long()
    if tokens.shape != (B, T) or targets.shape != (B, T):
        errors.append("tokens/targets shape %s/%s" % (tuple(tokens.shape), tuple(targets.shape)))
    logits, loss = forward_loss(model, tokens, targets)
    loss.backward()
    close("logits", logits, g["logits"], 1e-6, errors)
    close("loss", loss.reshape(1), g["loss"], 1e-6, errors)
    for n, p in params.items():
        close("grad/" + n, p.grad, g["grad/" + n], 1e-6, errors)
    model.zero_grad(set_to_none=True)
    losses, norms, final = trajectory(model, tokens, targets)
    close("step_losses", torch.tensor(losses), g["step_losses"], 1e-6, errors)
    close("step_grad_norms", torch.tensor(norms), g["step_grad_norms"], 1e-6, errors)
    if not any(x > CLIP for x in norms) or all(x > CLIP for x in norms):
        errors.append("clipping should be active in some steps and not in others: %s" % norms)
    if not losses[-1] < losses[0]:
        errors.append("the trajectory does not learn: %s" % losses)
    for n, p in final.items():
        close("final/" + n, p, g["final/" + n], 1e-6, errors)
    adamw = g["adamw"].tolist()
    want = [LR, BETA1, BETA2, EPS, WD, CLIP]
    if any(abs(a - b) > 1e-6 * abs(b) for a, b in zip(adamw, want)):
        errors.append("adamw %s, expected %s" % (adamw, want))
    for e in errors:
        print("%s: %s" % (d, e))
    print("%s: %s" % (d, "ok" if not errors else "%d problems" % len(errors)))
    return not errors


def main():
    args = sys.argv[1:]
    do_check = "--check" in args
    args = [a for a in args if a != "--check"]
    outdir = args[0] if args else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                               "tests", "fixtures")
    torch.use_deterministic_algorithms(True)
    ok = True
    for name, (cfg, seed) in CONFIGS.items():
        if do_check:
            ok = check(outdir, name) and ok
        else:
            generate(outdir, name, cfg, seed)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
