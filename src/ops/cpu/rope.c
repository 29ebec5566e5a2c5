/*
 * rope.c - rotary position embeddings on the cpu, in place (HF Llama's
 * "rotate_half": channel i of a head pairs with channel i + hd/2).
 *
 * x holds B*T rows of `stride` elements; the first n_heads heads of hd
 * channels of each row are rotated. The angle of pair i at position p is
 * the fp32 product p * inv_freq[i], as transformers computes it, and its
 * cosine and sine come from libm once per position: for the plain layout
 * (pos NULL) a (T, hd) table serves every sequence of the batch; with a
 * position array each token gets its own. The rotation loops are plain
 * fp32 loops the compiler vectorises; bf16 rows are widened, rotated and
 * rounded once.
 */
#include <math.h>

#include "ops/cpu/cpu_ops.h"

/* cs[0..half) = cos(p f), cs[half..2 half) = sin(p f) */
static void rope_angles(float *cs, const float *inv_freq, int p, int half)
{
    for (int i = 0; i < half; i++) {
        float a = (float)p * inv_freq[i];
        cs[i] = cosf(a);
        cs[half + i] = sinf(a);
    }
}

/* Rotate n_heads heads of a row by the angles in cs; dir +1 forward, -1
 * backward (the transpose). */
static void rope_row(float *x, const float *cs, int n_heads, int half, int dir)
{
    const float *c = cs, *s = cs + half;
    for (int h = 0; h < n_heads; h++) {
        float *x1 = x + (size_t)h * 2 * half, *x2 = x1 + half;
        if (dir > 0) {
            for (int i = 0; i < half; i++) {
                float a = x1[i], b = x2[i];
                x1[i] = a * c[i] - b * s[i];
                x2[i] = b * c[i] + a * s[i];
            }
        } else {
            for (int i = 0; i < half; i++) {
                float a = x1[i], b = x2[i];
                x1[i] = a * c[i] + b * s[i];
                x2[i] = b * c[i] - a * s[i];
            }
        }
    }
}

/* The shared walk over rows: x is fp32 (dt F32) or bf16. */
static void rope_apply(fsdp_op_ctx *ctx, void *x, fsdp_dtype dt, const float *inv_freq,
                       const int *pos, int B, int T, int n_heads, int hd, int stride, int dir)
{
    if (B <= 0 || T <= 0 || n_heads <= 0)
        return;
    FSDP_ASSERT(hd > 0 && hd % 2 == 0 && stride >= n_heads * hd);
    const int half = hd / 2, width = n_heads * hd;
    /* angles: (T, hd) shared by every sequence, or one row per token */
    float *cs = fsdp_cpu_scratch(ctx, FSDP_CPU_SLOT_0, (size_t)(pos ? 1 : T) * hd);
    float *row = dt == FSDP_DTYPE_BF16 ? fsdp_cpu_scratch(ctx, FSDP_CPU_SLOT_1, (size_t)width)
                                       : NULL;
    if (!cs || (dt == FSDP_DTYPE_BF16 && !row))
        return; /* scratch OOM, reported by sync_error */
    if (!pos)
        for (int t = 0; t < T; t++)
            rope_angles(cs + (size_t)t * hd, inv_freq, t, half);
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            const size_t r = (size_t)b * T + t;
            const float *a = cs + (size_t)t * hd;
            if (pos) {
                rope_angles(cs, inv_freq, pos[r], half);
                a = cs;
            }
            if (dt == FSDP_DTYPE_F32) {
                rope_row((float *)x + r * stride, a, n_heads, half, dir);
                continue;
            }
            fsdp_bf16 *xr = (fsdp_bf16 *)x + r * stride;
            for (int i = 0; i < width; i++)
                row[i] = fsdp_bf16_to_f32(xr[i]);
            rope_row(row, a, n_heads, half, dir);
            for (int i = 0; i < width; i++)
                xr[i] = fsdp_f32_to_bf16(row[i]);
        }
    }
}

void fsdp_cpu_rope_fwd(fsdp_op_ctx *ctx, void *x, const float *inv_freq, const int *pos, int B,
                       int T, int n_heads, int hd, int stride)
{
    rope_apply(ctx, x, ctx->dt, inv_freq, pos, B, T, n_heads, hd, stride, +1);
}

void fsdp_cpu_rope_bwd(fsdp_op_ctx *ctx, float *dx, const float *inv_freq, const int *pos, int B,
                       int T, int n_heads, int hd, int stride)
{
    rope_apply(ctx, dx, FSDP_DTYPE_F32, inv_freq, pos, B, T, n_heads, hd, stride, -1);
}
