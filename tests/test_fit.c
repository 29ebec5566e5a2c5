/*
 * test_fit.c - `fsdp plan --fit` and the check of `fsdp train`: the
 * memory order the search prunes by holds in the engine; the search with
 * pruning gives exactly what measuring every candidate gives; a cap that
 * forces accumulation picks it and keeps the global batch; a cap nothing
 * fits says so with exit code 1; the ranking follows the cost model, whose
 * arithmetic is checked by hand; the chosen command runs on the cpu backend
 * within the cap; the JSON; train refusing a run before it allocates; the
 * cuda overheads' constants agree with the cuda code.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/json.h"
#include "model_rig.h"
#include "models/registry.h"
#include "report/fit_report.h"
#include "testutil.h"
#include "train/fit.h"

/* Sanitizer builds run fewer shapes (the checks stay). */
#define SMALL_RUN (FSDP_TEST_TSAN || FSDP_TEST_ASAN)

static char out[1 << 18];

static void base_config(fsdp_train_config *c, const char *model, int devices, int seq)
{
    fsdp_train_config_default(c);
    c->model = model;
    c->eng.n_ranks = devices;
    c->eng.seq = seq;
    c->out = NULL;
    c->eval_problems = 0;
}

/* A cpu request: tiny on 2 devices, seq 64, global batch 16 (micro-batches
 * 1, 2, 4, 8). */
static void tiny_request(fsdp_fit_request *req, size_t cap)
{
    fsdp_fit_request_default(req);
    base_config(&req->base, "tiny", 2, 64);
    req->global_batch = 16;
    req->device_mem = cap;
    req->host_mem = (size_t)1 << 40;
    req->backend = FSDP_BACKEND_CPU;
}

/* The configuration of candidate c of req. */
static void candidate_config(const fsdp_fit_request *req, const fsdp_fit_candidate *c,
                             fsdp_train_config *cfg)
{
    *cfg = req->base;
    cfg->eng.batch = c->batch;
    cfg->eng.grad_accum = c->grad_accum;
    cfg->eng.shard = c->shard;
    cfg->eng.offload = c->offload & 1; /* fsdp_offload_names' value */
    cfg->eng.offload_params = (c->offload & 2) != 0;
    cfg->eng.prefetch = c->prefetch;
    cfg->eng.accum = c->accum;
    cfg->eng.recompute = (fsdp_recompute)fsdp_fit_recompute_modes[c->recompute].value;
}

/* ---- the memory order the search prunes by -------------------------------------------------- */

/* peak of one setting, from its own meta run (recompute: base's) */
static size_t peak_of(const fsdp_train_config *base, int b, int A, int shard, int off, int pf)
{
    fsdp_train_config c = *base;
    c.eng.batch = b;
    c.eng.grad_accum = A;
    c.eng.shard = (fsdp_shard_strategy)shard;
    c.eng.offload = off & 1; /* fsdp_offload_names' value */
    c.eng.offload_params = (off & 2) != 0;
    c.eng.prefetch = pf;
    fsdp_plan p;
    ck_assert_msg(fsdp_plan_run(&c, 2, &p) == FSDP_STATUS_OK, "%s", fsdp_error_msg());
    size_t v = fsdp_plan_max_peak(&p, NULL);
    fsdp_plan_free(&p);
    return v;
}

/* At a fixed micro-batch and accumulation, one step along any ordered
 * dimension (shard full -> grad-op, offload optimizer,params -> optimizer ->
 * none, prefetch
 * off -> on, a recompute mode to one of a higher memory_rank) never lowers
 * the peak: the order fit.h's pruning relies on, for both families.
 * (NO_SHARD is not in it: on one device it holds less than grad-op.) */
START_TEST(test_fit_memory_order)
{
    static const char *const models[] = {
        "tiny", "custom:layers=3,heads=2,channels=48,vocab=300,context=32", "llama-tiny",
        "qwen2-tiny"};
    static const int devs[] = {1, 2, 4}, bas[][2] = {{1, 1}, {2, 3}, {4, 2}};
    const int n_dev = SMALL_RUN ? 2 : 3, R = fsdp_fit_n_recompute_modes;
    ck_assert_int_le(R, 4);
    for (size_t mi = 0; mi < FSDP_TEST_LEN(models); mi++)
        for (int di = 0; di < n_dev; di++)
            for (int k = 0; k < 3; k++)
                for (int prec = 0; prec < 2; prec++) {
                    fsdp_train_config base;
                    base_config(&base, models[mi], devs[di], 32);
                    base.eng.compute_dtype = (fsdp_dtype)prec;
                    static const int offs[] = {0, 1, 3}; /* none, optimizer, both */
                    size_t pk[4][3][3][2];
                    for (int rc = 0; rc < R; rc++)
                        for (int s = 0; s < 3; s++)
                            for (int o = 0; o < 3; o++)
                                for (int p = 0; p < 2; p++) {
                                    base.eng.recompute =
                                        (fsdp_recompute)fsdp_fit_recompute_modes[rc].value;
                                    pk[rc][s][o][p] =
                                        peak_of(&base, bas[k][0], bas[k][1], s, offs[o], p);
                                }
                    const char *what = models[mi];
                    for (int rc = 0; rc < R; rc++)
                        for (int s = 0; s < 3; s++)
                            for (int o = 0; o < 3; o++)
                                for (int p = 0; p < 2; p++) {
                                    const size_t v = pk[rc][s][o][p];
                                    if (s == FSDP_SHARD_FULL)
                                        ck_assert_msg(v <= pk[rc][FSDP_SHARD_GRAD_OP][o][p],
                                                      "%s, %d devices: full > grad-op", what,
                                                      devs[di]);
                                    if (o >= 1)
                                        ck_assert_msg(v <= pk[rc][s][o - 1][p],
                                                      "%s, %d devices: offload raises the peak",
                                                      what, devs[di]);
                                    if (p == 0)
                                        ck_assert_msg(v <= pk[rc][s][o][1],
                                                      "%s, %d devices: prefetch off > on", what,
                                                      devs[di]);
                                    for (int r2 = 0; r2 < R; r2++)
                                        if (fsdp_fit_recompute_modes[rc].memory_rank <
                                            fsdp_fit_recompute_modes[r2].memory_rank)
                                            ck_assert_msg(v <= pk[r2][s][o][p],
                                                          "%s, %d devices: recompute %s > %s",
                                                          what, devs[di],
                                                          fsdp_fit_recompute_modes[rc].name,
                                                          fsdp_fit_recompute_modes[r2].name);
                                }
                }
}
END_TEST

