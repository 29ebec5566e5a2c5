/*
 * gelu.c - GELU on the cpu, GPT-2's tanh approximation:
 *   gelu(x) = 0.5 x (1 + tanh(s (x + 0.044715 x^3))),  s = sqrt(2/pi),
 * and its exact derivative. inp/out in ctx->dt, gradients fp32.
 */
#include <math.h>

#include "ops/cpu/cpu_ops.h"

#define GELU_S 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_A 0.044715f

void fsdp_cpu_gelu_fwd(fsdp_op_ctx *ctx, void *out, const void *inp, size_t n)
{
    const fsdp_dtype dt = ctx->dt;
    for (size_t i = 0; i < n; i++) {
        float x = fsdp_cpu_ld(inp, dt, i);
        float u = GELU_S * (x + GELU_A * x * x * x);
        fsdp_cpu_st(out, dt, i, 0.5f * x * (1.0f + tanhf(u)));
    }
}

void fsdp_cpu_gelu_bwd(fsdp_op_ctx *ctx, float *dinp, const void *inp, const float *dout,
                       size_t n)
{
    const fsdp_dtype dt = ctx->dt;
    for (size_t i = 0; i < n; i++) {
        float x = fsdp_cpu_ld(inp, dt, i);
        float u = GELU_S * (x + GELU_A * x * x * x);
        float th = tanhf(u);
        float sech2 = 1.0f - th * th;
        float du = GELU_S * (1.0f + 3.0f * GELU_A * x * x);
        float grad = 0.5f * (1.0f + th) + 0.5f * x * sech2 * du;
        dinp[i] += grad * dout[i];
    }
}
