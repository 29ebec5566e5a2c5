/*
 * layernorm.cu - LayerNorm over the last dimension on the GPU (eps 1e-5).
 *
 * inp, out (N, C) in ctx->dt; w, b (C,) in ctx->dt; mean, rstd (N,) fp32
 * (either may be NULL in the forward: not saved). One warp per row. Row
 * statistics are summed in double (as the cpu backend does) and the
 * normalised output is computed with explicit single roundings, so results
 * match the cpu up to the order of the double sums.
 *
 * Backward: dinp += (dn - mean(dn) - n * mean(dn * n)) * rstd, dn = w * dout,
 * one warp per row. dw += sum_i n_i * dout_i and db += sum_i dout_i are
 * deterministic: fixed row chunks give per-chunk partials (rows in order
 * per thread, 8 threads per column added in order), then a second pass adds
 * the chunks in order and adds the total to dw/db once.
 */
#include "ops/cuda/common.cuh"

template <typename T>
__global__ void layernorm_fwd_kernel(T *out, float *mean, float *rstd, const T *inp, const T *w,
                                     const T *b, int N, int C)
{
    int row, lane;
    size_t off;
    if (!fsdp_cu_warp_row_of(N, C, &row, &lane, &off))
        return;
    double s = 0.0;
    for (int c = lane; c < C; c += 32)
        s += (double)fsdp_cu_ld(inp, off + c);
    double m = fsdp_cu_warp_sum_d(s) / C;
    double ss = 0.0;
    for (int c = lane; c < C; c += 32) {
        double d = (double)fsdp_cu_ld(inp, off + c) - m;
        ss = __dadd_rn(ss, __dmul_rn(d, d));
    }
    ss = fsdp_cu_warp_sum_d(ss);
    float mf = (float)m;
    float rs = (float)(1.0 / sqrt(ss / C + FSDP_CUDA_LN_EPS));
    for (int c = lane; c < C; c += 32) {
        float n = __fmul_rn(__fsub_rn(fsdp_cu_ld(inp, off + c), mf), rs);
        fsdp_cu_st(out, off + c, __fadd_rn(__fmul_rn(n, fsdp_cu_ld(w, c)), fsdp_cu_ld(b, c)));
    }
    if (lane == 0) {
        if (mean)
            mean[row] = mf;
        if (rstd)
            rstd[row] = rs;
    }
}

template <typename T>
__global__ void layernorm_bwd_dinp_kernel(float *dinp, const float *dout, const T *inp,
                                          const T *w, const float *mean, const float *rstd, int N,
                                          int C)
{
    int row, lane;
    size_t off;
    if (!fsdp_cu_warp_row_of(N, C, &row, &lane, &off))
        return;
    const float m = mean[row], rs = rstd[row];
    float a = 0.0f, an = 0.0f;
    for (int c = lane; c < C; c += 32) {
        float n = (fsdp_cu_ld(inp, off + c) - m) * rs;
        float dn = fsdp_cu_ld(w, c) * dout[off + c];
        a += dn;
        an += dn * n;
    }
    float dnorm_mean = fsdp_cu_warp_sum(a) / (float)C;
    float dnorm_norm_mean = fsdp_cu_warp_sum(an) / (float)C;
    for (int c = lane; c < C; c += 32) {
        float n = (fsdp_cu_ld(inp, off + c) - m) * rs;
        float dn = fsdp_cu_ld(w, c) * dout[off + c];
        dinp[off + c] += (dn - dnorm_mean - n * dnorm_norm_mean) * rs;
    }
}

/* dw's and db's column sums (common.cuh's scheme): partial kernel, then
 * finish (dw or db NULL: not summed). */
template <typename T>
__global__ void layernorm_bwd_partial_kernel(float *pdw, float *pdb, const float *dout,
                                             const T *inp, const float *mean, const float *rstd,
                                             int N, int C, int rows_per)
{
    __shared__ float sw[8][33], sb[8][33];
    int r0, r1;
    const int c = fsdp_cu_colsum_span(N, rows_per, &r0, &r1);
    float aw = 0.0f, ab = 0.0f;
    if (c < C) {
        for (int r = r0 + threadIdx.y; r < r1; r += 8) {
            size_t e = (size_t)r * C + c;
            float n = (fsdp_cu_ld(inp, e) - mean[r]) * rstd[r];
            aw += n * dout[e];
            ab += dout[e];
        }
    }
    fsdp_cu_colsum_lanes(sw, aw, pdw, c, C);
    fsdp_cu_colsum_lanes(sb, ab, pdb, c, C);
}

__global__ void layernorm_bwd_finish_kernel(float *dw, float *db, const float *pdw,
                                            const float *pdb, int n_chunks, int C)
{
    if (dw)
        fsdp_cu_colsum_chunks(dw, pdw, n_chunks, C);
    if (db)
        fsdp_cu_colsum_chunks(db, pdb, n_chunks, C);
}

void fsdp_ops_cuda_layernorm_fwd(fsdp_op_ctx *ctx, void *out, float *mean, float *rstd,
                                 const void *inp, const void *w, const void *b, int N, int C)
{
    fsdp_ops_cuda_rows(ctx, "layernorm_fwd", N, C, [&](unsigned grid, cudaStream_t s) {
        FSDP_CUDA_DISPATCH(ctx->dt, E,
                           layernorm_fwd_kernel<E><<<grid, 256, 0, s>>>(
                               (E *)out, mean, rstd, (const E *)inp, (const E *)w, (const E *)b,
                               N, C));
    });
}

void fsdp_ops_cuda_layernorm_bwd(fsdp_op_ctx *ctx, float *dinp, float *dw, float *db,
                                 const float *dout, const void *inp, const void *w,
                                 const float *mean, const float *rstd, int N, int C)
{
    if (N <= 0 || C <= 0 || !fsdp_ops_cuda_ok(ctx))
        return;
    auto dinp_launch = [&](unsigned grid, cudaStream_t s) {
        FSDP_CUDA_DISPATCH(ctx->dt, E,
                           layernorm_bwd_dinp_kernel<E><<<grid, 256, 0, s>>>(
                               dinp, dout, (const E *)inp, (const E *)w, mean, rstd, N, C));
    };
    if (dinp && !fsdp_ops_cuda_rows(ctx, "layernorm_bwd", N, C, dinp_launch))
        return;
    cudaStream_t s = fsdp_ops_cuda_stream(ctx);
    if (!dw && !db)
        return;
    int rows_per; /* the chunks depend on the shape only */
    const int n_chunks = fsdp_ops_cuda_row_chunks(N, &rows_per);
    float *pdw = (float *)fsdp_ops_cuda_scratch(ctx, 2 * (size_t)n_chunks * C * sizeof(float),
                                                "layernorm_bwd");
    if (!pdw)
        return;
    float *pdb = pdw + (size_t)n_chunks * C;
    dim3 grid((unsigned)((C + 31) / 32), (unsigned)n_chunks);
    FSDP_CUDA_DISPATCH(ctx->dt, E,
                       layernorm_bwd_partial_kernel<E><<<grid, dim3(32, 8), 0, s>>>(
                           pdw, pdb, dout, (const E *)inp, mean, rstd, N, C, rows_per));
    if (!fsdp_ops_cuda_launched(ctx, "layernorm_bwd"))
        return;
    layernorm_bwd_finish_kernel<<<(C + 255) / 256, 256, 0, s>>>(dw, db, pdw, pdb, n_chunks, C);
    fsdp_ops_cuda_launched(ctx, "layernorm_bwd");
}
