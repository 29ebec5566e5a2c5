/*
 * rmsnorm.cu - RMSNorm over the last dimension on the GPU (HF Llama):
 *   out = inp * rstd * w,  rstd = 1 / sqrt(mean(inp^2) + eps).
 *
 * inp, out (N, C) and w (C,) in ctx->dt; rstd (N,) fp32 (NULL in the
 * forward: not saved). One warp per row; the sum of squares runs in double
 * (as on the cpu, whose lane order differs only in how the double partial
 * sums are grouped), products are explicitly rounded (no FMA contraction).
 *
 * Backward: dinp += (dn - n * mean(dn * n)) * rstd with n = inp * rstd,
 * dn = w * dout, one warp per row. dw += sum_i n_i * dout_i is
 * deterministic: fixed row chunks give per-chunk partials (rows in order
 * per thread, 8 threads per column added in order), then a second pass adds
 * the chunks in order and adds the total to dw once.
 */
#include "ops/cuda/common.cuh"

template <typename T>
__global__ void rmsnorm_fwd_kernel(T *out, float *rstd, const T *inp, const T *w, float eps,
                                   int N, int C)
{
    int row, lane;
    size_t off;
    if (!fsdp_cu_warp_row_of(N, C, &row, &lane, &off))
        return;
    double ss = 0.0;
    for (int c = lane; c < C; c += 32) {
        double x = (double)fsdp_cu_ld(inp, off + c);
        ss = __dadd_rn(ss, __dmul_rn(x, x));
    }
    ss = fsdp_cu_warp_sum_d(ss);
    float rs = (float)(1.0 / sqrt(ss / C + (double)eps));
    for (int c = lane; c < C; c += 32)
        fsdp_cu_st(out, off + c, __fmul_rn(__fmul_rn(fsdp_cu_ld(inp, off + c), rs),
                                           fsdp_cu_ld(w, c)));
    if (lane == 0 && rstd)
        rstd[row] = rs;
}

template <typename T>
__global__ void rmsnorm_bwd_dinp_kernel(float *dinp, const float *dout, const T *inp, const T *w,
                                        const float *rstd, int N, int C)
{
    int row, lane;
    size_t off;
    if (!fsdp_cu_warp_row_of(N, C, &row, &lane, &off))
        return;
    const float rs = rstd[row];
    float a = 0.0f;
    for (int c = lane; c < C; c += 32) {
        float n = __fmul_rn(fsdp_cu_ld(inp, off + c), rs);
        float dn = __fmul_rn(fsdp_cu_ld(w, c), dout[off + c]);
        a = __fadd_rn(a, __fmul_rn(dn, n));
    }
    const float m = fsdp_cu_warp_sum(a) / (float)C;
    for (int c = lane; c < C; c += 32) {
        float n = __fmul_rn(fsdp_cu_ld(inp, off + c), rs);
        float dn = __fmul_rn(fsdp_cu_ld(w, c), dout[off + c]);
        dinp[off + c] += __fmul_rn(__fsub_rn(dn, __fmul_rn(n, m)), rs);
    }
}

/* dw's column sums (common.cuh's scheme): partial kernel, then finish. */
template <typename T>
__global__ void rmsnorm_bwd_partial_kernel(float *pdw, const float *dout, const T *inp,
                                           const float *rstd, int N, int C, int rows_per)
{
    __shared__ float sw[8][33];
    int r0, r1;
    const int c = fsdp_cu_colsum_span(N, rows_per, &r0, &r1);
    float aw = 0.0f;
    if (c < C)
        for (int r = r0 + threadIdx.y; r < r1; r += 8) {
            size_t e = (size_t)r * C + c;
            aw = __fadd_rn(aw, __fmul_rn(__fmul_rn(fsdp_cu_ld(inp, e), rstd[r]), dout[e]));
        }
    fsdp_cu_colsum_lanes(sw, aw, pdw, c, C);
}

__global__ void rmsnorm_bwd_finish_kernel(float *dw, const float *pdw, int n_chunks, int C)
{
    fsdp_cu_colsum_chunks(dw, pdw, n_chunks, C);
}

void fsdp_ops_cuda_rmsnorm_fwd(fsdp_op_ctx *ctx, void *out, float *rstd, const void *inp,
                               const void *w, float eps, int N, int C)
{
    fsdp_ops_cuda_rows(ctx, "rmsnorm_fwd", N, C, [&](unsigned grid, cudaStream_t s) {
        FSDP_CUDA_DISPATCH(ctx->dt, E,
                           rmsnorm_fwd_kernel<E><<<grid, 256, 0, s>>>(
                               (E *)out, rstd, (const E *)inp, (const E *)w, eps, N, C));
    });
}

void fsdp_ops_cuda_rmsnorm_bwd(fsdp_op_ctx *ctx, float *dinp, float *dw, const float *dout,
                               const void *inp, const void *w, const float *rstd, int N, int C)
{
    if (N <= 0 || C <= 0 || !fsdp_ops_cuda_ok(ctx))
        return;
    auto dinp_launch = [&](unsigned grid, cudaStream_t s) {
        FSDP_CUDA_DISPATCH(ctx->dt, E,
                           rmsnorm_bwd_dinp_kernel<E><<<grid, 256, 0, s>>>(
                               dinp, dout, (const E *)inp, (const E *)w, rstd, N, C));
    };
    if (dinp && !fsdp_ops_cuda_rows(ctx, "rmsnorm_bwd", N, C, dinp_launch))
        return;
    cudaStream_t s = fsdp_ops_cuda_stream(ctx);
    if (!dw)
        return;
    int rows_per; /* the chunks depend on the shape only */
    const int n_chunks = fsdp_ops_cuda_row_chunks(N, &rows_per);
    float *pdw = (float *)fsdp_ops_cuda_scratch(ctx, (size_t)n_chunks * C * sizeof(float),
                                                "rmsnorm_bwd");
    if (!pdw)
        return;
    dim3 grid((unsigned)((C + 31) / 32), (unsigned)n_chunks);
    FSDP_CUDA_DISPATCH(ctx->dt, E,
                       rmsnorm_bwd_partial_kernel<E><<<grid, dim3(32, 8), 0, s>>>(
                           pdw, dout, (const E *)inp, rstd, N, C, rows_per));
    if (!fsdp_ops_cuda_launched(ctx, "rmsnorm_bwd"))
        return;
    rmsnorm_bwd_finish_kernel<<<(C + 255) / 256, 256, 0, s>>>(dw, pdw, n_chunks, C);
    fsdp_ops_cuda_launched(ctx, "rmsnorm_bwd");
}
