/*
 * test_engine_device.c - what the engine promises the device layer, checked
 * on the cpu and meta backends (test_engine.c holds the numerics):
 *
 * - teardown after a failure, with the fault hook: fsdp_engine_free stops
 *   the rank (its stop hook, core/world.h) before it frees anything, with
 *   the failure of init or of the step, and the world hears of the failure
 *   then, not after the teardown. On a GPU the stop is ncclCommAbort, and a
 *   free before it would wait for a collective kernel that waits for the
 *   failed rank (test_cuda_comm.c has the GPU side);
 * - the warm-up: init reserves (fsdp_device_reserve) every buffer the step
 *   allocates, as many of each size as the step holds at once, for every
 *   strategy, prefetch, placement and accumulation depth, so a cuda run
 *   never asks the driver for memory in a step (the device's warm-up
 *   ledger counts the same on every backend; test_cuda.c checks the block
 *   cache itself on a GPU);
 * - a forward's length: fsdp_engine_forward on rows shorter than the
 *   engine's seq runs at their length, with the logits of the full length
 *   up to float rounding, the same bits call after call, and refuses a
 *   length or position outside the rows.
 */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/rng.h"
#include "core/world.h"
#include "data/data.h"
#include "device/device.h"
#include "engine/engine.h"
#include "models/lora.h"
#include "models/registry.h"
#include "testutil.h"

#define N_RANKS 2
#define MAX_RANKS 4

/* What one rank saw. */
struct probe {
    fsdp_world *w;
    const fsdp_engine_shared *sh;
    int rank;
    fsdp_engine *e;            /* once init returned it */
    int n_stops;
    size_t frees_at_stop;      /* device and host frees when the stop hook ran */
    bool aborted_at_stop;      /* the world knew of the failure by then */
    bool shards_at_stop;       /* unit 0's shards were still allocated */
    size_t frees_at_return;    /* when the failed call returned, before fsdp_engine_free */
    size_t allocs_after_init;  /* device and host allocations made by init */
    fsdp_status init_st, st;
};

struct probe_run {
    fsdp_engine_shared *sh;
    int steps;
    struct probe p[N_RANKS];
};

static size_t n_frees(const fsdp_device *d)
{
    return (d->mem.n_allocs - d->mem.n_live) + (d->host.n_allocs - d->host.n_live);
}

static void probe_stop(void *arg)
{
    struct probe *p = arg;
    p->n_stops++;
    p->frees_at_stop = p->e ? n_frees(fsdp_engine_device(p->e)) : SIZE_MAX;
    p->aborted_at_stop = fsdp_world_aborted(p->w);
    p->shards_at_stop = p->sh->sm.units[0].rows[p->rank].master != NULL;
}

static fsdp_status probe_rank(fsdp_world *w, int rank, void *arg)
{
    struct probe_run *run = arg;
    struct probe *p = &run->p[rank];
    memset(p, 0, sizeof *p);
    p->w = w;
    p->sh = run->sh;
    p->rank = rank;
    if (fsdp_world_add_rank_stop(w, rank, probe_stop, p) != FSDP_STATUS_OK)
        return FSDP_STATUS_INTERNAL;
    fsdp_engine *e = NULL;
    p->init_st = fsdp_engine_init(&e, run->sh, rank);
    p->st = p->init_st;
    if (p->st != FSDP_STATUS_OK)
        return p->st;
    const fsdp_device *d = fsdp_engine_device(e);
    p->allocs_after_init = d->mem.n_allocs + d->host.n_allocs;
    p->e = e;
    fsdp_step_result res;
    for (int s = 0; s < run->steps && p->st == FSDP_STATUS_OK; s++)
        p->st = fsdp_engine_step(e, (uint64_t)s, 1e-3f, &res);
    p->frees_at_return = n_frees(d);
    fsdp_engine_free(e);
    return p->st;
}

struct setup {
    fsdp_model m;
    fsdp_data *data;
    fsdp_world *w;
    fsdp_engine_shared sh;
};

static void setup_open(struct setup *s)
{
    memset(s, 0, sizeof *s);
    ck_assert_int_eq(fsdp_model_from_spec("tiny", &s->m), FSDP_STATUS_OK);
    ck_assert_int_eq(fsdp_data_open(&s->data, "synthetic", s->m.vocab_size, 7), FSDP_STATUS_OK);
    ck_assert_int_eq(fsdp_world_init(&s->w, N_RANKS), FSDP_STATUS_OK);
    fsdp_engine_config c = {.backend = FSDP_BACKEND_CPU, .n_ranks = N_RANKS,
                            .shard = FSDP_SHARD_FULL, .compute_dtype = FSDP_DTYPE_F32,
                            .prefetch = true, .batch = 2, .seq = 16, .grad_accum = 1,
                            .clip = 1.0f, .seed = 1}; /* AdamW at its defaults */
    ck_assert_msg(fsdp_engine_shared_init(&s->sh, &c, &s->m, s->data, s->w) == FSDP_STATUS_OK,
                  "%s", fsdp_error_msg());
}

