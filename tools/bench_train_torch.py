#!/usr/bin/env python3
"""bench_train_torch.py - the PyTorch side of tools/bench_train.c.

Why: bench_train reports the C trainer's tokens/s on 1, 2, 4 and 8
simulated cpu devices; this script times the same training step in plain
PyTorch on the CPU (one process, no sharding) as the yardstick: the same
GPT-2 shape (the model class of bench_model_torch.py, tied head over the
padded vocabulary), the same global batch and sequence length, and the same
optimizer step as the engine: gradient-norm clipping, then AdamW
(betas 0.9/0.95, eps 1e-8) with weight decay on wte and the linear weights
only, at a constant learning rate.

Prints one line: "tokens_per_s X step_ms S loss L" (from the median of
--steps timed steps after --warmup untimed ones, as bench_train reads the C
trainer's steps; loss is the last step's, a sanity figure), or exits
non-zero with the reason on stderr.

Usage: bench_train_torch.py --layers L --heads H --channels C --vocab V
       --padded-vocab Vp --context T --batch B --seq T [--threads N]
       [--steps N] [--warmup N] [--lr X] [--wd X] [--clip X]
"""
import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_model_torch import GPT  # noqa: E402  (same model as bench_model)


def param_groups(model, wd):
    """AdamW groups as the C engine decays: wte and the (OC, C) linear
    weights; never wpe, biases or layernorm parameters."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        linear = name.endswith(".weight") and p.dim() == 2 and not name.startswith("wpe")
        (decay if linear else no_decay).append(p)
    return [{"params": decay, "weight_decay": wd}, {"params": no_decay, "weight_decay": 0.0}]


def main():
    ap = argparse.ArgumentParser()
    for k in ("layers", "heads", "channels", "vocab", "padded-vocab", "context", "batch", "seq"):
        ap.add_argument("--" + k, type=int, required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--wd", type=float, default=0.1)
    ap.add_argument("--clip", type=float, default=1.0)
    a = ap.parse_args()
    if a.steps < 1:
        sys.exit("bench_train_torch: --steps must be >= 1")
    if a.seq > a.context:
        sys.exit("bench_train_torch: --seq %d exceeds --context %d" % (a.seq, a.context))
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model = GPT(a.layers, a.heads, a.channels, a.vocab, a.padded_vocab, a.context)
    opt = torch.optim.AdamW(param_groups(model, a.wd), lr=a.lr, betas=(0.9, 0.95), eps=1e-8)
    gen = torch.Generator().manual_seed(1)
    times = []
    loss = None
    for i in range(a.warmup + a.steps):
        # fresh tokens each step, as the trainer reads a new batch (not timed)
        idx = torch.randint(0, a.vocab, (a.batch, a.seq + 1), generator=gen)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = model(idx[:, :-1], idx[:, 1:])
        loss.backward()
        if a.clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip)
        opt.step()
        t1 = time.perf_counter()
        if i >= a.warmup:
            times.append(t1 - t0)
    med = statistics.median(times)
    print("tokens_per_s %.1f step_ms %.3f loss %.4f" %
          (a.batch * a.seq / med, 1e3 * med, loss.item()))


if __name__ == "__main__":
    main()
