/*
 * test_cuda_ops.c - every cuda op against the cpu backend on the same
 * inputs (per-op tolerance; embed_bwd, residual, add exactly; AdamW, cast
 * and sumsq_blocks bit for bit), determinism (the same op twice gives the
 * same bits), and the op error path (sync_error).
 *
 * Every output an op writes (rather than accumulates into) is poisoned with
 * 0xFF bytes (NaN in fp32 and bf16) on both devices before every run, so
 * an element an op fails to write fails the comparison instead of matching
 * a zero-initialised buffer. Shapes include the production ones that take
 * other code paths: bf16 matmul backward over several low-precision chunks
 * (the GPT-2 head), column sums over more than 16,384 rows, cross-entropy
 * backward on its 512-thread path, attention with head size 64 at T 1024.
 * Without a GPU every test prints a SKIP line and passes (cuda_test.h).
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/bf16.h"
#include "core/rng.h"
#include "cuda_test.h"
#include "device/device.h"
#include "ops/ops.h"
#include "testutil.h"

/* A tensor on both devices with the same initial contents. */
typedef struct tens {
    void *c, *g;
    size_t n;
    fsdp_dtype dt;
    float *init; /* values exactly representable in dt */
} tens;

static void to_dt(void *dst, fsdp_dtype dt, const float *src, size_t n)
{
    if (dt == FSDP_DTYPE_BF16)
        for (size_t i = 0; i < n; i++)
            ((fsdp_bf16 *)dst)[i] = fsdp_f32_to_bf16(src[i]);
    else
        memcpy(dst, src, n * sizeof(float));
}

static void t_upload(pair *P, tens *t)
{
    size_t bytes = t->n * fsdp_dtype_size(t->dt);
    to_dt(t->c, t->dt, t->init, t->n);
    ck_assert_int_eq(fsdp_device_memcpy(&P->gpu, t->g, t->c, bytes, NULL), FSDP_STATUS_OK);
    ck_assert_int_eq(fsdp_device_stream_sync(&P->gpu, P->gpu.compute), FSDP_STATUS_OK);
}

/* n values std * N(0, 1) (std 0: zeros), rounded to dt. */
static tens t_new(pair *P, size_t n, fsdp_dtype dt, float std, uint64_t stream)
{
    tens t = {.n = n, .dt = dt};
    size_t bytes = n * fsdp_dtype_size(dt);
    t.init = malloc(n * sizeof(float));
    ck_assert_ptr_nonnull(t.init);
    for (size_t i = 0; i < n; i++) {
        float v = std ? std * fsdp_rng_normal(SEED, stream, i) : 0.0f;
        t.init[i] = dt == FSDP_DTYPE_BF16 ? fsdp_bf16_to_f32(fsdp_f32_to_bf16(v)) : v;
    }
    ck_assert_int_eq(fsdp_device_alloc(&P->cpu, bytes, FSDP_MEM_OTHER, "test", &t.c), FSDP_STATUS_OK);
    ck_assert_int_eq(fsdp_device_alloc(&P->gpu, bytes, FSDP_MEM_OTHER, "test", &t.g), FSDP_STATUS_OK);
    t_upload(P, &t);
    return t;
}

/* Integers in [0, maxv) on both devices. */
static tens t_ints(pair *P, size_t n, int maxv, uint64_t stream)
{
    tens t = {.n = n, .dt = FSDP_DTYPE_F32};
    ck_assert_int_eq(fsdp_device_alloc(&P->cpu, n * 4, FSDP_MEM_OTHER, "ints", &t.c), FSDP_STATUS_OK);
    ck_assert_int_eq(fsdp_device_alloc(&P->gpu, n * 4, FSDP_MEM_OTHER, "ints", &t.g), FSDP_STATUS_OK);
    int *v = t.c;
    for (size_t i = 0; i < n; i++)
        v[i] = (int)(fsdp_rng_u64(SEED, stream, i) % (uint64_t)maxv);
    ck_assert_int_eq(fsdp_device_memcpy(&P->gpu, t.g, t.c, n * 4, NULL), FSDP_STATUS_OK);
    ck_assert_int_eq(fsdp_device_stream_sync(&P->gpu, P->gpu.compute), FSDP_STATUS_OK);
    return t;
}

