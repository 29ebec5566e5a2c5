/*
 * test_data.c - data sources: llm.c token shards (one file and globs), their
 * validation, byte-level text, batch numbering and determinism across
 * threads, and the synthetic addition task (correct sums, held-out problems
 * never in training batches, 14-byte blocks aligned to rows of 14, skewed
 * training digits and uniform held-out ones).
 *
 * Single-file fixtures are written to /tmp (mkstemp) and removed by each
 * test; the directories of globs are in the suite's scratch directory
 * (testutil.h), removed even when a test fails.
 */
#include <check.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/error.h"
#include "data/data.h"
#include "data_util.h"
#include "testutil.h"

#define MAGIC 20240520

/* Check in hot loops: unlike ck_assert, a passing REQUIRE costs nothing
 * (Check reports every passing ck_assert to its parent process). */
/* ---- fixtures -------------------------------------------------------------- */

static void write_shard(const char *path, const uint16_t *tok, size_t n)
{
    write_token_shard(path, MAGIC, 1, (int)n, tok, 2, n, 0);
}


static uint16_t *pattern_tokens(size_t n, unsigned mul, unsigned add, unsigned mod)
{
    uint16_t *t = malloc(n * sizeof *t);
    ck_assert_ptr_nonnull(t);
    for (size_t i = 0; i < n; i++)
        t[i] = (uint16_t)((i * mul + add) % mod);
    return t;
}

/* ---- token shards -------------------------------------------------------- */

START_TEST(test_shard_single)
{
    char path[64];
    temp_path(path, sizeof path, "data", ".bin");
    size_t n = 1000;
    uint16_t *tok = pattern_tokens(n, 7, 3, 501); /* max token 500 */
    write_shard(path, tok, n);
    fsdp_data *d = NULL;
    ck_assert_int_eq(fsdp_data_open(&d, path, 0, 1), FSDP_STATUS_OK);
    ck_assert_uint_eq(fsdp_data_n_tokens(d), n);
    ck_assert_int_eq(fsdp_data_vocab(d), 501);
    int *all = malloc(n * sizeof *all);
    for (size_t i = 0; i < n; i++)
        all[i] = tok[i];
    for (uint64_t m = 0; m < 40; m++) /* 40 * 4 * 16 tokens: wraps around twice */
        check_batch_against(d, all, n, m, 4, 16);
    check_batch_against(d, all, n, (1ull << 62) + 5, 3, 7); /* m*B*T overflows 64 bits */
    /* vocab_size exactly large enough is accepted */
    fsdp_data_close(d);
    ck_assert_int_eq(fsdp_data_open(&d, path, 501, 1), FSDP_STATUS_OK);
    fsdp_data_close(d);
    free(all);
    free(tok);
    unlink(path);
}
END_TEST

START_TEST(test_shard_glob)
{
    char dir[128];
    fsdp_test_mkdir(dir, sizeof dir, "glob");
    /* written out of order; one empty shard that must be skipped */
    size_t lens[4] = {300, 0, 77, 1200};
    const char *names[4] = {"tr_002.bin", "tr_001.bin", "tr_000.bin", "tr_003.bin"};
    size_t order[4] = {2, 1, 0, 3}; /* sorted order of names[] */
    uint16_t *toks[4];
    char path[128];
    for (int i = 0; i < 4; i++) {
        toks[i] = pattern_tokens(lens[i], 13 + i, 100 * i, 40000);
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        write_shard(path, toks[i], lens[i]);
    }
    snprintf(path, sizeof path, "%s/other.bin", dir); /* not matched by the glob */
    write_shard(path, toks[0], lens[0]);
    size_t n = 0;
    for (int i = 0; i < 4; i++)
        n += lens[i];
    int *all = malloc(n * sizeof *all);
    int mx = 0;
    size_t at = 0;
    for (int k = 0; k < 4; k++) {
        size_t i = order[k];
        for (size_t j = 0; j < lens[i]; j++) {
            all[at++] = toks[i][j];
            if (toks[i][j] > mx)
                mx = toks[i][j];
        }
    }
    char spec[128];
    snprintf(spec, sizeof spec, "%s/tr_*.bin", dir);
    fsdp_data *d = NULL;
    ck_assert_int_eq(fsdp_data_open(&d, spec, 50257, 0), FSDP_STATUS_OK);
    ck_assert_uint_eq(fsdp_data_n_tokens(d), n);
    ck_assert_int_eq(fsdp_data_vocab(d), mx + 1);
    for (uint64_t m = 0; m < 50; m++) /* rows cross every file boundary and wrap */
        check_batch_against(d, all, n, m, 2, 64);
    check_batch_against(d, all, n, 0, 1, (int)n + 5); /* one row longer than the data */
    fsdp_data_close(d);
    for (int i = 0; i < 4; i++)
        free(toks[i]);
    free(all);
}
END_TEST

