/*
 * scratch.c - per-context host scratch and BLAS setup for the cpu ops.
 *
 * Scratch holds fp32 copies of bf16 operands and fp32 results before they
 * are rounded to bf16. It is plain malloc'd host memory kept in ctx->backend
 * (created on first use, freed by fsdp_cpu_ops_fini): a simulation artifact
 * that the device accounting deliberately does not count.
 */
#include <cblas.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops/cpu/cpu_ops.h"

struct fsdp_cpu_ops_state {
    float *buf[FSDP_CPU_SLOT_COUNT];
    size_t numel[FSDP_CPU_SLOT_COUNT]; /* capacity of buf[k], elements */
};

static void cpu_oom(size_t bytes)
{
    fprintf(stderr,
            "fsdp: cpu ops: out of host memory allocating %zu bytes of op scratch; "
            "use smaller --batch/--seq or fewer simulated devices\n",
            bytes);
    abort();
}

float *fsdp_cpu_scratch(fsdp_op_ctx *ctx, fsdp_cpu_slot slot, size_t numel)
{
    FSDP_ASSERT(slot >= 0 && slot < FSDP_CPU_SLOT_COUNT);
    struct fsdp_cpu_ops_state *s = ctx->backend;
    if (!s) {
        s = calloc(1, sizeof *s);
        if (!s)
            cpu_oom(sizeof *s);
        ctx->backend = s;
    }
    if (numel == 0)
        numel = 1;
    if (s->numel[slot] < numel) {
        /* Grow by at least half again, so slowly rising sizes do not
         * reallocate on every call. Old contents need not survive. */
        size_t want = numel;
        if (want < s->numel[slot] + s->numel[slot] / 2)
            want = s->numel[slot] + s->numel[slot] / 2;
        free(s->buf[slot]);
        s->buf[slot] = NULL;
        s->numel[slot] = 0;
        if (want > SIZE_MAX / sizeof(float))
            cpu_oom(SIZE_MAX);
        float *p = malloc(want * sizeof(float));
        if (!p)
            cpu_oom(want * sizeof(float));
        s->buf[slot] = p;
        s->numel[slot] = want;
    }
    return s->buf[slot];
}

void fsdp_cpu_ops_fini(fsdp_op_ctx *ctx)
{
    struct fsdp_cpu_ops_state *s = ctx->backend;
    if (!s)
        return;
    for (int k = 0; k < FSDP_CPU_SLOT_COUNT; k++)
        free(s->buf[k]);
    free(s);
    ctx->backend = NULL;
}

static pthread_once_t blas_once = PTHREAD_ONCE_INIT;

static void blas_one_thread(void) { openblas_set_num_threads(1); }

void fsdp_cpu_blas_init(void) { pthread_once(&blas_once, blas_one_thread); }

const float *fsdp_cpu_in(fsdp_op_ctx *ctx, fsdp_cpu_slot slot, const void *src, size_t n)
{
    if (ctx->dt != FSDP_DTYPE_BF16)
        return src;
    float *buf = fsdp_cpu_scratch(ctx, slot, n);
    const fsdp_bf16 *h = src;
    for (size_t i = 0; i < n; i++)
        buf[i] = fsdp_bf16_to_f32(h[i]);
    return buf;
}

float *fsdp_cpu_out(fsdp_op_ctx *ctx, fsdp_cpu_slot slot, void *dst, size_t n)
{
    if (ctx->dt != FSDP_DTYPE_BF16)
        return dst;
    return fsdp_cpu_scratch(ctx, slot, n);
}

void fsdp_cpu_out_done(fsdp_op_ctx *ctx, void *dst, const float *buf, size_t n)
{
    if (ctx->dt != FSDP_DTYPE_BF16)
        return;
    fsdp_bf16 *h = dst;
    for (size_t i = 0; i < n; i++)
        h[i] = fsdp_f32_to_bf16(buf[i]);
}
