/*
 * test_ops_lora.c - the LoRA ops on the cpu (lora_fwd, lora_bwd; contracts
 * in ops/ops.h) against:
 *   - a naive double-precision reference on small odd shapes (r = 1 and 8):
 *     fp32 within 1e-5 relative; bf16 outputs within one rounding of the
 *     reference (u and out are rounded once; the rounded u feeds out), bf16
 *     gradients within 1e-5 (the widened operands are exact, math is fp32);
 *   - their layout contracts: out a column slice of wider rows (the columns
 *     outside it keep their bits), dout strided (the columns outside its
 *     slice hold NaN, so reading one shows), gradients accumulated into
 *     pre-filled buffers, any of dinp / dA / dB left out without changing
 *     the others;
 *   - central finite differences of lora_fwd for lora_bwd (fp32; A, B, inp);
 *   - the same bits on 1 and 3 threads per device (a shape whose GEMMs tile)
 *     and through the asynchronous stream table;
 *   - a group of adapters on one input (q, k, v of unequal widths: A's one
 *     matrix, u and dv column slices of one buffer; the first product and the
 *     dA / dinp products formed once for the group) against each adapter
 *     alone: within 1e-5 relative (fp32), one bf16 rounding (bf16).
 */
#include <check.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/bf16.h"
#include "device/cpu.h"
#include "ops/ops.h"
#include "ops_util.h"
#include "testutil.h"

/* ---- data ---------------------------------------------------------------------- */

/* One LoRA layer's inputs, as fp32 values (bf16-representable when dt is
 * bf16), and the caller's buffers: out and dout rows hold ld elements, the
 * slice is columns [col0, col0 + OC). */
typedef struct lcase {
    fsdp_dtype dt;
    int N, C, r, OC, ld, col0;
    float scale;
    float *x;    /* (N, C) */
    float *A;    /* (r, C) */
    float *B;    /* (OC, r) */
    float *out0; /* (N, ld): the base product already there */
    float *dout; /* (N, ld): NaN outside the slice */
    float *gx0, *gA0, *gB0; /* gradients before the backward: (N, C), (r, C), (OC, r) */
} lcase;

/* This suite's test data: uniform in [-scale, scale), keyed by seed. */
static float *frand(size_t n, uint64_t seed, float scale)
{
    return frand_stream(n, seed, 26, scale);
}

/* x rounded to bf16 in place when dt is bf16. */
static void representable(float *x, size_t n, fsdp_dtype dt)
{
    if (dt == FSDP_DTYPE_BF16)
        free(to_bf16(x, n));
}

/* scale = alpha / r with PEFT's default alpha 8: 1 at r = 8, where the
 * GEMMs with alpha = scale run on oneDNN, else OpenBLAS (gemm.c). */
static void lcase_init(lcase *c, fsdp_dtype dt, int N, int C, int r, int OC, int pad,
                       uint64_t seed)
{
    *c = (lcase){.dt = dt, .N = N, .C = C, .r = r, .OC = OC, .ld = OC + pad, .col0 = pad / 2,
                 .scale = 8.0f / (float)r};
    size_t n_rows = (size_t)N * c->ld;
    c->x = frand((size_t)N * C, seed, 1.0f);
    c->A = frand((size_t)r * C, seed + 1, 1.0f / sqrtf((float)C));
    c->B = frand((size_t)OC * r, seed + 2, 0.5f);
    c->out0 = frand(n_rows, seed + 3, 1.0f);
    c->dout = frand(n_rows, seed + 4, 1.0f);
    for (size_t i = 0; i < n_rows; i++)
        if ((int)(i % (size_t)c->ld) < c->col0 || (int)(i % (size_t)c->ld) >= c->col0 + OC)
            c->dout[i] = NAN;
    c->gx0 = frand((size_t)N * C, seed + 5, 0.1f);
    c->gA0 = frand((size_t)r * C, seed + 6, 0.1f);
    c->gB0 = frand((size_t)OC * r, seed + 7, 0.1f);
    representable(c->x, (size_t)N * C, dt);
    representable(c->A, (size_t)r * C, dt);
    representable(c->B, (size_t)OC * r, dt);
    representable(c->out0, n_rows, dt);
}

static void lcase_fini(lcase *c)
{
    free(c->x), free(c->A), free(c->B), free(c->out0), free(c->dout);
    free(c->gx0), free(c->gA0), free(c->gB0);
}