/* ---- the search is exact -------------------------------------------------------------------- */

/* Every candidate, judged independently from its own meta run: the
 * search's figures for those it measured, and those it pruned really are
 * over the device cap; the fitting set and the best are the brute-force
 * ones. */
static void check_exact(const fsdp_fit_request *req, const fsdp_fit_result *r)
{
    int n_fit = 0;
    for (int i = 0; i < r->n_cand; i++) {
        const fsdp_fit_candidate *c = &r->cand[i];
        fsdp_train_config cfg;
        candidate_config(req, c, &cfg);
        fsdp_plan p;
        ck_assert_msg(fsdp_plan_run(&cfg, 2, &p) == FSDP_STATUS_OK, "%s", fsdp_error_msg());
        int who;
        size_t peak = fsdp_plan_max_peak(&p, &who), host = 0;
        for (int d = 0; d < p.n_ranks; d++)
            host += p.ranks[d].host.peak_bytes +
                    (req->backend == FSDP_BACKEND_CPU ? p.ranks[d].mem.peak_bytes : 0);
        size_t extra = 0;
        if (req->backend == FSDP_BACKEND_CUDA) {
            fsdp_cuda_overhead oh;
            /* tiny: 4 heads, 32 channels, padded vocabulary 256 */
            fsdp_cost_shape s = {c->batch, cfg.eng.seq, 4, 32, 256};
            fsdp_cost_cuda_overhead(p.n_ranks, cfg.eng.compute_dtype, &s, p.ranks[who].mem.n_live,
                                    &oh);
            extra = oh.total_bytes;
        }
        bool fits = peak + extra <= req->device_mem && (!req->host_mem || host <= req->host_mem);
        n_fit += fits;
        if (c->pruned_by < 0) {
            ck_assert_uint_eq(c->peak_bytes, peak);
            ck_assert_uint_eq(c->device_bytes, peak + extra);
            ck_assert_uint_eq(c->host_bytes, host);
            ck_assert_int_eq(c->verdict == FSDP_FIT_FITS, fits);
        } else {
            ck_assert_msg(peak + extra > req->device_mem,
                          "candidate %d (batch %d, shard %d, offload %d, prefetch %d) was pruned "
                          "but fits: %zu + %zu <= %zu",
                          i, c->batch, c->shard, c->offload, c->prefetch, peak, extra,
                          req->device_mem);
            const fsdp_fit_candidate *by = &r->cand[c->pruned_by];
            ck_assert(by->pruned_by < 0 && by->verdict == FSDP_FIT_OVER_DEVICE);
            ck_assert(by->batch == c->batch && by->accum == c->accum &&
                      (by->shard == c->shard || (by->shard == FSDP_SHARD_FULL &&
                                                 c->shard == FSDP_SHARD_GRAD_OP)) &&
                      (by->offload & c->offload) == c->offload && by->prefetch <= c->prefetch);
        }
        fsdp_plan_free(&p);
    }
    ck_assert_int_eq(r->n_fits, n_fit);
}

/* tiny_request's chains: micro-batches 1, 2, 4, 8 with the tree, and 1, 2, 4
 * (8, 4 and 2 micro-steps) flat; flat at one micro-step is the tree's run */
#define TINY_CHAINS (4 + 3)

START_TEST(test_fit_exact_vs_every_candidate)
{
    /* caps from "everything fits" to "nothing fits", on cpu and cuda */
    static const size_t caps[] = {(size_t)64 << 20, (size_t)3 << 20, (size_t)1500 << 10,
                                  (size_t)1 << 20};
    for (int be = 0; be < 2; be++)
        for (size_t k = 0; k < FSDP_TEST_LEN(caps); k++) {
            fsdp_fit_request req;
            tiny_request(&req, caps[k]);
            req.jobs = 1 + (int)k; /* one to four micro-batches searched at once */
            if (be) {
                req.backend = FSDP_BACKEND_CUDA;
                req.device_mem += (size_t)2 << 30; /* above the fixed cuda overheads */
            }
            fsdp_fit_result r;
            ck_assert_int_eq(fsdp_fit_search(&req, &r), FSDP_STATUS_OK);
            ck_assert_int_eq(r.n_cand, TINY_CHAINS * 18 * fsdp_fit_n_recompute_modes);
            check_exact(&req, &r);
            fsdp_fit_free(&r);
        }
    /* the Llama family (llama-tiny has tiny's heads, width and padded
     * vocabulary, so check_exact's cuda shape holds too) */
    for (size_t k = 0; k < FSDP_TEST_LEN(caps); k++) {
        fsdp_fit_request req;
        tiny_request(&req, caps[k]);
        req.base.model = "llama-tiny";
        fsdp_fit_result r;
        ck_assert_int_eq(fsdp_fit_search(&req, &r), FSDP_STATUS_OK);
        ck_assert_int_eq(r.n_cand, TINY_CHAINS * 18 * fsdp_fit_n_recompute_modes);
        ck_assert_uint_eq(r.recompute_refused, 0);
        check_exact(&req, &r);
        fsdp_fit_free(&r);
    }
}
END_TEST

/* ---- a recompute mode the model refuses ------------------------------------------------------ */

/* A family without the recompute slots runs only none: the modes it
 * refuses are named, by the engine's message, and only they are left out
 * (the search leaves fsdp_fit_recompute_refused's modes out of its
 * settings, fit.c). The real families refuse none. */
