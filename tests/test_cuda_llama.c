/*
 * test_cuda_llama.c - the Llama-family cuda ops (RMSNorm, rotary
 * embeddings, SwiGLU, grouped-query attention) against the cpu backend on
 * the same inputs, in fp32 and bf16, with per-op tolerances; outputs that
 * the ops overwrite start poisoned with NaN on the GPU, so an element a
 * kernel forgets shows up; gradients start from random values, so the
 * accumulation is checked; the same op twice gives the same bits; bad
 * shapes are reported through sync_error.
 *
 * Without a GPU every test but the table test prints a SKIP line and
 * passes (cuda_test.h). Builds with CUDA=0 compile the same file.
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
#include "ops/rope_table.h"
#include "testutil.h"

#define LLAMA_SEED 4321u

/* A tensor on both devices. init holds its fp32 values (representable in
 * dt); poisoned tensors start as NaN on the GPU and zero on the cpu. */
typedef struct tens {
    void *c, *g;
    size_t n;
    fsdp_dtype dt;
    float *init;
    int poison;
} tens;

static size_t t_bytes(const tens *t) { return t->n * fsdp_dtype_size(t->dt); }

static void t_upload(pair *P, tens *t)
{
    if (t->dt == FSDP_DTYPE_BF16)
        for (size_t i = 0; i < t->n; i++)
            ((fsdp_bf16 *)t->c)[i] = fsdp_f32_to_bf16(t->init[i]);
    else
        memcpy(t->c, t->init, t->n * sizeof(float));
    if (t->poison) /* all-ones bytes: NaN in fp32 and in bf16 */
        ck_assert_int_eq(fsdp_device_memset(&P->gpu, t->g, 0xff, t_bytes(t), NULL),
                         FSDP_STATUS_OK);
    else
        ck_assert_int_eq(fsdp_device_memcpy(&P->gpu, t->g, t->c, t_bytes(t), NULL),
                         FSDP_STATUS_OK);
    ck_assert_int_eq(fsdp_device_stream_sync(&P->gpu, P->gpu.compute), FSDP_STATUS_OK);
}

/* n values std * N(0, 1) rounded to dt; std < 0: a poisoned output. */
static tens t_new(pair *P, size_t n, fsdp_dtype dt, float std, uint64_t stream)
{
    tens t = {.n = n, .dt = dt, .poison = std < 0.0f};
    t.init = calloc(n ? n : 1, sizeof(float));
    ck_assert_ptr_nonnull(t.init);
    for (size_t i = 0; std > 0.0f && i < n; i++) {
        float v = std * fsdp_rng_normal(LLAMA_SEED, stream, i);
        t.init[i] = dt == FSDP_DTYPE_BF16 ? fsdp_bf16_to_f32(fsdp_f32_to_bf16(v)) : v;
    }
    ck_assert_int_eq(fsdp_device_alloc(&P->cpu, t_bytes(&t), FSDP_MEM_OTHER, "t", &t.c),
                     FSDP_STATUS_OK);
    ck_assert_int_eq(fsdp_device_alloc(&P->gpu, t_bytes(&t), FSDP_MEM_OTHER, "t", &t.g),
                     FSDP_STATUS_OK);
    t_upload(P, &t);
    return t;
}

/* An int32 array on both devices. */
static tens t_ints(pair *P, const int *v, size_t n)
{
    tens t = {.n = n, .dt = FSDP_DTYPE_F32};
    t.init = calloc(n, sizeof(float));
    ck_assert_ptr_nonnull(t.init);
    memcpy(t.init, v, n * sizeof(int));
    ck_assert_int_eq(fsdp_device_alloc(&P->cpu, n * 4, FSDP_MEM_OTHER, "i", &t.c), FSDP_STATUS_OK);
    ck_assert_int_eq(fsdp_device_alloc(&P->gpu, n * 4, FSDP_MEM_OTHER, "i", &t.g), FSDP_STATUS_OK);
    t_upload(P, &t);
    return t;
}

