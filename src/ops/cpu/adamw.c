/*
 * adamw.c - AdamW on host memory: the scalar reference that defines the
 * update's bits (operation order in optim_kernels.h), its SSE4.1, AVX2 and
 * AVX-512F transcriptions, and the cpu op table's adamw slot.
 *
 * Each vector kernel is a line-for-line transcription of fsdp_adamw_ref:
 * the same seventeen roundings in the same order; the n % width tail goes
 * through the reference. AdamW on a large shard is memory-bound (28 bytes
 * per element), so the kernels stay simple: unaligned loads and stores, no
 * unrolling beyond what the core does itself.
 */
#include <math.h>
#include <stdint.h>

#include "core/error.h"
#include "ops/cpu/cpu_ops.h"
#include "ops/optim_kernels.h"
#include "ops/cpu/simd.h"

/* ---- the reference ------------------------------------------------------ */

void fsdp_adamw_ref(float *p, const float *grad, float *m, float *v, size_t n, float lr, float b1,
                    float b2, float eps, float wd, float bc1, float bc2, float grad_scale,
                    void *p_out, fsdp_dtype out_dt)
{
    const float omb1 = 1.0f - b1;
    const float omb2 = 1.0f - b2;
    for (size_t i = 0; i < n; i++) {
        float g = grad[i] * grad_scale;
        float bm = b1 * m[i];
        float gm = omb1 * g;
        float mi = bm + gm;
        float g2 = g * g;
        float bv = b2 * v[i];
        float gv = omb2 * g2;
        float vi = bv + gv;
        float mhat = mi / bc1;
        float vhat = vi / bc2;
        float den = sqrtf(vhat) + eps;
        float q = mhat / den;
        float dec = wd * p[i];
        float upd = q + dec;
        float step = lr * upd;
        float pi = p[i] - step;
        m[i] = mi;
        v[i] = vi;
        fsdp_cpu_param_st(p, p_out, out_dt, i, pi);
    }
}

/* ---- vector kernels --------------------------------------------------- */

/* Hyperparameters of one step, as the kernels take them. */
typedef struct adamw_hp {
    float lr, b1, b2, eps, wd, bc1, bc2, grad_scale;
} adamw_hp;

typedef void (*adamw_kernel_fn)(float *p, const float *grad, float *m, float *v, size_t n,
                                const adamw_hp *hp, void *p_out, fsdp_dtype out_dt);

static void adamw_scalar(float *p, const float *grad, float *m, float *v, size_t n,
                         const adamw_hp *hp, void *p_out, fsdp_dtype out_dt)
{
    fsdp_adamw_ref(p, grad, m, v, n, hp->lr, hp->b1, hp->b2, hp->eps, hp->wd, hp->bc1, hp->bc2,
                   hp->grad_scale, p_out, out_dt);
}

/* The reference on elements [i, n), for the kernels' tails. */
static void adamw_tail(size_t i, float *p, const float *grad, float *m, float *v, size_t n,
                       const adamw_hp *hp, void *p_out, fsdp_dtype out_dt)
{
    if (i < n)
        adamw_scalar(p + i, grad + i, m + i, v + i, n - i, hp, fsdp_cpu_at(p_out, out_dt, i),
                     out_dt);
}

#if FSDP_CPU_X86

/* One kernel per instruction set of simd.h's list, from the same body: V is
 * the vector type, W its width, PFX its intrinsics' prefix. */