START_TEST(test_fit_recompute_refused)
{
    /* the search's modes are spelled as the --recompute table spells them */
    for (int k = 0; k < fsdp_fit_n_recompute_modes; k++)
        ck_assert_str_eq(fsdp_fit_recompute_modes[k].name,
                         fsdp_names_name(&fsdp_recompute_names, fsdp_fit_recompute_modes[k].value));
    static const char *const models[] = {"tiny", "llama-tiny", "qwen2-tiny"};
    for (size_t i = 0; i < FSDP_TEST_LEN(models); i++) {
        fsdp_model m;
        ck_assert_int_eq(fsdp_model_from_spec(models[i], &m), FSDP_STATUS_OK);
        char why[256] = "x";
        ck_assert_uint_eq(fsdp_fit_recompute_refused(&m, 0, why, sizeof why), 0);
        ck_assert_str_eq(why, "");
        struct fsdp_model_i no_recompute;
        const struct fsdp_model_i *own = model_drop_recompute(&m, &no_recompute);
        unsigned want = 0;
        int first = -1;
        for (int k = 0; k < fsdp_fit_n_recompute_modes; k++)
            if (fsdp_fit_recompute_modes[k].value != FSDP_RECOMPUTE_NONE) {
                want |= 1u << k;
                if (first < 0)
                    first = k;
            }
        ck_assert_uint_eq(fsdp_fit_recompute_refused(&m, 0, why, sizeof why), want);
        char flag[64];
        snprintf(flag, sizeof flag, "--recompute %s:", fsdp_fit_recompute_modes[first].name);
        ck_assert_msg(strstr(why, flag) && strstr(why, m.name) &&
                          strstr(why, "use --recompute none"),
                      "%s", why);
        /* a mask: the refused modes among those asked about, named by the first of them */
        for (int k = 0; k < fsdp_fit_n_recompute_modes; k++) {
            unsigned got = fsdp_fit_recompute_refused(&m, 1u << k, why, sizeof why);
            ck_assert_uint_eq(got, want & (1u << k));
            snprintf(flag, sizeof flag, "--recompute %s:", fsdp_fit_recompute_modes[k].name);
            ck_assert_msg(got ? strstr(why, flag) != NULL : why[0] == '\0', "%s", why);
        }
        ck_assert_str_eq(fsdp_error_msg(), ""); /* the refusals leave no error behind */
        m.iface = own;
        fsdp_model_free(&m);
    }
}
END_TEST

/* Issue 13's report: Llama 3.1 70B on 8 x 141 GiB at T 4096 and a global
 * batch of 32 once said NOTHING FITS because the family's refusal of
 * --recompute block ruled out every setting of micro-batch 1. Micro-batch
 * 1 is judged now in every mode, by its own meta run or by pruning (2 and
 * 4 are too large a shape for the ops' int indexing: refused), and in bf16
 * with offload and block recompute it fits; the search takes well under a
 * second. */
START_TEST(test_fit_llama_70b)
{
    for (int prec = 0; prec < 2; prec++) {
        fsdp_fit_request req;
        fsdp_fit_request_default(&req);
        base_config(&req.base, "llama3.1-70b", 8, 4096);
        req.base.eng.compute_dtype = (fsdp_dtype)prec;
        req.global_batch = 32;
        req.device_mem = (size_t)141 << 30;
        req.host_mem = (size_t)2 << 40;
        fsdp_fit_result r;
        ck_assert_msg(fsdp_fit_search(&req, &r) == FSDP_STATUS_OK, "%s", fsdp_error_msg());
        ck_assert_uint_eq(r.recompute_refused, 0);
        /* micro-batch 1: every setting measured, or pruned by one measured over the cap */
        int judged[8] = {0}, n_runs_1 = 0;
        for (int i = 0; i < r.n_cand; i++) {
            const fsdp_fit_candidate *c = &r.cand[i];
            ck_assert_int_eq(c->verdict == FSDP_FIT_INVALID, c->batch > 1);
            if (c->batch != 1)
                continue;
            judged[c->recompute]++;
            n_runs_1 += c->pruned_by < 0;
            if (c->pruned_by >= 0)
                ck_assert_int_eq(r.cand[c->pruned_by].verdict, FSDP_FIT_OVER_DEVICE);
        }
        for (int k = 0; k < fsdp_fit_n_recompute_modes; k++)
            /* 18 settings, tree and flat (4 micro-steps) */
            ck_assert_msg(judged[k] == 36, "recompute %s: %d micro-batch-1 settings judged",
                          fsdp_fit_recompute_modes[k].name, judged[k]);
        ck_assert_int_ge(n_runs_1, 2); /* the least-memory sharded and NO_SHARD settings */
        if (prec) {
            ck_assert_int_ge(r.best, 0);
            const fsdp_fit_candidate *b = &r.cand[r.best];
            ck_assert_str_eq(fsdp_fit_recompute_modes[b->recompute].name, "block");
            ck_assert_uint_le(b->device_bytes, req.device_mem);
        }
        ck_assert_msg(r.wall_s < (SMALL_RUN ? 20.0 : 2.0), "the search took %.2f s", r.wall_s);
        fsdp_fit_free(&r);
    }
}
END_TEST

/* ---- answers -------------------------------------------------------------------------------- */

/* A cap under the largest micro-batch's smallest peak, above a smaller
 * one's: the answer accumulates, and keeps devices x batch x accum. */
