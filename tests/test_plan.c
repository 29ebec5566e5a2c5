/*
 * test_plan.c - `fsdp plan` and its neighbours: the meta-backend plan
 * equals a real cpu run's memory and traffic to the byte over a matrix of
 * configurations; 70B-class shapes plan in seconds with figures that match
 * independent formulas; the fit verdict, JSON and SVG outputs; shard-map
 * tables and JSON; Chrome traces of train and plan (valid JSON, properly
 * nested events per track); `fsdp plot` of a metrics file, and the
 * commands' exit codes.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/clock.h"
#include "core/json.h"
#include "engine/accum.h"
#include "engine/shardmap.h"
#include "models/registry.h"
#include "report/plan_report.h"
#include "report/plot.h"
#include "testutil.h"
#include "train/adapt.h"
#include "train/train.h"
#include "train_util.h"

/* ---- helpers ---------------------------------------------------------------- */

static void base_config(fsdp_train_config *c, const char *model, int devices)
{
    train_config_cpu(c, model, devices);
    c->eng.batch = 2;
    c->steps = 2;
    c->warmup = 1;
    c->n_samples = 0;
}

/* The plan of tiny with the optimizer offloaded over `devices`, for
 * `steps` steps, against a device of device_mem bytes (the reports' input). */
static void offload_plan(fsdp_plan *plan, int devices, int steps, size_t device_mem)
{
    fsdp_train_config c;
    base_config(&c, "tiny", devices);
    c.eng.offload = true;
    ck_assert_int_eq(fsdp_plan_run(&c, steps, plan), FSDP_STATUS_OK);
    plan->device_mem = device_mem;
}

/* ---- exactness: meta plan == cpu run, to the byte ------------------------------ */

static const char *const models[] = {"tiny", "custom:layers=3,heads=2,channels=48,vocab=300,context=32",
                                     "llama-tiny", "qwen2-tiny"};
#define N_MODELS ((int)(sizeof models / sizeof models[0]))
static const int devices[] = {1, 2, 4};

/* 4 models (GPT-2 x 2, an untied GQA Llama, a tied Qwen2 with biases) x 3 device counts x 3
 * strategies x recompute (none, block, elementwise), each with the four binary factors
 * precision, offload, grad-accum and optimizer (AdamW, SGD) in the 8 rows of an L8 orthogonal
 * array: its columns 1, 2, 4 and 7, the fourth the xor of the other three, so any three of
 * the four factors meet in all 8 combinations (only the four-way product is left out: the
 * full product, 1728 runs, took 172 s of CI's make test for no pair or triple more).
 * Sanitizer builds (10-20x slower; they are there for races and bad accesses, the byte
 * counts are make test's) run two passes over models x device counts x strategies (72 runs),
 * the L8 row, the recompute mode and the group layout moving along them so that every pair of
 * the nine factors still meets (checked by enumeration when this was written). */
#if FSDP_TEST_TSAN || FSDP_TEST_ASAN
#define MATRIX_FULL 0
#define N_MATRIX (N_MODELS * 3 * 3 * 2)
#else
#define MATRIX_FULL 1
#define N_MATRIX (N_MODELS * 3 * 3 * 8 * FSDP_RECOMPUTE_COUNT)
#endif

static void matrix_config(int i, fsdp_train_config *c, char *desc, size_t n)
{
    int k = i;
    int mi = k % N_MODELS; k /= N_MODELS;
    int di = k % 3; k /= 3;
    int shard = k % 3; k /= 3;
    /* the L8 row: columns 1, 2, 4 and 7, the fourth the xor of the others */
    int pass = k % 2; /* sanitizer builds: which of the two passes */
    int row = MATRIX_FULL ? k % 8 : (4 * pass + mi + 2 * di + 3 * shard) % 8;
    k = MATRIX_FULL ? k / 8 : 0;
    int prec = row >> 2 & 1, off = row >> 1 & 1, accum = 1 + (row & 1);
    int opt = prec ^ off ^ (row & 1);
    int rc = MATRIX_FULL ? k : (row + mi + di + shard) % FSDP_RECOMPUTE_COUNT;
    base_config(c, models[mi], devices[di]);
    c->eng.shard = (fsdp_shard_strategy)shard;
    c->eng.compute_dtype = (fsdp_dtype)prec;
    c->eng.offload = off;
    c->eng.grad_accum = accum;
    c->eng.optim = fsdp_optim_at(opt);
    c->eng.recompute = (fsdp_recompute)rc;
    int layout = MATRIX_FULL ? mi + di + shard + row : mi + di + shard + pass;
    c->eng.direct_numel = layout % 2 ? 1 : 0; /* shardmap.h's groups */
    snprintf(desc, n,
             "model %s, %d device(s), shard %s, %s, offload %s, grad-accum %d, %s, recompute %s, "
             "%s groups",
             models[mi], devices[di], fsdp_shard_strategy_name(c->eng.shard),
             fsdp_dtype_name(c->eng.compute_dtype), off ? "optimizer" : "none", accum,
             c->eng.optim->name, fsdp_names_name(&fsdp_recompute_names, rc),
             c->eng.direct_numel ? "direct" : "packed");
}

/* The cpu run of c and its meta plan agree to the byte: peaks by kind on
 * the device and the host, allocation counts, traffic. */
static void expect_plan_equals_run(const fsdp_train_config *c0, const char *desc)
{
    fsdp_train_config c = *c0;
    fsdp_train_result res;
    fsdp_status st = fsdp_train_run(&c, &res);
    ck_assert_msg(st == FSDP_STATUS_OK, "%s: cpu run failed: %s", desc, fsdp_error_msg());
    fsdp_plan plan;
    st = fsdp_plan_run(&c, c.steps, &plan);
    ck_assert_msg(st == FSDP_STATUS_OK, "%s: plan failed: %s", desc, fsdp_error_msg());
    ck_assert_int_eq(plan.n_ranks, res.n_ranks);
    for (int r = 0; r < plan.n_ranks; r++) {
        const fsdp_rank_stats *cpu = &res.stats[r];
        const fsdp_plan_rank *pr = &plan.ranks[r];
        ck_assert_msg(pr->mem.peak_bytes == cpu->mem.peak_bytes,
                      "%s: device %d peak: plan %zu, cpu %zu", desc, r, pr->mem.peak_bytes,
                      cpu->mem.peak_bytes);
        for (int k = 0; k < FSDP_MEM_KIND_COUNT; k++) {
            ck_assert_msg(pr->mem.peak_kind_bytes[k] == cpu->mem.peak_kind_bytes[k],
                          "%s: device %d %s at the peak: plan %zu, cpu %zu", desc, r,
                          fsdp_mem_kind_name((fsdp_mem_kind)k), pr->mem.peak_kind_bytes[k],
                          cpu->mem.peak_kind_bytes[k]);
            ck_assert_msg(pr->host.peak_kind_bytes[k] == cpu->host.peak_kind_bytes[k],
                          "%s: device %d host %s at the peak: plan %zu, cpu %zu", desc, r,
                          fsdp_mem_kind_name((fsdp_mem_kind)k), pr->host.peak_kind_bytes[k],
                          cpu->host.peak_kind_bytes[k]);
        }
        /* the same allocation sequence: same counts and the same state after the step */
        ck_assert_msg(pr->mem.n_allocs == cpu->mem.n_allocs, "%s: device %d: %zu vs %zu allocations",
                      desc, r, pr->mem.n_allocs, cpu->mem.n_allocs);
        ck_assert_uint_eq(pr->mem.in_use_bytes, cpu->mem.in_use_bytes);
        ck_assert_uint_eq(pr->host.peak_bytes, cpu->host.peak_bytes);
        ck_assert_uint_eq(pr->host.n_allocs, cpu->host.n_allocs);
        size_t recv = 0, sent = 0;
        for (int k = 0; k < FSDP_COLL_KIND_COUNT; k++) {
            recv += pr->recv_bytes[k];
            sent += pr->sent_bytes[k];
        }
        ck_assert_msg(recv == cpu->comm_recv_bytes && sent == cpu->comm_sent_bytes,
                      "%s: device %d traffic: plan %zu/%zu, cpu %zu/%zu", desc, r, recv, sent,
                      cpu->comm_recv_bytes, cpu->comm_sent_bytes);
        if (plan.n_ranks > 1)
            ck_assert(recv > 0);
    }
    fsdp_plan_free(&plan);
    fsdp_train_result_free(&res);
}

START_TEST(test_plan_equals_cpu_run)
{
    fsdp_train_config c;
    char desc[256];
    matrix_config(_i, &c, desc, sizeof desc);
    expect_plan_equals_run(&c, desc);
}
END_TEST

/* Frozen parameters (--freeze; LoRA's base) and, with LoRA, adapters: the frozen segment's
 * compute-dtype shards and its gathers, and no gradient or optimizer state for it, counted to
 * the byte on every strategy, every offload setting (params: the frozen shards in pinned host
 * memory; optimizer,params: the trainable ones too), in both precisions. */
static const char *const frozen_patterns[] = {
    "model.layers.*.mlp.*,model.embed_tokens.weight",
    "model.*", /* everything but the LM head: blocks that train nothing */
};

