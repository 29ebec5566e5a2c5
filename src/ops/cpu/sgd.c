/*
 * sgd.c - SGD with momentum on host memory (PyTorch's torch.optim.SGD with
 * dampening 0, no Nesterov): the scalar reference that defines the update's
 * bits (operation order in optim_kernels.h), its SSE4.1, AVX2 and AVX-512F
 * transcriptions (seven roundings in the same order, the n % width tail
 * through the reference), and the cpu op table's sgd slot.
 */
#include <stdint.h>

#include "core/error.h"
#include "ops/cpu/cpu_ops.h"
#include "ops/optim_kernels.h"
#include "ops/cpu/simd.h"

/* ---- the reference ------------------------------------------------------ */

void fsdp_sgd_ref(float *p, const float *grad, float *buf, size_t n, float lr, float mu, float wd,
                  float grad_scale, void *p_out, fsdp_dtype out_dt)
{
    for (size_t i = 0; i < n; i++) {
        float g = grad[i] * grad_scale;
        float dec = wd * p[i];
        float d = g + dec;
        float bm = mu * buf[i];
        float bi = bm + d;
        float step = lr * bi;
        float pi = p[i] - step;
        buf[i] = bi;
        p[i] = pi;
        if (p_out)
            fsdp_cpu_st(p_out, out_dt, i, pi);
    }
}

/* ---- vector kernels --------------------------------------------------- */

/* Hyperparameters of one step, as the kernels take them. */
typedef struct sgd_hp {
    float lr, mu, wd, grad_scale;
} sgd_hp;

typedef void (*sgd_kernel_fn)(float *p, const float *grad, float *buf, size_t n, const sgd_hp *hp,
                              void *p_out, fsdp_dtype out_dt);

static void sgd_scalar(float *p, const float *grad, float *buf, size_t n, const sgd_hp *hp,
                       void *p_out, fsdp_dtype out_dt)
{
    fsdp_sgd_ref(p, grad, buf, n, hp->lr, hp->mu, hp->wd, hp->grad_scale, p_out, out_dt);
}

/* The reference on elements [i, n), for the kernels' tails. */
static void sgd_tail(size_t i, float *p, const float *grad, float *buf, size_t n,
                     const sgd_hp *hp, void *p_out, fsdp_dtype out_dt)
{
    if (i < n)
        sgd_scalar(p + i, grad + i, buf + i, n - i, hp, fsdp_cpu_at(p_out, out_dt, i), out_dt);
}

#if FSDP_CPU_X86

/* One kernel per instruction set, generated from the same body: V is the
 * vector type, W its width, the rest its intrinsics; STORE16 the bf16 store. */
#define SGD_KERNEL(NAME, TARGET, V, W, SET1, LOAD, STORE, MUL, ADD, SUB, STORE16)             \
    __attribute__((target(TARGET))) static void NAME(float *p, const float *grad, float *buf, \
                                                     size_t n, const sgd_hp *hp, void *p_out, \
                                                     fsdp_dtype out_dt)                       \
    {                                                                                         \
        const V lr = SET1(hp->lr), mu = SET1(hp->mu), wd = SET1(hp->wd);                      \
        const V gs = SET1(hp->grad_scale);                                                    \
        float *out32 = out_dt == FSDP_DTYPE_F32 ? p_out : NULL;                               \
        fsdp_bf16 *out16 = out_dt == FSDP_DTYPE_BF16 ? p_out : NULL;                          \
        size_t i = 0;                                                                         \
        for (; i + W <= n; i += W) {                                                          \
            const V p0 = LOAD(p + i);                                                         \
            const V g = MUL(LOAD(grad + i), gs);                                              \
            const V dec = MUL(wd, p0);                                                        \
            const V d = ADD(g, dec);                                                          \
            const V bm = MUL(mu, LOAD(buf + i));                                              \
            const V bi = ADD(bm, d);                                                          \
            const V step = MUL(lr, bi);                                                       \
            const V pi = SUB(p0, step);                                                       \
            STORE(buf + i, bi);                                                               \
            STORE(p + i, pi);                                                                 \
            if (out32)                                                                        \
                STORE(out32 + i, pi);                                                         \
            else if (out16)                                                                   \
                STORE16(out16 + i, pi);                                                       \
        }                                                                                     \
        sgd_tail(i, p, grad, buf, n, hp, p_out, out_dt);                                      \
    }

SGD_KERNEL(sgd_sse41, "sse4.1", __m128, 4, _mm_set1_ps, _mm_loadu_ps, _mm_storeu_ps, _mm_mul_ps,
           _mm_add_ps, _mm_sub_ps, fsdp_bf16_store_sse41)
SGD_KERNEL(sgd_avx2, "avx2", __m256, 8, _mm256_set1_ps, _mm256_loadu_ps, _mm256_storeu_ps,
           _mm256_mul_ps, _mm256_add_ps, _mm256_sub_ps, fsdp_bf16_store_avx2)
SGD_KERNEL(sgd_avx512f, "avx512f", __m512, 16, _mm512_set1_ps, _mm512_loadu_ps,
           _mm512_storeu_ps, _mm512_mul_ps, _mm512_add_ps, _mm512_sub_ps, fsdp_bf16_store_avx512)

#endif /* FSDP_CPU_X86 */

/* ---- dispatch --------------------------------------------------------- */

static const sgd_kernel_fn sgd_kernels[FSDP_CPU_ISA_COUNT] = {
    /* [SCALAR]  = */ sgd_scalar,
#if FSDP_CPU_X86
    /* [SSE41]   = */ sgd_sse41,
    /* [AVX2]    = */ sgd_avx2,
    /* [AVX512F] = */ sgd_avx512f,
#endif
};

void fsdp_sgd_cpu(fsdp_cpu_isa isa, float *p, const float *grad, float *buf, size_t n, float lr,
                  float mu, float wd, float grad_scale, void *p_out, fsdp_dtype out_dt)
{
    if (isa == FSDP_CPU_ISA_COUNT)
        isa = fsdp_cpu_isa_best();
    FSDP_ASSERT(fsdp_cpu_isa_supported(isa) && sgd_kernels[isa]);
    const sgd_hp hp = {lr, mu, wd, grad_scale};
    sgd_kernels[isa](p, grad, buf, n, &hp, p_out, out_dt);
}

/* ---- the op slot ------------------------------------------------------ */

void fsdp_cpu_sgd(fsdp_op_ctx *ctx, float *p, const float *grad, float *buf, size_t n, float lr,
                  float mu, float wd, float grad_scale, void *p_out, fsdp_dtype out_dt)
{
    (void)ctx;
    fsdp_sgd_ref(p, grad, buf, n, lr, mu, wd, grad_scale, p_out, out_dt);
}
