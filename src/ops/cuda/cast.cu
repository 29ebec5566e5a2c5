/*
 * cast.cu - dtype conversion on the GPU: fp32 -> bf16 (round to nearest
 * even, NaN kept quiet with core/bf16.h's bit pattern, so the cpu and cuda
 * casts agree bit for bit), bf16 -> fp32 (exact), and same-dtype copies
 * (cudaMemcpyAsync on ctx->stream; overlapping src/dst is not supported).
 */
#include "ops/cuda/common.cuh"

__global__ void cast_bf16_to_f32_kernel(float *dst, const __nv_bfloat16 *src, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dst[i] = fsdp_cu_bf2f(src[i]);
}

void fsdp_ops_cuda_cast(fsdp_op_ctx *ctx, void *dst, fsdp_dtype ddt, const void *src,
                        fsdp_dtype sdt, size_t n)
{
    if (!n || !fsdp_ops_cuda_ok(ctx))
        return;
    cudaStream_t s = fsdp_ops_cuda_stream(ctx);
    if (ddt == sdt) {
        if (dst == src)
            return;
        cudaError_t rc = fsdp_cuda_error_take(
            cudaMemcpyAsync(dst, src, n * fsdp_dtype_size(ddt), cudaMemcpyDefault, s));
        if (rc != cudaSuccess)
            fsdp_ops_cuda_fail(ctx, FSDP_STATUS_CUDA, "cast", "copy of %zu elements failed: %s",
                               n, cudaGetErrorString(rc));
        return;
    }
    if (ddt == FSDP_DTYPE_BF16) {
        fsdp_ops_cuda_f32_to_bf16(ctx, "cast", (__nv_bfloat16 *)dst, (const float *)src, n);
        return;
    }
    cast_bf16_to_f32_kernel<<<fsdp_ops_cuda_grid(ctx, n, 256), 256, 0, s>>>(
        (float *)dst, (const __nv_bfloat16 *)src, n);
    fsdp_ops_cuda_launched(ctx, "cast");
}
