/*
 * residual.c - residual connection on the cpu: out = a + b elementwise in
 * ctx->dt (bf16: the fp32 sum rounded once). out may alias a or b. Ranges
 * of elements go to the rank's team.
 */
#include "ops/cpu/cpu_ops.h"

typedef struct residual_job {
    void *out;
    const void *a, *b;
    fsdp_dtype dt;
} residual_job;

/* One loop per dtype, so that each vectorises. */
static void residual_range(void *arg, size_t begin, size_t end, int worker)
{
    const residual_job *j = arg;
    if (j->dt == FSDP_DTYPE_BF16) {
        fsdp_bf16 *o = j->out;
        const fsdp_bf16 *a = j->a, *b = j->b;
        for (size_t i = begin; i < end; i++)
            o[i] = fsdp_f32_to_bf16(fsdp_bf16_to_f32(a[i]) + fsdp_bf16_to_f32(b[i]));
        return;
    }
    float *o = j->out;
    const float *a = j->a, *b = j->b;
    for (size_t i = begin; i < end; i++)
        o[i] = a[i] + b[i];
}

void fsdp_cpu_residual_fwd(fsdp_op_ctx *ctx, void *out, const void *a, const void *b, size_t n)
{
    residual_job j = {.out = out, .a = a, .b = b, .dt = ctx->dt};
    fsdp_cpu_parallel_range(ctx, n, FSDP_CPU_GRAIN, residual_range, &j);
}
