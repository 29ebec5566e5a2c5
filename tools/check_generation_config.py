#!/usr/bin/env python3
"""check_generation_config.py - does transformers' generate stop where the
generation_config.json that `fsdp convert --to hf` writes says it should?

Why: a checkpoint carries its tokenizer (src/ckpt/ckpt_tok.h), and `fsdp
convert CK OUT --to hf` writes generation_config.json with the tokenizer's
BOS, padding and stop tokens: the chat format's end of turn (Llama 3
<|eot_id|>, ChatML <|im_end|>) and the end of text. Without it, transformers
generates past the end of an assistant's turn. This script checks that end
to end with the reference itself, for each test tokenizer (Llama 3, Qwen2):

  1. builds a tiny GPT-2 in transformers whose every next token is the
     chat format's end of turn (ln_f gives a fixed vector; that token's
     embedding row is the only one aligned with it), saved with the test
     tokenizer beside it and no generation config, or a base model's that
     stops at the end of text only (fsdp appends the end of turn);
  2. `fsdp convert DIR CK --to ckpt` (the checkpoint carries the tokenizer)
     and `fsdp convert CK OUT --to hf` (no --tokenizer);
  3. GenerationConfig.from_pretrained(OUT) must give the expected ids, and
     model.generate on OUT must stop after that one token, while the same
     model without the file runs to max_new_tokens.

Not part of `make test` (CI has no torch); run it by hand:
  tools/check_generation_config.py [--fsdp build/fsdp]
Exits 1 on the first mismatch. Needs torch, transformers, safetensors (pip).
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile

import torch
from transformers import GenerationConfig, GPT2Config, GPT2LMHeadModel

# tokenizer fixture, the chat format's end of turn, end of text, BOS (-1: none), and the
# model's own generation_config.json (None: none; a base model's stops at the end of text)
CASES = [
    ("tests/fixtures/tok_llama3.json", "<|eot_id|>", 664, 660, 659, None),
    ("tests/fixtures/tok_qwen2.json", "<|im_end|>", 658, 656, -1, None),
    ("tests/fixtures/tok_llama3.json", "<|eot_id|>", 664, 660, 659,
     {"bos_token_id": 659, "eos_token_id": 660, "do_sample": True, "temperature": 0.6}),
]
VOCAB = 665


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit("check_generation_config: '%s' failed (%d):\n%s%s"
                 % (" ".join(cmd), p.returncode, p.stdout, p.stderr))
    return p.stdout


def stop_model(stop_id):
    """A 1-layer GPT-2 whose logits always favour stop_id."""
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=VOCAB, n_positions=64, n_embd=32, n_layer=1, n_head=2,
                     bos_token_id=None, eos_token_id=None)
    m = GPT2LMHeadModel(cfg).eval()
    sign = torch.tensor([1.0 if c % 2 else -1.0 for c in range(32)])
    with torch.no_grad():
        m.transformer.ln_f.weight.zero_()  # h = ln_f.bias whatever the input
        m.transformer.ln_f.bias.copy_(sign)
        m.transformer.wte.weight.mul_(0.01)
        m.transformer.wte.weight[stop_id].copy_(2.0 * sign)
    return m


def check(fsdp, tok, turn_name, turn, eot, bos, own, work):
    src, ck, out = (os.path.join(work, n) for n in ("src", "ck", "out"))
    m = stop_model(turn)
    m.save_pretrained(src, safe_serialization=True)
    gen = os.path.join(src, "generation_config.json")
    if os.path.exists(gen):
        os.remove(gen)
    if own is not None:
        GenerationConfig(**own).save_pretrained(src)
    shutil.copy(tok, os.path.join(src, "tokenizer.json"))
    run([fsdp, "convert", src, ck, "--to", "ckpt", "--quiet"])
    run([fsdp, "convert", ck, out, "--to", "hf"])
    g = GenerationConfig.from_pretrained(out)
    want_eos, want_pad = ([turn, eot], eot) if own is None else ([eot, turn], None)
    if list(g.eos_token_id) != want_eos or g.pad_token_id != want_pad or \
            (g.bos_token_id if g.bos_token_id is not None else -1) != bos or \
            (own is not None and g.temperature != own["temperature"]):
        sys.exit("%s: generation_config bos %r eos %r pad %r; expected bos %d eos %r pad %r"
                 % (tok, g.bos_token_id, g.eos_token_id, g.pad_token_id, bos, want_eos,
                    want_pad))
    model = GPT2LMHeadModel.from_pretrained(out).eval()
    prompt = torch.tensor([[5, 17, 23]])
    with torch.no_grad():
        ids = model.generate(prompt, max_new_tokens=8, do_sample=False)[0, 3:].tolist()
        os.remove(os.path.join(out, "generation_config.json"))
        bare = GPT2LMHeadModel.from_pretrained(out).eval()
        ids_bare = bare.generate(prompt, max_new_tokens=8, do_sample=False,
                                 eos_token_id=None, pad_token_id=0)[0, 3:].tolist()
    if ids != [turn]:
        sys.exit("%s: generate gave %r, expected to stop after %s (%d)"
                 % (tok, ids, turn_name, turn))
    if len(ids_bare) != 8:
        sys.exit("%s: without generation_config.json generate stopped early: %r" % (tok, ids_bare))
    print("%s%s: generation_config.json eos %r pad %r bos %s; generate stops after %s "
          "(8 tokens without the file)" % (os.path.basename(tok),
                                           " (own config: end of text only)" if own else "",
                                           want_eos, want_pad, bos if bos >= 0 else "none",
                                           turn_name))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fsdp", default="build/fsdp")
    a = ap.parse_args()
    for tok, turn_name, turn, eot, bos, own in CASES:
        with tempfile.TemporaryDirectory() as work:
            check(a.fsdp, tok, turn_name, turn, eot, bos, own, work)
    print("ok")


if __name__ == "__main__":
    main()
