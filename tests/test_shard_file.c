/*
 * test_shard_file.c - the checkpoint shard file (src/ckpt/shard_file.c):
 * block writes in any order and reads of any range; named arrays (version
 * 2) and what readers expect of them; header, table and payload damage;
 * the version-1 fixture tests/fixtures/ckpt_v1_tiny, which must keep
 * loading as the AdamW state it is; and the corruption the version-1 sum
 * let through (1000 parameters negated in one block), which `convert`,
 * `eval` and `train --resume` must now refuse.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "ckpt/ckpt.h"
#include "core/error.h"
#include "core/rng.h"
#include "file_util.h"
#include "models/registry.h"
#include "testutil.h"
#include "train/train.h"
#include "train_util.h"

#define V1_FIXTURE "tests/fixtures/ckpt_v1_tiny"
#define V1_STEP V1_FIXTURE "/step_00000002"
/* the fixture's run: fsdp train --model tiny --devices 2 --steps 2 --batch 2 --seq 16 */
#define SPEC "custom:layers=2,heads=2,channels=16,vocab=256,context=16"

/* Element i of array a of unit u: distinct everywhere. */
static float val(int u, int a, size_t i) { return fsdp_rng_normal(7, (uint64_t)(u * 3 + a), i); }

/* Write a 2-unit shard file with the given arrays (NULL: the default),
 * blocks in reverse order. */
static void write_file(const char *path, const fsdp_ckpt_shard_info *info)
{
    const size_t B = FSDP_CKPT_BLOCK_NUMEL;
    int n_arrays = info->n_arrays ? info->n_arrays : 3;
    float *buf = malloc(B * sizeof(float));
    fsdp_ckpt_writer *w;
    ck_assert_int_eq(fsdp_ckpt_writer_open(&w, path, info), FSDP_STATUS_OK);
    for (int u = info->n_units - 1; u >= 0; u--)
        for (int a = n_arrays - 1; a >= 0; a--)
            for (size_t b = (info->shard_numel[u] + B - 1) / B; b-- > 0;) {
                for (size_t i = 0; i < B && b * B + i < info->shard_numel[u]; i++)
                    buf[i] = val(u, a, b * B + i);
                ck_assert_int_eq(fsdp_ckpt_writer_put(w, u, a, b, buf), FSDP_STATUS_OK);
            }
    ck_assert_int_eq(fsdp_ckpt_writer_close(w), FSDP_STATUS_OK);
    free(buf);
}