START_TEST(test_plan_equals_cpu_run_frozen)
{
    static const int devices[] = {1, 2, 4};
    for (int d = 0; d < 3; d++)
        for (int s = 0; s < FSDP_SHARD_COUNT; s++) {
            fsdp_train_config c;
            base_config(&c, "llama-tiny", devices[d]);
            c.freeze = frozen_patterns[_i % 2];
            c.eng.shard = (fsdp_shard_strategy)s;
            int off = (d + s + _i) % 4; /* fsdp_offload_names' value */
            c.eng.offload = off & 1;
            c.eng.offload_params = off & 2;
            c.eng.compute_dtype = _i / 2 ? FSDP_DTYPE_BF16 : FSDP_DTYPE_F32;
            c.eng.grad_accum = 2;
            if (s == FSDP_SHARD_HYBRID && devices[d] > 1)
                c.eng.n_nodes = 2;
            char desc[256];
            snprintf(desc, sizeof desc, "--freeze %s, %d device(s), %s, %s, offload %s", c.freeze,
                     devices[d], fsdp_shard_strategy_name(c.eng.shard),
                     fsdp_dtype_name(c.eng.compute_dtype),
                     fsdp_names_name(&fsdp_offload_names, off));
            expect_plan_equals_run(&c, desc);
        }
}
END_TEST

/* QLoRA: adapters on every linear layer of a base whose linear weights are
 * NF4 (codes and absmax shards, their packed all-gathers and dequantized
 * units), on every strategy and offload setting, params offload keeping the
 * frozen shards in pinned host memory and uploading them before each
 * gather: counted to the byte on the device and the host. */
START_TEST(test_plan_equals_cpu_run_nf4)
{
    static const int devices[] = {1, 2, 4};
    for (int d = 0; d < 3; d++)
        for (int s = 0; s < FSDP_SHARD_COUNT; s++) {
            fsdp_train_config c;
            base_config(&c, "llama-tiny", devices[d]);
            c.lora = (fsdp_lora_config){.r = 4, .alpha = 8, .targets = "all-linear"};
            c.quantize = FSDP_QUANT_NF4;
            c.eng.shard = (fsdp_shard_strategy)s;
            int off = (d + s + _i) % 4; /* fsdp_offload_names' value */
            c.eng.offload = off & 1;
            c.eng.offload_params = off & 2;
            c.eng.compute_dtype = _i ? FSDP_DTYPE_BF16 : FSDP_DTYPE_F32;
            c.eng.grad_accum = 2;
            if (s == FSDP_SHARD_HYBRID && devices[d] > 1)
                c.eng.n_nodes = 2;
            char desc[256];
            snprintf(desc, sizeof desc, "QLoRA, %d device(s), %s, %s, offload %s", devices[d],
                     fsdp_shard_strategy_name(c.eng.shard), fsdp_dtype_name(c.eng.compute_dtype),
                     fsdp_names_name(&fsdp_offload_names, off));
            expect_plan_equals_run(&c, desc);
        }
}
END_TEST

/* --offload optimizer,params on a full fine-tune: every parameter shard in pinned host memory,
 * uploaded before each gather; the plan equals the cpu run to the byte (device and host, by
 * kind) for every model, device count and strategy, precision, accumulation and recompute
 * cycling along them; the device holds no parameter bytes. --offload params alone, with
 * nothing frozen, is refused by both naming optimizer,params. Then LoRA adapters (dense base)
 * with every parameter on the host, on 2 devices, both precisions. */
START_TEST(test_plan_equals_cpu_run_params)
{
    int i = 0;
    for (int d = 0; d < 3; d++)
        for (int s = 0; s < FSDP_SHARD_COUNT; s++, i++) {
            fsdp_train_config c;
            base_config(&c, models[(_i + i) % N_MODELS], devices[d]);
            c.eng.shard = (fsdp_shard_strategy)s;
            if (s == FSDP_SHARD_HYBRID && devices[d] > 1)
                c.eng.n_nodes = 2;
            c.eng.offload = c.eng.offload_params = true;
            c.eng.compute_dtype = (i + _i) % 2 ? FSDP_DTYPE_BF16 : FSDP_DTYPE_F32;
            c.eng.grad_accum = 1 + i % 2;
            c.eng.recompute = (fsdp_recompute)((i + _i) % FSDP_RECOMPUTE_COUNT);
            char desc[256];
            snprintf(desc, sizeof desc, "%s, %d device(s), %s, %s, grad-accum %d, recompute %s, "
                     "offload optimizer,params", c.model, devices[d],
                     fsdp_shard_strategy_name(c.eng.shard), fsdp_dtype_name(c.eng.compute_dtype),
                     c.eng.grad_accum, fsdp_names_name(&fsdp_recompute_names, c.eng.recompute));
            expect_plan_equals_run(&c, desc);
            fsdp_plan plan;
            ck_assert_int_eq(fsdp_plan_run(&c, 1, &plan), FSDP_STATUS_OK);
            for (int r = 0; r < plan.n_ranks; r++)
                ck_assert_msg(plan.ranks[r].mem.peak_kind_bytes[FSDP_MEM_PARAM] == 0,
                              "%s: device %d holds %zu parameter bytes", desc, r,
                              plan.ranks[r].mem.peak_kind_bytes[FSDP_MEM_PARAM]);
            fsdp_plan_free(&plan);
            c.eng.offload = false; /* params alone: nothing frozen to move */
            ck_assert_int_eq(fsdp_plan_run(&c, 1, &plan), FSDP_STATUS_INVALID_ARG);
            ck_assert_msg(strstr(fsdp_error_msg(), "--offload optimizer,params"), "%s",
                          fsdp_error_msg());
            fsdp_error_clear();
            fsdp_train_result res;
            ck_assert_int_eq(fsdp_train_run(&c, &res), FSDP_STATUS_INVALID_ARG);
            ck_assert_msg(strstr(fsdp_error_msg(), "nothing of model"), "%s", fsdp_error_msg());
            fsdp_error_clear();
            fsdp_train_result_free(&res);
        }
    fsdp_train_config c;
    base_config(&c, "llama-tiny", 2);
    c.lora = (fsdp_lora_config){.r = 4, .alpha = 8, .targets = "q_proj,v_proj"};
    c.eng.offload = c.eng.offload_params = true;
    c.eng.compute_dtype = _i ? FSDP_DTYPE_BF16 : FSDP_DTYPE_F32;
    c.eng.grad_accum = 2;
    expect_plan_equals_run(&c, _i ? "LoRA, 2 devices, bf16, offload optimizer,params"
                                  : "LoRA, 2 devices, fp32, offload optimizer,params");
}
END_TEST

/* Packed example rows: the device holds their token positions, which the
 * trainer decides from the data; a plan of the same engine settings
 * (positions on) counts them to the byte, and without them it is short by
 * exactly that buffer, B x T ints. */
START_TEST(test_plan_equals_cpu_run_packed)
{
    char data[4096];
    fsdp_test_path(data, sizeof data, "rows.jsonl");
    FILE *f = fopen(data, "w");
    ck_assert_ptr_nonnull(f);
    for (int i = 0; i < 12; i++)
        fprintf(f, "{\"prompt\": \"Q%d: %s?\", \"completion\": \" %d\"}\n", i,
                i % 3 ? "why" : "how many foxes", i);
    ck_assert_int_eq(fclose(f), 0);
    fsdp_train_config c;
    base_config(&c, "llama:layers=1,heads=2,kv_heads=1,hidden=16,intermediate=32,head_dim=8,"
                    "vocab=768,context=32", 2);
    c.eng.seq = 32;
    c.data = data;
    c.tokenizer = "tests/fixtures/tok_llama3.json";
    c.pack = FSDP_TRAIN_PACK_ON;
    c.eng.positions = true;
    expect_plan_equals_run(&c, "packed rows");
    fsdp_plan with, without;
    ck_assert_int_eq(fsdp_plan_run(&c, 2, &with), FSDP_STATUS_OK);
    c.eng.positions = false;
    ck_assert_int_eq(fsdp_plan_run(&c, 2, &without), FSDP_STATUS_OK);
    ck_assert_uint_eq(with.ranks[0].mem.peak_kind_bytes[FSDP_MEM_ACT] -
                          without.ranks[0].mem.peak_kind_bytes[FSDP_MEM_ACT],
                      (size_t)c.eng.batch * 32 * sizeof(int));
    fsdp_plan_free(&with);
    fsdp_plan_free(&without);
}
END_TEST

/* --accum flat, exact too: its one buffer per unit and its scratch, on the
 * device or (offload) in pinned host memory, over strategies, precisions
 * and recompute modes, 2 to 8 micro-steps. */
START_TEST(test_plan_equals_cpu_run_flat)
{
    static const struct {
        const char *model;
        int devices, nodes, accum;
        fsdp_shard_strategy shard;
        bool offload, bf16;
        fsdp_recompute rc;
    } rows[] = {
        {"tiny", 2, 0, 4, FSDP_SHARD_FULL, false, false, FSDP_RECOMPUTE_NONE},
        {"tiny", 2, 0, 8, FSDP_SHARD_FULL, true, true, FSDP_RECOMPUTE_NONE},
        {"tiny", 4, 2, 2, FSDP_SHARD_HYBRID, false, true, FSDP_RECOMPUTE_BLOCK},
        {"llama-tiny", 2, 0, 4, FSDP_SHARD_GRAD_OP, true, false, FSDP_RECOMPUTE_ELEMENTWISE},
        {"qwen2-tiny", 1, 0, 3, FSDP_SHARD_NONE, false, true, FSDP_RECOMPUTE_BLOCK},
    };
    for (size_t i = 0; i < FSDP_TEST_LEN(rows); i++) {
        fsdp_train_config c;
        base_config(&c, rows[i].model, rows[i].devices);
        c.eng.batch = 1;
        c.eng.n_nodes = rows[i].nodes;
        c.eng.grad_accum = rows[i].accum;
        c.eng.accum = FSDP_ACCUM_FLAT;
        c.eng.shard = rows[i].shard;
        c.eng.offload = rows[i].offload;
        c.eng.compute_dtype = rows[i].bf16 ? FSDP_DTYPE_BF16 : FSDP_DTYPE_F32;
        c.eng.recompute = rows[i].rc;
        char desc[160];
        snprintf(desc, sizeof desc, "flat, %s, %d device(s), %d micro-steps, row %zu",
                 rows[i].model, rows[i].devices, rows[i].accum, i);
        expect_plan_equals_run(&c, desc);
    }
}
END_TEST

