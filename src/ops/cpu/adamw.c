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
        p[i] = pi;
        if (p_out)
            fsdp_cpu_st(p_out, out_dt, i, pi);
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

/* ---- SSE4.1: 4 lanes -------------------------------------------------- */

__attribute__((target("sse4.1"))) static void adamw_sse41(float *p, const float *grad, float *m,
                                                          float *v, size_t n, const adamw_hp *hp,
                                                          void *p_out, fsdp_dtype out_dt)
{
    const __m128 lr = _mm_set1_ps(hp->lr), b1 = _mm_set1_ps(hp->b1), b2 = _mm_set1_ps(hp->b2);
    const __m128 omb1 = _mm_set1_ps(1.0f - hp->b1), omb2 = _mm_set1_ps(1.0f - hp->b2);
    const __m128 eps = _mm_set1_ps(hp->eps), wd = _mm_set1_ps(hp->wd);
    const __m128 bc1 = _mm_set1_ps(hp->bc1), bc2 = _mm_set1_ps(hp->bc2);
    const __m128 gs = _mm_set1_ps(hp->grad_scale);
    float *out32 = out_dt == FSDP_DTYPE_F32 ? p_out : NULL;
    fsdp_bf16 *out16 = out_dt == FSDP_DTYPE_BF16 ? p_out : NULL;
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        const __m128 p0 = _mm_loadu_ps(p + i);
        const __m128 g = _mm_mul_ps(_mm_loadu_ps(grad + i), gs);
        const __m128 bm = _mm_mul_ps(b1, _mm_loadu_ps(m + i));
        const __m128 gm = _mm_mul_ps(omb1, g);
        const __m128 mi = _mm_add_ps(bm, gm);
        const __m128 g2 = _mm_mul_ps(g, g);
        const __m128 bv = _mm_mul_ps(b2, _mm_loadu_ps(v + i));
        const __m128 gv = _mm_mul_ps(omb2, g2);
        const __m128 vi = _mm_add_ps(bv, gv);
        const __m128 mhat = _mm_div_ps(mi, bc1);
        const __m128 vhat = _mm_div_ps(vi, bc2);
        const __m128 den = _mm_add_ps(_mm_sqrt_ps(vhat), eps);
        const __m128 q = _mm_div_ps(mhat, den);
        const __m128 dec = _mm_mul_ps(wd, p0);
        const __m128 upd = _mm_add_ps(q, dec);
        const __m128 step = _mm_mul_ps(lr, upd);
        const __m128 pi = _mm_sub_ps(p0, step);
        _mm_storeu_ps(m + i, mi);
        _mm_storeu_ps(v + i, vi);
        _mm_storeu_ps(p + i, pi);
        if (out32)
            _mm_storeu_ps(out32 + i, pi);
        else if (out16)
            fsdp_bf16_store_sse41(out16 + i, pi);
    }
    adamw_tail(i, p, grad, m, v, n, hp, p_out, out_dt);
}

/* ---- AVX2: 8 lanes ---------------------------------------------------- */