START_TEST(test_shard_file_blocks)
{
    char path[128];
    fsdp_test_path(path, sizeof path, "rank_00001.bin");
    const size_t B = FSDP_CKPT_BLOCK_NUMEL;
    size_t shard[2] = {2 * B + 12345, 7}, first[2] = {shard[0], 7};
    fsdp_ckpt_shard_info info = {.run_id = 42, .step = 3, .adam_t = 3, .rank = 1,
                                 .world_size = 2, .n_units = 2, .shard_numel = shard,
                                 .first = first};
    float *buf = malloc(B * sizeof(float));
    fsdp_ckpt_writer *w;
    /* a block left out is a bug, reported, not a silent hole */
    ck_assert_int_eq(fsdp_ckpt_writer_open(&w, path, &info), FSDP_STATUS_OK);
    ck_assert_int_eq(fsdp_ckpt_writer_close(w), FSDP_STATUS_INTERNAL);
    write_file(path, &info);

    /* ranges inside a block, across blocks, the tail, the whole shard */
    fsdp_ckpt_reader *r;
    fsdp_status st = fsdp_ckpt_reader_open(&r, path, &info);
    REQUIRE(st == FSDP_STATUS_OK, "%s", fsdp_error_msg());
    ck_assert_int_eq(fsdp_ckpt_reader_version(r), 2);
    ck_assert_int_eq(fsdp_ckpt_reader_n_arrays(r), 3); /* the default layout: AdamW's */
    ck_assert_str_eq(fsdp_ckpt_reader_array_name(r, FSDP_CKPT_ADAM_V), "adam_v");
    float *out = malloc(shard[0] * sizeof(float));
    size_t ranges[][2] = {{0, 1}, {5, 100}, {B - 3, 10}, {B - 1, B + 2}, {2 * B, 12345},
                          {0, 2 * B + 12345}, {shard[0] - 1, 1}};
    for (int a = 0; a < 3; a++)
        for (size_t k = 0; k < sizeof ranges / sizeof ranges[0]; k++) {
            size_t lo = ranges[k][0], n = ranges[k][1];
            ck_assert_int_eq(fsdp_ckpt_reader_read(r, 0, a, lo, n, out), FSDP_STATUS_OK);
            for (size_t i = 0; i < n; i++)
                REQUIRE(out[i] == val(0, a, lo + i), "array %d range %zu element %zu", a, k, i);
        }
    ck_assert_int_eq(fsdp_ckpt_reader_read(r, 1, FSDP_CKPT_ADAM_V, 0, 7, out), FSDP_STATUS_OK);
    for (size_t i = 0; i < 7; i++)
        ck_assert(out[i] == val(1, 2, i));
    fsdp_ckpt_reader_close(r);

    /* one flipped payload byte: only the reads touching its block fail.
     * Layout: 72-byte header, 3 x 24 names (72..143), 2 x 16 unit table
     * (144..175), 12 checksums (176..271); the payload starts at 320 with
     * unit 0's master */
    char bad[128];
    fsdp_test_path(bad, sizeof bad, "bad.bin");
    copy_file(path, bad);
    flip_byte(bad, (long)(320 + 4 * (B + 10)), false);
    ck_assert_int_eq(fsdp_ckpt_reader_open(&r, bad, &info), FSDP_STATUS_OK);
    ck_assert_int_eq(fsdp_ckpt_reader_read(r, 0, FSDP_CKPT_MASTER, 0, B, out), FSDP_STATUS_OK);
    ck_assert_int_eq(fsdp_ckpt_reader_read(r, 0, FSDP_CKPT_MASTER, B + 5, 10, out),
                     FSDP_STATUS_FORMAT);
    REQUIRE(strstr(fsdp_error_msg(), "checksum") && strstr(fsdp_error_msg(), bad) &&
                strstr(fsdp_error_msg(), "master"), "%s", fsdp_error_msg());
    fsdp_ckpt_reader_close(r);

    /* header and table damage, and mismatched expectations */
    struct {
        long off;        /* byte to flip (from the start); -1: none */
        uint64_t run_id; /* expected */
        int rank;
        size_t truncate;
        const char *expect;
    } cases[] = {
        {0, 42, 1, 0, "bad magic"},
        {20, 42, 1, 0, "header checksum"},      /* world size field */
        {72 + 2, 42, 1, 0, "header checksum"},  /* name table */
        {144 + 3, 42, 1, 0, "header checksum"}, /* unit table */
        {200, 42, 1, 0, "header checksum"},     /* checksum table */
        {56, 42, 1, 0, "arrays per unit"},      /* array count: 3 ^ 0x5a */
        {-1, 43, 1, 0, "another checkpoint"},
        {-1, 42, 0, 0, "rank"},
        {-1, 42, 1, 1000, "truncated"},
        {-1, 42, 1, 68, "truncated"},
        {-1, 42, 1, 10, "truncated"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        copy_file(path, bad);
        if (cases[k].off >= 0)
            flip_byte(bad, cases[k].off, false);
        if (cases[k].truncate)
            ck_assert_int_eq(truncate(bad, (off_t)cases[k].truncate), 0);
        fsdp_ckpt_shard_info ex = info;
        ex.run_id = cases[k].run_id;
        ex.rank = cases[k].rank;
        r = (fsdp_ckpt_reader *)1;
        st = fsdp_ckpt_reader_open(&r, bad, &ex);
        REQUIRE(st == FSDP_STATUS_FORMAT && r == NULL, "case %zu: %s %s", k,
                fsdp_status_name(st), fsdp_error_msg());
        REQUIRE(strstr(fsdp_error_msg(), cases[k].expect) && strstr(fsdp_error_msg(), bad),
                "case %zu: %s", k, fsdp_error_msg());
    }
    /* a newer format version */
    copy_file(path, bad);
    set_u32(bad, 8, 3);
    ck_assert_int_eq(fsdp_ckpt_reader_open(&r, bad, &info), FSDP_STATUS_FORMAT);
    REQUIRE(strstr(fsdp_error_msg(), "version 3"), "%s", fsdp_error_msg());
    /* the manifest's layout differs from the file's */
    size_t other[2] = {shard[0], 8};
    fsdp_ckpt_shard_info ex = info;
    ex.shard_numel = other;
    ck_assert_int_eq(fsdp_ckpt_reader_open(&r, path, &ex), FSDP_STATUS_FORMAT);
    fsdp_test_path(bad, sizeof bad, "missing.bin");
    ck_assert_int_ne(fsdp_ckpt_reader_open(&r, bad, &info), FSDP_STATUS_OK);
    REQUIRE(strstr(fsdp_error_msg(), "missing.bin"), "%s", fsdp_error_msg());
    free(out);
    free(buf);
}
END_TEST

/* Named arrays: any optimizer's list is stored and checked; a reader that
 * names none takes the file's. */
START_TEST(test_shard_file_named_arrays)
{
    char path[128];
    fsdp_test_path(path, sizeof path, "rank_00000.bin");
    size_t shard[2] = {1000, 70000}, first[2] = {0, 0};
    const char *sgd[] = {"master", "momentum"};
    fsdp_ckpt_shard_info info = {.run_id = 9, .step = 5, .adam_t = 5, .rank = 0,
                                 .world_size = 1, .n_units = 2, .shard_numel = shard,
                                 .first = first, .n_arrays = 2, .array_names = sgd};
    write_file(path, &info);
    size_t want_size = (72 + 2 * 24 + 2 * 16 + (2 * 1 + 2 * 2) * 8 + 63) / 64 * 64 +
                       2 * 4 * (shard[0] + shard[1]);
    size_t size = 0;
    free(slurp_n(path, &size));
    ck_assert_uint_eq(size, want_size);

    fsdp_ckpt_reader *r;
    ck_assert_int_eq(fsdp_ckpt_reader_open(&r, path, &info), FSDP_STATUS_OK);
    float got[4];
    ck_assert_int_eq(fsdp_ckpt_reader_read(r, 1, 1, 69998, 2, got), FSDP_STATUS_OK);
    ck_assert(got[0] == val(1, 1, 69998) && got[1] == val(1, 1, 69999));
    fsdp_ckpt_reader_close(r);
    /* a reader of the master alone takes whatever the file holds */
    fsdp_ckpt_shard_info any = info;
    any.n_arrays = 0;
    any.array_names = NULL;
    ck_assert_int_eq(fsdp_ckpt_reader_open(&r, path, &any), FSDP_STATUS_OK);
    ck_assert_int_eq(fsdp_ckpt_reader_n_arrays(r), 2);
    ck_assert_str_eq(fsdp_ckpt_reader_array_name(r, 1), "momentum");
    fsdp_ckpt_reader_close(r);
    /* a reader that expects AdamW's arrays is told what the file holds */
    const char *adamw[] = {"master", "adam_m", "adam_v"};
    fsdp_ckpt_shard_info ex = info;
    ex.n_arrays = 3;
    ex.array_names = adamw;
    ck_assert_int_eq(fsdp_ckpt_reader_open(&r, path, &ex), FSDP_STATUS_FORMAT);
    REQUIRE(strstr(fsdp_error_msg(), "(master, momentum)") &&
                strstr(fsdp_error_msg(), "(master, adam_m, adam_v)") && strstr(fsdp_error_msg(), path),
            "%s", fsdp_error_msg());
    const char *renamed[] = {"master", "velocity"};
    ex.n_arrays = 2;
    ex.array_names = renamed;
    ck_assert_int_eq(fsdp_ckpt_reader_open(&r, path, &ex), FSDP_STATUS_FORMAT);

    /* lists a writer refuses */
    const char *no_master[] = {"momentum", "master"};
    const char *twice[] = {"master", "m", "m"};
    const char *bad_char[] = {"master", "Adam-M"};
    const char *too_long[] = {"master", "a_name_far_longer_than_23_chars"};
    const char *many[] = {"master", "a", "b", "c", "d", "e", "f", "g", "h"};
    struct {
        const char *const *names;
        int n;
        const char *expect;
    } refused[] = {
        {no_master, 2, "not 'master'"}, {twice, 3, "twice"},   {bad_char, 2, "valid name"},
        {too_long, 2, "valid name"},    {many, 9, "arrays per unit"}, {sgd, -1, "arrays per unit"},
    };
    for (size_t k = 0; k < sizeof refused / sizeof refused[0]; k++) {
        fsdp_ckpt_shard_info bad = info;
        bad.n_arrays = refused[k].n;
        bad.array_names = refused[k].names;
        fsdp_ckpt_writer *w = (fsdp_ckpt_writer *)1;
        ck_assert_int_eq(fsdp_ckpt_writer_open(&w, path, &bad), FSDP_STATUS_INVALID_ARG);
        ck_assert_ptr_null(w);
        REQUIRE(strstr(fsdp_error_msg(), refused[k].expect), "case %zu: %s", k,
                fsdp_error_msg());
    }
    /* damage in the name table (a padding byte of "master"): the header
     * checksum covers it */
    flip_byte(path, 72 + 20, false);
    ck_assert_int_eq(fsdp_ckpt_reader_open(&r, path, &info), FSDP_STATUS_FORMAT);
    REQUIRE(strstr(fsdp_error_msg(), "header checksum"), "%s", fsdp_error_msg());
}
END_TEST

/* ---- the version-1 fixture ---------------------------------------------------- */

static void cfg_tiny(fsdp_train_config *c, const char *ck, int devices, int batch, int accum)
{
    train_config_cpu(c, "tiny", devices);
    c->eng.batch = batch;
    c->eng.grad_accum = accum;
    c->eng.deterministic = true;
    c->steps = 4;
    c->n_samples = 0;
    c->keep_params = true;
    c->ckpt_dir = ck;
    c->resume = true;
}

static void expect_identical(const fsdp_train_result *a, const fsdp_train_result *b,
                             const char *what)
{
    REQUIRE(a->first_step == b->first_step && a->steps == b->steps, "%s: steps differ", what);
    for (int s = a->first_step; s < a->steps; s++)
        REQUIRE(!memcmp(&a->losses[s], &b->losses[s], 4), "%s: step %d loss %.9g vs %.9g", what,
                s + 1, a->losses[s], b->losses[s]);
    fsdp_model m;
    ck_assert_int_eq(fsdp_model_from_spec("tiny", &m), FSDP_STATUS_OK);
    for (int u = 0; u < m.n_units; u++)
        REQUIRE(!memcmp(a->params[u], b->params[u], m.units[u].numel * 4),
                "%s: unit %s parameters differ", what, m.units[u].name);
    fsdp_model_free(&m);
}

/* Copy the fixture's step directory into dir/step_00000002. */
static void copy_fixture(const char *dir)
{
    char p[256], q[256];
    pathf(p, sizeof p, "%s/step_00000002", dir);
    ck_assert_int_eq(mkdir(dir, 0755), 0);
    ck_assert_int_eq(mkdir(p, 0755), 0);
    const char *files[] = {"manifest", "rank_00000.bin", "rank_00001.bin", "DONE"};
    for (int i = 0; i < 4; i++) {
        pathf(p, sizeof p, "%s/%s", V1_STEP, files[i]);
        pathf(q, sizeof q, "%s/step_00000002/%s", dir, files[i]);
        copy_file(p, q);
    }
}

/* Rewrite the checkpoint in dir in today's formats (manifest with optimizer
 * lines, version-2 shard files), through the readers and writers alone. */
static void reencode(const char *dir)
{
    char p[256];
    fsdp_ckpt_manifest man;
    pathf(p, sizeof p, "%s/step_00000002/manifest", dir);
    REQUIRE(fsdp_ckpt_manifest_read(p, &man) == FSDP_STATUS_OK, "%s", fsdp_error_msg());
    ck_assert_str_eq(man.optimizer, "adamw"); /* no optimizer line: AdamW */
    ck_assert_int_eq(fsdp_ckpt_manifest_write(p, &man), FSDP_STATUS_OK);
    size_t shard[8], first[8];
    for (int u = 0; u < man.n_units; u++)
        shard[u] = man.units[u].shard_numel;
    float *buf = malloc(FSDP_CKPT_BLOCK_NUMEL * sizeof(float));
    for (int k = 0; k < man.world_size; k++) {
        for (int u = 0; u < man.n_units; u++)
            first[u] = fsdp_ckpt_shard_first(&man, u, k);
        fsdp_ckpt_shard_info info = {.run_id = man.run_id, .step = man.step,
                                     .adam_t = man.adam_t, .rank = k,
                                     .world_size = man.world_size, .n_units = man.n_units,
                                     .shard_numel = shard, .first = first};
        fsdp_ckpt_reader *r;
        char in[256], out[256];
        pathf(in, sizeof in, "%s/step_00000002/rank_%05d.bin", dir, k);
        pathf(out, sizeof out, "%s.v2", in);
        REQUIRE(fsdp_ckpt_reader_open(&r, in, &info) == FSDP_STATUS_OK, "%s", fsdp_error_msg());
        ck_assert_int_eq(fsdp_ckpt_reader_version(r), 1);
        ck_assert_int_eq(fsdp_ckpt_reader_n_arrays(r), 3);
        ck_assert_str_eq(fsdp_ckpt_reader_array_name(r, 1), "adam_m");
        fsdp_ckpt_writer *w;
        ck_assert_int_eq(fsdp_ckpt_writer_open(&w, out, &info), FSDP_STATUS_OK);
        size_t v_nonzero = 0;
        for (int u = 0; u < man.n_units; u++)
            for (int a = 0; a < 3; a++)
                for (size_t b = 0, lo = 0; lo < shard[u]; b++, lo += FSDP_CKPT_BLOCK_NUMEL) {
                    size_t n = shard[u] - lo < FSDP_CKPT_BLOCK_NUMEL ? shard[u] - lo
                                                                    : FSDP_CKPT_BLOCK_NUMEL;
                    REQUIRE(fsdp_ckpt_reader_read(r, u, a, lo, n, buf) == FSDP_STATUS_OK, "%s",
                            fsdp_error_msg());
                    for (size_t i = 0; a == FSDP_CKPT_ADAM_V && i < n; i++) {
                        REQUIRE(buf[i] >= 0.0f, "adam_v[%zu] = %g < 0", i, buf[i]);
                        v_nonzero += buf[i] > 0.0f;
                    }
                    ck_assert_int_eq(fsdp_ckpt_writer_put(w, u, a, b, buf), FSDP_STATUS_OK);
                }
        REQUIRE(v_nonzero > 1000, "rank %d: only %zu non-zero second moments", k, v_nonzero);
        ck_assert_int_eq(fsdp_ckpt_writer_close(w), FSDP_STATUS_OK);
        fsdp_ckpt_reader_close(r);
        ck_assert_int_eq(rename(out, in), 0);
    }
    free(buf);
    fsdp_ckpt_manifest_free(&man);
}

/* The version-1 fixture resumes as AdamW state: the same run as from its
 * re-encoding in today's formats, on 2 devices, and on 1 device with
 * offload (the determinism contract), and it refuses another optimizer. */
START_TEST(test_v1_fixture_resumes)
{
    char a[96], b[96], c[96];
    fsdp_test_path(a, sizeof a, "v1");
    fsdp_test_path(b, sizeof b, "v2");
    fsdp_test_path(c, sizeof c, "v1_offload");
    copy_fixture(a);
    copy_fixture(b);
    copy_fixture(c);
    reencode(b);
    fsdp_train_config cfg;
    fsdp_train_result ra, rb, rc;
    cfg_tiny(&cfg, a, 2, 2, 1);
    run_ok(&cfg, &ra);
    ck_assert_int_eq(ra.first_step, 2);
    ck_assert_int_eq(ra.steps, 4);
    cfg_tiny(&cfg, b, 2, 2, 1);
    run_ok(&cfg, &rb);
    expect_identical(&ra, &rb, "v1 vs its v2 re-encoding");
    cfg_tiny(&cfg, c, 1, 2, 2);
    cfg.eng.offload = true;
    run_ok(&cfg, &rc);
    expect_identical(&ra, &rc, "v1 on 2 devices vs 1 device with offload");
    /* the new checkpoints are version 2 */
    char p[160];
    pathf(p, sizeof p, "%s/step_00000004/rank_00000.bin", a);
    char *head = slurp(p);
    uint32_t version;
    memcpy(&version, head + 8, 4);
    ck_assert_uint_eq(version, 2);
    free(head);
    fsdp_train_result_free(&ra);
    fsdp_train_result_free(&rb);
    fsdp_train_result_free(&rc);
    /* a version-1 checkpoint is AdamW's: SGD may not resume from it */
    fsdp_test_path(p, sizeof p, "v1_sgd");
    copy_fixture(p);
    cfg_tiny(&cfg, p, 2, 2, 1);
    cfg.eng.optim = &fsdp_optim_sgd;
    fsdp_status st = fsdp_train_run(&cfg, &ra);
    ck_assert_int_eq(st, FSDP_STATUS_INVALID_ARG);
    REQUIRE(strstr(fsdp_error_msg(), "--optimizer adamw"), "%s", fsdp_error_msg());
    fsdp_train_result_free(&ra);
}
END_TEST

/* ---- corruption the version-1 sum let through ----------------------------------- */

/* Version 1's block sum, as it was. */
static uint64_t v1_sum(const void *p, size_t n)
{
    const unsigned char *c = p;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, c + i, 8);
        h = (h ^ w) * 1099511628211ull;
    }
    return h; /* n is a multiple of 8 here */
}

