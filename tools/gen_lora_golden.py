#!/usr/bin/env python3
"""gen_lora_golden.py - the PyTorch + PEFT reference for LoRA fine-tuning:
adapters on the tiny Hugging Face fixtures, trained in float64.

Why: fsdp's LoRA (models/lora.h, the engine's frozen base, --adapter) must
reproduce PEFT: the same step losses, gradient norms and final adapters over
several AdamW steps with gradient accumulation, global-norm clipping, weight
decay on the adapters and fsdp's warmup + cosine schedule, on a Llama 3 style
model (GQA, untied head, a subset of targets) and a Qwen2 style one (q/k/v
biases, tied embeddings, all-linear, rslora). These files are that
reference, small enough to commit (about 60 KB per fixture).

Fixtures (the base models are tests/fixtures/llama_gqa and
tests/fixtures/llama_qwen2, made by tools/gen_llama_golden.py; not changed):
  tests/fixtures/lora_gqa/     base llama_gqa, target_modules
                               [q_proj, v_proj, down_proj], r 4, alpha 8
                               (scale 2)
  tests/fixtures/lora_qwen2/   base llama_qwen2, target_modules "all-linear"
                               (q, k, v, o, gate, up, down; not the tied
                               head), r 4, alpha 8, use_rslora (scale 4)

Each directory holds:
  adapter_init/adapter_config.json        as PEFT's LoraConfig.save_pretrained
  adapter_init/adapter_model.safetensors  writes them (base_model_name_or_path
                                          is the base fixture's path from the
                                          repository root); the initial
                                          adapters in F32, PEFT's names
                                          ("base_model.model.<fsdp name>"): A
                                          U(-1/sqrt(C), 1/sqrt(C)), B 0.1 N
                                          (NOT zero, so that every adapter
                                          has a gradient at step 1), drawn in
                                          fp32 from torch's RNG with the seed
  tokens.bin        the data: an llm.c token shard (magic 20240520, version 1,
                    uint16) of the 64-token stream
  golden.safetensors (F32 unless marked):
    stream   I32 (64,)      the token stream tokens.bin holds
    tokens   I32 (4, 16)    the batch: row k = stream[16k .. 16k + 15]
    targets  I32 (4, 16)    row k = stream[16k + 1 .. 16k + 16] (the last
                            target of row 3 wraps to stream[0])
    settings (12,)          [lr, min_lr, warmup, steps, beta1, beta2, eps,
                             weight_decay, clip, grad_accum, batch, seq]
    step_lrs (4,)           the learning rate of each step (fsdp's formula)
    step_losses (4,)        each step's loss: the mean of its two micro-batch
                            losses (each a mean over its 2 x 16 positions)
    step_grad_norms (4,)    the global norm of the adapters' gradient, before
                            clipping
    final/NAME              every adapter after the 4 steps, by PEFT name

The trajectory, step s = 0..3, on the same batch every step: gradients
zeroed; micro-batch a = 0, 1 is rows 2a, 2a + 1; loss_a / 2 backward (so the
gradient is that of the mean over the 4 rows); g = grad; if |g| > clip, g *=
clip / (|g| + 1e-6) (fsdp's engine); torch.optim.AdamW (betas 0.9, 0.95, eps
1e-8, weight_decay 0.1 on every adapter, fsdp's decay = true) at the step's
rate: warmup s < W: lr (s + 1) / W; after it, cosine: min + (lr - min)(1 +
cos(pi p)) / 2, p = (s - W) / (S - W - 1) (src/train/schedule.c, in the
same float32/double roundings). Only the adapters train; the base is frozen.
All math runs in float64 from the stored F32 values.

How the lead's end-to-end test reproduces it (from the repository root; the
data is a stream, so micro-batch m row r is the 17 tokens from (m B + r) 16
modulo 64: with B x A x devices = 4 rows a step, every step sees exactly the
4 rows above, on any device count):

  fsdp train --model tests/fixtures/llama_gqa \
      --adapter tests/fixtures/lora_gqa/adapter_init \
      --data tests/fixtures/lora_gqa/tokens.bin \
      --steps 4 --batch 2 --grad-accum 2 --seq 16 --devices 1 \
      --lr 1e-2 --min-lr 1e-3 --warmup 1 --schedule cosine \
      --wd 0.1 --clip CLIP --precision fp32 --deterministic
  (CLIP: 0.9 for lora_gqa, 3.5 for lora_qwen2: settings[8]; --beta1 0.9
  --beta2 0.95 --eps 1e-8 are fsdp's AdamW defaults; with --devices 2 use
  --batch 1 --grad-accum 2, with --devices 4 --batch 1 --grad-accum 1)

(Checked when the fixtures were made: `fsdp train` of the base alone with
these data flags gives step 1 loss 5.46493, the float64 base's loss on
tokens/targets, 5.464932: the micro-batches are these rows.)

then compare its step losses (metrics --log) with step_losses (fp32 against
float64: about 1e-5 relative, as tests/test_llama.c's AdamW trajectory) and
the exported adapters (`fsdp convert CKPT OUT --to peft`) with final/NAME
(about 2e-3 relative, the same test's bound for 8 full steps; Adam divides
each gradient by its own rms, so fp32 rounding shows in the smallest ones).

Usage: tools/gen_lora_golden.py [--check] [OUTDIR]   (default tests/fixtures)
  --check  reload each adapter_init with peft.PeftModel.from_pretrained on
           the base fixture and verify it: config (r, alpha, rslora,
           targets), every adapter loaded with the stored values, every
           targeted module adapted and no other; the trajectory replayed
           against golden.safetensors; tokens.bin against the stream.
           Exit 1 on any mismatch.
Needs torch, transformers, peft, safetensors (pip).
"""
import json
import math
import os
import struct
import sys
import warnings

