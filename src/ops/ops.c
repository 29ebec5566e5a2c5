/*
 * ops.c - binds an op context to the rank's backend.
 */
#include "ops/ops.h"

fsdp_status fsdp_ops_init(fsdp_op_ctx *ctx, fsdp_device *dev, fsdp_dtype dt)
{
    *ctx = (fsdp_op_ctx){.dev = dev, .stream = dev->compute, .dt = dt};
    switch (dev->backend) {
    case FSDP_BACKEND_CPU: ctx->iface = &fsdp_ops_cpu_i; return FSDP_STATUS_OK;
    case FSDP_BACKEND_META: ctx->iface = NULL; return FSDP_STATUS_OK;
    case FSDP_BACKEND_CUDA:
        ctx->iface = fsdp_ops_cuda_iface();
        if (!ctx->iface)
            return fsdp_error_set(FSDP_STATUS_UNSUPPORTED, "this build has no CUDA ops");
        return fsdp_ops_cuda_init(ctx);
    default: return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "unknown backend");
    }
}

void fsdp_ops_fini(fsdp_op_ctx *ctx)
{
    if (ctx->iface && ctx->iface->fini)
        ctx->iface->fini(ctx);
    ctx->iface = NULL;
}