START_TEST(test_fit_cap_forces_accumulation)
{
    fsdp_fit_request req;
    tiny_request(&req, 0);
    req.recompute_mask = FSDP_NAME_BIT(0); /* none: the memory below is without recompute */
    fsdp_train_config base = req.base;
    /* the least memory each micro-batch can run in: shard full, every shard offloaded,
     * prefetch off */
    size_t whole = peak_of(&base, 8, 1, FSDP_SHARD_FULL, 3, 0);
    size_t half = peak_of(&base, 4, 2, FSDP_SHARD_FULL, 3, 0);
    ck_assert_msg(half < whole, "precondition: batch 4 x 2 (%zu) under batch 8 x 1 (%zu)", half,
                  whole);
    req.device_mem = whole - 1;
    fsdp_fit_result r;
    ck_assert_int_eq(fsdp_fit_search(&req, &r), FSDP_STATUS_OK);
    ck_assert_int_ge(r.best, 0);
    const fsdp_fit_candidate *b = &r.cand[r.best];
    ck_assert_int_lt(b->batch, 8);
    ck_assert_int_gt(b->grad_accum, 1);
    ck_assert_int_eq(2 * b->batch * b->grad_accum, 16);
    ck_assert_uint_le(b->device_bytes, req.device_mem);
    /* every micro-batch-8 setting is excluded, most of them without a run */
    int pruned = 0;
    for (int i = 0; i < r.n_cand; i++)
        if (r.cand[i].batch == 8) {
            ck_assert_int_ne(r.cand[i].verdict, FSDP_FIT_FITS);
            pruned += r.cand[i].verdict == FSDP_FIT_PRUNED;
        }
    /* the 7 sharded settings above the failing least one; NO_SHARD is its own chain */
    ck_assert_int_ge(pruned, 7);
    ck_assert_int_lt(r.n_runs, r.n_cand);
    char cmd[1024];
    fsdp_fit_command(&req, b, cmd, sizeof cmd);
    char want[64];
    snprintf(want, sizeof want, "--batch %d --grad-accum %d ", b->batch, b->grad_accum);
    ck_assert_msg(strstr(cmd, want) && strstr(cmd, "--devices 2 --seq 64"), "%s", cmd);
    fsdp_fit_free(&r);
}
END_TEST

START_TEST(test_fit_nothing_fits)
{
    fsdp_fit_request req;
    tiny_request(&req, (size_t)64 << 10);
    fsdp_fit_result r;
    ck_assert_int_eq(fsdp_fit_search(&req, &r), FSDP_STATUS_OK);
    ck_assert_int_eq(r.best, -1);
    ck_assert_int_eq(r.n_fits, 0);
    /* two runs per chain: the least-memory sharded setting and the
     * least-memory NO_SHARD one fail, and rule out the other 10 */
    ck_assert_int_eq(r.n_runs, 2 * TINY_CHAINS);
    fsdp_fit_free(&r);
    int rc = fsdp_test_cli(out, sizeof out,
                           "plan --fit --target cpu --model tiny --devices 2 --seq 64 "
                           "--global-batch 16 --device-mem 64KiB");
    ck_assert_msg(rc == 1, "exit %d:\n%s", rc, out);
    ck_assert_msg(strstr(out, "NOTHING FITS") && strstr(out, "closest: batch") &&
                      strstr(out, "try more --devices") && !strstr(out, "fsdp train --"),
                  "%s", out);
    /* an over-host answer names --host-mem */
    rc = fsdp_test_cli(out, sizeof out,
                       "plan --fit --target cpu --model tiny --devices 2 --seq 64 "
                       "--global-batch 16 --device-mem 1GiB --host-mem 1MiB");
    ck_assert_msg(rc == 1 && strstr(out, "over the host memory") && strstr(out, "--host-mem"),
                  "exit %d:\n%s", rc, out);
}
END_TEST

/* ---- accumulation modes and the host ------------------------------------------------------- */

/* The README's 8B example: Llama 3.1 8B on 8 x 24 GiB, bf16, seq 2048, block
 * recompute, global batch 64. It fits only with optimizer offload (pinned
 * here, with shard full and prefetch off, to keep the search short), where
 * the accumulation lives in pinned host memory: 194 GiB of it as a tree, 139
 * GiB flat. On a 160 GiB host only flat fits, and the answer says so; on 256
 * GiB the tree fits and is chosen (same speed, exact for any split). */
START_TEST(test_fit_accum_modes)
{
    static const char *const host[] = {"160GiB", "256GiB"};
    for (int k = 0; k < 2; k++) {
        char cmd[512];
        snprintf(cmd, sizeof cmd,
                 "plan --fit --model llama3.1-8b --devices 8 --device-mem 24GiB --precision bf16 "
                 "--seq 2048 --recompute block --global-batch 64 --shard full --offload optimizer "
                 "--prefetch off --host-mem %s", host[k]);
        int rc = fsdp_test_cli(out, sizeof out, "%s", cmd);
        ck_assert_msg(rc == 0, "exit %d:\n%s", rc, out);
        ck_assert_msg(strstr(out, "as a tree (exact for any split of the global batch)") &&
                          strstr(out, k ? "the tree fits: --accum tree"
                                        : "the tree does not fit (over the host memory): "
                                          "--accum flat"),
                      "%s", out);
        const char *line = strstr(out, "\n  fsdp train ");
        ck_assert_msg(line && (strstr(line, "--accum flat") != NULL) == (k == 0), "%s", out);
    }
    /* the same through the API: the twin is measured, flat keeps less */
    fsdp_fit_request req;
    fsdp_fit_request_default(&req);
    base_config(&req.base, "llama3.1-8b", 8, 2048);
    req.base.eng.compute_dtype = FSDP_DTYPE_BF16;
    req.global_batch = 64;
    req.device_mem = (size_t)24 << 30;
    req.host_mem = (size_t)160 << 30;
    req.recompute_mask = FSDP_NAME_BIT(2); /* block */
    req.shard_mask = FSDP_NAME_BIT(FSDP_SHARD_FULL);
    req.offload_mask = FSDP_NAME_BIT(1);
    req.prefetch_mask = FSDP_NAME_BIT(0);
    fsdp_fit_result r;
    ck_assert_msg(fsdp_fit_search(&req, &r) == FSDP_STATUS_OK, "%s", fsdp_error_msg());
    ck_assert(r.best >= 0 && r.best_twin >= 0);
    const fsdp_fit_candidate *b = &r.cand[r.best], *t = &r.cand[r.best_twin];
    ck_assert(b->accum == FSDP_ACCUM_FLAT && t->accum == FSDP_ACCUM_TREE);
    ck_assert(b->offload && b->grad_accum > 1 && t->verdict == FSDP_FIT_OVER_HOST);
    ck_assert_uint_lt(b->grad_bytes, t->grad_bytes);
    ck_assert_uint_eq(b->peak_bytes, t->peak_bytes); /* the device holds no sum either way */
    fsdp_fit_free(&r);
    /* pinned to the tree, nothing fits that host */
    req.accum_mask = FSDP_NAME_BIT(FSDP_ACCUM_TREE);
    ck_assert_int_eq(fsdp_fit_search(&req, &r), FSDP_STATUS_OK);
    ck_assert_int_eq(r.best, -1);
    for (int i = 0; i < r.n_cand; i++)
        ck_assert_int_eq(r.cand[i].accum, FSDP_ACCUM_TREE);
    fsdp_fit_free(&r);
}
END_TEST