/* x (n) in dtype dt (malloc'd; exact: the values are representable). */
static void *dt_copy(const float *x, size_t n, fsdp_dtype dt)
{
    if (dt == FSDP_DTYPE_BF16) {
        fsdp_bf16 *h = calloc(n ? n : 1, sizeof *h);
        ck_assert_ptr_nonnull(h);
        for (size_t i = 0; i < n; i++)
            h[i] = fsdp_f32_to_bf16(x[i]);
        return h;
    }
    return fcopy(x, n);
}

/* p (n, dtype dt) as fp32 (malloc'd). */
static float *dt_read(const void *p, size_t n, fsdp_dtype dt)
{
    return dt == FSDP_DTYPE_BF16 ? from_bf16(p, n) : fcopy(p, n);
}

/* ---- running the ops ------------------------------------------------------------ */

/* lora_fwd on ctx (which must be synchronised by the caller if it is
 * asynchronous): *out (N, ld) = out0 with the branch added to the slice,
 * *u (N, r), both read back as fp32. */
static void run_fwd(env *e, const lcase *c, float **out, float **u)
{
    size_t n_rows = (size_t)c->N * c->ld, n_u = (size_t)c->N * c->r;
    void *o = dt_copy(c->out0, n_rows, c->dt);
    void *x = dt_copy(c->x, (size_t)c->N * c->C, c->dt);
    void *A = dt_copy(c->A, (size_t)c->r * c->C, c->dt);
    void *B = dt_copy(c->B, (size_t)c->OC * c->r, c->dt);
    size_t esz = fsdp_dtype_size(c->dt);
    void *ub = calloc(n_u ? n_u : 1, esz);
    ck_assert_ptr_nonnull(ub);
    FSDP_OP(&e->ctx, lora_fwd, (char *)o + (size_t)c->col0 * esz, c->ld, ub, c->r, x, A, B,
            c->scale, c->N, c->C, c->r, c->OC);
    ck_assert_int_eq(fsdp_device_stream_sync(&e->dev, e->ctx.stream), FSDP_STATUS_OK);
    *out = dt_read(o, n_rows, c->dt);
    *u = dt_read(ub, n_u, c->dt);
    free(o), free(x), free(A), free(B), free(ub);
}

/* Gradients of one lora_bwd: the pre-filled buffers after it (NULL where
 * not asked for) and the scratch dv. */
typedef struct grads {
    float *dx, *dA, *dB, *dv;
} grads;

static void grads_free(grads *g)
{
    free(g->dx), free(g->dA), free(g->dB), free(g->dv);
}

/* lora_bwd from the stored u (N, r) with the gradients pre-filled from c. */
static grads run_bwd(env *e, const lcase *c, const float *u, bool want_x, bool want_A,
                     bool want_B)
{
    grads g = {
        .dx = want_x ? fcopy(c->gx0, (size_t)c->N * c->C) : NULL,
        .dA = want_A ? fcopy(c->gA0, (size_t)c->r * c->C) : NULL,
        .dB = want_B ? fcopy(c->gB0, (size_t)c->OC * c->r) : NULL,
        .dv = fbuf((size_t)c->N * c->r),
    };
    void *x = dt_copy(c->x, (size_t)c->N * c->C, c->dt);
    void *A = dt_copy(c->A, (size_t)c->r * c->C, c->dt);
    void *B = dt_copy(c->B, (size_t)c->OC * c->r, c->dt);
    void *ub = dt_copy(u, (size_t)c->N * c->r, c->dt);
    FSDP_OP(&e->ctx, lora_bwd, g.dx, g.dA, g.dB, g.dv, c->r, c->dout + c->col0, c->ld, x, ub, A,
            B, c->scale, c->N, c->C, c->r, c->OC);
    ck_assert_int_eq(fsdp_device_stream_sync(&e->dev, e->ctx.stream), FSDP_STATUS_OK);
    free(x), free(A), free(B), free(ub);
    return g;
}

/* ---- the reference ------------------------------------------------------------- */

/* u = x A^T in double. */
static double *ref_u(const lcase *c)
{
    double *u = calloc((size_t)c->N * c->r, sizeof *u);
    ck_assert_ptr_nonnull(u);
    for (int n = 0; n < c->N; n++)
        for (int k = 0; k < c->r; k++)
            for (int i = 0; i < c->C; i++)
                u[(size_t)n * c->r + k] +=
                    (double)c->x[(size_t)n * c->C + i] * c->A[(size_t)k * c->C + i];
    return u;
}

