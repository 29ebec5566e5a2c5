/*
 * test_cuda_llama.c - the Llama-family cuda ops (RMSNorm, rotary
 * embeddings, SwiGLU, grouped-query attention) against the cpu backend on
 * the same inputs, in fp32 and bf16, with per-op tolerances; outputs that
 * the ops overwrite start poisoned with NaN, so an element a kernel
 * forgets shows up; gradients start from random values, so the
 * accumulation is checked; the same op twice gives the same bits; bad
 * shapes are reported through sync_error.
 *
 * Without a GPU every test but the table test prints a SKIP line and
 * passes (cuda_test.h). Builds with CUDA=0 compile the same file. The
 * tensors on both devices and the checks are cuda_tens.h's.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_tens.h"
#include "cuda_test.h"
#include "device/device.h"
#include "ops/ops.h"
#include "ops/rope_table.h"
#include "testutil.h"

#define LLAMA_SEED 4321u

/* pair_init, drawing this suite's values (LLAMA_SEED). */
static void llama_pair_init(pair *P, fsdp_dtype dt)
{
    pair_init(P, dt);
    P->seed = LLAMA_SEED;
}

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

typedef struct rmsnorm_args {
    tens *inp, *w, *out, *rstd, *dout, *dinp, *dw;
    int N, C;
} rmsnorm_args;

static void run_rmsnorm(fsdp_op_ctx *o, int gpu, const void *arg)
{
    const rmsnorm_args *a = arg;
    FSDP_OP(o, rmsnorm_fwd, t_on(a->out, gpu), t_on(a->rstd, gpu), t_on(a->inp, gpu),
            t_on(a->w, gpu), 1e-5f, a->N, a->C);
    FSDP_OP(o, rmsnorm_bwd, t_on(a->dinp, gpu), t_on(a->dw, gpu), t_on(a->dout, gpu),
            t_on(a->inp, gpu), t_on(a->w, gpu), t_on(a->rstd, gpu), a->N, a->C);
}

START_TEST(test_rmsnorm)
{
    NEED_GPU(_i ? "test_rmsnorm(bf16)" : "test_rmsnorm(f32)");
    pair P;
    const fsdp_dtype dt = (fsdp_dtype)_i;
    llama_pair_init(&P, dt);
    const int N = 150, C = 200; /* > 64 rows: several dw chunks */
    const size_t n = (size_t)N * C;
    tens inp = t_new(&P, n, dt, 2.0f, 1), w = t_new(&P, C, dt, 1.0f, 2);
    tens out = t_out(&P, n, dt), rstd = t_out(&P, N, FSDP_DTYPE_F32);
    tens dout = t_new(&P, n, FSDP_DTYPE_F32, 1.0f, 3);
    tens dinp = t_new(&P, n, FSDP_DTYPE_F32, 0.5f, 4), dw = t_new(&P, C, FSDP_DTYPE_F32, 0.5f, 5);
    const rmsnorm_args a = {&inp, &w, &out, &rstd, &dout, &dinp, &dw, N, C};
    const t_check chk[] = {
        {"rmsnorm out", &out, tol_for(dt, 1e-5)},
        {"rmsnorm rstd", &rstd, 1e-6},
        {"rmsnorm dinp", &dinp, 1e-4},
        {"rmsnorm dw", &dw, 1e-4},
    };
    t_check_op(&P, run_rmsnorm, &a, chk, FSDP_TEST_LEN(chk));
    T_FREE_ALL(&P, &inp, &w, &out, &rstd, &dout, &dinp, &dw);
    pair_fini(&P);
}
END_TEST

typedef struct rope_args {
    tens *x, *dx, *inv, *pos; /* pos NULL: positions 0..T-1 */
    int B, T, NHKV, hd, QS;
} rope_args;

static void run_rope(fsdp_op_ctx *o, int gpu, const void *arg)
{
    const rope_args *a = arg;
    const int *pos = a->pos ? t_on(a->pos, gpu) : NULL;
    FSDP_OP(o, rope_fwd, t_on(a->x, gpu), t_on(a->inv, gpu), pos, a->B, a->T, a->NHKV, a->hd,
            a->QS);
    FSDP_OP(o, rope_bwd, t_on(a->dx, gpu), t_on(a->inv, gpu), pos, a->B, a->T, a->NHKV, a->hd,
            a->QS);
}

/* _i: bit 0 dtype, bit 1 with a position array (packed documents). */
START_TEST(test_rope)
{
    const fsdp_dtype dt = (fsdp_dtype)(_i & 1);
    const int use_pos = _i >> 1;
    NEED_GPU("test_rope");
    pair P;
    llama_pair_init(&P, dt);
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
    const rope_args a = {&x, &dx, &inv, use_pos ? &pos : NULL, B, T, NH + NKV, hd, QS};
    const t_check chk[] = {
        {"rope x", &x, tol_for(dt, 1e-5)},
        {"rope dx", &dx, 1e-5},
    };
    t_check_op(&P, run_rope, &a, chk, FSDP_TEST_LEN(chk));
    /* an odd head size is reported, then cleared */
    FSDP_OP(&P.og, rope_fwd, x.g, inv.g, use_pos ? pos.g : NULL, B, T, NH + NKV, hd - 1, QS);
    expect_sync_error(&P, "rope_fwd", "even");
    T_FREE_ALL(&P, &inv, &pos, &x, &dx);
    pair_fini(&P);
}
END_TEST

typedef struct swiglu_args {
    tens *inp, *out, *dout, *dinp;
    int N, IC;
} swiglu_args;