import numpy as np
import torch
import torch.nn.functional as F
from peft import LoraConfig, PeftModel, get_peft_model
from peft.utils import get_peft_model_state_dict
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM

from gen_llama_golden import close, read_st  # tools/: the same comparisons

B, T, A, STEPS = 2, 16, 2, 4           # rows per micro-batch, seq, grad accum, steps
ROWS = B * A                            # the batch: 4 rows, the whole 64-token stream
LR, MIN_LR, WARMUP = 1e-2, 1e-3, 1
BETA1, BETA2, EPS, WD = 0.9, 0.95, 1e-8, 0.1
R, ALPHA = 4, 8

FIXTURES = {
    # name: (base fixture, target_modules, use_rslora, clip, seed)
    "lora_gqa": ("llama_gqa", ["q_proj", "v_proj", "down_proj"], False, 0.9, 2024),
    "lora_qwen2": ("llama_qwen2", "all-linear", True, 3.5, 4242),
}


def repo_root():
    return os.path.relpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def lr_at(step):
    """fsdp_lr_at (src/train/schedule.c) for the cosine schedule, with its
    roundings: lr a float, the floor a double of a float, the cosine in
    double rounded to float once."""
    lr = np.float32(LR)
    if step < WARMUP:
        return float(lr * np.float32(step + 1) / np.float32(WARMUP))
    lo = float(np.float32(MIN_LR))
    span = STEPS - WARMUP
    p = min(1.0, (step - WARMUP) / (span - 1)) if span > 1 else 1.0
    f = 0.5 * (1.0 + math.cos(math.pi * p))
    return float(np.float32(lo + f * (float(lr) - lo)))


def base_model(base_dir):
    m = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float64,
                                             attn_implementation="eager")
    return m.double().eval()


def lora_config(targets, rslora, base_name):
    return LoraConfig(r=R, lora_alpha=ALPHA, target_modules=targets, lora_dropout=0.0,
                      bias="none", use_rslora=rslora, task_type="CAUSAL_LM",
                      base_model_name_or_path=base_name)


def adapters(model):
    """PEFT name ("base_model.model.<...>.lora_A.weight") -> parameter."""
    out = {}
    for n, p in model.named_parameters():
        if "lora_" in n:
            out[n.replace(".default", "")] = p
    return out


def init_adapters(model, gen):
    """A: U(-1/sqrt(C), 1/sqrt(C)) (PEFT's Kaiming-uniform bound), B: 0.1 N, both
    drawn in fp32 so that the F32 file holds exactly what trains."""
    with torch.no_grad():
        for n, p in sorted(adapters(model).items()):
            if ".lora_A." in n:
                bound = 1.0 / math.sqrt(p.shape[1])
                v = (torch.rand(p.shape, generator=gen, dtype=torch.float32) * 2 - 1) * bound
            else:
                v = 0.1 * torch.randn(p.shape, generator=gen, dtype=torch.float32)
            p.copy_(v.double())


def batch_of(stream):
    n = stream.numel()
    idx = torch.arange(ROWS)[:, None] * T + torch.arange(T + 1)[None, :]
    rows = stream[idx % n]
    return rows[:, :T].contiguous(), rows[:, 1:].contiguous()