/* Contents as fp32 (malloc'd), from the cpu or the gpu copy. */
static float *t_get(pair *P, const tens *t, int gpu)
{
    void *raw = malloc(t_bytes(t) + 4);
    float *out = malloc(t->n * sizeof(float) + 4);
    ck_assert(raw && out);
    if (gpu) {
        ck_assert_int_eq(fsdp_device_memcpy(&P->gpu, raw, t->g, t_bytes(t), NULL),
                         FSDP_STATUS_OK);
        ck_assert_int_eq(fsdp_device_stream_sync(&P->gpu, P->gpu.compute), FSDP_STATUS_OK);
    } else {
        memcpy(raw, t->c, t_bytes(t));
    }
    if (t->dt == FSDP_DTYPE_BF16)
        for (size_t i = 0; i < t->n; i++)
            out[i] = fsdp_bf16_to_f32(((fsdp_bf16 *)raw)[i]);
    else
        memcpy(out, raw, t_bytes(t));
    free(raw);
    return out;
}

static void t_free(pair *P, tens *t)
{
    fsdp_device_free(&P->cpu, t->c);
    fsdp_device_free(&P->gpu, t->g);
    free(t->init);
}

/* cuda vs cpu: |g - c| <= rtol * (|c| + max|c|) everywhere (NaN fails).
 * The gpu values are kept in *keep for the determinism check. */
static void expect_pair(pair *P, const char *what, const tens *t, double rtol, float **keep)
{
    float *c = t_get(P, t, 0), *g = t_get(P, t, 1);
    double mx = 0.0;
    for (size_t i = 0; i < t->n; i++)
        mx = fmax(mx, fabs(c[i]));
    for (size_t i = 0; i < t->n; i++) {
        double err = fabs((double)g[i] - c[i]);
        ck_assert_msg(err <= rtol * (fabs(c[i]) + mx),
                      "%s[%zu] (%s): cuda %.9g vs cpu %.9g (rtol %g)", what, i,
                      fsdp_dtype_name(P->dt), g[i], c[i], rtol);
    }
    free(c);
    *keep = g;
}

/* The gpu contents of t equal prev bit for bit (frees prev). */
static void expect_same_bits(pair *P, const char *what, const tens *t, float *prev)
{
    float *g = t_get(P, t, 1);
    ck_assert_msg(memcmp(g, prev, t->n * sizeof(float)) == 0,
                  "%s: the same cuda op twice gave different bits", what);
    free(g), free(prev);
}

static double tol(fsdp_dtype dt, double f32) { return dt == FSDP_DTYPE_BF16 ? 1e-2 : f32; }

/* ---- everywhere ------------------------------------------------------------------ */

START_TEST(test_table_has_llama_ops)
{
    const struct fsdp_ops_i *t = fsdp_ops_cuda_iface();
#ifdef FSDP_CUDA
    ck_assert_ptr_nonnull(t);
    ck_assert(t->rmsnorm_fwd && t->rmsnorm_bwd && t->rope_fwd && t->rope_bwd && t->swiglu_fwd &&
              t->swiglu_bwd && t->attention_gqa_fwd && t->attention_gqa_bwd);
#else
    ck_assert_ptr_null(t);
#endif
    ck_assert(fsdp_ops_cpu_i.rmsnorm_fwd && fsdp_ops_cpu_i.attention_gqa_bwd);
}
END_TEST

/* ---- ops against the cpu ------------------------------------------------------------ */

