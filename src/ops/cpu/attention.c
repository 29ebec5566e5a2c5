/*
 * attention.c - causal multi-head self-attention on the cpu.
 *
 * qkv (B, T, 3C) holds [q | k | v] per position; head h uses channels
 * h*hs .. h*hs+hs-1 of each part (hs = C / NH). Per (batch, head) the
 * products QK^T, att @ V and their backward are single sgemm calls that read
 * q, k, v in place with row stride 3C and write out/dqkv with strides C/3C,
 * so no head is ever copied out. Scores are scaled by 1/sqrt(hs); the causal
 * softmax is saved in att (B, NH, T, T) with zeros above the diagonal.
 *
 * The (batch, head) pairs are the chunks given to the rank's team: each
 * writes only its own head's slices, with one-tile products, so the result
 * does not depend on the thread count. With bf16 storage each worker has
 * its own (T, T) fp32 buffer for the softmax.
 */
#include <math.h>

#include "ops/cpu/blas.h"
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

typedef struct att_job {
    const float *x;  /* qkv as fp32 (B, T, 3C) */
    float *y;        /* out as fp32 (B, T, C); fwd */
    void *att;       /* (B, NH, T, T) in dt */
    float *a_tmp;    /* bf16: (workers, T, T) */
    float *dqkv;     /* bwd */
    float *datt;
    const float *dout;
    int T, C, NH, hs, bf16;
    float scale;
} att_job;

static void att_fwd_head(void *arg, size_t bh, int worker)
{
    const att_job *j = arg;
    const int T = j->T, C = j->C, C3 = 3 * C, hs = j->hs;
    const size_t TT = (size_t)T * T;
    size_t b = bh / (size_t)j->NH, h = bh % (size_t)j->NH;
    const float *q = j->x + b * T * C3 + h * hs;
    const float *k = q + C;
    const float *v = q + 2 * C;
    float *a = j->bf16 ? j->a_tmp + (size_t)worker * TT : (float *)j->att + bh * TT;
    /* a (T, T) = scale * q (T, hs) @ k^T (hs, T) */
    fsdp_cpu_blas_sgemm(false, true, T, T, hs, j->scale, q, C3, k, C3, 0.0f, a, T);
    causal_softmax(a, T);
    /* out (T, hs), row stride C = a (T, T) @ v (T, hs) */
    fsdp_cpu_blas_sgemm(false, false, T, hs, T, 1.0f, a, T, v, C3, 0.0f,
                        j->y + b * T * C + h * hs, C);
    if (j->bf16) {
        fsdp_bf16 *dst = (fsdp_bf16 *)j->att + bh * TT;
        for (size_t i = 0; i < TT; i++)
            dst[i] = fsdp_f32_to_bf16(a[i]);
    }
}

void fsdp_cpu_attention_fwd(fsdp_op_ctx *ctx, void *out, void *att, const void *qkv, int B,
                            int T, int C, int NH)
{
    if (B <= 0 || T <= 0 || C <= 0 || !fsdp_cpu_gemm_ready(ctx))
        return;
    FSDP_ASSERT(NH > 0 && C % NH == 0);
    const size_t TT = (size_t)T * T;
    const int bf16 = ctx->dt == FSDP_DTYPE_BF16;
    att_job j = {.att = att, .T = T, .C = C, .NH = NH, .hs = C / NH, .bf16 = bf16,
                 .scale = 1.0f / sqrtf((float)(C / NH))};
    j.x = fsdp_cpu_in(ctx, FSDP_CPU_SLOT_0, qkv, (size_t)B * T * 3 * C);
    j.y = fsdp_cpu_out(ctx, FSDP_CPU_SLOT_1, out, (size_t)B * T * C);
    if (bf16)
        j.a_tmp = fsdp_cpu_scratch(ctx, FSDP_CPU_SLOT_2, (size_t)fsdp_cpu_threads(ctx) * TT);
    if (!j.x || !j.y || (bf16 && !j.a_tmp))
        return; /* scratch OOM, reported by sync_error */
    fsdp_cpu_parallel(ctx, (size_t)B * NH, att_fwd_head, &j);
    fsdp_cpu_out_done(ctx, out, j.y, (size_t)B * T * C);
}

