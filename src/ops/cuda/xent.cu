/*
 * xent.cu - fused softmax + cross-entropy on the GPU, with its gradient.
 *
 * One block per row of logits (N, Vp) in ctx->dt, over the first V columns:
 *   losses[i]  = log(sum_j exp(l_j - max)) - (l_target - max)
 *   dlogits[i] = (exp(l_j - max) / sum - [j == target]) * dloss,  j < V
 *   dlogits[i][V..Vp) = 0.
 * A target < 0 masks its row: loss 0 and a zero gradient row.
 * Written (=), not accumulated. No probability buffer: the row is read
 * once for the max, once for the exp-sum (taken in double, like the cpu),
 * and once more to write the gradient. dlogits may alias logits (fp32):
 * every read of the row, including the target's logit, is finished before
 * the block barrier that precedes the first write, and in the write pass
 * each thread reads element j just before it overwrites it. Reductions
 * combine threads in a fixed order, so results are deterministic.
 */
#include <math.h>

#include "ops/cuda/common.cuh"

#define XENT_THREADS 512

/* The warp reductions as the block reduction takes them. */
struct warp_max_f {
    __device__ float operator()(float v) const { return fsdp_cu_warp_max(v); }
};
struct warp_sum_d {
    __device__ double operator()(double v) const { return fsdp_cu_warp_sum_d(v); }
};

/* v reduced over the block (a multiple of 32 threads, at most 1024): each
 * warp reduces its own (Warp), then warp 0 reduces the warps' results in
 * warp order (missing lanes: id). Every thread gets the result; sh holds
 * 33 values. */
template <typename V, typename Warp>
__device__ V block_reduce(V v, V id, V *sh)
{
    int lane = threadIdx.x % 32, wid = threadIdx.x / 32, nw = blockDim.x / 32;
    v = Warp()(v);
    if (lane == 0)
        sh[wid] = v;
    __syncthreads();
    if (wid == 0) {
        V t = lane < nw ? sh[lane] : id;
        t = Warp()(t);
        if (lane == 0)
            sh[32] = t;
    }
    __syncthreads();
    return sh[32];
}

/* logits and dlogits may alias: no __restrict__. */
template <typename T>
__global__ void xent_kernel(float *losses, float *dlogits, const T *logits, const int *targets,
                            int V, int Vp, float dloss)
{
    __shared__ float shf[33];
    __shared__ double shd[33];
    size_t off = (size_t)blockIdx.x * Vp;
    const T *x = logits + off;
    int tgt = targets[blockIdx.x];
    if (tgt < 0) { /* masked, the whole block alike: no loss, no gradient, no barrier */
        if (losses && threadIdx.x == 0)
            losses[blockIdx.x] = 0.0f;
        if (dlogits)
            for (int j = threadIdx.x; j < Vp; j += blockDim.x)
                dlogits[off + j] = 0.0f;
        return;
    }

    float mx = -INFINITY;
    for (int j = threadIdx.x; j < V; j += blockDim.x)
        mx = fmaxf(mx, fsdp_cu_ld(x, j));
    mx = block_reduce<float, warp_max_f>(mx, -INFINITY, shf);
    /* Read before the barrier inside block_reduce: nothing is written yet. */
    float lt = fsdp_cu_ld(x, tgt) - mx;
    double s = 0.0;
    for (int j = threadIdx.x; j < V; j += blockDim.x)
        s += (double)expf(fsdp_cu_ld(x, j) - mx);
    double sum = block_reduce<double, warp_sum_d>(s, 0.0, shd);
    if (losses && threadIdx.x == 0)
        losses[blockIdx.x] = (float)(log(sum) - (double)lt);
    if (!dlogits)
        return;
    float inv = (float)(1.0 / sum);
    float *d = dlogits + off;
    for (int j = threadIdx.x; j < Vp; j += blockDim.x) {
        float g = 0.0f;
        if (j < V) {
            float p = expf(fsdp_cu_ld(x, j) - mx) * inv;
            g = (p - (j == tgt ? 1.0f : 0.0f)) * dloss;
        }
        d[j] = g;
    }
}

void fsdp_ops_cuda_xent_fwd_bwd(fsdp_op_ctx *ctx, float *losses, float *dlogits,
                                const void *logits, const int *targets, int N, int V, int Vp,
                                float dloss)
{
    if (N <= 0 || V <= 0 || !fsdp_ops_cuda_ok(ctx))
        return;
    if (V > Vp) {
        fsdp_ops_cuda_fail(ctx, FSDP_STATUS_INVALID_ARG, "xent_fwd_bwd",
                           "vocabulary %d is larger than the padded vocabulary %d", V, Vp);
        return;
    }
    unsigned threads = Vp >= 4096 ? XENT_THREADS : 128;
    cudaStream_t s = fsdp_ops_cuda_stream(ctx);
    FSDP_CUDA_DISPATCH(ctx->dt, E,
                       xent_kernel<E><<<(unsigned)N, threads, 0, s>>>(
                           losses, dlogits, (const E *)logits, targets, V, Vp, dloss));
    fsdp_ops_cuda_launched(ctx, "xent_fwd_bwd");
}