static void setup_close(struct setup *s)
{
    fsdp_engine_shared_free(&s->sh);
    fsdp_world_free(s->w);
    fsdp_data_close(s->data);
    fsdp_model_free(&s->m);
}

/* A failure in the step (the second allocation after init on rank 1):
 * both ranks stop before their first free, the failing one with its own
 * status, the other after the abort it saw; the failure the user sees is
 * the injected one. A clean run stops nobody. */
START_TEST(test_step_failure_stops_before_any_free)
{
    struct setup s;
    setup_open(&s);
    struct probe_run run = {.sh = &s.sh, .steps = 2};
    ck_assert_msg(fsdp_world_launch(s.w, probe_rank, &run) == FSDP_STATUS_OK, "%s",
                  fsdp_error_msg());
    for (int r = 0; r < N_RANKS; r++)
        ck_assert_int_eq(run.p[r].n_stops, 0);
    size_t init_allocs = run.p[1].allocs_after_init;
    ck_assert_uint_gt(init_allocs, 0);

    fsdp_world_set_fault(s.w, FSDP_FAULT_ALLOC, 1, (long)init_allocs + 2);
    fsdp_status st = fsdp_world_launch(s.w, probe_rank, &run);
    ck_assert_int_eq(st, FSDP_STATUS_OOM);
    ck_assert_msg(strstr(fsdp_error_msg(), "rank 1: device 1: injected allocation failure"), "%s",
                  fsdp_error_msg());
    ck_assert_int_eq(run.p[1].init_st, FSDP_STATUS_OK);
    ck_assert_int_eq(run.p[1].st, FSDP_STATUS_OOM);
    ck_assert_int_eq(run.p[0].st, FSDP_STATUS_ABORTED);
    for (int r = 0; r < N_RANKS; r++) {
        struct probe *p = &run.p[r];
        ck_assert_int_eq(p->n_stops, 1);
        ck_assert_msg(p->frees_at_stop == p->frees_at_return,
                      "rank %d: %zu frees before its stop, %zu when the step failed", r,
                      p->frees_at_stop, p->frees_at_return);
        ck_assert(p->aborted_at_stop);
        ck_assert(p->shards_at_stop);
    }
    fsdp_world_set_fault(s.w, FSDP_FAULT_ALLOC, 1, 0);
    setup_close(&s);
}
END_TEST

/* A failure in init (rank 1's third allocation): init's own teardown stops
 * the rank before it releases the shards it made, and the world knows. */
START_TEST(test_init_failure_stops_before_any_free)
{
    struct setup s;
    setup_open(&s);
    struct probe_run run = {.sh = &s.sh, .steps = 1};
    fsdp_world_set_fault(s.w, FSDP_FAULT_ALLOC, 1, 3);
    fsdp_status st = fsdp_world_launch(s.w, probe_rank, &run);
    ck_assert_int_eq(st, FSDP_STATUS_OOM);
    ck_assert_msg(strstr(fsdp_error_msg(), "rank 1: device 1: injected allocation failure"), "%s",
                  fsdp_error_msg());
    struct probe *p = &run.p[1];
    ck_assert_int_eq(p->init_st, FSDP_STATUS_OOM);
    ck_assert_int_eq(p->n_stops, 1);
    ck_assert(p->aborted_at_stop);
    ck_assert_msg(p->shards_at_stop, "rank 1's shards were released before its stop");
    /* teardown did release them afterwards */
    ck_assert_ptr_null(s.sh.sm.units[0].rows[1].master);
    fsdp_world_set_fault(s.w, FSDP_FAULT_ALLOC, 1, 0);
    setup_close(&s);
}
END_TEST

/* ---- the warm-up covers the step --------------------------------------------- */

struct warm_probe {
    size_t n_resv, misses, step_allocs, resv_allocs;
    size_t slack;              /* reserved beyond the most ever live, all sizes */
    fsdp_status st;
};

struct warm_run {
    fsdp_engine_shared *sh;
    struct warm_probe p[MAX_RANKS];
};

static size_t ledger_allocs(const fsdp_device *d)
{
    size_t n = 0;
    for (size_t i = 0; i < d->n_resv; i++)
        n += d->resv[i].n_allocs;
    return n;
}

