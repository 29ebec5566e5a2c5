/*
 * fuzz_shard_file.c - libFuzzer target for checkpoint shard files
 * (fsdp_ckpt_reader_open / _read, versions 1 and 2).
 *
 * A reader checks a file against the layout its manifest implies, so most
 * mutations would stop at the first identity check. To get past them, the
 * expectation is taken from the input itself where it can be: run id, step,
 * optimizer step, rank and world from the header, the unit sizes from the
 * unit table (at most 16 units of at most 2^20 elements, which bounds what
 * the reader allocates). Every array of every unit is then read back.
 */
#include <string.h>

#include "ckpt/ckpt.h"
#include "fuzz_common.h"

static uint64_t le64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

static uint32_t le32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 64)
        return 0;
    uint32_t version = le32(data + 8), n_units = le32(data + 24);
    size_t table = version == 1 ? 64 : 72 + (size >= 60 ? (size_t)(le32(data + 56) & 15) * 24 : 0);
    if (n_units < 1 || n_units > 16 || table + 16 * (size_t)n_units > size)
        return 0;
    size_t shard[16], first[16];
    for (uint32_t u = 0; u < n_units; u++) {
        shard[u] = (size_t)(le64(data + table + 16 * u) & ((1u << 20) - 1));
        first[u] = (size_t)le64(data + table + 16 * u + 8);
    }
    fsdp_ckpt_shard_info ex = {.run_id = le64(data + 32), .step = le64(data + 40),
                               .adam_t = le64(data + 48), .rank = (int)le32(data + 16),
                               .world_size = (int)le32(data + 20), .n_units = (int)n_units,
                               .shard_numel = shard, .first = first};
    const char *path = fuzz_temp_file(data, size, ".bin");
    fsdp_ckpt_reader *r = NULL;
    if (fsdp_ckpt_reader_open(&r, path, &ex) != FSDP_STATUS_OK)
        return 0;
    static float buf[1 << 20];
    for (uint32_t u = 0; u < n_units; u++)
        for (int a = 0; a < fsdp_ckpt_reader_n_arrays(r); a++)
            (void)fsdp_ckpt_reader_read(r, (int)u, a, 0, shard[u], buf);
    fsdp_ckpt_reader_close(r);
    return 0;
}
