#!/usr/bin/env python3
"""bench_adam_torch.py - PyTorch's CPU AdamW timed the way tools/bench_adam
times fsdp's, so the C tool can print both in one table.

Runs torch.optim.AdamW on one fp32 parameter of --params elements with
--threads intra-op threads, for each implementation the installed torch
offers on CPU (foreach=True, foreach=False, fused=True), and prints one
machine-readable line per variant on stdout:

    RESULT <variant> <median seconds per step> <best seconds per step>
    UNSUPPORTED <variant> <reason>
    UNAVAILABLE <reason>            (torch cannot be imported)

bench_adam runs this with several interpreters in turn and uses the first
that can import torch.
"""
import argparse
import statistics
import sys
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--params", type=int, default=100_000_000)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--iters", type=int, default=10)
    args = ap.parse_args()
    try:
        import torch
    except Exception as e:  # ImportError, or a broken install
        print(f"UNAVAILABLE cannot import torch with {sys.executable}: {e}", flush=True)
        return 0
    torch.set_num_threads(args.threads)
    print(f"INFO torch {torch.__version__} {sys.executable} threads={torch.get_num_threads()}",
          flush=True)

    variants = [("foreach=True", {"foreach": True}),
                ("foreach=False", {"foreach": False}),
                ("fused=True", {"fused": True})]
    n = args.params
    for name, kw in variants:
        gen = torch.Generator().manual_seed(0)
        # Same value ranges as bench_adam: p ~ 0.05, g ~ 0.01, state after a few steps.
        p = torch.nn.Parameter((torch.rand(n, generator=gen) - 0.5) * 0.1)
        p.grad = (torch.rand(n, generator=gen) - 0.5) * 0.02
        try:
            opt = torch.optim.AdamW([p], lr=1e-3, betas=(0.9, 0.999), eps=1e-8,
                                    weight_decay=0.1, **kw)
            opt.step()  # warm-up: creates exp_avg / exp_avg_sq, touches every page
        except Exception as e:  # TypeError (no such flag) or RuntimeError (not on CPU)
            msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            print(f"UNSUPPORTED {name} torch {torch.__version__}: {msg}", flush=True)
            del p
            continue
        times = []
        for _ in range(args.iters):
            t0 = time.perf_counter()
            opt.step()
            times.append(time.perf_counter() - t0)
        print(f"RESULT {name} {statistics.median(times):.6f} {min(times):.6f}", flush=True)
        del opt, p
    return 0


if __name__ == "__main__":
    sys.exit(main())
