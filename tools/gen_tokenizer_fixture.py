#!/usr/bin/env python3
"""Write the tokenizer fixtures of tests/test_tokenizer.c: three small
byte-level BPE tokenizers in Hugging Face's tokenizer.json format, one per
family fsdp reads, and the ids the reference implementation (the
`tokenizers` package, PyPI) gives for a corpus of awkward text.

  tests/fixtures/tok_gpt2.json    GPT-2 layout: ByteLevel pre-tokenizer with
      its built-in regex, <|endoftext|> as the last vocab entry and an added
      token, merges in the legacy "a b" string form.
  tests/fixtures/tok_llama3.json  Llama 3 layout: Split(Llama 3 regex) then
      ByteLevel(use_regex false), ignore_merges, special tokens after the
      vocab (<|begin_of_text|> ... <|eot_id|>), a TemplateProcessing
      post-processor that adds <|begin_of_text|>, merges as [a, b] pairs,
      and a few vocab words that no merge reaches (only ignore_merges finds
      them, as in Llama 3's tiktoken-derived vocab).
  tests/fixtures/tok_qwen2.json   Qwen2 layout: NFC normalizer, Split(Qwen2
      regex: single digits) then ByteLevel, <|endoftext|> <|im_start|>
      <|im_end|> after the vocab.
  tests/fixtures/tok_expected.json  for each family and corpus text: the ids
      with special tokens matched in the text, the ids with them split as
      plain text (encode_special_tokens), and the bytes decode gives back;
      decode cases whose ids split UTF-8 sequences (raw bytes, checked here
      against the reference's lossy decode); chat conversations rendered
      with each family's chat format, with the ids and the per-token
      "trained" flags derived from the reference's offsets.

Each tokenizer is trained here (a few hundred merges on a generated
corpus), then its tokenizer.json is written by hand from the trained vocab
and merges so the layout matches the family's published files, and reloaded
with Tokenizer.from_str, which is the reference the expectations come from.
Run from the repository root:

    python3 tools/gen_tokenizer_fixture.py
"""
import json
import os
import random

from tokenizers import Regex, Tokenizer, decoders, models, normalizers
from tokenizers import pre_tokenizers, trainers

OUT = "tests/fixtures"

GPT2_PATTERN = (r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+"
                r"|\s+(?!\S)|\s+")
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                  r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

N_MERGES = 400

# ---- the byte-level alphabet (GPT-2's bytes_to_unicode) ----------------------


def byte_to_char():
    keep = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    table, n = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + n)
            n += 1
    return table


B2C = byte_to_char()
C2B = {c: b for b, c in B2C.items()}


def token_bytes(s):
    """Bytes of a token string, as the ByteLevel decoder maps it."""
    if all(c in C2B for c in s):
        return bytes(C2B[c] for c in s)
    return s.encode("utf-8")


# ---- text --------------------------------------------------------------------

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "It's a truth universally acknowledged, that a single man in possession of a good "
    "fortune, must be in want of a wife.",
    "I'm sure we'll see; they'd've known. You're right, we've done it.",
    "def train(model, data):\n    for step in range(1000):\n        loss = model(data)\n",
    "    return loss.item()  # the mean over tokens\n\n",
    "In 2024, 1,234,567 tokens cost $3.50 (about 0.0035 per 1000).",
    "我爱自然语言处理。机器学习很有趣。今天天气很好。",
    "日本語のテキストを処理します。東京は大きい都市です。",
    "한국어 텍스트도 있습니다. 서울은 큰 도시입니다.",
    "Emoji: 🦙🦙 😀😃😄 ❤️ 👍🏽 🚀 🎉🎉🎉",
    "Ünïcödé façade naïve coöperate Straße café résumé",
    "Привет, мир! Как дела? Всё хорошо.",
    "مرحبا بالعالم. كيف حالك؟",
    "नमस्ते दुनिया। किताब पढ़ो।",
    "<html><body><p>Hello, world!</p></body></html>",
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name;",
    "x = [1, 2, 3]; y = {'a': 1, 'b': 2}\n\n\n",
    "   indented text with\ttabs\tand  double  spaces   \n",
    # U+180E: \s in PCRE2 10.42, not White_Space (the reference's \s)
    "Mongolian\u180e! vowel\u180e!! separator\u180e!",
]


def training_corpus():
    rng = random.Random(12)
    lines = []
    for _ in range(3000):
        k = rng.randint(1, 3)
        lines.append(" ".join(rng.choice(SENTENCES) for _ in range(k)))
    for _ in range(400):
        lines.append(" ".join(str(rng.randint(0, 10 ** rng.randint(1, 8))) for _ in range(6)))
    return lines


