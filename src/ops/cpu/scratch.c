/*
 * scratch.c - per-context host scratch and failure record for the cpu ops,
 * and the dtype conversions of their inputs and outputs.
 *
 * Scratch holds fp32 copies of bf16 operands and fp32 results before they
 * are rounded to bf16. It is plain malloc'd host memory kept in ctx->backend
 * (created on first use, freed by fsdp_cpu_ops_fini): a simulation artifact
 * that the device accounting deliberately does not count. When it cannot be
 * allocated, the op that needed it does nothing and the failure (OOM, with
 * a message) is held for the sync_error slot, as cuda holds launch errors.
 * A held failure is not logged as an error: it is returned, and whoever
 * receives it decides whether it is one (a caller may expect it and go on,
 * as a test does); FSDP_LOG=debug FSDP_LOG_SUBSYS=ops shows it when held.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "ops/cpu/cpu_ops.h"
#include "ops/cpu/cpu_state.h"

struct fsdp_cpu_ops_state *fsdp_cpu_state(fsdp_op_ctx *ctx)
{
    struct fsdp_cpu_ops_state *s = ctx->backend;
    if (!s) {
        /* A few hundred bytes: if even this fails there is nowhere to record it. */
        s = calloc(1, sizeof *s);
        if (!s) {
            fprintf(stderr, "fsdp: cpu ops: out of host memory creating the op state\n");
            abort();
        }
        ctx->backend = s;
    }
    return s;
}

float *fsdp_cpu_scratch(fsdp_op_ctx *ctx, fsdp_cpu_slot slot, size_t numel)
{
    FSDP_ASSERT(slot >= 0 && slot < FSDP_CPU_SLOT_COUNT);
    struct fsdp_cpu_ops_state *s = fsdp_cpu_state(ctx);
    if (numel == 0)
        numel = 1;
    if (s->numel[slot] >= numel)
        return s->buf[slot];
    /* Grow by at least half again, so slowly rising sizes do not reallocate
     * on every call. Old contents need not survive. */
    size_t want = numel;
    if (want < s->numel[slot] + s->numel[slot] / 2)
        want = s->numel[slot] + s->numel[slot] / 2;
    free(s->buf[slot]);
    s->buf[slot] = NULL;
    s->numel[slot] = 0;
    float *p = want <= SIZE_MAX / sizeof(float) ? malloc(want * sizeof(float)) : NULL;
    if (!p) {
        if (s->err == FSDP_STATUS_OK) {
            char b[32];
            s->err = FSDP_STATUS_OOM;
            snprintf(s->err_msg, sizeof s->err_msg,
                     "rank %d: cpu ops: out of host memory allocating %s of op scratch; "
                     "try a smaller --batch or --seq, or fewer simulated devices",
                     ctx->dev ? ctx->dev->rank : -1,
                     fsdp_fmt_bytes(b, sizeof b, (double)numel * sizeof(float)));
            FSDP_DEBUG(FSDP_SUB_OPS, "held for sync_error: %s", s->err_msg);
        }
        return NULL;
    }
    s->buf[slot] = p;
    s->numel[slot] = want;
    return p;
}

void fsdp_cpu_ops_fail(fsdp_op_ctx *ctx, fsdp_status st)
{
    struct fsdp_cpu_ops_state *s = fsdp_cpu_state(ctx);
    if (st == FSDP_STATUS_OK || s->err != FSDP_STATUS_OK)
        return;
    s->err = st;
    snprintf(s->err_msg, sizeof s->err_msg, "rank %d: %s", ctx->dev ? ctx->dev->rank : -1,
             fsdp_error_msg());
    FSDP_DEBUG(FSDP_SUB_OPS, "held for sync_error: %s", s->err_msg);
}

fsdp_status fsdp_cpu_ops_sync_error(fsdp_op_ctx *ctx)
{
    struct fsdp_cpu_ops_state *s = ctx->backend;
    if (!s || s->err == FSDP_STATUS_OK)
        return FSDP_STATUS_OK;
    fsdp_status st = fsdp_error_set(s->err, "%s", s->err_msg);
    s->err = FSDP_STATUS_OK;
    s->err_msg[0] = '\0';
    return st;
}

void fsdp_cpu_ops_fini(fsdp_op_ctx *ctx)
{
    struct fsdp_cpu_ops_state *s = ctx->backend;
    if (!s)
        return;
    for (int k = 0; k < FSDP_CPU_SLOT_COUNT; k++)
        free(s->buf[k]);
    fsdp_cpu_dnnl_free(s->dnnl);
    free(s);
    ctx->backend = NULL;
}

typedef struct cvt_job {
    const void *src;
    void *dst;
} cvt_job;

static void widen_range(void *arg, size_t begin, size_t end, int worker)
{
    const cvt_job *j = arg;
    const fsdp_bf16 *h = j->src;
    float *f = j->dst;
    for (size_t i = begin; i < end; i++)
        f[i] = fsdp_bf16_to_f32(h[i]);
}

static void round_range(void *arg, size_t begin, size_t end, int worker)
{
    const cvt_job *j = arg;
    const float *f = j->src;
    fsdp_bf16 *h = j->dst;
    for (size_t i = begin; i < end; i++)
        h[i] = fsdp_f32_to_bf16(f[i]);
}

void fsdp_cpu_widen(fsdp_op_ctx *ctx, float *dst, const fsdp_bf16 *src, size_t n)
{
    cvt_job j = {.src = src, .dst = dst};
    fsdp_cpu_parallel_range(ctx, n, FSDP_CPU_GRAIN, widen_range, &j);
}

void fsdp_cpu_round(fsdp_op_ctx *ctx, fsdp_bf16 *dst, const float *src, size_t n)
{
    cvt_job j = {.src = src, .dst = dst};
    fsdp_cpu_parallel_range(ctx, n, FSDP_CPU_GRAIN, round_range, &j);
}

const float *fsdp_cpu_in(fsdp_op_ctx *ctx, fsdp_cpu_slot slot, const void *src, size_t n)
{
    if (ctx->dt != FSDP_DTYPE_BF16)
        return src;
    float *buf = fsdp_cpu_scratch(ctx, slot, n);
    if (buf)
        fsdp_cpu_widen(ctx, buf, src, n);
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
    if (ctx->dt == FSDP_DTYPE_BF16)
        fsdp_cpu_round(ctx, dst, buf, n);
}
