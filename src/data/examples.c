/*
 * examples.c - batches of example rows (prompt/completion and chat rows;
 * the contract is in data.h): one example per batch row, padded, with -1
 * targets wherever the loss must not look.
 *
 * The order: global example slot k = m*B + r falls in epoch k / n at
 * position k % n, and that position is mapped to an example by a
 * permutation keyed by (seed, epoch). The permutation is a 4-round Feistel
 * network on the smallest even power of two >= n, walked until it lands
 * below n (fewer than 4 steps on average): a bijection computed in O(1)
 * without any table, so every thread can find any row of any epoch on its
 * own, and nothing depends on how many ranks ask.
 */
#include <stdlib.h>
#include <string.h>

#include "core/rng.h"
#include "data/data_internal.h"

#define EXAMPLES_RNG_STREAM 0x6578616d706c6573ull /* "examples" */

/* Position x (< n) of the permutation of 0..n-1 keyed by key. */
static uint64_t permute(uint64_t x, uint64_t n, uint64_t key)
{
    if (n <= 1)
        return 0;
    int bits = 64 - __builtin_clzll(n - 1);
    bits += bits & 1;
    int half = bits / 2;
    uint64_t mask = half == 64 ? ~0ull : (1ull << half) - 1;
    do {
        uint64_t l = x >> half, r = x & mask;
        for (uint64_t round = 0; round < 4; round++) {
            uint64_t f = fsdp_rng_mix(r ^ key ^ (round * 0x9e3779b97f4a7c15ull)) & mask;
            uint64_t nl = r;
            r = l ^ f;
            l = nl;
        }
        x = (l << half) | r;
    } while (x >= n);
    return x;
}

void fsdp_data_examples_batch(const fsdp_data *d, uint64_t index, int B, int T, int *inputs,
                              int *targets)
{
    const fsdp_examples *ex = &d->ex;
    for (int r = 0; r < B; r++) {
        unsigned __int128 k = (unsigned __int128)index * (unsigned)B + (unsigned)r;
        uint64_t epoch = (uint64_t)(k / ex->n), slot = (uint64_t)(k % ex->n);
        uint64_t e = permute(slot, ex->n, fsdp_rng_u64(d->seed, EXAMPLES_RNG_STREAM, epoch));
        uint64_t s = ex->start[e], len = ex->start[e + 1] - s;
        if (len > (uint64_t)T + 1)
            len = (uint64_t)T + 1;
        int *in = inputs + (size_t)r * T, *tg = targets + (size_t)r * T;
        for (uint64_t j = 0; j < (uint64_t)T; j++) {
            in[j] = j < len ? ex->tokens[s + j] : ex->pad;
            tg[j] = j + 1 < len && ex->trained[s + j + 1] ? ex->tokens[s + j + 1] : -1;
        }
    }
}

void fsdp_data_truncated(const fsdp_data *d, int T, uint64_t *n_cut, uint64_t *n_no_target)
{
    *n_cut = *n_no_target = 0;
    const fsdp_examples *ex = &d->ex;
    for (uint64_t i = 0; i < ex->n; i++) {
        uint64_t s = ex->start[i], len = ex->start[i + 1] - s;
        if (len > (uint64_t)T + 1) {
            (*n_cut)++;
            len = (uint64_t)T + 1;
        }
        bool any = false;
        for (uint64_t j = 1; j < len && !any; j++)
            any = ex->trained[s + j];
        *n_no_target += !any;
    }
}

void fsdp_data_examples_free(fsdp_examples *ex)
{
    free(ex->tokens);
    free(ex->trained);
    free(ex->start);
    memset(ex, 0, sizeof *ex);
}
