#!/usr/bin/env python3
"""Write tests/fixtures/utf8_lossy.txt for test_core's utf8 case: byte strings
and what Python's bytes.decode("utf-8", "replace") makes of them, re-encoded.
That is the lossy decode of the `tokenizers` decoders (gen_tokenizer_fixture.py
asserts it agrees with Tokenizer.decode), which `fsdp sample` must print for
ids whose bytes split or break characters (src/core/utf8.h).

One line per case: the input's hex, a space, the expected output's hex ("-"
for an empty string). The cases: the Unicode standard's example of maximal
subparts (chapter 3, table 3-8), every lead byte alone and with each kind of
continuation, then seeded random strings over the boundary bytes and valid
text with bytes deleted, replaced or inserted.

    python3 tools/gen_utf8_fixture.py   # rewrites the fixture
"""
import os
import random

BOUNDARY = [0x00, 0x41, 0x7F, 0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF, 0xC0, 0xC1, 0xC2, 0xDF,
            0xE0, 0xE1, 0xEC, 0xED, 0xEE, 0xEF, 0xF0, 0xF1, 0xF3, 0xF4, 0xF5, 0xFF]


def cases():
    yield bytes([0x61, 0xF1, 0x80, 0x80, 0xE1, 0x80, 0xC2, 0x62, 0x80, 0x63, 0x80, 0xBF, 0x64])
    for lead in BOUNDARY:
        yield bytes([lead])
        for cont in (0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF, 0x41):
            yield bytes([lead, cont])
            yield bytes([lead, cont, 0x80])
            yield bytes([lead, cont, 0x80, 0x80])
    rng = random.Random(2026)
    for _ in range(160):
        n = rng.randint(0, 40)
        if rng.random() < 0.5:
            yield bytes(rng.choice(BOUNDARY) for _ in range(n))
            continue
        ranges = [(0x20, 0x7E), (0x80, 0x7FF), (0x800, 0xD7FF), (0xE000, 0xFFFF),
                  (0x10000, 0x10FFFF)]
        text = "".join(chr(rng.randint(*rng.choice(ranges))) for _ in range(n))
        b = bytearray(text.encode())
        for _ in range(rng.randint(0, 3)):
            if not b:
                break
            i, op = rng.randrange(len(b)), rng.random()
            if op < 0.4:
                del b[i]
            elif op < 0.7:
                b[i] = rng.choice(BOUNDARY)
            else:
                b.insert(i, rng.choice(BOUNDARY))
        yield bytes(b)


def main():
    path = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "utf8_lossy.txt")
    with open(path, "w") as f:
        for b in cases():
            want = b.decode("utf-8", "replace").encode()
            f.write("%s %s\n" % (b.hex() or "-", want.hex() or "-"))


if __name__ == "__main__":
    main()
