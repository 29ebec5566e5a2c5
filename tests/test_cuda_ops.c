/*
 * test_cuda_ops.c - every cuda op against the cpu backend on the same
 * inputs (per-op tolerance; embed_bwd, residual, add exactly; AdamW, cast,
 * nf4_dequant and sumsq_blocks bit for bit), determinism (the same op twice
 * gives the same bits), and the op error path (sync_error).
 *
 * Every output an op writes (rather than accumulates into) is poisoned with
 * 0xFF bytes (NaN in fp32 and bf16) on both devices before every run, so
 * an element an op fails to write fails the comparison instead of matching
 * a zero-initialised buffer. Shapes include the production ones that take
 * other code paths: bf16 matmul backward over several low-precision chunks
 * (the GPT-2 head), column sums over more than 16,384 rows, cross-entropy
 * backward on its 512-thread path, attention with head size 64 at T 1024.
 * Without a GPU every test prints a SKIP line and passes (cuda_test.h).
 * The tensors on both devices and the checks are cuda_tens.h's.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/rng.h"
#include "cuda_tens.h"
#include "cuda_test.h"
#include "device/device.h"
#include "ops/ops.h"
#include "testutil.h"

/* Inside a test looped over dtype (_i 0 f32, 1 bf16): NEED_GPU naming it. */
#define NEED_GPU_DT(name) NEED_GPU(_i ? name "(bf16)" : name "(f32)")

/* Integers in [0, maxv) on both devices. */
static tens t_rand_ints(pair *P, size_t n, int maxv, uint64_t stream)
{
    int *v = malloc(n * sizeof *v);
    ck_assert_ptr_nonnull(v);
    for (size_t i = 0; i < n; i++)
        v[i] = (int)(fsdp_rng_u64(P->seed, stream, i) % (uint64_t)maxv);
    tens t = t_ints(P, v, n);
    free(v);
    return t;
}

/* ---- tests that run everywhere ------------------------------------------- */

START_TEST(test_ops_table_complete)
{
    const struct fsdp_ops_i *t = fsdp_ops_cuda_iface();
    if (!built_with_cuda) {
        ck_assert_ptr_null(t);
        return;
    }
    ck_assert_ptr_nonnull(t);
    ck_assert_str_eq(t->name, "cuda");
    /* every slot after the name is a function */
    const void *const *slots = (const void *const *)((const char *)t + sizeof(const char *));
    size_t n_slots = (sizeof *t - sizeof(const char *)) / sizeof(void *);
    ck_assert_uint_ge(n_slots, 18); /* fini, 16 ops, sync_error */
    for (size_t i = 0; i < n_slots; i++)
        ck_assert_msg(slots[i] != NULL, "cuda op table slot %zu is NULL", i);
}
END_TEST

/* ---- ops against the cpu backend ------------------------------------------ */

typedef struct embed_args {
    tens *tok, *pos, *wte, *wpe, *out, *dout, *dwte, *dwpe; /* pos NULL: by column */
    int B, T, C;
} embed_args;

static void run_embed(fsdp_op_ctx *o, int gpu, const void *arg)
{
    const embed_args *a = arg;
    const int *pos = a->pos ? t_on(a->pos, gpu) : NULL;
    FSDP_OP(o, embed_fwd, t_on(a->out, gpu), t_on(a->tok, gpu), pos, t_on(a->wte, gpu),
            t_on(a->wpe, gpu), a->B, a->T, a->C);
    FSDP_OP(o, embed_bwd, t_on(a->dwte, gpu), t_on(a->dwpe, gpu), t_on(a->dout, gpu),
            t_on(a->tok, gpu), pos, a->B, a->T, a->C);
}

/* By column, then with positions (packed documents: any row of wpe, repeated). */
START_TEST(test_embed)
{
    NEED_GPU_DT("test_embed");
    pair P;
    fsdp_dtype dt = (fsdp_dtype)_i;
    pair_init(&P, dt);
    const int B = 3, T = 17, C = 72, V = 50, maxT = 20;
    tens tok = t_rand_ints(&P, (size_t)B * T, V, 1), pos = t_rand_ints(&P, (size_t)B * T, T, 7);
    tens wte = t_new(&P, (size_t)V * C, dt, 0.5f, 2), wpe = t_new(&P, (size_t)maxT * C, dt, 0.5f, 3);
    tens out = t_out(&P, (size_t)B * T * C, dt);
    tens dout = t_new(&P, (size_t)B * T * C, FSDP_DTYPE_F32, 1.0f, 4);
    tens dwte = t_new(&P, (size_t)V * C, FSDP_DTYPE_F32, 0.1f, 5);
    tens dwpe = t_new(&P, (size_t)maxT * C, FSDP_DTYPE_F32, 0.1f, 6);
    for (int with_pos = 0; with_pos < 2; with_pos++) {
        const embed_args a = {&tok, with_pos ? &pos : NULL, &wte, &wpe, &out, &dout, &dwte,
                              &dwpe, B, T, C};
        const t_check chk[] = {
            {"embed_fwd out", &out, dt == FSDP_DTYPE_BF16 ? 4e-3 : 0.0},
            /* same adds in the same order as the cpu: exact */
            {"embed_bwd dwte", &dwte, 0.0},
            {"embed_bwd dwpe", &dwpe, 0.0},
        };
        t_check_op(&P, run_embed, &a, chk, FSDP_TEST_LEN(chk));
    }
    T_FREE_ALL(&P, &tok, &pos, &wte, &wpe, &out, &dout, &dwte, &dwpe);
    pair_fini(&P);
}
END_TEST

