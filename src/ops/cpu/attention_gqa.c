/*
 * attention_gqa.c - causal grouped-query self-attention on the cpu.
 *
 * qkv (B, T, QS) with QS = (NH + 2 NKV) hd holds [q | k | v] per position:
 * query head h at channels h*hd, its kv head g = h / (NH / NKV) at
 * (NH + g) hd (k) and (NH + NKV + g) hd (v). Per (batch, query head) the
 * products QK^T, att @ V and their backward are sgemm calls (one per block
 * of rows, below) that read q, k, v in place with row stride QS and write
 * out (row stride NH hd) and dqkv in place, so no head is copied out and
 * the query heads of a group share their kv head without replicating it.
 * A kv head's gradient accumulates its query heads' contributions in head
 * order (deterministic).
 *
 * Causality is used to skip work: the rows of a head run in blocks of
 * ATT_BLOCK query positions, and block [r0, r1) multiplies only against the
 * keys and values [0, r1) (forward, da, dq) or, for dk and dv, only the
 * queries [r0, T) that can see keys [r0, r1). About half of the products'
 * work is above the diagonal; at T = 256 the blocks skip 3/8 of it, at
 * T = 1024 15/32. The skipped terms are exact zeros of att and datt, so a
 * block's sums are the full sums without their trailing (or leading) zero
 * terms.
 *
 * Scores are scaled by 1/sqrt(hd); the softmax over the window
 * [t - pos[t], t] of row t is saved in att (B, NH, T, T), zeros elsewhere.
 * The softmax rows and their backward are vectorised (vsoftmax.h, as the
 * cross-entropy's): e^x from vexp.h, arguments below -87 as e^-87, the
 * row's sum and the backward's sum(a * da) over 16 fixed lanes in double,
 * so the bits depend on T alone, not on the build's instruction set.
 * With NKV == NH, hd = C / NH and no position array it is GPT-2's causal
 * multi-head attention, whose op slots (attention_fwd/bwd) are the two
 * wrappers at the end of this file; GPT-2's trajectory did not move by a
 * bit when it moved onto this code (tests/test_golden.c).
 *
 * The rank's team takes (batch, query head) pairs in forward and (batch,
 * kv head) groups in backward: a group's query heads run in head order on
 * one worker, since they accumulate into the same dk and dv. Every product
 * is one single-threaded library call, so the result does not depend on the
 * thread count. With bf16 storage each worker has its own (T, T) buffer.
 */
#include <math.h>

#include "ops/cpu/blas.h"
#include "ops/cpu/cpu_ops.h"
#include "ops/cpu/vsoftmax.h"

/* Query positions per block of the causal products (a shape-only constant:
 * the bits do not depend on the thread count). */
#define ATT_BLOCK 64

/* The end of the block of rows that starts at r0. */
static inline int block_end(int r0, int T)
{
    return r0 + ATT_BLOCK < T ? r0 + ATT_BLOCK : T;
}

double fsdp_cpu_attention_flops(int B, int T, int NH, int hd)
{
    double pairs = 0.0; /* (query, key) pairs the blocks multiply */
    for (int r0 = 0; r0 < T; r0 = block_end(r0, T))
        pairs += (double)(block_end(r0, T) - r0) * block_end(r0, T);
    return 4.0 * B * NH * hd * pairs;
}

/* The first key row t attends to: t - pos[t] clamped to [0, t]. */
static inline int window_lo(const int *pos, int t)
{
    if (!pos)
        return 0;
    int p = pos[t];
    return p < 0 ? t : (p > t ? 0 : t - p);
}

/* The row kernels (vsoftmax.h's fixed-order sums, vexp.h's e^x) and the
 * softmax's forward and backward over a (T, T) block of scores, compiled for
 * the build's baseline and for AVX2 and picked at run time (as xent.c). */