/* Micro-batch m of B rows is rows m*B .. m*B+B-1 of one global numbering: it
 * equals the B single-row micro-batches m*B + r, so the global batch does not
 * depend on how it is split into micro-batches. */
static void check_global_numbering(const fsdp_data *d, uint64_t m, int B, int T)
{
    int *in = malloc(sizeof(int) * B * T), *tg = malloc(sizeof(int) * B * T);
    int *in1 = malloc(sizeof(int) * T), *tg1 = malloc(sizeof(int) * T);
    ck_assert_int_eq(fsdp_data_batch(d, m, B, T, in, tg), FSDP_STATUS_OK);
    for (int r = 0; r < B; r++) {
        ck_assert_int_eq(fsdp_data_batch(d, m * B + r, 1, T, in1, tg1), FSDP_STATUS_OK);
        ck_assert_mem_eq(in + r * T, in1, sizeof(int) * T);
        ck_assert_mem_eq(tg + r * T, tg1, sizeof(int) * T);
    }
    free(in);
    free(tg);
    free(in1);
    free(tg1);
}

START_TEST(test_global_numbering)
{
    char path[64];
    temp_path(path, sizeof path, "data", ".bin");
    size_t n = 5003;
    uint16_t *tok = pattern_tokens(n, 31, 5, 65535);
    write_shard(path, tok, n);
    fsdp_data *d = NULL;
    ck_assert_int_eq(fsdp_data_open(&d, path, 0, 7), FSDP_STATUS_OK);
    for (uint64_t m = 0; m < 30; m++)
        check_global_numbering(d, m, 4, 33);
    fsdp_data_close(d);
    ck_assert_int_eq(fsdp_data_open(&d, "synthetic", 0, 7), FSDP_STATUS_OK);
    for (uint64_t m = 0; m < 30; m++)
        check_global_numbering(d, m, 4, 33);
    fsdp_data_close(d);
    free(tok);
    unlink(path);
}
END_TEST

/* ---- determinism across threads ------------------------------------------ */

#define DET_BATCHES 24
#define DET_B 3
#define DET_T 50

typedef struct det_arg {
    const fsdp_data *d;
    int rank, n_ranks;
    int *out; /* DET_BATCHES x (inputs, targets) x DET_B x DET_T */
    fsdp_status st;
} det_arg;

/* Rank r takes micro-batches r, r+N, ... (docs/determinism.md), in reverse order, to show
 * that nothing depends on call order. */
static void *det_worker(void *p)
{
    det_arg *a = p;
    a->st = FSDP_STATUS_OK;
    for (int m = DET_BATCHES - 1; m >= 0; m--) {
        if (m % a->n_ranks != a->rank)
            continue;
        int *in = a->out + (size_t)m * 2 * DET_B * DET_T;
        fsdp_status st = fsdp_data_batch(a->d, (uint64_t)m, DET_B, DET_T, in, in + DET_B * DET_T);
        if (st != FSDP_STATUS_OK)
            a->st = st;
    }
    return NULL;
}

static void check_threads_match(const fsdp_data *d)
{
    size_t per = (size_t)2 * DET_B * DET_T, total = per * DET_BATCHES;
    int *ref = malloc(total * sizeof *ref), *got = calloc(total, sizeof *got);
    for (int m = 0; m < DET_BATCHES; m++)
        ck_assert_int_eq(fsdp_data_batch(d, (uint64_t)m, DET_B, DET_T, ref + m * per,
                                         ref + m * per + DET_B * DET_T),
                         FSDP_STATUS_OK);
    for (int n_ranks = 2; n_ranks <= 4; n_ranks += 2) {
        pthread_t th[4];
        det_arg args[4];
        memset(got, 0, total * sizeof *got);
        for (int r = 0; r < n_ranks; r++) {
            args[r] = (det_arg){.d = d, .rank = r, .n_ranks = n_ranks, .out = got};
            ck_assert_int_eq(pthread_create(&th[r], NULL, det_worker, &args[r]), 0);
        }
        for (int r = 0; r < n_ranks; r++) {
            pthread_join(th[r], NULL);
            ck_assert_int_eq(args[r].st, FSDP_STATUS_OK);
        }
        ck_assert_mem_eq(ref, got, total * sizeof *ref);
    }
    free(ref);
    free(got);
}

