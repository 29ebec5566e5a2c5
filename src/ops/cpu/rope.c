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
 * rounded once. Rows go to the rank's team in fixed ranges.
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
typedef struct rope_job {
    void *x;
    fsdp_dtype dt;
    const float *inv_freq;
    const int *pos;
    float *cs;   /* pos NULL: the (T, hd) table; else (workers, hd) */
    float *row;  /* bf16: (workers, width) */
    int T, n_heads, hd, stride, dir;
} rope_job;

static void rope_table_rows(void *arg, size_t begin, size_t end, int worker)
{
    const rope_job *j = arg;
    for (size_t t = begin; t < end; t++)
        rope_angles(j->cs + t * j->hd, j->inv_freq, (int)t, j->hd / 2);
}

static void rope_rows(void *arg, size_t begin, size_t end, int worker)
{
    const rope_job *j = arg;
    const int half = j->hd / 2, width = j->n_heads * j->hd;
    for (size_t r = begin; r < end; r++) {
        const float *a = j->cs + (r % (size_t)j->T) * j->hd;
        if (j->pos) {
            float *cs = j->cs + (size_t)worker * j->hd;
            rope_angles(cs, j->inv_freq, j->pos[r], half);
            a = cs;
        }
        if (j->dt == FSDP_DTYPE_F32) {
            rope_row((float *)j->x + r * j->stride, a, j->n_heads, half, j->dir);
            continue;
        }
        float *row = j->row + (size_t)worker * width;
        fsdp_bf16 *xr = (fsdp_bf16 *)j->x + r * j->stride;
        for (int i = 0; i < width; i++)
            row[i] = fsdp_bf16_to_f32(xr[i]);
        rope_row(row, a, j->n_heads, half, j->dir);
        for (int i = 0; i < width; i++)
            xr[i] = fsdp_f32_to_bf16(row[i]);
    }
}

/* Rows (and table rows) go to the rank's team in fixed ranges; each row's
 * result depends on that row alone. */
static void rope_apply(fsdp_op_ctx *ctx, void *x, fsdp_dtype dt, const float *inv_freq,
                       const int *pos, int B, int T, int n_heads, int hd, int stride, int dir)
{
    if (B <= 0 || T <= 0 || n_heads <= 0)
        return;
    FSDP_ASSERT(hd > 0 && hd % 2 == 0 && stride >= n_heads * hd);
    const int width = n_heads * hd;
    const size_t workers = (size_t)fsdp_cpu_threads(ctx);
    rope_job j = {.x = x, .dt = dt, .inv_freq = inv_freq, .pos = pos, .T = T,
                  .n_heads = n_heads, .hd = hd, .stride = stride, .dir = dir};
    /* angles: (T, hd) shared by every sequence, or one row per token */
    j.cs = fsdp_cpu_scratch(ctx, FSDP_CPU_SLOT_0, (pos ? workers : (size_t)T) * hd);
    j.row = dt == FSDP_DTYPE_BF16 ? fsdp_cpu_scratch(ctx, FSDP_CPU_SLOT_1, workers * width)
                                  : NULL;
    if (!j.cs || (dt == FSDP_DTYPE_BF16 && !j.row))
        return; /* scratch OOM, reported by sync_error */
    const size_t grain = FSDP_CPU_GRAIN / (size_t)width + 1;
    if (!pos)
        fsdp_cpu_parallel_range(ctx, (size_t)T, grain, rope_table_rows, &j);
    fsdp_cpu_parallel_range(ctx, (size_t)B * T, grain, rope_rows, &j);
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