START_TEST(test_rmsnorm)
{
    NEED_GPU(_i ? "test_rmsnorm(bf16)" : "test_rmsnorm(f32)");
    pair P;
    const fsdp_dtype dt = (fsdp_dtype)_i;
    pair_init(&P, dt);
    const int N = 150, C = 200; /* > 64 rows: several dw chunks */
    const size_t n = (size_t)N * C;
    tens inp = t_new(&P, n, dt, 2.0f, 1), w = t_new(&P, C, dt, 1.0f, 2);
    tens out = t_new(&P, n, dt, -1.0f, 0), rstd = t_new(&P, N, FSDP_DTYPE_F32, -1.0f, 0);
    tens dout = t_new(&P, n, FSDP_DTYPE_F32, 1.0f, 3);
    tens dinp = t_new(&P, n, FSDP_DTYPE_F32, 0.5f, 4), dw = t_new(&P, C, FSDP_DTYPE_F32, 0.5f, 5);
    float *k[4];
    FSDP_OP(&P.oc, rmsnorm_fwd, out.c, rstd.c, inp.c, w.c, 1e-5f, N, C);
    FSDP_OP(&P.og, rmsnorm_fwd, out.g, rstd.g, inp.g, w.g, 1e-5f, N, C);
    FSDP_OP(&P.oc, rmsnorm_bwd, dinp.c, dw.c, dout.c, inp.c, w.c, rstd.c, N, C);
    FSDP_OP(&P.og, rmsnorm_bwd, dinp.g, dw.g, dout.g, inp.g, w.g, rstd.g, N, C);
    gpu_done(&P);
    expect_pair(&P, "rmsnorm out", &out, tol(dt, 1e-5), &k[0]);
    expect_pair(&P, "rmsnorm rstd", &rstd, 1e-6, &k[1]);
    expect_pair(&P, "rmsnorm dinp", &dinp, 1e-4, &k[2]);
    expect_pair(&P, "rmsnorm dw", &dw, 1e-4, &k[3]);
    t_upload(&P, &out), t_upload(&P, &rstd), t_upload(&P, &dinp), t_upload(&P, &dw);
    FSDP_OP(&P.og, rmsnorm_fwd, out.g, rstd.g, inp.g, w.g, 1e-5f, N, C);
    FSDP_OP(&P.og, rmsnorm_bwd, dinp.g, dw.g, dout.g, inp.g, w.g, rstd.g, N, C);
    gpu_done(&P);
    expect_same_bits(&P, "rmsnorm out", &out, k[0]);
    expect_same_bits(&P, "rmsnorm rstd", &rstd, k[1]);
    expect_same_bits(&P, "rmsnorm dinp", &dinp, k[2]);
    expect_same_bits(&P, "rmsnorm dw", &dw, k[3]);
    tens *all[] = {&inp, &w, &out, &rstd, &dout, &dinp, &dw};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        t_free(&P, all[i]);
    pair_fini(&P);
}
END_TEST

/* _i: bit 0 dtype, bit 1 with a position array (packed documents). */
START_TEST(test_rope)
{
    const fsdp_dtype dt = (fsdp_dtype)(_i & 1);
    const int use_pos = _i >> 1;
    NEED_GPU("test_rope");
    pair P;
    pair_init(&P, dt);
    const int B = 3, T = 37, NH = 6, NKV = 2, hd = 64, QS = (NH + 2 * NKV) * hd;
    const size_t n = (size_t)B * T * QS;
    fsdp_rope_spec rs = {.type = FSDP_ROPE_LLAMA3, .theta = 5e5, .factor = 8,
                         .low_freq_factor = 1, .high_freq_factor = 4, .original_max_pos = 64};
    float invf[32];
    ck_assert_int_eq(fsdp_rope_inv_freq(&rs, hd, invf), FSDP_STATUS_OK);
    int posv[3 * 37];
    for (int i = 0; i < B * T; i++)
        posv[i] = (i % T) < 20 ? i % T : i % T - 20;
    tens inv = t_new(&P, hd / 2, FSDP_DTYPE_F32, 0.0f, 0);
    memcpy(inv.init, invf, sizeof invf);
    t_upload(&P, &inv);
    tens pos = t_ints(&P, posv, (size_t)B * T);
    tens x = t_new(&P, n, dt, 2.0f, 10), dx = t_new(&P, n, FSDP_DTYPE_F32, 1.0f, 11);
    const int *pc = use_pos ? pos.c : NULL, *pg = use_pos ? pos.g : NULL;
    float *k[2];
    FSDP_OP(&P.oc, rope_fwd, x.c, inv.c, pc, B, T, NH + NKV, hd, QS);
    FSDP_OP(&P.og, rope_fwd, x.g, inv.g, pg, B, T, NH + NKV, hd, QS);
    FSDP_OP(&P.oc, rope_bwd, dx.c, inv.c, pc, B, T, NH + NKV, hd, QS);
    FSDP_OP(&P.og, rope_bwd, dx.g, inv.g, pg, B, T, NH + NKV, hd, QS);
    gpu_done(&P);
    expect_pair(&P, "rope x", &x, tol(dt, 1e-5), &k[0]);
    expect_pair(&P, "rope dx", &dx, 1e-5, &k[1]);
    t_upload(&P, &x), t_upload(&P, &dx);
    FSDP_OP(&P.og, rope_fwd, x.g, inv.g, pg, B, T, NH + NKV, hd, QS);
    FSDP_OP(&P.og, rope_bwd, dx.g, inv.g, pg, B, T, NH + NKV, hd, QS);
    gpu_done(&P);
    expect_same_bits(&P, "rope x", &x, k[0]);
    expect_same_bits(&P, "rope dx", &dx, k[1]);
    /* an odd head size is reported, then cleared */
    FSDP_OP(&P.og, rope_fwd, x.g, inv.g, pg, B, T, NH + NKV, hd - 1, QS);
    ck_assert_int_eq(fsdp_device_stream_sync(&P.gpu, P.gpu.compute), FSDP_STATUS_OK);
    ck_assert_int_eq(P.og.iface->sync_error(&P.og), FSDP_STATUS_INVALID_ARG);
    ck_assert(strstr(fsdp_error_msg(), "rope_fwd") && strstr(fsdp_error_msg(), "even"));
    ck_assert_int_eq(P.og.iface->sync_error(&P.og), FSDP_STATUS_OK);
    tens *all[] = {&inv, &pos, &x, &dx};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        t_free(&P, all[i]);
    pair_fini(&P);
}
END_TEST