typedef struct layernorm_args {
    tens *inp, *w, *b, *out, *mean, *rstd, *dout, *dinp, *dw, *db;
    int N, C;
} layernorm_args;

static void run_layernorm(fsdp_op_ctx *o, int gpu, const void *arg)
{
    const layernorm_args *a = arg;
    FSDP_OP(o, layernorm_fwd, t_on(a->out, gpu), t_on(a->mean, gpu), t_on(a->rstd, gpu),
            t_on(a->inp, gpu), t_on(a->w, gpu), t_on(a->b, gpu), a->N, a->C);
    FSDP_OP(o, layernorm_bwd, a->dinp ? t_on(a->dinp, gpu) : NULL, t_on(a->dw, gpu),
            t_on(a->db, gpu), t_on(a->dout, gpu), t_on(a->inp, gpu), t_on(a->w, gpu),
            t_on(a->mean, gpu), t_on(a->rstd, gpu), a->N, a->C);
}

START_TEST(test_layernorm)
{
    NEED_GPU_DT("test_layernorm");
    pair P;
    fsdp_dtype dt = (fsdp_dtype)_i;
    pair_init(&P, dt);
    const int N = 150, C = 200; /* > 64 rows: several column-sum chunks */
    tens inp = t_new(&P, (size_t)N * C, dt, 2.0f, 10), w = t_new(&P, C, dt, 1.0f, 11);
    tens b = t_new(&P, C, dt, 1.0f, 12), out = t_out(&P, (size_t)N * C, dt);
    tens mean = t_out(&P, N, FSDP_DTYPE_F32), rstd = t_out(&P, N, FSDP_DTYPE_F32);
    tens dout = t_new(&P, (size_t)N * C, FSDP_DTYPE_F32, 1.0f, 13);
    tens dinp = t_new(&P, (size_t)N * C, FSDP_DTYPE_F32, 0.5f, 14);
    tens dw = t_new(&P, C, FSDP_DTYPE_F32, 0.5f, 15), db = t_new(&P, C, FSDP_DTYPE_F32, 0.5f, 16);
    const layernorm_args a = {&inp, &w, &b, &out, &mean, &rstd, &dout, &dinp, &dw, &db, N, C};
    const t_check chk[] = {
        {"layernorm_fwd out", &out, tol_for(dt, 1e-5)},
        {"layernorm_fwd mean", &mean, 1e-6},
        {"layernorm_fwd rstd", &rstd, 1e-6},
        {"layernorm_bwd dinp", &dinp, 1e-4},
        {"layernorm_bwd dw", &dw, 1e-4},
        {"layernorm_bwd db", &db, 1e-5},
    };
    t_check_op(&P, run_layernorm, &a, chk, FSDP_TEST_LEN(chk));
    T_FREE_ALL(&P, &inp, &w, &b, &out, &mean, &rstd, &dout, &dinp, &dw, &db);
    pair_fini(&P);
}
END_TEST

/* matmul_bwd on side gpu; NULL tensors are NULL gradients (skipped). */
static void matmul_bwd_on(fsdp_op_ctx *o, int gpu, tens *dinp, tens *dw, tens *dbias,
                          const tens *dout, const tens *inp, const tens *w, int N, int C, int OC)
{
    FSDP_OP(o, matmul_bwd, dinp ? t_on(dinp, gpu) : NULL, dw ? t_on(dw, gpu) : NULL,
            dbias ? t_on(dbias, gpu) : NULL, t_on(dout, gpu), t_on(inp, gpu), t_on(w, gpu), N, C,
            OC);
}

typedef struct matmul_args {
    tens *inp, *w, *bias, *out, *out2, *dout, *dinp, *dw, *dbias;
    int N, C, OC;
} matmul_args;

/* Forward with and without bias (unless out is NULL), then backward. */
static void run_matmul(fsdp_op_ctx *o, int gpu, const void *arg)
{
    const matmul_args *a = arg;
    if (a->out) {
        FSDP_OP(o, matmul_fwd, t_on(a->out, gpu), t_on(a->inp, gpu), t_on(a->w, gpu),
                t_on(a->bias, gpu), a->N, a->C, a->OC);
        FSDP_OP(o, matmul_fwd, t_on(a->out2, gpu), t_on(a->inp, gpu), t_on(a->w, gpu), NULL,
                a->N, a->C, a->OC);
    }
    matmul_bwd_on(o, gpu, a->dinp, a->dw, a->dbias, a->dout, a->inp, a->w, a->N, a->C, a->OC);
}

