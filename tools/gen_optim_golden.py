#!/usr/bin/env python3
"""gen_optim_golden.py - a PyTorch reference for training through the engine
with an optimizer other than AdamW (tests/test_optim_train.c).

Why: the engine's SGD (optimizer interface, sharded state, host offload,
checkpoints) is checked end to end against torch.optim.SGD on the same
model, weights and data: per-step losses, gradient norms and the final
parameters must match to a tight tolerance, so a mistake in the update
rule, in which parameters decay, in clipping or in the momentum buffer's
first step shows up as a mismatch.

The model is gen_golden.py's independent PyTorch GPT-2 (float64). What it
writes to OUTDIR (default tests/fixtures/sgd_golden/):
    init.bin    llm.c model file (fp32): the initial weights (torch's RNG)
    tokens.bin  llm.c token shard of exactly B*T tokens, so every
                micro-batch the engine reads is the same B rows: row r is
                tokens[r*T .. r*T+T), its targets the next tokens, wrapping
                at the end of the shard (src/data/data.c)
    final.bin   llm.c model file (fp32): the weights after STEPS updates
    golden.txt  `key value` lines: the config, the hyper-parameters, then
                `loss S X` and `grad_norm S X` (before clipping) per step

Training: every step the same batch; global-norm clipping as
torch.nn.utils.clip_grad_norm_ (scale max / (norm + 1e-6) when the norm is
larger); SGD(lr, momentum, dampening 0, nesterov False) with weight decay
on wte and the linear weights only (two parameter groups), at a constant
learning rate (the engine's schedule with warmup 0 and min fraction 1).

Usage: tools/gen_optim_golden.py [OUTDIR]
Needs PyTorch (Debian: python3-torch).
"""
import os
import struct
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_golden as gg  # noqa: E402

# n_layer, n_head, n_embd, vocab (not a multiple of 128: padding rows), context
L, NH, C, V, MAXT = 2, 2, 16, 200, 16
B, T = 4, 16
STEPS = 8
LR, MOMENTUM, WD, CLIP = 0.05, 0.9, 0.1, 0.75
SEED = 2024


def llmc_order(params):
    """The tensors in llm.c's file order (src/ckpt/llmc.c), wte padded to Vp rows."""
    vp = (V + 127) // 128 * 128
    wte = torch.zeros(vp, C, dtype=torch.float64)
    wte[:V] = params["wte.weight"].detach()
    out = [wte, params["wpe.weight"].detach()]
    for suffix in ("ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias",
                   "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight", "ln_2.bias",
                   "mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias"):
        out += [params["h.%d.%s" % (l, suffix)].detach() for l in range(L)]
    out += [params["ln_f.weight"].detach(), params["ln_f.bias"].detach()]
    return out


def write_llmc(path, params):
    header = [0] * 256
    header[:8] = [20240326, 3, MAXT, V, L, NH, C, (V + 127) // 128 * 128]
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *header))
        for t in llmc_order(params):
            f.write(t.reshape(-1).to(torch.float32).numpy().tobytes())


def write_tokens(path, tokens):
    header = [0] * 256
    header[:3] = [20240520, 1, len(tokens)]
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *header))
        f.write(struct.pack("<%dH" % len(tokens), *tokens))


def main():
    outdir = sys.argv[1] if len(sys.argv) > 1 else os.path.relpath(os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "sgd_golden"))
    os.makedirs(outdir, exist_ok=True)
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(SEED)
    params = gg.make_params(L, C, V, MAXT, gen)
    stream = torch.randint(0, V, (B * T,), generator=gen)
    tokens = stream.reshape(B, T)
    targets = torch.roll(stream, -1).reshape(B, T)  # the next token, wrapping

    write_llmc(os.path.join(outdir, "init.bin"), params)
    write_tokens(os.path.join(outdir, "tokens.bin"), stream.tolist())

    decay = [t for n, t in params.items() if gg.decays(n)]
    no_decay = [t for n, t in params.items() if not gg.decays(n)]
    opt = torch.optim.SGD([{"params": decay, "weight_decay": WD},
                           {"params": no_decay, "weight_decay": 0.0}],
                          lr=LR, momentum=MOMENTUM, dampening=0.0, nesterov=False)
    losses, norms = [], []
    for _ in range(STEPS):
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(gg.forward(params, tokens, L, NH).reshape(-1, V),
                               targets.reshape(-1))
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(list(params.values()), CLIP)
        losses.append(loss.item())
        norms.append(norm.item())
        opt.step()
    write_llmc(os.path.join(outdir, "final.bin"), params)

    with open(os.path.join(outdir, "golden.txt"), "w") as f:
        f.write("# written by tools/gen_optim_golden.py (torch %s, float64)\n" % torch.__version__)
        for k, v in (("model", "custom:layers=%d,heads=%d,channels=%d,vocab=%d,context=%d"
                      % (L, NH, C, V, MAXT)), ("batch", B), ("seq", T), ("steps", STEPS),
                     ("optimizer", "sgd"), ("lr", LR), ("momentum", MOMENTUM),
                     ("weight_decay", WD), ("clip", CLIP)):
            f.write("%s %s\n" % (k, v))
        for s in range(STEPS):
            f.write("loss %d %.17g\n" % (s + 1, losses[s]))
            f.write("grad_norm %d %.17g\n" % (s + 1, norms[s]))
    print("%s: SGD loss %.6f -> %.6f over %d steps, grad norm %.4f -> %.4f (clip %g)"
          % (outdir, losses[0], losses[-1], STEPS, norms[0], norms[-1], CLIP))


if __name__ == "__main__":
    main()