/* ---- 70B-class shapes: seconds, and figures from independent formulas ------------- */

#define SHAPE_70B "custom:layers=80,heads=64,channels=8192,vocab=32000,context=4096"

/* Parameters of a GPT-2 block and of the root, from the architecture. */
static void gpt2_counts(int L, size_t C, size_t Vp, size_t T, size_t *root, size_t *block)
{
    (void)L;
    *root = Vp * C + T * C + 2 * C;
    *block = 2 * C + 3 * C * C + 3 * C + C * C + C + 2 * C + 4 * C * C + 4 * C + 4 * C * C + C;
}

static size_t pad_to(size_t n, size_t a) { return (n + a - 1) / a * a; }

START_TEST(test_plan_70b_fast_and_formulas)
{
    const int N = 8, L = 80;
    const size_t C = 8192, Vp = 32000, T = 4096; /* 32000 is a multiple of 128 */
    fsdp_train_config c;
    base_config(&c, SHAPE_70B, N);
    c.eng.batch = 1;
    c.eng.seq = 4096;
    fsdp_plan plan;
    double t0 = fsdp_now_s();
    fsdp_status st = fsdp_plan_run(&c, 2, &plan);
    double s = fsdp_now_s() - t0;
    ck_assert_msg(st == FSDP_STATUS_OK, "%s", fsdp_error_msg());
    /* "a couple of seconds"; generous for sanitizer builds on a loaded machine */
    ck_assert_msg(s < 10.0, "planning a 70B shape took %.2f s", s);

    size_t root, block;
    gpt2_counts(L, C, Vp, T, &root, &block);
    ck_assert_uint_eq(plan.numel, root + (size_t)L * block);
    ck_assert_uint_gt(plan.numel, (size_t)64e9);
    size_t align = (size_t)N * 1024;
    size_t root_shard = pad_to(root, align) / N, block_shard = pad_to(block, align) / N;
    size_t shards = root_shard + (size_t)L * block_shard; /* elements per device */
    for (int r = 0; r < N; r++) {
        const fsdp_plan_rank *pr = &plan.ranks[r];
        /* fp32 without offload: the master shard is the parameter shard */
        ck_assert_uint_eq(pr->mem.peak_kind_bytes[FSDP_MEM_PARAM], 4 * shards);
        ck_assert_uint_eq(pr->mem.peak_kind_bytes[FSDP_MEM_OPTIM], 8 * shards);
        /* FULL_SHARD: the root plus at most two blocks gathered (current + prefetch),
         * and one unit's rank-major all-gather buffer while it is copied out */
        size_t gather = pr->mem.peak_kind_bytes[FSDP_MEM_GATHER];
        size_t staging = pad_to(root, align) > pad_to(block, align) ? pad_to(root, align)
                                                                    : pad_to(block, align);
        ck_assert_uint_ge(gather, 4 * pad_to(root, align));
        ck_assert_uint_le(gather, 4 * (pad_to(root, align) + 2 * pad_to(block, align) + staging));
        /* traffic (comm.h's byte formula, per rank): the root gathered once per
         * step, every block twice (forward and backward); every unit's
         * gradient reduce-scattered once per micro-step */
        size_t ag = 4 * (N - 1) * (root_shard + 2 * (size_t)L * block_shard);
        size_t rs = 4 * (N - 1) * shards;
        ck_assert_uint_eq(pr->recv_bytes[FSDP_COLL_ALL_GATHER], ag);
        ck_assert_uint_eq(pr->sent_bytes[FSDP_COLL_ALL_GATHER], ag);
        ck_assert_uint_eq(pr->recv_bytes[FSDP_COLL_REDUCE_SCATTER], rs);
        /* a collective per group (shardmap.h): the root's wte and wpe gathered
         * straight into place and ln_f packed; a block's four matrices straight
         * into place, its vectors packed between them, in flat order: 9 */
        ck_assert_uint_eq(pr->n_calls[FSDP_COLL_ALL_GATHER], (size_t)(3 + 2 * 9 * L));
        ck_assert_uint_eq(pr->n_calls[FSDP_COLL_REDUCE_SCATTER], (size_t)(3 + 9 * L));
        ck_assert_uint_eq(pr->n_calls[FSDP_COLL_ALL_REDUCE], 0);
    }
    /* the ZeRO formula: 16 P / N */
    size_t f_dev, f_host;
    char text[64];
    fsdp_plan_formula(&plan, &f_dev, &f_host, text, sizeof text);
    ck_assert_str_eq(text, "16 P/N");
    ck_assert(fabs((double)f_dev - 16.0 * (double)plan.numel / N) < 2.0);
    ck_assert_uint_eq(f_host, 0);
    fsdp_plan_free(&plan);

    /* with optimizer offload the fp32 state moves to pinned host memory:
     * master, gradient, m and v shards = 16 bytes per shard element */
    c.eng.offload = true;
    ck_assert_int_eq(fsdp_plan_run(&c, 2, &plan), FSDP_STATUS_OK);
    for (int r = 0; r < N; r++) {
        const fsdp_plan_rank *pr = &plan.ranks[r];
        ck_assert_uint_eq(pr->host.peak_kind_bytes[FSDP_MEM_PARAM], 4 * shards);
        ck_assert_uint_eq(pr->host.peak_kind_bytes[FSDP_MEM_OPTIM], 8 * shards);
        ck_assert_uint_eq(pr->host.peak_kind_bytes[FSDP_MEM_GRAD], 4 * shards);
        ck_assert_uint_eq(pr->mem.peak_kind_bytes[FSDP_MEM_OPTIM], 0);
        ck_assert_uint_eq(pr->mem.peak_kind_bytes[FSDP_MEM_PARAM], 4 * shards);
    }
    fsdp_plan_free(&plan);

    /* SGD keeps one state array: 4 bytes per shard element, and the formula
     * asks the optimizer */
    c.eng.offload = false;
    c.eng.optim = &fsdp_optim_sgd;
    ck_assert_int_eq(fsdp_plan_run(&c, 2, &plan), FSDP_STATUS_OK);
    for (int r = 0; r < N; r++)
        ck_assert_uint_eq(plan.ranks[r].mem.peak_kind_bytes[FSDP_MEM_OPTIM], 4 * shards);
    fsdp_plan_formula(&plan, &f_dev, &f_host, text, sizeof text);
    ck_assert_str_eq(text, "12 P/N");
    fsdp_plan_free(&plan);
}
END_TEST

/* The plan of `model` on 2 devices, batch 1, `accum` micro-steps summed
 * as `mode`, with or without the optimizer offloaded, for `steps` steps. */
static void accum_plan(const char *model, bool offload, int accum, fsdp_accum_mode mode,
                       int steps, fsdp_plan *plan)
{
    fsdp_train_config c;
    base_config(&c, model, 2);
    c.eng.offload = offload;
    c.eng.grad_accum = accum;
    c.eng.batch = 1;
    c.eng.accum = mode;
    ck_assert_int_eq(fsdp_plan_run(&c, steps, plan), FSDP_STATUS_OK);
}

/* Optimizer offload keeps no gradient shard on the device (ZeRO-Offload):
 * the accumulation counter's partial sums are in pinned host memory, so
 * the device's gradient bytes at its peak do not grow with --grad-accum
 * (they are the gradients in flight), while the host's grow by one shard
 * per buffer of the counter (fsdp_accum_depth). Without offload the device
 * holds the counter. The cpu run equals the plan (test_plan_equals_cpu_run). */
START_TEST(test_offload_grads_on_host)
{
    static const int accums[] = {1, 2, 8};
    size_t dev_grad[3][2], host_grad[3][2];
    for (int off = 0; off < 2; off++)
        for (int i = 0; i < 3; i++) {
            fsdp_plan plan;
            accum_plan("tiny", off, accums[i], FSDP_ACCUM_TREE, 1, &plan);
            dev_grad[i][off] = plan.ranks[0].mem.peak_kind_bytes[FSDP_MEM_GRAD];
            host_grad[i][off] = plan.ranks[0].host.peak_kind_bytes[FSDP_MEM_GRAD];
            fsdp_plan_free(&plan);
        }
    size_t shard = host_grad[0][1]; /* one micro-step: the gradient shard itself */
    ck_assert_uint_gt(shard, 0);
    for (int i = 0; i < 3; i++) {
        int depth = fsdp_accum_depth(accums[i]);
        ck_assert_msg(dev_grad[i][1] == dev_grad[0][1], "offload, %d micro-steps: %zu device "
                      "gradient bytes, %zu with one", accums[i], dev_grad[i][1], dev_grad[0][1]);
        ck_assert_uint_eq(host_grad[i][1], (size_t)depth * shard);
        ck_assert_uint_eq(host_grad[i][0], 0);
    }
    /* without offload the counter's extra shards are on the device */
    ck_assert_uint_gt(dev_grad[2][0], dev_grad[0][0]);
}
END_TEST

/* Flat's gradient memory does not grow with --grad-accum: from 2 to 64
 * micro-steps the device's (or, with offload, the host's) gradient bytes at
 * the peak stay those of 2; with offload the host holds exactly the
 * gradient shard and one scratch of the largest unit's shard (accum.h),
 * against the tree's fsdp_accum_depth(A) shards. The formula counts one
 * shard whatever A. */
