/*
 * swiglu.cu - SwiGLU on the GPU for a fused [gate | up] projection:
 *   inp (N, 2 IC) = [gate | up] per row,  out (N, IC) = silu(gate) * up,
 *   silu(g) = g / (1 + e^-g),
 * and its backward, dgate += dout * up * s (1 + g (1 - s)) with
 * s = 1 / (1 + e^-g), dup += dout * silu(g). inp/out in ctx->dt, gradients
 * fp32. expf is CUDA's precise one (no fast-math), products explicitly
 * rounded, so results match the cpu's polynomial exp to a few ulp.
 */
#include "ops/cuda/common.cuh"

template <typename T>
__global__ void swiglu_fwd_kernel(T *out, const T *inp, size_t n, int IC)
{
    for (size_t k = blockIdx.x * (size_t)blockDim.x + threadIdx.x; k < n;
         k += (size_t)gridDim.x * blockDim.x) {
        const size_t r = k / IC, j = k % IC, gi = r * 2 * IC + j;
        const float g = fsdp_cu_ld(inp, gi), u = fsdp_cu_ld(inp, gi + IC);
        fsdp_cu_st(out, k, __fmul_rn(g / __fadd_rn(1.0f, expf(-g)), u));
    }
}

template <typename T>
__global__ void swiglu_bwd_kernel(float *dinp, const T *inp, const float *dout, size_t n, int IC)
{
    for (size_t k = blockIdx.x * (size_t)blockDim.x + threadIdx.x; k < n;
         k += (size_t)gridDim.x * blockDim.x) {
        const size_t r = k / IC, j = k % IC, gi = r * 2 * IC + j;
        const float g = fsdp_cu_ld(inp, gi), u = fsdp_cu_ld(inp, gi + IC), dy = dout[k];
        const float e1 = __fadd_rn(1.0f, expf(-g));
        const float s = 1.0f / e1;
        const float ds = __fmul_rn(s, __fadd_rn(1.0f, __fmul_rn(g, __fsub_rn(1.0f, s))));
        dinp[gi] += __fmul_rn(__fmul_rn(dy, u), ds);
        dinp[gi + IC] += __fmul_rn(dy, g / e1);
    }
}

void fsdp_ops_cuda_swiglu_fwd(fsdp_op_ctx *ctx, void *out, const void *inp, int N, int IC)
{
    const size_t n = N > 0 && IC > 0 ? (size_t)N * IC : 0;
    fsdp_ops_cuda_elementwise(ctx, "swiglu_fwd", n, [&](unsigned grid, cudaStream_t s) {
        FSDP_CUDA_DISPATCH(ctx->dt, E,
                           swiglu_fwd_kernel<E><<<grid, 256, 0, s>>>((E *)out, (const E *)inp, n,
                                                                     IC));
    });
}

void fsdp_ops_cuda_swiglu_bwd(fsdp_op_ctx *ctx, float *dinp, const void *inp, const float *dout,
                              int N, int IC)
{
    const size_t n = N > 0 && IC > 0 ? (size_t)N * IC : 0;
    fsdp_ops_cuda_elementwise(ctx, "swiglu_bwd", n, [&](unsigned grid, cudaStream_t s) {
        FSDP_CUDA_DISPATCH(ctx->dt, E,
                           swiglu_bwd_kernel<E><<<grid, 256, 0, s>>>(dinp, (const E *)inp, dout, n,
                                                                     IC));
    });
}