/* out0's slice + scale * u B^T in double, from the u the op stored. */
static double *ref_out(const lcase *c, const float *u)
{
    double *y = calloc((size_t)c->N * c->OC, sizeof *y);
    ck_assert_ptr_nonnull(y);
    for (int n = 0; n < c->N; n++)
        for (int o = 0; o < c->OC; o++) {
            double s = 0.0;
            for (int k = 0; k < c->r; k++)
                s += (double)u[(size_t)n * c->r + k] * c->B[(size_t)o * c->r + k];
            y[(size_t)n * c->OC + o] = (double)c->out0[(size_t)n * c->ld + c->col0 + o] +
                                       (double)c->scale * s;
        }
    return y;
}

/* The four gradients of the contract in double, from the stored u, added
 * to the pre-filled values. */
typedef struct ref_grads {
    double *dx, *dA, *dB, *dv;
} ref_grads;

static double *dzeros(size_t n)
{
    double *p = calloc(n ? n : 1, sizeof *p);
    ck_assert_ptr_nonnull(p);
    return p;
}

static ref_grads ref_bwd(const lcase *c, const float *u)
{
    int N = c->N, C = c->C, r = c->r, OC = c->OC;
    ref_grads g = {dzeros((size_t)N * C), dzeros((size_t)r * C), dzeros((size_t)OC * r),
                   dzeros((size_t)N * r)};
    const float *dout = c->dout + c->col0;
    for (int n = 0; n < N; n++)
        for (int k = 0; k < r; k++)
            for (int o = 0; o < OC; o++)
                g.dv[(size_t)n * r + k] += (double)c->scale * dout[(size_t)n * c->ld + o] *
                                           c->B[(size_t)o * r + k];
    for (int o = 0; o < OC; o++)
        for (int k = 0; k < r; k++) {
            double s = 0.0;
            for (int n = 0; n < N; n++)
                s += (double)dout[(size_t)n * c->ld + o] * u[(size_t)n * r + k];
            g.dB[(size_t)o * r + k] = c->gB0[(size_t)o * r + k] + (double)c->scale * s;
        }
    for (int k = 0; k < r; k++)
        for (int i = 0; i < C; i++) {
            double s = 0.0;
            for (int n = 0; n < N; n++)
                s += g.dv[(size_t)n * r + k] * c->x[(size_t)n * C + i];
            g.dA[(size_t)k * C + i] = c->gA0[(size_t)k * C + i] + s;
        }
    for (int n = 0; n < N; n++)
        for (int i = 0; i < C; i++) {
            double s = 0.0;
            for (int k = 0; k < r; k++)
                s += g.dv[(size_t)n * r + k] * c->A[(size_t)k * C + i];
            g.dx[(size_t)n * C + i] = c->gx0[(size_t)n * C + i] + s;
        }
    return g;
}

static void ref_grads_free(ref_grads *g)
{
    free(g->dx), free(g->dA), free(g->dB), free(g->dv);
}

/* Every element within |got - want| <= rtol |want| + atol_rms rms(want):
 * rtol bounds the rounding of a stored value, the rms share keeps elements
 * that cancel to near zero from asking more than fp32 sums give. */
static void expect_near(const char *what, const float *got, const double *want, size_t n,
                        double rtol, double atol_rms)
{
    double ss = 0.0;
    for (size_t i = 0; i < n; i++)
        ss += want[i] * want[i];
    double rms = sqrt(ss / (double)(n ? n : 1));
    ck_assert_msg(rms > 0.0, "%s: reference is all zeros", what);
    for (size_t i = 0; i < n; i++) {
        double err = fabs((double)got[i] - want[i]);
        ck_assert_msg(err <= rtol * fabs(want[i]) + atol_rms * rms,
                      "%s[%zu]: got %.9g want %.9g (error %.3g, rms %.3g)", what, i, got[i],
                      want[i], err, rms);
    }
}

/* Shapes: small and odd, r = 1 and r = 8. */
static const int SHAPES[][4] = {{13, 37, 1, 29}, {11, 45, 8, 19}}; /* N, C, r, OC */
#define N_SHAPES 2

