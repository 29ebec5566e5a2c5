/*
 * lora.c - the LoRA branch of a linear layer on the cpu (PEFT's): beside the
 * base product matmul_fwd wrote, out += scale * (inp @ A^T) @ B^T, and its
 * accumulating backward, as tiled GEMMs on the rank's team (gemm.c).
 *
 * Shapes: inp (N, C), A (r, C), B (OC, r), u (N, r) = inp @ A^T kept for the
 * backward; out is a column slice of OC columns whose rows lie ld_out apart
 * (the q of a fused q|k|v output), dout likewise with ld_dout, and u and dv
 * column slices with ld_u (a group's (N, n r) buffers). r is small (8 to
 * 64), so every product is thin and cheap next to the base layer's, and
 * bound by reading inp, dinp and dout: a group of adapters on one input
 * reads inp (and dinp) once for its u's, dA's and dinp instead of n times.
 *
 * bf16 storage: the operands are widened to fp32 and multiplied in fp32 (no
 * bf16 dot products: the branch is a few percent of the layer's work, and
 * widened operands keep one code path). u is rounded to bf16 when stored
 * and the rounded u feeds the second product, as PyTorch's bf16 lora_B(
 * lora_A(x)) does and as the backward (which reads the stored u) sees it.
 * The out slice is widened, the scaled product added in fp32 by the GEMM
 * (beta = 1) and each element rounded once. Gradients are fp32 throughout.
 *
 * Threads never change results: the GEMMs tile by shape only (gemm.c) and
 * the strided copies split rows by a grain fixed by the shape.
 */
#include <string.h>

#include "ops/cpu/cpu_ops.h"

typedef struct slice_job {
    void *slice;     /* (N, ld) in ctx->dt; the first OC columns of each row */
    float *dense;    /* (N, OC) fp32 */
    int ld, OC;
} slice_job;

/* rows [begin, end): dense = the bf16 slice widened */
static void slice_widen_rows(void *arg, size_t begin, size_t end, int worker)
{
    const slice_job *j = arg;
    for (size_t i = begin; i < end; i++) {
        const fsdp_bf16 *src = (const fsdp_bf16 *)j->slice + i * (size_t)j->ld;
        float *dst = j->dense + i * (size_t)j->OC;
        for (int o = 0; o < j->OC; o++)
            dst[o] = fsdp_bf16_to_f32(src[o]);
    }
}

/* rows [begin, end): the bf16 slice = dense rounded to nearest even */
static void slice_round_rows(void *arg, size_t begin, size_t end, int worker)
{
    const slice_job *j = arg;
    for (size_t i = begin; i < end; i++) {
        fsdp_bf16 *dst = (fsdp_bf16 *)j->slice + i * (size_t)j->ld;
        const float *src = j->dense + i * (size_t)j->OC;
        for (int o = 0; o < j->OC; o++)
            dst[o] = fsdp_f32_to_bf16(src[o]);
    }
}

/* Rows of the slice per chunk: about FSDP_CPU_GRAIN elements. */
static size_t slice_grain(int OC)
{
    return FSDP_CPU_GRAIN / (size_t)OC + 1;
}

/* u (N, r; rows ld_u apart, ctx->dt) as dense fp32 (N, r) in scratch slot (NULL: OOM). */
static float *u_widened(fsdp_op_ctx *ctx, fsdp_cpu_slot slot, const void *u, int ld_u, int N,
                        int r)
{
    float *uf = fsdp_cpu_scratch(ctx, slot, (size_t)N * r);
    if (!uf)
        return NULL;
    slice_job j = {.slice = (void *)u, .dense = uf, .ld = ld_u, .OC = r};
    fsdp_cpu_parallel_range(ctx, (size_t)N, slice_grain(r), slice_widen_rows, &j);
    return uf;
}

