/*
 * attention.cu - causal multi-head self-attention on the GPU: batched
 * cuBLAS GEMMs over the heads plus causal softmax kernels.
 *
 * qkv (B, T, 3C) holds [q | k | v] per position; head h uses channels
 * h*hs .. h*hs+hs-1 of each part (hs = C / NH). For each batch row b, one
 * strided-batched GEMM over the NH heads reads q, k, v in place (leading
 * dimension 3C, head stride hs), so nothing is permuted or copied. Scores
 * are scaled by 1/sqrt(hs) inside the GEMM (alpha), accumulated in fp32
 * into scratch (NH, T, T); the causal softmax writes att (B, NH, T, T) in
 * ctx->dt with zeros above the diagonal; out = att @ v.
 *
 * Backward per b: datt = dout @ v^T; dv += att^T @ dout; softmax backward
 * dpre = att * (datt - sum(att * datt)) (zeros above the diagonal);
 * dq += scale dpre @ k; dk += scale dpre^T @ q. With bf16 storage the fp32
 * operands (dout, dpre) are rounded to bf16 scratch so cuBLAS sees one type;
 * with fp32 everything stays fp32 and dpre overwrites datt in place.
 * Warp reductions have a fixed order: results are deterministic.
 */
#include <math.h>

#include "ops/cuda/common.cuh"

/* One warp per row r = h*T + t of the (NH, T, T) block. */
template <typename E>
__global__ void causal_softmax_kernel(E *att, const float *pre, int rows, int Tn)
{
    int r = (int)((blockIdx.x * (size_t)blockDim.x + threadIdx.x) / 32);
    int lane = threadIdx.x % 32;
    if (r >= rows)
        return;
    int t = r % Tn;
    const float *src = pre + (size_t)r * Tn;
    float mx = -INFINITY;
    for (int j = lane; j <= t; j += 32)
        mx = fmaxf(mx, src[j]);
    mx = fsdp_cu_warp_max(mx);
    float s = 0.0f;
    for (int j = lane; j <= t; j += 32)
        s += expf(src[j] - mx);
    float inv = 1.0f / fsdp_cu_warp_sum(s);
    E *dst = att + (size_t)r * Tn;
    for (int j = lane; j < Tn; j += 32)
        fsdp_cu_st(dst, j, j <= t ? expf(src[j] - mx) * inv : 0.0f);
}

/* dpre = att * (datt - sum_j att_j datt_j), zeros above the diagonal.
 * dst may alias datt (fp32 case): each element is read, then written, by
 * one lane, after the row sum is complete. */
template <typename E, typename D>
__global__ void softmax_bwd_kernel(D *dst, const float *datt, const E *att, int rows, int Tn)
{
    int r = (int)((blockIdx.x * (size_t)blockDim.x + threadIdx.x) / 32);
    int lane = threadIdx.x % 32;
    if (r >= rows)
        return;
    int t = r % Tn;
    size_t off = (size_t)r * Tn;
    float s = 0.0f;
    for (int j = lane; j <= t; j += 32)
        s += fsdp_cu_ld(att, off + j) * datt[off + j];
    s = fsdp_cu_warp_sum(s);
    for (int j = lane; j < Tn; j += 32) {
        float v = 0.0f;
        if (j <= t)
            v = fsdp_cu_ld(att, off + j) * (datt[off + j] - s);
        fsdp_cu_st(dst, off + j, v);
    }
}

void fsdp_ops_cuda_attention_fwd(fsdp_op_ctx *ctx, void *out, void *att, const void *qkv, int B,
                                 int T, int C, int NH)
{
    const char *op = "attention_fwd";
    if (B <= 0 || T <= 0 || C <= 0 || !fsdp_ops_cuda_ok(ctx))
        return;
    if (NH <= 0 || C % NH) {
        fsdp_ops_cuda_fail(ctx, FSDP_STATUS_INVALID_ARG, op,
                           "%d channels do not split into %d heads", C, NH);
        return;
    }
    const fsdp_dtype dt = ctx->dt;
    const size_t es = fsdp_dtype_size(dt);
    const int hs = C / NH, C3 = 3 * C;
    const long long TT = (long long)T * T;
    const float scale = 1.0f / sqrtf((float)hs);
    float *pre = (float *)fsdp_ops_cuda_scratch(ctx, (size_t)NH * TT * sizeof(float), op);
    if (!pre)
        return;
    cudaStream_t s = fsdp_ops_cuda_stream(ctx);
    const int rows = NH * T;
    const unsigned sm_grid = (unsigned)(((size_t)rows * 32 + 255) / 256);
    for (int b = 0; b < B; b++) {
        const char *x = (const char *)qkv + (size_t)b * T * C3 * es;
        char *a = (char *)att + (size_t)b * NH * TT * es;
        char *y = (char *)out + (size_t)b * T * C * es;
        /* pre^T (T2, T) per head = k (T2, hs) @ q^T (hs, T), scaled */
        if (!fsdp_ops_cuda_gemm(ctx, op, true, false, T, T, hs, scale, x + C * es, C3, hs, x, C3,
                                hs, 0.0f, pre, FSDP_DTYPE_F32, T, TT, NH, dt))
            return;
        FSDP_CUDA_DISPATCH(dt, E,
                           causal_softmax_kernel<E><<<sm_grid, 256, 0, s>>>((E *)a, pre, rows, T));
        if (!fsdp_ops_cuda_launched(ctx, op))
            return;
        /* out^T (hs, T) per head = v^T (hs, T2) @ att^T (T2, T) */
        if (!fsdp_ops_cuda_gemm(ctx, op, false, false, hs, T, T, 1.0f, x + 2 * C * es, C3, hs, a,
                                T, TT, 0.0f, y, dt, C, hs, NH, dt))
            return;
    }
}