/* A test's device, its case (shape k) and the forward's outputs read back. */
typedef struct fixture {
    env e;
    lcase c;
    float *out, *u;
} fixture;

/* zero: out0 and the pre-filled gradients all zeros (finite differences). */
static void fixture_init(fixture *f, fsdp_dtype dt, int k, int pad, uint64_t seed, bool zero)
{
    env_init(&f->e, dt);
    lcase *c = &f->c;
    lcase_init(c, dt, SHAPES[k][0], SHAPES[k][1], SHAPES[k][2], SHAPES[k][3], pad, seed);
    if (zero) {
        memset(c->out0, 0, (size_t)c->N * c->ld * sizeof(float));
        memset(c->gx0, 0, (size_t)c->N * c->C * sizeof(float));
        memset(c->gA0, 0, (size_t)c->r * c->C * sizeof(float));
        memset(c->gB0, 0, (size_t)c->OC * c->r * sizeof(float));
    }
    run_fwd(&f->e, c, &f->out, &f->u);
}

static void fixture_fini(fixture *f)
{
    free(f->out), free(f->u);
    lcase_fini(&f->c);
    env_fini(&f->e);
}

/* ---- forward -------------------------------------------------------------------- */

static void check_fwd(fsdp_dtype dt, int k)
{
    fixture f;
    fixture_init(&f, dt, k, 9, 100 + k, false);
    const lcase c = f.c;
    const float *out = f.out, *u = f.u;
    bool bf = dt == FSDP_DTYPE_BF16;
    /* fp32: within fp32 sums; bf16: one rounding to nearest (half an ulp,
     * <= 2^-8 relative) of a value formed in fp32 */
    double rtol = bf ? 1.0 / 256 : 1e-5, arms = 1e-5;
    double *uw = ref_u(&c);
    expect_near("u", u, uw, (size_t)c.N * c.r, rtol, arms);
    double *yw = ref_out(&c, u);
    float *slice = fbuf((size_t)c.N * c.OC);
    for (int n = 0; n < c.N; n++) {
        for (int j = 0; j < c.ld; j++) {
            size_t i = (size_t)n * c.ld + j;
            if (j >= c.col0 && j < c.col0 + c.OC)
                slice[(size_t)n * c.OC + j - c.col0] = out[i];
            else
                ck_assert_msg(memcmp(&out[i], &c.out0[i], sizeof(float)) == 0,
                              "out[%d][%d] outside the slice changed: %.9g -> %.9g", n, j,
                              c.out0[i], out[i]);
        }
    }
    expect_near("out", slice, yw, (size_t)c.N * c.OC, rtol, arms);
    free(slice), free(yw), free(uw);
    fixture_fini(&f);
}

START_TEST(test_fwd_fp32) { check_fwd(FSDP_DTYPE_F32, _i); }
END_TEST

START_TEST(test_fwd_bf16) { check_fwd(FSDP_DTYPE_BF16, _i); }
END_TEST

/* ---- backward ------------------------------------------------------------------- */

static void check_bwd(fsdp_dtype dt, int k)
{
    fixture f;
    fixture_init(&f, dt, k, 7, 200 + k, false);
    const lcase c = f.c;
    const float *u = f.u;
    grads g = run_bwd(&f.e, &c, u, true, true, true);
    ref_grads w = ref_bwd(&c, u);
    /* bf16 operands widen exactly and the math is fp32: as tight as fp32 */
    expect_near("dv", g.dv, w.dv, (size_t)c.N * c.r, 1e-5, 1e-5);
    expect_near("dB", g.dB, w.dB, (size_t)c.OC * c.r, 1e-5, 1e-5);
    expect_near("dA", g.dA, w.dA, (size_t)c.r * c.C, 1e-5, 1e-5);
    expect_near("dinp", g.dx, w.dx, (size_t)c.N * c.C, 1e-5, 1e-5);
    /* Each gradient left out: the others keep their bits, dv too. */
    for (int skip = 0; skip < 3; skip++) {
        grads h = run_bwd(&f.e, &c, u, skip != 0, skip != 1, skip != 2);
        ck_assert_mem_eq(h.dv, g.dv, (size_t)c.N * c.r * sizeof(float));
        if (h.dx)
            ck_assert_mem_eq(h.dx, g.dx, (size_t)c.N * c.C * sizeof(float));
        if (h.dA)
            ck_assert_mem_eq(h.dA, g.dA, (size_t)c.r * c.C * sizeof(float));
        if (h.dB)
            ck_assert_mem_eq(h.dB, g.dB, (size_t)c.OC * c.r * sizeof(float));
        grads_free(&h);
    }
    ref_grads_free(&w);
    grads_free(&g);
    fixture_fini(&f);
}

