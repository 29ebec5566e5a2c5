/*
 * ops.c - binds an op context to the rank's backend and one of its streams.
 */
#include "device/cpu.h"
#include "ops/ops.h"

/* The backend's table for dev, bound to stream. */
static fsdp_status ops_bind(fsdp_op_ctx *ctx, fsdp_device *dev, fsdp_dtype dt,
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

/* A backend's table fills every slot but the optional sync_error: a
 * missing one is a bug of the table, caught when it is bound, not a silent
 * no-op when a model calls it (FSDP_OP skips NULL slots for meta only). */
static void assert_complete(const struct fsdp_ops_i *t)
{
#define REQUIRED(slot) FSDP_ASSERT(t->slot != NULL)
    REQUIRED(fini);
    REQUIRED(embed_fwd);
    REQUIRED(embed_bwd);
    REQUIRED(layernorm_fwd);
    REQUIRED(layernorm_bwd);
    REQUIRED(matmul_fwd);
    REQUIRED(matmul_bwd);
    REQUIRED(lora_fwd);
    REQUIRED(lora_bwd);
    REQUIRED(gelu_fwd);
    REQUIRED(gelu_bwd);
    REQUIRED(attention_fwd);
    REQUIRED(attention_bwd);
    REQUIRED(residual_fwd);
    REQUIRED(xent_fwd_bwd);
    REQUIRED(adamw);
    REQUIRED(sgd);
    REQUIRED(cast);
    REQUIRED(nf4_dequant);
    REQUIRED(add);
    REQUIRED(sumsq_blocks);
    REQUIRED(rmsnorm_fwd);
    REQUIRED(rmsnorm_bwd);
    REQUIRED(rope_fwd);
    REQUIRED(rope_bwd);
    REQUIRED(swiglu_fwd);
    REQUIRED(swiglu_bwd);
    REQUIRED(attention_gqa_fwd);
    REQUIRED(attention_gqa_bwd);
#undef REQUIRED
}

fsdp_status fsdp_ops_init_stream(fsdp_op_ctx *ctx, fsdp_device *dev, fsdp_dtype dt,
                                 fsdp_stream_t stream)
{
    fsdp_status st = ops_bind(ctx, dev, dt, stream);
    if (st == FSDP_STATUS_OK && ctx->iface)
        assert_complete(ctx->iface);
    return st;
}

fsdp_status fsdp_ops_init(fsdp_op_ctx *ctx, fsdp_device *dev, fsdp_dtype dt)
{
    return fsdp_ops_init_stream(ctx, dev, dt, dev->compute);
}

fsdp_status fsdp_ops_init_host(fsdp_op_ctx *ctx, fsdp_device *dev, fsdp_dtype dt)
{
    /* meta backs no memory: its host work is no work either */
    *ctx = (fsdp_op_ctx){.iface = fsdp_device_computes(dev) ? &fsdp_ops_cpu_i : NULL, .dev = dev,
                         .dt = dt};
    return FSDP_STATUS_OK;
}

fsdp_status fsdp_ops_init_host_stream(fsdp_op_ctx *ctx, fsdp_device *dev, fsdp_dtype dt,
                                      fsdp_stream_t stream)
{
    *ctx = (fsdp_op_ctx){.iface = fsdp_device_computes(dev) ? &fsdp_ops_cpu_async_i : NULL,
                         .dev = dev, .stream = stream, .dt = dt};
    return FSDP_STATUS_OK;
}

void fsdp_ops_fini(fsdp_op_ctx *ctx)
{
    if (ctx->iface && ctx->iface->fini)
        ctx->iface->fini(ctx);
    ctx->iface = NULL;
}