static void att_bwd_head(void *arg, size_t bh, int worker)
{
    const att_job *j = arg;
    const int T = j->T, C = j->C, C3 = 3 * C, hs = j->hs;
    const size_t TT = (size_t)T * T;
    size_t b = bh / (size_t)j->NH, h = bh % (size_t)j->NH;
    size_t qoff = b * T * C3 + h * hs;
    const float *q = j->x + qoff, *k = q + C, *v = q + 2 * C;
    float *dq = j->dqkv + qoff, *dk = dq + C, *dv = dq + 2 * C;
    const float *dy = j->dout + b * T * C + h * hs;
    float *da = j->datt + bh * TT;
    const float *a;
    if (j->bf16) {
        float *tmp = j->a_tmp + (size_t)worker * TT;
        const fsdp_bf16 *src = (const fsdp_bf16 *)j->att + bh * TT;
        for (size_t i = 0; i < TT; i++)
            tmp[i] = fsdp_bf16_to_f32(src[i]);
        a = tmp;
    } else {
        a = (const float *)j->att + bh * TT;
    }
    /* da (T, T) = dout (T, hs) @ v^T */
    fsdp_cpu_blas_sgemm(false, true, T, T, hs, 1.0f, dy, C, v, C3, 0.0f, da, T);
    /* dv (T, hs) += a^T (T, T) @ dout (T, hs) */
    fsdp_cpu_blas_sgemm(true, false, T, hs, T, 1.0f, a, T, dy, C, 1.0f, dv, C3);
    /* softmax backward, row by row: dpre = a * (da - sum(a * da)); the
     * masked (future) entries get exactly 0. */
    for (int t = 0; t < T; t++) {
        const float *arow = a + (size_t)t * T;
        float *drow = da + (size_t)t * T;
        float s = 0.0f;
        for (int i = 0; i <= t; i++)
            s += arow[i] * drow[i];
        for (int i = 0; i <= t; i++)
            drow[i] = arow[i] * (drow[i] - s);
        for (int i = t + 1; i < T; i++)
            drow[i] = 0.0f;
    }
    /* dq += scale * dpre @ k;  dk += scale * dpre^T @ q */
    fsdp_cpu_blas_sgemm(false, false, T, hs, T, j->scale, da, T, k, C3, 1.0f, dq, C3);
    fsdp_cpu_blas_sgemm(true, false, T, hs, T, j->scale, da, T, q, C3, 1.0f, dk, C3);
}

void fsdp_cpu_attention_bwd(fsdp_op_ctx *ctx, float *dqkv, float *datt, const float *dout,
                            const void *qkv, const void *att, int B, int T, int C, int NH)
{
    if (B <= 0 || T <= 0 || C <= 0 || !fsdp_cpu_gemm_ready(ctx))
        return;
    FSDP_ASSERT(NH > 0 && C % NH == 0);
    const size_t TT = (size_t)T * T;
    const int bf16 = ctx->dt == FSDP_DTYPE_BF16;
    att_job j = {.att = (void *)att, .dqkv = dqkv, .datt = datt, .dout = dout, .T = T, .C = C,
                 .NH = NH, .hs = C / NH, .bf16 = bf16, .scale = 1.0f / sqrtf((float)(C / NH))};
    j.x = fsdp_cpu_in(ctx, FSDP_CPU_SLOT_0, qkv, (size_t)B * T * 3 * C);
    if (bf16)
        j.a_tmp = fsdp_cpu_scratch(ctx, FSDP_CPU_SLOT_2, (size_t)fsdp_cpu_threads(ctx) * TT);
    if (!j.x || (bf16 && !j.a_tmp))
        return; /* scratch OOM, reported by sync_error */
    fsdp_cpu_parallel(ctx, (size_t)B * NH, att_bwd_head, &j);
}
