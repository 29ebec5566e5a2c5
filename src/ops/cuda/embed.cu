/*
 * embed.cu - token + position embedding on the GPU.
 *
 * out (B, T, C) = wte[tokens[b, t]] + wpe[p] in fp32, rounded once to
 * ctx->dt, p = pos[b, t] (a token's position in its packed document) or t
 * when pos is NULL; tokens are int32 in [0, Vp) (the data loaders validate
 * them). With positions, dwpe's rows repeat as dwte's do and take the same
 * kernel, with the positions for tokens.
 *
 * The backward is deterministic without atomics: every element of dwte and
 * dwpe is owned by one thread, which adds the contributions in position
 * order (b, t) — the same order as the cpu backend, so the results match it
 * bit for bit. For dwte, block (x, y) owns channels [128x, 128x+128) of the
 * token ids congruent to y mod gridDim.y; it walks all B*T positions (tokens
 * staged in shared memory) and adds only those rows, so no sort is needed
 * and the order never depends on timing.
 */
#include "ops/cuda/common.cuh"

#define EMBED_TILE 1024 /* tokens staged in shared memory per pass */

template <typename T>
__global__ void embed_fwd_kernel(T *out, const int *tokens, const int *pos, const T *wte,
                                 const T *wpe, int Tn, int C, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t bt = i / C;
        int c = (int)(i - bt * C);
        int t = pos ? pos[bt] : (int)(bt % Tn);
        size_t tok = (size_t)tokens[bt];
        fsdp_cu_st(out, i, fsdp_cu_ld(wte, tok * C + c) + fsdp_cu_ld(wpe, (size_t)t * C + c));
    }
}

/* dwpe[t, c] += dout[b, t, c] for b = 0..B-1 in order. */
__global__ void embed_bwd_wpe_kernel(float *dwpe, const float *dout, int B, int Tn, int C)
{
    size_t n = (size_t)Tn * C;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float acc = dwpe[i];
        for (int b = 0; b < B; b++)
            acc += dout[(size_t)b * n + i];
        dwpe[i] = acc;
    }
}

/* Block (x, y), 128 threads: channel c = 128x + tid of every token id
 * tok with tok % gridDim.y == y, positions in order. */
__global__ void embed_bwd_wte_kernel(float *dwte, const float *dout, const int *tokens, int N,
                                     int C)
{
    __shared__ int tile[EMBED_TILE];
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    unsigned R = gridDim.y, mine = blockIdx.y;
    for (int base = 0; base < N; base += EMBED_TILE) {
        int len = min(EMBED_TILE, N - base);
        __syncthreads();
        for (int j = threadIdx.x; j < len; j += blockDim.x)
            tile[j] = tokens[base + j];
        __syncthreads();
        if (c >= C)
            continue;
        for (int j = 0; j < len; j++) {
            int tok = tile[j];
            if ((unsigned)tok % R != mine)
                continue;
            size_t e = (size_t)tok * C + c;
            dwte[e] += dout[(size_t)(base + j) * C + c];
        }
    }
}

void fsdp_ops_cuda_embed_fwd(fsdp_op_ctx *ctx, void *out, const int *tokens, const int *pos,
                             const void *wte, const void *wpe, int B, int T, int C)
{
    size_t n = (size_t)B * T * C;
    if (!n || !fsdp_ops_cuda_ok(ctx))
        return;
    unsigned grid = fsdp_ops_cuda_grid(ctx, n, 256);
    cudaStream_t s = fsdp_ops_cuda_stream(ctx);
    FSDP_CUDA_DISPATCH(ctx->dt, E,
                       embed_fwd_kernel<E><<<grid, 256, 0, s>>>((E *)out, tokens, pos,
                                                                (const E *)wte, (const E *)wpe,
                                                                T, C, n));
    fsdp_ops_cuda_launched(ctx, "embed_fwd");
}

/* dtab[ids[i]] += dout[i] for the N rows, in row order (embed_bwd_wte_kernel). */
static bool rows_bwd(fsdp_op_ctx *ctx, float *dtab, const float *dout, const int *ids, int N,
                     int C)
{
    unsigned gx = (unsigned)((C + 127) / 128);
    /* Enough blocks to fill the GPU; any R gives the same result. */
    unsigned R = (unsigned)(4 * fsdp_ops_cuda_st(ctx)->n_sms) / gx + 1;
    if (R > 1024)
        R = 1024;
    embed_bwd_wte_kernel<<<dim3(gx, R), 128, 0, fsdp_ops_cuda_stream(ctx)>>>(dtab, dout, ids, N,
                                                                             C);
    return fsdp_ops_cuda_launched(ctx, "embed_bwd");
}

void fsdp_ops_cuda_embed_bwd(fsdp_op_ctx *ctx, float *dwte, float *dwpe, const float *dout,
                             const int *tokens, const int *pos, int B, int T, int C)
{
    int N = B * T;
    if (N <= 0 || C <= 0 || !fsdp_ops_cuda_ok(ctx))
        return;
    cudaStream_t s = fsdp_ops_cuda_stream(ctx);
    if (dwpe && pos) {
        if (!rows_bwd(ctx, dwpe, dout, pos, N, C))
            return;
    } else if (dwpe) {
        embed_bwd_wpe_kernel<<<fsdp_ops_cuda_grid(ctx, (size_t)T * C, 256), 256, 0, s>>>(
            dwpe, dout, B, T, C);
        if (!fsdp_ops_cuda_launched(ctx, "embed_bwd"))
            return;
    }
    if (dwte)
        rows_bwd(ctx, dwte, dout, tokens, N, C);
}
