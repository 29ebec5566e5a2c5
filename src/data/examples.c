/*
 * examples.c - batches of example rows (prompt/completion and chat rows;
 * the contract is in data.h), one example per batch row (padded) or packed
 * several to a row, with -1 targets wherever the loss must not look.
 *
 * One example per row: global example slot k = m*B + r falls in epoch
 * k / n at position k % n, and that position is mapped to an example by a
 * permutation keyed by (seed, epoch). The permutation is a 4-round Feistel
 * network on the smallest even power of two >= n, walked until it lands
 * below n (fewer than 4 steps on average): a bijection computed in O(1)
 * without any table, so every thread can find any row of any epoch on its
 * own, and nothing depends on how many ranks ask.
 *
 * Packed (fsdp_data_pack): the rows are laid out once, at open, by a greedy
 * next fit over the examples in the permutation keyed by (seed, PACK
 * stream); then global row slot k = m*B + r is row permute(k % R) of epoch
 * k / R, as above with R rows for n examples. An example of len tokens
 * takes min(len - 1, T) input positions: inputs tokens[0 .. len-2], targets
 * tokens[1 .. len-1], positions 0, 1, ... from its start; padding after the
 * last example of a row has position 0 (it attends to itself only) and
 * target -1.
 *
 * Read once (fsdp_data_set_one_pass, a held-out set): slots k >= n (or R) are
 * rows of padding instead of the next epoch's, so no example counts twice.
 */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/rng.h"
#include "data/data_internal.h"

#define EXAMPLES_RNG_STREAM 0x6578616d706c6573ull /* "examples" */
#define PACK_RNG_STREAM 0x7061636b696e6721ull     /* "packing!" */

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

/* What global row slot k of n per epoch maps to (an example, or a packed row). */
static uint64_t slot_of(const fsdp_data *d, uint64_t index, int B, int r, uint64_t n)
{
    unsigned __int128 k = (unsigned __int128)index * (unsigned)B + (unsigned)r;
    uint64_t epoch = (uint64_t)(k / n), slot = (uint64_t)(k % n);
    return permute(slot, n, fsdp_rng_u64(d->seed, EXAMPLES_RNG_STREAM, epoch));
}

/* Whether global row slot k = index * B + r of n per epoch lies past the one pass
 * (fsdp_data_set_one_pass): a row of padding. */
static bool past_pass(const fsdp_data *d, uint64_t index, int B, int r, uint64_t n)
{
    return d->ex.one_pass &&
           (unsigned __int128)index * (unsigned)B + (unsigned)r >= (unsigned __int128)n;
}

/* Input positions example e takes in a packed row of T. */
static uint64_t packed_len(const fsdp_examples *ex, uint64_t e, int T)
{
    uint64_t len = ex->start[e + 1] - ex->start[e];
    len = len ? len - 1 : 0;
    return len < (uint64_t)T ? len : (uint64_t)T;
}

/* Input positions example e takes alone in a row of T (its last one has no target). */
static uint64_t padded_len(const fsdp_examples *ex, uint64_t e, int T)
{
    uint64_t len = ex->start[e + 1] - ex->start[e];
    return len < (uint64_t)T ? len : (uint64_t)T;
}

/* Packed row `row` into in, tg and pos (may be NULL), T each. */
static void packed_row(const fsdp_examples *ex, uint64_t row, int T, int *in, int *tg, int *pos)
{
    uint64_t o = 0;
    for (uint64_t k = ex->pack_first[row]; k < ex->pack_first[row + 1]; k++) {
        uint64_t e = ex->pack_order[k], s = ex->start[e], n = packed_len(ex, e, T);
        for (uint64_t j = 0; j < n; j++, o++) {
            in[o] = ex->tokens[s + j];
            tg[o] = ex->trained[s + j + 1] ? ex->tokens[s + j + 1] : -1;
            if (pos)
                pos[o] = (int)j;
        }
    }
    for (; o < (uint64_t)T; o++) {
        in[o] = ex->pad;
        tg[o] = -1;
        if (pos)
            pos[o] = 0;
    }
}

void fsdp_data_examples_batch(const fsdp_data *d, uint64_t index, int B, int T, int *inputs,
                              int *targets, int *pos)
{
    const fsdp_examples *ex = &d->ex;
    for (int r = 0; r < B; r++) {
        int *in = inputs + (size_t)r * T, *tg = targets + (size_t)r * T;
        int *ps = pos ? pos + (size_t)r * T : NULL;
        if (past_pass(d, index, B, r, ex->pack_T ? ex->n_rows : ex->n)) {
            for (int j = 0; j < T; j++) {
                in[j] = ex->pad;
                tg[j] = -1;
                if (ps)
                    ps[j] = ex->pack_T ? 0 : j;
            }
            continue;
        }
        if (ex->pack_T) {
            packed_row(ex, slot_of(d, index, B, r, ex->n_rows), T, in, tg, ps);
            continue;
        }
        uint64_t e = slot_of(d, index, B, r, ex->n);
        uint64_t s = ex->start[e], len = ex->start[e + 1] - s;
        if (len > (uint64_t)T + 1)
            len = (uint64_t)T + 1;
        for (uint64_t j = 0; j < (uint64_t)T; j++) {
            in[j] = j < len ? ex->tokens[s + j] : ex->pad;
            tg[j] = j + 1 < len && ex->trained[s + j + 1] ? ex->tokens[s + j + 1] : -1;
            if (ps)
                ps[j] = (int)j;
        }
    }
}

