/*
 * cast.c - data movement and reductions on the cpu: dtype casts, fp32 add,
 * and the per-block sums of squares used for the gradient norm.
 */
#include <string.h>

#include "ops/cpu/cpu_ops.h"

void fsdp_cpu_cast(fsdp_op_ctx *ctx, void *dst, fsdp_dtype ddt, const void *src, fsdp_dtype sdt,
                   size_t n)
{
    if (ddt == sdt) {
        memmove(dst, src, n * fsdp_dtype_size(ddt));
        return;
    }
    if (ddt == FSDP_DTYPE_BF16) {
        fsdp_bf16 *d = dst;
        const float *s = src;
        for (size_t i = 0; i < n; i++)
            d[i] = fsdp_f32_to_bf16(s[i]);
    } else {
        float *d = dst;
        const fsdp_bf16 *s = src;
        for (size_t i = 0; i < n; i++)
            d[i] = fsdp_bf16_to_f32(s[i]);
    }
}

void fsdp_cpu_add(fsdp_op_ctx *ctx, float *dst, const float *a, const float *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = a[i] + b[i];
}

/* Each x[i] is widened to double and squared in double; the block sum runs
 * left to right in double and is rounded to fp32 once. A vectorised version
 * must keep this order to give the same bits. */
void fsdp_cpu_sumsq_blocks(fsdp_op_ctx *ctx, float *out, const float *x, size_t n)
{
    for (size_t k = 0, i = 0; i < n; k++) {
        size_t end = i + FSDP_NORM_BLOCK < n ? i + FSDP_NORM_BLOCK : n;
        double s = 0.0;
        for (; i < end; i++) {
            double d = x[i];
            s += d * d;
        }
        out[k] = (float)s;
    }
}
