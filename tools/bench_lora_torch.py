#!/usr/bin/env python3
"""bench_lora_torch.py - the PyTorch + PEFT peer of `bench_model --lora R`: one LoRA
forward+backward of a Llama built by transformers (LlamaForCausalLM from a config with the
shape bench_model passes, fp32, its default attention), adapters of rank R on every linear
layer but the head (PEFT's target_modules="all-linear", lora_alpha 2R, no dropout), the base
frozen as PEFT freezes it, on --threads CPU threads.

Prints one line, `tokens_per_s X fwd_ms F bwd_ms B`, as tools/bench_model_torch.py does; with
--clock cpu the times are the stepping thread's CPU time (time.thread_time: at one thread every
op runs on it), not the wall clock (bench_model --cpu-time); with --stat best, the fastest
iteration instead of the mean (bench_model --best).
Needs torch, transformers and peft (pip).
"""
import argparse
import time

import torch


def main():
    ap = argparse.ArgumentParser()
    for k in ("layers", "heads", "kv-heads", "channels", "intermediate", "head-dim", "vocab",
              "padded-vocab", "context", "batch", "seq", "lora"):
        ap.add_argument("--" + k, type=int, required=True)
    ap.add_argument("--family", default="llama")
    ap.add_argument("--rope-theta", type=float, default=10000.0)
    ap.add_argument("--eps", type=float, default=1e-5)
    ap.add_argument("--tied", action="store_true")
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--stat", choices=("mean", "best"), default="mean",
                    help="best: the fastest iteration (bench_model --best)")
    ap.add_argument("--dtype", choices=("fp32",), default="fp32")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    a = ap.parse_args()
    now = time.thread_time if a.clock == "cpu" else time.perf_counter
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=a.padded_vocab, hidden_size=a.channels,
                      intermediate_size=a.intermediate, num_hidden_layers=a.layers,
                      num_attention_heads=a.heads, num_key_value_heads=a.kv_heads,
                      head_dim=a.head_dim, max_position_embeddings=a.context,
                      rope_theta=a.rope_theta, rms_norm_eps=a.eps,
                      tie_word_embeddings=a.tied)
    model = get_peft_model(LlamaForCausalLM(cfg),
                           LoraConfig(r=a.lora, lora_alpha=2 * a.lora, lora_dropout=0.0,
                                      target_modules="all-linear"))
    idx = torch.randint(0, a.vocab, (a.batch, a.seq))
    tgt = torch.randint(0, a.vocab, (a.batch, a.seq))
    fwd = bwd = 0.0
    times = []
    for i in range(a.warmup + a.iters):
        model.zero_grad(set_to_none=True)
        t0 = now()
        logits = model(input_ids=idx).logits
        loss = torch.nn.functional.cross_entropy(logits[..., : a.vocab].reshape(-1, a.vocab),
                                                 tgt.reshape(-1))
        t1 = now()
        loss.backward()
        t2 = now()
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
