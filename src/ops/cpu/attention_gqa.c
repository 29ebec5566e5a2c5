/*
 * attention_gqa.c - causal grouped-query self-attention on the cpu.
 *
 * qkv (B, T, QS) with QS = (NH + 2 NKV) hd holds [q | k | v] per position:
 * query head h at channels h*hd, its kv head g = h / (NH / NKV) at
 * (NH + g) hd (k) and (NH + NKV + g) hd (v). Per (batch, query head) the
 * products QK^T, att @ V and their backward are single sgemm calls that
 * read q, k, v in place with row stride QS and write out (row stride
 * NH hd) and dqkv in place, so no head is copied out and the query heads of
 * a group share their kv head without replicating it. A kv head's gradient
 * accumulates its query heads' contributions in head order (deterministic).
 *
 * Scores are scaled by 1/sqrt(hd); the softmax over the window
 * [t - pos[t], t] of row t is saved in att (B, NH, T, T), zeros elsewhere.
 * With NKV == NH, hd = C / NH and no position array, every call and loop is
 * the one attention.c makes for GPT-2, so the results are bit-identical
 * (the test checks it), and GPT-2 can move onto this op without changing a
 * bit of its trajectory.
 */
#include <cblas.h>
#include <math.h>

#include "ops/cpu/cpu_ops.h"

/* The first key row t attends to: t - pos[t] clamped to [0, t]. */
static inline int window_lo(const int *pos, int t)
{
    if (!pos)
        return 0;
    int p = pos[t];
    return p < 0 ? t : (p > t ? 0 : t - p);
}

/* In place: row t of a (T, T) becomes softmax(a[t, lo..t]), zeros elsewhere. */
static void window_softmax(float *a, const int *pos, int T)
{
    for (int t = 0; t < T; t++) {
        float *row = a + (size_t)t * T;
        const int lo = window_lo(pos, t);
        float maxv = row[lo];
        for (int j = lo + 1; j <= t; j++)
            if (row[j] > maxv)
                maxv = row[j];
        float sum = 0.0f;
        for (int j = lo; j <= t; j++) {
            row[j] = expf(row[j] - maxv);
            sum += row[j];
        }
        float inv = 1.0f / sum;
        for (int j = lo; j <= t; j++)
            row[j] *= inv;
        for (int j = 0; j < lo; j++)
            row[j] = 0.0f;
        for (int j = t + 1; j < T; j++)
            row[j] = 0.0f;
    }
}

void fsdp_cpu_attention_gqa_fwd(fsdp_op_ctx *ctx, void *out, void *att, const void *qkv,
                                const int *pos, int B, int T, int NH, int NKV, int hd)
{
    if (B <= 0 || T <= 0)
        return;
    FSDP_ASSERT(NH > 0 && NKV > 0 && NH % NKV == 0 && hd > 0);
    fsdp_cpu_blas_init();
    const int QS = (NH + 2 * NKV) * hd, OS = NH * hd, rep = NH / NKV;
    const float scale = 1.0f / sqrtf((float)hd);
    const size_t TT = (size_t)T * T;
    const float *x = fsdp_cpu_in(ctx, FSDP_CPU_SLOT_0, qkv, (size_t)B * T * QS);
    float *y = fsdp_cpu_out(ctx, FSDP_CPU_SLOT_1, out, (size_t)B * T * OS);
    const int bf16 = ctx->dt == FSDP_DTYPE_BF16;
    float *a_tmp = bf16 ? fsdp_cpu_scratch(ctx, FSDP_CPU_SLOT_2, TT) : NULL;
    if (!x || !y || (bf16 && !a_tmp))
        return; /* scratch OOM, reported by sync_error */

    for (int b = 0; b < B; b++) {
        const float *xb = x + (size_t)b * T * QS;
        const int *pb = pos ? pos + (size_t)b * T : NULL;
        for (int h = 0; h < NH; h++) {
            const int g = h / rep;
            const float *q = xb + (size_t)h * hd;
            const float *k = xb + (size_t)(NH + g) * hd;
            const float *v = xb + (size_t)(NH + NKV + g) * hd;
            const size_t bh = (size_t)b * NH + h;
            float *a = bf16 ? a_tmp : (float *)att + bh * TT;
            /* a (T, T) = scale * q (T, hd) @ k^T (hd, T) */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hd, scale, q, QS, k, QS,
                        0.0f, a, T);
            window_softmax(a, pb, T);
            /* out (T, hd), row stride OS = a (T, T) @ v (T, hd) */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hd, T, 1.0f, a, T, v, QS,
                        0.0f, y + (size_t)b * T * OS + (size_t)h * hd, OS);
            if (bf16) {
                fsdp_bf16 *dst = (fsdp_bf16 *)att + bh * TT;
                for (size_t i = 0; i < TT; i++)
                    dst[i] = fsdp_f32_to_bf16(a[i]);
            }
        }
    }
    fsdp_cpu_out_done(ctx, out, y, (size_t)B * T * OS);
}

