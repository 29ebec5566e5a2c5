/*
 * norm.cu - per-block sums of squares for the gradient norm, on the GPU.
 *
 * out[k] = sum of x[i]^2 over block k (FSDP_NORM_BLOCK elements, the last
 * may be short). Same order as the cpu backend, so the same bits: each x[i]
 * is widened to double and squared in double, the block is summed left to
 * right in double (no tree), and rounded to fp32 once. One warp per block:
 * lanes load 32 consecutive elements (coalesced), then every lane adds the
 * 32 values in index order by shuffling them out one at a time.
 */
#include "ops/cuda/common.cuh"

__global__ void sumsq_blocks_kernel(float *out, const float *x, size_t n, size_t n_blocks)
{
    size_t warp = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) / 32;
    int lane = threadIdx.x % 32;
    if (warp >= n_blocks)
        return;
    size_t begin = warp * FSDP_NORM_BLOCK;
    size_t end = begin + FSDP_NORM_BLOCK < n ? begin + FSDP_NORM_BLOCK : n;
    double s = 0.0;
    for (size_t base = begin; base < end; base += 32) {
        size_t i = base + lane;
        double d = i < end ? (double)x[i] : 0.0;
        double sq = __dmul_rn(d, d);
        int len = end - base < 32 ? (int)(end - base) : 32;
        for (int j = 0; j < len; j++)
            s = __dadd_rn(s, __shfl_sync(0xffffffffu, sq, j));
    }
    if (lane == 0)
        out[warp] = (float)s;
}

void fsdp_ops_cuda_sumsq_blocks(fsdp_op_ctx *ctx, float *out, const float *x, size_t n)
{
    if (!n || !fsdp_ops_cuda_ok(ctx))
        return;
    size_t n_blocks = (n + FSDP_NORM_BLOCK - 1) / FSDP_NORM_BLOCK;
    size_t grid = (n_blocks * 32 + 255) / 256;
    sumsq_blocks_kernel<<<(unsigned)grid, 256, 0, fsdp_ops_cuda_stream(ctx)>>>(out, x, n,
                                                                                n_blocks);
    fsdp_ops_cuda_launched(ctx, "sumsq_blocks");
}
