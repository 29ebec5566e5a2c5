/*
 * nf4.cu - NF4 dequantization on the GPU (ops.h nf4_dequant; the format is
 * ops/nf4.h): one thread per code byte, whose two elements (the even one in
 * the high nibble) are code value * the block's fp32 absmax, one fp32
 * multiply each (__fmul_rn: never contracted), rounded once into fp32 or
 * bf16 as the cpu kernel does, so both backends give the same bits.
 *
 * The 16 code values come from the host (the cpu kernels' table,
 * ops/cpu/nf4.c) as a kernel argument and are staged in shared memory:
 * neighbouring threads read different entries, which constant memory
 * would serialise.
 */
#include <string.h>

#include "ops/cuda/common.cuh"

extern "C" {
#include "ops/nf4.h"
/* The 16 NF4 code values (ops/cpu/cpu_ops.h; bitsandbytes' quant_map). */
}

struct nf4_table {
    float v[16];
};

/* Bytes [0, n_bytes) of codes: out[2i], out[2i + 1] from byte i. blockDim >= 16. */
template <typename T>
__global__ void nf4_dequant_kernel(T *out, const uint8_t *codes, const float *absmax,
                                   size_t n_bytes, nf4_table table)
{
    __shared__ float code[16];
    if (threadIdx.x < 16)
        code[threadIdx.x] = table.v[threadIdx.x];
    __syncthreads();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n_bytes;
         i += (size_t)gridDim.x * blockDim.x) {
        const unsigned b = codes[i];
        const float a = absmax[i / (FSDP_NF4_BLOCK / 2)];
        fsdp_cu_st(out, 2 * i, __fmul_rn(code[b >> 4], a));
        fsdp_cu_st(out, 2 * i + 1, __fmul_rn(code[b & 15u], a));
    }
}

void fsdp_ops_cuda_nf4_dequant(fsdp_op_ctx *ctx, void *out, const uint8_t *codes,
                               const float *absmax, size_t n)
{
    if (!n || !fsdp_ops_cuda_ok(ctx))
        return;
    if (n % FSDP_NF4_BLOCK) {
        fsdp_ops_cuda_fail(ctx, FSDP_STATUS_INVALID_ARG, "nf4_dequant",
                           "%zu elements is not a whole number of %d-element NF4 blocks", n,
                           FSDP_NF4_BLOCK);
        return;
    }
    nf4_table table;
    memcpy(table.v, fsdp_nf4_code, sizeof table.v);
    cudaStream_t s = fsdp_ops_cuda_stream(ctx);
    size_t n_bytes = n / 2;
    unsigned grid = fsdp_ops_cuda_grid(ctx, n_bytes, 256);
    if (ctx->dt == FSDP_DTYPE_BF16)
        nf4_dequant_kernel<<<grid, 256, 0, s>>>((__nv_bfloat16 *)out, codes, absmax, n_bytes,
                                                table);
    else
        nf4_dequant_kernel<<<grid, 256, 0, s>>>((float *)out, codes, absmax, n_bytes, table);
    fsdp_ops_cuda_launched(ctx, "nf4_dequant");
}
