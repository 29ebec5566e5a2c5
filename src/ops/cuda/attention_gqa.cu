/*
 * attention_gqa.cu - causal grouped-query self-attention on the GPU:
 * strided-batched cuBLAS GEMMs plus masked softmax kernels.
 *
 * qkv (B, T, QS), QS = (NH + 2 NKV) hd, holds [q | k | v] per position:
 * query head h at channels h hd, its kv head g = h / rep (rep = NH / NKV)
 * at (NH + g) hd (k) and (NH + NKV + g) hd (v). For batch row b and each
 * r < rep, one GEMM batched over the NKV groups handles query heads
 * h = g rep + r: q at stride rep hd, k and v at stride hd, scores at stride
 * rep T T, so every operand is read in place (no head is copied, no kv head
 * replicated). In the backward, a kv head's dk and dv accumulate the r = 0,
 * 1, ... contributions in turn (one GEMM per r, each writing distinct
 * groups): deterministic, in the cpu backend's head order. With NKV == NH
 * there is one GEMM per product.
 *
 * GPT-2's attention (attention_fwd/bwd: qkv (B, T, 3C)) is this with
 * NKV = NH and hd = C / NH, as in the cpu backend.
 *
 * Scores are scaled by 1/sqrt(hd) inside the GEMM (alpha), accumulated in
 * fp32 into scratch (NH, T, T); the softmax over row t's window
 * [t - pos[t], t] (pos NULL: [0, t]) writes att (B, NH, T, T) in ctx->dt,
 * zeros elsewhere; out = att @ v. Backward per b: datt = dout @ v^T;
 * dv += att^T @ dout; dpre = att * (datt - sum(att * datt)) (zero where att
 * is); dq += scale dpre @ k; dk += scale dpre^T @ q. With bf16 storage the
 * fp32 operands (dout, dpre) are rounded to bf16 scratch so cuBLAS sees one
 * type; with fp32 dpre overwrites datt in place.
 */
#include <math.h>

#include "ops/cuda/common.cuh"

/* One warp per row r = h*T + t of the (NH, T, T) block of one sequence. */
template <typename E>
__global__ void window_softmax_kernel(E *att, const float *pre, const int *pos, int rows, int Tn)
{
    int r, lane;
    size_t off;
    if (!fsdp_cu_warp_row_of(rows, Tn, &r, &lane, &off))
        return;
    const int t = r % Tn;
    int lo = 0;
    if (pos) {
        const int p = pos[t];
        lo = p < 0 ? t : (p > t ? 0 : t - p);
    }
    const float *src = pre + off;
    float mx = -INFINITY;
    for (int j = lo + lane; j <= t; j += 32)
        mx = fmaxf(mx, src[j]);
    mx = fsdp_cu_warp_max(mx);
    float s = 0.0f;
    for (int j = lo + lane; j <= t; j += 32)
        s += expf(src[j] - mx);
    const float inv = 1.0f / fsdp_cu_warp_sum(s);
    E *dst = att + off;
    for (int j = lane; j < Tn; j += 32)
        fsdp_cu_st(dst, j, j >= lo && j <= t ? __fmul_rn(expf(src[j] - mx), inv) : 0.0f);
}

/* dpre = att * (datt - sum_j att_j datt_j) on j <= t, zeros after t. dst
 * may alias datt (fp32): each element is read, then written, by one lane,
 * after the row sum is complete. */
template <typename E, typename D>
__global__ void gqa_softmax_bwd_kernel(D *dst, const float *datt, const E *att, int rows, int Tn)
{
    int r, lane;
    size_t off;
    if (!fsdp_cu_warp_row_of(rows, Tn, &r, &lane, &off))
        return;
    const int t = r % Tn;
    float s = 0.0f;
    for (int j = lane; j <= t; j += 32)
        s += fsdp_cu_ld(att, off + j) * datt[off + j];
    s = fsdp_cu_warp_sum(s);
    for (int j = lane; j < Tn; j += 32) {
        float v = 0.0f;
        if (j <= t)
            v = __fmul_rn(fsdp_cu_ld(att, off + j), __fsub_rn(datt[off + j], s));
        fsdp_cu_st(dst, off + j, v);
    }
}

static bool gqa_args_ok(fsdp_op_ctx *ctx, const char *op, int NH, int NKV, int hd)
{
    if (NH > 0 && NKV > 0 && NH % NKV == 0 && hd > 0)
        return true;
    fsdp_ops_cuda_fail(ctx, FSDP_STATUS_INVALID_ARG, op,
                       "%d query heads do not split into groups of %d kv heads (head size %d)",
                       NH, NKV, hd);
    return false;
}

