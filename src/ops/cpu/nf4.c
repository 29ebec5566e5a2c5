/*
 * nf4.c - NF4 dequantization on the cpu (ops.h nf4_dequant; the format is
 * ops/nf4.h): out[i] = code value of element i's nibble * its block's fp32
 * absmax, one fp32 multiply per element, rounded once into ctx->dt.
 *
 * Every element is computed alone, so neither the instruction set nor the
 * team's split can change a bit: the vector kernels look the 16 code
 * values up with a permute (AVX-512: one 16-entry permute; AVX2: two
 * 8-entry permutes and a blend on the index's bit 3), multiply by the
 * block's absmax and store fp32 or round to bf16 exactly as core/bf16.h
 * does (simd.h). Whole blocks go to the rank's team.
 *
 * The 16 values are fsdp_nf4_code (ops/nf4.c: bitsandbytes' quant_map in
 * fp32, checked against the fixture tests/fixtures/nf4/ by test_ops_nf4).
 */
#include <string.h>

#include "ops/cpu/cpu_ops.h"
#include "ops/cpu/simd.h"
#include "ops/nf4.h"
#include "ops/optim_kernels.h"

/* One kernel per instruction set: blocks [0, n_blocks) of codes and absmax
 * into out (dt). */
typedef void (*nf4_kernel)(void *out, fsdp_dtype dt, const uint8_t *codes, const float *absmax,
                           size_t n_blocks);

static void nf4_scalar(void *out, fsdp_dtype dt, const uint8_t *codes, const float *absmax,
                       size_t n_blocks)
{
    for (size_t b = 0; b < n_blocks; b++) {
        const float a = absmax[b];
        const uint8_t *c = codes + b * (FSDP_NF4_BLOCK / 2);
        size_t i0 = b * FSDP_NF4_BLOCK;
        for (size_t k = 0; k < FSDP_NF4_BLOCK / 2; k++) {
            fsdp_cpu_st(out, dt, i0 + 2 * k, fsdp_nf4_code[c[k] >> 4] * a);
            fsdp_cpu_st(out, dt, i0 + 2 * k + 1, fsdp_nf4_code[c[k] & 15] * a);
        }
    }
}

#if FSDP_CPU_X86
/* 8 elements from 4 bytes: each byte twice, the copy of the even element
 * shifted right by 4, both masked to 4 bits, looked up in two halves. */
__attribute__((target("avx2"))) static void nf4_avx2(void *out, fsdp_dtype dt,
                                                     const uint8_t *codes, const float *absmax,
                                                     size_t n_blocks)
{
    const __m256 lo_half = _mm256_loadu_ps(fsdp_nf4_code), hi_half = _mm256_loadu_ps(fsdp_nf4_code + 8);
    const __m256i shifts = _mm256_setr_epi32(4, 0, 4, 0, 4, 0, 4, 0);
    const __m256i mask = _mm256_set1_epi32(15);
    for (size_t i = 0; i < n_blocks * FSDP_NF4_BLOCK; i += 8) {
        int32_t four;
        memcpy(&four, codes + i / 2, 4);
        const __m128i b4 = _mm_cvtsi32_si128(four);
        __m256i idx = _mm256_cvtepu8_epi32(_mm_unpacklo_epi8(b4, b4));
        idx = _mm256_and_si256(_mm256_srlv_epi32(idx, shifts), mask);
        const __m256 lo = _mm256_permutevar8x32_ps(lo_half, idx);
        const __m256 hi = _mm256_permutevar8x32_ps(hi_half, idx);
        const __m256 bit3 = _mm256_castsi256_ps(_mm256_slli_epi32(idx, 28));
        const __m256 v = _mm256_blendv_ps(lo, hi, bit3);
        const __m256 a = _mm256_set1_ps(absmax[i / FSDP_NF4_BLOCK]);
        fsdp_simd_st_avx2(out, dt, i, _mm256_mul_ps(v, a));
    }
}

/* 16 elements from 8 bytes, one 16-entry permute. */
__attribute__((target("avx512f"))) static void nf4_avx512(void *out, fsdp_dtype dt,
                                                          const uint8_t *codes,
                                                          const float *absmax, size_t n_blocks)
{
    const __m512 table = _mm512_loadu_ps(fsdp_nf4_code);
    const __m512i shifts = _mm512_setr_epi32(4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0);
    const __m512i mask = _mm512_set1_epi32(15);
    for (size_t i = 0; i < n_blocks * FSDP_NF4_BLOCK; i += 16) {
        const __m128i b8 = _mm_loadl_epi64((const __m128i *)(codes + i / 2));
        __m512i idx = _mm512_cvtepu8_epi32(_mm_unpacklo_epi8(b8, b8));
        idx = _mm512_and_si512(_mm512_srlv_epi32(idx, shifts), mask);
        const __m512 a = _mm512_set1_ps(absmax[i / FSDP_NF4_BLOCK]);
        fsdp_simd_st_avx512f(out, dt, i, _mm512_mul_ps(_mm512_permutexvar_ps(idx, table), a));
    }
}
#endif

static const nf4_kernel nf4_kernels[FSDP_CPU_ISA_COUNT] = {
    /* [SCALAR]  = */ nf4_scalar,
    /* [SSE41]   = */ NULL, /* falls back to the scalar kernel */
#if FSDP_CPU_X86
    /* [AVX2]    = */ nf4_avx2,
    /* [AVX512F] = */ nf4_avx512,
#endif
};

static nf4_kernel nf4_pick(fsdp_cpu_isa isa)
{
    if (isa == FSDP_CPU_ISA_COUNT)
        isa = fsdp_cpu_isa_best();
    FSDP_ASSERT(fsdp_cpu_isa_supported(isa));
    while (!nf4_kernels[isa])
        isa = (fsdp_cpu_isa)(isa - 1);
    return nf4_kernels[isa];
}

void fsdp_cpu_nf4_dequant_isa(fsdp_cpu_isa isa, void *out, fsdp_dtype dt, const uint8_t *codes,
                              const float *absmax, size_t n)
{
    FSDP_ASSERT(n % FSDP_NF4_BLOCK == 0);
    nf4_pick(isa)(out, dt, codes, absmax, n / FSDP_NF4_BLOCK);
}

typedef struct nf4_job {
    nf4_kernel kernel;
    void *out;
    fsdp_dtype dt;
    const uint8_t *codes;
    const float *absmax;
} nf4_job;

/* blocks [begin, end) */
static void nf4_range(void *arg, size_t begin, size_t end, int worker)
{
    const nf4_job *j = arg;
    j->kernel(fsdp_cpu_at(j->out, j->dt, begin * FSDP_NF4_BLOCK), j->dt,
              j->codes + begin * (FSDP_NF4_BLOCK / 2), j->absmax + begin, end - begin);
}

void fsdp_cpu_nf4_dequant(fsdp_op_ctx *ctx, void *out, const uint8_t *codes, const float *absmax,
                          size_t n)
{
    FSDP_ASSERT(n % FSDP_NF4_BLOCK == 0);
    nf4_job j = {.kernel = nf4_pick(FSDP_CPU_ISA_COUNT), .out = out, .dt = ctx->dt,
                 .codes = codes, .absmax = absmax};
    fsdp_cpu_parallel_range(ctx, n / FSDP_NF4_BLOCK, FSDP_CPU_GRAIN / FSDP_NF4_BLOCK, nf4_range,
                            &j);
}