/* Contents as fp32 (malloc'd): the cpu copy, or the gpu copy. */
static float *t_get(pair *P, const tens *t, int gpu)
{
    size_t bytes = t->n * fsdp_dtype_size(t->dt);
    void *raw = malloc(bytes ? bytes : 1);
    float *out = malloc(t->n * sizeof(float) + 1);
    ck_assert(raw && out);
    if (gpu) {
        ck_assert_int_eq(fsdp_device_memcpy(&P->gpu, raw, t->g, bytes, NULL), FSDP_STATUS_OK);
        ck_assert_int_eq(fsdp_device_stream_sync(&P->gpu, P->gpu.compute), FSDP_STATUS_OK);
    } else {
        memcpy(raw, t->c, bytes);
    }
    if (t->dt == FSDP_DTYPE_BF16)
        for (size_t i = 0; i < t->n; i++)
            out[i] = fsdp_bf16_to_f32(((fsdp_bf16 *)raw)[i]);
    else
        memcpy(out, raw, bytes);
    free(raw);
    return out;
}

/* An output: allocated on both devices, contents poisoned (t_poison). */
static tens t_out(pair *P, size_t n, fsdp_dtype dt)
{
    tens t = t_new(P, n, dt, 0.0f, 0);
    memset(t.init, 0xFF, n * sizeof(float));
    t_upload(P, &t);
    return t;
}

/* Fill an output with 0xFF bytes on both devices (NaN in fp32 and in
 * bf16), in stream order before the next op: an element the op does not
 * write then fails every comparison. */
static void t_poison(pair *P, tens *t)
{
    size_t bytes = t->n * fsdp_dtype_size(t->dt);
    memset(t->c, 0xFF, bytes);
    ck_assert_int_eq(fsdp_device_memset(&P->gpu, t->g, 0xFF, bytes, NULL), FSDP_STATUS_OK);
}

static void t_free(pair *P, tens *t)
{
    fsdp_device_free(&P->cpu, t->c);
    fsdp_device_free(&P->gpu, t->g);
    free(t->init);
    t->c = t->g = NULL;
    t->init = NULL;
}

/* |got - want| <= rtol * (|want| + max|want|) everywhere. */
static void expect_close(const char *what, const float *got, const float *want, size_t n,
                         double rtol)
{
    double mx = 0.0;
    for (size_t i = 0; i < n; i++)
        mx = fmax(mx, fabs((double)want[i]));
    size_t bad = 0, first = 0;
    double worst = 0.0;
    for (size_t i = 0; i < n; i++) {
        double err = fabs((double)got[i] - (double)want[i]);
        double tol = rtol * (fabs((double)want[i]) + mx) + 1e-30;
        if (!(err <= tol)) {
            if (!bad++)
                first = i;
        }
        if (err / (fabs((double)want[i]) + mx + 1e-30) > worst)
            worst = err / (fabs((double)want[i]) + mx + 1e-30);
    }
    ck_assert_msg(bad == 0,
                  "%s: %zu of %zu elements differ beyond rtol %g (first [%zu]: cuda %.9g vs cpu "
                  "%.9g; worst relative %.3g)",
                  what, bad, n, rtol, first, got[first], want[first], worst);
}

/* Compare tensor t on both sides; gpu_copy receives the gpu values. */
static void expect_pair(pair *P, const char *what, const tens *t, double rtol, float **gpu_copy)
{
    float *c = t_get(P, t, 0), *g = t_get(P, t, 1);
    expect_close(what, g, c, t->n, rtol);
    if (gpu_copy)
        *gpu_copy = g;
    else
        free(g);
    free(c);
}

/* The gpu contents of t equal `prev` bit for bit (frees prev). */
static void expect_same_bits(pair *P, const char *what, const tens *t, float *prev)
{
    float *g = t_get(P, t, 1);
    ck_assert_msg(memcmp(g, prev, t->n * sizeof(float)) == 0,
                  "%s: running the same cuda op twice gave different bits", what);
    free(g);
    free(prev);
}

static double tol_for(fsdp_dtype dt, double f32_tol) { return dt == FSDP_DTYPE_BF16 ? 1e-2 : f32_tol; }

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