START_TEST(test_threads_deterministic)
{
    char dir[128], path[160], spec[160];
    fsdp_test_mkdir(dir, sizeof dir, "threads");
    uint16_t *tok = pattern_tokens(997, 17, 1, 1000);
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s/s%d.bin", dir, i);
        write_shard(path, tok + 300 * i, i < 2 ? 300 : 397);
    }
    snprintf(spec, sizeof spec, "%s/s*.bin", dir);
    fsdp_data *d = NULL;
    ck_assert_int_eq(fsdp_data_open(&d, spec, 1000, 3), FSDP_STATUS_OK);
    check_threads_match(d);
    fsdp_data_close(d);
    ck_assert_int_eq(fsdp_data_open(&d, "synthetic", 256, 3), FSDP_STATUS_OK);
    check_threads_match(d);
    fsdp_data_close(d);
    free(tok);
}
END_TEST

/* ---- validation ---------------------------------------------------------- */

/* Open must fail with `want` and a message containing `needle` (and, when
 * given, `needle2`). */
static void expect_fail(const char *spec, int vocab, fsdp_status want, const char *needle,
                        const char *needle2)
{
    fsdp_data *d = (fsdp_data *)0x1;
    fsdp_error_clear();
    fsdp_status st = fsdp_data_open(&d, spec, vocab, 0);
    ck_assert_msg(st == want, "'%s': status %s, want %s (%s)", spec, fsdp_status_name(st),
                  fsdp_status_name(want), fsdp_error_msg());
    ck_assert_ptr_null(d);
    ck_assert_msg(strstr(fsdp_error_msg(), needle), "message '%s' lacks '%s'", fsdp_error_msg(),
                  needle);
    if (needle2)
        ck_assert_msg(strstr(fsdp_error_msg(), needle2), "message '%s' lacks '%s'",
                      fsdp_error_msg(), needle2);
}

START_TEST(test_shard_corrupt)
{
    char path[64];
    temp_path(path, sizeof path, "data", ".bin");
    uint16_t *tok = pattern_tokens(100, 3, 0, 300);

    write_token_shard(path, 12345, 1, 100, tok, 2, 100, 0);
    expect_fail(path, 0, FSDP_STATUS_FORMAT, path, "12345");

    write_token_shard(path, MAGIC, 2, 100, tok, 2, 100, 0);
    expect_fail(path, 0, FSDP_STATUS_FORMAT, path, "version 2");

    write_token_shard(path, MAGIC, 1, 100, tok, 2, 100, 1); /* truncated by a byte */
    expect_fail(path, 0, FSDP_STATUS_FORMAT, path, "1223 bytes"); /* actual; expected 1224 */
    ck_assert_ptr_nonnull(strstr(fsdp_error_msg(), "1224"));

    write_token_shard(path, MAGIC, 1, 101, tok, 2, 100, 0); /* count says more than is there */
    expect_fail(path, 0, FSDP_STATUS_FORMAT, path, "1226");

    write_token_shard(path, MAGIC, 1, -5, tok, 2, 100, 0);
    expect_fail(path, 0, FSDP_STATUS_FORMAT, path, "-5");

    write_token_shard(path, MAGIC, 1, 100, tok, 2, 100, 1024); /* header cut short */
    expect_fail(path, 0, FSDP_STATUS_FORMAT, path, "header");

    write_token_shard(path, MAGIC, 1, 0, tok, 2, 0, 0); /* valid but no tokens */
    expect_fail(path, 0, FSDP_STATUS_FORMAT, path, "no tokens");

    /* token 299 (the largest) at index 73 -> byte offset 1024 + 146 */
    for (int i = 0; i < 100; i++)
        if (tok[i] >= 299)
            tok[i] = 1;
    tok[73] = 299;
    write_shard(path, tok, 100);
    expect_fail(path, 299, FSDP_STATUS_FORMAT, path, "offset 1170");
    ck_assert_ptr_nonnull(strstr(fsdp_error_msg(), "299"));
    fsdp_data *d = NULL;
    ck_assert_int_eq(fsdp_data_open(&d, path, 300, 0), FSDP_STATUS_OK);
    ck_assert_int_eq(fsdp_data_vocab(d), 300);
    fsdp_data_close(d);

    unlink(path);
    expect_fail(path, 0, FSDP_STATUS_IO, path, "No such file");

    char dir[128], spec[160];
    fsdp_test_mkdir(dir, sizeof dir, "glob");
    snprintf(spec, sizeof spec, "%s/train_*.bin", dir);
    expect_fail(spec, 0, FSDP_STATUS_IO, spec, "no files match");
    expect_fail(dir, 0, FSDP_STATUS_IO, dir, "not a regular file");

    /* one bad shard in a glob is named, not the pattern */
    char good[160], bad[160];
    snprintf(good, sizeof good, "%s/train_0.bin", dir);
    snprintf(bad, sizeof bad, "%s/train_1.bin", dir);
    write_shard(good, tok, 100);
    write_token_shard(bad, MAGIC, 1, 100, tok, 2, 100, 7);
    expect_fail(spec, 0, FSDP_STATUS_FORMAT, bad, "truncated");
    free(tok);
}
END_TEST

