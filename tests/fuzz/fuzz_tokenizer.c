/*
 * fuzz_tokenizer.c - libFuzzer target for llm.c tokenizer files
 * (fsdp_tokenizer_parse), then decoding every id and encoding a few bytes
 * of the input as text.
 */
#include "data/tokenizer.h"
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fsdp_tokenizer *t = NULL;
    if (fsdp_tokenizer_parse(&t, "fuzz_tokenizer.bin", data, size) != FSDP_STATUS_OK)
        return 0;
    size_t len, total = 0;
    for (int i = -1; i <= fsdp_tokenizer_vocab(t); i++) {
        const uint8_t *b = fsdp_tokenizer_decode(t, i, &len);
        if ((b != NULL) != (i >= 0 && i < fsdp_tokenizer_vocab(t)) || (b && len == 0))
            abort();
        total += b ? len : 0;
    }
    char text[64];
    size_t n = size < 63 ? size : 63;
    memcpy(text, data + size - n, n);
    text[n] = '\0';
    int *ids = NULL, k = 0;
    if (fsdp_tokenizer_encode(t, text, &ids, &k) == FSDP_STATUS_OK) {
        size_t at = 0;
        for (int i = 0; i < k; i++) { /* decoding the ids gives the text back */
            const uint8_t *b = fsdp_tokenizer_decode(t, ids[i], &len);
            if (!b || at + len > strlen(text) || memcmp(text + at, b, len))
                abort();
            at += len;
        }
        if (at != strlen(text))
            abort();
        free(ids);
    }
    (void)total;
    fsdp_tokenizer_free(t);
    return 0;
}