START_TEST(test_bwd_fp32) { check_bwd(FSDP_DTYPE_F32, _i); }
END_TEST

START_TEST(test_bwd_bf16) { check_bwd(FSDP_DTYPE_BF16, _i); }
END_TEST

/* ---- finite differences --------------------------------------------------------- */

/* L = sum over the slice of out * dout (dout is the weight R), out0 = 0. */
typedef struct fd_state {
    env *e;
    lcase *c;
} fd_state;

static double fd_loss(void *p)
{
    fd_state *s = p;
    lcase *c = s->c;
    float *out, *u;
    run_fwd(s->e, c, &out, &u);
    double L = 0.0;
    for (int n = 0; n < c->N; n++)
        for (int o = 0; o < c->OC; o++) {
            size_t i = (size_t)n * c->ld + c->col0 + o;
            L += (double)out[i] * c->dout[i];
        }
    free(out), free(u);
    return L;
}

START_TEST(test_bwd_finite_differences)
{
    fixture f;
    fixture_init(&f, FSDP_DTYPE_F32, _i, 5, 300 + _i, true);
    lcase *c = &f.c;
    grads g = run_bwd(&f.e, c, f.u, true, true, true);
    fd_state s = {&f.e, c};
    fd_check_spread("dA", fd_loss, &s, c->A, g.dA, (size_t)c->r * c->C, 8, 1e-2f, 26);
    fd_check_spread("dB", fd_loss, &s, c->B, g.dB, (size_t)c->OC * c->r, 8, 1e-2f, 26);
    fd_check_spread("dinp", fd_loss, &s, c->x, g.dx, (size_t)c->N * c->C, 8, 1e-2f, 26);
    grads_free(&g);
    fixture_fini(&f);
}
END_TEST

/* ---- threads and streams -------------------------------------------------------- */

/* Every output of a forward and a backward, for bitwise comparison. */
typedef struct all_out {
    float *out, *u;
    grads g;
} all_out;

static all_out run_all(env *e, const lcase *c)
{
    all_out a;
    run_fwd(e, c, &a.out, &a.u);
    a.g = run_bwd(e, c, a.u, true, true, true);
    return a;
}

static void expect_same(const all_out *a, const all_out *b, const lcase *c, const char *how)
{
    struct {
        const char *name;
        const float *x, *y;
        size_t n;
    } parts[] = {
        {"out", a->out, b->out, (size_t)c->N * c->ld},
        {"u", a->u, b->u, (size_t)c->N * c->r},
        {"dv", a->g.dv, b->g.dv, (size_t)c->N * c->r},
        {"dinp", a->g.dx, b->g.dx, (size_t)c->N * c->C},
        {"dA", a->g.dA, b->g.dA, (size_t)c->r * c->C},
        {"dB", a->g.dB, b->g.dB, (size_t)c->OC * c->r},
    };
    for (size_t p = 0; p < sizeof parts / sizeof parts[0]; p++)
        ck_assert_msg(memcmp(parts[p].x, parts[p].y, parts[p].n * sizeof(float)) == 0,
                      "%s differs %s", parts[p].name, how);
}

static void all_free(all_out *a)
{
    free(a->out), free(a->u);
    grads_free(&a->g);
}

/* Big enough that every GEMM of both ops is split into tiles (gemm.c). */
START_TEST(test_threads_bit_identical)
{
    fsdp_dtype dt = _i ? FSDP_DTYPE_BF16 : FSDP_DTYPE_F32;
    lcase c;
    lcase_init(&c, dt, 1031, 389, 8, 263, 6, 400 + _i);
    all_out res[2];
    for (int t = 0; t < 2; t++) {
        env e;
        env_init_threads(&e, dt, t ? 3 : 1);
        res[t] = run_all(&e, &c);
        env_fini(&e);
    }
    expect_same(&res[0], &res[1], &c, "between 1 and 3 threads");
    all_free(&res[0]), all_free(&res[1]);
    lcase_fini(&c);
}
END_TEST

