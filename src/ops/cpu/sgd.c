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
        fsdp_cpu_param_st(p, p_out, out_dt, i, pi);
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

/* One kernel per instruction set of simd.h's list, from the same body: V is
 * the vector type, W its width, PFX its intrinsics' prefix. */
#define SGD_KERNEL(isa, TARGET, V, W, PFX)                                               \
    __attribute__((target(TARGET))) static void sgd_##isa(float *p, const float *grad,   \
                                                          float *buf, size_t n,          \
                                                          const sgd_hp *hp, void *p_out, \
                                                          fsdp_dtype out_dt)             \
    {                                                                                    \
        const V lr = PFX##_set1_ps(hp->lr), mu = PFX##_set1_ps(hp->mu);                  \
        const V wd = PFX##_set1_ps(hp->wd), gs = PFX##_set1_ps(hp->grad_scale);          \
        size_t i = 0;                                                                    \
        for (; i + W <= n; i += W) {                                                     \
            const V p0 = PFX##_loadu_ps(p + i);                                          \
            const V g = PFX##_mul_ps(PFX##_loadu_ps(grad + i), gs);                      \
            const V dec = PFX##_mul_ps(wd, p0);                                          \
            const V d = PFX##_add_ps(g, dec);                                            \
            const V bm = PFX##_mul_ps(mu, PFX##_loadu_ps(buf + i));                      \
            const V bi = PFX##_add_ps(bm, d);                                            \
            const V step = PFX##_mul_ps(lr, bi);                                         \
            const V pi = PFX##_sub_ps(p0, step);                                         \
            PFX##_storeu_ps(buf + i, bi);                                                \
            fsdp_param_store_##isa(p, p_out, out_dt, i, pi);                             \
        }                                                                                \
        sgd_tail(i, p, grad, buf, n, hp, p_out, out_dt);                                 \
    }

FSDP_CPU_EACH_SIMD(SGD_KERNEL)

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