/* init, then three steps (forwards for an inference engine): the
 * allocations they made, those of them the ledger saw, and what it saw at
 * most at once. */
static fsdp_status warm_rank(fsdp_world *w, int rank, void *arg)
{
    (void)w;
    struct warm_run *run = arg;
    struct warm_probe *p = &run->p[rank];
    memset(p, 0, sizeof *p);
    fsdp_engine *e = NULL;
    p->st = fsdp_engine_init(&e, run->sh, rank);
    if (p->st != FSDP_STATUS_OK)
        return p->st;
    const fsdp_device *d = fsdp_engine_device(e);
    size_t a0 = d->mem.n_allocs, r0 = ledger_allocs(d);
    fsdp_step_result res;
    float loss;
    for (int s = 0; s < 3 && p->st == FSDP_STATUS_OK; s++)
        p->st = run->sh->cfg.inference
                    ? fsdp_engine_forward_batch(e, (uint64_t)s, &loss, NULL)
                    : fsdp_engine_step(e, (uint64_t)s, 1e-3f, &res);
    p->n_resv = d->n_resv;
    p->misses = d->n_resv_misses;
    p->step_allocs = d->mem.n_allocs - a0;
    p->resv_allocs = ledger_allocs(d) - r0;
    for (size_t i = 0; i < d->n_resv; i++)
        p->slack += d->resv[i].n - d->resv[i].peak_live;
    fsdp_engine_free(e);
    return p->st;
}

/* Every allocation a step makes has a reserved size, no size is ever live
 * more often than reserved, and nothing is reserved that is never used
 * but the one gradient buffer that prefetch adds (the blocks of both
 * models are of one size): strategies x prefetch x placement x micro-steps
 * (or an inference engine's forwards) x precision x ranks on meta, for
 * GPT-2 and Llama, and a corner of it on cpu (the same counts: the planner
 * is byte-exact against cpu). Returns how many configurations ran. */
static int warm_matrix(const char *model, bool with_cpu, bool qlora)
{
    fsdp_model m;
    ck_assert_int_eq(fsdp_model_from_spec(model, &m), FSDP_STATUS_OK);
    if (qlora) { /* adapters on every linear layer of an NF4 base (train/adapt.c's marking) */
        fsdp_lora_config lc = {.r = 4, .alpha = 8, .targets = "all-linear"};
        ck_assert_int_eq(fsdp_model_add_lora(&m, &lc), FSDP_STATUS_OK);
        for (int u = 0; u < m.n_units; u++)
            for (int i = 0; i < m.units[u].n_params; i++)
                m.units[u].params[i].nf4 = fsdp_lora_is_linear_weight(&m, u, i);
        ck_assert_int_eq(fsdp_model_relayout(&m), FSDP_STATUS_OK);
    }
    fsdp_data *data = NULL;
    ck_assert_int_eq(fsdp_data_open(&data, "synthetic", m.vocab_size, 7), FSDP_STATUS_OK);
    const fsdp_shard_strategy shards[] = {FSDP_SHARD_FULL, FSDP_SHARD_GRAD_OP, FSDP_SHARD_NONE};
    int n_runs = 0;
    for (int b = 0; b < 2; b++)
    for (int si = 0; si < 3; si++)
    for (int prefetch = 0; prefetch < 2; prefetch++)
    for (int offload = 0; offload < 4; offload++) /* fsdp_offload_names' values */
    for (int A = 0; A <= 5; A++) /* 0: an inference engine */
    for (int flat = 0; flat < 2; flat++) /* --accum flat: 3 and 4 micro-steps */
    for (int prec = 0; prec < 2; prec++)
    for (int N = 1; N <= 3; N += 2) {
        if (flat && A != 3 && A != 4)
            continue;
        fsdp_backend backend = b ? FSDP_BACKEND_CPU : FSDP_BACKEND_META;
        if (backend == FSDP_BACKEND_CPU &&
            (!with_cpu || prec || A == 2 || A > 3 || (N == 1 && si)))
            continue;
        if (A == 0 && (offload || prefetch || si))
            continue; /* inference gathers as full does; no placement, no prefetch */
        if (offload == 2 && !qlora)
            continue; /* params alone moves frozen shards: refused with none (engine.c) */
        fsdp_world *w = NULL;
        ck_assert_int_eq(fsdp_world_init(&w, N), FSDP_STATUS_OK);
        fsdp_engine_config c = {.backend = backend, .n_ranks = N, .shard = shards[si],
                                .compute_dtype = prec ? FSDP_DTYPE_BF16 : FSDP_DTYPE_F32,
                                .prefetch = prefetch, .offload = offload & 1,
                                .offload_params = offload & 2, .batch = 2,
                                .seq = 16, .grad_accum = A ? A : 1, .inference = A == 0,
                                .clip = 1.0f, .seed = 1, /* AdamW at its defaults */
                                .accum = flat ? FSDP_ACCUM_FLAT : FSDP_ACCUM_TREE};
        fsdp_engine_shared sh;
        ck_assert_int_eq(fsdp_engine_shared_init(&sh, &c, &m, data, w), FSDP_STATUS_OK);
        struct warm_run run = {.sh = &sh};
        ck_assert_msg(fsdp_world_launch(w, warm_rank, &run) == FSDP_STATUS_OK, "%s",
                      fsdp_error_msg());
        for (int r = 0; r < N; r++) {
            const struct warm_probe *p = &run.p[r];
            char what[200];
            snprintf(what, sizeof what,
                     "%s on %s, %d ranks, shard %d, prefetch %d, offload %d, A %d (0: "
                     "inference)%s, %s, rank %d",
                     model, fsdp_backend_name(backend), N, (int)shards[si], prefetch, offload, A,
                     flat ? " flat" : "", fsdp_dtype_name(c.compute_dtype), r);
            ck_assert_msg(p->n_resv > 0, "%s: nothing reserved", what);
            ck_assert_msg(p->step_allocs > 0, "%s: the steps allocated nothing", what);
            ck_assert_msg(p->resv_allocs == p->step_allocs,
                          "%s: %zu of the steps' %zu allocations have a size not reserved", what,
                          p->step_allocs - p->resv_allocs, p->step_allocs);
            ck_assert_msg(p->misses == 0,
                          "%s: %zu allocations found every reserved buffer of their size live",
                          what, p->misses);
            ck_assert_msg(p->slack == (size_t)(prefetch && A),
                          "%s: %zu reserved buffers were never used (want %d)", what, p->slack,
                          prefetch && A);
        }
        fsdp_engine_shared_free(&sh);
        fsdp_world_free(w);
        n_runs++;
    }
    fsdp_data_close(data);
    fsdp_model_free(&m);
    return n_runs;
}

