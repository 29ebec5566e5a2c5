/*
 * test_pack.c - packing example rows into rows of T (data.h, data/examples.c):
 * the rows, the example boundaries, the positions and the loss masks of
 * small packed sets whose expectations are computed by hand; the greedy
 * next fit; every example once per epoch; the padding and real-token
 * counts that tokens/s and the header use; the refusals.
 *
 * The sources are built in memory through the data layer's internal header
 * (data_internal.h), so every token is known: example e holds the tokens
 * 100 e + j, j = 0 .. len-1, and trains on j >= its prompt length.
 */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "data/data.h"
#include "data/data_internal.h"
#include "testutil.h"

#define PAD 7

/* An example source of n examples of len[e] tokens, the first prompt[e] untrained. */
static fsdp_data *examples(const int *len, const int *prompt, int n, uint64_t seed)
{
    fsdp_data *d = calloc(1, sizeof *d);
    ck_assert_ptr_nonnull(d);
    d->kind = FSDP_DATA_EXAMPLES;
    d->seed = seed;
    uint64_t total = 0;
    for (int e = 0; e < n; e++)
        total += (uint64_t)len[e];
    d->ex.tokens = malloc(total * sizeof(int) + 1);
    d->ex.trained = malloc(total + 1);
    d->ex.start = malloc(((size_t)n + 1) * sizeof(uint64_t));
    ck_assert(d->ex.tokens && d->ex.trained && d->ex.start);
    uint64_t at = 0;
    for (int e = 0; e < n; e++) {
        d->ex.start[e] = at;
        for (int j = 0; j < len[e]; j++, at++) {
            d->ex.tokens[at] = 100 * e + j;
            d->ex.trained[at] = j >= prompt[e];
        }
    }
    d->ex.start[n] = at;
    d->ex.n = (uint64_t)n;
    d->ex.pad = PAD;
    d->n_tokens = total;
    d->vocab = 100 * n;
    return d;
}

/* One row of T read back into its examples: checks every position against
 * the example it starts (positions restart at 0 at each example, inputs are
 * its tokens 0..k-1, targets its tokens 1..k where trained, else -1, then
 * padding: PAD, -1, position 0). Counts each example seen in seen[], their
 * slots in *used, and returns the number of examples in the row; first[0]
 * gets the first example's id and last_len the last one's slots. */
static int read_row(const int *in, const int *tg, const int *pos, int T, const int *len,
                    const int *prompt, int *seen, int *used, int *first)
{
    int o = 0, k = 0;
    *first = -1;
    while (o < T && in[o] != PAD) {
        ck_assert_int_eq(pos[o], 0);
        ck_assert_int_eq(in[o] % 100, 0);
        int e = in[o] / 100, n = len[e] - 1 < T ? len[e] - 1 : T;
        ck_assert_int_ge(n, 1);
        ck_assert_int_le(o + n, T);
        if (*first < 0)
            *first = e;
        for (int j = 0; j < n; j++, o++) {
            ck_assert_int_eq(pos[o], j);
            ck_assert_int_eq(in[o], 100 * e + j);
            ck_assert_int_eq(tg[o], j + 1 >= prompt[e] ? 100 * e + j + 1 : -1);
        }
        seen[e]++;
        k++;
    }
    *used = o;
    for (; o < T; o++) {
        ck_assert_int_eq(in[o], PAD);
        ck_assert_int_eq(tg[o], -1);
        ck_assert_int_eq(pos[o], 0);
    }
    return k;
}

/* Five examples of 4 tokens in rows of 8: each takes 3 positions (its last
 * token is only a target), two fit a row (6 + 2 padding), so 3 rows, the
 * last with one example; 15 of the 24 positions are real. Every example
 * once per epoch, in each of three epochs; global numbering (B = 3 in one
 * micro-batch is B = 1 in three). */