START_TEST(test_flat_grads_do_not_grow)
{
    static const int accums[] = {1, 2, 8, 64};
    for (int off = 0; off < 2; off++) {
        size_t grad[4], tree[4];
        for (int i = 0; i < 4; i++)
            for (int mode = 0; mode < 2; mode++) {
                fsdp_plan plan; /* 2 steps: what a step keeps is live from the second's start */
                accum_plan("llama-tiny", off, accums[i], mode ? FSDP_ACCUM_FLAT : FSDP_ACCUM_TREE,
                           2, &plan);
                const fsdp_mem_stats *m = off ? &plan.ranks[0].host : &plan.ranks[0].mem;
                (mode ? grad : tree)[i] = m->peak_kind_bytes[FSDP_MEM_GRAD];
                char text[64];
                size_t f_dev, f_host;
                fsdp_plan_formula(&plan, &f_dev, &f_host, text, sizeof text);
                if (mode)
                    ck_assert_str_eq(text, off ? "device 4 P/N + host 16 P/N" : "16 P/N");
                fsdp_plan_free(&plan);
            }
        ck_assert_uint_eq(grad[0], tree[0]); /* one micro-step: the same run */
        for (int i = 2; i < 4; i++)
            ck_assert_msg(grad[i] == grad[1], "flat, offload %d, %d micro-steps: %zu gradient "
                          "bytes, %zu with 2", off, accums[i], grad[i], grad[1]);
        ck_assert_uint_gt(tree[3], grad[3]);
        if (off) { /* the shard and the scratch, exactly */
            fsdp_model m;
            ck_assert_int_eq(fsdp_model_from_spec("llama-tiny", &m), FSDP_STATUS_OK);
            fsdp_shardmap sm;
            ck_assert_int_eq(fsdp_shardmap_init(&sm, &m, 2, FSDP_SHARD_FULL), FSDP_STATUS_OK);
            size_t shard = 0, max_unit = 0;
            for (int u = 0; u < sm.n_units; u++) {
                shard += sm.units[u].shard_numel;
                if (sm.units[u].shard_numel > max_unit)
                    max_unit = sm.units[u].shard_numel;
            }
            ck_assert_uint_eq(grad[0], 4 * shard);
            ck_assert_uint_eq(grad[1], 4 * (shard + max_unit));
            ck_assert_uint_eq(tree[3], 4 * shard * (size_t)fsdp_accum_depth(64));
            fsdp_shardmap_free(&sm);
            fsdp_model_free(&m);
        }
    }
}
END_TEST

/* Formulas per strategy, precision and offload (P = the model's parameters). */
START_TEST(test_plan_formula_text)
{
    static const struct {
        fsdp_shard_strategy shard;
        fsdp_dtype dt;
        bool offload;
        const fsdp_optim *optim; /* NULL: the default, AdamW */
        const char *text;
        double dev_per_p, dev_per_p_n, host_per_p_n;
        int accum;               /* micro-steps */
        bool params;             /* with offload: --offload optimizer,params */
    } cases[] = {
        {FSDP_SHARD_FULL, FSDP_DTYPE_F32, false, NULL, "16 P/N", 0, 16, 0, 1, false},
        {FSDP_SHARD_GRAD_OP, FSDP_DTYPE_F32, false, NULL, "4 P + 12 P/N", 4, 12, 0, 1, false},
        {FSDP_SHARD_NONE, FSDP_DTYPE_F32, false, NULL, "16 P", 16, 0, 0, 1, false},
        {FSDP_SHARD_FULL, FSDP_DTYPE_BF16, false, NULL, "18 P/N", 0, 18, 0, 1, false},
        {FSDP_SHARD_FULL, FSDP_DTYPE_F32, true, NULL, "device 4 P/N + host 16 P/N",
         0, 4, 16, 1, false},
        {FSDP_SHARD_GRAD_OP, FSDP_DTYPE_BF16, true, NULL, "device 2 P + host 16 P/N",
         2, 0, 16, 1, false},
        {FSDP_SHARD_FULL, FSDP_DTYPE_F32, false, &fsdp_optim_adamw, "16 P/N", 0, 16, 0, 1, false},
        {FSDP_SHARD_FULL, FSDP_DTYPE_F32, false, &fsdp_optim_sgd, "12 P/N", 0, 12, 0, 1, false},
        {FSDP_SHARD_GRAD_OP, FSDP_DTYPE_BF16, false, &fsdp_optim_sgd, "2 P + 12 P/N",
         2, 12, 0, 1, false},
        {FSDP_SHARD_FULL, FSDP_DTYPE_BF16, true, &fsdp_optim_sgd, "device 2 P/N + host 12 P/N", 0,
         2, 12, 1, false},
        /* 8 micro-steps: the counter holds up to 4 gradient shards (accum.h);
         * with offload they are all on the host */
        {FSDP_SHARD_FULL, FSDP_DTYPE_F32, false, NULL, "28 P/N", 0, 28, 0, 8, false},
        {FSDP_SHARD_FULL, FSDP_DTYPE_BF16, true, NULL, "device 2 P/N + host 28 P/N",
         0, 2, 28, 8, false},
        {FSDP_SHARD_FULL, FSDP_DTYPE_BF16, true, NULL, "device 2 P/N + host 20 P/N",
         0, 2, 20, 2, false},
        /* the compute-dtype copy moves to the host too (in fp32 it is the master) */
        {FSDP_SHARD_FULL, FSDP_DTYPE_BF16, true, NULL, "host 18 P/N", 0, 0, 18, 1, true},
        {FSDP_SHARD_FULL, FSDP_DTYPE_F32, true, NULL, "host 16 P/N", 0, 0, 16, 1, true},
        {FSDP_SHARD_NONE, FSDP_DTYPE_BF16, true, NULL, "host 18 P", 0, 0, 18 * 4, 1, true},
    };
    for (size_t i = 0; i < FSDP_TEST_LEN(cases); i++) {
        fsdp_plan p;
        memset(&p, 0, sizeof p);
        p.numel = p.train_numel = 1000000;
        p.n_ranks = 4;
        p.eng.shard = cases[i].shard;
        p.eng.compute_dtype = cases[i].dt;
        p.eng.offload = cases[i].offload;
        p.eng.offload_params = cases[i].params;
        p.eng.optim = cases[i].optim;
        p.eng.grad_accum = cases[i].accum;
        size_t dev, host;
        char text[64];
        fsdp_plan_formula(&p, &dev, &host, text, sizeof text);
        ck_assert_str_eq(text, cases[i].text);
        double want = cases[i].dev_per_p * 1e6 + cases[i].dev_per_p_n * 1e6 / 4;
        ck_assert_msg(fabs((double)dev - want) < 1, "case %zu: %zu vs %.0f", i, dev, want);
        ck_assert(fabs((double)host - cases[i].host_per_p_n * 1e6 / 4) < 1);
    }
    /* LoRA on an NF4 base: frozen compute-dtype (F) and NF4 (Q) shards beside the state */
    fsdp_plan p;
    memset(&p, 0, sizeof p);
    p.train_numel = 1000000;
    p.frozen_numel = 2000000;
    p.nf4_numel = 16000000;
    p.numel = p.train_numel + p.frozen_numel + p.nf4_numel;
    p.n_ranks = 4;
    p.eng.shard = FSDP_SHARD_FULL;
    p.eng.compute_dtype = FSDP_DTYPE_BF16;
    p.eng.grad_accum = 1;
    size_t dev, host;
    char text[128];
    fsdp_plan_formula(&p, &dev, &host, text, sizeof text);
    ck_assert_str_eq(text, "18 P/N + 2 F/N + 0.5625 Q/N");
    ck_assert_uint_eq(dev, (18 * 1000000 + 2 * 2000000 + 9 * 1000000) / 4);
    /* --offload params: the frozen shards in pinned host memory */
    p.eng.offload_params = true;
    fsdp_plan_formula(&p, &dev, &host, text, sizeof text);
    ck_assert_str_eq(text, "18 P/N + host 2 F/N + host 0.5625 Q/N");
    ck_assert_uint_eq(dev, 18 * 1000000 / 4);
    ck_assert_uint_eq(host, (2 * 2000000 + 9 * 1000000) / 4);
}
END_TEST

/* ---- the report: fit verdict, JSON, SVG ------------------------------------------ */

static char *print_plan(const fsdp_plan *p, bool json)
{
    char *buf = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&buf, &n);
    ck_assert_ptr_nonnull(f);
    if (json)
        fsdp_plan_write_json(f, p);
    else
        fsdp_plan_print(f, p);
    fclose(f);
    return buf;
}

START_TEST(test_plan_fit_verdict)
{
    fsdp_train_config c;
    base_config(&c, "small", 4);
    fsdp_plan plan;
    ck_assert_int_eq(fsdp_plan_run(&c, 1, &plan), FSDP_STATUS_OK);
    int who;
    size_t peak = fsdp_plan_max_peak(&plan, &who);
    ck_assert_uint_gt(peak, 0);
    for (int r = 0; r < plan.n_ranks; r++)
        ck_assert_uint_le(plan.ranks[r].mem.peak_bytes, peak);

    char *out = print_plan(&plan, false);
    ck_assert_msg(strstr(out, "give --device-mem"), "%s", out);
    ck_assert(!strstr(out, "FITS") && !strstr(out, "DOES NOT FIT"));
    free(out);

    plan.device_mem = peak; /* exactly at the cap: fits with no margin */
    out = print_plan(&plan, false);
    ck_assert_msg(strstr(out, "FITS under") && !strstr(out, "DOES NOT FIT"), "%s", out);
    free(out);

    plan.device_mem = peak - 1;
    out = print_plan(&plan, false);
    ck_assert_msg(strstr(out, "DOES NOT FIT") && strstr(out, "--offload optimizer"), "%s", out);
    free(out);

    /* the verdict agrees with a real run under that cap */
    c.eng.device_mem = peak - 1;
    fsdp_train_result res;
    ck_assert_int_eq(fsdp_train_run(&c, &res), FSDP_STATUS_OOM);
    ck_assert_msg(strstr(fsdp_error_msg(), "out of memory"), "%s", fsdp_error_msg());
    fsdp_train_result_free(&res);
    c.eng.device_mem = peak;
    c.steps = 1;
    ck_assert_int_eq(fsdp_train_run(&c, &res), FSDP_STATUS_OK);
    fsdp_train_result_free(&res);
    fsdp_plan_free(&plan);
}
END_TEST