/* Planning for another machine: without --host-mem nothing is over the host
 * (this machine's memory is not the target's) and the header says so; with
 * it, the limit applies. Llama 3.1 70B with optimizer offload pins about
 * 1.2 TiB of host memory over 8 devices. */
START_TEST(test_fit_host_mem_target)
{
    fsdp_fit_request req;
    fsdp_fit_request_default(&req);
    ck_assert_uint_eq(req.host_mem, 0);
    static const char base[] =
        "plan --fit --model llama3.1-70b --devices 8 --seq 4096 --precision bf16 "
        "--global-batch 8 --device-mem 141GiB --shard full --offload optimizer --prefetch off "
        "--recompute block";
    int rc = fsdp_test_cli(out, sizeof out, "%s", base);
    ck_assert_msg(rc == 0 && strstr(out, "host memory: not limited (give --host-mem for the "
                                         "target machine)") &&
                      strstr(out, "of an unlimited host (--host-mem)"),
                  "exit %d:\n%s", rc, out);
    rc = fsdp_test_cli(out, sizeof out, "%s --host-mem 512GiB", base);
    ck_assert_msg(rc == 1 && strstr(out, "host memory: 512.0 GiB") &&
                      strstr(out, "over the host memory") && strstr(out, "NOTHING FITS"),
                  "exit %d:\n%s", rc, out);
    rc = fsdp_test_cli(out, sizeof out, "%s --host-mem 2TiB --json", base);
    ck_assert_msg(rc == 0 && strstr(out, "\"host_mem\":2199023255552"), "exit %d:\n%s", rc, out);
}
END_TEST

/* ---- the cost model ------------------------------------------------------------------------- */

START_TEST(test_fit_cost_arithmetic)
{
    fsdp_machine m = {.tflops_fp32 = 10, .tflops_bf16 = 100, .mfu = 0.5, .link_gbs = 10,
                      .link_latency_us = 10, .pcie_gbs = 5, .host_gbs = 20};
    fsdp_cost_input in = {.flops = 1e12, .dtype = FSDP_DTYPE_BF16, .prefetch = true,
                          .gather_bytes = 100000000, .reduce_bytes = 200000000, .n_calls = 100};
    fsdp_cost k;
    fsdp_cost_estimate(&m, &in, &k);
    ck_assert(fabs(k.compute_s - 0.02) < 1e-12 && fabs(k.gather_s - 0.01) < 1e-12);
    ck_assert(fabs(k.reduce_s - 0.02) < 1e-12 && fabs(k.latency_s - 0.001) < 1e-12);
    ck_assert(fabs(k.step_s - 0.041) < 1e-12); /* the gather hides behind compute */
    in.prefetch = false;
    fsdp_cost_estimate(&m, &in, &k);
    ck_assert(fabs(k.step_s - 0.051) < 1e-12);
    /* bytes between nodes go over the node's network too, added */
    m.node_gbs = 2;
    in.inter_gather_bytes = 10000000;
    in.inter_reduce_bytes = 30000000;
    fsdp_cost_estimate(&m, &in, &k);
    ck_assert(fabs(k.inter_s - 0.02) < 1e-12 && fabs(k.gather_s - 0.015) < 1e-12);
    ck_assert(fabs(k.step_s - 0.071) < 1e-12);
    in.inter_gather_bytes = in.inter_reduce_bytes = 0;
    in.offload = true;
    in.pcie_bytes = 1000000000;
    in.host_update_bytes = 2000000000;
    fsdp_cost_estimate(&m, &in, &k);
    ck_assert(fabs(k.pcie_s - 0.2) < 1e-12 && fabs(k.cpu_opt_s - 0.1) < 1e-12);
    ck_assert(fabs(k.step_s - 0.3) < 1e-12); /* host side longer than the device */
    in.dtype = FSDP_DTYPE_F32;
    in.offload = false;
    fsdp_cost_estimate(&m, &in, &k);
    ck_assert(fabs(k.compute_s - 0.2) < 1e-12);
    /* GPT-2 124M at T 1024: 6 P + 12 L C T, P as llm.c counts it */
    ck_assert(fsdp_cost_flops_per_token(124475904, 12, 768, 1024) == 860101632.0);

    /* the search computes the same from the model's parameter specs */
    fsdp_fit_request req;
    fsdp_fit_request_default(&req);
    base_config(&req.base, "gpt2", 1, 1024);
    req.global_batch = 1;
    req.device_mem = (size_t)1 << 40;
    req.host_mem = (size_t)1 << 40;
    req.shard_mask = FSDP_NAME_BIT(FSDP_SHARD_FULL);
    req.offload_mask = FSDP_NAME_BIT(0);
    req.prefetch_mask = FSDP_NAME_BIT(1);
    req.recompute_mask = FSDP_NAME_BIT(0);
    fsdp_fit_result r;
    ck_assert_int_eq(fsdp_fit_search(&req, &r), FSDP_STATUS_OK);
    ck_assert_uint_eq(r.numel, 124475904);
    ck_assert(r.flops_per_token == 860101632.0);
    ck_assert_int_eq(r.n_cand, 1);
    /* one device: no collectives; the step is the compute */
    const fsdp_cost *c = &r.cand[0].cost;
    ck_assert(c->gather_s == 0 && c->reduce_s == 0);
    ck_assert(fabs(c->compute_s - 860101632.0 * 1024 / (67e12 * 0.4)) < 1e-9);
    fsdp_fit_free(&r);

    /* offload: the CPU update's bytes per element come from the optimizer's
     * table (AdamW 28, SGD 20 in fp32), over the same pinned gradient */
    double cpu_s[2];
    const fsdp_optim *optims[2] = {&fsdp_optim_adamw, &fsdp_optim_sgd};
    for (int i = 0; i < 2; i++) {
        tiny_request(&req, (size_t)1 << 40);
        req.base.eng.optim = optims[i];
        req.global_batch = 2;
        req.shard_mask = FSDP_NAME_BIT(FSDP_SHARD_FULL);
        req.offload_mask = FSDP_NAME_BIT(1);
        req.prefetch_mask = FSDP_NAME_BIT(1);
        req.recompute_mask = FSDP_NAME_BIT(0);
        ck_assert_int_eq(fsdp_fit_search(&req, &r), FSDP_STATUS_OK);
        ck_assert(r.n_cand >= 1 && r.cand[0].offload);
        cpu_s[i] = r.cand[0].cost.cpu_opt_s;
        fsdp_fit_free(&r);
    }
    ck_assert_uint_eq(fsdp_optim_step_bytes(&fsdp_optim_adamw), 28);
    ck_assert_uint_eq(fsdp_optim_step_bytes(&fsdp_optim_sgd), 20);
    ck_assert_msg(cpu_s[0] > 0 && fabs(cpu_s[1] / cpu_s[0] - 20.0 / 28.0) < 1e-12,
                  "cpu_opt_s adamw %g sgd %g", cpu_s[0], cpu_s[1]);
}
END_TEST

