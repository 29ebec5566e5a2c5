/*
 * residual.cu - elementwise sums on the GPU: the residual connection
 * out = a + b in ctx->dt (fp32 sum, one rounding), and the fp32 add used
 * for gradients (dst may alias a or b: each element is read, then written,
 * by one thread).
 */
#include "ops/cuda/common.cuh"

template <typename T>
__global__ void residual_fwd_kernel(T *out, const T *a, const T *b, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        fsdp_cu_st(out, i, fsdp_cu_ld(a, i) + fsdp_cu_ld(b, i));
}

__global__ void add_f32_kernel(float *dst, const float *a, const float *b, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dst[i] = a[i] + b[i];
}

void fsdp_ops_cuda_residual_fwd(fsdp_op_ctx *ctx, void *out, const void *a, const void *b,
                                size_t n)
{
    fsdp_ops_cuda_elementwise(ctx, "residual_fwd", n, [&](unsigned grid, cudaStream_t s) {
        FSDP_CUDA_DISPATCH(ctx->dt, E,
                           residual_fwd_kernel<E><<<grid, 256, 0, s>>>((E *)out, (const E *)a,
                                                                       (const E *)b, n));
    });
}

void fsdp_ops_cuda_add(fsdp_op_ctx *ctx, float *dst, const float *a, const float *b, size_t n)
{
    fsdp_ops_cuda_elementwise(ctx, "add", n, [&](unsigned grid, cudaStream_t s) {
        add_f32_kernel<<<grid, 256, 0, s>>>(dst, a, b, n);
    });
}
