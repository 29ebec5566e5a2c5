/*
 * cast.c - data movement and reductions on the cpu: dtype casts, fp32 add,
 * and the per-block sums of squares used for the gradient norm. Element
 * ranges (and, for the sums, whole blocks) go to the rank's team.
 */
#include <string.h>

#include "ops/cpu/cpu_ops.h"

typedef struct cast_job {
    void *dst;
    const void *src, *b;
    size_t n;
} cast_job;

static void copy_range(void *arg, size_t begin, size_t end, int worker)
{
    const cast_job *j = arg; /* bytes */
    memmove((char *)j->dst + begin, (const char *)j->src + begin, end - begin);
}

void fsdp_cpu_cast(fsdp_op_ctx *ctx, void *dst, fsdp_dtype ddt, const void *src, fsdp_dtype sdt,
                   size_t n)
{
    if (ddt == sdt) {
        cast_job j = {.dst = dst, .src = src};
        size_t bytes = n * fsdp_dtype_size(ddt);
        /* overlapping ranges would race between chunks: copy them in one piece */
        bool overlap = (const char *)src < (char *)dst + bytes &&
                       (const char *)dst < (const char *)src + bytes;
        if (overlap)
            memmove(dst, src, bytes);
        else
            fsdp_cpu_parallel_range(ctx, bytes, 4 * FSDP_CPU_GRAIN, copy_range, &j);
        return;
    }
    if (ddt == FSDP_DTYPE_BF16)
        fsdp_cpu_round(ctx, dst, src, n);
    else
        fsdp_cpu_widen(ctx, dst, src, n);
}

static void add_range(void *arg, size_t begin, size_t end, int worker)
{
    const cast_job *j = arg;
    float *d = j->dst;
    const float *a = j->src, *b = j->b;
    for (size_t i = begin; i < end; i++)
        d[i] = a[i] + b[i];
}

void fsdp_cpu_add(fsdp_op_ctx *ctx, float *dst, const float *a, const float *b, size_t n)
{
    cast_job j = {.dst = dst, .src = a, .b = b};
    fsdp_cpu_parallel_range(ctx, n, FSDP_CPU_GRAIN, add_range, &j);
}

/* Blocks [begin, end): each x[i] is widened to double and squared in
 * double; the block sum runs left to right in double and is rounded to
 * fp32 once. A vectorised version must keep this order to give the same
 * bits. */
static void sumsq_range(void *arg, size_t begin, size_t end, int worker)
{
    const cast_job *j = arg;
    const float *x = j->src;
    float *out = j->dst;
    for (size_t k = begin; k < end; k++) {
        size_t i = k * FSDP_NORM_BLOCK;
        size_t stop = i + FSDP_NORM_BLOCK < j->n ? i + FSDP_NORM_BLOCK : j->n;
        double s = 0.0;
        for (; i < stop; i++) {
            double d = x[i];
            s += d * d;
        }
        out[k] = (float)s;
    }
}

void fsdp_cpu_sumsq_blocks(fsdp_op_ctx *ctx, float *out, const float *x, size_t n)
{
    cast_job j = {.dst = out, .src = x, .n = n};
    size_t n_blocks = (n + FSDP_NORM_BLOCK - 1) / FSDP_NORM_BLOCK;
    fsdp_cpu_parallel_range(ctx, n_blocks, FSDP_CPU_GRAIN / FSDP_NORM_BLOCK, sumsq_range, &j);
}