__attribute__((target("avx2"))) static void adamw_avx2(float *p, const float *grad, float *m,
                                                       float *v, size_t n, const adamw_hp *hp,
                                                       void *p_out, fsdp_dtype out_dt)
{
    const __m256 lr = _mm256_set1_ps(hp->lr), b1 = _mm256_set1_ps(hp->b1);
    const __m256 b2 = _mm256_set1_ps(hp->b2);
    const __m256 omb1 = _mm256_set1_ps(1.0f - hp->b1), omb2 = _mm256_set1_ps(1.0f - hp->b2);
    const __m256 eps = _mm256_set1_ps(hp->eps), wd = _mm256_set1_ps(hp->wd);
    const __m256 bc1 = _mm256_set1_ps(hp->bc1), bc2 = _mm256_set1_ps(hp->bc2);
    const __m256 gs = _mm256_set1_ps(hp->grad_scale);
    float *out32 = out_dt == FSDP_DTYPE_F32 ? p_out : NULL;
    fsdp_bf16 *out16 = out_dt == FSDP_DTYPE_BF16 ? p_out : NULL;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 p0 = _mm256_loadu_ps(p + i);
        const __m256 g = _mm256_mul_ps(_mm256_loadu_ps(grad + i), gs);
        const __m256 bm = _mm256_mul_ps(b1, _mm256_loadu_ps(m + i));
        const __m256 gm = _mm256_mul_ps(omb1, g);
        const __m256 mi = _mm256_add_ps(bm, gm);
        const __m256 g2 = _mm256_mul_ps(g, g);
        const __m256 bv = _mm256_mul_ps(b2, _mm256_loadu_ps(v + i));
        const __m256 gv = _mm256_mul_ps(omb2, g2);
        const __m256 vi = _mm256_add_ps(bv, gv);
        const __m256 mhat = _mm256_div_ps(mi, bc1);
        const __m256 vhat = _mm256_div_ps(vi, bc2);
        const __m256 den = _mm256_add_ps(_mm256_sqrt_ps(vhat), eps);
        const __m256 q = _mm256_div_ps(mhat, den);
        const __m256 dec = _mm256_mul_ps(wd, p0);
        const __m256 upd = _mm256_add_ps(q, dec);
        const __m256 step = _mm256_mul_ps(lr, upd);
        const __m256 pi = _mm256_sub_ps(p0, step);
        _mm256_storeu_ps(m + i, mi);
        _mm256_storeu_ps(v + i, vi);
        _mm256_storeu_ps(p + i, pi);
        if (out32)
            _mm256_storeu_ps(out32 + i, pi);
        else if (out16)
            fsdp_bf16_store_avx2(out16 + i, pi);
    }
    adamw_tail(i, p, grad, m, v, n, hp, p_out, out_dt);
}

/* ---- AVX-512F: 16 lanes ----------------------------------------------- */

__attribute__((target("avx512f"))) static void adamw_avx512f(float *p, const float *grad,
                                                             float *m, float *v, size_t n,
                                                             const adamw_hp *hp, void *p_out,
                                                             fsdp_dtype out_dt)
{
    const __m512 lr = _mm512_set1_ps(hp->lr), b1 = _mm512_set1_ps(hp->b1);
    const __m512 b2 = _mm512_set1_ps(hp->b2);
    const __m512 omb1 = _mm512_set1_ps(1.0f - hp->b1), omb2 = _mm512_set1_ps(1.0f - hp->b2);
    const __m512 eps = _mm512_set1_ps(hp->eps), wd = _mm512_set1_ps(hp->wd);
    const __m512 bc1 = _mm512_set1_ps(hp->bc1), bc2 = _mm512_set1_ps(hp->bc2);
    const __m512 gs = _mm512_set1_ps(hp->grad_scale);
    float *out32 = out_dt == FSDP_DTYPE_F32 ? p_out : NULL;
    fsdp_bf16 *out16 = out_dt == FSDP_DTYPE_BF16 ? p_out : NULL;
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512 p0 = _mm512_loadu_ps(p + i);
        const __m512 g = _mm512_mul_ps(_mm512_loadu_ps(grad + i), gs);
        const __m512 bm = _mm512_mul_ps(b1, _mm512_loadu_ps(m + i));
        const __m512 gm = _mm512_mul_ps(omb1, g);
        const __m512 mi = _mm512_add_ps(bm, gm);
        const __m512 g2 = _mm512_mul_ps(g, g);
        const __m512 bv = _mm512_mul_ps(b2, _mm512_loadu_ps(v + i));
        const __m512 gv = _mm512_mul_ps(omb2, g2);
        const __m512 vi = _mm512_add_ps(bv, gv);
        const __m512 mhat = _mm512_div_ps(mi, bc1);
        const __m512 vhat = _mm512_div_ps(vi, bc2);
        const __m512 den = _mm512_add_ps(_mm512_sqrt_ps(vhat), eps);
        const __m512 q = _mm512_div_ps(mhat, den);
        const __m512 dec = _mm512_mul_ps(wd, p0);
        const __m512 upd = _mm512_add_ps(q, dec);
        const __m512 step = _mm512_mul_ps(lr, upd);
        const __m512 pi = _mm512_sub_ps(p0, step);
        _mm512_storeu_ps(m + i, mi);
        _mm512_storeu_ps(v + i, vi);
        _mm512_storeu_ps(p + i, pi);
        if (out32)
            _mm512_storeu_ps(out32 + i, pi);
        else if (out16)
            fsdp_bf16_store_avx512(out16 + i, pi);
    }
    adamw_tail(i, p, grad, m, v, n, hp, p_out, out_dt);
}

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
