#!/usr/bin/env python3
"""Write the seed corpora of the libFuzzer targets (tests/fuzz/fuzz_*.c):
small valid inputs for each reader, so fuzzing starts from the formats'
real structure (the chat templates come from the chat template fixture). Standard library only. Run from the repository root:

    python3 tools/gen_fuzz_corpus.py [path/to/fsdp]

The manifest seeds are a version-1 manifest (tests/fixtures/ckpt_v1_tiny)
and a current one, named by its version (tiny_manifest_v2 stays from when
version 2 was current); the current manifest and the version-2 shard-file seeds
come from a real checkpoint written by the fsdp binary (default build/fsdp,
`fsdp convert` of a tiny model); without the binary those seeds are
skipped. The version-1 shard file (a format fsdp only reads now) is
written here.
"""
import json
import os
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_safetensors_fixture as fx  # noqa: E402

ROOT = "tests/fuzz/corpus"


def put(target, name, data):
    d = os.path.join(ROOT, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def token_shard(tokens):
    header = [0] * 256
    header[:3] = [20240520, 1, len(tokens)]
    return struct.pack("<256i", *header) + struct.pack("<%dH" % len(tokens), *tokens)


def token_shard32(tokens):
    """llm.c's uint32 layout (its Llama 3 shards): magic 20240801, version 7."""
    header = [0] * 256
    header[:3] = [20240801, 7, len(tokens)]
    return struct.pack("<256i", *header) + struct.pack("<%dI" % len(tokens), *tokens)


def tokenizer(version, tokens, eot=None):
    header = [0] * 256
    header[:3] = [20240328, version, len(tokens)]
    if version == 2:
        header[3] = eot
    out = struct.pack("<256I", *header)
    for t in tokens:
        out += bytes([len(t)]) + t
    return out


def shard_v1(units, n_arrays=3):
    """A version-1 checkpoint shard file: 64-byte header, unit table, FNV-style
    block sums over 8-byte words, payload at a multiple of 64 (src/ckpt/shard_file.h)."""
    block, mask = 65536, (1 << 64) - 1

    def fnv(b):
        h = 1469598103934665603
        for i in range(0, len(b), 8):
            w = int.from_bytes(b[i:i + 8].ljust(8, b"\0"), "little")
            h = ((h ^ w) * 1099511628211) & mask
        return h

    payload, sums = [], []
    for u, n in enumerate(units):
        for a in range(n_arrays):
            arr = struct.pack("<%df" % n, *[((u + 1) * (a + 2) * (i + 1) % 97) / 97.0
                                             for i in range(n)])
            payload.append(arr)
            sums += [fnv(arr[o:o + 4 * block]) for o in range(0, len(arr), 4 * block)]
    table = struct.pack("<" + "QQ" * len(units), *[x for n in units for x in (n, 0)])
    # version, header bytes, rank, world, units, block numel; run id, step, t
    head = b"FSDPCKPT" + struct.pack("<6I3Q", 1, 64, 0, 1, len(units), block, 0x1234, 3, 3)
    tables = head + struct.pack("<Q", 0) + table + struct.pack("<%dQ" % len(sums), *sums)
    tables = tables[:56] + struct.pack("<Q", fnv(tables)) + tables[64:]
    pad = b"\0" * ((-len(tables)) % 64)
    return tables + pad + b"".join(payload)


def metrics_line(step, loss, peaks):
    n = len(peaks)
    return ('{"step":%d,"loss":%.9g,"lr":0.0003,"grad_norm":1.5,"tokens":896,'
            '"tokens_per_s":3098.51,"step_ms":289.171,"mfu":null,"peak_bytes":[%s],'
            '"comm_bytes":[%s],"host_bytes":[%s]}\n'
            % (step, loss, ",".join(str(p) for p in peaks), ",".join(["3883008"] * n),
               ",".join(["896"] * n)))


def main():
    fsdp = sys.argv[1] if len(sys.argv) > 1 else "build/fsdp"
    # token shards
    put("fuzz_tokens", "shard_16", token_shard([(i * 37) % 50257 for i in range(16)]))
    put("fuzz_tokens", "shard_1", token_shard([7]))
    put("fuzz_tokens", "shard_empty", token_shard([]))
    put("fuzz_tokens", "shard32_16", token_shard32([(i * 7919) % 128256 for i in range(16)]))
    # tokenizer.json: the three fixture tokenizers (tools/gen_tokenizer_fixture.py)
    for fam in ("gpt2", "llama3", "qwen2"):
        with open("tests/fixtures/tok_%s.json" % fam, "rb") as f:
            put("fuzz_tokenizer_json", "tok_%s.json" % fam, f.read())
    # .jsonl rows of every kind, for the Llama 3 fixture tokenizer
    put("fuzz_jsonl", "text.jsonl", b'{"text": "Hello world"}\n{"text": "second \\u00e9"}\n')
    put("fuzz_jsonl", "prompt.jsonl",
        b'{"prompt": "Q: 2+2?", "completion": " 4"}\n\n{"prompt": "", "completion": "x"}\n')
    put("fuzz_jsonl", "chat.jsonl",
        b'{"messages": [{"role": "system", "content": "Be brief."}, '
        b'{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]}\n')
    # chat templates: the published ones and the short ones of the chat template fixture
    # (tools/gen_chat_template_fixture.py)
    with open("tests/fixtures/chat_templates.json", encoding="utf-8") as f:
        chat = json.load(f)
    for t in chat["templates"]:
        put("fuzz_jinja", t["name"] + ".jinja", t["template"].encode("utf-8"))
    for i, t in enumerate(chat["snippets"]):
        put("fuzz_jinja", "snippet_%02d.jinja" % i, t["template"].encode("utf-8"))
    # llm.c model files and safetensors: a 1-layer, 4-channel GPT-2
    cfg = (1, 1, 4, 8, 4)
    ps = fx.params(cfg)
    with tempfile.TemporaryDirectory() as tmp:
        for name, writer in (("model.bin", lambda p: fx.write_llmc(p, ps, cfg)),
                             ("model.safetensors", lambda p: fx.write_safetensors(p, ps, cfg)),
                             ("model_bf16.safetensors",
                              lambda p: fx.write_safetensors(p, ps, cfg, "BF16"))):
            writer(os.path.join(tmp, name))
        with open(os.path.join(tmp, "model.bin"), "rb") as f:
            raw = f.read()
        put("fuzz_llmc", "tiny_f32.bin", raw)
        # the bf16 llm.c file (version 5): the same values, truncated to bf16
        body = raw[1024:]
        b16 = b"".join(body[i + 2:i + 4] for i in range(0, len(body), 4))
        put("fuzz_llmc", "tiny_bf16.bin", raw[:4] + struct.pack("<i", 5) + raw[8:1024] + b16)
        for name in ("model.safetensors", "model_bf16.safetensors"):
            with open(os.path.join(tmp, name), "rb") as f:
                put("fuzz_safetensors", name, f.read())
        # manifests: version 1 from the fixture, the current version from a real checkpoint
        with open("tests/fixtures/ckpt_v1_tiny/step_00000002/manifest", "rb") as f:
            put("fuzz_manifest", "tiny_manifest_v1", f.read())
        if os.access(fsdp, os.X_OK):
            ck = os.path.join(tmp, "ck")
            subprocess.run([fsdp, "convert", "--quiet", "--to", "ckpt",
                            os.path.join(tmp, "model.bin"), ck], check=True)
            with open(os.path.join(ck, "step_00000000", "manifest"), "rb") as f:
                text = f.read()
            version = int(text.split(b"\nversion ", 1)[1].split(b"\n", 1)[0])
            put("fuzz_manifest", "tiny_manifest_v%d" % version, text)
            with open(os.path.join(ck, "step_00000000", "rank_00000.bin"), "rb") as f:
                put("fuzz_shard_file", "tiny_v2.bin", f.read())
        else:
            print("gen_fuzz_corpus: %s not found; the current manifest and shard seeds are "
                  "skipped" % fsdp)
    put("fuzz_shard_file", "small_v1.bin", shard_v1([1024, 1024]))
    # Hugging Face directories' JSON: byte 0 even = an index, odd = a config.json
    with open("tests/fixtures/hf_gpt2/config.json", "rb") as f:
        put("fuzz_hfdir", "config_gpt2.json", b"\x01" + f.read())
    for fam in ("llama_gqa", "llama_qwen2"):
        with open("tests/fixtures/%s/config.json" % fam, "rb") as f:
            put("fuzz_hfdir", "config_%s.json" % fam, b"\x01" + f.read())
    names = ["transformer.wte.weight", "transformer.wpe.weight", "transformer.h.0.ln_1.weight",
             "transformer.ln_f.bias"]
    index = {"metadata": {"total_parameters": 100, "total_size": 400},
             "weight_map": {n: "model-%05d-of-00002.safetensors" % (1 + i % 2)
                            for i, n in enumerate(names)}}
    put("fuzz_hfdir", "index.json", b"\x00" + json.dumps(index, indent=2).encode())
    # tokenizer files: version 2 (with end-of-text) and version 1
    toks = [bytes([i]) for i in range(256)] + [b"ab", b"abc", b" the", b"<|endoftext|>"]
    put("fuzz_tokenizer", "tok_v2.bin", tokenizer(2, toks, len(toks) - 1))
    put("fuzz_tokenizer", "tok_v1.bin", tokenizer(1, toks[:258]))
    # metrics files as fsdp train --log writes them (2 devices), with nulls
    # for non-finite values, and one whose last line was cut
    lines = [metrics_line(s, 5.5 - s * 0.5, [10107700 + s, 10107700]) for s in range(1, 4)]
    put("fuzz_metrics", "run.jsonl", "".join(lines).encode())
    put("fuzz_metrics", "nulls.jsonl",
        (lines[0] + '{"step":2,"loss":null,"tokens_per_s":null,"peak_bytes":[null,7]}\n'
         '\n{"step":3,"loss":1e999,"peak_bytes":[]}\r\n').encode())
    put("fuzz_metrics", "cut.jsonl", ("".join(lines) + lines[0][:40]).encode())
    print("wrote seed corpora under %s" % ROOT)


if __name__ == "__main__":
    main()