START_TEST(test_warm_up_covers_the_step)
{
    ck_assert_int_gt(warm_matrix("tiny", true, false), 150);
    ck_assert_int_gt(warm_matrix("llama-tiny", false, false), 150);
    ck_assert_int_gt(warm_matrix("llama-tiny", false, true), 250);
}
END_TEST

/* ---- a forward's length -------------------------------------------------- */

#define LEN_SEQ 32   /* the engine's */
#define LEN_SHORT 21 /* the short rows' */

struct len_rank {
    float *full, *shorter, *again; /* (2, Vp) logits at positions {9, 20} */
    fsdp_status zero_st, long_st, pos_st;
    char pos_msg[200];
};

struct len_run {
    fsdp_engine_shared *sh;
    int Vp, vocab;
    struct len_rank r[N_RANKS];
};

static fsdp_status len_rank_main(fsdp_world *w, int rank, void *arg)
{
    (void)w;
    struct len_run *run = arg;
    struct len_rank *p = &run->r[rank];
    int full[2 * LEN_SEQ], shorter[2 * LEN_SHORT], pos[2] = {9, LEN_SHORT - 1};
    for (int i = 0; i < 2 * LEN_SEQ; i++) /* the same rows on every rank */
        full[i] = (int)(fsdp_rng_u64(5, 0, (uint64_t)i) % (uint64_t)run->vocab);
    for (int b = 0; b < 2; b++)
        memcpy(shorter + b * LEN_SHORT, full + b * LEN_SEQ, LEN_SHORT * sizeof(int));
    fsdp_engine *e = NULL;
    FSDP_TRY(fsdp_engine_init(&e, run->sh, rank));
    fsdp_status st = fsdp_engine_forward(e, full, 2, LEN_SEQ, pos, p->full, NULL);
    if (st == FSDP_STATUS_OK)
        st = fsdp_engine_forward(e, shorter, 2, LEN_SHORT, pos, p->shorter, NULL);
    if (st == FSDP_STATUS_OK)
        st = fsdp_engine_forward(e, shorter, 2, LEN_SHORT, pos, p->again, NULL);
    if (st == FSDP_STATUS_OK) { /* refused before anything runs: every rank alike */
        p->zero_st = fsdp_engine_forward(e, shorter, 2, 0, pos, p->again, NULL);
        p->long_st = fsdp_engine_forward(e, full, 2, LEN_SEQ + 1, pos, p->again, NULL);
        int past[2] = {9, LEN_SHORT};
        p->pos_st = fsdp_engine_forward(e, shorter, 2, LEN_SHORT, past, p->again, NULL);
        snprintf(p->pos_msg, sizeof p->pos_msg, "%s", fsdp_error_msg());
    }
    fsdp_engine_free(e);
    return st;
}

