/*
 * layernorm.c - LayerNorm over the last dimension on the cpu (eps 1e-5).
 *
 * inp, out (N, C) in ctx->dt; w, b (C,) in ctx->dt; mean, rstd (N,) fp32,
 * saved by the forward for the backward. Row statistics are summed in
 * double, in index order. The forward and the input gradient go to the
 * rank's team by rows; the weight and bias gradients, which sum over rows,
 * by columns, each column summing its rows in order.
 */
#include <math.h>

#include "ops/cpu/cpu_ops.h"

#define LN_EPS 1e-5

typedef struct ln_job {
    void *out;
    float *mean, *rstd;
    const void *inp;
    const float *wf, *bf;
    float *dinp, *dw_acc, *db_acc;
    const float *dout;
    const float *mean_in, *rstd_in;
    int N, C;
    fsdp_dtype dt;
} ln_job;

static void ln_fwd_rows(void *arg, size_t begin, size_t end, int worker)
{
    const ln_job *j = arg;
    const int C = j->C;
    const fsdp_dtype dt = j->dt;
    for (size_t i = begin; i < end; i++) {
        size_t off = i * C;
        double s = 0.0;
        for (int c = 0; c < C; c++)
            s += fsdp_cpu_ld(j->inp, dt, off + c);
        double m = s / C;
        double ss = 0.0;
        for (int c = 0; c < C; c++) {
            double d = fsdp_cpu_ld(j->inp, dt, off + c) - m;
            ss += d * d;
        }
        float mf = (float)m;
        float rs = (float)(1.0 / sqrt(ss / C + LN_EPS));
        for (int c = 0; c < C; c++) {
            float n = (fsdp_cpu_ld(j->inp, dt, off + c) - mf) * rs;
            fsdp_cpu_st(j->out, dt, off + c, n * j->wf[c] + j->bf[c]);
        }
        if (j->mean)
            j->mean[i] = mf;
        if (j->rstd)
            j->rstd[i] = rs;
    }
}

void fsdp_cpu_layernorm_fwd(fsdp_op_ctx *ctx, void *out, float *mean, float *rstd,
                            const void *inp, const void *w, const void *b, int N, int C)
{
    if (N <= 0 || C <= 0)
        return;
    ln_job j = {.out = out, .mean = mean, .rstd = rstd, .inp = inp, .N = N, .C = C,
                .dt = ctx->dt};
    j.wf = fsdp_cpu_in(ctx, FSDP_CPU_SLOT_1, w, (size_t)C);
    j.bf = fsdp_cpu_in(ctx, FSDP_CPU_SLOT_2, b, (size_t)C);
    if (!j.wf || !j.bf)
        return; /* scratch OOM, reported by sync_error */
    fsdp_cpu_parallel_range(ctx, (size_t)N, FSDP_CPU_GRAIN / (size_t)C + 1, ln_fwd_rows, &j);
}

/* dinp rows [begin, end) */
static void ln_bwd_rows(void *arg, size_t begin, size_t end, int worker)
{
    const ln_job *j = arg;
    const int C = j->C;
    const fsdp_dtype dt = j->dt;
    for (size_t i = begin; i < end; i++) {
        size_t off = i * C;
        const float *dy = j->dout + off;
        const float m = j->mean_in[i], rs = j->rstd_in[i];
        /* The two row means the input gradient needs. */
        float dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
        for (int c = 0; c < C; c++) {
            float n = (fsdp_cpu_ld(j->inp, dt, off + c) - m) * rs;
            float dn = j->wf[c] * dy[c];
            dnorm_mean += dn;
            dnorm_norm_mean += dn * n;
        }
        dnorm_mean /= (float)C;
        dnorm_norm_mean /= (float)C;
        for (int c = 0; c < C; c++) {
            float n = (fsdp_cpu_ld(j->inp, dt, off + c) - m) * rs;
            float dn = j->wf[c] * dy[c];
            j->dinp[off + c] += (dn - dnorm_mean - n * dnorm_norm_mean) * rs;
        }
    }
}

/* dw, db partial sums for columns [begin, end), rows in order */
static void ln_bwd_cols(void *arg, size_t begin, size_t end, int worker)
{
    const ln_job *j = arg;
    const int C = j->C;
    const fsdp_dtype dt = j->dt;
    for (size_t c = begin; c < end; c++)
        j->dw_acc[c] = j->db_acc[c] = 0.0f;
    for (int i = 0; i < j->N; i++) {
        size_t off = (size_t)i * C;
        const float *dy = j->dout + off;
        const float m = j->mean_in[i], rs = j->rstd_in[i];
        for (size_t c = begin; c < end; c++) {
            float n = (fsdp_cpu_ld(j->inp, dt, off + c) - m) * rs;
            j->db_acc[c] += dy[c];
            j->dw_acc[c] += n * dy[c];
        }
    }
}

void fsdp_cpu_layernorm_bwd(fsdp_op_ctx *ctx, float *dinp, float *dw, float *db,
                            const float *dout, const void *inp, const void *w, const float *mean,
                            const float *rstd, int N, int C)
{
    if (N <= 0 || C <= 0)
        return;
    ln_job j = {.inp = inp, .dinp = dinp, .dout = dout, .mean_in = mean, .rstd_in = rstd,
                .N = N, .C = C, .dt = ctx->dt};
    j.wf = fsdp_cpu_in(ctx, FSDP_CPU_SLOT_1, w, (size_t)C);
    /* This call's dw and db are summed over rows in scratch, then added to
     * dw and db once, so the result does not depend on what they held. */
    j.dw_acc = fsdp_cpu_scratch(ctx, FSDP_CPU_SLOT_2, (size_t)C);
    j.db_acc = fsdp_cpu_scratch(ctx, FSDP_CPU_SLOT_3, (size_t)C);
    if (!j.wf || !j.dw_acc || !j.db_acc)
        return; /* scratch OOM, reported by sync_error */
    if (dinp)
        fsdp_cpu_parallel_range(ctx, (size_t)N, FSDP_CPU_GRAIN / (size_t)C + 1, ln_bwd_rows, &j);
    if (dw || db) {
        fsdp_cpu_parallel_range(ctx, (size_t)C, 64, ln_bwd_cols, &j);
        for (int c = 0; c < C; c++) {
            if (dw)
                dw[c] += j.dw_acc[c];
            if (db)
                db[c] += j.db_acc[c];
        }
    }
}