START_TEST(test_embed)
{
    NEED_GPU(_i ? "test_embed(bf16)" : "test_embed(f32)");
    pair P;
    fsdp_dtype dt = (fsdp_dtype)_i;
    pair_init(&P, dt);
    const int B = 3, T = 17, C = 72, V = 50, maxT = 20;
    tens tok = t_ints(&P, (size_t)B * T, V, 1);
    tens wte = t_new(&P, (size_t)V * C, dt, 0.5f, 2), wpe = t_new(&P, (size_t)maxT * C, dt, 0.5f, 3);
    tens out = t_out(&P, (size_t)B * T * C, dt);
    tens dout = t_new(&P, (size_t)B * T * C, FSDP_DTYPE_F32, 1.0f, 4);
    tens dwte = t_new(&P, (size_t)V * C, FSDP_DTYPE_F32, 0.1f, 5);
    tens dwpe = t_new(&P, (size_t)maxT * C, FSDP_DTYPE_F32, 0.1f, 6);
    FSDP_OP(&P.oc, embed_fwd, out.c, tok.c, wte.c, wpe.c, B, T, C);
    FSDP_OP(&P.og, embed_fwd, out.g, tok.g, wte.g, wpe.g, B, T, C);
    FSDP_OP(&P.oc, embed_bwd, dwte.c, dwpe.c, dout.c, tok.c, B, T, C);
    FSDP_OP(&P.og, embed_bwd, dwte.g, dwpe.g, dout.g, tok.g, B, T, C);
    gpu_done(&P);
    float *g_out, *g_dwte, *g_dwpe;
    expect_pair(&P, "embed_fwd out", &out, dt == FSDP_DTYPE_BF16 ? 4e-3 : 0.0, &g_out);
    /* same adds in the same order as the cpu: exact */
    expect_pair(&P, "embed_bwd dwte", &dwte, 0.0, &g_dwte);
    expect_pair(&P, "embed_bwd dwpe", &dwpe, 0.0, &g_dwpe);
    t_upload(&P, &dwte);
    t_upload(&P, &dwpe);
    t_poison(&P, &out);
    FSDP_OP(&P.og, embed_fwd, out.g, tok.g, wte.g, wpe.g, B, T, C);
    FSDP_OP(&P.og, embed_bwd, dwte.g, dwpe.g, dout.g, tok.g, B, T, C);
    gpu_done(&P);
    expect_same_bits(&P, "embed_fwd", &out, g_out);
    expect_same_bits(&P, "embed_bwd dwte", &dwte, g_dwte);
    expect_same_bits(&P, "embed_bwd dwpe", &dwpe, g_dwpe);
    tens *all[] = {&tok, &wte, &wpe, &out, &dout, &dwte, &dwpe};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        t_free(&P, all[i]);
    pair_fini(&P);
}
END_TEST

START_TEST(test_layernorm)
{
    NEED_GPU(_i ? "test_layernorm(bf16)" : "test_layernorm(f32)");
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
    FSDP_OP(&P.oc, layernorm_fwd, out.c, mean.c, rstd.c, inp.c, w.c, b.c, N, C);
    FSDP_OP(&P.og, layernorm_fwd, out.g, mean.g, rstd.g, inp.g, w.g, b.g, N, C);
    FSDP_OP(&P.oc, layernorm_bwd, dinp.c, dw.c, db.c, dout.c, inp.c, w.c, mean.c, rstd.c, N, C);
    FSDP_OP(&P.og, layernorm_bwd, dinp.g, dw.g, db.g, dout.g, inp.g, w.g, mean.g, rstd.g, N, C);
    gpu_done(&P);
    float *g[6];
    expect_pair(&P, "layernorm_fwd out", &out, tol_for(dt, 1e-5), &g[0]);
    expect_pair(&P, "layernorm_fwd mean", &mean, 1e-6, &g[1]);
    expect_pair(&P, "layernorm_fwd rstd", &rstd, 1e-6, &g[2]);
    expect_pair(&P, "layernorm_bwd dinp", &dinp, 1e-4, &g[3]);
    expect_pair(&P, "layernorm_bwd dw", &dw, 1e-4, &g[4]);
    expect_pair(&P, "layernorm_bwd db", &db, 1e-5, &g[5]);
    t_upload(&P, &dinp);
    t_upload(&P, &dw);
    t_upload(&P, &db);
    t_poison(&P, &out);
    t_poison(&P, &mean);
    t_poison(&P, &rstd);
    FSDP_OP(&P.og, layernorm_fwd, out.g, mean.g, rstd.g, inp.g, w.g, b.g, N, C);
    FSDP_OP(&P.og, layernorm_bwd, dinp.g, dw.g, db.g, dout.g, inp.g, w.g, mean.g, rstd.g, N, C);
    gpu_done(&P);
    expect_same_bits(&P, "layernorm_fwd out", &out, g[0]);
    expect_same_bits(&P, "layernorm_fwd mean", &mean, g[1]);
    expect_same_bits(&P, "layernorm_fwd rstd", &rstd, g[2]);
    expect_same_bits(&P, "layernorm_bwd dinp", &dinp, g[3]);
    expect_same_bits(&P, "layernorm_bwd dw", &dw, g[4]);
    expect_same_bits(&P, "layernorm_bwd db", &db, g[5]);
    tens *all[] = {&inp, &w, &b, &out, &mean, &rstd, &dout, &dinp, &dw, &db};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        t_free(&P, all[i]);
    pair_fini(&P);
}
END_TEST