/* The forward, for op `op` (messages name it). */
static void gqa_fwd(fsdp_op_ctx *ctx, const char *op, void *out, void *att, const void *qkv,
                    const int *pos, int B, int T, int NH, int NKV, int hd)
{
    if (B <= 0 || T <= 0 || !fsdp_ops_cuda_ok(ctx) || !gqa_args_ok(ctx, op, NH, NKV, hd))
        return;
    const fsdp_dtype dt = ctx->dt;
    const size_t es = fsdp_dtype_size(dt);
    const int rep = NH / NKV, QS = (NH + 2 * NKV) * hd, OS = NH * hd;
    const long long TT = (long long)T * T;
    const float scale = 1.0f / sqrtf((float)hd);
    float *pre = (float *)fsdp_ops_cuda_scratch(ctx, (size_t)NH * TT * sizeof(float), op);
    if (!pre)
        return;
    cudaStream_t s = fsdp_ops_cuda_stream(ctx);
    const int rows = NH * T;
    const unsigned sm_grid = fsdp_ops_cuda_warp_grid((size_t)rows);
    for (int b = 0; b < B; b++) {
        const char *x = (const char *)qkv + (size_t)b * T * QS * es;
        const char *k = x + (size_t)NH * hd * es, *v = x + (size_t)(NH + NKV) * hd * es;
        char *a = (char *)att + (size_t)b * NH * TT * es;
        char *y = (char *)out + (size_t)b * T * OS * es;
        /* pre^T (T2, T) of head h = g rep + r: k_g (T2, hd) @ q_h^T (hd, T), scaled */
        for (int r = 0; r < rep; r++)
            if (!fsdp_ops_cuda_gemm(ctx, op, true, false, T, T, hd, scale, k, QS, hd,
                                    x + (size_t)r * hd * es, QS, (long long)rep * hd, 0.0f,
                                    pre + (size_t)r * TT, FSDP_DTYPE_F32, T, rep * TT, NKV, dt))
                return;
        FSDP_CUDA_DISPATCH(dt, E,
                           window_softmax_kernel<E><<<sm_grid, 256, 0, s>>>(
                               (E *)a, pre, pos ? pos + (size_t)b * T : NULL, rows, T));
        if (!fsdp_ops_cuda_launched(ctx, op))
            return;
        /* out_h^T (hd, T) = v_g^T (hd, T2) @ att_h^T (T2, T) */
        for (int r = 0; r < rep; r++)
            if (!fsdp_ops_cuda_gemm(ctx, op, false, false, hd, T, T, 1.0f, v, QS, hd,
                                    a + (size_t)r * TT * es, T, rep * TT, 0.0f,
                                    y + (size_t)r * hd * es, dt, OS, (long long)rep * hd, NKV,
                                    dt))
                return;
    }
}

