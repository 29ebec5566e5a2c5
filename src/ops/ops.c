/*
 * ops.c - binds an op context to the rank's backend and one of its streams.
 */
#include "device/cpu.h"
#include "ops/ops.h"

fsdp_status fsdp_ops_init_stream(fsdp_op_ctx *ctx, fsdp_device *dev, fsdp_dtype dt,
                                 fsdp_stream_t stream)
{
    *ctx = (fsdp_op_ctx){.dev = dev, .stream = stream, .dt = dt};
    switch (dev->backend) {
    case FSDP_BACKEND_CPU:
        ctx->iface = fsdp_device_cpu_async(dev) ? &fsdp_ops_cpu_async_i : &fsdp_ops_cpu_i;
        return FSDP_STATUS_OK;
    case FSDP_BACKEND_META: ctx->iface = NULL; return FSDP_STATUS_OK;
    case FSDP_BACKEND_CUDA:
        ctx->iface = fsdp_ops_cuda_iface();
        if (!ctx->iface)
            return fsdp_error_set(FSDP_STATUS_UNSUPPORTED, "this build has no CUDA ops");
        return fsdp_ops_cuda_init(ctx);
    default: return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "unknown backend");
    }
}

fsdp_status fsdp_ops_init(fsdp_op_ctx *ctx, fsdp_device *dev, fsdp_dtype dt)
{
    return fsdp_ops_init_stream(ctx, dev, dt, dev->compute);
}

fsdp_status fsdp_ops_init_host(fsdp_op_ctx *ctx, fsdp_device *dev, fsdp_dtype dt)
{
    *ctx = (fsdp_op_ctx){.iface = &fsdp_ops_cpu_i, .dev = dev, .stream = NULL, .dt = dt};
    return FSDP_STATUS_OK;
}

void fsdp_ops_fini(fsdp_op_ctx *ctx)
{
    if (ctx->iface && ctx->iface->fini)
        ctx->iface->fini(ctx);
    ctx->iface = NULL;
}