def random_text(seed, n):
    """Characters drawn from many scripts, spaces, controls and marks."""
    rng = random.Random(seed)
    pools = [
        (0x20, 0x7e), (0x09, 0x0d), (0xa0, 0x17f), (0x300, 0x36f), (0x391, 0x3c9),
        (0x410, 0x44f), (0x5d0, 0x5ea), (0x621, 0x64a), (0x900, 0x97f), (0xe01, 0xe5b),
        (0x2000, 0x206f), (0x3000, 0x303f), (0x3041, 0x30ff), (0x4e00, 0x4fff),
        (0xac00, 0xacff), (0xff01, 0xff5e), (0x1f300, 0x1f64f), (0x1f900, 0x1f9ff),
    ]
    out = []
    for _ in range(n):
        lo, hi = rng.choice(pools)
        c = rng.randint(lo, hi)
        if 0xd800 <= c <= 0xdfff:
            continue
        out.append(chr(c))
    return "".join(out)


CORPUS = [
    "Hello world! How's it going? I'm fine, we'll see; they'd've said DON'T.",
    "IT'S WE'VE YOU'RE I'LL SHE'D I'M it's we'Ve",
    "I ❤️ 🦙s 👩‍👩‍👧‍👦 👍🏽 🇫🇷! 😀😃😄😁",
    "我爱自然语言处理。日本語のテキスト、한국어 텍스트",
    "e\u0301te\u0301 cafe\u0301 Cafe\u0301 n\u0303 a\u0308\u0304 \u0915\u093f\u0924\u093e\u092c",
    "1234567890 3.14159 1,000,000 ２０２４ ٣٤٥ 12ab34 x1y22z333 0000000",
    "\n\n  \t",
    "a  b   c    d\t\te",
    "line1\r\nline2\n\n\nline3   \n",
    "   leading and trailing   ",
    " ",
    "",
    "\u00a0nbsp\u3000ideographic\u2003em\u0085nel\u2028ls x\u180e! \u180e!!",
    "Hello<|endoftext|>world",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>",
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|><|endoftext|> <|endoftext|",
    "def f(x):\n    return x**2  # square\n\nif __name__ == '__main__':\n\tprint(f(3))\n",
    "!!!??? ... --- ((())) ''' \"\"\" @@##$$ ...\n\n",
    "a" * 300,
    "ab" * 200,
    "quokka zebra quokka's Zebra\nquokka",
    "Ünïcödé façade naïve coöperate Straße İstanbul ǅ ß ẞ",
    random_text(1, 200),
    random_text(2, 200),
    random_text(3, 400),
]

# Conversations for the chat formats (tests/test_tokenizer.c renders them
# with src/data/chat.c). Contents do not begin with a line break: there the
# chat renderer, which encodes a turn's header and its content separately
# (as torchtune does), and the reference, which encodes the whole rendered
# string, may split differently (chat.c says so).
CHATS = [
    [{"role": "user", "content": "What is 2+2?"},
     {"role": "assistant", "content": "4"}],
    [{"role": "system", "content": "You are terse."},
     {"role": "user", "content": "Name a llama: 🦙"},
     {"role": "assistant", "content": "Llama 3, of course. It's 我的."},
     {"role": "user", "content": "  And another?  "},
     {"role": "assistant", "content": "Qwen2\n\n  with spaces  "}],
]

# ---- the families --------------------------------------------------------------


def train(pre_tokenizer, normalizer):
    tok = Tokenizer(models.BPE())
    if normalizer is not None:
        tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizer
    trainer = trainers.BpeTrainer(vocab_size=256 + N_MERGES, min_frequency=2,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(training_corpus(), trainer)
    model = json.loads(tok.to_str())["model"]
    vocab = sorted(model["vocab"].items(), key=lambda kv: kv[1])
    merges = [m if isinstance(m, list) else m.split(" ") for m in model["merges"]]
    return [k for k, _ in vocab], merges


def added(i, content, special=True, normalized=False):
    return {"id": i, "content": content, "single_word": False, "lstrip": False,
            "rstrip": False, "normalized": normalized, "special": special}


def bpe_model(vocab, merges, ignore_merges, pair_merges):
    return {
        "type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
        "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
        "ignore_merges": ignore_merges,
        "vocab": {k: i for i, k in enumerate(vocab)},
        "merges": [list(m) for m in merges] if pair_merges else [" ".join(m) for m in merges],
    }


def byte_level(use_regex):
    return {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
            "use_regex": use_regex}


def split(pattern):
    return {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated",
            "invert": False}


def gpt2():
    vocab, merges = train(pre_tokenizers.ByteLevel(add_prefix_space=False), None)
    vocab.append("<|endoftext|>")
    return {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [added(len(vocab) - 1, "<|endoftext|>", normalized=True)],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                          "use_regex": True},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False,
                           "use_regex": True},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": bpe_model(vocab, merges, False, False),
    }


LLAMA3_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
                   "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]