START_TEST(test_matmul)
{
    NEED_GPU_DT("test_matmul");
    pair P;
    fsdp_dtype dt = (fsdp_dtype)_i;
    pair_init(&P, dt);
    const int N = 70, C = 96, OC = 136;
    tens inp = t_new(&P, (size_t)N * C, dt, 1.0f, 20), w = t_new(&P, (size_t)OC * C, dt, 0.2f, 21);
    tens bias = t_new(&P, OC, dt, 1.0f, 22);
    tens out = t_out(&P, (size_t)N * OC, dt), out2 = t_out(&P, (size_t)N * OC, dt);
    tens dout = t_new(&P, (size_t)N * OC, FSDP_DTYPE_F32, 1.0f, 23);
    tens dinp = t_new(&P, (size_t)N * C, FSDP_DTYPE_F32, 0.5f, 24);
    tens dw = t_new(&P, (size_t)OC * C, FSDP_DTYPE_F32, 0.5f, 25);
    tens dbias = t_new(&P, OC, FSDP_DTYPE_F32, 0.5f, 26);
    const matmul_args a = {&inp, &w, &bias, &out, &out2, &dout, &dinp, &dw, &dbias, N, C, OC};
    const t_check chk[] = {
        {"matmul_fwd out", &out, tol_for(dt, 1e-4)},
        {"matmul_fwd out (no bias)", &out2, tol_for(dt, 1e-4)},
        {"matmul_bwd dinp", &dinp, tol_for(dt, 1e-4)},
        {"matmul_bwd dw", &dw, tol_for(dt, 1e-4)},
        {"matmul_bwd dbias", &dbias, 1e-5},
    };
    t_check_op(&P, run_matmul, &a, chk, FSDP_TEST_LEN(chk));
    /* NULL gradients are skipped: only dinp changes */
    t_upload(&P, &dinp);
    t_upload(&P, &dw);
    matmul_bwd_on(&P.og, 1, &dinp, NULL, NULL, &dout, &inp, &w, N, C, OC);
    gpu_done(&P);
    float *gw = t_get(&P, &dw, 1);
    ck_assert(memcmp(gw, dw.init, dw.n * sizeof(float)) == 0);
    free(gw);
    T_FREE_ALL(&P, &inp, &w, &bias, &out, &out2, &dout, &dinp, &dw, &dbias);
    pair_fini(&P);
}
END_TEST

/* bf16 matmul backward over several low-precision chunks of dout (the
 * cuda op rounds dout to bf16 in chunks of 32 Mi elements): the GPT-2
 * head's shape, OC = 50304 (padded vocabulary), 1400 rows = chunks of 667,
 * 667 and 66 rows; the head at B*T = 8192 runs 13 of them. */
START_TEST(test_matmul_bwd_head_chunks)
{
    NEED_GPU("test_matmul_bwd_head_chunks");
    pair P;
    pair_init(&P, FSDP_DTYPE_BF16);
    const int N = 1400, C = 32, OC = 50304;
    ck_assert_uint_gt((size_t)N * OC, 2 * ((size_t)32 << 20)); /* three chunks */
    tens inp = t_new(&P, (size_t)N * C, FSDP_DTYPE_BF16, 1.0f, 80);
    tens w = t_new(&P, (size_t)OC * C, FSDP_DTYPE_BF16, 0.2f, 81);
    tens dout = t_new(&P, (size_t)N * OC, FSDP_DTYPE_F32, 1.0f, 82);
    tens dinp = t_new(&P, (size_t)N * C, FSDP_DTYPE_F32, 0.5f, 83);
    tens dw = t_new(&P, (size_t)OC * C, FSDP_DTYPE_F32, 0.5f, 84);
    tens dbias = t_new(&P, OC, FSDP_DTYPE_F32, 0.5f, 85);
    const matmul_args a = {&inp, &w, NULL, NULL, NULL, &dout, &dinp, &dw, &dbias, N, C, OC};
    const t_check chk[] = {
        {"matmul_bwd dinp (3 chunks)", &dinp, 1e-2},
        {"matmul_bwd dw (3 chunks)", &dw, 1e-2},
        {"matmul_bwd dbias (1400 rows)", &dbias, 1e-5},
    };
    t_compare(&P, run_matmul, &a, chk, FSDP_TEST_LEN(chk), NULL);
    T_FREE_ALL(&P, &inp, &w, &dout, &dinp, &dw, &dbias);
    pair_fini(&P);
}
END_TEST

typedef struct lora_args {
    tens *inp, *A, *B, *out, *u, *dout, *dinp, *dA, *dB, *dv;
    int N, C, r, OC, ld, col0;
    float scale;
} lora_args;

/* The LoRA branch into columns [col0, col0 + OC) of rows ld wide (the q of
 * a fused q|k|v), then its backward from a dout laid out the same way. */
static void run_lora(fsdp_op_ctx *o, int gpu, const void *arg)
{
    const lora_args *a = arg;
    size_t off = (size_t)a->col0 * fsdp_dtype_size(o->dt);
    FSDP_OP(o, lora_fwd, (char *)t_on(a->out, gpu) + off, a->ld, t_on(a->u, gpu), a->r,
            t_on(a->inp, gpu), t_on(a->A, gpu), t_on(a->B, gpu), a->scale, a->N, a->C, a->r,
            a->OC);
    FSDP_OP(o, lora_bwd, t_on(a->dinp, gpu), t_on(a->dA, gpu), t_on(a->dB, gpu),
            t_on(a->dv, gpu), a->r, (const float *)t_on(a->dout, gpu) + a->col0, a->ld,
            t_on(a->inp, gpu), t_on(a->u, gpu), t_on(a->A, gpu), t_on(a->B, gpu), a->scale, a->N,
            a->C, a->r, a->OC);
}