static size_t json_uint(const fsdp_json *obj, const char *key)
{
    const fsdp_json *v = fsdp_json_get(obj, key);
    ck_assert_msg(v && v->type == FSDP_JSON_NUMBER, "missing number '%s'", key);
    return (size_t)v->number;
}

START_TEST(test_plan_json)
{
    fsdp_plan plan;
    offload_plan(&plan, 2, 2, (size_t)1 << 30);
    char *out = print_plan(&plan, true);
    fsdp_json *root;
    fsdp_status st = fsdp_json_parse(out, strlen(out), &root);
    ck_assert_msg(st == FSDP_STATUS_OK, "%s\n%s", fsdp_error_msg(), out);
    ck_assert_uint_eq(json_uint(root, "params"), plan.numel);
    ck_assert_uint_eq(json_uint(root, "devices"), 2);
    ck_assert_str_eq(fsdp_json_get(root, "offload")->str, "optimizer");
    ck_assert_str_eq(fsdp_json_get(root, "accum")->str, "tree");
    const fsdp_json *opt = fsdp_json_get(root, "optimizer");
    ck_assert_str_eq(fsdp_json_get(opt, "name")->str, "adamw");
    ck_assert_str_eq(fsdp_json_at(fsdp_json_get(opt, "state"), 1)->str, "adam_v");
    ck_assert_uint_eq(json_uint(opt, "state_bytes_per_param"), 8);
    ck_assert(fsdp_json_get(root, "fits")->type == FSDP_JSON_BOOL);
    ck_assert(fsdp_json_get(root, "fits")->boolean);
    const fsdp_json *devs = fsdp_json_get(root, "per_device");
    ck_assert(devs && devs->type == FSDP_JSON_ARRAY && devs->n == 2);
    for (int r = 0; r < 2; r++) {
        const fsdp_json *d = fsdp_json_at(devs, (size_t)r);
        ck_assert_uint_eq(json_uint(d, "peak_bytes"), plan.ranks[r].mem.peak_bytes);
        ck_assert_uint_eq(json_uint(d, "host_peak_bytes"), plan.ranks[r].host.peak_bytes);
        const fsdp_json *kinds = fsdp_json_get(d, "peak_by_kind");
        size_t sum = 0;
        for (int k = 0; k < FSDP_MEM_KIND_COUNT; k++) {
            size_t v = json_uint(kinds, fsdp_mem_kind_name((fsdp_mem_kind)k));
            ck_assert_uint_eq(v, plan.ranks[r].mem.peak_kind_bytes[k]);
            sum += v;
        }
        ck_assert_uint_eq(sum, plan.ranks[r].mem.peak_bytes); /* the breakdown adds up */
        const fsdp_json *ag = fsdp_json_get(fsdp_json_get(d, "collectives"), "all_gather");
        ck_assert_uint_eq(json_uint(ag, "recv_bytes"), plan.ranks[r].recv_bytes[FSDP_COLL_ALL_GATHER]);
    }
    fsdp_json_free(root);
    free(out);
    fsdp_plan_free(&plan);
}
END_TEST

/* Tags balance (a stack of names; self-closing tags, <?xml ?> and comments
 * skipped); returns the number of elements named `count_name`. */
static int check_xml(const char *s, const char *count_name)
{
    char stack[64][32];
    int depth = 0, count = 0, n_roots = 0;
    for (const char *p = s; (p = strchr(p, '<'));) {
        if (p[1] == '?' || p[1] == '!') {
            p = strchr(p, '>');
            ck_assert_ptr_nonnull(p);
            continue;
        }
        const char *end = strchr(p, '>');
        ck_assert_msg(end != NULL, "unterminated tag");
        bool closing = p[1] == '/', self = end[-1] == '/';
        const char *name = p + (closing ? 2 : 1);
        size_t len = strcspn(name, " />\n\t");
        ck_assert(len > 0 && len < 32);
        if (closing) {
            ck_assert_msg(depth > 0 && strlen(stack[depth - 1]) == len &&
                              !strncmp(stack[depth - 1], name, len),
                          "closing </%.*s> does not match <%s>", (int)len, name,
                          depth ? stack[depth - 1] : "(none)");
            depth--;
        } else {
            if (!strncmp(name, count_name, len) && strlen(count_name) == len)
                count++;
            if (!self) {
                ck_assert(depth < 64);
                if (depth == 0)
                    n_roots++;
                memcpy(stack[depth], name, len);
                stack[depth][len] = '\0';
                depth++;
            }
        }
        /* text between tags must not hold a raw '<' or an unescaped '&' */
        p = end + 1;
        const char *next = strchr(p, '<');
        for (const char *q = p; *q && q != next; q++)
            if (*q == '&')
                ck_assert_msg(!strncmp(q, "&amp;", 5) || !strncmp(q, "&lt;", 4) ||
                                  !strncmp(q, "&gt;", 4) || !strncmp(q, "&quot;", 6) ||
                                  !strncmp(q, "&apos;", 6),
                              "unescaped '&'");
    }
    ck_assert_int_eq(depth, 0);
    ck_assert_int_eq(n_roots, 1);
    return count;
}

START_TEST(test_plan_svg)
{
    fsdp_plan plan;
    offload_plan(&plan, 4, 1, 64 << 20);
    char path[512];
    fsdp_test_path(path, sizeof path, "f.svg");
    ck_assert_int_eq(fsdp_plan_write_svg(&plan, path), FSDP_STATUS_OK);
    char *svg = fsdp_test_read_file(path, NULL);
    ck_assert(!strncmp(svg, "<?xml", 5));
    check_xml(svg, "rect");
    /* one bar segment per non-zero kind per device, each with a tooltip */
    for (int r = 0; r < 4; r++)
        for (int k = 0; k < FSDP_MEM_KIND_COUNT; k++) {
            if (!plan.ranks[r].mem.peak_kind_bytes[k])
                continue;
            char want[64];
            snprintf(want, sizeof want, "<title>device %d ", r);
            ck_assert_msg(strstr(svg, want), "no bar for device %d", r);
        }
    ck_assert(strstr(svg, "pinned host memory"));
    ck_assert(strstr(svg, "cap 64.0 MiB"));
    ck_assert(strstr(svg, "ZeRO device 4 P/N + host 16 P/N"));
    free(svg);
    /* an unwritable path is an IO error, not a crash */
    ck_assert_int_eq(fsdp_plan_write_svg(&plan, "/nonexistent-dir/x.svg"), FSDP_STATUS_IO);
    ck_assert(strstr(fsdp_error_msg(), "/nonexistent-dir/x.svg"));
    fsdp_plan_free(&plan);
}
END_TEST

/* ---- shard maps ----------------------------------------------------------------- */

/* One parameter of `fsdp shardmap --json`: the ranks' rows tile [0, rows) in slot order (R
 * each, the last fewer, then none), the same on every replica; a split parameter's R rows are
 * whole norm blocks, an unsplit one is slot 0's whole; its span lies after the previous
 * one's, inside the shard. Returns its span. */
static size_t check_param_rows(const fsdp_json *p, const fsdp_shardmap *sm, size_t shard,
                               size_t at_min)
{
    size_t pn = json_uint(p, "numel"), rows = 1, R = json_uint(p, "shard_rows");
    const fsdp_json *shape = fsdp_json_get(p, "shape");
    if (shape->n)
        rows = (size_t)shape->child->number;
    size_t rn = pn / rows, span = R * rn, at = json_uint(p, "shard_offset");
    int K = sm->shard_ranks;
    ck_assert_uint_ge(at, at_min);
    ck_assert_uint_le(at + span, shard);
    ck_assert_uint_ge(R * (size_t)K, rows);
    if (R < rows)
        ck_assert_uint_eq(span % FSDP_NORM_BLOCK, 0);
    else
        ck_assert_uint_eq(R, rows);
    if (K == 1)
        ck_assert_uint_eq(R, rows);
    const fsdp_json *rr = fsdp_json_get(p, "rows");
    ck_assert_uint_eq(rr->n, (size_t)sm->n_ranks);
    int r = 0;
    for (const fsdp_json *x = rr->child; x; x = x->next, r++) {
        size_t k = (size_t)(r % K), r0 = (size_t)x->child->number;
        size_t r1 = (size_t)x->child->next->number;
        size_t want0 = k * R < rows ? k * R : rows, want1 = (k + 1) * R < rows ? (k + 1) * R : rows;
        ck_assert_uint_eq(r0, want0);
        ck_assert_uint_eq(r1, want1);
    }
    return at + span;
}