void fsdp_cpu_attention_gqa_bwd(fsdp_op_ctx *ctx, float *dqkv, float *datt, const float *dout,
                                const void *qkv, const void *att, int B, int T, int NH, int NKV,
                                int hd)
{
    if (B <= 0 || T <= 0)
        return;
    FSDP_ASSERT(NH > 0 && NKV > 0 && NH % NKV == 0 && hd > 0);
    fsdp_cpu_blas_init();
    const int QS = (NH + 2 * NKV) * hd, OS = NH * hd, rep = NH / NKV;
    const float scale = 1.0f / sqrtf((float)hd);
    const size_t TT = (size_t)T * T;
    const float *x = fsdp_cpu_in(ctx, FSDP_CPU_SLOT_0, qkv, (size_t)B * T * QS);
    const int bf16 = ctx->dt == FSDP_DTYPE_BF16;
    float *a_tmp = bf16 ? fsdp_cpu_scratch(ctx, FSDP_CPU_SLOT_2, TT) : NULL;
    if (!x || (bf16 && !a_tmp))
        return; /* scratch OOM, reported by sync_error */

    for (int b = 0; b < B; b++) {
        const size_t xb = (size_t)b * T * QS;
        for (int h = 0; h < NH; h++) {
            const int g = h / rep;
            const size_t bh = (size_t)b * NH + h;
            const size_t qo = xb + (size_t)h * hd, ko = xb + (size_t)(NH + g) * hd,
                         vo = xb + (size_t)(NH + NKV + g) * hd;
            const float *q = x + qo, *k = x + ko, *v = x + vo;
            float *dq = dqkv + qo, *dk = dqkv + ko, *dv = dqkv + vo;
            const float *dy = dout + (size_t)b * T * OS + (size_t)h * hd;
            float *da = datt + bh * TT;
            const float *a;
            if (bf16) {
                const fsdp_bf16 *src = (const fsdp_bf16 *)att + bh * TT;
                for (size_t i = 0; i < TT; i++)
                    a_tmp[i] = fsdp_bf16_to_f32(src[i]);
                a = a_tmp;
            } else {
                a = (const float *)att + bh * TT;
            }
            /* da (T, T) = dout (T, hd) @ v^T */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hd, 1.0f, dy, OS, v, QS,
                        0.0f, da, T);
            /* dv (T, hd) += a^T (T, T) @ dout (T, hd) */
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hd, T, 1.0f, a, T, dy, OS,
                        1.0f, dv, QS);
            /* softmax backward, row by row: dpre = a * (da - sum(a * da)).
             * Entries outside the window have a = 0 and add nothing to the
             * sum; the future ones are set to exactly 0. */
            for (int t = 0; t < T; t++) {
                const float *arow = a + (size_t)t * T;
                float *drow = da + (size_t)t * T;
                float s = 0.0f;
                for (int j = 0; j <= t; j++)
                    s += arow[j] * drow[j];
                for (int j = 0; j <= t; j++)
                    drow[j] = arow[j] * (drow[j] - s);
                for (int j = t + 1; j < T; j++)
                    drow[j] = 0.0f;
            }
            /* dq += scale * dpre @ k;  dk += scale * dpre^T @ q */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hd, T, scale, da, T, k, QS,
                        1.0f, dq, QS);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hd, T, scale, da, T, q, QS,
                        1.0f, dk, QS);
        }
    }
}