#define GQA_KERNELS(sfx, attr)                                                               \
    FSDP_SOFTMAX_KERNELS(sfx, attr)                                                          \
    /* In place: row t of a (T, T) becomes softmax(a[t, lo..t]), zeros elsewhere. */         \
    attr static void window_softmax_##sfx(float *a, const int *pos, int T)                   \
    {                                                                                        \
        for (int t = 0; t < T; t++) {                                                        \
            float *row = a + (size_t)t * T;                                                  \
            const int lo = window_lo(pos, t), n = t + 1 - lo;                                \
            float *w = row + lo;                                                             \
            const float maxv = fsdp_softmax_max_##sfx(w, n);                                 \
            const float inv = (float)(1.0 / fsdp_softmax_exp_sum_##sfx(w, w, n, maxv));     \
            for (int j = 0; j < n; j++)                                                      \
                w[j] *= inv;                                                                 \
            for (int j = 0; j < lo; j++)                                                     \
                row[j] = 0.0f;                                                               \
            for (int j = t + 1; j < T; j++)                                                  \
                row[j] = 0.0f;                                                               \
        }                                                                                    \
    }                                                                                        \
    /* In place, row by row: da becomes dpre = a * (da - sum(a * da)). Entries outside the   \
     * window have a = 0 and add nothing to the sum; the future ones are set to exactly 0. */ \
    attr static void softmax_bwd_##sfx(float *da, const float *a, int T)                     \
    {                                                                                        \
        for (int t = 0; t < T; t++) {                                                        \
            const float *arow = a + (size_t)t * T;                                           \
            float *drow = da + (size_t)t * T;                                                \
            const float s = (float)fsdp_softmax_dot_##sfx(arow, drow, t + 1);                \
            for (int i = 0; i <= t; i++)                                                     \
                drow[i] = arow[i] * (drow[i] - s);                                           \
            for (int i = t + 1; i < T; i++)                                                  \
                drow[i] = 0.0f;                                                              \
        }                                                                                    \
    }
GQA_KERNELS(base, )
GQA_KERNELS(avx2, __attribute__((target("avx2"))))

typedef struct gqa_job {
    const float *x;  /* qkv as fp32 (B, T, QS) */
    float *y;        /* out as fp32 (B, T, OS); fwd */
    void *att;       /* (B, NH, T, T) in dt */
    float *a_tmp;    /* bf16: (workers, T, T) */
    const int *pos;  /* (B, T) or NULL; fwd */
    float *dqkv;     /* bwd */
    float *datt;
    const float *dout;
    int T, NH, NKV, hd, bf16;
    bool avx2; /* the row kernels' AVX2 variant */
    float scale;
} gqa_job;

static void gqa_fwd_head(void *arg, size_t bh, int worker)
{
    const gqa_job *j = arg;
    const int T = j->T, NH = j->NH, NKV = j->NKV, hd = j->hd;
    const int QS = (NH + 2 * NKV) * hd, OS = NH * hd, rep = NH / NKV;
    const size_t TT = (size_t)T * T;
    const size_t b = bh / (size_t)NH, h = bh % (size_t)NH, g = h / (size_t)rep;
    const float *xb = j->x + b * T * QS;
    const float *q = xb + h * hd;
    const float *k = xb + (NH + g) * hd;
    const float *v = xb + (NH + NKV + g) * hd;
    float *a = j->bf16 ? j->a_tmp + (size_t)worker * TT : (float *)j->att + bh * TT;
    float *y = j->y + b * T * OS + h * hd;
    /* a[r0:r1, 0:r1] = scale * q[r0:r1] (hd) @ k[0:r1]^T; the rest of the
     * rows is above the diagonal and set to 0 by the softmax */
    for (int r0 = 0; r0 < T; r0 += ATT_BLOCK) {
        const int r1 = block_end(r0, T);
        fsdp_cpu_blas_sgemm(false, true, r1 - r0, r1, hd, j->scale, q + (size_t)r0 * QS, QS, k,
                            QS, 0.0f, a + (size_t)r0 * T, T);
    }
    const int *pos = j->pos ? j->pos + b * T : NULL;
    if (j->avx2)
        window_softmax_avx2(a, pos, T);
    else
        window_softmax_base(a, pos, T);
    /* out[r0:r1] (hd, row stride OS) = a[r0:r1, 0:r1] @ v[0:r1] */
    for (int r0 = 0; r0 < T; r0 += ATT_BLOCK) {
        const int r1 = block_end(r0, T);
        fsdp_cpu_blas_sgemm(false, false, r1 - r0, hd, r1, 1.0f, a + (size_t)r0 * T, T, v, QS,
                            0.0f, y + (size_t)r0 * OS, OS);
    }
    if (j->bf16) {
        fsdp_bf16 *dst = (fsdp_bf16 *)j->att + bh * TT;
        for (size_t i = 0; i < TT; i++)
            dst[i] = fsdp_f32_to_bf16(a[i]);
    }
}

void fsdp_cpu_attention_gqa_fwd(fsdp_op_ctx *ctx, void *out, void *att, const void *qkv,
                                const int *pos, int B, int T, int NH, int NKV, int hd)
{
    if (B <= 0 || T <= 0 || !fsdp_cpu_gemm_ready(ctx))
        return;
    FSDP_ASSERT(NH > 0 && NKV > 0 && NH % NKV == 0 && hd > 0);
    const int QS = (NH + 2 * NKV) * hd, OS = NH * hd;
    const size_t TT = (size_t)T * T;
    const int bf16 = ctx->dt == FSDP_DTYPE_BF16;
    gqa_job j = {.att = att, .pos = pos, .T = T, .NH = NH, .NKV = NKV, .hd = hd, .bf16 = bf16,
                 .avx2 = __builtin_cpu_supports("avx2"), .scale = 1.0f / sqrtf((float)hd)};
    j.x = fsdp_cpu_in(ctx, FSDP_CPU_SLOT_0, qkv, (size_t)B * T * QS);
    j.y = fsdp_cpu_out(ctx, FSDP_CPU_SLOT_1, out, (size_t)B * T * OS);
    if (bf16)
        j.a_tmp = fsdp_cpu_scratch(ctx, FSDP_CPU_SLOT_2, (size_t)fsdp_cpu_threads(ctx) * TT);
    if (!j.x || !j.y || (bf16 && !j.a_tmp))
        return; /* scratch OOM, reported by sync_error */
    fsdp_cpu_parallel(ctx, (size_t)B * NH, gqa_fwd_head, &j);
    fsdp_cpu_out_done(ctx, out, j.y, (size_t)B * T * OS);
}

/* The backward of query head h of batch b (its kv head's dk, dv += its
 * share). */
static void gqa_bwd_head(const gqa_job *j, size_t b, size_t h, int worker)
{
    const int T = j->T, NH = j->NH, NKV = j->NKV, hd = j->hd;
    const int QS = (NH + 2 * NKV) * hd, OS = NH * hd, rep = NH / NKV;
    const size_t TT = (size_t)T * T, g = h / (size_t)rep, bh = b * NH + h;
    const size_t xb = b * T * QS;
    const size_t qo = xb + h * hd, ko = xb + (NH + g) * hd, vo = xb + (NH + NKV + g) * hd;
    const float *q = j->x + qo, *k = j->x + ko, *v = j->x + vo;
    float *dq = j->dqkv + qo, *dk = j->dqkv + ko, *dv = j->dqkv + vo;
    const float *dy = j->dout + b * T * OS + h * hd;
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
    for (int r0 = 0; r0 < T; r0 += ATT_BLOCK) {
        const int r1 = block_end(r0, T);
        const size_t o = (size_t)r0;
        /* da[r0:r1, 0:r1] = dout[r0:r1] (hd) @ v[0:r1]^T (the rest of the
         * rows is set to 0 below) */
        fsdp_cpu_blas_sgemm(false, true, r1 - r0, r1, hd, 1.0f, dy + o * OS, OS, v, QS, 0.0f,
                            da + o * T, T);
        /* dv[r0:r1] += a[r0:T, r0:r1]^T @ dout[r0:T]: queries before r0
         * do not see these keys */
        fsdp_cpu_blas_sgemm(true, false, r1 - r0, hd, T - r0, 1.0f, a + o * T + o, T,
                            dy + o * OS, OS, 1.0f, dv + o * QS, QS);
    }
    /* softmax backward, row by row: dpre = a * (da - sum(a * da)) */
    if (j->avx2)
        softmax_bwd_avx2(da, a, T);
    else
        softmax_bwd_base(da, a, T);
    /* dq[r0:r1] += scale * dpre[r0:r1, 0:r1] @ k[0:r1];
     * dk[r0:r1] += scale * dpre[r0:T, r0:r1]^T @ q[r0:T] */
    for (int r0 = 0; r0 < T; r0 += ATT_BLOCK) {
        const int r1 = block_end(r0, T);
        const size_t o = (size_t)r0;
        fsdp_cpu_blas_sgemm(false, false, r1 - r0, hd, r1, j->scale, da + o * T, T, k, QS, 1.0f,
                            dq + o * QS, QS);
        fsdp_cpu_blas_sgemm(true, false, r1 - r0, hd, T - r0, j->scale, da + o * T + o, T,
                            q + o * QS, QS, 1.0f, dk + o * QS, QS);
    }
}

/* Chunk bg = (batch, kv head): its query heads in head order. */
static void gqa_bwd_group(void *arg, size_t bg, int worker)
{
    const gqa_job *j = arg;
    const size_t rep = (size_t)(j->NH / j->NKV);
    const size_t b = bg / (size_t)j->NKV, g = bg % (size_t)j->NKV;
    for (size_t h = g * rep; h < (g + 1) * rep; h++)
        gqa_bwd_head(j, b, h, worker);
}

void fsdp_cpu_attention_gqa_bwd(fsdp_op_ctx *ctx, float *dqkv, float *datt, const float *dout,
                                const void *qkv, const void *att, int B, int T, int NH, int NKV,
                                int hd)
{
    if (B <= 0 || T <= 0 || !fsdp_cpu_gemm_ready(ctx))
        return;
    FSDP_ASSERT(NH > 0 && NKV > 0 && NH % NKV == 0 && hd > 0);
    const int QS = (NH + 2 * NKV) * hd;
    const size_t TT = (size_t)T * T;
    const int bf16 = ctx->dt == FSDP_DTYPE_BF16;
    gqa_job j = {.att = (void *)att, .dqkv = dqkv, .datt = datt, .dout = dout, .T = T, .NH = NH,
                 .NKV = NKV, .hd = hd, .bf16 = bf16, .avx2 = __builtin_cpu_supports("avx2"),
                 .scale = 1.0f / sqrtf((float)hd)};
    j.x = fsdp_cpu_in(ctx, FSDP_CPU_SLOT_0, qkv, (size_t)B * T * QS);
    if (bf16)
        j.a_tmp = fsdp_cpu_scratch(ctx, FSDP_CPU_SLOT_2, (size_t)fsdp_cpu_threads(ctx) * TT);
    if (!j.x || (bf16 && !j.a_tmp))
        return; /* scratch OOM, reported by sync_error */
    fsdp_cpu_parallel(ctx, (size_t)B * NKV, gqa_bwd_group, &j);
}

/* GPT-2's slots: qkv (B, T, 3C) is [q | k | v] with NH heads of C / NH
 * channels each and one kv head per query head. */
void fsdp_cpu_attention_fwd(fsdp_op_ctx *ctx, void *out, void *att, const void *qkv, int B,
                            int T, int C, int NH)
{
    if (C <= 0)
        return;
    FSDP_ASSERT(NH > 0 && C % NH == 0);
    fsdp_cpu_attention_gqa_fwd(ctx, out, att, qkv, NULL, B, T, NH, NH, C / NH);
}

void fsdp_cpu_attention_bwd(fsdp_op_ctx *ctx, float *dqkv, float *datt, const float *dout,
                            const void *qkv, const void *att, int B, int T, int C, int NH)
{
    if (C <= 0)
        return;
    FSDP_ASSERT(NH > 0 && C % NH == 0);
    fsdp_cpu_attention_gqa_bwd(ctx, dqkv, datt, dout, qkv, att, B, T, NH, NH, C / NH);
}