START_TEST(test_shardmap_json)
{
    static const int ns[] = {1, 3, 8};
    static const char *const models[] = {"gpt2", "llama3.2-1b"};
    for (size_t mi = 0; mi < FSDP_TEST_LEN(models); mi++)
        for (int s = 0; s < FSDP_SHARD_COUNT; s++)
            for (size_t i = 0; i < FSDP_TEST_LEN(ns); i++) {
                fsdp_model m;
                fsdp_shardmap sm;
                ck_assert_int_eq(fsdp_model_from_spec(models[mi], &m), FSDP_STATUS_OK);
                ck_assert_int_eq(fsdp_shardmap_init(&sm, &m, ns[i], (fsdp_shard_strategy)s),
                                 FSDP_STATUS_OK);
                char *buf = NULL;
                size_t n = 0;
                FILE *f = open_memstream(&buf, &n);
                fsdp_plan_shardmap_json(f, &sm, models[mi]);
                fclose(f);
                fsdp_json *root;
                fsdp_status st = fsdp_json_parse(buf, n, &root);
                ck_assert_msg(st == FSDP_STATUS_OK, "%s", fsdp_error_msg());
                ck_assert_uint_eq(json_uint(root, "devices"), (size_t)ns[i]);
                ck_assert_uint_eq(json_uint(root, "params"), m.numel);
                const fsdp_json *units = fsdp_json_get(root, "units");
                ck_assert(units && units->n == (size_t)m.n_units);
                size_t total = 0;
                int u = 0;
                for (const fsdp_json *ju = units->child; ju; ju = ju->next, u++) {
                    const fsdp_shard_unit *su = &sm.units[u];
                    ck_assert_str_eq(fsdp_json_get(ju, "name")->str, su->spec->name);
                    size_t numel = json_uint(ju, "numel"), padded = json_uint(ju, "padded_numel");
                    size_t shard = json_uint(ju, "shard_numel");
                    ck_assert_uint_eq(numel, su->numel);
                    ck_assert_uint_eq(padded, shard * (size_t)sm.shard_ranks);
                    if (sm.shard_ranks == 1) /* the padded segment; else the spans' sum */
                        ck_assert_uint_eq(shard % FSDP_NORM_BLOCK, 0);
                    /* parameters tile the unit's flat buffer in order; their spans the shard */
                    const fsdp_json *params = fsdp_json_get(ju, "params");
                    size_t off = 0, at = 0;
                    for (const fsdp_json *p = params->child; p; p = p->next) {
                        ck_assert_uint_eq(json_uint(p, "offset"), off);
                        size_t pn = json_uint(p, "numel"), prod = 1;
                        for (const fsdp_json *d = fsdp_json_get(p, "shape")->child; d; d = d->next)
                            prod *= (size_t)d->number;
                        ck_assert_uint_eq(prod, pn);
                        off += pn;
                        at = check_param_rows(p, &sm, shard, at);
                    }
                    ck_assert_uint_eq(off, numel);
                    /* every rank's real elements; the slots' add up to the unit */
                    const fsdp_json *ranks = fsdp_json_get(ju, "ranks");
                    ck_assert_uint_eq(ranks->n, (size_t)ns[i]);
                    size_t real = 0;
                    int r = 0;
                    for (const fsdp_json *x = ranks->child; x; x = x->next, r++)
                        real += r < sm.shard_ranks ? json_uint(x, "real") : 0;
                    ck_assert_uint_eq(real, numel);
                    total += numel;
                }
                ck_assert_uint_eq(total, m.numel);
                fsdp_json_free(root);
                free(buf);
                fsdp_shardmap_free(&sm);
                fsdp_model_free(&m);
            }
}
END_TEST

START_TEST(test_shardmap_table)
{
    fsdp_model m;
    fsdp_shardmap sm;
    ck_assert_int_eq(fsdp_model_from_spec("tiny", &m), FSDP_STATUS_OK);
    ck_assert_int_eq(fsdp_shardmap_init(&sm, &m, 4, FSDP_SHARD_FULL), FSDP_STATUS_OK);
    char *buf = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&buf, &n);
    fsdp_plan_shardmap_table(f, &sm, "tiny", true);
    fclose(f);
    /* each parameter's rows on each rank: a split one's by R, an unsplit one's on rank 0 */
    for (int u = 0; u < sm.n_units; u++)
        for (int i = 0; i < sm.units[u].n_params; i++) {
            const fsdp_shard_param *sp = &sm.units[u].params[i];
            char want[160];
            bool split = sp->shard_rows < sp->rows; /* then rank 3's line, else rank 0's */
            size_t r0 = split ? 3 * sp->shard_rows : 0, r1 = split ? 4 * sp->shard_rows : sp->rows;
            r0 = r0 < sp->rows ? r0 : sp->rows;
            r1 = r1 < sp->rows ? r1 : sp->rows;
            snprintf(want, sizeof want, "%s[%zu:%zu)", sp->spec->name, r0, r1);
            ck_assert_msg(strstr(buf, want), "no rows %s in\n%s", want, buf);
        }
    const fsdp_shard_param *wte = &sm.units[0].params[0];
    ck_assert_str_eq(wte->spec->name, "wte.weight");
    ck_assert_uint_lt(wte->shard_rows, wte->rows); /* split: 4 x R >= rows > 3 x R */
    ck_assert(strstr(buf, "h.1.mlp.c_proj.bias"));
    free(buf);
    fsdp_shardmap_free(&sm);
    fsdp_model_free(&m);
}
END_TEST

/* `fsdp shardmap` with train's --lora, --freeze and --quantize shows the shard map a run of
 * them builds: on the bnb-4bit fixture (NF4 without --quantize, as train keeps it) the
 * adapters trainable, norms and embeddings frozen, the linear weights NF4, each segment
 * labelled, every parameter's rows on the last rank as the engine's map has them; and the
 * JSON names each parameter's segment. */
START_TEST(test_shardmap_lora)
{
    static const char *const dir = "tests/fixtures/bnb4/nf4";
    fsdp_lora_config lora = {.r = 4, .alpha = 8, .targets = "q_proj,v_proj"};
    fsdp_model m;
    fsdp_shardmap sm;
    ck_assert_msg(fsdp_adapt_shape(dir, &lora, "model.norm.weight", FSDP_QUANT_NONE, &m) ==
                      FSDP_STATUS_OK, "%s", fsdp_error_msg());
    ck_assert_int_eq(fsdp_shardmap_init(&sm, &m, 2, FSDP_SHARD_FULL), FSDP_STATUS_OK);
    ck_assert(sm.numel > 0 && sm.frozen_numel > 0 && sm.nf4_numel > 0);
    static char out[1 << 16];
    int rc = fsdp_test_cli(out, sizeof out, "shardmap --model %s --devices 2 --lora 4 "
                           "--freeze model.norm.weight --params", dir);
    ck_assert_msg(rc == 0 && strstr(out, "segments: trainable "), "rc %d: %s", rc, out);
    static const char *const seg_label[] = {"trainable ", "frozen    ", "nf4       "};
    for (int u = 0; u < sm.n_units; u++)
        for (int i = 0; i < sm.units[u].n_params; i++) {
            const fsdp_shard_param *sp = &sm.units[u].params[i];
            size_t r0 = sp->shard_rows < sp->rows ? sp->shard_rows : sp->rows;
            char want[160];
            snprintf(want, sizeof want, "%s[%zu:%zu)", sp->spec->name, r0, sp->rows);
            const char *at = strstr(out, want);
            ck_assert_msg(at, "no rows %s in\n%s", want, out);
            /* the nearest label before it on rank 1's lines is its segment's */
            const char *label = NULL;
            for (int k = 0; k < 3; k++)
                for (const char *p = strstr(out, seg_label[k]); p && p < at;
                     p = strstr(p + 1, seg_label[k]))
                    if (!label || p > label)
                        label = p;
            ck_assert_msg(label && !strncmp(label, seg_label[sp->seg], 10), "%s is not under "
                          "'%s'", want, seg_label[sp->seg]);
        }
    ck_assert(strstr(out, "q_proj.lora_A.weight") && strstr(out, "nf4       "));
    rc = fsdp_test_cli(out, sizeof out, "shardmap --model %s --devices 2 --lora 4 --json", dir);
    ck_assert_msg(rc == 0 && strstr(out, "\"segment\":\"nf4\"") &&
                      strstr(out, "\"segment\":\"trainable\""), "rc %d: %s", rc, out);
    static const fsdp_test_cli_case bad[] = {
        {"shardmap --model tests/fixtures/bnb4/nf4", 2, "stored in 4 bits"},
        {"shardmap --lora-alpha 8", 2, "give --lora R too"},
        {"shardmap --model small --quantize nf4", 2, "--quantize nf4"},
    };
    fsdp_test_cli_cases(bad, FSDP_TEST_LEN(bad));
    fsdp_shardmap_free(&sm);
    fsdp_model_free(&m);
}
END_TEST

/* ---- traces ---------------------------------------------------------------------- */

struct span {
    long long t0, t1; /* ns */
    int pid, tid;
};

static int span_cmp(const void *a, const void *b)
{
    const struct span *x = a, *y = b;
    if (x->pid != y->pid)
        return x->pid - y->pid;
    if (x->tid != y->tid)
        return x->tid - y->tid;
    if (x->t0 != y->t0)
        return x->t0 < y->t0 ? -1 : 1;
    return x->t1 > y->t1 ? -1 : x->t1 < y->t1; /* enclosing first */
}

/* Parse a Chrome trace and check it: every event has the fields its phase
 * needs; every track with events is named; duration events on each (pid,
 * tid) track nest properly (each event lies inside the enclosing one or
 * starts after it ends); counters carry bytes. Counts "X" events per rank
 * and stream into n_track[pid * 4 + stream] (stream = tid % 4: overlapping
 * work of one stream goes to extra lanes, tid = stream + 4 * lane). */
