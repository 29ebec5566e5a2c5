/*
 * residual.c - residual connection on the cpu: out = a + b elementwise in
 * ctx->dt (bf16: the fp32 sum rounded once). out may alias a or b.
 */
#include "ops/cpu/cpu_ops.h"

void fsdp_cpu_residual_fwd(fsdp_op_ctx *ctx, void *out, const void *a, const void *b, size_t n)
{
    const fsdp_dtype dt = ctx->dt;
    for (size_t i = 0; i < n; i++)
        fsdp_cpu_st(out, dt, i, fsdp_cpu_ld(a, dt, i) + fsdp_cpu_ld(b, dt, i));
}
