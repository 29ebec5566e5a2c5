#!/usr/bin/env python3
"""bench_fsdp2_torch.py - one training step, PyTorch FSDP2 against fsdp train.

Why: issue 14 compares the cpu backend with what a PyTorch user would run
for the same job: FSDP2 (fully_shard on every block and the root, gloo,
one process per rank, torch.set_num_threads(threads) in each) and
`fsdp train` on as many simulated devices with --threads-per-device
threads. Same GPT-2 shape (tools/bench_model_torch.py's model, tied head
over the padded vocabulary), same per-rank batch and sequence, same step:
forward, backward, gradient-norm clipping at 1.0, AdamW (betas 0.9/0.95,
eps 1e-8, weight decay 0.1 on the matrices). Both read random GPT-2 tokens
(an llm.c token shard written to a temporary directory, so fsdp reads the
same kind of data a user gives it).

Prints the median step time of each after the first --warmup steps, tokens
per second over all ranks, and the ratio fsdp / PyTorch.

Usage: bench_fsdp2_torch.py [--ranks 2] [--threads 1] [--layers 4] [--heads 4]
       [--channels 256] [--vocab 50257] [--seq 128] [--batch 8] [--steps 12]
       [--warmup 2] [--fsdp build/fsdp] [--precision fp32|bf16] [--skip-torch]
       [--skip-fsdp]
--batch is per rank. Run from anywhere; --fsdp defaults to ../build/fsdp
next to this script.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_model_torch import GPT  # noqa: E402  (same model as bench_model)


def padded(v):
    return (v + 127) // 128 * 128


def write_tokens(path, n, vocab, seed):
    """An llm.c token shard: 256 int32 header (magic 20240520, version 1,
    count), then n uint16 tokens."""
    g = torch.Generator().manual_seed(seed)
    tok = torch.randint(0, vocab, (n,), generator=g, dtype=torch.int32).to(torch.int16)
    header = torch.zeros(256, dtype=torch.int32)
    header[0], header[1], header[2] = 20240520, 1, n
    with open(path, "wb") as f:
        f.write(header.numpy().tobytes())
        f.write(tok.numpy().tobytes())


def param_groups(model, wd):
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        linear = name.endswith(".weight") and p.dim() == 2 and not name.startswith("wpe")
        (decay if linear else no_decay).append(p)
    return [{"params": decay, "weight_decay": wd}, {"params": no_decay, "weight_decay": 0.0}]


def torch_rank(rank, a, port, out):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=a.ranks)
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    mesh = init_device_mesh("cpu", (a.ranks,))
    model = GPT(a.layers, a.heads, a.channels, a.vocab, padded(a.vocab), a.seq)
    mp_policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) \
        if a.precision == "bf16" else MixedPrecisionPolicy()
    for blk in model.h:
        fully_shard(blk, mesh=mesh, mp_policy=mp_policy)
    fully_shard(model, mesh=mesh, mp_policy=mp_policy)
    opt = torch.optim.AdamW(param_groups(model, 0.1), lr=1e-4, betas=(0.9, 0.95), eps=1e-8)
    g = torch.Generator().manual_seed(1 + rank)
    times = []
    for i in range(a.warmup + a.steps):
        idx = torch.randint(0, a.vocab, (a.batch, a.seq + 1), generator=g)
        dist.barrier()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = model(idx[:, :-1], idx[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        dist.barrier()
        if i >= a.warmup:
            times.append(time.perf_counter() - t0)
    if rank == 0:
        out.put((statistics.median(times), loss.detach().item()))
    dist.destroy_process_group()


def run_torch(a):
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = 29500 + os.getpid() % 1000
    procs = [ctx.Process(target=torch_rank, args=(r, a, port, q)) for r in range(a.ranks)]
    for p in procs:
        p.start()
    res = q.get()
    for p in procs:
        p.join()
        if p.exitcode:
            sys.exit("bench_fsdp2_torch: a PyTorch rank failed (exit %d)" % p.exitcode)
    return res


def run_fsdp(a, data):
    with tempfile.TemporaryDirectory() as d:
        log = os.path.join(d, "metrics.jsonl")
        model = "custom:layers=%d,heads=%d,channels=%d,vocab=%d,context=%d" % (
            a.layers, a.heads, a.channels, a.vocab, a.seq)
        cmd = [a.fsdp, "train", "--backend", "cpu", "--devices", str(a.ranks), "--model", model,
               "--data", data, "--batch", str(a.batch), "--seq", str(a.seq),
               "--steps", str(a.warmup + a.steps), "--precision", a.precision, "--log", log]
        # builds before --threads-per-device ran one thread per rank
        help_text = subprocess.run([a.fsdp, "train", "--help"], capture_output=True,
                                   text=True).stdout
        if "--threads-per-device" in help_text:
            cmd += ["--threads-per-device", str(a.threads)]
        elif a.threads != 1:
            sys.exit("bench_fsdp2_torch: %s has no --threads-per-device" % a.fsdp)
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit("bench_fsdp2_torch: %s failed:\n%s%s" % (" ".join(cmd), r.stdout, r.stderr))
        header = [ln for ln in r.stdout.splitlines()
                  if ln.startswith(("cpu:", "note:", "warning:"))]
        with open(log) as f:
            rows = [json.loads(ln) for ln in f if ln.strip()]
    ms = [row["step_ms"] for row in rows[a.warmup:]]
    return statistics.median(ms) / 1e3, rows[-1]["loss"], header


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--channels", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    ap.add_argument("--fsdp", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                   "..", "build", "fsdp"))
    ap.add_argument("--skip-torch", action="store_true")
    ap.add_argument("--skip-fsdp", action="store_true")
    a = ap.parse_args()
    if a.steps < 1 or a.warmup < 1:
        sys.exit("bench_fsdp2_torch: --steps and --warmup must be >= 1 (the first step is "
                 "never timed)")
    tokens = a.ranks * a.batch * a.seq
    print("one training step: GPT-2 L%d H%d C%d V%d, %d ranks x batch %d x seq %d = %d tokens, "
          "%d thread(s) per rank, %s; median of %d steps after %d" % (
              a.layers, a.heads, a.channels, a.vocab, a.ranks, a.batch, a.seq, tokens,
              a.threads, a.precision, a.steps, a.warmup))
    t_torch = t_fsdp = None
    if not a.skip_torch:
        t_torch, loss = run_torch(a)
        print("PyTorch %s FSDP2 (fully_shard, gloo, %d processes): %8.1f ms/step %9.0f tok/s "
              "(loss %.3f)" % (torch.__version__, a.ranks, 1e3 * t_torch, tokens / t_torch, loss))
    if not a.skip_fsdp:
        with tempfile.TemporaryDirectory() as d:
            data = os.path.join(d, "tokens.bin")
            write_tokens(data, max(1 << 20, 4 * tokens * (a.warmup + a.steps)), a.vocab, 7)
            t_fsdp, loss, header = run_fsdp(a, data)
        for ln in header:
            print("  " + ln)
        print("fsdp train --devices %d --threads-per-device %d:%s %8.1f ms/step %9.0f tok/s "
              "(loss %.3f)" % (a.ranks, a.threads, " " * 11, 1e3 * t_fsdp, tokens / t_fsdp,
                               loss))
    if t_torch and t_fsdp:
        print("fsdp / PyTorch FSDP2: %.2fx" % (t_torch / t_fsdp))


if __name__ == "__main__":
    main()
