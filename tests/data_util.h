/*
 * data_util.h - what the data suites (test_data, test_shard, test_corpus)
 * share: llm.c token shards written byte by byte (so a test controls the
 * header and can cut the file short), and Hugging Face tokenizers opened
 * and applied with the test's assertions. Static functions: each suite
 * compiles the ones it uses.
 */
#ifndef FSDP_TESTS_DATA_UTIL_H
#define FSDP_TESTS_DATA_UTIL_H

#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <unistd.h>

#include "core/error.h"
#include "data/data.h"
#include "data/hftok.h"
#include "testutil.h"

#define DATA_UTIL static __attribute__((unused))

/* An llm.c shard: a 1024-byte header (magic, version, count, zeros) and n
 * tokens of `width` bytes (2: uint16, 4: uint32), without its last `cut`
 * bytes. */
DATA_UTIL void write_token_shard(const char *path, int magic, int version, int count,
                                 const void *tok, size_t width, size_t n, size_t cut)
{
    size_t bytes = 1024 + width * n;
    uint8_t *buf = calloc(1, bytes);
    ck_assert_ptr_nonnull(buf);
    int32_t h[3] = {magic, version, count};
    memcpy(buf, h, sizeof h);
    if (n)
        memcpy(buf + 1024, tok, width * n);
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(fwrite(buf, 1, bytes - cut, f), bytes - cut);
    ck_assert_int_eq(fclose(f), 0);
    free(buf);
}

/* A fresh path /tmp/fsdp_test_<tag>_XXXXXX<suffix> (the file exists,
 * empty). */
DATA_UTIL void temp_path(char *path, size_t n, const char *tag, const char *suffix)
{
    snprintf(path, n, "/tmp/fsdp_test_%s_XXXXXX%s", tag, suffix);
    int fd = mkstemps(path, (int)strlen(suffix));
    ck_assert_int_ge(fd, 0);
    close(fd);
}

/* The batch contract, computed directly from the concatenated tokens all
 * (n): batch m of B rows of T holds all[(m * B + r) * T + j] (mod n) and
 * its successor as the target. */
DATA_UTIL void check_batch_against(const fsdp_data *d, const int *all, uint64_t n, uint64_t m,
                                   int B, int T)
{
    int *in = malloc(sizeof(int) * B * T), *tg = malloc(sizeof(int) * B * T);
    ck_assert_int_eq(fsdp_data_batch(d, m, B, T, in, tg), FSDP_STATUS_OK);
    for (int r = 0; r < B; r++)
        for (int j = 0; j < T; j++) {
            uint64_t p = (uint64_t)((((unsigned __int128)m * B + r) * T + j) % n);
            REQUIRE(in[r * T + j] == all[p] && tg[r * T + j] == all[(p + 1) % n],
                    "batch %llu row %d col %d: got (%d, %d), want (%d, %d)",
                    (unsigned long long)m, r, j, in[r * T + j], tg[r * T + j], all[p],
                    all[(p + 1) % n]);
        }
    free(in);
    free(tg);
}

DATA_UTIL fsdp_hftok *tok_open(const char *path)
{
    fsdp_hftok *t = NULL;
    ck_assert_int_eq(fsdp_hftok_open(&t, path), FSDP_STATUS_OK);
    return t;
}

/* Append the tokens of s (special tokens left as text) to v[*n..]. */
DATA_UTIL void enc(fsdp_hftok *t, const char *s, int *v, size_t *n)
{
    int *ids;
    size_t k;
    ck_assert_int_eq(fsdp_hftok_encode(t, s, strlen(s), FSDP_HFTOK_SPLIT_SPECIAL, &ids, &k),
                     FSDP_STATUS_OK);
    if (k)
        memcpy(v + *n, ids, k * sizeof *ids);
    *n += k;
    free(ids);
}

#endif /* FSDP_TESTS_DATA_UTIL_H */