START_TEST(test_lora)
{
    NEED_GPU_DT("test_lora");
    pair P;
    fsdp_dtype dt = (fsdp_dtype)_i;
    pair_init(&P, dt);
    const int N = 70, C = 96, r = 8, OC = 40, ld = 3 * OC;
    tens inp = t_new(&P, (size_t)N * C, dt, 1.0f, 30), A = t_new(&P, (size_t)r * C, dt, 0.1f, 31);
    tens B = t_new(&P, (size_t)OC * r, dt, 0.5f, 32), out = t_new(&P, (size_t)N * ld, dt, 1.0f, 33);
    tens u = t_out(&P, (size_t)N * r, dt), dv = t_out(&P, (size_t)N * r, FSDP_DTYPE_F32);
    tens dout = t_new(&P, (size_t)N * ld, FSDP_DTYPE_F32, 1.0f, 34);
    tens dinp = t_new(&P, (size_t)N * C, FSDP_DTYPE_F32, 0.5f, 35);
    tens dA = t_new(&P, (size_t)r * C, FSDP_DTYPE_F32, 0.5f, 36);
    tens dB = t_new(&P, (size_t)OC * r, FSDP_DTYPE_F32, 0.5f, 37);
    const lora_args a = {&inp, &A, &B, &out, &u, &dout, &dinp, &dA, &dB, &dv,
                         N, C, r, OC, ld, OC, 2.0f};
    /* bf16: u and out rounded once on each side, dinp and dA from dv rounded
     * to bf16 on the gpu only; dv and dB are fp32 products on both */
    const t_check chk[] = {
        {"lora_fwd out", &out, tol_for(dt, 1e-4)},  {"lora_fwd u", &u, tol_for(dt, 1e-4)},
        {"lora_bwd dv", &dv, tol_for(dt, 1e-4)},    {"lora_bwd dB", &dB, tol_for(dt, 1e-4)},
        {"lora_bwd dA", &dA, tol_for(dt, 1e-4)},    {"lora_bwd dinp", &dinp, tol_for(dt, 1e-4)},
    };
    t_check_op(&P, run_lora, &a, chk, FSDP_TEST_LEN(chk));
    T_FREE_ALL(&P, &inp, &A, &B, &out, &u, &dv, &dout, &dinp, &dA, &dB);
    pair_fini(&P);
}
END_TEST

/* got[c] against init[c] + the double-precision column sum of x (rows, cols). */
static void expect_colsum(const char *what, const float *got, const float *init, const float *x,
                          int rows, int cols, double rtol)
{
    double *ref = calloc((size_t)cols, sizeof *ref);
    float *want = malloc((size_t)cols * sizeof *want);
    ck_assert(ref && want);
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++)
            ref[c] += x[(size_t)r * cols + c];
    for (int c = 0; c < cols; c++)
        want[c] = (float)((double)init[c] + ref[c]);
    expect_close(what, got, want, (size_t)cols, rtol);
    free(ref);
    free(want);
}

typedef struct colsum_args {
    matmul_args mm;
    layernorm_args ln;
} colsum_args;

static void run_colsum(fsdp_op_ctx *o, int gpu, const void *arg)
{
    const colsum_args *a = arg;
    run_matmul(o, gpu, &a->mm);
    run_layernorm(o, gpu, &a->ln);
}

/* Column sums over more rows than 256 chunks of 64 (16,384), where the
 * chunk count stops growing and the rows per chunk grow instead: matmul's
 * dbias and layernorm's dw and db, against the cpu and a double sum. */