/* Real input positions of packed row `row`. */
static uint64_t packed_real(const fsdp_examples *ex, uint64_t row, int T)
{
    uint64_t n = 0;
    for (uint64_t k = ex->pack_first[row]; k < ex->pack_first[row + 1]; k++)
        n += packed_len(ex, ex->pack_order[k], T);
    return n;
}

uint64_t fsdp_data_examples_real(const fsdp_data *d, uint64_t index, int B, int T)
{
    const fsdp_examples *ex = &d->ex;
    uint64_t n = 0;
    for (int r = 0; r < B; r++)
        if (!past_pass(d, index, B, r, ex->pack_T ? ex->n_rows : ex->n))
            n += ex->pack_T ? packed_real(ex, slot_of(d, index, B, r, ex->n_rows), T)
                            : padded_len(ex, slot_of(d, index, B, r, ex->n), T);
    return n;
}

int fsdp_data_examples_len(const fsdp_data *d, uint64_t first, int n, int B, int T)
{
    const fsdp_examples *ex = &d->ex;
    if (ex->pack_T)
        return T;
    uint64_t len = 1;
    for (uint64_t m = first; m < first + (uint64_t)n; m++)
        for (int r = 0; r < B; r++) {
            if (past_pass(d, m, B, r, ex->n))
                continue;
            uint64_t l = padded_len(ex, slot_of(d, m, B, r, ex->n), T);
            len = l > len ? l : len;
        }
    return (int)len;
}

void fsdp_data_set_one_pass(fsdp_data *d)
{
    d->ex.one_pass = d->kind == FSDP_DATA_EXAMPLES;
}

void fsdp_data_examples_layout(const fsdp_data *d, int T, uint64_t *n_rows, uint64_t *n_real)
{
    const fsdp_examples *ex = &d->ex;
    *n_real = 0;
    if (ex->pack_T) {
        *n_rows = ex->n_rows;
        for (uint64_t k = 0; k < ex->pack_first[ex->n_rows]; k++)
            *n_real += packed_len(ex, ex->pack_order[k], T);
        return;
    }
    *n_rows = ex->n;
    for (uint64_t e = 0; e < ex->n; e++)
        *n_real += padded_len(ex, e, T);
}

fsdp_status fsdp_data_pack(fsdp_data *d, int T)
{
    if (!d || d->kind != FSDP_DATA_EXAMPLES)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "only example rows (prompt/completion or messages .jsonl rows) "
                              "are packed; this data is one token stream already cut into rows "
                              "of --seq: leave --pack off");
    if (T <= 0)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "packing into rows of %d tokens", T);
    fsdp_examples *ex = &d->ex;
    uint64_t *order = malloc((ex->n ? ex->n : 1) * sizeof *order);
    uint64_t *first = malloc((ex->n + 1) * sizeof *first);
    if (!order || !first) {
        free(order);
        free(first);
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory packing %llu examples",
                              (unsigned long long)ex->n);
    }
    uint64_t key = fsdp_rng_u64(d->seed, PACK_RNG_STREAM, 0);
    uint64_t n_in = 0, rows = 0, used = (uint64_t)T;
    for (uint64_t i = 0; i < ex->n; i++) {
        uint64_t e = permute(i, ex->n, key), len = packed_len(ex, e, T);
        if (!len)
            continue; /* one token: nothing to predict */
        if (used + len > (uint64_t)T) { /* next fit: start a new row */
            first[rows++] = n_in;
            used = 0;
        }
        order[n_in++] = e;
        used += len;
    }
    first[rows] = n_in;
    if (!rows) {
        free(order);
        free(first);
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "none of the %llu examples has two "
                              "tokens or more: there is nothing to pack or train on",
                              (unsigned long long)ex->n);
    }
    free(ex->pack_order);
    free(ex->pack_first);
    ex->pack_order = order;
    ex->pack_first = first;
    ex->n_rows = rows;
    ex->pack_T = T;
    return FSDP_STATUS_OK;
}

uint64_t fsdp_data_longest(const fsdp_data *d)
{
    uint64_t m = 0;
    for (uint64_t e = 0; e < d->ex.n; e++)
        if (d->ex.start[e + 1] - d->ex.start[e] > m)
            m = d->ex.start[e + 1] - d->ex.start[e];
    return m;
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
    free(ex->pack_order);
    free(ex->pack_first);
    memset(ex, 0, sizeof *ex);
}
