#!/usr/bin/env python3
"""check_bnb4_convert.py - does transformers + bitsandbytes load what
`fsdp convert IN OUT --to hf --quantize nf4` wrote, and is it what they would
have made of IN themselves?

  tools/check_bnb4_convert.py IN OUT

IN: the float Hugging Face directory fsdp converted; OUT: fsdp's bnb-4bit
directory. Checks, printing each:
  1. AutoModelForCausalLM.from_pretrained(OUT, device_map="cpu") loads it
     (bitsandbytes' CPU 4-bit path), every block nn.Linear a Linear4bit;
  2. IN loaded by transformers with the same BitsAndBytesConfig (bitsandbytes
     quantizing on the CPU) holds, for every quantized weight, the same codes,
     absmax codes, nested absmax, offset, shape and dtype, and the same
     dequantize_4bit output, bit for bit; every other parameter is equal;
  3. both models give the same logits on a fixed batch of tokens;
  4. OUT loaded and written back by save_pretrained gives the same
     model.safetensors bytes (a transformers round trip changes nothing);
     skipped where transformers cannot save a model loaded pre-quantized.
Exits 1 on the first difference. Needs torch, transformers, bitsandbytes.
"""
import os
import sys
import tempfile

import torch
import bitsandbytes as bnb
import bitsandbytes.functional as F
from transformers import AutoModelForCausalLM, BitsAndBytesConfig


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def quantized(model):
    return {n: m for n, m in model.named_modules() if isinstance(m, bnb.nn.Linear4bit)}


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    src, out = sys.argv[1], sys.argv[2]
    import json
    qc = json.load(open(os.path.join(out, "config.json")))["quantization_config"]
    dtype = getattr(torch, qc["bnb_4bit_compute_dtype"])
    print("transformers %s, bitsandbytes %s, torch %s" % (
        __import__("transformers").__version__, bnb.__version__, torch.__version__))

    ours = AutoModelForCausalLM.from_pretrained(out, device_map="cpu")
    q = quantized(ours)
    if not q:
        fail("%s loaded with no Linear4bit layer" % out)
    print("1. loaded %s: %d Linear4bit layers (%s)" % (out, len(q), ", ".join(sorted(q)[:3]) +
                                                       ", ..."))

    cfg = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                             bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=dtype)
    ref = AutoModelForCausalLM.from_pretrained(src, quantization_config=cfg, dtype=dtype,
                                               device_map="cpu")
    rq = quantized(ref)
    if sorted(rq) != sorted(q):
        fail("quantized layers differ: %s vs %s" % (sorted(q), sorted(rq)))
    for name in sorted(q):
        a, b = q[name].weight, rq[name].weight
        sa, sb = a.quant_state, b.quant_state
        same = (torch.equal(a.data, b.data) and torch.equal(sa.absmax, sb.absmax) and
                torch.equal(sa.state2.absmax, sb.state2.absmax) and
                torch.equal(sa.offset, sb.offset) and sa.shape == sb.shape and
                sa.dtype == sb.dtype and torch.equal(sa.code, sb.code) and
                torch.equal(sa.state2.code, sb.state2.code))
        if not same:
            fail("%s: the stored quantization differs from bitsandbytes'" % name)
        da, db = F.dequantize_4bit(a.data, sa), F.dequantize_4bit(b.data, sb)
        if not torch.equal(da, db):
            fail("%s: dequantize_4bit differs" % name)
    n_other = 0
    rp = dict(ref.named_parameters())
    for name, p in ours.named_parameters():
        if isinstance(p, bnb.nn.Params4bit):
            continue
        if name not in rp or p.dtype != rp[name].dtype or not torch.equal(p, rp[name]):
            fail("%s differs from transformers' load of %s" % (name, src))
        n_other += 1
    print("2. %d quantized weights bit for bit as bitsandbytes quantizes %s (codes, absmax "
          "codes, nested absmax, offset, shape, dtype %s, dequantize_4bit); %d other "
          "parameters equal" % (len(q), src, sa.dtype, n_other))

    ids = torch.arange(16).reshape(2, 8) % ours.config.vocab_size
    with torch.no_grad():
        la, lb = ours(ids).logits, ref(ids).logits
    if not torch.equal(la, lb) or not torch.isfinite(la).all():
        fail("logits differ: max |diff| %g" % (la.float() - lb.float()).abs().max())
    print("3. logits on a (2, 8) batch equal (%s, max |logit| %.4f)" % (
        la.dtype, la.float().abs().max()))

    with tempfile.TemporaryDirectory() as tmp:
        try:
            ours.save_pretrained(tmp)
        except NotImplementedError:
            # transformers 5.24 cannot revert its load-time conversions of a model loaded
            # from a pre-quantized directory; the same happens with one it wrote itself
            print("4. skipped: save_pretrained of a model loaded from a bnb-4bit directory "
                  "raises NotImplementedError in transformers %s (so does loading one "
                  "transformers wrote)" % __import__("transformers").__version__)
            tmp = None
        names = sorted(f for f in os.listdir(out) if f.endswith(".safetensors"))
        for f in names if tmp else []:
            x = open(os.path.join(out, f), "rb").read()
            y = open(os.path.join(tmp, f), "rb").read() if os.path.exists(
                os.path.join(tmp, f)) else b""
            if x != y and len(names) == 1:
                fail("save_pretrained of the loaded %s rewrites %s (%d vs %d bytes)" % (
                    out, f, len(x), len(y)))
        if tmp and len(names) == 1:
            print("4. save_pretrained of the loaded model writes %s byte for byte (%d bytes)"
                  % (names[0], len(x)))
        elif tmp:
            print("4. skipped: %d files (save_pretrained shards by its own default size)" %
                  len(names))
    print("OK")


if __name__ == "__main__":
    main()
