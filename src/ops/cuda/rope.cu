/*
 * rope.cu - rotary position embeddings on the GPU, in place (HF Llama's
 * "rotate_half": channel i of a head pairs with channel i + hd/2).
 *
 * x holds B*T rows of `stride` elements; the first n_heads heads of hd
 * channels of each row are rotated. One thread per (row, head, pair): the
 * angle is the fp32 product pos * inv_freq[i] (as transformers and the cpu
 * backend compute it), its sine and cosine the precise sincosf (no
 * fast-math), the rotation explicitly rounded (no FMA contraction), so the
 * results match the cpu up to sincosf's last bit. pos (B*T,) int32, or NULL
 * for position t in row t of each sequence; inv_freq (hd/2,) fp32; both in
 * device memory.
 */
#include "ops/cuda/common.cuh"

/* dir +1: forward rotation; -1: its transpose (the backward). */
template <typename T>
__global__ void rope_kernel(T *x, const float *inv_freq, const int *pos, size_t rows, int T_,
                            int n_heads, int half, int stride, int dir)
{
    const size_t n = rows * (size_t)n_heads * half;
    for (size_t k = blockIdx.x * (size_t)blockDim.x + threadIdx.x; k < n;
         k += (size_t)gridDim.x * blockDim.x) {
        const int i = (int)(k % half);
        const size_t rh = k / half;
        const int h = (int)(rh % n_heads);
        const size_t r = rh / n_heads;
        const int p = pos ? pos[r] : (int)(r % T_);
        float s, c;
        sincosf(__fmul_rn((float)p, inv_freq[i]), &s, &c);
        const size_t e1 = r * stride + (size_t)h * 2 * half + i, e2 = e1 + half;
        const float a = fsdp_cu_ld(x, e1), b = fsdp_cu_ld(x, e2);
        if (dir > 0) {
            fsdp_cu_st(x, e1, __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s)));
            fsdp_cu_st(x, e2, __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s)));
        } else {
            fsdp_cu_st(x, e1, __fadd_rn(__fmul_rn(a, c), __fmul_rn(b, s)));
            fsdp_cu_st(x, e2, __fsub_rn(__fmul_rn(b, c), __fmul_rn(a, s)));
        }
    }
}

static bool rope_args_ok(fsdp_op_ctx *ctx, const char *op, int hd, int n_heads, int stride)
{
    if (hd > 0 && hd % 2 == 0 && stride >= n_heads * hd)
        return true;
    fsdp_ops_cuda_fail(ctx, FSDP_STATUS_INVALID_ARG, op,
                       "head size %d must be even and %d heads must fit a row of %d", hd,
                       n_heads, stride);
    return false;
}

/* Checks the shape, then rotates x (B*T rows of E) by dir * the angle: +1
 * the forward, -1 the backward. */
template <typename E>
static void rope_launch(fsdp_op_ctx *ctx, const char *op, E *x, const float *inv_freq,
                        const int *pos, int B, int T, int n_heads, int hd, int stride, int dir)
{
    if (B <= 0 || T <= 0 || n_heads <= 0 || !fsdp_ops_cuda_ok(ctx) ||
        !rope_args_ok(ctx, op, hd, n_heads, stride))
        return;
    const size_t rows = (size_t)B * T, n = rows * n_heads * (hd / 2);
    unsigned grid = fsdp_ops_cuda_grid(ctx, n, 256);
    rope_kernel<E><<<grid, 256, 0, fsdp_ops_cuda_stream(ctx)>>>(x, inv_freq, pos, rows, T,
                                                                n_heads, hd / 2, stride, dir);
    fsdp_ops_cuda_launched(ctx, op);
}

void fsdp_ops_cuda_rope_fwd(fsdp_op_ctx *ctx, void *x, const float *inv_freq, const int *pos,
                            int B, int T, int n_heads, int hd, int stride)
{
    FSDP_CUDA_DISPATCH(ctx->dt, E,
                       rope_launch<E>(ctx, "rope_fwd", (E *)x, inv_freq, pos, B, T, n_heads, hd,
                                      stride, +1));
}

void fsdp_ops_cuda_rope_bwd(fsdp_op_ctx *ctx, float *dx, const float *inv_freq, const int *pos,
                            int B, int T, int n_heads, int hd, int stride)
{
    rope_launch<float>(ctx, "rope_bwd", dx, inv_freq, pos, B, T, n_heads, hd, stride, -1);
}
