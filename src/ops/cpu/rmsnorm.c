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

void fsdp_cpu_rmsnorm_fwd(fsdp_op_ctx *ctx, void *out, float *rstd, const void *inp,
                          const void *w, float eps, int N, int C)
{
    if (N <= 0 || C <= 0)
        return;
    const size_t n = (size_t)N * C;
    const float *x = fsdp_cpu_in(ctx, FSDP_CPU_SLOT_0, inp, n);
    const float *wf = fsdp_cpu_in(ctx, FSDP_CPU_SLOT_1, w, (size_t)C);
    float *y = fsdp_cpu_out(ctx, FSDP_CPU_SLOT_2, out, n);
    if (!x || !wf || !y)
        return; /* scratch OOM, reported by sync_error */
    for (int i = 0; i < N; i++) {
        const float *xr = x + (size_t)i * C;
        float *yr = y + (size_t)i * C;
        float rs = (float)(1.0 / sqrt(row_sumsq(xr, C) / C + (double)eps));
        for (int c = 0; c < C; c++)
            yr[c] = (xr[c] * rs) * wf[c];
        if (rstd)
            rstd[i] = rs;
    }
    fsdp_cpu_out_done(ctx, out, y, n);
}

void fsdp_cpu_rmsnorm_bwd(fsdp_op_ctx *ctx, float *dinp, float *dw, const float *dout,
                          const void *inp, const void *w, const float *rstd, int N, int C)
{
    if (N <= 0 || C <= 0 || (!dinp && !dw))
        return;
    const float *x = fsdp_cpu_in(ctx, FSDP_CPU_SLOT_0, inp, (size_t)N * C);
    const float *wf = fsdp_cpu_in(ctx, FSDP_CPU_SLOT_1, w, (size_t)C);
    /* per row: n = x * rstd and dn = w * dout; then this call's dw, summed
     * over rows in scratch and added to dw once (independent of what dw held) */
    float *nrow = fsdp_cpu_scratch(ctx, FSDP_CPU_SLOT_2, (size_t)C);
    float *dnrow = fsdp_cpu_scratch(ctx, FSDP_CPU_SLOT_3, (size_t)C);
    float *dw_acc = fsdp_cpu_scratch(ctx, FSDP_CPU_SLOT_4, (size_t)C);
    if (!x || !wf || !nrow || !dnrow || !dw_acc)
        return; /* scratch OOM, reported by sync_error */
    for (int c = 0; c < C; c++)
        dw_acc[c] = 0.0f;
    for (int i = 0; i < N; i++) {
        const size_t off = (size_t)i * C;
        const float *xr = x + off, *dy = dout + off;
        const float rs = rstd[i];
        for (int c = 0; c < C; c++) {
            nrow[c] = xr[c] * rs;
            dnrow[c] = wf[c] * dy[c];
        }
        for (int c = 0; c < C; c++)
            dw_acc[c] += nrow[c] * dy[c];
        if (!dinp)
            continue;
        const float m = row_dot(dnrow, nrow, C) / (float)C;
        float *dx = dinp + off;
        for (int c = 0; c < C; c++)
            dx[c] += (dnrow[c] - nrow[c] * m) * rs;
    }
    if (dw)
        for (int c = 0; c < C; c++)
            dw[c] += dw_acc[c];
}