void fsdp_ops_cuda_attention_bwd(fsdp_op_ctx *ctx, float *dqkv, float *datt, const float *dout,
                                 const void *qkv, const void *att, int B, int T, int C, int NH)
{
    const char *op = "attention_bwd";
    if (B <= 0 || T <= 0 || C <= 0 || !fsdp_ops_cuda_ok(ctx))
        return;
    if (NH <= 0 || C % NH) {
        fsdp_ops_cuda_fail(ctx, FSDP_STATUS_INVALID_ARG, op,
                           "%d channels do not split into %d heads", C, NH);
        return;
    }
    const fsdp_dtype dt = ctx->dt;
    const bool lowp = dt == FSDP_DTYPE_BF16;
    const size_t es = fsdp_dtype_size(dt);
    const int hs = C / NH, C3 = 3 * C;
    const long long TT = (long long)T * T;
    const float scale = 1.0f / sqrtf((float)hs);
    __nv_bfloat16 *dout_lp = NULL, *dpre_lp = NULL;
    if (lowp) {
        /* dout (T, C) then dpre (NH, T, T), the second 256-byte aligned */
        size_t n_dout = ((size_t)T * C + 127) / 128 * 128, n_dpre = (size_t)NH * TT;
        dout_lp = (__nv_bfloat16 *)fsdp_ops_cuda_scratch(
            ctx, (n_dout + n_dpre) * sizeof(__nv_bfloat16), op);
        if (!dout_lp)
            return;
        dpre_lp = dout_lp + n_dout;
    }
    cudaStream_t s = fsdp_ops_cuda_stream(ctx);
    const int rows = NH * T;
    const unsigned sm_grid = (unsigned)(((size_t)rows * 32 + 255) / 256);
    for (int b = 0; b < B; b++) {
        const char *x = (const char *)qkv + (size_t)b * T * C3 * es;
        const char *a = (const char *)att + (size_t)b * NH * TT * es;
        const float *dy = dout + (size_t)b * T * C;
        float *dx = dqkv + (size_t)b * T * C3;
        float *da = datt + (size_t)b * NH * TT;
        const void *dyA = dy; /* dout as a GEMM operand of type dt */
        if (lowp) {
            fsdp_ops_cuda_f32_to_bf16(ctx, op, dout_lp, dy, (size_t)T * C);
            dyA = dout_lp;
        }
        /* datt^T (T2, T) per head = v (T2, hs) @ dout^T (hs, T) */
        if (!fsdp_ops_cuda_gemm(ctx, op, true, false, T, T, hs, 1.0f, x + 2 * C * es, C3, hs, dyA,
                                C, hs, 0.0f, da, FSDP_DTYPE_F32, T, TT, NH, dt))
            return;
        /* dv^T (hs, T2) += dout^T (hs, T) @ att (T, T2) */
        if (!fsdp_ops_cuda_gemm(ctx, op, false, true, hs, T, T, 1.0f, dyA, C, hs, a, T, TT, 1.0f,
                                dx + 2 * C, FSDP_DTYPE_F32, C3, hs, NH, dt))
            return;
        const void *dp;
        if (lowp) {
            softmax_bwd_kernel<__nv_bfloat16, __nv_bfloat16><<<sm_grid, 256, 0, s>>>(
                dpre_lp, da, (const __nv_bfloat16 *)a, rows, T);
            dp = dpre_lp;
        } else {
            softmax_bwd_kernel<float, float><<<sm_grid, 256, 0, s>>>(da, da, (const float *)a,
                                                                     rows, T);
            dp = da;
        }
        if (!fsdp_ops_cuda_launched(ctx, op))
            return;
        /* dq^T (hs, T) += scale k^T (hs, T2) @ dpre^T (T2, T) */
        if (!fsdp_ops_cuda_gemm(ctx, op, false, false, hs, T, T, scale, x + C * es, C3, hs, dp, T,
                                TT, 1.0f, dx, FSDP_DTYPE_F32, C3, hs, NH, dt))
            return;
        /* dk^T (hs, T2) += scale q^T (hs, T) @ dpre (T, T2) */
        if (!fsdp_ops_cuda_gemm(ctx, op, false, true, hs, T, T, scale, x, C3, hs, dp, T, TT, 1.0f,
                                dx + C, FSDP_DTYPE_F32, C3, hs, NH, dt))
            return;
    }
}