static double total_recv(const fsdp_fit_candidate *c)
{
    return c->cost.gather_s + c->cost.reduce_s;
}

/* The order of the answer is the cost model's: step times never decrease
 * down the list; a slow host puts every offloaded setting last; a slow
 * link puts first a setting that moves the fewest collective bytes. */
START_TEST(test_fit_ranking_follows_cost)
{
    fsdp_fit_request req;
    tiny_request(&req, (size_t)64 << 20);
    req.base.eng.n_ranks = 4;
    req.global_batch = 32;
    fsdp_fit_result r;
    ck_assert_int_eq(fsdp_fit_search(&req, &r), FSDP_STATUS_OK);
    ck_assert_int_eq(r.n_fits, r.n_cand);
    for (int i = 1; i < r.n_fits; i++)
        ck_assert(r.cand[r.ranked[i - 1]].cost.step_s <= r.cand[r.ranked[i]].cost.step_s);
    fsdp_fit_free(&r);

    req.machine.host_gbs = 1e-3;
    ck_assert_int_eq(fsdp_fit_search(&req, &r), FSDP_STATUS_OK);
    bool seen_offload = false;
    for (int i = 0; i < r.n_fits; i++) {
        bool off = r.cand[r.ranked[i]].offload;
        ck_assert_msg(off || !seen_offload, "a setting without offload ranks after one with");
        seen_offload |= off;
    }
    ck_assert(seen_offload && !r.cand[r.best].offload);
    fsdp_fit_free(&r);

    fsdp_machine_default(&req.machine);
    req.machine.link_gbs = 1e-6; /* a byte costs a millisecond: far above compute */
    ck_assert_int_eq(fsdp_fit_search(&req, &r), FSDP_STATUS_OK);
    for (int i = 0; i < r.n_fits; i++)
        ck_assert(total_recv(&r.cand[r.best]) <= total_recv(&r.cand[r.ranked[i]]));
    /* fewest bytes: no accumulation, and not FULL_SHARD's second gather */
    ck_assert_int_eq(r.cand[r.best].grad_accum, 1);
    ck_assert_int_ne(r.cand[r.best].shard, FSDP_SHARD_FULL);
    fsdp_fit_free(&r);
}
END_TEST

/* ---- the command it prints runs within the cap ---------------------------------------------- */

START_TEST(test_fit_command_runs_within_cap)
{
    size_t cap = (size_t)3 << 20;
    int rc = fsdp_test_cli(out, sizeof out,
                           "plan --fit --target cpu --model tiny --devices 2 --seq 64 "
                           "--global-batch 16 --device-mem 3MiB");
    ck_assert_msg(rc == 0, "exit %d:\n%s", rc, out);
    ck_assert_msg(strstr(out, "meta runs") && strstr(out, "fits, fastest first") &&
                      strstr(out, "ESTIMATE") && strstr(out, "does not fit:"),
                  "%s", out);
    char *line = strstr(out, "  fsdp train --backend cpu ");
    ck_assert_msg(line, "no command in:\n%s", out);
    line += strlen("  fsdp ");
    char cmd[1024];
    size_t n = strcspn(line, "\n");
    ck_assert_uint_lt(n, sizeof cmd);
    memcpy(cmd, line, n);
    cmd[n] = '\0';
    ck_assert_msg(strstr(cmd, "--device-mem 3MiB"), "%s", cmd);
    char log[512];
    fsdp_test_path(log, sizeof log, "fit.jsonl");
    rc = fsdp_test_cli(out, sizeof out, "%s --steps 3 --eval 0 --quiet --log %s", cmd, log);
    ck_assert_msg(rc == 0, "'%s' exited %d:\n%s", cmd, rc, out);
    /* the measured per-device peaks of every step are within the cap */
    char *text = fsdp_test_read_file(log, NULL);
    int steps = 0;
    for (char *p = text; (p = strstr(p, "\"peak_bytes\":[")); steps++) {
        p += strlen("\"peak_bytes\":[");
        for (;;) {
            char *end;
            unsigned long long v = strtoull(p, &end, 10);
            ck_assert_msg(end != p && v > 0 && v <= cap, "peak %llu over the cap %zu", v, cap);
            p = end;
            if (*p != ',')
                break;
            p++;
        }
    }
    ck_assert_int_eq(steps, 3);
    free(text);
}
END_TEST

/* ---- JSON ----------------------------------------------------------------------------------- */

static const fsdp_json *get(const fsdp_json *o, const char *k, fsdp_json_type t)
{
    const fsdp_json *v = fsdp_json_get(o, k);
    ck_assert_msg(v && v->type == t, "missing '%s'", k);
    return v;
}