static void run_swiglu(fsdp_op_ctx *o, int gpu, const void *arg)
{
    const swiglu_args *a = arg;
    FSDP_OP(o, swiglu_fwd, t_on(a->out, gpu), t_on(a->inp, gpu), a->N, a->IC);
    FSDP_OP(o, swiglu_bwd, t_on(a->dinp, gpu), t_on(a->inp, gpu), t_on(a->dout, gpu), a->N,
            a->IC);
}

START_TEST(test_swiglu)
{
    NEED_GPU(_i ? "test_swiglu(bf16)" : "test_swiglu(f32)");
    pair P;
    const fsdp_dtype dt = (fsdp_dtype)_i;
    llama_pair_init(&P, dt);
    const int N = 97, IC = 131;
    const size_t ni = (size_t)N * 2 * IC, no = (size_t)N * IC;
    tens inp = t_new(&P, ni, dt, 4.0f, 20), out = t_out(&P, no, dt);
    tens dout = t_new(&P, no, FSDP_DTYPE_F32, 1.0f, 21);
    tens dinp = t_new(&P, ni, FSDP_DTYPE_F32, 0.5f, 22);
    const swiglu_args a = {&inp, &out, &dout, &dinp, N, IC};
    const t_check chk[] = {
        {"swiglu out", &out, tol_for(dt, 1e-5)},
        {"swiglu dinp", &dinp, 1e-5},
    };
    t_check_op(&P, run_swiglu, &a, chk, FSDP_TEST_LEN(chk));
    T_FREE_ALL(&P, &inp, &out, &dout, &dinp);
    pair_fini(&P);
}
END_TEST

typedef struct gqa_args {
    tens *qkv, *out, *att, *dout, *dqkv, *datt, *pos; /* pos NULL: positions 0..T-1 */
    int B, T, NH, NKV, hd;
} gqa_args;

static void run_gqa(fsdp_op_ctx *o, int gpu, const void *arg)
{
    const gqa_args *a = arg;
    FSDP_OP(o, attention_gqa_fwd, t_on(a->out, gpu), t_on(a->att, gpu), t_on(a->qkv, gpu),
            a->pos ? t_on(a->pos, gpu) : NULL, a->B, a->T, a->NH, a->NKV, a->hd);
    FSDP_OP(o, attention_gqa_bwd, t_on(a->dqkv, gpu), t_on(a->datt, gpu), t_on(a->dout, gpu),
            t_on(a->qkv, gpu), t_on(a->att, gpu), a->B, a->T, a->NH, a->NKV, a->hd);
}

/* _i: bit 0 dtype; bits 1-2 the head layout: GQA (8 q / 2 kv heads),
 * MQA (6 / 1), MHA (4 / 4), GQA with packed positions. */
START_TEST(test_attention_gqa)
{
    static const int layouts[4][3] = {{8, 2, 0}, {6, 1, 0}, {4, 4, 0}, {8, 2, 1}};
    const fsdp_dtype dt = (fsdp_dtype)(_i & 1);
    const int NH = layouts[_i >> 1][0], NKV = layouts[_i >> 1][1], use_pos = layouts[_i >> 1][2];
    NEED_GPU("test_attention_gqa");
    pair P;
    llama_pair_init(&P, dt);
    const int B = 2, T = 45, hd = 24, QS = (NH + 2 * NKV) * hd; /* T > 32: several lanes */
    const size_t nq = (size_t)B * T * QS, no = (size_t)B * T * NH * hd;
    const size_t na = (size_t)B * NH * T * T;
    int posv[2 * 45];
    for (int i = 0; i < B * T; i++)
        posv[i] = i < T ? (i < 17 ? i : i - 17) : i - T;
    tens pos = t_ints(&P, posv, (size_t)B * T);
    tens qkv = t_new(&P, nq, dt, 1.0f, 30), out = t_out(&P, no, dt);
    tens att = t_out(&P, na, dt), dout = t_new(&P, no, FSDP_DTYPE_F32, 1.0f, 31);
    tens dqkv = t_new(&P, nq, FSDP_DTYPE_F32, 0.5f, 32);
    tens datt = t_out(&P, na, FSDP_DTYPE_F32);
    const gqa_args a = {&qkv, &out, &att, &dout, &dqkv, &datt, use_pos ? &pos : NULL,
                        B, T, NH, NKV, hd};
    const t_check chk[] = {
        {"attention_gqa att", &att, tol_for(dt, 1e-5)},
        {"attention_gqa out", &out, tol_for(dt, 1e-4)},
        {"attention_gqa dqkv", &dqkv, tol_for(dt, 1e-4)},
    };
    float *k[FSDP_TEST_LEN(chk)];
    t_compare(&P, run_gqa, &a, chk, FSDP_TEST_LEN(chk), k);
    float *ac = t_get(&P, &att, 0); /* the mask: exact zeros where the cpu has them */
    for (size_t i = 0; i < na; i++)
        if (ac[i] == 0.0f)
            ck_assert_msg(k[0][i] == 0.0f, "att[%zu] = %g outside the mask", i, k[0][i]);
    free(ac);
    t_upload(&P, &datt); /* scratch the backward writes: poisoned again */
    t_rerun_same_bits(&P, run_gqa, &a, chk, FSDP_TEST_LEN(chk), k);
    /* kv heads that do not divide the query heads: reported, then cleared */
    FSDP_OP(&P.og, attention_gqa_fwd, out.g, att.g, qkv.g, use_pos ? pos.g : NULL, B, T, NH,
            NH + 1, hd);
    expect_sync_error(&P, "kv heads", NULL);
    T_FREE_ALL(&P, &pos, &qkv, &out, &att, &dout, &dqkv, &datt);
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