START_TEST(test_colsum_many_rows)
{
    NEED_GPU("test_colsum_many_rows");
    pair P;
    pair_init(&P, FSDP_DTYPE_F32);
    const int N = 40000, C = 72, IC = 8;
    tens inp = t_new(&P, (size_t)N * IC, FSDP_DTYPE_F32, 1.0f, 90);
    tens w = t_new(&P, (size_t)C * IC, FSDP_DTYPE_F32, 0.2f, 91);
    tens dout = t_new(&P, (size_t)N * C, FSDP_DTYPE_F32, 1.0f, 92);
    tens dbias = t_new(&P, C, FSDP_DTYPE_F32, 0.5f, 93);
    /* layernorm over (N, C) */
    tens x = t_new(&P, (size_t)N * C, FSDP_DTYPE_F32, 2.0f, 94);
    tens lw = t_new(&P, C, FSDP_DTYPE_F32, 1.0f, 95), lb = t_new(&P, C, FSDP_DTYPE_F32, 1.0f, 96);
    tens out = t_out(&P, (size_t)N * C, FSDP_DTYPE_F32);
    tens mean = t_out(&P, N, FSDP_DTYPE_F32), rstd = t_out(&P, N, FSDP_DTYPE_F32);
    tens dw = t_new(&P, C, FSDP_DTYPE_F32, 0.5f, 97), db = t_new(&P, C, FSDP_DTYPE_F32, 0.5f, 98);
    const colsum_args a = {
        .mm = {&inp, &w, NULL, NULL, NULL, &dout, NULL, NULL, &dbias, N, IC, C},
        .ln = {&x, &lw, &lb, &out, &mean, &rstd, &dout, NULL, &dw, &db, N, C},
    };
    const t_check chk[] = {
        {"matmul_bwd dbias (40000 rows)", &dbias, 1e-5},
        {"layernorm_bwd dw (40000 rows)", &dw, 1e-4},
        {"layernorm_bwd db (40000 rows)", &db, 1e-5},
    };
    float *g[FSDP_TEST_LEN(chk)];
    t_compare(&P, run_colsum, &a, chk, FSDP_TEST_LEN(chk), g);
    expect_colsum("dbias vs a double sum", g[0], dbias.init, dout.init, N, C, 1e-6);
    expect_colsum("layernorm db vs a double sum", g[2], db.init, dout.init, N, C, 1e-6);
    for (size_t k = 0; k < FSDP_TEST_LEN(g); k++)
        free(g[k]);
    T_FREE_ALL(&P, &inp, &w, &dout, &dbias, &x, &lw, &lb, &out, &mean, &rstd, &dw, &db);
    pair_fini(&P);
}
END_TEST

typedef struct gelu_args {
    tens *x, *y, *out, *res, *dout, *dinp, *a32;
    size_t n;
} gelu_args;

static void run_gelu_residual_add(fsdp_op_ctx *o, int gpu, const void *arg)
{
    const gelu_args *a = arg;
    FSDP_OP(o, gelu_fwd, t_on(a->out, gpu), t_on(a->x, gpu), a->n);
    FSDP_OP(o, gelu_bwd, t_on(a->dinp, gpu), t_on(a->x, gpu), t_on(a->dout, gpu), a->n);
    FSDP_OP(o, residual_fwd, t_on(a->res, gpu), t_on(a->x, gpu), t_on(a->y, gpu), a->n);
    /* in place */
    FSDP_OP(o, add, t_on(a->a32, gpu), t_on(a->a32, gpu), t_on(a->dout, gpu), a->n);
}

START_TEST(test_gelu_residual_add)
{
    NEED_GPU_DT("test_gelu_residual_add");
    pair P;
    fsdp_dtype dt = (fsdp_dtype)_i;
    pair_init(&P, dt);
    const size_t n = 5000;
    tens x = t_new(&P, n, dt, 3.0f, 30), y = t_new(&P, n, dt, 1.0f, 31);
    tens out = t_out(&P, n, dt), res = t_out(&P, n, dt);
    tens dout = t_new(&P, n, FSDP_DTYPE_F32, 1.0f, 32), dinp = t_new(&P, n, FSDP_DTYPE_F32, 1.0f, 33);
    tens a32 = t_new(&P, n, FSDP_DTYPE_F32, 1.0f, 34);
    const gelu_args a = {&x, &y, &out, &res, &dout, &dinp, &a32, n};
    const t_check chk[] = {
        {"gelu_fwd", &out, tol_for(dt, 1e-5)},
        {"gelu_bwd", &dinp, 1e-5},
        {"residual_fwd", &res, 0.0},
        {"add", &a32, 0.0},
    };
    t_check_op(&P, run_gelu_residual_add, &a, chk, FSDP_TEST_LEN(chk));
    T_FREE_ALL(&P, &x, &y, &out, &res, &dout, &dinp, &a32);
    pair_fini(&P);
}
END_TEST

typedef struct attention_args {
    tens *qkv, *att, *out, *dout, *dqkv, *datt;
    int B, T, C, NH;
} attention_args;

static void run_attention(fsdp_op_ctx *o, int gpu, const void *arg)
{
    const attention_args *a = arg;
    FSDP_OP(o, attention_fwd, t_on(a->out, gpu), t_on(a->att, gpu), t_on(a->qkv, gpu), a->B,
            a->T, a->C, a->NH);
    FSDP_OP(o, attention_bwd, t_on(a->dqkv, gpu), t_on(a->datt, gpu), t_on(a->dout, gpu),
            t_on(a->qkv, gpu), t_on(a->att, gpu), a->B, a->T, a->C, a->NH);
}

/* Attention forward and backward at one shape, against the cpu; att is
 * zero above the diagonal (poisoned first, so unwritten elements fail). */