def trajectory(model, tokens, targets, clip):
    params = adapters(model)
    opt = torch.optim.AdamW(list(params.values()), lr=LR, betas=(BETA1, BETA2), eps=EPS,
                            weight_decay=WD)
    losses, norms, lrs = [], [], []
    for s in range(STEPS):
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for a in range(A):
            rows = slice(a * B, (a + 1) * B)
            logits = model(input_ids=tokens[rows]).logits
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                   targets[rows].reshape(-1))
            (loss / A).backward()
            total += loss.item() / A
        norm = torch.sqrt(sum((p.grad ** 2).sum() for p in params.values()))
        if clip > 0 and norm > clip:
            for p in params.values():
                p.grad.mul_(clip / (norm + 1e-6))
        lr = lr_at(s)
        for g in opt.param_groups:
            g["lr"] = lr
        opt.step()
        losses.append(total)
        norms.append(norm.item())
        lrs.append(lr)
    return losses, norms, lrs, {n: p.detach().clone() for n, p in params.items()}


def write_shard(path, stream):
    """llm.c token shard: 256 int32 header {20240520, 1, n}, then uint16 tokens."""
    header = [0] * 256
    header[0], header[1], header[2] = 20240520, 1, stream.numel()
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *header))
        f.write(stream.numpy().astype("<u2").tobytes())


def f32(t):
    return t.detach().to(torch.float32).contiguous()


def settings(clip):
    return torch.tensor([LR, MIN_LR, WARMUP, STEPS, BETA1, BETA2, EPS, WD, clip, A, B, T],
                        dtype=torch.float32)


def generate(outdir, name):
    base_name, targets, rslora, clip, seed = FIXTURES[name]
    d = os.path.join(outdir, name)
    init_dir = os.path.join(d, "adapter_init")
    os.makedirs(init_dir, exist_ok=True)
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    base = base_model(os.path.join(outdir, base_name))
    cfg = lora_config(targets, rslora, "tests/fixtures/" + base_name)
    model = get_peft_model(base, cfg)
    init_adapters(model, gen)
    # the initial adapter, as PeftModel.save_pretrained writes it (inference_mode
    # true, the base named as given) but in F32 (the model is float64)
    saved = model.peft_config["default"]
    saved.base_model_name_or_path = "tests/fixtures/" + base_name
    saved.inference_mode = True
    saved.target_modules = sorted(saved.target_modules)  # a set: its order varies by run
    saved.save_pretrained(init_dir)
    saved.inference_mode = False
    state = get_peft_model_state_dict(model)
    save_file({n: f32(p) for n, p in state.items()},
              os.path.join(init_dir, "adapter_model.safetensors"), metadata={"format": "pt"})
    V = base.config.vocab_size
    stream = torch.randint(0, V, (ROWS * T,), generator=gen)
    write_shard(os.path.join(d, "tokens.bin"), stream)
    tokens, targets_ = batch_of(stream)
    losses, norms, lrs, final = trajectory(model, tokens, targets_, clip)
    golden = {"stream": stream.to(torch.int32), "tokens": tokens.to(torch.int32),
              "targets": targets_.to(torch.int32), "settings": settings(clip),
              "step_lrs": torch.tensor(lrs, dtype=torch.float32),
              "step_losses": torch.tensor(losses, dtype=torch.float32),
              "step_grad_norms": torch.tensor(norms, dtype=torch.float32)}
    for n, p in final.items():
        golden["final/" + n] = f32(p)
    save_file(golden, os.path.join(d, "golden.safetensors"),
              metadata={"generator": "tools/gen_lora_golden.py seed %d" % seed})
    size = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(d) for f in fs)
    print("%s: %d adapters, losses %s, grad norms %s (clip %g: %d of %d steps), lrs %s, "
          "%d bytes" % (d, len(final), " ".join("%.5f" % x for x in losses),
                        " ".join("%.3g" % x for x in norms), clip,
                        sum(x > clip for x in norms), STEPS, " ".join("%.4g" % x for x in lrs),
                        size))


# ---- --check ----------------------------------------------------------------