START_TEST(test_pack_by_hand)
{
    static const int len[] = {4, 4, 4, 4, 4}, prompt[] = {2, 1, 3, 2, 1};
    enum { T = 8, N = 5 };
    fsdp_data *d = examples(len, prompt, N, 42);
    ck_assert_int_eq(fsdp_data_pack(d, T), FSDP_STATUS_OK);
    ck_assert_int_eq(fsdp_data_packed(d), T);
    fsdp_data_layout lay;
    fsdp_data_layout_get(d, T, &lay);
    ck_assert_uint_eq(lay.n_rows, 3);
    ck_assert_uint_eq(lay.n_real, 15);
    ck_assert_uint_eq(fsdp_data_longest(d), 4);
    int in[3 * T], tg[3 * T], pos[3 * T], in1[T], tg1[T], pos1[T];
    for (uint64_t epoch = 0; epoch < 3; epoch++) {
        int seen[N] = {0}, pairs = 0, singles = 0;
        ck_assert_int_eq(fsdp_data_batch_pos(d, epoch, 3, T, in, tg, pos), FSDP_STATUS_OK);
        ck_assert_uint_eq(fsdp_data_batch_real(d, epoch, 3, T), 15);
        for (int r = 0; r < 3; r++) {
            int used, first;
            int k = read_row(in + r * T, tg + r * T, pos + r * T, T, len, prompt, seen, &used,
                             &first);
            ck_assert_int_eq(used, 3 * k);
            pairs += k == 2;
            singles += k == 1;
            ck_assert_int_eq(fsdp_data_batch_pos(d, 3 * epoch + (uint64_t)r, 1, T, in1, tg1,
                                                 pos1), FSDP_STATUS_OK);
            ck_assert(!memcmp(in1, in + r * T, sizeof in1) &&
                      !memcmp(tg1, tg + r * T, sizeof tg1) &&
                      !memcmp(pos1, pos + r * T, sizeof pos1));
        }
        ck_assert_int_eq(pairs, 2);
        ck_assert_int_eq(singles, 1);
        for (int e = 0; e < N; e++)
            ck_assert_msg(seen[e] == 1, "epoch %d: example %d seen %d times", (int)epoch, e,
                          seen[e]);
    }
    /* fsdp_data_batch (no positions) gives the same tokens and targets */
    int in2[3 * T], tg2[3 * T];
    ck_assert_int_eq(fsdp_data_batch(d, 2, 3, T, in2, tg2), FSDP_STATUS_OK);
    ck_assert(!memcmp(in2, in, sizeof in2) && !memcmp(tg2, tg, sizeof tg2));
    /* the rows are packed for T only */
    ck_assert_int_eq(fsdp_data_batch_pos(d, 0, 1, T + 1, in, tg, pos),
                     FSDP_STATUS_INVALID_ARG);
    fsdp_data_close(d);
}
END_TEST

/* Mixed lengths in rows of 8: 9 tokens fill a row exactly (8 positions), 12
 * are cut to the first 9 (8 positions, the 9th token its last target), one
 * token has nothing to predict and is left out, the rest share rows. The
 * layout is a greedy next fit (no row could have taken the next row's first
 * example), the same for the same seed, another order for another seed;
 * the padding count is by hand: 8 + 2 + 8 + 4 + 1 = 23 real positions. */