START_TEST(test_matmul)
{
    NEED_GPU(_i ? "test_matmul(bf16)" : "test_matmul(f32)");
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
    FSDP_OP(&P.oc, matmul_fwd, out.c, inp.c, w.c, bias.c, N, C, OC);
    FSDP_OP(&P.og, matmul_fwd, out.g, inp.g, w.g, bias.g, N, C, OC);
    FSDP_OP(&P.oc, matmul_fwd, out2.c, inp.c, w.c, NULL, N, C, OC);
    FSDP_OP(&P.og, matmul_fwd, out2.g, inp.g, w.g, NULL, N, C, OC);
    FSDP_OP(&P.oc, matmul_bwd, dinp.c, dw.c, dbias.c, dout.c, inp.c, w.c, N, C, OC);
    FSDP_OP(&P.og, matmul_bwd, dinp.g, dw.g, dbias.g, dout.g, inp.g, w.g, N, C, OC);
    gpu_done(&P);
    float *g[5];
    expect_pair(&P, "matmul_fwd out", &out, tol_for(dt, 1e-4), &g[0]);
    expect_pair(&P, "matmul_fwd out (no bias)", &out2, tol_for(dt, 1e-4), &g[1]);
    expect_pair(&P, "matmul_bwd dinp", &dinp, tol_for(dt, 1e-4), &g[2]);
    expect_pair(&P, "matmul_bwd dw", &dw, tol_for(dt, 1e-4), &g[3]);
    expect_pair(&P, "matmul_bwd dbias", &dbias, 1e-5, &g[4]);
    t_upload(&P, &dinp);
    t_upload(&P, &dw);
    t_upload(&P, &dbias);
    t_poison(&P, &out);
    t_poison(&P, &out2);
    FSDP_OP(&P.og, matmul_fwd, out.g, inp.g, w.g, bias.g, N, C, OC);
    FSDP_OP(&P.og, matmul_fwd, out2.g, inp.g, w.g, NULL, N, C, OC);
    FSDP_OP(&P.og, matmul_bwd, dinp.g, dw.g, dbias.g, dout.g, inp.g, w.g, N, C, OC);
    gpu_done(&P);
    expect_same_bits(&P, "matmul_fwd", &out, g[0]);
    expect_same_bits(&P, "matmul_fwd (no bias)", &out2, g[1]);
    expect_same_bits(&P, "matmul_bwd dinp", &dinp, g[2]);
    expect_same_bits(&P, "matmul_bwd dw", &dw, g[3]);
    expect_same_bits(&P, "matmul_bwd dbias", &dbias, g[4]);
    /* NULL gradients are skipped: only dinp changes */
    t_upload(&P, &dinp);
    t_upload(&P, &dw);
    FSDP_OP(&P.og, matmul_bwd, dinp.g, NULL, NULL, dout.g, inp.g, w.g, N, C, OC);
    gpu_done(&P);
    float *gw = t_get(&P, &dw, 1);
    ck_assert(memcmp(gw, dw.init, dw.n * sizeof(float)) == 0);
    free(gw);
    tens *all[] = {&inp, &w, &bias, &out, &out2, &dout, &dinp, &dw, &dbias};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        t_free(&P, all[i]);
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
    FSDP_OP(&P.oc, matmul_bwd, dinp.c, dw.c, dbias.c, dout.c, inp.c, w.c, N, C, OC);
    FSDP_OP(&P.og, matmul_bwd, dinp.g, dw.g, dbias.g, dout.g, inp.g, w.g, N, C, OC);
    gpu_done(&P);
    expect_pair(&P, "matmul_bwd dinp (3 chunks)", &dinp, 1e-2, NULL);
    expect_pair(&P, "matmul_bwd dw (3 chunks)", &dw, 1e-2, NULL);
    expect_pair(&P, "matmul_bwd dbias (1400 rows)", &dbias, 1e-5, NULL);
    tens *all[] = {&inp, &w, &dout, &dinp, &dw, &dbias};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        t_free(&P, all[i]);
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
    FSDP_OP(&P.oc, matmul_bwd, NULL, NULL, dbias.c, dout.c, inp.c, w.c, N, IC, C);
    FSDP_OP(&P.og, matmul_bwd, NULL, NULL, dbias.g, dout.g, inp.g, w.g, N, IC, C);
    /* layernorm over (N, C) */
    tens x = t_new(&P, (size_t)N * C, FSDP_DTYPE_F32, 2.0f, 94);
    tens lw = t_new(&P, C, FSDP_DTYPE_F32, 1.0f, 95), lb = t_new(&P, C, FSDP_DTYPE_F32, 1.0f, 96);
    tens out = t_out(&P, (size_t)N * C, FSDP_DTYPE_F32);
    tens mean = t_out(&P, N, FSDP_DTYPE_F32), rstd = t_out(&P, N, FSDP_DTYPE_F32);
    tens dw = t_new(&P, C, FSDP_DTYPE_F32, 0.5f, 97), db = t_new(&P, C, FSDP_DTYPE_F32, 0.5f, 98);
    FSDP_OP(&P.oc, layernorm_fwd, out.c, mean.c, rstd.c, x.c, lw.c, lb.c, N, C);
    FSDP_OP(&P.og, layernorm_fwd, out.g, mean.g, rstd.g, x.g, lw.g, lb.g, N, C);
    FSDP_OP(&P.oc, layernorm_bwd, NULL, dw.c, db.c, dout.c, x.c, lw.c, mean.c, rstd.c, N, C);
    FSDP_OP(&P.og, layernorm_bwd, NULL, dw.g, db.g, dout.g, x.g, lw.g, mean.g, rstd.g, N, C);
    gpu_done(&P);
    float *g_dbias = NULL, *g_db = NULL;
    expect_pair(&P, "matmul_bwd dbias (40000 rows)", &dbias, 1e-5, &g_dbias);
    expect_pair(&P, "layernorm_bwd dw (40000 rows)", &dw, 1e-4, NULL);
    expect_pair(&P, "layernorm_bwd db (40000 rows)", &db, 1e-5, &g_db);
    expect_colsum("dbias vs a double sum", g_dbias, dbias.init, dout.init, N, C, 1e-6);
    expect_colsum("layernorm db vs a double sum", g_db, db.init, dout.init, N, C, 1e-6);
    free(g_dbias);
    free(g_db);
    tens *all[] = {&inp, &w, &dout, &dbias, &x, &lw, &lb, &out, &mean, &rstd, &dw, &db};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        t_free(&P, all[i]);
    pair_fini(&P);
}
END_TEST

