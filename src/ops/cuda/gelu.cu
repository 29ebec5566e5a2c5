/*
 * gelu.cu - GELU on the GPU, GPT-2's tanh approximation:
 *   gelu(x) = 0.5 x (1 + tanh(s (x + 0.044715 x^3))),  s = sqrt(2/pi),
 * and its derivative (sech^2 = 1 - tanh^2, as the cpu backend computes it).
 * inp/out in ctx->dt; dinp and dout fp32, dinp accumulated (+=).
 * tanhf is the precise CUDA one (no fast-math), within a few ulp of libm.
 */
#include "ops/cuda/common.cuh"

#define GELU_S 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_A 0.044715f

template <typename T>
__global__ void gelu_fwd_kernel(T *out, const T *inp, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float x = fsdp_cu_ld(inp, i);
        float u = GELU_S * (x + GELU_A * x * x * x);
        fsdp_cu_st(out, i, 0.5f * x * (1.0f + tanhf(u)));
    }
}

template <typename T>
__global__ void gelu_bwd_kernel(float *dinp, const T *inp, const float *dout, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float x = fsdp_cu_ld(inp, i);
        float u = GELU_S * (x + GELU_A * x * x * x);
        float th = tanhf(u);
        float sech2 = 1.0f - th * th;
        float du = GELU_S * (1.0f + 3.0f * GELU_A * x * x);
        float grad = 0.5f * (1.0f + th) + 0.5f * x * sech2 * du;
        dinp[i] += grad * dout[i];
    }
}

void fsdp_ops_cuda_gelu_fwd(fsdp_op_ctx *ctx, void *out, const void *inp, size_t n)
{
    fsdp_ops_cuda_elementwise(ctx, "gelu_fwd", n, [&](unsigned grid, cudaStream_t s) {
        FSDP_CUDA_DISPATCH(ctx->dt, E,
                           gelu_fwd_kernel<E><<<grid, 256, 0, s>>>((E *)out, (const E *)inp, n));
    });
}

void fsdp_ops_cuda_gelu_bwd(fsdp_op_ctx *ctx, float *dinp, const void *inp, const float *dout,
                            size_t n)
{
    fsdp_ops_cuda_elementwise(ctx, "gelu_bwd", n, [&](unsigned grid, cudaStream_t s) {
        FSDP_CUDA_DISPATCH(ctx->dt, E,
                           gelu_bwd_kernel<E><<<grid, 256, 0, s>>>(dinp, (const E *)inp, dout,
                                                                   n));
    });
}
