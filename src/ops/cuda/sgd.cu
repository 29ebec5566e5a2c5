/*
 * sgd.cu - SGD with momentum on the GPU, bit-identical to fsdp_sgd_ref
 * (ops/optim_kernels.h defines the operation order). Every step uses an
 * explicit round-to-nearest intrinsic (__fmul_rn, __fadd_rn, __fsub_rn),
 * which nvcc never contracts into an FMA, so each rounding matches the
 * cpu's -ffp-contract=off build.
 *
 * p, grad, buf fp32 (n elements, p and buf updated in place; grad may not
 * alias them); p_out optional: the new p again, in out_dt (bf16 rounded to
 * nearest even); it may alias p only when out_dt is fp32.
 */
#include "ops/cuda/common.cuh"

template <typename O>
__global__ void sgd_kernel(float *p, const float *grad, float *buf, size_t n, float lr, float mu,
                           float wd, float grad_scale, O *p_out)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float pv = p[i];
        float g = __fmul_rn(grad[i], grad_scale);
        float d = __fadd_rn(g, __fmul_rn(wd, pv));
        float bi = __fadd_rn(__fmul_rn(mu, buf[i]), d);
        float pi = __fsub_rn(pv, __fmul_rn(lr, bi));
        buf[i] = bi;
        p[i] = pi;
        if (p_out)
            fsdp_cu_st(p_out, i, pi);
    }
}

void fsdp_ops_cuda_sgd(fsdp_op_ctx *ctx, float *p, const float *grad, float *buf, size_t n,
                       float lr, float mu, float wd, float grad_scale, void *p_out,
                       fsdp_dtype out_dt)
{
    if (!n || !fsdp_ops_cuda_ok(ctx))
        return;
    unsigned grid = fsdp_ops_cuda_grid(ctx, n, 256);
    cudaStream_t s = fsdp_ops_cuda_stream(ctx);
    if (p_out && out_dt == FSDP_DTYPE_BF16)
        sgd_kernel<__nv_bfloat16><<<grid, 256, 0, s>>>(p, grad, buf, n, lr, mu, wd, grad_scale,
                                                       (__nv_bfloat16 *)p_out);
    else
        sgd_kernel<float><<<grid, 256, 0, s>>>(p, grad, buf, n, lr, mu, wd, grad_scale,
                                               (float *)p_out);
    fsdp_ops_cuda_launched(ctx, "sgd");
}