START_TEST(test_gelu_residual_add)
{
    NEED_GPU(_i ? "test_gelu_residual_add(bf16)" : "test_gelu_residual_add(f32)");
    pair P;
    fsdp_dtype dt = (fsdp_dtype)_i;
    pair_init(&P, dt);
    const size_t n = 5000;
    tens x = t_new(&P, n, dt, 3.0f, 30), y = t_new(&P, n, dt, 1.0f, 31);
    tens out = t_out(&P, n, dt), res = t_out(&P, n, dt);
    tens dout = t_new(&P, n, FSDP_DTYPE_F32, 1.0f, 32), dinp = t_new(&P, n, FSDP_DTYPE_F32, 1.0f, 33);
    tens a32 = t_new(&P, n, FSDP_DTYPE_F32, 1.0f, 34);
    FSDP_OP(&P.oc, gelu_fwd, out.c, x.c, n);
    FSDP_OP(&P.og, gelu_fwd, out.g, x.g, n);
    FSDP_OP(&P.oc, gelu_bwd, dinp.c, x.c, dout.c, n);
    FSDP_OP(&P.og, gelu_bwd, dinp.g, x.g, dout.g, n);
    FSDP_OP(&P.oc, residual_fwd, res.c, x.c, y.c, n);
    FSDP_OP(&P.og, residual_fwd, res.g, x.g, y.g, n);
    FSDP_OP(&P.oc, add, a32.c, a32.c, dout.c, n); /* in place */
    FSDP_OP(&P.og, add, a32.g, a32.g, dout.g, n);
    gpu_done(&P);
    float *g[4];
    expect_pair(&P, "gelu_fwd", &out, tol_for(dt, 1e-5), &g[0]);
    expect_pair(&P, "gelu_bwd", &dinp, 1e-5, &g[1]);
    expect_pair(&P, "residual_fwd", &res, 0.0, &g[2]);
    expect_pair(&P, "add", &a32, 0.0, &g[3]);
    t_upload(&P, &dinp);
    t_upload(&P, &a32);
    t_poison(&P, &out);
    t_poison(&P, &res);
    FSDP_OP(&P.og, gelu_fwd, out.g, x.g, n);
    FSDP_OP(&P.og, gelu_bwd, dinp.g, x.g, dout.g, n);
    FSDP_OP(&P.og, residual_fwd, res.g, x.g, y.g, n);
    FSDP_OP(&P.og, add, a32.g, a32.g, dout.g, n);
    gpu_done(&P);
    expect_same_bits(&P, "gelu_fwd", &out, g[0]);
    expect_same_bits(&P, "gelu_bwd", &dinp, g[1]);
    expect_same_bits(&P, "residual_fwd", &res, g[2]);
    expect_same_bits(&P, "add", &a32, g[3]);
    tens *all[] = {&x, &y, &out, &res, &dout, &dinp, &a32};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        t_free(&P, all[i]);
    pair_fini(&P);
}
END_TEST

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
    FSDP_OP(&P.oc, attention_fwd, out.c, att.c, qkv.c, B, T, C, NH);
    FSDP_OP(&P.og, attention_fwd, out.g, att.g, qkv.g, B, T, C, NH);
    FSDP_OP(&P.oc, attention_bwd, dqkv.c, datt.c, dout.c, qkv.c, att.c, B, T, C, NH);
    FSDP_OP(&P.og, attention_bwd, dqkv.g, datt.g, dout.g, qkv.g, att.g, B, T, C, NH);
    gpu_done(&P);
    float *g[3];
    expect_pair(&P, "attention_fwd att", &att, tol_for(dt, 1e-5), &g[0]);
    expect_pair(&P, "attention_fwd out", &out, tol_for(dt, 1e-4), &g[1]);
    expect_pair(&P, "attention_bwd dqkv", &dqkv, tol_for(dt, 1e-4), &g[2]);
    /* causal: zeros above the diagonal, written (the buffer was poisoned) */
    size_t above = 0;
    for (int bh = 0; bh < B * NH; bh++)
        for (int t = 0; t < T; t++)
            for (int j = t + 1; j < T; j++)
                above += g[0][((size_t)bh * T + t) * T + j] != 0.0f;
    ck_assert_msg(above == 0, "%zu attention weights above the diagonal are not 0", above);
    t_upload(&P, &dqkv);
    t_poison(&P, &att);
    t_poison(&P, &out);
    t_poison(&P, &datt);
    FSDP_OP(&P.og, attention_fwd, out.g, att.g, qkv.g, B, T, C, NH);
    FSDP_OP(&P.og, attention_bwd, dqkv.g, datt.g, dout.g, qkv.g, att.g, B, T, C, NH);
    gpu_done(&P);
    expect_same_bits(&P, "attention_fwd att", &att, g[0]);
    expect_same_bits(&P, "attention_fwd out", &out, g[1]);
    expect_same_bits(&P, "attention_bwd dqkv", &dqkv, g[2]);
    /* a bad head count is reported through sync_error, then cleared */
    FSDP_OP(&P.og, attention_fwd, out.g, att.g, qkv.g, B, T, C, C + 1);
    ck_assert_int_eq(fsdp_device_stream_sync(&P.gpu, P.gpu.compute), FSDP_STATUS_OK);
    ck_assert_int_eq(P.og.iface->sync_error(&P.og), FSDP_STATUS_INVALID_ARG);
    ck_assert(strstr(fsdp_error_msg(), "heads") != NULL);
    ck_assert_int_eq(P.og.iface->sync_error(&P.og), FSDP_STATUS_OK);
    tens *all[] = {&qkv, &att, &out, &dout, &dqkv, &datt};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        t_free(&P, all[i]);
    pair_fini(&P);
}

