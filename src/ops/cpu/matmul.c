/*
 * matmul.c - linear layer on the cpu: out = inp @ w^T + bias, and its
 * backward, as tiled GEMMs on the rank's team (gemm.c).
 *
 * Shapes (llm.c): inp (N, C), w (OC, C) row-major, bias (OC,) or NULL,
 * out (N, OC). With bf16 storage the products take the bf16 operands
 * directly where the CPU has bf16 dot products (fp32 accumulation; in the
 * backward the fp32 dout is rounded to bf16 first, as on cuda); elsewhere
 * the operands are widened and multiplied in fp32. Either way the output is
 * formed in fp32, bias added, and rounded once.
 */
#include "ops/cpu/blas.h"
#include "ops/cpu/cpu_ops.h"

typedef struct bias_job {
    float *y;
    const float *bias;
    const float *dout;
    float *acc;
    int N, OC;
} bias_job;

/* rows [begin, end) of y += bias */
static void bias_add_rows(void *arg, size_t begin, size_t end, int worker)
{
    const bias_job *j = arg;
    for (size_t i = begin; i < end; i++) {
        float *row = j->y + i * (size_t)j->OC;
        for (int o = 0; o < j->OC; o++)
            row[o] += j->bias[o];
    }
}

/* columns [begin, end) of dout summed over every row, rows in order */
static void bias_sum_cols(void *arg, size_t begin, size_t end, int worker)
{
    const bias_job *j = arg;
    for (size_t o = begin; o < end; o++)
        j->acc[o] = 0.0f;
    for (int i = 0; i < j->N; i++) {
        const float *row = j->dout + (size_t)i * j->OC;
        for (size_t o = begin; o < end; o++)
            j->acc[o] += row[o];
    }
}

void fsdp_cpu_matmul_fwd(fsdp_op_ctx *ctx, void *out, const void *inp, const void *w,
                         const void *bias, int N, int C, int OC)
{
    if (N <= 0 || OC <= 0)
        return;
    size_t n_out = (size_t)N * OC;
    float *y = fsdp_cpu_out(ctx, FSDP_CPU_SLOT_2, out, n_out);
    if (!y)
        return; /* scratch OOM, reported by sync_error */
    if (C > 0 && ctx->dt == FSDP_DTYPE_BF16 && fsdp_cpu_blas_bf16_dot()) {
        /* y (N, OC) = x (N, C) @ w^T, bf16 products */
        fsdp_cpu_gemm_bf16(ctx, false, true, N, OC, C, inp, C, w, C, 0.0f, y, OC);
    } else {
        const float *x = fsdp_cpu_in(ctx, FSDP_CPU_SLOT_0, inp, (size_t)N * C);
        const float *wf = fsdp_cpu_in(ctx, FSDP_CPU_SLOT_1, w, (size_t)OC * C);
        if (!x || !wf)
            return;
        /* y (N, OC) = x (N, C) @ wf^T; with C == 0 sgemm only scales y by beta. */
        fsdp_cpu_gemm(ctx, false, true, N, OC, C, 1.0f, x, C, wf, C, 0.0f, y, OC);
    }
    if (bias) {
        const float *bf = fsdp_cpu_in(ctx, FSDP_CPU_SLOT_3, bias, (size_t)OC);
        if (!bf)
            return;
        bias_job j = {.y = y, .bias = bf, .OC = OC};
        fsdp_cpu_parallel_range(ctx, (size_t)N, FSDP_CPU_GRAIN / (size_t)OC + 1, bias_add_rows,
                                &j);
    }
    fsdp_cpu_out_done(ctx, out, y, n_out);
}

/* dinp += dout @ w and dw += dout^T @ inp with bf16 products: dout is
 * rounded to bf16 once, into scratch. */
static void matmul_bwd_bf16(fsdp_op_ctx *ctx, float *dinp, float *dw, const float *dout,
                            const fsdp_bf16 *x, const fsdp_bf16 *w, int N, int C, int OC)
{
    size_t n = (size_t)N * OC;
    fsdp_bf16 *d = (fsdp_bf16 *)fsdp_cpu_scratch(ctx, FSDP_CPU_SLOT_0, (n + 1) / 2);
    if (!d)
        return; /* scratch OOM, reported by sync_error */
    fsdp_cpu_round(ctx, d, dout, n);
    if (dinp) /* dinp (N, C) += d (N, OC) @ w (OC, C) */
        fsdp_cpu_gemm_bf16(ctx, false, false, N, C, OC, d, OC, w, C, 1.0f, dinp, C);
    if (dw) /* dw (OC, C) += d^T (OC, N) @ x (N, C) */
        fsdp_cpu_gemm_bf16(ctx, true, false, OC, C, N, d, OC, x, C, 1.0f, dw, C);
}

void fsdp_cpu_matmul_bwd(fsdp_op_ctx *ctx, float *dinp, float *dw, float *dbias,
                         const float *dout, const void *inp, const void *w, int N, int C, int OC)
{
    if (N <= 0 || OC <= 0 || C < 0)
        return;
    if (C > 0 && (dinp || dw) && ctx->dt == FSDP_DTYPE_BF16 && fsdp_cpu_blas_bf16_dot()) {
        matmul_bwd_bf16(ctx, dinp, dw, dout, inp, w, N, C, OC);
    } else {
        if (dinp && C > 0) {
            /* dinp (N, C) += dout (N, OC) @ w (OC, C) */
            const float *wf = fsdp_cpu_in(ctx, FSDP_CPU_SLOT_1, w, (size_t)OC * C);
            if (!wf)
                return; /* scratch OOM, reported by sync_error */
            fsdp_cpu_gemm(ctx, false, false, N, C, OC, 1.0f, dout, OC, wf, C, 1.0f, dinp, C);
        }
        if (dw && C > 0) {
            /* dw (OC, C) += dout^T (OC, N) @ inp (N, C) */
            const float *x = fsdp_cpu_in(ctx, FSDP_CPU_SLOT_0, inp, (size_t)N * C);
            if (!x)
                return;
            fsdp_cpu_gemm(ctx, true, false, OC, C, N, 1.0f, dout, OC, x, C, 1.0f, dw, C);
        }
    }
    if (dbias) {
        /* Column sums of dout, rows in order, added to dbias once. */
        float *acc = fsdp_cpu_scratch(ctx, FSDP_CPU_SLOT_2, (size_t)OC);
        if (!acc)
            return;
        bias_job j = {.dout = dout, .acc = acc, .N = N, .OC = OC};
        fsdp_cpu_parallel_range(ctx, (size_t)OC, 64, bias_sum_cols, &j);
        for (int o = 0; o < OC; o++)
            dbias[o] += acc[o];
    }
}