START_TEST(test_hostile_headers)
{
    /* Random header words and sizes: every open either succeeds with a
     * consistent source or fails cleanly; none crashes. */
    char path[64];
    temp_path(path, sizeof path, "data", ".bin");
    uint16_t tok[64] = {0};
    int32_t counts[] = {0, 1, 63, 64, 65, 1 << 30, -1, (int32_t)0x80000000, 0x7fffffff};
    for (size_t i = 0; i < sizeof counts / sizeof counts[0]; i++)
        for (size_t cut = 0; cut < 4; cut++) {
            write_token_shard(path, MAGIC, 1, counts[i], tok, 2, 64, cut);
            fsdp_data *d = NULL;
            fsdp_status st = fsdp_data_open(&d, path, 0, 0);
            int64_t size = 1024 + 128 - (int64_t)cut;
            if (counts[i] > 0 && size == 1024 + 2 * (int64_t)counts[i]) { /* consistent */
                ck_assert_int_eq(st, FSDP_STATUS_OK);
                ck_assert_uint_eq(fsdp_data_n_tokens(d), (uint64_t)counts[i]);
                fsdp_data_close(d);
            } else {
                ck_assert_int_eq(st, FSDP_STATUS_FORMAT);
                ck_assert_ptr_nonnull(strstr(fsdp_error_msg(), path));
            }
        }
    unlink(path);
}
END_TEST

START_TEST(test_bad_args)
{
    fsdp_data *d = NULL;
    ck_assert_int_eq(fsdp_data_open(&d, "", 0, 0), FSDP_STATUS_INVALID_ARG);
    ck_assert_int_eq(fsdp_data_open(&d, NULL, 0, 0), FSDP_STATUS_INVALID_ARG);
    ck_assert_int_eq(fsdp_data_open(&d, "synthetic", -1, 0), FSDP_STATUS_INVALID_ARG);
    ck_assert_int_eq(fsdp_data_open(&d, "synthetic", 50, 0), FSDP_STATUS_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(fsdp_error_msg(), "vocabulary"));
    ck_assert_int_eq(fsdp_data_open(&d, "synthetic", 0, 0), FSDP_STATUS_OK);
    int in[8], tg[8];
    ck_assert_int_eq(fsdp_data_batch(d, 0, 0, 8, in, tg), FSDP_STATUS_INVALID_ARG);
    ck_assert_int_eq(fsdp_data_batch(d, 0, 1, -1, in, tg), FSDP_STATUS_INVALID_ARG);
    ck_assert_int_eq(fsdp_data_batch(d, 0, 1, 8, NULL, tg), FSDP_STATUS_INVALID_ARG);
    ck_assert_int_eq(fsdp_data_batch(d, 0, 1, 8, in, tg), FSDP_STATUS_OK);
    fsdp_data_close(d);
    fsdp_data_close(NULL);
}
END_TEST

/* ---- text ------------------------------------------------------------------ */