START_TEST(test_attention)
{
    NEED_GPU(_i ? "test_attention(bf16)" : "test_attention(f32)");
    check_attention((fsdp_dtype)_i, 2, 33, 64, 4);
}
END_TEST

/* GPT-2's shape: head size 64, T 1024. */
START_TEST(test_attention_gpt2_shape)
{
    NEED_GPU(_i ? "test_attention_gpt2_shape(bf16)" : "test_attention_gpt2_shape(f32)");
    check_attention((fsdp_dtype)_i, 1, 1024, 128, 2);
}
END_TEST

/* Cross-entropy forward and backward at one shape: losses and dlogits
 * (poisoned first) against the cpu, the padding columns written as 0, the
 * same bits twice; with fp32, dlogits aliasing logits gives the same. */
static void check_xent(fsdp_dtype dt, int N, int V, int Vp, uint64_t seed)
{
    pair P;
    pair_init(&P, dt);
    tens logits = t_new(&P, (size_t)N * Vp, dt, 3.0f, seed);
    tens tgt = t_ints(&P, N, V, seed + 1);
    tens losses = t_out(&P, N, FSDP_DTYPE_F32);
    tens dlogits = t_out(&P, (size_t)N * Vp, FSDP_DTYPE_F32);
    const float dloss = 1.0f / N;
    FSDP_OP(&P.oc, xent_fwd_bwd, losses.c, dlogits.c, logits.c, tgt.c, N, V, Vp, dloss);
    FSDP_OP(&P.og, xent_fwd_bwd, losses.g, dlogits.g, logits.g, tgt.g, N, V, Vp, dloss);
    gpu_done(&P);
    float *g[2];
    expect_pair(&P, "xent losses", &losses, 1e-5, &g[0]);
    expect_pair(&P, "xent dlogits", &dlogits, 1e-5, &g[1]);
    size_t pad = 0;
    for (int i = 0; i < N; i++)
        for (int j = V; j < Vp; j++)
            pad += g[1][(size_t)i * Vp + j] != 0.0f;
    ck_assert_msg(pad == 0, "%zu padding gradients are not 0", pad);
    t_poison(&P, &losses);
    t_poison(&P, &dlogits);
    FSDP_OP(&P.og, xent_fwd_bwd, losses.g, dlogits.g, logits.g, tgt.g, N, V, Vp, dloss);
    gpu_done(&P);
    float *sep = t_get(&P, &dlogits, 1);
    expect_same_bits(&P, "xent losses", &losses, g[0]);
    expect_same_bits(&P, "xent dlogits", &dlogits, g[1]);
    if (dt == FSDP_DTYPE_F32) {
        FSDP_OP(&P.og, xent_fwd_bwd, losses.g, (float *)logits.g, logits.g, tgt.g, N, V, Vp,
                dloss);
        gpu_done(&P);
        float *inplace = t_get(&P, &logits, 1);
        ck_assert_msg(memcmp(sep, inplace, logits.n * sizeof(float)) == 0,
                      "xent with dlogits aliasing logits differs");
        free(inplace);
    }
    free(sep);
    tens *all[] = {&logits, &tgt, &losses, &dlogits};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        t_free(&P, all[i]);
    pair_fini(&P);
}