static void check_attention(fsdp_dtype dt, int B, int T, int C, int NH)
{
    pair P;
    pair_init(&P, dt);
    const size_t nqkv = (size_t)B * T * 3 * C, natt = (size_t)B * NH * T * T, nout = (size_t)B * T * C;
    tens qkv = t_new(&P, nqkv, dt, 1.0f, 40);
    tens att = t_out(&P, natt, dt), out = t_out(&P, nout, dt);
    tens dout = t_new(&P, nout, FSDP_DTYPE_F32, 1.0f, 41);
    tens dqkv = t_new(&P, nqkv, FSDP_DTYPE_F32, 0.5f, 42);
    tens datt = t_out(&P, natt, FSDP_DTYPE_F32);
    const attention_args a = {&qkv, &att, &out, &dout, &dqkv, &datt, B, T, C, NH};
    const t_check chk[] = {
        {"attention_fwd att", &att, tol_for(dt, 1e-5)},
        {"attention_fwd out", &out, tol_for(dt, 1e-4)},
        {"attention_bwd dqkv", &dqkv, tol_for(dt, 1e-4)},
    };
    float *g[FSDP_TEST_LEN(chk)];
    t_compare(&P, run_attention, &a, chk, FSDP_TEST_LEN(chk), g);
    /* causal: zeros above the diagonal, written (the buffer was poisoned) */
    size_t above = 0;
    for (int bh = 0; bh < B * NH; bh++)
        for (int t = 0; t < T; t++)
            for (int j = t + 1; j < T; j++)
                above += g[0][((size_t)bh * T + t) * T + j] != 0.0f;
    ck_assert_msg(above == 0, "%zu attention weights above the diagonal are not 0", above);
    t_upload(&P, &datt); /* scratch the backward writes: poisoned again */
    t_rerun_same_bits(&P, run_attention, &a, chk, FSDP_TEST_LEN(chk), g);
    /* a bad head count is reported through sync_error, then cleared */
    FSDP_OP(&P.og, attention_fwd, out.g, att.g, qkv.g, B, T, C, C + 1);
    expect_sync_error(&P, "heads", NULL);
    T_FREE_ALL(&P, &qkv, &att, &out, &dout, &dqkv, &datt);
    pair_fini(&P);
}

START_TEST(test_attention)
{
    NEED_GPU_DT("test_attention");
    check_attention((fsdp_dtype)_i, 2, 33, 64, 4);
}
END_TEST

/* GPT-2's shape: head size 64, T 1024. */
START_TEST(test_attention_gpt2_shape)
{
    NEED_GPU_DT("test_attention_gpt2_shape");
    check_attention((fsdp_dtype)_i, 1, 1024, 128, 2);
}
END_TEST

typedef struct xent_args {
    tens *losses, *dlogits, *logits, *tgt;
    int N, V, Vp;
} xent_args;

static void run_xent(fsdp_op_ctx *o, int gpu, const void *arg)
{
    const xent_args *a = arg;
    FSDP_OP(o, xent_fwd_bwd, t_on(a->losses, gpu), t_on(a->dlogits, gpu),
            t_on(a->logits, gpu), t_on(a->tgt, gpu), a->N, a->V, a->Vp, 1.0f / a->N);
}

/* Cross-entropy forward and backward at one shape: losses and dlogits
 * (poisoned first) against the cpu, the padding columns written as 0, the
 * same bits twice; with fp32, dlogits aliasing logits gives the same. */
static void check_xent(fsdp_dtype dt, int N, int V, int Vp, uint64_t seed)
{
    pair P;
    pair_init(&P, dt);
    tens logits = t_new(&P, (size_t)N * Vp, dt, 3.0f, seed);
    tens tgt = t_rand_ints(&P, N, V, seed + 1);
    tens losses = t_out(&P, N, FSDP_DTYPE_F32);
    tens dlogits = t_out(&P, (size_t)N * Vp, FSDP_DTYPE_F32);
    const xent_args a = {&losses, &dlogits, &logits, &tgt, N, V, Vp};
    const t_check chk[] = {
        {"xent losses", &losses, 1e-5},
        {"xent dlogits", &dlogits, 1e-5},
    };
    float *g[FSDP_TEST_LEN(chk)];
    t_compare(&P, run_xent, &a, chk, FSDP_TEST_LEN(chk), g);
    size_t pad = 0;
    for (int i = 0; i < N; i++)
        for (int j = V; j < Vp; j++)
            pad += g[1][(size_t)i * Vp + j] != 0.0f;
    ck_assert_msg(pad == 0, "%zu padding gradients are not 0", pad);
    t_rerun_same_bits(&P, run_xent, &a, chk, FSDP_TEST_LEN(chk), g);
    if (dt == FSDP_DTYPE_F32) {
        float *sep = t_get(&P, &dlogits, 1);
        const xent_args inplace_args = {&losses, &logits, &logits, &tgt, N, V, Vp};
        run_xent(&P.og, 1, &inplace_args);
        gpu_done(&P);
        float *inplace = t_get(&P, &logits, 1);
        ck_assert_msg(memcmp(sep, inplace, logits.n * sizeof(float)) == 0,
                      "xent with dlogits aliasing logits differs");
        free(inplace);
        free(sep);
    }
    T_FREE_ALL(&P, &logits, &tgt, &losses, &dlogits);
    pair_fini(&P);
}

START_TEST(test_xent)
{
    NEED_GPU_DT("test_xent");
    check_xent((fsdp_dtype)_i, 40, 1000, 1024, 50); /* 128 threads per row */
}
END_TEST

/* GPT-2's vocabulary: the 512-thread path, forward and backward. */
START_TEST(test_xent_gpt2_vocab)
{
    NEED_GPU_DT("test_xent_gpt2_vocab");
    check_xent((fsdp_dtype)_i, 6, 50257, 50304, 53);
}
END_TEST