START_TEST(test_swiglu)
{
    NEED_GPU(_i ? "test_swiglu(bf16)" : "test_swiglu(f32)");
    pair P;
    const fsdp_dtype dt = (fsdp_dtype)_i;
    pair_init(&P, dt);
    const int N = 97, IC = 131;
    const size_t ni = (size_t)N * 2 * IC, no = (size_t)N * IC;
    tens inp = t_new(&P, ni, dt, 4.0f, 20), out = t_new(&P, no, dt, -1.0f, 0);
    tens dout = t_new(&P, no, FSDP_DTYPE_F32, 1.0f, 21);
    tens dinp = t_new(&P, ni, FSDP_DTYPE_F32, 0.5f, 22);
    float *k[2];
    FSDP_OP(&P.oc, swiglu_fwd, out.c, inp.c, N, IC);
    FSDP_OP(&P.og, swiglu_fwd, out.g, inp.g, N, IC);
    FSDP_OP(&P.oc, swiglu_bwd, dinp.c, inp.c, dout.c, N, IC);
    FSDP_OP(&P.og, swiglu_bwd, dinp.g, inp.g, dout.g, N, IC);
    gpu_done(&P);
    expect_pair(&P, "swiglu out", &out, tol(dt, 1e-5), &k[0]);
    expect_pair(&P, "swiglu dinp", &dinp, 1e-5, &k[1]);
    t_upload(&P, &out), t_upload(&P, &dinp);
    FSDP_OP(&P.og, swiglu_fwd, out.g, inp.g, N, IC);
    FSDP_OP(&P.og, swiglu_bwd, dinp.g, inp.g, dout.g, N, IC);
    gpu_done(&P);
    expect_same_bits(&P, "swiglu out", &out, k[0]);
    expect_same_bits(&P, "swiglu dinp", &dinp, k[1]);
    tens *all[] = {&inp, &out, &dout, &dinp};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        t_free(&P, all[i]);
    pair_fini(&P);
}
END_TEST

/* _i: bit 0 dtype; bits 1-2 the head layout: GQA (8 q / 2 kv heads),
 * MQA (6 / 1), MHA (4 / 4), GQA with packed positions. */