START_TEST(test_xent)
{
    NEED_GPU(_i ? "test_xent(bf16)" : "test_xent(f32)");
    check_xent((fsdp_dtype)_i, 40, 1000, 1024, 50); /* 128 threads per row */
}
END_TEST

/* GPT-2's vocabulary: the 512-thread path, forward and backward. */
START_TEST(test_xent_gpt2_vocab)
{
    NEED_GPU(_i ? "test_xent_gpt2_vocab(bf16)" : "test_xent_gpt2_vocab(f32)");
    check_xent((fsdp_dtype)_i, 6, 50257, 50304, 53);
}
END_TEST

/* AdamW: bit-identical to the cpu (the AdamW reference in ops/cpu/optim_kernels.h), p_out fp32 or bf16. */
START_TEST(test_adamw_bit_exact)
{
    NEED_GPU(_i ? "test_adamw_bit_exact(bf16 out)" : "test_adamw_bit_exact(f32 out)");
    pair P;
    fsdp_dtype out_dt = (fsdp_dtype)_i;
    pair_init(&P, FSDP_DTYPE_F32);
    const size_t n = 10007;
    tens p = t_new(&P, n, FSDP_DTYPE_F32, 1.0f, 60), g = t_new(&P, n, FSDP_DTYPE_F32, 0.3f, 61);
    tens m = t_new(&P, n, FSDP_DTYPE_F32, 0.01f, 62), v = t_new(&P, n, FSDP_DTYPE_F32, 0.0f, 0);
    tens po = t_out(&P, n, out_dt);
    for (int step = 1; step <= 3; step++) {
        float b1 = 0.9f, b2 = 0.95f;
        float bc1 = 1.0f - powf(b1, (float)step), bc2 = 1.0f - powf(b2, (float)step);
        FSDP_OP(&P.oc, adamw, p.c, g.c, m.c, v.c, n, 3e-4f, b1, b2, 1e-8f, 0.1f, bc1, bc2, 0.7f,
                po.c, out_dt);
        FSDP_OP(&P.og, adamw, p.g, g.g, m.g, v.g, n, 3e-4f, b1, b2, 1e-8f, 0.1f, bc1, bc2, 0.7f,
                po.g, out_dt);
    }
    gpu_done(&P);
    tens *chk[] = {&p, &m, &v, &po};
    const char *names[] = {"p", "m", "v", "p_out"};
    for (int k = 0; k < 4; k++) {
        float *c = t_get(&P, chk[k], 0), *gg = t_get(&P, chk[k], 1);
        for (size_t i = 0; i < n; i++)
            ck_assert_msg(memcmp(&c[i], &gg[i], 4) == 0, "adamw %s[%zu]: cuda %.9g vs cpu %.9g",
                          names[k], i, gg[i], c[i]);
        free(c);
        free(gg);
    }
    tens *all[] = {&p, &g, &m, &v, &po};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        t_free(&P, all[i]);
    pair_fini(&P);
}
END_TEST

