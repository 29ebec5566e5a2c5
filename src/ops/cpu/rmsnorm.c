/*
 * rmsnorm.c - RMSNorm over the last dimension on the cpu (HF Llama):
 *   out = inp * rstd * w,  rstd = 1 / sqrt(mean(inp^2) + eps).
 *
 * inp, out (N, C) and w (C,) in ctx->dt; rstd (N,) fp32, saved by the
 * forward for the backward. A row's sum of squares runs in double over 8
 * interleaved lanes (lane k takes elements k, k+8, ...) combined in a fixed
 * tree, so the loop vectorises and the bits never depend on the machine;
 * the per-element loops are plain fp32 loops the compiler vectorises
 * without reassociating (bf16 operands are widened into scratch first).
 * The rank's team takes rows in fixed ranges, and for the weight gradient
 * column ranges that each sum every row in row order, so the bits do not
 * depend on the thread count.
 */
#include <math.h>

#include "ops/cpu/cpu_ops.h"

#define RMS_LANES 8

/* sum of x[c]^2 in double, in the fixed lane order described above */
static double row_sumsq(const float *x, int C)
{
    double acc[RMS_LANES] = {0};
    int c = 0;
    for (; c + RMS_LANES <= C; c += RMS_LANES)
        for (int k = 0; k < RMS_LANES; k++)
            acc[k] += (double)x[c + k] * (double)x[c + k];
    for (int k = 0; c < C; c++, k++)
        acc[k] += (double)x[c] * (double)x[c];
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

/* sum of a[c] * b[c] in fp32, same lane order (fp32 lanes, fp32 tree) */
static float row_dot(const float *a, const float *b, int C)
{
    float acc[RMS_LANES] = {0};
    int c = 0;
    for (; c + RMS_LANES <= C; c += RMS_LANES)
        for (int k = 0; k < RMS_LANES; k++)
            acc[k] += a[c + k] * b[c + k];
    for (int k = 0; c < C; c++, k++)
        acc[k] += a[c] * b[c];
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

typedef struct rms_job {
    const float *x, *wf, *rstd_in, *dout;
    float *y, *rstd, *dinp, *dw_acc;
    float *rows; /* bwd: (workers, 2 C): n and dn of a row */
    float eps;
    int N, C;
} rms_job;

static void rms_fwd_rows(void *arg, size_t begin, size_t end, int worker)
{
    const rms_job *j = arg;
    const int C = j->C;
    for (size_t i = begin; i < end; i++) {
        const float *xr = j->x + i * C;
        float *yr = j->y + i * C;
        float rs = (float)(1.0 / sqrt(row_sumsq(xr, C) / C + (double)j->eps));
        for (int c = 0; c < C; c++)
            yr[c] = (xr[c] * rs) * j->wf[c];
        if (j->rstd)
            j->rstd[i] = rs;
    }
}

/* Rows per chunk: about FSDP_CPU_GRAIN elements. */
static size_t rms_grain(int C)
{
    return FSDP_CPU_GRAIN / (size_t)C + 1;
}

void fsdp_cpu_rmsnorm_fwd(fsdp_op_ctx *ctx, void *out, float *rstd, const void *inp,
                          const void *w, float eps, int N, int C)
{
    if (N <= 0 || C <= 0)
        return;
    const size_t n = (size_t)N * C;
    rms_job j = {.rstd = rstd, .eps = eps, .N = N, .C = C};
    j.x = fsdp_cpu_in(ctx, FSDP_CPU_SLOT_0, inp, n);
    j.wf = fsdp_cpu_in(ctx, FSDP_CPU_SLOT_1, w, (size_t)C);
    j.y = fsdp_cpu_out(ctx, FSDP_CPU_SLOT_2, out, n);
    if (!j.x || !j.wf || !j.y)
        return; /* scratch OOM, reported by sync_error */
    fsdp_cpu_parallel_range(ctx, (size_t)N, rms_grain(C), rms_fwd_rows, &j);
    fsdp_cpu_out_done(ctx, out, j.y, n);
}

/* dinp rows: n = x * rstd and dn = w * dout, dx += (dn - n mean(dn n)) rstd. */
static void rms_bwd_rows(void *arg, size_t begin, size_t end, int worker)
{
    const rms_job *j = arg;
    const int C = j->C;
    float *nrow = j->rows + (size_t)worker * 2 * C, *dnrow = nrow + C;
    for (size_t i = begin; i < end; i++) {
        const size_t off = i * C;
        const float *xr = j->x + off, *dy = j->dout + off;
        const float rs = j->rstd_in[i];
        for (int c = 0; c < C; c++) {
            nrow[c] = xr[c] * rs;
            dnrow[c] = j->wf[c] * dy[c];
        }
        const float m = row_dot(dnrow, nrow, C) / (float)C;
        float *dx = j->dinp + off;
        for (int c = 0; c < C; c++)
            dx[c] += (dnrow[c] - nrow[c] * m) * rs;
    }
}

/* dw columns [begin, end): summed over every row in row order (the same
 * order for any chunking). */
static void rms_bwd_cols(void *arg, size_t begin, size_t end, int worker)
{
    const rms_job *j = arg;
    const size_t C = (size_t)j->C;
    float *acc = j->dw_acc;
    for (size_t c = begin; c < end; c++)
        acc[c] = 0.0f;
    for (int i = 0; i < j->N; i++) {
        const float *xr = j->x + i * C, *dy = j->dout + i * C;
        const float rs = j->rstd_in[i];
        for (size_t c = begin; c < end; c++)
            acc[c] += (xr[c] * rs) * dy[c];
    }
}

void fsdp_cpu_rmsnorm_bwd(fsdp_op_ctx *ctx, float *dinp, float *dw, const float *dout,
                          const void *inp, const void *w, const float *rstd, int N, int C)
{
    if (N <= 0 || C <= 0 || (!dinp && !dw))
        return;
    rms_job j = {.rstd_in = rstd, .dout = dout, .dinp = dinp, .N = N, .C = C};
    j.x = fsdp_cpu_in(ctx, FSDP_CPU_SLOT_0, inp, (size_t)N * C);
    j.wf = fsdp_cpu_in(ctx, FSDP_CPU_SLOT_1, w, (size_t)C);
    if (!j.x || !j.wf)
        return; /* scratch OOM, reported by sync_error */
    if (dw) {
        /* this call's dw, summed in scratch and added to dw once
         * (independent of what dw held) */
        j.dw_acc = fsdp_cpu_scratch(ctx, FSDP_CPU_SLOT_4, (size_t)C);
        if (!j.dw_acc)
            return;
        size_t cols = FSDP_CPU_GRAIN / (size_t)N + 1;
        cols = (cols + 15) / 16 * 16; /* whole vectors per chunk */
        fsdp_cpu_parallel_range(ctx, (size_t)C, cols, rms_bwd_cols, &j);
        for (int c = 0; c < C; c++)
            dw[c] += j.dw_acc[c];
    }
    if (dinp) {
        j.rows = fsdp_cpu_scratch(ctx, FSDP_CPU_SLOT_2,
                                  (size_t)fsdp_cpu_threads(ctx) * 2 * (size_t)C);
        if (!j.rows)
            return;
        fsdp_cpu_parallel_range(ctx, (size_t)N, rms_grain(C), rms_bwd_rows, &j);
    }
}