START_TEST(test_attention_gqa)
{
    static const int layouts[4][3] = {{8, 2, 0}, {6, 1, 0}, {4, 4, 0}, {8, 2, 1}};
    const fsdp_dtype dt = (fsdp_dtype)(_i & 1);
    const int NH = layouts[_i >> 1][0], NKV = layouts[_i >> 1][1], use_pos = layouts[_i >> 1][2];
    NEED_GPU("test_attention_gqa");
    pair P;
    pair_init(&P, dt);
    const int B = 2, T = 45, hd = 24, QS = (NH + 2 * NKV) * hd; /* T > 32: several lanes */
    const size_t nq = (size_t)B * T * QS, no = (size_t)B * T * NH * hd;
    const size_t na = (size_t)B * NH * T * T;
    int posv[2 * 45];
    for (int i = 0; i < B * T; i++)
        posv[i] = i < T ? (i < 17 ? i : i - 17) : i - T;
    tens pos = t_ints(&P, posv, (size_t)B * T);
    tens qkv = t_new(&P, nq, dt, 1.0f, 30), out = t_new(&P, no, dt, -1.0f, 0);
    tens att = t_new(&P, na, dt, -1.0f, 0), dout = t_new(&P, no, FSDP_DTYPE_F32, 1.0f, 31);
    tens dqkv = t_new(&P, nq, FSDP_DTYPE_F32, 0.5f, 32);
    tens datt = t_new(&P, na, FSDP_DTYPE_F32, -1.0f, 0);
    const int *pc = use_pos ? pos.c : NULL, *pg = use_pos ? pos.g : NULL;
    float *k[3];
    FSDP_OP(&P.oc, attention_gqa_fwd, out.c, att.c, qkv.c, pc, B, T, NH, NKV, hd);
    FSDP_OP(&P.og, attention_gqa_fwd, out.g, att.g, qkv.g, pg, B, T, NH, NKV, hd);
    FSDP_OP(&P.oc, attention_gqa_bwd, dqkv.c, datt.c, dout.c, qkv.c, att.c, B, T, NH, NKV, hd);
    FSDP_OP(&P.og, attention_gqa_bwd, dqkv.g, datt.g, dout.g, qkv.g, att.g, B, T, NH, NKV, hd);
    gpu_done(&P);
    expect_pair(&P, "attention_gqa att", &att, tol(dt, 1e-5), &k[0]);
    expect_pair(&P, "attention_gqa out", &out, tol(dt, 1e-4), &k[1]);
    expect_pair(&P, "attention_gqa dqkv", &dqkv, tol(dt, 1e-4), &k[2]);
    float *ac = t_get(&P, &att, 0); /* the mask: exact zeros where the cpu has them */
    for (size_t i = 0; i < na; i++)
        if (ac[i] == 0.0f)
            ck_assert_msg(k[0][i] == 0.0f, "att[%zu] = %g outside the mask", i, k[0][i]);
    free(ac);
    t_upload(&P, &out), t_upload(&P, &att), t_upload(&P, &dqkv), t_upload(&P, &datt);
    FSDP_OP(&P.og, attention_gqa_fwd, out.g, att.g, qkv.g, pg, B, T, NH, NKV, hd);
    FSDP_OP(&P.og, attention_gqa_bwd, dqkv.g, datt.g, dout.g, qkv.g, att.g, B, T, NH, NKV, hd);
    gpu_done(&P);
    expect_same_bits(&P, "attention_gqa att", &att, k[0]);
    expect_same_bits(&P, "attention_gqa out", &out, k[1]);
    expect_same_bits(&P, "attention_gqa dqkv", &dqkv, k[2]);
    /* kv heads that do not divide the query heads: reported, then cleared */
    FSDP_OP(&P.og, attention_gqa_fwd, out.g, att.g, qkv.g, pg, B, T, NH, NH + 1, hd);
    ck_assert_int_eq(fsdp_device_stream_sync(&P.gpu, P.gpu.compute), FSDP_STATUS_OK);
    ck_assert_int_eq(P.og.iface->sync_error(&P.og), FSDP_STATUS_INVALID_ARG);
    ck_assert(strstr(fsdp_error_msg(), "kv heads"));
    ck_assert_int_eq(P.og.iface->sync_error(&P.og), FSDP_STATUS_OK);
    tens *all[] = {&pos, &qkv, &out, &att, &dout, &dqkv, &datt};
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
        {"everywhere", FSDP_TESTS(test_table_has_llama_ops)},
        {"ops", 120,
         FSDP_TESTS(FSDP_TEST_LOOP(test_rmsnorm, 2), FSDP_TEST_LOOP(test_rope, 4),
                    FSDP_TEST_LOOP(test_swiglu, 2), FSDP_TEST_LOOP(test_attention_gqa, 8))},
    };
    return fsdp_test_main("cuda_llama", tcases, FSDP_TEST_LEN(tcases));
}