/* The backward, for op `op`. */
static void gqa_bwd(fsdp_op_ctx *ctx, const char *op, float *dqkv, float *datt, const float *dout,
                    const void *qkv, const void *att, int B, int T, int NH, int NKV, int hd)
{
    if (B <= 0 || T <= 0 || !fsdp_ops_cuda_ok(ctx) || !gqa_args_ok(ctx, op, NH, NKV, hd))
        return;
    const fsdp_dtype dt = ctx->dt;
    const bool lowp = dt == FSDP_DTYPE_BF16;
    const size_t es = fsdp_dtype_size(dt);
    const int rep = NH / NKV, QS = (NH + 2 * NKV) * hd, OS = NH * hd;
    const long long TT = (long long)T * T;
    const float scale = 1.0f / sqrtf((float)hd);
    __nv_bfloat16 *dout_lp = NULL, *dpre_lp = NULL;
    if (lowp) {
        /* dout (T, OS) then dpre (NH, T, T), the second 256-byte aligned */
        size_t n_dout = ((size_t)T * OS + 127) / 128 * 128, n_dpre = (size_t)NH * TT;
        dout_lp = (__nv_bfloat16 *)fsdp_ops_cuda_scratch(
            ctx, (n_dout + n_dpre) * sizeof(__nv_bfloat16), op);
        if (!dout_lp)
            return;
        dpre_lp = dout_lp + n_dout;
    }
    cudaStream_t s = fsdp_ops_cuda_stream(ctx);
    const int rows = NH * T;
    const unsigned sm_grid = fsdp_ops_cuda_warp_grid((size_t)rows);
    const long long qstr = (long long)rep * hd; /* q (and dq, dout) from one group to the next */
    for (int b = 0; b < B; b++) {
        const char *x = (const char *)qkv + (size_t)b * T * QS * es;
        const char *k = x + (size_t)NH * hd * es, *v = x + (size_t)(NH + NKV) * hd * es;
        const char *a = (const char *)att + (size_t)b * NH * TT * es;
        const float *dy = dout + (size_t)b * T * OS;
        float *dx = dqkv + (size_t)b * T * QS;
        float *dk = dx + (size_t)NH * hd, *dv = dx + (size_t)(NH + NKV) * hd;
        float *da = datt + (size_t)b * NH * TT;
        const char *dyA = (const char *)dy; /* dout as a GEMM operand of type dt */
        if (lowp) {
            fsdp_ops_cuda_f32_to_bf16(ctx, op, dout_lp, dy, (size_t)T * OS);
            dyA = (const char *)dout_lp;
        }
        for (int r = 0; r < rep; r++) {
            /* datt_h^T (T2, T) = v_g (T2, hd) @ dout_h^T (hd, T) */
            if (!fsdp_ops_cuda_gemm(ctx, op, true, false, T, T, hd, 1.0f, v, QS, hd,
                                    dyA + (size_t)r * hd * es, OS, qstr, 0.0f,
                                    da + (size_t)r * TT, FSDP_DTYPE_F32, T, rep * TT, NKV, dt))
                return;
            /* dv_g^T (hd, T2) += dout_h^T (hd, T) @ att_h (T, T2) */
            if (!fsdp_ops_cuda_gemm(ctx, op, false, true, hd, T, T, 1.0f,
                                    dyA + (size_t)r * hd * es, OS, qstr, a + (size_t)r * TT * es,
                                    T, rep * TT, 1.0f, dv, FSDP_DTYPE_F32, QS, hd, NKV, dt))
                return;
        }
        const char *dp;
        if (lowp) {
            gqa_softmax_bwd_kernel<__nv_bfloat16, __nv_bfloat16><<<sm_grid, 256, 0, s>>>(
                dpre_lp, da, (const __nv_bfloat16 *)a, rows, T);
            dp = (const char *)dpre_lp;
        } else {
            gqa_softmax_bwd_kernel<float, float><<<sm_grid, 256, 0, s>>>(da, da, (const float *)a,
                                                                         rows, T);
            dp = (const char *)da;
        }
        if (!fsdp_ops_cuda_launched(ctx, op))
            return;
        for (int r = 0; r < rep; r++) {
            const char *dph = dp + (size_t)r * TT * es;
            /* dq_h^T (hd, T) += scale k_g^T (hd, T2) @ dpre_h^T (T2, T) */
            if (!fsdp_ops_cuda_gemm(ctx, op, false, false, hd, T, T, scale, k, QS, hd, dph, T,
                                    rep * TT, 1.0f, dx + (size_t)r * hd, FSDP_DTYPE_F32, QS, qstr,
                                    NKV, dt))
                return;
            /* dk_g^T (hd, T2) += scale q_h^T (hd, T) @ dpre_h (T, T2) */
            if (!fsdp_ops_cuda_gemm(ctx, op, false, true, hd, T, T, scale,
                                    x + (size_t)r * hd * es, QS, qstr, dph, T, rep * TT, 1.0f, dk,
                                    FSDP_DTYPE_F32, QS, hd, NKV, dt))
                return;
        }
    }
}

/* ---- launchers -------------------------------------------------------------- */

void fsdp_ops_cuda_attention_gqa_fwd(fsdp_op_ctx *ctx, void *out, void *att, const void *qkv,
                                     const int *pos, int B, int T, int NH, int NKV, int hd)
{
    gqa_fwd(ctx, "attention_gqa_fwd", out, att, qkv, pos, B, T, NH, NKV, hd);
}

void fsdp_ops_cuda_attention_gqa_bwd(fsdp_op_ctx *ctx, float *dqkv, float *datt,
                                     const float *dout, const void *qkv, const void *att, int B,
                                     int T, int NH, int NKV, int hd)
{
    gqa_bwd(ctx, "attention_gqa_bwd", dqkv, datt, dout, qkv, att, B, T, NH, NKV, hd);
}

/* GPT-2's layout: C channels in NH heads of C / NH. */
static bool heads_ok(fsdp_op_ctx *ctx, const char *op, int C, int NH)
{
    if (NH > 0 && C % NH == 0)
        return true;
    fsdp_ops_cuda_fail(ctx, FSDP_STATUS_INVALID_ARG, op, "%d channels do not split into %d heads",
                       C, NH);
    return false;
}

void fsdp_ops_cuda_attention_fwd(fsdp_op_ctx *ctx, void *out, void *att, const void *qkv, int B,
                                 int T, int C, int NH)
{
    const char *op = "attention_fwd";
    if (B <= 0 || T <= 0 || C <= 0 || !fsdp_ops_cuda_ok(ctx) || !heads_ok(ctx, op, C, NH))
        return;
    gqa_fwd(ctx, op, out, att, qkv, NULL, B, T, NH, NH, C / NH);
}

void fsdp_ops_cuda_attention_bwd(fsdp_op_ctx *ctx, float *dqkv, float *datt, const float *dout,
                                 const void *qkv, const void *att, int B, int T, int C, int NH)
{
    const char *op = "attention_bwd";
    if (B <= 0 || T <= 0 || C <= 0 || !fsdp_ops_cuda_ok(ctx) || !heads_ok(ctx, op, C, NH))
        return;
    gqa_bwd(ctx, op, dqkv, datt, dout, qkv, att, B, T, NH, NH, C / NH);
}
