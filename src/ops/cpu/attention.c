/*
 * attention.c - causal multi-head self-attention on the cpu.
 *
 * qkv (B, T, 3C) holds [q | k | v] per position; head h uses channels
 * h*hs .. h*hs+hs-1 of each part (hs = C / NH). Per (batch, head) the
 * products QK^T, att @ V and their backward are single sgemm calls that read
 * q, k, v in place with row stride 3C and write out/dqkv with strides C/3C,
 * so no head is ever copied out. Scores are scaled by 1/sqrt(hs); the causal
 * softmax is saved in att (B, NH, T, T) with zeros above the diagonal.
 */
#include <cblas.h>
#include <math.h>

#include "ops/cpu/cpu_ops.h"

/* In place: row t of a (T, T) becomes softmax(a[t, 0..t]), zeros after t. */
static void causal_softmax(float *a, int T)
{
    for (int t = 0; t < T; t++) {
        float *row = a + (size_t)t * T;
        float maxv = row[0];
        for (int j = 1; j <= t; j++)
            if (row[j] > maxv)
                maxv = row[j];
        float sum = 0.0f;
        for (int j = 0; j <= t; j++) {
            row[j] = expf(row[j] - maxv);
            sum += row[j];
        }
        float inv = 1.0f / sum;
        for (int j = 0; j <= t; j++)
            row[j] *= inv;
        for (int j = t + 1; j < T; j++)
            row[j] = 0.0f;
    }
}

void fsdp_cpu_attention_fwd(fsdp_op_ctx *ctx, void *out, void *att, const void *qkv, int B,
                            int T, int C, int NH)
{
    if (B <= 0 || T <= 0 || C <= 0)
        return;
    FSDP_ASSERT(NH > 0 && C % NH == 0);
    fsdp_cpu_blas_init();
    const int hs = C / NH, C3 = 3 * C;
    const float scale = 1.0f / sqrtf((float)hs);
    const size_t TT = (size_t)T * T;
    const float *x = fsdp_cpu_in(ctx, FSDP_CPU_SLOT_0, qkv, (size_t)B * T * C3);
    float *y = fsdp_cpu_out(ctx, FSDP_CPU_SLOT_1, out, (size_t)B * T * C);
    const int bf16 = ctx->dt == FSDP_DTYPE_BF16;
    float *a_tmp = bf16 ? fsdp_cpu_scratch(ctx, FSDP_CPU_SLOT_2, TT) : NULL;
    if (!x || !y || (bf16 && !a_tmp))
        return; /* scratch OOM, reported by sync_error */

    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            const float *q = x + (size_t)b * T * C3 + (size_t)h * hs;
            const float *k = q + C;
            const float *v = q + 2 * C;
            size_t bh = (size_t)b * NH + h;
            float *a = bf16 ? a_tmp : (float *)att + bh * TT;
            /* a (T, T) = scale * q (T, hs) @ k^T (hs, T) */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs, scale, q, C3, k, C3,
                        0.0f, a, T);
            causal_softmax(a, T);
            /* out (T, hs), row stride C = a (T, T) @ v (T, hs) */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, T, 1.0f, a, T, v, C3,
                        0.0f, y + (size_t)b * T * C + (size_t)h * hs, C);
            if (bf16) {
                fsdp_bf16 *dst = (fsdp_bf16 *)att + bh * TT;
                for (size_t i = 0; i < TT; i++)
                    dst[i] = fsdp_f32_to_bf16(a[i]);
            }
        }
    }
    fsdp_cpu_out_done(ctx, out, y, (size_t)B * T * C);
}

void fsdp_cpu_attention_bwd(fsdp_op_ctx *ctx, float *dqkv, float *datt, const float *dout,
                            const void *qkv, const void *att, int B, int T, int C, int NH)
{
    if (B <= 0 || T <= 0 || C <= 0)
        return;
    FSDP_ASSERT(NH > 0 && C % NH == 0);
    fsdp_cpu_blas_init();
    const int hs = C / NH, C3 = 3 * C;
    const float scale = 1.0f / sqrtf((float)hs);
    const size_t TT = (size_t)T * T;
    const float *x = fsdp_cpu_in(ctx, FSDP_CPU_SLOT_0, qkv, (size_t)B * T * C3);
    const int bf16 = ctx->dt == FSDP_DTYPE_BF16;
    float *a_tmp = bf16 ? fsdp_cpu_scratch(ctx, FSDP_CPU_SLOT_2, TT) : NULL;
    if (!x || (bf16 && !a_tmp))
        return; /* scratch OOM, reported by sync_error */

    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            size_t bh = (size_t)b * NH + h;
            size_t qoff = (size_t)b * T * C3 + (size_t)h * hs;
            const float *q = x + qoff, *k = q + C, *v = q + 2 * C;
            float *dq = dqkv + qoff, *dk = dq + C, *dv = dq + 2 * C;
            const float *dy = dout + (size_t)b * T * C + (size_t)h * hs;
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
            /* da (T, T) = dout (T, hs) @ v^T */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs, 1.0f, dy, C, v, C3,
                        0.0f, da, T);
            /* dv (T, hs) += a^T (T, T) @ dout (T, hs) */
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T, 1.0f, a, T, dy, C,
                        1.0f, dv, C3);
            /* softmax backward, row by row: dpre = a * (da - sum(a * da)); the
             * masked (future) entries get exactly 0. */
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
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, T, scale, da, T, k, C3,
                        1.0f, dq, C3);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T, scale, da, T, q, C3,
                        1.0f, dk, C3);
        }
    }
}