/* The async table queues both ops with their arguments in place. */
START_TEST(test_async_stream_same_bits)
{
    fsdp_dtype dt = _i ? FSDP_DTYPE_BF16 : FSDP_DTYPE_F32;
    lcase c;
    lcase_init(&c, dt, SHAPES[1][0], SHAPES[1][1], SHAPES[1][2], SHAPES[1][3], 4, 500 + _i);
    env e;
    env_init(&e, dt);
    all_out inline_res = run_all(&e, &c);
    env_fini(&e);
    fsdp_device_cpu_set_streams(FSDP_CPU_STREAMS_ASYNC, 3);
    ck_assert_int_eq(fsdp_device_init(&e.dev, FSDP_BACKEND_CPU, NULL, 0, 0, 0), FSDP_STATUS_OK);
    fsdp_device_cpu_set_streams(FSDP_CPU_STREAMS_INLINE, 0);
    ck_assert_int_eq(fsdp_ops_init(&e.ctx, &e.dev, dt), FSDP_STATUS_OK);
    ck_assert_ptr_eq(e.ctx.iface, &fsdp_ops_cpu_async_i);
    all_out async_res = run_all(&e, &c);
    ck_assert_int_eq(e.ctx.iface->sync_error(&e.ctx), FSDP_STATUS_OK);
    ck_assert_int_eq(fsdp_device_stream_sync(&e.dev, e.ctx.stream), FSDP_STATUS_OK);
    fsdp_ops_fini(&e.ctx);
    fsdp_device_fini(&e.dev);
    expect_same(&inline_res, &async_res, &c, "between inline and async streams");
    all_free(&inline_res), all_free(&async_res);
    lcase_fini(&c);
}
END_TEST

/* |got - want| within tol relative to max(1, |want|), element by element. */
static void expect_close(const char *what, const float *got, const float *want, size_t n,
                         float tol)
{
    for (size_t i = 0; i < n; i++)
        ck_assert_msg(fabsf(got[i] - want[i]) <= tol * fmaxf(1.0f, fabsf(want[i])),
                      "%s[%zu]: group %.9g, alone %.9g", what, i, got[i], want[i]);
}

/* Three adapters on one input, the shape of q, k and v with GQA (out columns
 * 11 | 5 | 5): each alone (u (N, r) apiece), then as one group (A's one
 * (3 r, C) matrix, u (N, 3 r) formed in one call, dv (N, 3 r) from each
 * adapter's B, dA and dinp in one call with B NULL). */
