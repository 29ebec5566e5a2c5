/*
 * adamw.cu - AdamW on the GPU, bit-identical to fsdp_adamw_ref
 * (ops/optim_kernels.h defines the operation order). Every step uses an explicit
 * round-to-nearest intrinsic (__fmul_rn, __fadd_rn, __fsub_rn, __fdiv_rn,
 * __fsqrt_rn), which nvcc never contracts into an FMA, so each rounding
 * matches the cpu's -ffp-contract=off build; division and sqrt are IEEE
 * correctly rounded on both sides.
 *
 * p, grad, m, v fp32 (n elements, updated in place; grad may not alias the
 * others); p_out optional: the new p again, in out_dt (bf16 rounded to
 * nearest even); it may alias p only when out_dt is fp32.
 */
#include "ops/cuda/common.cuh"

template <typename O>
__global__ void adamw_kernel(float *p, const float *grad, float *m, float *v, size_t n, float lr,
                             float b1, float b2, float eps, float wd, float bc1, float bc2,
                             float grad_scale, O *p_out)
{
    const float omb1 = __fsub_rn(1.0f, b1);
    const float omb2 = __fsub_rn(1.0f, b2);
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float g = __fmul_rn(grad[i], grad_scale);
        float mi = __fadd_rn(__fmul_rn(b1, m[i]), __fmul_rn(omb1, g));
        float vi = __fadd_rn(__fmul_rn(b2, v[i]), __fmul_rn(omb2, __fmul_rn(g, g)));
        float mhat = __fdiv_rn(mi, bc1);
        float vhat = __fdiv_rn(vi, bc2);
        float den = __fadd_rn(__fsqrt_rn(vhat), eps);
        float pv = p[i];
        float upd = __fadd_rn(__fdiv_rn(mhat, den), __fmul_rn(wd, pv));
        float pi = __fsub_rn(pv, __fmul_rn(lr, upd));
        m[i] = mi;
        v[i] = vi;
        p[i] = pi;
        if (p_out)
            fsdp_cu_st(p_out, i, pi);
    }
}

void fsdp_ops_cuda_adamw(fsdp_op_ctx *ctx, float *p, const float *grad, float *m, float *v,
                         size_t n, float lr, float b1, float b2, float eps, float wd, float bc1,
                         float bc2, float grad_scale, void *p_out, fsdp_dtype out_dt)
{
    if (!n || !fsdp_ops_cuda_ok(ctx))
        return;
    unsigned grid = fsdp_ops_cuda_grid(ctx, n, 256);
    cudaStream_t s = fsdp_ops_cuda_stream(ctx);
    if (p_out && out_dt == FSDP_DTYPE_BF16)
        adamw_kernel<__nv_bfloat16><<<grid, 256, 0, s>>>(p, grad, m, v, n, lr, b1, b2, eps, wd,
                                                         bc1, bc2, grad_scale,
                                                         (__nv_bfloat16 *)p_out);
    else
        adamw_kernel<float><<<grid, 256, 0, s>>>(p, grad, m, v, n, lr, b1, b2, eps, wd, bc1, bc2,
                                                 grad_scale, (float *)p_out);
    fsdp_ops_cuda_launched(ctx, "adamw");
}