/* The short rows' logits are the full rows' at the same positions within
 * float rounding (1e-4 of the largest), bit for bit the same in a second
 * call, and alike on both ranks; lengths 0 and seq + 1 and a position past
 * the rows are INVALID_ARG. GPT-2 and Llama (state_len), fp32 and bf16. */
START_TEST(test_forward_at_a_shorter_length)
{
    const char *models[] = {"tiny", "llama-tiny"};
    for (int mi = 0; mi < 2; mi++)
    for (int prec = 0; prec < 2; prec++) {
        fsdp_model m;
        ck_assert_int_eq(fsdp_model_from_spec(models[mi], &m), FSDP_STATUS_OK);
        fsdp_world *w = NULL;
        ck_assert_int_eq(fsdp_world_init(&w, N_RANKS), FSDP_STATUS_OK);
        fsdp_engine_config c = {.backend = FSDP_BACKEND_CPU, .n_ranks = N_RANKS,
                                .shard = FSDP_SHARD_FULL,
                                .compute_dtype = prec ? FSDP_DTYPE_BF16 : FSDP_DTYPE_F32,
                                .batch = 2, .seq = LEN_SEQ, .grad_accum = 1, .inference = true,
                                .seed = 3};
        fsdp_engine_shared sh;
        ck_assert_msg(fsdp_engine_shared_init(&sh, &c, &m, NULL, w) == FSDP_STATUS_OK, "%s",
                      fsdp_error_msg());
        struct len_run run = {.sh = &sh, .Vp = m.padded_vocab_size, .vocab = m.vocab_size};
        const size_t n = 2 * (size_t)run.Vp;
        for (int r = 0; r < N_RANKS; r++) {
            run.r[r].full = calloc(n, sizeof(float));
            run.r[r].shorter = calloc(n, sizeof(float));
            run.r[r].again = calloc(n, sizeof(float));
        }
        fsdp_world_launch(w, len_rank_main, &run); /* the refusals end it with their status */
        for (int r = 0; r < N_RANKS; r++) {
            const struct len_rank *p = &run.r[r];
            const char *what = models[mi];
            ck_assert_msg(p->zero_st == FSDP_STATUS_INVALID_ARG &&
                              p->long_st == FSDP_STATUS_INVALID_ARG &&
                              p->pos_st == FSDP_STATUS_INVALID_ARG,
                          "%s rank %d: %d %d %d", what, r, p->zero_st, p->long_st, p->pos_st);
            ck_assert_msg(strstr(p->pos_msg, "position 21 of 21"), "%s", p->pos_msg);
            double top = 0.0, diff = 0.0;
            for (size_t i = 0; i < n; i++) {
                top = fmax(top, fabs(p->full[i]));
                diff = fmax(diff, fabs((double)p->full[i] - p->shorter[i]));
            }
            ck_assert_msg(top > 0 && diff <= 1e-4 * top, "%s %s rank %d: %g of %g", what,
                          prec ? "bf16" : "fp32", r, diff, top);
            ck_assert_msg(!memcmp(p->shorter, p->again, n * sizeof(float)),
                          "%s %s rank %d: another call, other bits", what,
                          prec ? "bf16" : "fp32", r);
            ck_assert_msg(!memcmp(p->shorter, run.r[0].shorter, n * sizeof(float)),
                          "%s %s rank %d: not rank 0's bits", what, prec ? "bf16" : "fp32", r);
        }
        for (int r = 0; r < N_RANKS; r++)
            free(run.r[r].full), free(run.r[r].shorter), free(run.r[r].again);
        fsdp_engine_shared_free(&sh);
        fsdp_world_free(w);
        fsdp_model_free(&m);
    }
}
END_TEST

int main(void)
{
    const fsdp_test_tcase tcases[] = {
        {"teardown", 120,
         FSDP_TESTS(test_step_failure_stops_before_any_free,
                    test_init_failure_stops_before_any_free)},
        {"warm_up", 300, FSDP_TESTS(test_warm_up_covers_the_step)},
        {"forward_len", 120, FSDP_TESTS(test_forward_at_a_shorter_length)},
    };
    return fsdp_test_main("engine_device", tcases, FSDP_TEST_LEN(tcases));
}