/* bf16 forward: u rounded on store, out's slice widened, added to, rounded. */
static void lora_fwd_bf16(fsdp_op_ctx *ctx, fsdp_bf16 *out, int ld_out, fsdp_bf16 *u, int ld_u,
                          const void *inp, const void *A, const void *B, float scale, int N, int C,
                          int r, int OC)
{
    float *uf;
    if (A) {
        const float *x = fsdp_cpu_in(ctx, FSDP_CPU_SLOT_0, inp, (size_t)N * C);
        const float *af = fsdp_cpu_in(ctx, FSDP_CPU_SLOT_1, A, (size_t)r * C);
        uf = fsdp_cpu_scratch(ctx, FSDP_CPU_SLOT_2, (size_t)N * r);
        if (!x || !af || !uf)
            return; /* scratch OOM, reported by sync_error */
        /* uf (N, r) = x (N, C) @ af^T */
        fsdp_cpu_gemm(ctx, false, true, N, r, C, 1.0f, x, C, af, C, 0.0f, uf, r);
        /* u = uf rounded; uf keeps the rounded values for the second product */
        slice_job ju = {.slice = u, .dense = uf, .ld = ld_u, .OC = r};
        fsdp_cpu_parallel_range(ctx, (size_t)N, slice_grain(r), slice_round_rows, &ju);
    }
    if (OC <= 0 || !B)
        return;
    uf = u_widened(ctx, FSDP_CPU_SLOT_2, u, ld_u, N, r);
    const float *bf = fsdp_cpu_in(ctx, FSDP_CPU_SLOT_3, B, (size_t)OC * r);
    float *y = fsdp_cpu_scratch(ctx, FSDP_CPU_SLOT_4, (size_t)N * OC);
    if (!uf || !bf || !y)
        return;
    slice_job j = {.slice = out, .dense = y, .ld = ld_out, .OC = OC};
    fsdp_cpu_parallel_range(ctx, (size_t)N, slice_grain(OC), slice_widen_rows, &j);
    /* y (N, OC) += scale * uf (N, r) @ bf^T */
    fsdp_cpu_gemm(ctx, false, true, N, OC, r, scale, uf, r, bf, r, 1.0f, y, OC);
    fsdp_cpu_parallel_range(ctx, (size_t)N, slice_grain(OC), slice_round_rows, &j);
}

void fsdp_cpu_lora_fwd(fsdp_op_ctx *ctx, void *out, int ld_out, void *u, int ld_u,
                       const void *inp, const void *A, const void *B, float scale, int N, int C,
                       int r, int OC)
{
    if (N <= 0 || r <= 0 || C < 0)
        return;
    FSDP_ASSERT(ld_u >= r && (OC <= 0 || !B || ld_out >= OC));
    const size_t dts = fsdp_dtype_size(ctx->dt);
    if (A && C == 0) { /* an empty product: u = 0 and out unchanged */
        for (int n = 0; n < N; n++)
            memset((char *)u + (size_t)n * ld_u * dts, 0, (size_t)r * dts);
        return;
    }
    if (ctx->dt == FSDP_DTYPE_BF16) {
        lora_fwd_bf16(ctx, out, ld_out, u, ld_u, inp, A, B, scale, N, C, r, OC);
        return;
    }
    /* u (N, r) = inp (N, C) @ A^T */
    if (A)
        fsdp_cpu_gemm(ctx, false, true, N, r, C, 1.0f, inp, C, A, C, 0.0f, u, ld_u);
    /* out (N, OC; rows ld_out apart) += scale * u (N, r) @ B^T */
    if (OC > 0 && B)
        fsdp_cpu_gemm(ctx, false, true, N, OC, r, scale, u, ld_u, B, r, 1.0f, out, ld_out);
}

void fsdp_cpu_lora_bwd(fsdp_op_ctx *ctx, float *dinp, float *dA, float *dB, float *dv, int ld_u,
                       const float *dout, int ld_dout, const void *inp, const void *u,
                       const void *A, const void *B, float scale, int N, int C, int r, int OC)
{
    if (N <= 0 || r <= 0 || C < 0 || (B && OC <= 0))
        return; /* every gradient gets += 0 */
    FSDP_ASSERT(ld_u >= r && (!B || ld_dout >= OC));
    if (B) {
        /* dv (N, r) = scale * dout (N, OC) @ B (OC, r) */
        const float *bf = fsdp_cpu_in(ctx, FSDP_CPU_SLOT_3, B, (size_t)OC * r);
        if (!bf)
            return; /* scratch OOM, reported by sync_error */
        fsdp_cpu_gemm(ctx, false, false, N, r, OC, scale, dout, ld_dout, bf, r, 0.0f, dv, ld_u);
        if (dB) {
            /* dB (OC, r) += scale * dout^T (OC, N) @ u (N, r) */
            bool wide = ctx->dt == FSDP_DTYPE_BF16;
            const float *uf = wide ? u_widened(ctx, FSDP_CPU_SLOT_2, u, ld_u, N, r) : u;
            if (!uf)
                return;
            fsdp_cpu_gemm(ctx, true, false, OC, r, N, scale, dout, ld_dout, uf, wide ? r : ld_u,
                          1.0f, dB, r);
        }
    }
    if (C == 0)
        return;
    if (dA) {
        /* dA (r, C) += dv^T (r, N) @ inp (N, C) */
        const float *x = fsdp_cpu_in(ctx, FSDP_CPU_SLOT_0, inp, (size_t)N * C);
        if (!x)
            return;
        fsdp_cpu_gemm(ctx, true, false, r, C, N, 1.0f, dv, ld_u, x, C, 1.0f, dA, C);
    }
    if (dinp) {
        /* dinp (N, C) += dv (N, r) @ A (r, C) */
        const float *af = fsdp_cpu_in(ctx, FSDP_CPU_SLOT_1, A, (size_t)r * C);
        if (!af)
            return;
        fsdp_cpu_gemm(ctx, false, false, N, C, r, 1.0f, dv, ld_u, af, C, 1.0f, dinp, C);
    }
}