/* SGD with momentum: bit-identical to the cpu (fsdp_sgd_ref), p_out fp32 or bf16. */
START_TEST(test_sgd_bit_exact)
{
    NEED_GPU(_i ? "test_sgd_bit_exact(bf16 out)" : "test_sgd_bit_exact(f32 out)");
    pair P;
    fsdp_dtype out_dt = (fsdp_dtype)_i;
    pair_init(&P, FSDP_DTYPE_F32);
    const size_t n = 10007;
    tens p = t_new(&P, n, FSDP_DTYPE_F32, 1.0f, 63), g = t_new(&P, n, FSDP_DTYPE_F32, 0.3f, 64);
    tens buf = t_new(&P, n, FSDP_DTYPE_F32, 0.0f, 0), po = t_out(&P, n, out_dt);
    for (int step = 1; step <= 3; step++) {
        float wd = step == 2 ? 0.0f : 0.1f;
        FSDP_OP(&P.oc, sgd, p.c, g.c, buf.c, n, 0.05f, 0.9f, wd, 0.7f, po.c, out_dt);
        FSDP_OP(&P.og, sgd, p.g, g.g, buf.g, n, 0.05f, 0.9f, wd, 0.7f, po.g, out_dt);
    }
    gpu_done(&P);
    tens *chk[] = {&p, &buf, &po};
    const char *names[] = {"p", "buf", "p_out"};
    for (int k = 0; k < 3; k++) {
        float *c = t_get(&P, chk[k], 0), *gg = t_get(&P, chk[k], 1);
        for (size_t i = 0; i < n; i++)
            ck_assert_msg(memcmp(&c[i], &gg[i], 4) == 0, "sgd %s[%zu]: cuda %.9g vs cpu %.9g",
                          names[k], i, gg[i], c[i]);
        free(c);
        free(gg);
    }
    tens *all[] = {&p, &g, &buf, &po};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        t_free(&P, all[i]);
    pair_fini(&P);
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
    FSDP_OP(&P.oc, cast, h.c, FSDP_DTYPE_BF16, x.c, FSDP_DTYPE_F32, n);
    FSDP_OP(&P.og, cast, h.g, FSDP_DTYPE_BF16, x.g, FSDP_DTYPE_F32, n);
    FSDP_OP(&P.oc, cast, back.c, FSDP_DTYPE_F32, h.c, FSDP_DTYPE_BF16, n);
    FSDP_OP(&P.og, cast, back.g, FSDP_DTYPE_F32, h.g, FSDP_DTYPE_BF16, n);
    FSDP_OP(&P.oc, cast, same.c, FSDP_DTYPE_F32, x.c, FSDP_DTYPE_F32, n);
    FSDP_OP(&P.og, cast, same.g, FSDP_DTYPE_F32, x.g, FSDP_DTYPE_F32, n);
    gpu_done(&P);
    void *hb = malloc(n * 2);
    ck_assert_int_eq(fsdp_device_memcpy(&P.gpu, hb, h.g, n * 2, NULL), FSDP_STATUS_OK);
    ck_assert_int_eq(fsdp_device_stream_sync(&P.gpu, P.gpu.compute), FSDP_STATUS_OK);
    ck_assert_msg(memcmp(hb, h.c, n * 2) == 0, "cast f32->bf16 differs from the cpu");
    free(hb);
    tens *cmp[] = {&back, &same};
    for (int k = 0; k < 2; k++) {
        float *c = t_get(&P, cmp[k], 0), *g = t_get(&P, cmp[k], 1);
        ck_assert_msg(memcmp(c, g, n * 4) == 0, "cast %d differs from the cpu", k);
        free(c);
        free(g);
    }
    /* sums of squares of finite values only */
    tens y = t_new(&P, n, FSDP_DTYPE_F32, 10.0f, 71);
    size_t nb = (n + FSDP_NORM_BLOCK - 1) / FSDP_NORM_BLOCK;
    tens sq = t_out(&P, nb, FSDP_DTYPE_F32);
    FSDP_OP(&P.oc, sumsq_blocks, sq.c, y.c, n);
    FSDP_OP(&P.og, sumsq_blocks, sq.g, y.g, n);
    gpu_done(&P);
    float *c = t_get(&P, &sq, 0), *g = t_get(&P, &sq, 1);
    ck_assert_msg(memcmp(c, g, nb * 4) == 0, "sumsq_blocks differs from the cpu (%.9g vs %.9g)",
                  g[0], c[0]);
    free(c);
    free(g);
    tens *all[] = {&x, &h, &back, &same, &y, &sq};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        t_free(&P, all[i]);
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
                    test_colsum_many_rows, FSDP_TEST_LOOP(test_gelu_residual_add, 2),
                    FSDP_TEST_LOOP(test_attention, 2), FSDP_TEST_LOOP(test_attention_gpt2_shape, 2),
                    FSDP_TEST_LOOP(test_xent, 2), FSDP_TEST_LOOP(test_xent_gpt2_vocab, 2),
                    FSDP_TEST_LOOP(test_adamw_bit_exact, 2), FSDP_TEST_LOOP(test_sgd_bit_exact, 2),
                    test_cast_sumsq_bit_exact)},
    };
    return fsdp_test_main("cuda_ops", tcases, FSDP_TEST_LEN(tcases));
}