START_TEST(test_fit_json)
{
    int rc = fsdp_test_cli(out, sizeof out,
                           "plan --fit --model tiny --devices 2 --seq 64 --global-batch 16 "
                           "--device-mem 3MiB --cuda-overhead 1MiB --shard grad-op --recompute none "
                           "--json");
    ck_assert_msg(rc == 0, "exit %d:\n%s", rc, out);
    fsdp_json *root;
    ck_assert_msg(fsdp_json_parse(out, strlen(out), &root) == FSDP_STATUS_OK, "%s\n%s",
                  fsdp_error_msg(), out);
    ck_assert_str_eq(get(root, "target", FSDP_JSON_STRING)->str, "cuda");
    ck_assert(get(root, "cuda_overhead", FSDP_JSON_NUMBER)->number == 1 << 20);
    ck_assert(strstr(get(root, "estimate", FSDP_JSON_STRING)->str, "cost model"));
    const fsdp_json *search = get(root, "search", FSDP_JSON_OBJECT);
    ck_assert(get(search, "wall_s", FSDP_JSON_NUMBER)->number > 0);
    ck_assert_uint_eq(get(search, "recompute_refused", FSDP_JSON_ARRAY)->n, 0);
    const fsdp_json *cands = get(root, "candidates", FSDP_JSON_ARRAY);
    /* --shard and --recompute stay fixed: 7 chains x 3 offload (none, optimizer,
     * optimizer,params) x 2 prefetch */
    ck_assert_uint_eq(cands->n, TINY_CHAINS * 6);
    ck_assert(get(search, "candidates", FSDP_JSON_NUMBER)->number == TINY_CHAINS * 6);
    int fits = 0, chosen = (int)get(get(root, "chosen", FSDP_JSON_OBJECT), "index",
                                    FSDP_JSON_NUMBER)->number;
    const fsdp_json *c = cands->child;
    for (int i = 0; c; c = c->next, i++) {
        ck_assert_str_eq(get(c, "shard", FSDP_JSON_STRING)->str, "grad-op");
        const char *accum = get(c, "accum", FSDP_JSON_STRING)->str;
        ck_assert(!strcmp(accum, "tree") ||
                  (!strcmp(accum, "flat") && get(c, "grad_accum", FSDP_JSON_NUMBER)->number > 1));
        const char *v = get(c, "verdict", FSDP_JSON_STRING)->str;
        if (!strcmp(v, "fits")) {
            fits++;
            double rank = get(c, "rank", FSDP_JSON_NUMBER)->number;
            ck_assert(rank >= 1 && (rank == 1) == (i == chosen));
            double dev = get(c, "device_bytes", FSDP_JSON_NUMBER)->number;
            ck_assert(dev == get(c, "peak_bytes", FSDP_JSON_NUMBER)->number + (1 << 20));
            ck_assert(dev <= 3 << 20);
            const fsdp_json *cost = get(c, "cost", FSDP_JSON_OBJECT);
            ck_assert(get(cost, "step_s", FSDP_JSON_NUMBER)->number > 0);
        } else if (!strcmp(v, "pruned")) {
            ck_assert(get(c, "pruned_by", FSDP_JSON_NUMBER)->number < i);
        } else {
            ck_assert_str_eq(v, "over_device");
            ck_assert(get(c, "over_device_bytes", FSDP_JSON_NUMBER)->number > 0);
        }
    }
    ck_assert(fits > 0 && fits == get(search, "fits", FSDP_JSON_NUMBER)->number);
    const char *cmd = get(get(root, "chosen", FSDP_JSON_OBJECT), "command", FSDP_JSON_STRING)->str;
    /* cuda: the engine's share is the device less the overhead */
    ck_assert_msg(!strncmp(cmd, "fsdp train --backend cuda ", 26) &&
                      strstr(cmd, "--shard grad-op") && strstr(cmd, "--device-mem 2MiB"),
                  "%s", cmd);
    fsdp_json_free(root);
}
END_TEST

/* ---- fsdp train refuses before allocating --------------------------------------------------- */

START_TEST(test_fit_train_refuses)
{
    fsdp_train_config c;
    base_config(&c, "tiny", 2, 64);
    c.eng.backend = FSDP_BACKEND_CPU;
    c.eng.batch = 4;
    fsdp_plan p;
    ck_assert_int_eq(fsdp_plan_run(&c, 2, &p), FSDP_STATUS_OK);
    size_t peak = fsdp_plan_max_peak(&p, NULL);
    fsdp_plan_free(&p);
    c.eng.device_mem = peak;
    ck_assert_int_eq(fsdp_fit_check_train(&c, 0), FSDP_STATUS_OK);
    c.eng.device_mem = peak - 1;
    ck_assert_int_eq(fsdp_fit_check_train(&c, 0), FSDP_STATUS_OOM);
    const char *msg = fsdp_error_msg();
    ck_assert_msg(strstr(msg, "does not fit") && strstr(msg, "1 B over") &&
                      strstr(msg, "fsdp plan --fit --target cpu --model tiny --devices 2 --seq 64 "
                                  "--precision fp32 --global-batch 8"),
                  "%s", msg);
    /* a GPU of known size: the peak plus the cuda overheads must fit it */
    c.eng.backend = FSDP_BACKEND_CUDA;
    c.eng.device_mem = 0;
    fsdp_cuda_overhead oh;
    fsdp_cost_shape s = {4, 64, 4, 32, 256};
    ck_assert_int_eq(fsdp_fit_check_train(&c, peak + ((size_t)1 << 30)), FSDP_STATUS_OOM);
    ck_assert_msg(strstr(fsdp_error_msg(), "the GPU's memory") &&
                      strstr(fsdp_error_msg(), "(estimate)"),
                  "%s", fsdp_error_msg());
    fsdp_cost_cuda_overhead(2, FSDP_DTYPE_F32, &s, 1000, &oh); /* more allocations than tiny has */
    ck_assert_int_eq(fsdp_fit_check_train(&c, peak + oh.total_bytes), FSDP_STATUS_OK);
    /* two ranks on one GPU need it twice, but for the one CUDA context */
    c.eng.ranks_per_device = 2;
    ck_assert_int_eq(fsdp_fit_check_train(&c, peak + oh.total_bytes), FSDP_STATUS_OOM);
    ck_assert_msg(strstr(fsdp_error_msg(), "2 ranks sharing it x "), "%s", fsdp_error_msg());
    ck_assert_int_eq(fsdp_fit_check_train(&c, 2 * (peak + oh.total_bytes)), FSDP_STATUS_OK);
    c.eng.ranks_per_device = 1;
    c.eng.backend = FSDP_BACKEND_META; /* nothing to protect */
    c.eng.device_mem = 1;
    ck_assert_int_eq(fsdp_fit_check_train(&c, 0), FSDP_STATUS_OK);

    /* the command refuses before the trainer starts (no header, no init line) */
    int rc = fsdp_test_cli(out, sizeof out,
                           "train --model tiny --devices 2 --seq 64 --batch 4 --device-mem %zu "
                           "--steps 1 --eval 0",
                           peak - 1);
    ck_assert_msg(rc == 1 && strstr(out, "out of memory") && strstr(out, "fsdp plan --fit") &&
                      !strstr(out, "fsdp train: model") && !strstr(out, "after init"),
                  "exit %d:\n%s", rc, out);
    /* and the suggested search answers */
    char *sugg = strstr(out, "fsdp plan --fit");
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%.*s", (int)strcspn(sugg + 5, "\n"), sugg + 5);
    rc = fsdp_test_cli(out, sizeof out, "%s", cmd);
    ck_assert_msg(rc == 0 && strstr(out, "chosen:"), "'%s' exited %d:\n%s", cmd, rc, out);
}
END_TEST