START_TEST(test_group_same_as_each)
{
    enum { N = 37, C = 29, R = 4, G = 3, LD = 21 };
    const int oc[G] = {11, 5, 5}, col[G] = {0, 11, 16};
    fsdp_dtype dt = _i ? FSDP_DTYPE_BF16 : FSDP_DTYPE_F32;
    const size_t esz = fsdp_dtype_size(dt);
    const float scale = 2.0f, tol = _i ? 1.0f / 128 : 1e-5f;
    env e;
    env_init(&e, dt);
    float *x = frand(N * C, 600 + _i, 1.0f), *A = frand(G * R * C, 610 + _i, 0.2f);
    float *B = frand(LD * R, 620 + _i, 0.5f), *out0 = frand(N * LD, 630 + _i, 1.0f);
    float *dout = frand(N * LD, 640 + _i, 1.0f);
    representable(x, N * C, dt), representable(A, G * R * C, dt);
    representable(B, LD * R, dt), representable(out0, N * LD, dt);
    char *xd = dt_copy(x, N * C, dt), *Ad = dt_copy(A, G * R * C, dt);
    char *Bd = dt_copy(B, LD * R, dt); /* adapter g's B: rows col[g] .. col[g] + oc[g] */
    char *o[2] = {dt_copy(out0, N * LD, dt), dt_copy(out0, N * LD, dt)};
    char *u[2] = {calloc(N * G * R, esz), calloc(N * G * R, esz)};
    float *dx[2] = {fbuf(N * C), fbuf(N * C)}, *dA[2] = {fbuf(G * R * C), fbuf(G * R * C)};
    float *dB[2] = {fbuf(LD * R), fbuf(LD * R)}, *dv[2] = {fbuf(N * R), fbuf(N * G * R)};
    for (int g = 0; g < G; g++) { /* alone: u[0] holds G (N, R) blocks */
        char *ug = u[0] + (size_t)g * N * R * esz, *Ag = Ad + (size_t)g * R * C * esz;
        char *Bg = Bd + (size_t)col[g] * R * esz;
        FSDP_OP(&e.ctx, lora_fwd, o[0] + col[g] * esz, LD, ug, R, xd, Ag, Bg, scale, N, C, R,
                oc[g]);
        FSDP_OP(&e.ctx, lora_bwd, dx[0], dA[0] + (size_t)g * R * C, dB[0] + col[g] * R, dv[0], R,
                dout + col[g], LD, xd, ug, Ag, Bg, scale, N, C, R, oc[g]);
    }
    FSDP_OP(&e.ctx, lora_fwd, NULL, 0, u[1], G * R, xd, Ad, NULL, scale, N, C, G * R, 0);
    for (int g = 0; g < G; g++) {
        char *ug = u[1] + (size_t)g * R * esz, *Bg = Bd + (size_t)col[g] * R * esz;
        FSDP_OP(&e.ctx, lora_fwd, o[1] + col[g] * esz, LD, ug, G * R, xd, NULL, Bg, scale, N, C,
                R, oc[g]);
        FSDP_OP(&e.ctx, lora_bwd, NULL, NULL, dB[1] + col[g] * R, dv[1] + g * R, G * R,
                dout + col[g], LD, xd, ug, NULL, Bg, scale, N, C, R, oc[g]);
    }
    FSDP_OP(&e.ctx, lora_bwd, dx[1], dA[1], NULL, dv[1], G * R, NULL, 0, xd, NULL, Ad, NULL,
            scale, N, C, G * R, 0);
    ck_assert_int_eq(fsdp_device_stream_sync(&e.dev, e.ctx.stream), FSDP_STATUS_OK);
    float *uf[2] = {dt_read(u[0], N * G * R, dt), dt_read(u[1], N * G * R, dt)};
    float *of[2] = {dt_read(o[0], N * LD, dt), dt_read(o[1], N * LD, dt)};
    float *u_alone = fbuf(N * G * R); /* u[0]'s blocks in the group's (N, 3 R) layout */
    for (int g = 0; g < G; g++)
        for (int n = 0; n < N; n++)
            memcpy(u_alone + (size_t)n * G * R + g * R, uf[0] + ((size_t)g * N + n) * R,
                   R * sizeof(float));
    expect_close("u", uf[1], u_alone, N * G * R, tol);
    expect_close("out", of[1], of[0], N * LD, tol);
    expect_close("dB", dB[1], dB[0], LD * R, tol);
    expect_close("dA", dA[1], dA[0], G * R * C, tol);
    expect_close("dinp", dx[1], dx[0], N * C, tol);
    env_fini(&e);
    free(x), free(A), free(B), free(out0), free(dout), free(xd), free(Ad), free(Bd), free(u_alone);
    for (int k = 0; k < 2; k++)
        free(o[k]), free(u[k]), free(dx[k]), free(dA[k]), free(dB[k]), free(dv[k]), free(uf[k]),
            free(of[k]);
}
END_TEST

int main(void)
{
    /* The other cases run inline whatever FSDP_CPU_STREAMS says (env_init
     * wants the inline table); the async one opens its own device. */
    fsdp_device_cpu_set_streams(FSDP_CPU_STREAMS_INLINE, 0);
    const fsdp_test_tcase tcases[] = {
        {"reference", 60,
         FSDP_TESTS(FSDP_TEST_LOOP(test_fwd_fp32, N_SHAPES),
                    FSDP_TEST_LOOP(test_fwd_bf16, N_SHAPES),
                    FSDP_TEST_LOOP(test_bwd_fp32, N_SHAPES),
                    FSDP_TEST_LOOP(test_bwd_bf16, N_SHAPES),
                    FSDP_TEST_LOOP(test_bwd_finite_differences, N_SHAPES),
                    FSDP_TEST_LOOP(test_group_same_as_each, 2))},
        {"determinism", 60,
         FSDP_TESTS(FSDP_TEST_LOOP(test_threads_bit_identical, 2),
                    FSDP_TEST_LOOP(test_async_stream_same_bits, 2))},
    };
    return fsdp_test_main("ops_lora", tcases, FSDP_TEST_LEN(tcases));
}