def llama3():
    pre = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    vocab, merges = train(pre, None)
    # words no merge reaches: only ignore_merges finds them whole
    for w in ("Ġzebra", "quokka", "ĠZebra"):
        if w not in vocab:
            vocab.append(w)
    n = len(vocab)
    bos = n
    return {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [added(n + i, s) for i, s in enumerate(LLAMA3_SPECIALS)],
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [split(LLAMA3_PATTERN),
                                                                byte_level(False)]},
        "post_processor": {"type": "Sequence", "processors": [
            {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False,
             "use_regex": True},
            {"type": "TemplateProcessing",
             "single": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
                        {"Sequence": {"id": "A", "type_id": 0}}],
             "pair": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
                      {"Sequence": {"id": "A", "type_id": 0}},
                      {"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 1}},
                      {"Sequence": {"id": "B", "type_id": 1}}],
             "special_tokens": {"<|begin_of_text|>": {"id": "<|begin_of_text|>", "ids": [bos],
                                                      "tokens": ["<|begin_of_text|>"]}}}]},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": bpe_model(vocab, merges, True, True),
    }


QWEN2_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def qwen2():
    pre = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    vocab, merges = train(pre, normalizers.NFC())
    n = len(vocab)
    return {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [added(n + i, s) for i, s in enumerate(QWEN2_SPECIALS)],
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [split(QWEN2_PATTERN),
                                                                byte_level(False)]},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                           "use_regex": False},
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                    "use_regex": False},
        "model": bpe_model(vocab, merges, False, True),
    }


# The chat formats, as src/data/chat.c renders them: (begin, header, close, sep, trim).
CHAT_FORMATS = {
    "llama3": ("<|begin_of_text|>", "<|start_header_id|>{role}<|end_header_id|>\n\n",
               "<|eot_id|>", "", True),
    "chatml": ("", "<|im_start|>{role}\n", "<|im_end|>", "\n", False),
}


def render_chat(tok, fmt, messages):
    """ids and trained flags of a conversation: the whole rendered string is
    encoded once; a token is trained when it starts inside an assistant
    turn's content or its closing token."""
    begin, header, close, sep, trim = CHAT_FORMATS[fmt]
    text, spans = begin, []
    for m in messages:
        content = m["content"].strip() if trim else m["content"]
        text += header.format(role=m["role"])
        start = len(text)
        text += content + close
        if m["role"] == "assistant":
            spans.append((start, len(text)))
        text += sep
    enc = tok.encode(text, add_special_tokens=False)
    trained = [int(any(a <= s < b for a, b in spans)) for s, _ in enc.offsets]
    return enc.ids, trained


def expectations(name, spec):
    tok = Tokenizer.from_str(json.dumps(spec))
    cases = []
    for text in CORPUS:
        tok.encode_special_tokens = False
        ids = tok.encode(text, add_special_tokens=False).ids
        tok.encode_special_tokens = True
        plain = tok.encode(text, add_special_tokens=False).ids
        tok.encode_special_tokens = False
        decoded = tok.decode(ids, skip_special_tokens=False)
        vocab = {i: s for s, i in tok.get_vocab(with_added_tokens=True).items()}
        raw = b"".join(token_bytes(vocab[i]) for i in ids)
        assert raw.decode("utf-8", "replace") == decoded, (name, text)
        cases.append({"text": text, "ids": ids, "ids_split_special": plain,
                      "decoded_hex": raw.hex()})
    # ids that cut UTF-8 sequences: raw bytes come back, the reference shows U+FFFD
    vocab = tok.get_vocab(with_added_tokens=True)
    inv = {i: s for s, i in vocab.items()}

    def byte_id(b):
        return vocab[B2C[b]]

    decode_cases = []
    for seq in ([0xe6, 0x88], [0x88], [0xf0, 0x9f, 0xa6], [0xff, 0xfe], [0xc3],
                [ord("a"), 0xe6, 0x88, ord("b"), 0x91], [0xed, 0xa0, 0x80]):
        ids = [byte_id(b) for b in seq]
        raw = b"".join(token_bytes(inv[i]) for i in ids)
        assert raw == bytes(seq)
        assert raw.decode("utf-8", "replace") == tok.decode(ids), seq
        decode_cases.append({"ids": ids, "bytes_hex": raw.hex()})
    out = {"cases": cases, "decode": decode_cases}
    fmt = {"llama3": "llama3", "qwen2": "chatml"}.get(name)
    if fmt:
        out["chat_format"] = fmt
        out["chats"] = []
        for messages in CHATS:
            ids, trained = render_chat(tok, fmt, messages)
            out["chats"].append({"messages": messages, "ids": ids, "trained": trained})
    return out


def main():
    expected = {}
    for name, make in (("gpt2", gpt2), ("llama3", llama3), ("qwen2", qwen2)):
        spec = make()
        with open(os.path.join(OUT, "tok_%s.json" % name), "w", encoding="utf-8") as f:
            json.dump(spec, f, ensure_ascii=False, indent=1)
            f.write("\n")
        expected[name] = expectations(name, spec)
        print("tok_%s.json: %d vocab, %d merges, %d added" %
              (name, len(spec["model"]["vocab"]), len(spec["model"]["merges"]),
               len(spec["added_tokens"])))
    with open(os.path.join(OUT, "tok_expected.json"), "w", encoding="utf-8") as f:
        json.dump(expected, f, ensure_ascii=True, separators=(",", ":"))
        f.write("\n")
    print("tok_expected.json: %d texts per family" % len(CORPUS))


if __name__ == "__main__":
    main()
