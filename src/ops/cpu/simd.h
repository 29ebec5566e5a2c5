/*
 * simd.h - helpers shared by the vectorised host optimizer kernels
 * (adamw.c, sgd.c): fp32 -> bf16 stores that round exactly as
 * fsdp_f32_to_bf16 (core/bf16.h) does, one per instruction set. Each is
 * compiled for its own target (the build's baseline is x86-64-v2), so
 * include this only from files whose callers carry the same attribute.
 */
#ifndef FSDP_OPS_CPU_SIMD_H
#define FSDP_OPS_CPU_SIMD_H

#include <stddef.h>

#include "core/bf16.h"
#include "fsdp/fsdp.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define FSDP_CPU_X86 1

/* The vector instruction sets the host kernels are written for, as
 * X(isa, TARGET, V, W, PFX): the kernel's name suffix, its target attribute,
 * the fp32 vector type, its width in floats and the intrinsics' prefix
 * (PFX##_add_ps). A file generates one kernel per set from one body with
 * FSDP_CPU_EACH_SIMD(ITS_KERNEL), so every width runs the same operations in
 * the same order; each body stores bf16 through fsdp_bf16_store_##isa. */
#define FSDP_CPU_EACH_SIMD(X)          \
    X(sse41, "sse4.1", __m128, 4, _mm) \
    X(avx2, "avx2", __m256, 8, _mm256) \
    X(avx512f, "avx512f", __m512, 16, _mm512)

/* Round W lanes of x to bf16 (nearest even, NaNs quieted: core/bf16.h) and
 * store out[0 .. W), for the SSE4.1 and AVX2 sets (VI the integer vector
 * type, SI the suffix of its bitwise intrinsics); PACK16 stores the W
 * results, each in the low half of a 32-bit lane and <= 0xffff. */
#define FSDP_BF16_STORE_BLENDV(isa, TARGET, V, VI, PFX, SI, PACK16)                          \
    __attribute__((target(TARGET))) static inline void fsdp_bf16_store_##isa(fsdp_bf16 *out, \
                                                                             V x)            \
    {                                                                                        \
        const VI u = PFX##_castps_##SI(x);                                                   \
        const VI abs = PFX##_and_##SI(u, PFX##_set1_epi32(0x7fffffff));                      \
        const VI is_nan = PFX##_cmpgt_epi32(abs, PFX##_set1_epi32(0x7f800000));              \
        const VI hi = PFX##_srli_epi32(u, 16);                                               \
        const VI lsb = PFX##_and_##SI(hi, PFX##_set1_epi32(1));                              \
        const VI sum = PFX##_add_epi32(PFX##_add_epi32(u, PFX##_set1_epi32(0x7fff)), lsb);   \
        const VI rounded = PFX##_srli_epi32(sum, 16);                                        \
        const VI quiet = PFX##_or_##SI(hi, PFX##_set1_epi32(0x40));                          \
        PACK16(out, PFX##_blendv_epi8(rounded, quiet, is_nan));                              \
    }

/* 4 results: packus saturates, and the values are exact in 16 bits. */
__attribute__((target("sse4.1"))) static inline void fsdp_bf16_pack_sse41(fsdp_bf16 *out,
                                                                          __m128i r)
{
    _mm_storel_epi64((__m128i *)out, _mm_packus_epi32(r, r));
}

/* 8 results: packus works per 128-bit lane, giving qwords (r0..3, r0..3,
 * r4..7, r4..7); keep qwords 0 and 2. */
__attribute__((target("avx2"))) static inline void fsdp_bf16_pack_avx2(fsdp_bf16 *out, __m256i r)
{
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
    _mm_storeu_si128((__m128i *)out, _mm256_castsi256_si128(packed));
}

FSDP_BF16_STORE_BLENDV(sse41, "sse4.1", __m128, __m128i, _mm, si128, fsdp_bf16_pack_sse41)
FSDP_BF16_STORE_BLENDV(avx2, "avx2", __m256, __m256i, _mm256, si256, fsdp_bf16_pack_avx2)

/* 16 lanes, out[0..15]: the same rounding, NaNs chosen by a mask. */
__attribute__((target("avx512f"))) static inline void fsdp_bf16_store_avx512f(fsdp_bf16 *out,
                                                                              __m512 x)
{
    const __m512i u = _mm512_castps_si512(x);
    const __m512i abs = _mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff));
    const __mmask16 is_nan = _mm512_cmpgt_epi32_mask(abs, _mm512_set1_epi32(0x7f800000));
    const __m512i hi = _mm512_srli_epi32(u, 16);
    const __m512i lsb = _mm512_and_si512(hi, _mm512_set1_epi32(1));
    const __m512i rounded = _mm512_srli_epi32(
        _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb), 16);
    const __m512i quiet = _mm512_or_si512(hi, _mm512_set1_epi32(0x40));
    const __m512i r = _mm512_mask_blend_epi32(is_nan, rounded, quiet);
    _mm256_storeu_si256((__m256i *)out, _mm512_cvtepi32_epi16(r)); /* truncates: exact here */
}

/* The vector fsdp_cpu_st and its use by the optimizers, for each set:
 * fsdp_simd_st_##isa stores W lanes x as elements [i, i + W) of out in dt
 * (fp32, or bf16 rounded as above); fsdp_param_store_##isa stores W updated
 * parameters pi at p + i and, when the step writes a compute copy (p_out
 * not NULL), at p_out + i in out_dt. */
#define FSDP_SIMD_STORES(isa, TARGET, V, W, PFX)                               \
    __attribute__((target(TARGET))) static inline void fsdp_simd_st_##isa(     \
        void *out, fsdp_dtype dt, size_t i, V x)                               \
    {                                                                          \
        if (dt == FSDP_DTYPE_BF16)                                             \
            fsdp_bf16_store_##isa((fsdp_bf16 *)out + i, x);                    \
        else                                                                   \
            PFX##_storeu_ps((float *)out + i, x);                              \
    }                                                                          \
    __attribute__((target(TARGET))) static inline void fsdp_param_store_##isa( \
        float *p, void *p_out, fsdp_dtype out_dt, size_t i, V pi)              \
    {                                                                          \
        PFX##_storeu_ps(p + i, pi);                                            \
        if (p_out)                                                             \
            fsdp_simd_st_##isa(p_out, out_dt, i, pi);                          \
    }

FSDP_CPU_EACH_SIMD(FSDP_SIMD_STORES)
#else
#define FSDP_CPU_X86 0
#endif

#endif /* FSDP_OPS_CPU_SIMD_H */
