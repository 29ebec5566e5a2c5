#!/usr/bin/env python3
"""check_hf_export.py - does a Hugging Face directory that fsdp wrote load in
transformers and compute what fsdp computes?

Why: `fsdp convert CKPT OUT_DIR` promises a directory that
AutoModelForCausalLM.from_pretrained loads. This script is that promise,
checked end to end by the reference itself: it loads the directory with
transformers (fp32), has fsdp decode greedily from the same prompt
(`fsdp sample --ids --logits`), and compares, position by position, the
tokens and the logits each was chosen from. Not part of `make test` (CI has
no torch); run it by hand, e.g. after changing a family's HF mapping.

Usage:
  tools/check_hf_export.py [--fsdp build/fsdp] [--tokens N] [--devices D]
                           [--from MODEL [--dtype fp32|bf16] [--shard-size S]] DIR
  DIR          an exported directory; with --from, fsdp first exports MODEL
               (any model file fsdp reads: checkpoint, .bin, .safetensors,
               Hugging Face directory) there with `fsdp convert --to hf`.
  --tol X      largest |logit difference| / largest |logit| accepted (1e-4)

Prints the largest absolute and relative logit difference and whether the
greedy tokens agree; exits 1 when they do not or the difference passes
--tol. Needs torch and transformers (pip).
"""
import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch
from transformers import AutoConfig, AutoModelForCausalLM


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit("check_hf_export: '%s' failed (%d):\n%s%s" % (" ".join(cmd), p.returncode,
                                                              p.stdout, p.stderr))
    return p.stdout


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dir")
    ap.add_argument("--fsdp", default="build/fsdp")
    ap.add_argument("--from", dest="src")
    ap.add_argument("--dtype", default="fp32")
    ap.add_argument("--shard-size")
    ap.add_argument("--tokens", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=12)
    ap.add_argument("--devices", type=int, default=1)
    ap.add_argument("--tol", type=float, default=1e-4)
    a = ap.parse_args()
    if a.src:
        cmd = [a.fsdp, "convert", a.src, a.dir, "--to", "hf", "--dtype", a.dtype]
        if a.shard_size:
            cmd += ["--shard-size", a.shard_size]
        print(run(cmd).strip())

    cfg = AutoConfig.from_pretrained(a.dir)
    model = AutoModelForCausalLM.from_pretrained(a.dir, dtype=torch.float32).eval()
    V = cfg.vocab_size
    rng = np.random.default_rng(0)
    prompt = [int(t) for t in rng.integers(0, V, a.prompt_len)]

    with tempfile.TemporaryDirectory() as tmp:
        lpath = os.path.join(tmp, "logits.f32")
        out = run([a.fsdp, "sample", "--model", a.dir, "--ids", "--prompt",
                   ",".join(map(str, prompt)), "--tokens", str(a.tokens), "--backend", "cpu",
                   "--devices", str(a.devices), "--logits", lpath])
        seq = [int(t) for t in out.split()]
        ours = np.fromfile(lpath, dtype=np.float32).reshape(-1, V)
    gen = seq[len(prompt):]
    assert seq[:len(prompt)] == prompt and len(gen) == ours.shape[0], (seq, prompt)

    with torch.no_grad():
        ref = model(torch.tensor([seq])).logits[0].double().numpy()
    ref = ref[len(prompt) - 1:len(prompt) - 1 + len(gen)]
    greedy = [int(r.argmax()) for r in ref]
    diff = np.abs(ours.astype(np.float64) - ref).max()
    rel = diff / np.abs(ref).max()
    same = greedy == gen
    print("%s: %s %s, %d parameters, vocab %d: %d greedy tokens %s; logits differ by at most "
          "%.3g (%.3g of the largest |logit| %.3g)"
          % (a.dir, cfg.model_type, type(model).__name__,
             sum(p.numel() for p in model.parameters()), V, len(gen),
             "agree" if same else "DISAGREE (fsdp %s, transformers %s)" % (gen, greedy),
             diff, rel, np.abs(ref).max()))
    sys.exit(0 if same and rel <= a.tol else 1)


if __name__ == "__main__":
    main()