/* Negate 1000 parameters (every other one, so each 8-byte word's high
 * float) in the first block of unit 0's master in rank 0's file: an even
 * number of sign flips, which the version-1 sum cannot see. */
START_TEST(test_sign_flips_refused)
{
    char dir[128], ck[96], p[192], out[8192];
    fsdp_test_mkdir(dir, sizeof dir, "shard");
    pathf(ck, sizeof ck, "%s/ck", dir);
    fsdp_train_config cfg;
    fsdp_train_result r;
    cfg_tiny(&cfg, ck, 2, 2, 1);
    cfg.model = SPEC;
    cfg.resume = false;
    cfg.steps = 2;
    cfg.keep_params = false;
    run_ok(&cfg, &r);
    fsdp_train_result_free(&r);

    fsdp_ckpt_manifest man;
    pathf(p, sizeof p, "%s/step_00000002/manifest", ck);
    ck_assert_int_eq(fsdp_ckpt_manifest_read(p, &man), FSDP_STATUS_OK);
    int U = man.n_units, A = 3;
    size_t sums = 0;
    for (int u = 0; u < U; u++)
        sums += (size_t)A * ((man.units[u].shard_numel + FSDP_CKPT_BLOCK_NUMEL - 1) /
                             FSDP_CKPT_BLOCK_NUMEL);
    size_t payload = (72 + (size_t)A * 24 + 16 * (size_t)U + 8 * sums + 63) / 64 * 64;
    size_t S = man.units[0].shard_numel;
    REQUIRE(S >= 2000, "unit 0's shard has %zu elements", S);
    size_t len = (S < FSDP_CKPT_BLOCK_NUMEL ? S : FSDP_CKPT_BLOCK_NUMEL) * 4;
    fsdp_ckpt_manifest_free(&man);

    pathf(p, sizeof p, "%s/step_00000002/rank_00000.bin", ck);
    size_t size;
    char *file = slurp_n(p, &size);
    REQUIRE(payload + len <= size, "layout: payload %zu + %zu > %zu", payload, len, size);
    float *blk = (float *)(file + payload);
    uint64_t before = v1_sum(blk, len);
    int flipped = 0;
    for (size_t i = 1; flipped < 1000; i += 2, flipped++) {
        REQUIRE(blk[i] != 0.0f, "parameter %zu is zero", i);
        blk[i] = -blk[i];
    }
    ck_assert_uint_eq(v1_sum(blk, len), before); /* the old sum is blind to it */
    spit(p, file, size);
    free(file);

    /* convert, eval and resume all refuse, naming the file and the checksum */
    char args[512];
    pathf(args, sizeof args, "convert %s %s/out.bin", ck, dir);
    int rc = fsdp_test_cli(out, sizeof out, "%s", args);
    REQUIRE(rc != 0 && strstr(out, "checksum") && strstr(out, "rank_00000.bin"),
            "convert exited %d:\n%s", rc, out);
    pathf(args, sizeof args, "%s/out.bin", dir);
    REQUIRE(!exists(args), "convert left %s behind", args);
    pathf(args, sizeof args, "eval --model %s --data synthetic --batch 2 --seq 16 --steps 2", ck);
    rc = fsdp_test_cli(out, sizeof out, "%s", args);
    REQUIRE(rc != 0 && strstr(out, "checksum") && strstr(out, "rank_00000.bin"),
            "eval exited %d:\n%s", rc, out);
    cfg_tiny(&cfg, ck, 2, 2, 1);
    cfg.model = SPEC;
    cfg.keep_params = false;
    fsdp_status st = fsdp_train_run(&cfg, &r);
    fsdp_train_result_free(&r);
    REQUIRE(st == FSDP_STATUS_FORMAT && strstr(fsdp_error_msg(), "checksum") &&
                strstr(fsdp_error_msg(), "rank_00000.bin"),
            "resume: %s: %s", fsdp_status_name(st), fsdp_error_msg());
    pathf(args, sizeof args, "train --model %s --devices 2 --batch 2 --seq 16 --steps 4 --eval 0 "
          "--ckpt-dir %s --resume", SPEC, ck);
    rc = fsdp_test_cli(out, sizeof out, "%s", args);
    REQUIRE(rc != 0 && strstr(out, "checksum"), "train --resume exited %d:\n%s", rc, out);
}
END_TEST

int main(void)
{
    const fsdp_test_tcase tcases[] = {
        {"format", 120, .tmpdir = true,
         FSDP_TESTS(test_shard_file_blocks, test_shard_file_named_arrays)},
        {"compat", 300, .tmpdir = true,
         FSDP_TESTS(test_v1_fixture_resumes, test_sign_flips_refused)},
    };
    return fsdp_test_main("shard_file", tcases, FSDP_TEST_LEN(tcases));
}
