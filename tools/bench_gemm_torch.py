#!/usr/bin/env python3
"""bench_gemm_torch.py - the base products of bench_model's LoRA step (the Llama bench
shape, fp32) in PyTorch, as the PyTorch + PEFT peer runs them (aten::mm: MKL on x86), on
--threads threads: for each linear layer its forward y = x w^T and its input gradient
dx = dy w (a frozen base computes no weight gradient), the LM head included, B*T = --tokens
rows.

Why: the peer goal of issue 26 (the LoRA step >= 1.3x PyTorch + PEFT) is a question of what
is left beside these products when both sides run them at the same rate. Each line: the
product, its best time over --iters runs (thread CPU time at one thread, else wall time),
GFLOP/s; the total weighs each by how often the step runs it (once per layer, the head once).
Compare with `build/tools/bench_gemm --only llama` (its NT and NN lines) and bench_model's
per-op figures (docs/figures.md).

  python3 tools/bench_gemm_torch.py [--threads N] [--tokens N] [--iters K]

Needs torch (pip).
"""
import argparse
import time

import torch

# The Llama bench shape (tools/bench_cases.h): 12 layers, hidden 768, 12 query heads and 4
# kv heads of 64, intermediate 2048, vocabulary 32000; transformers' modules, one product
# each (fsdp runs q|k|v and gate|up as one product each). (name, in, out, runs per step)
LAYERS = 12
PRODUCTS = [
    ("q", 768, 768, LAYERS),
    ("k", 768, 256, LAYERS),
    ("v", 768, 256, LAYERS),
    ("o", 768, 768, LAYERS),
    ("gate", 768, 2048, LAYERS),
    ("up", 768, 2048, LAYERS),
    ("down", 2048, 768, LAYERS),
    ("head", 768, 32000, 1),
]


def best_of(fn, iters, clock):
    fn()  # warm up: first-touch pages, MKL's buffers
    best = float("inf")
    for _ in range(iters):
        t0 = clock()
        fn()
        best = min(best, clock() - t0)
    return best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--tokens", type=int, default=512, help="rows: batch x seq (default 2 x 256)")
    ap.add_argument("--iters", type=int, default=10)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    clock = time.thread_time if a.threads == 1 else time.perf_counter
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, {a.threads} thread(s), {a.tokens} rows, best of "
          f"{a.iters}; {torch.backends.mkl.is_available() and 'MKL' or 'no MKL'}")
    print(f"{'product':>8} {'op':>3} {'M':>5} {'N':>6} {'K':>5} {'ms':>8} {'GFLOP/s':>8} {'n':>3}")
    total = {"NT": 0.0, "NN": 0.0}
    for name, cin, cout, n in PRODUCTS:
        x = torch.randn(a.tokens, cin)
        w = torch.randn(cout, cin)
        dy = torch.randn(a.tokens, cout)
        for op, fn, (m, nn, k) in (("NT", lambda: x @ w.t(), (a.tokens, cout, cin)),
                                   ("NN", lambda: dy @ w, (a.tokens, cin, cout))):
            s = best_of(fn, a.iters, clock)
            total[op] += n * s
            print(f"{name:>8} {op:>3} {m:>5} {nn:>6} {k:>5} {s * 1e3:8.2f} "
                  f"{2.0 * m * nn * k / s / 1e9:8.1f} {n:>3}")
    print(f"step: forward products {total['NT'] * 1e3:.0f} ms, input gradients "
          f"{total['NN'] * 1e3:.0f} ms, together {(total['NT'] + total['NN']) * 1e3:.0f} ms")


if __name__ == "__main__":
    main()