static void check_trace(const char *path, int n_ranks, int *n_track, int *n_counters)
{
    fsdp_json *root;
    fsdp_status st = fsdp_json_parse_file(path, &root);
    ck_assert_msg(st == FSDP_STATUS_OK, "%s", fsdp_error_msg());
    const fsdp_json *evs = fsdp_json_get(root, "traceEvents");
    ck_assert(evs && evs->type == FSDP_JSON_ARRAY && evs->n > 0);
    struct span *sp = calloc(evs->n, sizeof *sp);
    size_t n = 0;
    memset(n_track, 0, sizeof(int) * (size_t)n_ranks * 4);
    *n_counters = 0;
    static unsigned char named[64][128]; /* [pid][tid]: has a thread_name */
    memset(named, 0, sizeof named);
    for (const fsdp_json *e = evs->child; e; e = e->next) {
        const fsdp_json *ph = fsdp_json_get(e, "ph"), *pid = fsdp_json_get(e, "pid");
        ck_assert(ph && ph->type == FSDP_JSON_STRING && pid && pid->type == FSDP_JSON_NUMBER);
        ck_assert(pid->number >= 0 && pid->number < n_ranks);
        ck_assert(fsdp_json_get(e, "name") && fsdp_json_get(e, "name")->type == FSDP_JSON_STRING);
        if (!strcmp(ph->str, "M")) {
            const char *what = fsdp_json_get(e, "name")->str;
            const fsdp_json *args = fsdp_json_get(e, "args");
            if (!strcmp(what, "thread_sort_index"))
                ck_assert(fsdp_json_get(args, "sort_index"));
            else
                ck_assert_msg(fsdp_json_get(args, "name") && (!strcmp(what, "thread_name") ||
                                                             !strcmp(what, "process_name")),
                              "metadata '%s'", what);
            const fsdp_json *tid = fsdp_json_get(e, "tid");
            if (!strcmp(fsdp_json_get(e, "name")->str, "thread_name")) {
                ck_assert(tid && tid->number >= 0 && tid->number < 128);
                named[(int)pid->number % 64][(int)tid->number] = 1;
            }
            continue;
        }
        const fsdp_json *ts = fsdp_json_get(e, "ts");
        ck_assert(ts && ts->type == FSDP_JSON_NUMBER && ts->number >= 0);
        if (!strcmp(ph->str, "C")) {
            const fsdp_json *b = fsdp_json_get(fsdp_json_get(e, "args"), "bytes");
            ck_assert(b && b->type == FSDP_JSON_NUMBER && b->number >= 0);
            (*n_counters)++;
            continue;
        }
        ck_assert_msg(!strcmp(ph->str, "X"), "unexpected phase '%s'", ph->str);
        const fsdp_json *tid = fsdp_json_get(e, "tid"), *dur = fsdp_json_get(e, "dur");
        ck_assert(tid && tid->type == FSDP_JSON_NUMBER && tid->number >= 0 && tid->number < 128);
        ck_assert_msg(named[(int)pid->number % 64][(int)tid->number], "track %d of rank %d has no "
                      "name", (int)tid->number, (int)pid->number);
        ck_assert(dur && dur->type == FSDP_JSON_NUMBER && dur->number > 0);
        const fsdp_json *args = fsdp_json_get(e, "args");
        ck_assert(fsdp_json_get(args, "bytes") && fsdp_json_get(args, "unit"));
        /* ts and dur are microseconds with 3 decimals: exact nanoseconds */
        sp[n].t0 = llround(ts->number * 1000.0);
        sp[n].t1 = sp[n].t0 + llround(dur->number * 1000.0);
        sp[n].pid = (int)pid->number;
        sp[n].tid = (int)tid->number;
        n_track[sp[n].pid * 4 + sp[n].tid % 4]++;
        n++;
    }
    for (int r = 0; r < n_ranks && r < 64; r++)
        for (int k = 0; k < 4; k++)
            ck_assert(named[r][k]); /* a named track per stream */
    qsort(sp, n, sizeof *sp, span_cmp);
    long long stack[64];
    int depth = 0;
    for (size_t i = 0; i < n; i++) {
        if (i > 0 && (sp[i].pid != sp[i - 1].pid || sp[i].tid != sp[i - 1].tid))
            depth = 0;
        while (depth > 0 && stack[depth - 1] <= sp[i].t0)
            depth--; /* enclosing events that ended before this one starts */
        ck_assert_msg(depth == 0 || sp[i].t1 <= stack[depth - 1],
                      "rank %d track %d: event [%lld, %lld] ns overlaps the enclosing event "
                      "ending at %lld",
                      sp[i].pid, sp[i].tid, sp[i].t0, sp[i].t1, stack[depth - 1]);
        ck_assert(depth < 64);
        stack[depth++] = sp[i].t1;
    }
    free(sp);
    fsdp_json_free(root);
}

/* Train c (2 ranks) with a trace and check it; n_track[r * 4 + stream]. */
static void train_traced(fsdp_train_config *c, int *n_track, int *n_counters)
{
    char path[512];
    fsdp_test_path(path, sizeof path, "trace.json");
    c->trace_path = path;
    fsdp_train_result res;
    ck_assert_msg(fsdp_train_run(c, &res) == FSDP_STATUS_OK, "%s", fsdp_error_msg());
    fsdp_train_result_free(&res);
    check_trace(path, 2, n_track, n_counters);
}

START_TEST(test_trace_train)
{
    static const bool offload[] = {false, true};
    for (int k = 0; k < 2; k++) {
        fsdp_train_config c;
        base_config(&c, "tiny", 2);
        c.eng.offload = offload[k];
        c.eng.grad_accum = 2;
        int n_track[8], n_counters;
        train_traced(&c, n_track, &n_counters);
        for (int r = 0; r < 2; r++) {
            ck_assert_int_gt(n_track[r * 4 + 0], 0); /* compute */
            ck_assert_int_gt(n_track[r * 4 + 1], 0); /* comm */
            if (offload[k]) {
                ck_assert_int_gt(n_track[r * 4 + 2], 0); /* copy */
                ck_assert_int_gt(n_track[r * 4 + 3], 0); /* cpu optimizer */
            }
        }
        ck_assert_int_gt(n_counters, 0);
    }
}
END_TEST

/* With several CPU optimizer workers, the updates of several units run at
 * once: the trace must still nest properly on every track it declares. */
START_TEST(test_trace_offload_workers)
{
    if (!fsdp_test_forks()) {
        printf("SKIP: FSDP_CPU_THREADS is read once per process; needs Check's fork\n");
        return;
    }
    ck_assert_int_eq(setenv("FSDP_CPU_THREADS", "4", 1), 0);
    fsdp_train_config c;
    base_config(&c, "custom:layers=4,heads=4,channels=256,vocab=256,context=32", 2);
    c.eng.batch = 1;
    c.eng.offload = true;
    c.steps = 2;
    int n_track[8], n_counters;
    train_traced(&c, n_track, &n_counters);
    for (int r = 0; r < 2; r++)
        ck_assert_int_eq(n_track[r * 4 + 3], 2 * 5); /* one update per unit and step */
}
END_TEST

START_TEST(test_trace_plan)
{
    fsdp_train_config c;
    base_config(&c, "gpt2", 4);
    char path[512];
    fsdp_test_path(path, sizeof path, "f.json");
    c.trace_path = path;
    fsdp_plan plan;
    ck_assert_int_eq(fsdp_plan_run(&c, 2, &plan), FSDP_STATUS_OK);
    fsdp_plan_free(&plan);
    int n_track[16], n_counters;
    check_trace(path, 4, n_track, &n_counters);
    /* two steps: 12 blocks gathered in forward and backward + the root, per step */
    for (int r = 0; r < 4; r++)
        ck_assert_int_eq(n_track[r * 4 + 1], 2 * ((1 + 2 * 12) + 13));
    /* an unwritable trace path fails the plan with IO */
    c.trace_path = "/nonexistent-dir/t.json";
    ck_assert_int_eq(fsdp_plan_run(&c, 1, &plan), FSDP_STATUS_IO);
}
END_TEST

/* ---- fsdp plot ------------------------------------------------------------------- */

START_TEST(test_plot_metrics)
{
    /* a real metrics file from a short run */
    fsdp_train_config c;
    base_config(&c, "tiny", 3);
    c.steps = 6;
    char log[512], svgp[512];
    fsdp_test_path(log, sizeof log, "f.jsonl");
    fsdp_test_path(svgp, sizeof svgp, "f.svg");
    c.log_path = log;
    fsdp_train_result res;
    ck_assert_int_eq(fsdp_train_run(&c, &res), FSDP_STATUS_OK);
    fsdp_train_result_free(&res);
    fsdp_plot_info info;
    fsdp_status st = fsdp_plot_metrics(log, svgp, &info);
    ck_assert_msg(st == FSDP_STATUS_OK, "%s", fsdp_error_msg());
    ck_assert_int_eq(info.n_steps, 6);
    ck_assert_int_eq(info.n_devices, 3);
    char *svg = fsdp_test_read_file(svgp, NULL);
    /* series: loss, lr, grad_norm, tokens/s, and the devices' peaks (equal: one line); no
     * eval_loss; axis titles */
    ck_assert_int_eq(check_xml(svg, "polyline"), 4 + 1);
    ck_assert(strstr(svg, ">loss<"));
    ck_assert(strstr(svg, ">tokens/s<"));
    ck_assert(strstr(svg, "devices 0..2"));
    ck_assert(strstr(svg, ">step<"));
    ck_assert(strstr(svg, "peak memory (KiB)") || strstr(svg, "peak memory (MiB)"));
    free(svg);
    /* devices that differ get a line each */
    fsdp_test_write_file(log, "{\"step\":1,\"loss\":3,\"tokens_per_s\":50,\"peak_bytes\":[100,200,300]}\n"
                    "{\"step\":2,\"loss\":2,\"tokens_per_s\":60,\"peak_bytes\":[100,200,300]}\n");
    ck_assert_int_eq(fsdp_plot_metrics(log, svgp, &info), FSDP_STATUS_OK);
    svg = fsdp_test_read_file(svgp, NULL);
    ck_assert_int_eq(check_xml(svg, "polyline"), 2 + 3);
    ck_assert(strstr(svg, ">device 2<"));
    ck_assert(strstr(svg, "peak memory (B)"));
    free(svg);
}
END_TEST

