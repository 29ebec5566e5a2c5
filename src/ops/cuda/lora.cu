/*
 * lora.cu - the LoRA branch of a linear layer on the GPU through cuBLAS:
 * out += scale * (inp @ A^T) @ B^T beside the base product, and its
 * accumulating backward (contracts in ops/ops.h).
 *
 * Shapes: inp (N, C), A (r, C), B (OC, r), u (N, r) in ctx->dt; out a
 * column slice of OC columns with rows ld_out apart, dout (fp32) likewise
 * with ld_dout, u and dv with ld_u (a group's column slices): cuBLAS reads
 * them all through their leading dimensions. Row-major buffers are used as
 * column-major transposes, as in matmul.cu.
 *
 * Every GEMM accumulates in fp32 (CUBLAS_COMPUTE_32F, no TF32). The forward
 * needs no kernel of its own: cuBLAS stores u in ctx->dt (rounded once) and
 * adds scale * u @ B^T into the slice with beta = 1, forming the sum in
 * fp32 and rounding it once, as the cpu does. Backward with bf16 storage:
 * the small operands that meet the fp32 dout (B, u) are widened to fp32, so
 * dv and dB are fp32 products as on the cpu; the products with the large
 * bf16 operands (inp, A) take dv rounded to bf16 (cuBLAS needs one operand
 * type; matmul_bwd rounds dout the same way), with fp32 outputs
 * accumulated. Deterministic for a given GPU model and cuBLAS version.
 */
#include "ops/cuda/common.cuh"

/* Scratch offsets are rounded up to this many bytes (cuBLAS likes aligned
 * operands). */
#define LORA_ALIGN ((size_t)256)

static size_t lora_align(size_t bytes)
{
    return (bytes + LORA_ALIGN - 1) / LORA_ALIGN * LORA_ALIGN;
}

/* Elements a (N, r) slice with rows ld apart spans: the last row ends r past its start. */
static size_t lora_span(int N, int r, int ld)
{
    return (size_t)(N - 1) * ld + r;
}

void fsdp_ops_cuda_lora_fwd(fsdp_op_ctx *ctx, void *out, int ld_out, void *u, int ld_u,
                            const void *inp, const void *A, const void *B, float scale, int N,
                            int C, int r, int OC)
{
    if (N <= 0 || r <= 0 || C < 0 || !fsdp_ops_cuda_ok(ctx))
        return;
    const char *op = "lora_fwd";
    if (A && C == 0) { /* an empty product: u = 0 and out unchanged */
        const size_t dts = fsdp_dtype_size(ctx->dt);
        cudaError_t rc = fsdp_cuda_error_take(cudaMemset2DAsync(
            u, (size_t)ld_u * dts, 0, (size_t)r * dts, (size_t)N, fsdp_ops_cuda_stream(ctx)));
        if (rc != cudaSuccess)
            fsdp_ops_cuda_fail(ctx, FSDP_STATUS_CUDA, op, "cudaMemset2DAsync failed: %s",
                               cudaGetErrorString(rc));
        return;
    }
    /* u^T (r, N; columns ld_u apart) = A (r, C) @ inp^T (C, N) */
    if (A && !fsdp_ops_cuda_gemm(ctx, op, true, false, r, N, C, 1.0f, A, C, 0, inp, C, 0, 0.0f,
                                 u, ctx->dt, ld_u, 0, 1, ctx->dt))
        return;
    if (OC <= 0 || !B)
        return;
    /* out^T (OC, N; columns ld_out apart) += scale * B (OC, r) @ u^T (r, N) */
    fsdp_ops_cuda_gemm(ctx, op, true, false, OC, N, r, scale, B, r, 0, u, ld_u, 0, 1.0f, out,
                       ctx->dt, ld_out, 0, 1, ctx->dt);
}

void fsdp_ops_cuda_lora_bwd(fsdp_op_ctx *ctx, float *dinp, float *dA, float *dB, float *dv,
                            int ld_u, const float *dout, int ld_dout, const void *inp,
                            const void *u, const void *A, const void *B, float scale, int N,
                            int C, int r, int OC)
{
    if (N <= 0 || r <= 0 || C < 0 || (B && OC <= 0) || !fsdp_ops_cuda_ok(ctx))
        return; /* every gradient gets += 0 */
    const char *op = "lora_bwd";
    const bool bf = ctx->dt == FSDP_DTYPE_BF16;
    const size_t n_u = lora_span(N, r, ld_u);
    const void *bf32 = B, *uf32 = u, *dvp = dv;
    if (bf) {
        /* scratch: B (OC, r) and u's span widened, dv's span rounded */
        size_t n_b = B ? (size_t)OC * r : 0;
        size_t off_u = lora_align(n_b * sizeof(float));
        size_t off_dv = off_u + lora_align(n_u * sizeof(float));
        char *s = (char *)fsdp_ops_cuda_scratch(ctx, off_dv + n_u * sizeof(__nv_bfloat16), op);
        if (!s)
            return;
        if (B) {
            fsdp_ops_cuda_cast(ctx, s, FSDP_DTYPE_F32, B, FSDP_DTYPE_BF16, n_b);
            fsdp_ops_cuda_cast(ctx, s + off_u, FSDP_DTYPE_F32, u, FSDP_DTYPE_BF16, n_u);
        }
        bf32 = s;
        uf32 = s + off_u;
        dvp = s + off_dv;
    }
    if (B) {
        /* dv^T (r, N; columns ld_u apart) = scale * B^T (r, OC) @ dout^T (OC, N) */
        if (!fsdp_ops_cuda_gemm(ctx, op, false, false, r, N, OC, scale, bf32, r, 0, dout,
                                ld_dout, 0, 0.0f, dv, FSDP_DTYPE_F32, ld_u, 0, 1,
                                FSDP_DTYPE_F32))
            return;
        /* dB^T (r, OC) += scale * u^T (r, N) @ dout (N, OC) */
        if (dB && !fsdp_ops_cuda_gemm(ctx, op, false, true, r, OC, N, scale, uf32, ld_u, 0, dout,
                                      ld_dout, 0, 1.0f, dB, FSDP_DTYPE_F32, r, 0, 1,
                                      FSDP_DTYPE_F32))
            return;
    }
    if (C == 0 || (!dA && !dinp))
        return;
    if (bf)
        fsdp_ops_cuda_f32_to_bf16(ctx, op, (__nv_bfloat16 *)dvp, dv, n_u);
    /* dA^T (C, r) += inp^T (C, N) @ dv (N, r) */
    if (dA && !fsdp_ops_cuda_gemm(ctx, op, false, true, C, r, N, 1.0f, inp, C, 0, dvp, ld_u, 0,
                                  1.0f, dA, FSDP_DTYPE_F32, C, 0, 1, ctx->dt))
        return;
    /* dinp^T (C, N) += A^T (C, r) @ dv^T (r, N) */
    if (dinp)
        fsdp_ops_cuda_gemm(ctx, op, false, false, C, N, r, 1.0f, A, C, 0, dvp, ld_u, 0, 1.0f, dinp,
                           FSDP_DTYPE_F32, C, 0, 1, ctx->dt);
}