/* What the optimizer tests share: a pair, n parameters p (N(0, 1)) with
 * gradients g (0.3 N(0, 1)) from streams stream and stream + 1, and the
 * output copy po in out_dt (_i: 0 fp32, 1 bf16). */
typedef struct optim_case {
    pair P;
    tens p, g, po;
    fsdp_dtype out_dt;
    size_t n;
} optim_case;

static void optim_case_init(optim_case *c, fsdp_dtype out_dt, uint64_t stream)
{
    pair_init(&c->P, FSDP_DTYPE_F32);
    c->out_dt = out_dt;
    c->n = 10007;
    c->p = t_new(&c->P, c->n, FSDP_DTYPE_F32, 1.0f, stream);
    c->g = t_new(&c->P, c->n, FSDP_DTYPE_F32, 0.3f, stream + 1);
    c->po = t_out(&c->P, c->n, out_dt);
}

/* p and p_out bit for bit, then frees what optim_case_init made. */
static void optim_case_check_fini(optim_case *c, const char *opt)
{
    char what[64];
    pathf(what, sizeof what, "%s p", opt);
    expect_bits_equal(&c->P, what, &c->p);
    pathf(what, sizeof what, "%s p_out", opt);
    expect_bits_equal(&c->P, what, &c->po);
    T_FREE_ALL(&c->P, &c->p, &c->g, &c->po);
    pair_fini(&c->P);
}

/* AdamW: bit-identical to the cpu (the AdamW reference in ops/optim_kernels.h), p_out fp32 or bf16. */
START_TEST(test_adamw_bit_exact)
{
    NEED_GPU(_i ? "test_adamw_bit_exact(bf16 out)" : "test_adamw_bit_exact(f32 out)");
    optim_case c;
    optim_case_init(&c, (fsdp_dtype)_i, 60);
    tens m = t_new(&c.P, c.n, FSDP_DTYPE_F32, 0.01f, 62);
    tens v = t_new(&c.P, c.n, FSDP_DTYPE_F32, 0.0f, 0);
    for (int step = 1; step <= 3; step++) {
        float b1 = 0.9f, b2 = 0.95f;
        float bc1 = 1.0f - powf(b1, (float)step), bc2 = 1.0f - powf(b2, (float)step);
        for (int gpu = 0; gpu < 2; gpu++)
            FSDP_OP(pair_ops(&c.P, gpu), adamw, t_on(&c.p, gpu), t_on(&c.g, gpu), t_on(&m, gpu),
                    t_on(&v, gpu), c.n, 3e-4f, b1, b2, 1e-8f, 0.1f, bc1, bc2, 0.7f,
                    t_on(&c.po, gpu), c.out_dt);
    }
    gpu_done(&c.P);
    expect_bits_equal(&c.P, "adamw m", &m);
    expect_bits_equal(&c.P, "adamw v", &v);
    T_FREE_ALL(&c.P, &m, &v);
    optim_case_check_fini(&c, "adamw");
}
END_TEST

/* SGD with momentum: bit-identical to the cpu (fsdp_sgd_ref), p_out fp32 or bf16. */
START_TEST(test_sgd_bit_exact)
{
    NEED_GPU(_i ? "test_sgd_bit_exact(bf16 out)" : "test_sgd_bit_exact(f32 out)");
    optim_case c;
    optim_case_init(&c, (fsdp_dtype)_i, 63);
    tens buf = t_new(&c.P, c.n, FSDP_DTYPE_F32, 0.0f, 0);
    for (int step = 1; step <= 3; step++) {
        float wd = step == 2 ? 0.0f : 0.1f;
        for (int gpu = 0; gpu < 2; gpu++)
            FSDP_OP(pair_ops(&c.P, gpu), sgd, t_on(&c.p, gpu), t_on(&c.g, gpu), t_on(&buf, gpu),
                    c.n, 0.05f, 0.9f, wd, 0.7f, t_on(&c.po, gpu), c.out_dt);
    }
    gpu_done(&c.P);
    expect_bits_equal(&c.P, "sgd buf", &buf);
    t_free(&c.P, &buf);
    optim_case_check_fini(&c, "sgd");
}
END_TEST