START_TEST(test_text)
{
    char path[64];
    temp_path(path, sizeof path, "data", ".txt");
    const char text[] = "To be, or not to be, that is the question:\n\xc3\xa9t\xc3\xa9\n";
    size_t n = sizeof text - 1;
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    fwrite(text, 1, n, f);
    fclose(f);
    fsdp_data *d = NULL;
    ck_assert_int_eq(fsdp_data_open(&d, path, 0, 9), FSDP_STATUS_OK);
    ck_assert_uint_eq(fsdp_data_n_tokens(d), n);
    ck_assert_int_eq(fsdp_data_vocab(d), 256);
    int all[64];
    for (size_t i = 0; i < n; i++)
        all[i] = (unsigned char)text[i];
    for (uint64_t m = 0; m < 10; m++)
        check_batch_against(d, all, n, m, 2, 9);
    fsdp_data_close(d);
    /* bytes >= 128 do not fit a 128-token vocabulary: offset of the first */
    char needle[32];
    snprintf(needle, sizeof needle, "offset %zu", (size_t)(strchr(text, '\xc3') - text));
    expect_fail(path, 128, FSDP_STATUS_FORMAT, path, needle);
    /* an empty text file has nothing to train on */
    f = fopen(path, "wb");
    fclose(f);
    expect_fail(path, 0, FSDP_STATUS_FORMAT, path, "no tokens");
    unlink(path);
}
END_TEST

/* ---- synthetic task ------------------------------------------------------ */

/* Parse "aaa+bbb=" + reversed 4-digit sum + "\n" at s; returns the pair id
 * a*1000+b, or -1 if the text is not a correct problem. */
static long parse_problem(const int *s)
{
    int a = 0, b = 0, sum = 0;
    for (int i = 0; i < 3; i++) {
        if (s[i] < '0' || s[i] > '9' || s[4 + i] < '0' || s[4 + i] > '9')
            return -1;
        a = a * 10 + (s[i] - '0');
        b = b * 10 + (s[4 + i] - '0');
    }
    if (s[3] != '+' || s[7] != '=' || s[12] != '\n')
        return -1;
    for (int i = 3; i >= 0; i--) {
        if (s[8 + i] < '0' || s[8 + i] > '9')
            return -1;
        sum = sum * 10 + (s[8 + i] - '0');
    }
    return sum == a + b ? (long)a * 1000 + b : -1;
}

/* The training stream's unit: "\n" + a problem (14 bytes). */
#define BLOCK 14

static long parse_block(const int *s)
{
    return s[0] == '\n' ? parse_problem(s + 1) : -1;
}

START_TEST(test_synth_problems)
{
    /* held-out problems: correct arithmetic, prompt/answer format */
    for (uint64_t i = 0; i < 2000; i++) {
        char prompt[64], answer[64];
        fsdp_synth_problem(11, i, prompt, answer);
        REQUIRE(strlen(prompt) == 8 && strlen(answer) == 5, "bad lengths '%s' '%s'", prompt,
                answer);
        int s[13];
        for (int k = 0; k < 8; k++)
            s[k] = (unsigned char)prompt[k];
        for (int k = 0; k < 5; k++)
            s[8 + k] = (unsigned char)answer[k];
        REQUIRE(parse_problem(s) >= 0, "bad problem '%s%s'", prompt, answer);
    }
    char p1[64], a1[64], p2[64], a2[64];
    fsdp_synth_problem(11, 5, p1, a1);
    fsdp_synth_problem(11, 5, p2, a2);
    ck_assert_str_eq(p1, p2);
    ck_assert_str_eq(a1, a2);
    /* the format the docs show: 352+471 = 823 -> "3280\n" */
    int s[13];
    const char *ex = "352+471=3280\n";
    for (int k = 0; k < 13; k++)
        s[k] = ex[k];
    ck_assert_int_eq(parse_problem(s), 352471);
}
END_TEST

