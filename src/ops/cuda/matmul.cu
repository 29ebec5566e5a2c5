/*
 * matmul.cu - linear layer on the GPU through cuBLAS: out = inp @ w^T + bias,
 * and its backward.
 *
 * Shapes (llm.c): inp (N, C), w (OC, C) row-major, bias (OC,) or NULL, out
 * (N, OC), all in ctx->dt; dout, dinp, dw, dbias fp32. cuBLAS is column-
 * major, so a row-major (R, K) buffer is used as the column-major (K, R)
 * matrix, its transpose.
 *
 * Every GEMM accumulates in fp32 (CUBLAS_COMPUTE_32F, no TF32): fp32 runs
 * stay within rounding of the cpu backend; bf16 operands use tensor cores.
 * The bias is broadcast into out first and the GEMM runs with beta = 1, so
 * acc + bias is formed in fp32 and rounded to ctx->dt once (as on cpu).
 *
 * Backward with bf16 storage: cuBLAS needs A and B of one type, and dout is
 * fp32, so dout is rounded to bf16 in row chunks (at most
 * FSDP_CUDA_LOWP_CHUNK_NUMEL elements of scratch) and the products run in
 * bf16 with fp32 outputs accumulated (beta = 1). dbias sums the fp32 dout
 * exactly, in a fixed order (fsdp_ops_cuda_colsum). All products are
 * deterministic for a given GPU model and cuBLAS version: one handle per
 * rank, bound to one stream, with its own workspace.
 */
#include "ops/cuda/common.cuh"

template <typename T>
__global__ void bias_fill_kernel(T *out, const T *bias, size_t n, int OC)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] = bias[i % OC];
}

void fsdp_ops_cuda_matmul_fwd(fsdp_op_ctx *ctx, void *out, const void *inp, const void *w,
                              const void *bias, int N, int C, int OC)
{
    if (N <= 0 || OC <= 0 || !fsdp_ops_cuda_ok(ctx))
        return;
    float beta = 0.0f;
    if (bias) {
        size_t n = (size_t)N * OC;
        unsigned grid = fsdp_ops_cuda_grid(ctx, n, 256);
        cudaStream_t s = fsdp_ops_cuda_stream(ctx);
        FSDP_CUDA_DISPATCH(ctx->dt, E,
                           bias_fill_kernel<E><<<grid, 256, 0, s>>>((E *)out, (const E *)bias, n,
                                                                    OC));
        if (!fsdp_ops_cuda_launched(ctx, "matmul_fwd"))
            return;
        beta = 1.0f;
    }
    int ldk = C > 0 ? C : 1;
    /* out^T (OC, N) = w (OC, C) @ inp^T (C, N) */
    fsdp_ops_cuda_gemm(ctx, "matmul_fwd", true, false, OC, N, C, 1.0f, w, ldk, 0, inp, ldk, 0,
                       beta, out, ctx->dt, OC, 0, 1, ctx->dt);
}

void fsdp_ops_cuda_matmul_bwd(fsdp_op_ctx *ctx, float *dinp, float *dw, float *dbias,
                              const float *dout, const void *inp, const void *w, int N, int C,
                              int OC)
{
    if (N <= 0 || OC <= 0 || C < 0 || !fsdp_ops_cuda_ok(ctx))
        return;
    const char *op = "matmul_bwd";
    if (C > 0 && (dinp || dw)) {
        if (ctx->dt == FSDP_DTYPE_F32) {
            /* dinp^T (C, N) += w^T (C, OC) @ dout^T (OC, N) */
            if (dinp && !fsdp_ops_cuda_gemm(ctx, op, false, false, C, N, OC, 1.0f, w, C, 0, dout,
                                            OC, 0, 1.0f, dinp, FSDP_DTYPE_F32, C, 0, 1,
                                            FSDP_DTYPE_F32))
                return;
            /* dw^T (C, OC) += inp^T (C, N) @ dout (N, OC) */
            if (dw && !fsdp_ops_cuda_gemm(ctx, op, false, true, C, OC, N, 1.0f, inp, C, 0, dout,
                                          OC, 0, 1.0f, dw, FSDP_DTYPE_F32, C, 0, 1,
                                          FSDP_DTYPE_F32))
                return;
        } else {
            size_t rows = FSDP_CUDA_LOWP_CHUNK_NUMEL / (size_t)OC;
            if (rows < 1)
                rows = 1;
            if (rows > (size_t)N)
                rows = (size_t)N;
            __nv_bfloat16 *lp = (__nv_bfloat16 *)fsdp_ops_cuda_scratch(
                ctx, rows * OC * sizeof(__nv_bfloat16), op);
            if (!lp)
                return;
            const __nv_bfloat16 *x = (const __nv_bfloat16 *)inp;
            for (size_t r0 = 0; r0 < (size_t)N; r0 += rows) {
                int nr = (int)((size_t)N - r0 < rows ? (size_t)N - r0 : rows);
                fsdp_ops_cuda_f32_to_bf16(ctx, op, lp, dout + r0 * OC, (size_t)nr * OC);
                if (dinp && !fsdp_ops_cuda_gemm(ctx, op, false, false, C, nr, OC, 1.0f, w, C, 0,
                                                lp, OC, 0, 1.0f, dinp + r0 * C, FSDP_DTYPE_F32,
                                                C, 0, 1, FSDP_DTYPE_BF16))
                    return;
                if (dw && !fsdp_ops_cuda_gemm(ctx, op, false, true, C, OC, nr, 1.0f, x + r0 * C,
                                              C, 0, lp, OC, 0, 1.0f, dw, FSDP_DTYPE_F32, C, 0, 1,
                                              FSDP_DTYPE_BF16))
                    return;
            }
        }
    }
    if (dbias)
        fsdp_ops_cuda_colsum(ctx, op, dbias, dout, N, OC);
}