/* cast (both directions, ties, NaN, inf) and sumsq_blocks: bit-identical. */
START_TEST(test_cast_sumsq_bit_exact)
{
    NEED_GPU("test_cast_sumsq_bit_exact");
    pair P;
    pair_init(&P, FSDP_DTYPE_F32);
    const size_t n = 3 * FSDP_NORM_BLOCK + 77; /* a short last block */
    tens x = t_new(&P, n, FSDP_DTYPE_F32, 10.0f, 70);
    /* specials: ties to even, NaN, infinities, denormals */
    uint32_t specials[] = {0x3f808000u, 0x3f818000u, 0x7fc00001u, 0xffa00000u, 0x7f800000u,
                           0xff800000u, 0x00000001u, 0x807fffffu, 0x7f7fffffu, 0x3f80ffffu};
    for (size_t k = 0; k < sizeof specials / sizeof *specials; k++)
        memcpy(&x.init[k], &specials[k], 4);
    t_upload(&P, &x);
    tens h = t_out(&P, n, FSDP_DTYPE_BF16), back = t_out(&P, n, FSDP_DTYPE_F32);
    tens same = t_out(&P, n, FSDP_DTYPE_F32);
    for (int gpu = 0; gpu < 2; gpu++) {
        fsdp_op_ctx *o = pair_ops(&P, gpu);
        FSDP_OP(o, cast, t_on(&h, gpu), FSDP_DTYPE_BF16, t_on(&x, gpu), FSDP_DTYPE_F32, n);
        FSDP_OP(o, cast, t_on(&back, gpu), FSDP_DTYPE_F32, t_on(&h, gpu), FSDP_DTYPE_BF16, n);
        FSDP_OP(o, cast, t_on(&same, gpu), FSDP_DTYPE_F32, t_on(&x, gpu), FSDP_DTYPE_F32, n);
    }
    gpu_done(&P);
    void *hb = malloc(n * 2);
    ck_assert_int_eq(fsdp_device_memcpy(&P.gpu, hb, h.g, n * 2, NULL), FSDP_STATUS_OK);
    ck_assert_int_eq(fsdp_device_stream_sync(&P.gpu, P.gpu.compute), FSDP_STATUS_OK);
    ck_assert_msg(memcmp(hb, h.c, n * 2) == 0, "cast f32->bf16 differs from the cpu");
    free(hb);
    expect_bits_equal(&P, "cast bf16->f32", &back);
    expect_bits_equal(&P, "cast f32->f32", &same);
    /* sums of squares of finite values only */
    tens y = t_new(&P, n, FSDP_DTYPE_F32, 10.0f, 71);
    size_t nb = (n + FSDP_NORM_BLOCK - 1) / FSDP_NORM_BLOCK;
    tens sq = t_out(&P, nb, FSDP_DTYPE_F32);
    FSDP_OP(&P.oc, sumsq_blocks, sq.c, y.c, n);
    FSDP_OP(&P.og, sumsq_blocks, sq.g, y.g, n);
    gpu_done(&P);
    expect_bits_equal(&P, "sumsq_blocks", &sq);
    T_FREE_ALL(&P, &x, &h, &back, &same, &y, &sq);
    pair_fini(&P);
}
END_TEST

/* nf4_dequant: bit-identical to the cpu on random code bytes and absmax
 * values (a zero block, one near the fp32 maximum, a subnormal one), fp32
 * and bf16 out, over more blocks than one grid-stride pass covers. */
START_TEST(test_nf4_dequant_bit_exact)
{
    NEED_GPU_DT("test_nf4_dequant_bit_exact");
    pair P;
    pair_init(&P, (fsdp_dtype)_i);
    const size_t n = (size_t)64 * 4099;
    int *words = malloc(n / 8 * sizeof *words);
    ck_assert_ptr_nonnull(words);
    for (size_t i = 0; i < n / 8; i++)
        words[i] = (int)(uint32_t)fsdp_rng_u64(P.seed, 80, i);
    tens codes = t_ints(&P, words, n / 8); /* n / 2 code bytes */
    free(words);
    tens absmax = t_new(&P, n / 64, FSDP_DTYPE_F32, 3.0f, 81);
    absmax.init[0] = 0.0f, absmax.init[1] = 3.3e38f, absmax.init[2] = 1e-39f;
    t_upload(&P, &absmax);
    tens out = t_out(&P, n, (fsdp_dtype)_i);
    for (int gpu = 0; gpu < 2; gpu++)
        FSDP_OP(pair_ops(&P, gpu), nf4_dequant, t_on(&out, gpu), t_on(&codes, gpu),
                t_on(&absmax, gpu), n);
    gpu_done(&P);
    expect_bits_equal(&P, "nf4_dequant", &out);
    T_FREE_ALL(&P, &codes, &absmax, &out);
    pair_fini(&P);
}
END_TEST

int main(void)
{
    /* Nothing CUDA here: Check forks each test, and CUDA must not be
     * initialised in the parent. */
    const fsdp_test_tcase tcases[] = {
        {"everywhere", FSDP_TESTS(test_ops_table_complete)},
        {"ops", 120,
         FSDP_TESTS(FSDP_TEST_LOOP(test_embed, 2), FSDP_TEST_LOOP(test_layernorm, 2),
                    FSDP_TEST_LOOP(test_matmul, 2), test_matmul_bwd_head_chunks,
                    FSDP_TEST_LOOP(test_lora, 2),
                    test_colsum_many_rows, FSDP_TEST_LOOP(test_gelu_residual_add, 2),
                    FSDP_TEST_LOOP(test_attention, 2), FSDP_TEST_LOOP(test_attention_gpt2_shape, 2),
                    FSDP_TEST_LOOP(test_xent, 2), FSDP_TEST_LOOP(test_xent_gpt2_vocab, 2),
                    FSDP_TEST_LOOP(test_adamw_bit_exact, 2), FSDP_TEST_LOOP(test_sgd_bit_exact, 2),
                    test_cast_sumsq_bit_exact,
                    FSDP_TEST_LOOP(test_nf4_dequant_bit_exact, 2))},
    };
    return fsdp_test_main("cuda_ops", tcases, FSDP_TEST_LEN(tcases));
}
