/*
 * gelu.c - GELU on the cpu, GPT-2's tanh approximation:
 *   gelu(x) = 0.5 x (1 + tanh(s (x + 0.044715 x^3))),  s = sqrt(2/pi),
 * and its exact derivative. inp/out in ctx->dt, gradients fp32.
 *
 * tanh comes from a branch-free exp (vexp.h) so the loops vectorise: libm's
 * tanhf was half the small model's step time. Absolute error of tanh < 3e-7.
 * Element-wise, so the rank's team takes it in fixed-size ranges.
 */
#include <math.h>

#include "ops/cpu/cpu_ops.h"
#include "ops/cpu/vexp.h"

#define GELU_S 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_A 0.044715f

/* The clamp also sends NaN to 9 (both compares are false for it), so
 * fsdp_cpu_exp never converts NaN or infinity to an integer (undefined
 * behaviour); NaN still propagates through gelu's factor x. Finite
 * inputs give the same bits as a plain clamp. */
static inline float tanh_fast(float u)
{
    u = u < 9.0f ? u : 9.0f;
    u = u > -9.0f ? u : -9.0f;
    return 1.0f - 2.0f / (fsdp_cpu_exp(2.0f * u) + 1.0f);
}

static inline float gelu_one(float x)
{
    float u = GELU_S * (x + GELU_A * x * x * x);
    return 0.5f * x * (1.0f + tanh_fast(u));
}

static inline float gelu_grad_one(float x)
{
    float u = GELU_S * (x + GELU_A * x * x * x);
    float th = tanh_fast(u);
    float sech2 = 1.0f - th * th;
    float du = GELU_S * (1.0f + 3.0f * GELU_A * x * x);
    return 0.5f * (1.0f + th) + 0.5f * x * sech2 * du;
}

/* The fp32 loops, compiled twice: for the build's baseline and for AVX2,
 * picked at run time (no ifunc: resolvers run before the sanitizers'
 * runtimes start). */
#define GELU_LOOPS(suffix, attr)                                                         \
    attr static void gelu_fwd_f32_##suffix(float *y, const float *x, size_t n)          \
    {                                                                                    \
        for (size_t i = 0; i < n; i++)                                                   \
            y[i] = gelu_one(x[i]);                                                       \
    }                                                                                    \
    attr static void gelu_bwd_f32_##suffix(float *dx, const float *x, const float *dy,   \
                                           size_t n)                                     \
    {                                                                                    \
        for (size_t i = 0; i < n; i++)                                                   \
            dx[i] += gelu_grad_one(x[i]) * dy[i];                                        \
    }
GELU_LOOPS(base, )
GELU_LOOPS(avx2, __attribute__((target("avx2"))))

typedef struct gelu_job {
    void *out;
    float *dinp;
    const void *inp;
    const float *dout;
    fsdp_dtype dt;
    bool avx2;
} gelu_job;

/* bf16 storage goes through the fp32 loops a block at a time. */
#define GELU_BLOCK 512

static void gelu_fwd_f32(const gelu_job *j, float *y, const float *x, size_t n)
{
    if (j->avx2)
        gelu_fwd_f32_avx2(y, x, n);
    else
        gelu_fwd_f32_base(y, x, n);
}

static void gelu_bwd_f32(const gelu_job *j, float *dx, const float *x, const float *dy, size_t n)
{
    if (j->avx2)
        gelu_bwd_f32_avx2(dx, x, dy, n);
    else
        gelu_bwd_f32_base(dx, x, dy, n);
}

static void gelu_fwd_range(void *arg, size_t begin, size_t end, int worker)
{
    const gelu_job *j = arg;
    if (j->dt == FSDP_DTYPE_F32) {
        gelu_fwd_f32(j, (float *)j->out + begin, (const float *)j->inp + begin, end - begin);
        return;
    }
    float x[GELU_BLOCK], y[GELU_BLOCK];
    const fsdp_bf16 *in = j->inp;
    fsdp_bf16 *out = j->out;
    for (size_t i = begin; i < end; i += GELU_BLOCK) {
        size_t n = end - i < GELU_BLOCK ? end - i : GELU_BLOCK;
        for (size_t k = 0; k < n; k++)
            x[k] = fsdp_bf16_to_f32(in[i + k]);
        gelu_fwd_f32(j, y, x, n);
        for (size_t k = 0; k < n; k++)
            out[i + k] = fsdp_f32_to_bf16(y[k]);
    }
}

static void gelu_bwd_range(void *arg, size_t begin, size_t end, int worker)
{
    const gelu_job *j = arg;
    if (j->dt == FSDP_DTYPE_F32) {
        gelu_bwd_f32(j, j->dinp + begin, (const float *)j->inp + begin, j->dout + begin,
                     end - begin);
        return;
    }
    float x[GELU_BLOCK];
    const fsdp_bf16 *in = j->inp;
    for (size_t i = begin; i < end; i += GELU_BLOCK) {
        size_t n = end - i < GELU_BLOCK ? end - i : GELU_BLOCK;
        for (size_t k = 0; k < n; k++)
            x[k] = fsdp_bf16_to_f32(in[i + k]);
        gelu_bwd_f32(j, j->dinp + i, x, j->dout + i, n);
    }
}

void fsdp_cpu_gelu_fwd(fsdp_op_ctx *ctx, void *out, const void *inp, size_t n)
{
    gelu_job j = {.out = out, .inp = inp, .dt = ctx->dt, .avx2 = __builtin_cpu_supports("avx2")};
    fsdp_cpu_parallel_range(ctx, n, FSDP_CPU_GRAIN, gelu_fwd_range, &j);
}

void fsdp_cpu_gelu_bwd(fsdp_op_ctx *ctx, float *dinp, const void *inp, const float *dout,
                       size_t n)
{
    gelu_job j = {.dinp = dinp, .inp = inp, .dout = dout, .dt = ctx->dt,
                  .avx2 = __builtin_cpu_supports("avx2")};
    fsdp_cpu_parallel_range(ctx, n, FSDP_CPU_GRAIN, gelu_bwd_range, &j);
}