START_TEST(test_plot_bad_inputs)
{
    char in[512], out[512];
    fsdp_test_path(in, sizeof in, "f.jsonl");
    fsdp_test_path(out, sizeof out, "f.svg");
    fsdp_plot_info info;
    /* missing file */
    ck_assert_int_eq(fsdp_plot_metrics("/nonexistent/m.jsonl", out, &info), FSDP_STATUS_IO);
    ck_assert(strstr(fsdp_error_msg(), "/nonexistent/m.jsonl"));
    ck_assert(access(out, F_OK) != 0);
    /* malformed line: named by number, no output left behind */
    fsdp_test_write_file(in, "{\"step\":1,\"loss\":2.5,\"tokens_per_s\":100,\"peak_bytes\":[10]}\n"
                   "{\"step\":2,\"loss\":2.4,,}\n");
    ck_assert_int_eq(fsdp_plot_metrics(in, out, &info), FSDP_STATUS_FORMAT);
    ck_assert_msg(strstr(fsdp_error_msg(), "line 2"), "%s", fsdp_error_msg());
    ck_assert(access(out, F_OK) != 0);
    /* a line without a loss */
    fsdp_test_write_file(in, "{\"step\":1,\"tokens_per_s\":100}\n");
    ck_assert_int_eq(fsdp_plot_metrics(in, out, &info), FSDP_STATUS_FORMAT);
    ck_assert_msg(strstr(fsdp_error_msg(), "loss"), "%s", fsdp_error_msg());
    /* nan is not JSON */
    fsdp_test_write_file(in, "{\"step\":1,\"loss\":nan}\n");
    ck_assert_int_eq(fsdp_plot_metrics(in, out, &info), FSDP_STATUS_FORMAT);
    /* empty file */
    fsdp_test_write_file(in, "\n\n");
    ck_assert_int_eq(fsdp_plot_metrics(in, out, &info), FSDP_STATUS_FORMAT);
    ck_assert_msg(strstr(fsdp_error_msg(), "no metrics"), "%s", fsdp_error_msg());
    /* one step and blank lines are fine */
    fsdp_test_write_file(in, "\n{\"step\":1,\"loss\":3,\"tokens_per_s\":5,\"peak_bytes\":[1,2]}\n\n");
    ck_assert_int_eq(fsdp_plot_metrics(in, out, &info), FSDP_STATUS_OK);
    ck_assert_int_eq(info.n_steps, 1);
    char *svg = fsdp_test_read_file(out, NULL);
    check_xml(svg, "circle");
    free(svg);
}
END_TEST

/* ---- the commands ---------------------------------------------------------------- */

static char cmd_out[1 << 17];

START_TEST(test_commands)
{
    static const fsdp_test_cli_case cases[] = {
        {"plan --help", 0, "--device-mem"},
        {"plan --model tiny --devices 2", 0, "give --device-mem"},
        {"plan --model tiny --devices 2 --device-mem 1GiB", 0, "FITS under"},
        {"plan --model tiny --devices 2 --device-mem 1MiB", 0, "DOES NOT FIT"},
        {"plan --model tiny --json", 0, "\"per_device\""},
        {"plan --model tiny --optimizer sgd", 0, "optim: optimizer state (momentum)"},
        {"plan --model tiny --optimizer sgd --offload optimizer", 0, "host 12 P/N"},
        {"plan --model tiny", 0, "optim: optimizer state (adam_m, adam_v)"},
        {"plan --help", 0, "--recompute none|block|elementwise"},
        {"plan --model tiny --recompute block", 0, "recompute block;"},
        {"plan --model tiny --recompute elementwise --json", 0, "\"recompute\":\"elementwise\""},
        {"plan --model tiny --recompute full", 2,
         "--recompute: unknown value 'full' (expected none, block or elementwise)"},
        {"plan --model tiny --device-mem 1MiB", 0, "--recompute block, a smaller --batch"},
        {"plan --model tiny --optimizer lion", 2, "unknown optimizer 'lion' (expected adamw, sgd)"},
        {"plan --model tiny --momentum 0.5", 2, "--momentum is not a setting of --optimizer adamw"},
        {"plan --model tiny --optimizer sgd --momentum 1", 2, "momentum 1 must be in [0, 1)"},
        /* the flags come from the optimizers' declarations, their checks too */
        {"plan --help", 0, "--beta2 X "},
        {"plan --model tiny --beta1 0.8 --beta2 0.999 --eps 1e-6", 0, "optimizer adamw"},
        {"plan --model tiny --beta2 1", 2, "adamw: beta2 1 must be in [0, 1)"},
        {"plan --model tiny --eps 0", 2, "adamw: eps 0 must be finite and > 0"},
        {"plan --model tiny --optimizer sgd --eps 1e-6", 2,
         "--eps is not a setting of --optimizer sgd"},
        {"plan --backend cpu", 2, "unknown option '--backend'"},
        {"plan --comm host", 2, "unknown option '--comm'"},
        {"plan --devices 0", 2, "--devices"},
        {"plan --steps 1001", 2, "--steps: 1001 is out of range (expected 1..1000)"},
        {"plan --model tiny --seq 65", 2, "context"},
        {"plan --model tiny --svg /nonexistent-dir/p.svg", 1, "/nonexistent-dir/p.svg"},
        {"plan --model tests/fixtures/tiny_gpt2.bin --devices 2 --seq 8", 0, "10816 parameters"},
        {"plan --model /nonexistent/m.bin", 1, "/nonexistent/m.bin"},
        {"shardmap --help", 0, "--json"},
        {"shardmap --model tests/fixtures/tiny_gpt2.safetensors", 0, "10816 parameters"},
        {"shardmap --model /nonexistent/m.safetensors", 1, "/nonexistent/m.safetensors"},
        {"shardmap --model tiny --devices 3", 0, "h.1"},
        {"shardmap --model tiny --json", 0, "\"units\""},
        {"shardmap --model tiny --devices 4 --params", 0, "rows wte.weight[0:"},
        {"shardmap --model tiny --devices 4 --json", 0, "\"shard_rows\":"},
        {"shardmap --model nope", 2, "unknown model"},
        {"shardmap --devices -1", 2, "--devices"},
        {"plot --help", 0, "METRICS.jsonl"},
        {"plot", 2, "usage"},
        {"plot a.jsonl", 2, "usage"},
        {"plot /nonexistent/m.jsonl /nonexistent/x.svg", 1, "/nonexistent/x.svg"}, /* output first */
    };
    fsdp_test_cli_cases(cases, FSDP_TEST_LEN(cases));
    /* the JSON outputs parse */
    const char *json_cmds[] = {"plan --model tiny --devices 3 --offload optimizer --json",
                               "shardmap --model gpt2 --devices 8 --shard grad-op --json"};
    for (size_t k = 0; k < FSDP_TEST_LEN(json_cmds); k++) {
        ck_assert_int_eq(fsdp_test_cli(cmd_out, sizeof cmd_out, "%s", json_cmds[k]), 0);
        fsdp_json *root;
        fsdp_status st = fsdp_json_parse(cmd_out, strlen(cmd_out), &root);
        ck_assert_msg(st == FSDP_STATUS_OK, "'fsdp %s': %s", json_cmds[k], fsdp_error_msg());
        fsdp_json_free(root);
    }
    /* a malformed metrics line: exit 1 naming the line */
    char in[512];
    fsdp_test_path(in, sizeof in, "f.jsonl");
    fsdp_test_write_file(in, "{\"step\":1,\"loss\":1}\n{oops}\n");
    char never[512];
    fsdp_test_path(never, sizeof never, "never.svg");
    ck_assert_int_eq(fsdp_test_cli(cmd_out, sizeof cmd_out, "plot %s %s", in, never), 1);
    ck_assert_msg(strstr(cmd_out, "line 2"), "%s", cmd_out);
    ck_assert(access(never, F_OK) != 0);
}
END_TEST

int main(void)
{
    const fsdp_test_tcase tcases[] = {
        {"exact", 600, FSDP_TESTS(FSDP_TEST_LOOP(test_plan_equals_cpu_run, N_MATRIX))},
        {"accum", 120, FSDP_TESTS(test_plan_equals_cpu_run_flat, test_flat_grads_do_not_grow)},
        {"packed", 60, .tmpdir = true, FSDP_TESTS(test_plan_equals_cpu_run_packed)},
        {"frozen", 120, FSDP_TESTS(FSDP_TEST_LOOP(test_plan_equals_cpu_run_frozen, 4))},
        {"nf4", 120, FSDP_TESTS(FSDP_TEST_LOOP(test_plan_equals_cpu_run_nf4, 2))},
        {"params", 120, FSDP_TESTS(FSDP_TEST_LOOP(test_plan_equals_cpu_run_params, 2))},
        {"plan", 600, .tmpdir = true,
         FSDP_TESTS(test_plan_70b_fast_and_formulas, test_plan_formula_text,
                    test_offload_grads_on_host, test_plan_fit_verdict, test_plan_json,
                    test_plan_svg)},
        {"shardmap", FSDP_TESTS(test_shardmap_json, test_shardmap_table, test_shardmap_lora)},
        {"trace", 600, .tmpdir = true,
         FSDP_TESTS(test_trace_train, test_trace_offload_workers, test_trace_plan)},
        {"plot", 600, .tmpdir = true,
         FSDP_TESTS(test_plot_metrics, test_plot_bad_inputs, test_commands)},
    };
    return fsdp_test_main("plan", tcases, FSDP_TEST_LEN(tcases));
}