START_TEST(test_pack_mixed)
{
    static const int len[] = {9, 3, 1, 12, 5, 2}, prompt[] = {4, 1, 0, 6, 2, 1};
    enum { T = 8, N = 6 };
    int orders = 0;
    int first_seed_rows[8][T];
    for (uint64_t seed = 1; seed <= 6; seed++) {
        fsdp_data *d = examples(len, prompt, N, seed);
        ck_assert_int_eq(fsdp_data_pack(d, T), FSDP_STATUS_OK);
        fsdp_data_layout lay;
        fsdp_data_layout_get(d, T, &lay);
        ck_assert_uint_eq(lay.n_real, 23);
        ck_assert(lay.n_rows >= 3 && lay.n_rows <= 5);
        int R = (int)lay.n_rows, seen[N] = {0}, used[8], first[8];
        int in[8 * T], tg[8 * T], pos[8 * T];
        ck_assert_int_eq(fsdp_data_batch_pos(d, 0, R, T, in, tg, pos), FSDP_STATUS_OK);
        for (int r = 0; r < R; r++)
            read_row(in + r * T, tg + r * T, pos + r * T, T, len, prompt, seen, &used[r],
                     &first[r]);
        for (int e = 0; e < N; e++)
            ck_assert_int_eq(seen[e], e == 2 ? 0 : 1);
        /* next fit in the layout's own order: row r is full for row r+1's first example */
        const fsdp_examples *ex = &d->ex;
        for (uint64_t r = 0; r + 1 < ex->n_rows; r++) {
            uint64_t u = 0;
            for (uint64_t k = ex->pack_first[r]; k < ex->pack_first[r + 1]; k++) {
                uint64_t e = ex->pack_order[k];
                u += (uint64_t)(len[e] - 1 < T ? len[e] - 1 : T);
            }
            uint64_t nxt = ex->pack_order[ex->pack_first[r + 1]];
            ck_assert_uint_gt(u + (uint64_t)(len[nxt] - 1 < T ? len[nxt] - 1 : T), T);
        }
        /* the same seed packs the same */
        fsdp_data *d2 = examples(len, prompt, N, seed);
        ck_assert_int_eq(fsdp_data_pack(d2, T), FSDP_STATUS_OK);
        int in2[8 * T], tg2[8 * T], pos2[8 * T];
        ck_assert_int_eq(fsdp_data_batch_pos(d2, 0, R, T, in2, tg2, pos2), FSDP_STATUS_OK);
        ck_assert(!memcmp(in, in2, sizeof(int) * (size_t)(R * T)));
        if (seed == 1)
            memcpy(first_seed_rows, in, sizeof(int) * (size_t)(R * T));
        else
            orders += memcmp(first_seed_rows, in, sizeof(int) * (size_t)(R * T)) != 0;
        fsdp_data_close(d2);
        fsdp_data_close(d);
    }
    ck_assert_msg(orders > 0, "six seeds gave one and the same packing");
}
END_TEST

/* Unpacked, the positions are the columns and nothing else moves: an
 * example per row, padded, its last token an input too. Refusals: packing a
 * stream, or examples with no two tokens. */
START_TEST(test_pack_off_and_refusals)
{
    static const int len[] = {3, 6}, prompt[] = {1, 2};
    enum { T = 4 };
    fsdp_data *d = examples(len, prompt, 2, 5);
    fsdp_data_layout lay;
    fsdp_data_layout_get(d, T, &lay);
    ck_assert_uint_eq(lay.n_rows, 2);
    ck_assert_uint_eq(lay.n_real, 3 + 4);
    int in[2 * T], tg[2 * T], pos[2 * T];
    ck_assert_int_eq(fsdp_data_batch_pos(d, 0, 2, T, in, tg, pos), FSDP_STATUS_OK);
    for (int r = 0; r < 2; r++) {
        int e = in[r * T] / 100;
        for (int j = 0; j < T; j++) {
            ck_assert_int_eq(pos[r * T + j], j);
            ck_assert_int_eq(in[r * T + j], j < len[e] ? 100 * e + j : PAD);
            ck_assert_int_eq(tg[r * T + j],
                             j + 1 < len[e] && j + 1 >= prompt[e] ? 100 * e + j + 1 : -1);
        }
    }
    ck_assert_uint_eq(fsdp_data_batch_real(d, 0, 2, T), 7);
    fsdp_data_close(d);

    static const int ones[] = {1, 1}, none[] = {0, 0};
    d = examples(ones, none, 2, 5);
    ck_assert_int_eq(fsdp_data_pack(d, T), FSDP_STATUS_INVALID_ARG);
    ck_assert_int_eq(fsdp_data_packed(d), 0);
    fsdp_data_close(d);
    ck_assert_int_eq(fsdp_data_open(&d, "synthetic", 0, 1), FSDP_STATUS_OK);
    ck_assert_int_eq(fsdp_data_pack(d, T), FSDP_STATUS_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(fsdp_error_msg(), "--pack off"));
    fsdp_data_layout_get(d, T, &lay);
    ck_assert_uint_eq(lay.n_rows, 0); /* endless: --epochs is refused on it */
    fsdp_data_close(d);
}
END_TEST

int main(void)
{
    const fsdp_test_tcase tcases[] = {
        {"pack", 60,
         FSDP_TESTS(test_pack_by_hand, test_pack_mixed, test_pack_off_and_refusals)},
    };
    return fsdp_test_main("pack", tcases, FSDP_TEST_LEN(tcases));
}
