/*
 * matmul.c - linear layer on the cpu: out = inp @ w^T + bias, and its
 * backward, through OpenBLAS sgemm on the rank's own thread.
 *
 * Shapes (llm.c): inp (N, C), w (OC, C) row-major, bias (OC,) or NULL,
 * out (N, OC). bf16 operands are widened into scratch, the product is taken
 * in fp32 and the output rounded once.
 */
#include <cblas.h>

#include "ops/cpu/cpu_ops.h"

void fsdp_cpu_matmul_fwd(fsdp_op_ctx *ctx, void *out, const void *inp, const void *w,
                         const void *bias, int N, int C, int OC)
{
    if (N <= 0 || OC <= 0)
        return;
    fsdp_cpu_blas_init();
    size_t n_out = (size_t)N * OC;
    const float *x = fsdp_cpu_in(ctx, FSDP_CPU_SLOT_0, inp, (size_t)N * C);
    const float *wf = fsdp_cpu_in(ctx, FSDP_CPU_SLOT_1, w, (size_t)OC * C);
    float *y = fsdp_cpu_out(ctx, FSDP_CPU_SLOT_2, out, n_out);
    if (!x || !wf || !y)
        return; /* scratch OOM, reported by sync_error */

    /* y (N, OC) = x (N, C) @ wf^T; with C == 0 sgemm only scales y by beta. */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, C, 1.0f, x, C, wf, C, 0.0f, y,
                OC);
    if (bias) {
        const float *bf = fsdp_cpu_in(ctx, FSDP_CPU_SLOT_3, bias, (size_t)OC);
        if (!bf)
            return;
        for (int i = 0; i < N; i++) {
            float *row = y + (size_t)i * OC;
            for (int o = 0; o < OC; o++)
                row[o] += bf[o];
        }
    }
    fsdp_cpu_out_done(ctx, out, y, n_out);
}

void fsdp_cpu_matmul_bwd(fsdp_op_ctx *ctx, float *dinp, float *dw, float *dbias,
                         const float *dout, const void *inp, const void *w, int N, int C, int OC)
{
    if (N <= 0 || OC <= 0 || C < 0)
        return;
    fsdp_cpu_blas_init();
    if (dinp && C > 0) {
        /* dinp (N, C) += dout (N, OC) @ w (OC, C) */
        const float *wf = fsdp_cpu_in(ctx, FSDP_CPU_SLOT_1, w, (size_t)OC * C);
        if (!wf)
            return; /* scratch OOM, reported by sync_error */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, OC, 1.0f, dout, OC, wf, C,
                    1.0f, dinp, C);
    }
    if (dw && C > 0) {
        /* dw (OC, C) += dout^T (OC, N) @ inp (N, C) */
        const float *x = fsdp_cpu_in(ctx, FSDP_CPU_SLOT_0, inp, (size_t)N * C);
        if (!x)
            return;
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, N, 1.0f, dout, OC, x, C, 1.0f,
                    dw, C);
    }
    if (dbias) {
        /* Column sums of dout, rows in order, added to dbias once. */
        float *acc = fsdp_cpu_scratch(ctx, FSDP_CPU_SLOT_2, (size_t)OC);
        if (!acc)
            return;
        for (int o = 0; o < OC; o++)
            acc[o] = 0.0f;
        for (int i = 0; i < N; i++) {
            const float *row = dout + (size_t)i * OC;
            for (int o = 0; o < OC; o++)
                acc[o] += row[o];
        }
        for (int o = 0; o < OC; o++)
            dbias[o] += acc[o];
    }
}
