/*
 * fuzz_jsonl.c - libFuzzer target for .jsonl training data (src/data:
 * fsdp_data_open_opts with the Llama 3 fixture tokenizer, rows of text,
 * prompt/completion or messages), then a few batches from whatever it
 * accepted: inputs must be tokens of the data's vocabulary, targets too or
 * -1 on example rows. Runs from the repository root (the tokenizer is
 * tests/fixtures/tok_llama3.json).
 */
#include "data/data.h"
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *path = fuzz_temp_file(data, size, ".jsonl");
    fsdp_data_opts o = {.spec = path, .seed = 3, .tokenizer = "tests/fixtures/tok_llama3.json"};
    fsdp_data *d = NULL;
    if (fsdp_data_open_opts(&d, &o) != FSDP_STATUS_OK)
        return 0;
    int in[2 * 8], tg[2 * 8], v = fsdp_data_vocab(d);
    bool masked = fsdp_data_masked(d);
    for (uint64_t m = 0; m < 4; m++)
        if (fsdp_data_batch(d, m * 1000003u, 2, 8, in, tg) == FSDP_STATUS_OK)
            for (int i = 0; i < 16; i++)
                if (in[i] < 0 || in[i] >= v || tg[i] < (masked ? -1 : 0) || tg[i] >= v)
                    abort(); /* a token outside the vocabulary the source reported */
    fsdp_data_close(d);
    return 0;
}
