/*
 * fuzz_tokens.c - libFuzzer target for the llm.c token shard reader
 * (src/data: fsdp_data_open on one .bin shard), then a few batches from
 * whatever it accepted.
 */
#include "data/data.h"
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *path = fuzz_temp_file(data, size, ".bin");
    fsdp_data *d = NULL;
    if (fsdp_data_open(&d, path, 0, 1) != FSDP_STATUS_OK)
        return 0;
    int in[2 * 5], tg[2 * 5];
    for (uint64_t m = 0; m < 3; m++)
        if (fsdp_data_batch(d, m * 1000003u, 2, 5, in, tg) == FSDP_STATUS_OK)
            for (int i = 0; i < 10; i++)
                if (in[i] < 0 || in[i] >= fsdp_data_vocab(d) || tg[i] < 0 ||
                    tg[i] >= fsdp_data_vocab(d))
                    abort(); /* a token outside the vocabulary the reader reported */
    fsdp_data_close(d);
    return 0;
}
