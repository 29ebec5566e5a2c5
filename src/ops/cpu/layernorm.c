/*
 * layernorm.c - LayerNorm over the last dimension on the cpu (eps 1e-5).
 *
 * inp, out (N, C) in ctx->dt; w, b (C,) in ctx->dt; mean, rstd (N,) fp32,
 * saved by the forward for the backward. Row statistics are summed in
 * double, in index order.
 */
#include <math.h>

#include "ops/cpu/cpu_ops.h"

#define LN_EPS 1e-5

void fsdp_cpu_layernorm_fwd(fsdp_op_ctx *ctx, void *out, float *mean, float *rstd,
                            const void *inp, const void *w, const void *b, int N, int C)
{
    if (N <= 0 || C <= 0)
        return;
    const fsdp_dtype dt = ctx->dt;
    const float *wf = fsdp_cpu_in(ctx, FSDP_CPU_SLOT_1, w, (size_t)C);
    const float *bf = fsdp_cpu_in(ctx, FSDP_CPU_SLOT_2, b, (size_t)C);
    if (!wf || !bf)
        return; /* scratch OOM, reported by sync_error */
    for (int i = 0; i < N; i++) {
        size_t off = (size_t)i * C;
        double s = 0.0;
        for (int c = 0; c < C; c++)
            s += fsdp_cpu_ld(inp, dt, off + c);
        double m = s / C;
        double ss = 0.0;
        for (int c = 0; c < C; c++) {
            double d = fsdp_cpu_ld(inp, dt, off + c) - m;
            ss += d * d;
        }
        float mf = (float)m;
        float rs = (float)(1.0 / sqrt(ss / C + LN_EPS));
        for (int c = 0; c < C; c++) {
            float n = (fsdp_cpu_ld(inp, dt, off + c) - mf) * rs;
            fsdp_cpu_st(out, dt, off + c, n * wf[c] + bf[c]);
        }
        if (mean)
            mean[i] = mf;
        if (rstd)
            rstd[i] = rs;
    }
}

void fsdp_cpu_layernorm_bwd(fsdp_op_ctx *ctx, float *dinp, float *dw, float *db,
                            const float *dout, const void *inp, const void *w, const float *mean,
                            const float *rstd, int N, int C)
{
    if (N <= 0 || C <= 0)
        return;
    const fsdp_dtype dt = ctx->dt;
    const float *wf = fsdp_cpu_in(ctx, FSDP_CPU_SLOT_1, w, (size_t)C);
    /* This call's dw and db are summed over rows in scratch, then added to
     * dw and db once, so the result does not depend on what they held. */
    float *dw_acc = fsdp_cpu_scratch(ctx, FSDP_CPU_SLOT_2, (size_t)C);
    float *db_acc = fsdp_cpu_scratch(ctx, FSDP_CPU_SLOT_3, (size_t)C);
    if (!wf || !dw_acc || !db_acc)
        return; /* scratch OOM, reported by sync_error */
    for (int c = 0; c < C; c++)
        dw_acc[c] = db_acc[c] = 0.0f;
    for (int i = 0; i < N; i++) {
        size_t off = (size_t)i * C;
        const float *dy = dout + off;
        const float m = mean[i], rs = rstd[i];
        /* The two row means the input gradient needs. */
        float dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
        for (int c = 0; c < C; c++) {
            float n = (fsdp_cpu_ld(inp, dt, off + c) - m) * rs;
            float dn = wf[c] * dy[c];
            dnorm_mean += dn;
            dnorm_norm_mean += dn * n;
        }
        dnorm_mean /= (float)C;
        dnorm_norm_mean /= (float)C;
        for (int c = 0; c < C; c++) {
            float n = (fsdp_cpu_ld(inp, dt, off + c) - m) * rs;
            float dn = wf[c] * dy[c];
            db_acc[c] += dy[c];
            dw_acc[c] += n * dy[c];
            if (dinp)
                dinp[off + c] += (dn - dnorm_mean - n * dnorm_norm_mean) * rs;
        }
    }
    for (int c = 0; c < C; c++) {
        if (dw)
            dw[c] += dw_acc[c];
        if (db)
            db[c] += db_acc[c];
    }
}