#define ADAMW_KERNEL(isa, TARGET, V, W, PFX)                                                 \
    __attribute__((target(TARGET))) static void adamw_##isa(float *p, const float *grad,     \
                                                            float *m, float *v, size_t n,    \
                                                            const adamw_hp *hp, void *p_out, \
                                                            fsdp_dtype out_dt)               \
    {                                                                                        \
        const V lr = PFX##_set1_ps(hp->lr), b1 = PFX##_set1_ps(hp->b1);                      \
        const V b2 = PFX##_set1_ps(hp->b2);                                                  \
        const V omb1 = PFX##_set1_ps(1.0f - hp->b1), omb2 = PFX##_set1_ps(1.0f - hp->b2);    \
        const V eps = PFX##_set1_ps(hp->eps), wd = PFX##_set1_ps(hp->wd);                    \
        const V bc1 = PFX##_set1_ps(hp->bc1), bc2 = PFX##_set1_ps(hp->bc2);                  \
        const V gs = PFX##_set1_ps(hp->grad_scale);                                          \
        size_t i = 0;                                                                        \
        for (; i + W <= n; i += W) {                                                         \
            const V p0 = PFX##_loadu_ps(p + i);                                              \
            const V g = PFX##_mul_ps(PFX##_loadu_ps(grad + i), gs);                          \
            const V bm = PFX##_mul_ps(b1, PFX##_loadu_ps(m + i));                            \
            const V gm = PFX##_mul_ps(omb1, g);                                              \
            const V mi = PFX##_add_ps(bm, gm);                                               \
            const V g2 = PFX##_mul_ps(g, g);                                                 \
            const V bv = PFX##_mul_ps(b2, PFX##_loadu_ps(v + i));                            \
            const V gv = PFX##_mul_ps(omb2, g2);                                             \
            const V vi = PFX##_add_ps(bv, gv);                                               \
            const V mhat = PFX##_div_ps(mi, bc1);                                            \
            const V vhat = PFX##_div_ps(vi, bc2);                                            \
            const V den = PFX##_add_ps(PFX##_sqrt_ps(vhat), eps);                            \
            const V q = PFX##_div_ps(mhat, den);                                             \
            const V dec = PFX##_mul_ps(wd, p0);                                              \
            const V upd = PFX##_add_ps(q, dec);                                              \
            const V step = PFX##_mul_ps(lr, upd);                                            \
            const V pi = PFX##_sub_ps(p0, step);                                             \
            PFX##_storeu_ps(m + i, mi);                                                      \
            PFX##_storeu_ps(v + i, vi);                                                      \
            fsdp_param_store_##isa(p, p_out, out_dt, i, pi);                                 \
        }                                                                                    \
        adamw_tail(i, p, grad, m, v, n, hp, p_out, out_dt);                                  \
    }

FSDP_CPU_EACH_SIMD(ADAMW_KERNEL)

#endif /* FSDP_CPU_X86 */

/* ---- dispatch --------------------------------------------------------- */

static const adamw_kernel_fn adamw_kernels[FSDP_CPU_ISA_COUNT] = {
    /* [SCALAR]  = */ adamw_scalar,
#if FSDP_CPU_X86
    /* [SSE41]   = */ adamw_sse41,
    /* [AVX2]    = */ adamw_avx2,
    /* [AVX512F] = */ adamw_avx512f,
#endif
};

void fsdp_adamw_cpu(fsdp_cpu_isa isa, float *p, const float *grad, float *m, float *v, size_t n,
                    float lr, float b1, float b2, float eps, float wd, float bc1, float bc2,
                    float grad_scale, void *p_out, fsdp_dtype out_dt)
{
    if (isa == FSDP_CPU_ISA_COUNT)
        isa = fsdp_cpu_isa_best();
    FSDP_ASSERT(fsdp_cpu_isa_supported(isa) && adamw_kernels[isa]);
    const adamw_hp hp = {lr, b1, b2, eps, wd, bc1, bc2, grad_scale};
    adamw_kernels[isa](p, grad, m, v, n, &hp, p_out, out_dt);
}

/* ---- the op slot ------------------------------------------------------ */

void fsdp_cpu_adamw(fsdp_op_ctx *ctx, float *p, const float *grad, float *m, float *v, size_t n,
                    float lr, float b1, float b2, float eps, float wd, float bc1, float bc2,
                    float grad_scale, void *p_out, fsdp_dtype out_dt)
{
    (void)ctx;
    fsdp_adamw_ref(p, grad, m, v, n, lr, b1, b2, eps, wd, bc1, bc2, grad_scale, p_out, out_dt);
}