def check(outdir, name):
    base_name, targets, rslora, clip, _ = FIXTURES[name]
    d = os.path.join(outdir, name)
    init_dir = os.path.join(d, "adapter_init")
    errors = []
    cfg = json.load(open(os.path.join(init_dir, "adapter_config.json")))
    want_cfg = {"peft_type": "LORA", "r": R, "lora_alpha": ALPHA, "use_rslora": rslora,
                "lora_dropout": 0.0, "bias": "none",
                "base_model_name_or_path": "tests/fixtures/" + base_name}
    for k, v in want_cfg.items():
        if cfg.get(k) != v:
            errors.append("adapter_config.json: %s is %r, expected %r" % (k, cfg.get(k), v))
    if targets != "all-linear" and sorted(cfg.get("target_modules") or []) != sorted(targets):
        errors.append("target_modules %s, expected %s" % (cfg.get("target_modules"), targets))
    base = base_model(os.path.join(outdir, base_name))
    linear = {n.rsplit(".", 1)[-1] for n, mod in base.named_modules()
              if isinstance(mod, torch.nn.Linear) and not n.endswith("lm_head")}
    model = PeftModel.from_pretrained(base, init_dir, is_trainable=True).double()
    stored = read_st(os.path.join(init_dir, "adapter_model.safetensors"))
    params = adapters(model)
    if set(stored) != set(params):
        errors.append("adapter_model.safetensors names differ from the loaded model's: %s" %
                      sorted(set(stored) ^ set(params)))
    for n, p in params.items():
        if n in stored and (stored[n].dtype != torch.float32 or
                            not torch.equal(p.detach().float(), stored[n])):
            errors.append("%s: from_pretrained did not load the stored F32 values" % n)
        if ".lora_B." in n and not p.detach().abs().sum() > 0:
            errors.append("%s is zero: the reference needs a non-zero B" % n)
    adapted = {n.split(".")[-3] for n in params}
    want_adapted = linear if targets == "all-linear" else set(targets)
    if adapted != want_adapted:
        errors.append("adapted modules %s, expected %s" % (sorted(adapted), sorted(want_adapted)))
    scaling = model.base_model.model.model.layers[0].self_attn.q_proj.scaling["default"]
    want_scale = ALPHA / math.sqrt(R) if rslora else ALPHA / R
    if abs(scaling - want_scale) > 1e-12:
        errors.append("PEFT scales by %g, expected %g" % (scaling, want_scale))
    g = read_st(os.path.join(d, "golden.safetensors"))
    raw = open(os.path.join(d, "tokens.bin"), "rb").read()
    header = struct.unpack("<256i", raw[:1024])
    shard = torch.tensor(np.frombuffer(raw[1024:], dtype="<u2").astype(np.int64))
    if header[:3] != (20240520, 1, ROWS * T) or not torch.equal(shard, g["stream"].long()):
        errors.append("tokens.bin does not hold the golden stream")
    tokens, targets_ = batch_of(g["stream"].long())
    if not torch.equal(tokens, g["tokens"].long()) or not torch.equal(targets_,
                                                                       g["targets"].long()):
        errors.append("tokens/targets are not the stream's rows")
    close("settings", g["settings"], settings(clip), 1e-7, errors)
    losses, norms, lrs, final = trajectory(model, tokens, targets_, clip)
    close("step_lrs", torch.tensor(lrs), g["step_lrs"], 1e-7, errors)
    close("step_losses", torch.tensor(losses), g["step_losses"], 1e-6, errors)
    close("step_grad_norms", torch.tensor(norms), g["step_grad_norms"], 1e-6, errors)
    if not any(x > clip for x in norms) or all(x > clip for x in norms):
        errors.append("clipping should bind in some steps and not in others: %s" % norms)
    if not losses[-1] < losses[0]:
        errors.append("the trajectory does not learn: %s" % losses)
    for n, p in final.items():
        if "final/" + n not in g:
            errors.append("golden lacks final/%s" % n)
            continue
        close("final/" + n, p, g["final/" + n], 1e-6, errors)
        if torch.equal(f32(p), stored[n]):
            errors.append("%s did not move" % n)
    for e in errors:
        print("%s: %s" % (d, e))
    print("%s: %s" % (d, "ok" if not errors else "%d problems" % len(errors)))
    return not errors


def main():
    args = sys.argv[1:]
    do_check = "--check" in args
    args = [a for a in args if a != "--check"]
    outdir = args[0] if args else os.path.join(repo_root(), "tests", "fixtures")
    torch.use_deterministic_algorithms(True)
    warnings.filterwarnings("ignore", module="peft")  # the base renamed to its path: on purpose
    ok = True
    for name in FIXTURES:
        if do_check:
            ok = check(outdir, name) and ok
        else:
            generate(outdir, name)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
