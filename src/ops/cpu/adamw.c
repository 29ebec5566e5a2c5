/*
 * adamw.c - the cpu op slot for AdamW: the scalar reference itself
 * (optim/adamw.h defines the operation order).
 */
#include "ops/cpu/cpu_ops.h"
#include "optim/adamw.h"

void fsdp_cpu_adamw(fsdp_op_ctx *ctx, float *p, const float *grad, float *m, float *v, size_t n,
                    float lr, float b1, float b2, float eps, float wd, float bc1, float bc2,
                    float grad_scale, void *p_out, fsdp_dtype out_dt)
{
    fsdp_adamw_ref(p, grad, m, v, n, lr, b1, b2, eps, wd, bc1, bc2, grad_scale, p_out, out_dt);
}