START_TEST(test_synth_train_disjoint)
{
    const uint64_t seed = 11;
    /* mark the pairs of 3000 held-out problems */
    uint8_t *held = calloc(1000000, 1);
    int n_held = 0;
    for (uint64_t i = 0; i < 3000; i++) {
        char prompt[64], answer[64];
        fsdp_synth_problem(seed, i, prompt, answer);
        int a = atoi(prompt), b = atoi(prompt + 4);
        n_held += !held[a * 1000 + b];
        held[a * 1000 + b] = 1;
    }
    ck_assert_int_gt(n_held, 2500); /* varied, so the check below means something */

    /* 150k training problems (micro-batches aligned to block boundaries):
     * all valid, none held out. With random pairs, ~450 would be. */
    fsdp_data *d = NULL;
    ck_assert_int_eq(fsdp_data_open(&d, "synthetic", 256, seed), FSDP_STATUS_OK);
    ck_assert_int_eq(fsdp_data_vocab(d), 256);
    ck_assert_uint_eq(fsdp_data_n_tokens(d), 0);
    const int T = BLOCK * 500;
    int *in = malloc(sizeof(int) * T), *tg = malloc(sizeof(int) * T);
    long n_problems = 0;
    int last_target = -1;
    uint8_t *seen = calloc(1000000, 1);
    for (uint64_t m = 0; m < 300; m++) {
        ck_assert_int_eq(fsdp_data_batch(d, m, 1, T, in, tg), FSDP_STATUS_OK);
        for (int j = 0; j + 1 < T; j++)
            REQUIRE(tg[j] == in[j + 1], "targets are not inputs shifted at %d", j);
        if (m > 0) /* last target of batch m-1 = first input of batch m */
            ck_assert_int_eq(last_target, in[0]);
        last_target = tg[T - 1];
        for (int k = 0; k < T; k += BLOCK) {
            long id = parse_block(in + k);
            REQUIRE(id >= 0, "malformed training problem at batch %llu byte %d",
                          (unsigned long long)m, k);
            REQUIRE(!held[id], "held-out problem %03ld+%03ld in training batch %llu",
                          id / 1000, id % 1000, (unsigned long long)m);
            seen[id] = 1;
            n_problems++;
        }
    }
    ck_assert_int_eq(n_problems, 150000);
    long distinct = 0;
    for (int i = 0; i < 1000000; i++)
        distinct += seen[i];
    /* the training stream is varied too (the zero skew concentrates it: about
     * 92.6k distinct pairs in these 150k draws, against ~139k for uniform
     * digits) */
    ck_assert_int_gt(distinct, 80000);

    /* another seed gives another stream (and another held-out split) */
    fsdp_data *d2 = NULL;
    int *in2 = malloc(sizeof(int) * T), *tg2 = malloc(sizeof(int) * T);
    ck_assert_int_eq(fsdp_data_open(&d2, "synthetic", 0, seed + 1), FSDP_STATUS_OK);
    ck_assert_int_eq(fsdp_data_batch(d, 0, 1, T, in, tg), FSDP_STATUS_OK);
    ck_assert_int_eq(fsdp_data_batch(d2, 0, 1, T, in2, tg2), FSDP_STATUS_OK);
    ck_assert_int_ne(memcmp(in, in2, sizeof(int) * T), 0);
    fsdp_data_close(d2);
    fsdp_data_close(d);
    free(in);
    free(tg);
    free(in2);
    free(tg2);
    free(held);
    free(seen);
}
END_TEST

START_TEST(test_synth_unaligned_rows)
{
    /* rows start anywhere in the stream; the bytes still belong to correct
     * problems: realign to the stream and parse */
    fsdp_data *d = NULL;
    ck_assert_int_eq(fsdp_data_open(&d, "synthetic", 0, 5), FSDP_STATUS_OK);
    int B = 3, T = 40;
    int in[120], tg[120];
    for (uint64_t m = 0; m < 50; m++) {
        ck_assert_int_eq(fsdp_data_batch(d, m, B, T, in, tg), FSDP_STATUS_OK);
        for (int r = 0; r < B; r++) {
            uint64_t start = (m * B + r) * T;
            int off = (int)((BLOCK - start % BLOCK) % BLOCK); /* first block start in the row */
            for (int k = off; k + BLOCK <= T; k += BLOCK)
                REQUIRE(parse_block(in + r * T + k) >= 0, "bad problem at %d", k);
            for (int j = 0; j < T; j++) {
                int c = in[r * T + j];
                REQUIRE((c >= '0' && c <= '9') || c == '+' || c == '=' || c == '\n',
                        "byte %d outside the task's alphabet", c);
            }
        }
    }
    fsdp_data_close(d);
}
END_TEST

