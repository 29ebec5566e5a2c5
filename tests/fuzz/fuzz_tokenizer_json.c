/*
 * fuzz_tokenizer_json.c - libFuzzer target for Hugging Face tokenizer.json
 * files (fsdp_hftok_parse), then encoding a fixed text and the input's own
 * first bytes with whatever it accepted, and decoding the ids again: every
 * id must be a token of the tokenizer.
 */
#include <stdlib.h>

#include "data/hftok.h"
#include "fuzz_common.h"

static void check(fsdp_hftok *t, const char *text, size_t len, unsigned flags)
{
    int *ids = NULL;
    size_t n = 0, out_len;
    if (fsdp_hftok_encode(t, text, len, flags, &ids, &n) != FSDP_STATUS_OK)
        return;
    for (size_t i = 0; i < n; i++) {
        size_t k;
        if (ids[i] < 0 || ids[i] >= fsdp_hftok_vocab(t) || !fsdp_hftok_token_bytes(t, ids[i], &k))
            abort(); /* the encoder made an id the tokenizer cannot decode */
    }
    char *dec = NULL;
    if (fsdp_hftok_decode(t, ids, n, &dec, &out_len) != FSDP_STATUS_OK)
        abort();
    free(dec);
    free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fsdp_hftok *t = NULL;
    if (fsdp_hftok_parse(&t, "fuzz_tokenizer.json", (const char *)data, size) != FSDP_STATUS_OK)
        return 0;
    static const char text[] = "Hello, world! It's 2024 \xe6\x88\x91 e\xcc\x81 \xf0\x9f\xa6\x99\n\n"
                               "  \t<|endoftext|><|im_start|>x\xff\xfe";
    check(t, text, sizeof text - 1, 0);
    check(t, text, sizeof text - 1, FSDP_HFTOK_SPLIT_SPECIAL);
    check(t, (const char *)data, size < 512 ? size : 512, 0);
    fsdp_hftok_free(t);
    return 0;
}
