/*
 * simd.h - helpers shared by the vectorised host optimizer kernels
 * (adamw.c, sgd.c): fp32 -> bf16 stores that round exactly as
 * fsdp_f32_to_bf16 (core/bf16.h) does, one per instruction set. Each is
 * compiled for its own target (the build's baseline is x86-64-v2), so
 * include this only from files whose callers carry the same attribute.
 */
#ifndef FSDP_OPS_CPU_SIMD_H
#define FSDP_OPS_CPU_SIMD_H

#include "core/bf16.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define FSDP_CPU_X86 1

/* Round 4 lanes to bf16 (nearest even, NaNs quieted) and store out[0..3]. */
__attribute__((target("sse4.1"))) static inline void fsdp_bf16_store_sse41(fsdp_bf16 *out,
                                                                           __m128 x)
{
    const __m128i u = _mm_castps_si128(x);
    const __m128i abs = _mm_and_si128(u, _mm_set1_epi32(0x7fffffff));
    const __m128i is_nan = _mm_cmpgt_epi32(abs, _mm_set1_epi32(0x7f800000));
    const __m128i hi = _mm_srli_epi32(u, 16);
    const __m128i lsb = _mm_and_si128(hi, _mm_set1_epi32(1));
    const __m128i rounded =
        _mm_srli_epi32(_mm_add_epi32(_mm_add_epi32(u, _mm_set1_epi32(0x7fff)), lsb), 16);
    const __m128i quiet = _mm_or_si128(hi, _mm_set1_epi32(0x40));
    const __m128i r = _mm_blendv_epi8(rounded, quiet, is_nan);
    _mm_storel_epi64((__m128i *)out, _mm_packus_epi32(r, r)); /* values <= 0xffff: exact */
}

/* 8 lanes, out[0..7]. */
__attribute__((target("avx2"))) static inline void fsdp_bf16_store_avx2(fsdp_bf16 *out, __m256 x)
{
    const __m256i u = _mm256_castps_si256(x);
    const __m256i abs = _mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff));
    const __m256i is_nan = _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(0x7f800000));
    const __m256i hi = _mm256_srli_epi32(u, 16);
    const __m256i lsb = _mm256_and_si256(hi, _mm256_set1_epi32(1));
    const __m256i rounded = _mm256_srli_epi32(
        _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb), 16);
    const __m256i quiet = _mm256_or_si256(hi, _mm256_set1_epi32(0x40));
    const __m256i r = _mm256_blendv_epi8(rounded, quiet, is_nan);
    /* packus works per 128-bit lane: qwords (r0..3, r0..3, r4..7, r4..7);
     * keep qwords 0 and 2. */
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
    _mm_storeu_si128((__m128i *)out, _mm256_castsi256_si128(packed));
}

/* 16 lanes, out[0..15]. */
__attribute__((target("avx512f"))) static inline void fsdp_bf16_store_avx512(fsdp_bf16 *out,
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
#else
#define FSDP_CPU_X86 0
#endif

#endif /* FSDP_OPS_CPU_SIMD_H */