START_TEST(test_synth_rows_of_one_problem)
{
    /* T = 14: every row is one whole block, laid out as the trainer's greedy
     * evaluation lays out a held-out problem ("\n" + prompt, then the answer),
     * and its last target is the next block's newline */
    fsdp_data *d = NULL;
    ck_assert_int_eq(fsdp_data_open(&d, "synthetic", 0, 9), FSDP_STATUS_OK);
    enum { B = 16 };
    int in[B * BLOCK], tg[B * BLOCK];
    char prompt[64], answer[64];
    fsdp_synth_problem(9, 0, prompt, answer);
    ck_assert_int_eq(1 + strlen(prompt) + strlen(answer), BLOCK);
    for (uint64_t m = 0; m < 40; m++) {
        ck_assert_int_eq(fsdp_data_batch(d, m, B, BLOCK, in, tg), FSDP_STATUS_OK);
        for (int r = 0; r < B; r++) {
            REQUIRE(parse_block(in + r * BLOCK) >= 0, "row %d of batch %llu is not a problem", r,
                    (unsigned long long)m);
            REQUIRE(in[r * BLOCK + 8] == '=' && tg[r * BLOCK + BLOCK - 1] == '\n',
                    "row %d of batch %llu is not aligned", r, (unsigned long long)m);
        }
    }
    fsdp_data_close(d);
}
END_TEST

START_TEST(test_synth_digit_skew)
{
    /* training digits: 0 with probability 77/256 + (179/256)/10 = 0.370,
     * each other digit 0.070; every (x, y) pair of units digits occurs, so
     * the whole addition table is taught. Held-out digits stay uniform. */
    fsdp_data *d = NULL;
    ck_assert_int_eq(fsdp_data_open(&d, "synthetic", 0, 21), FSDP_STATUS_OK);
    enum { B = 100, N_BATCH = 20 };
    static int in[B * BLOCK], tg[B * BLOCK];
    long zeros = 0, digits = 0, nines = 0;
    int pair_seen[100] = {0};
    for (uint64_t m = 0; m < N_BATCH; m++) {
        ck_assert_int_eq(fsdp_data_batch(d, m, B, BLOCK, in, tg), FSDP_STATUS_OK);
        for (int r = 0; r < B; r++) {
            const int *p = in + r * BLOCK;
            REQUIRE(parse_block(p) >= 0, "bad training problem");
            for (int k = 0; k < 3; k++) {
                zeros += (p[1 + k] == '0') + (p[5 + k] == '0');
                nines += (p[1 + k] == '9') + (p[5 + k] == '9');
                digits += 2;
            }
            pair_seen[(p[3] - '0') * 10 + (p[7] - '0')]++;
        }
    }
    double z = (double)zeros / digits, n9 = (double)nines / digits;
    ck_assert_msg(z > 0.35 && z < 0.39, "training zero-digit share %.3f, want ~0.370", z);
    ck_assert_msg(n9 > 0.06 && n9 < 0.08, "training nine-digit share %.3f, want ~0.070", n9);
    for (int i = 0; i < 100; i++)
        ck_assert_msg(pair_seen[i] > 0, "units digits %d+%d never trained", i / 10, i % 10);
    fsdp_data_close(d);

    long hz = 0, hd = 0;
    for (uint64_t i = 0; i < 4000; i++) {
        char prompt[64], answer[64];
        fsdp_synth_problem(21, i, prompt, answer);
        for (int k = 0; k < 7; k++)
            if (k != 3) {
                hz += prompt[k] == '0';
                hd++;
            }
    }
    double h = (double)hz / hd;
    ck_assert_msg(h > 0.09 && h < 0.11, "held-out zero-digit share %.3f, want ~0.100", h);
}
END_TEST

int main(void)
{
    const fsdp_test_tcase tcases[] = {
        {"shards", 60, .tmpdir = true,
         FSDP_TESTS(test_shard_single, test_shard_glob, test_global_numbering,
                    test_threads_deterministic, test_shard_corrupt, test_hostile_headers,
                    test_bad_args, test_text)},
        {"synthetic", 60,
         FSDP_TESTS(test_synth_problems, test_synth_train_disjoint, test_synth_unaligned_rows,
                    test_synth_rows_of_one_problem, test_synth_digit_skew)},
    };
    return fsdp_test_main("data", tcases, FSDP_TEST_LEN(tcases));
}