/* ---- the cuda overheads --------------------------------------------------------------------- */

/* The constants cost.h mirrors from the cuda code, read from its source. */
START_TEST(test_fit_cuda_constants)
{
    char *src = fsdp_test_read_file("src/ops/cuda/common.cuh", NULL);
    ck_assert_msg(strstr(src, "#define FSDP_CUDA_BLAS_WS_BYTES ((size_t)32 << 20)"),
                  "the cuBLAS workspace changed: update FSDP_COST_CUBLAS_WS_BYTES");
    ck_assert_msg(strstr(src, "#define FSDP_CUDA_LOWP_CHUNK_NUMEL ((size_t)32 << 20)"),
                  "the matmul staging chunk changed: update FSDP_COST_LOWP_CHUNK_NUMEL");
    free(src);
    ck_assert_uint_eq(FSDP_COST_CUBLAS_WS_BYTES, (size_t)32 << 20);
    /* GPT-2 124M, T 1024, B 4: fp32 keeps the attention scores of one
     * sequence (12 x 1024 x 1024 fp32); bf16's largest is the matmul staging
     * chunk (32 Mi bf16); both with the ops' 25% headroom */
    fsdp_cost_shape s = {4, 1024, 12, 768, 50304};
    fsdp_cuda_overhead oh;
    fsdp_cost_cuda_overhead(8, FSDP_DTYPE_F32, &s, 10, &oh);
    ck_assert_uint_eq(oh.scratch_bytes, (size_t)12 * 1024 * 1024 * 4 * 5 / 4);
    ck_assert_uint_eq(oh.comm_bytes, FSDP_COST_NCCL_BYTES);
    ck_assert_uint_eq(oh.cache_bytes, (size_t)10 << 20);
    ck_assert_uint_eq(oh.total_bytes, oh.context_bytes + oh.cublas_bytes + oh.scratch_bytes +
                                          oh.comm_bytes + oh.cache_bytes);
    fsdp_cost_cuda_overhead(1, FSDP_DTYPE_BF16, &s, 0, &oh);
    ck_assert_uint_eq(oh.scratch_bytes, ((size_t)32 << 20) * 2 * 5 / 4);
    ck_assert_uint_eq(oh.comm_bytes, 0); /* one device: no NCCL */
}
END_TEST

/* ---- the command line ----------------------------------------------------------------------- */

START_TEST(test_fit_usage)
{
    static const fsdp_test_cli_case cases[] = {
        {"plan --fit --model tiny --devices 2", 2, "--fit needs --device-mem"},
        {"plan --fit --model tiny --devices 3 --global-batch 16 --device-mem 1GiB", 2,
         "does not split over 3 devices"},
        {"plan --fit --model tiny --device-mem 1GiB --svg x.svg", 2, "--svg and --trace"},
        {"plan --fit --model tiny --device-mem 1GiB --mfu 0", 2, "--mfu"},
        {"plan --fit --model tiny --device-mem 1GiB --target meta", 2, "--target"},
        {"plan --fit --model tiny --device-mem 1GiB --backend cpu", 2,
         "unknown option '--backend'"},
        {"plan --model tiny --global-batch 16", 2, "--global-batch is an option of --fit"},
        {"plan --help", 0, "--fit"},
        {"plan --fit --model tiny --devices 2 --seq 64 --device-mem 1GiB --target cpu --top 3",
         0, "... and "},
    };
    fsdp_test_cli_cases(cases, FSDP_TEST_LEN(cases));
}
END_TEST

int main(void)
{
    const fsdp_test_tcase tcases[] = {
        {"search", 600,
         FSDP_TESTS(test_fit_memory_order, test_fit_exact_vs_every_candidate,
                    test_fit_cap_forces_accumulation, test_fit_nothing_fits,
                    test_fit_recompute_refused, test_fit_llama_70b)},
        {"cost", 600,
         FSDP_TESTS(test_fit_cost_arithmetic, test_fit_ranking_follows_cost,
                    test_fit_cuda_constants)},
        {"accum", 120, FSDP_TESTS(test_fit_accum_modes, test_fit_host_mem_target)},
        {"cli", 600, .tmpdir = true,
         FSDP_TESTS(test_fit_command_runs_within_cap, test_fit_json, test_fit_train_refuses,
                    test_fit_usage)},
    };
    return fsdp_test_main("fit", tcases, FSDP_TEST_LEN(tcases));
}
