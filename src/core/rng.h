/*
 * rng.h - counter-based random numbers: a pure function of (seed, stream,
 * index), so any slice of a tensor can be initialised alone, by any rank, in
 * any order, with the same values (docs/determinism.md, "Initialisation").
 *
 * The mixer is SplitMix64's finaliser applied to a combination of the keys;
 * normals use Box-Muller on two uniforms drawn from index*2 and index*2+1.
 */
#ifndef FSDP_CORE_RNG_H
#define FSDP_CORE_RNG_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

static inline uint64_t fsdp_rng_mix(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* The key of stream `stream` under `seed` (fsdp_rng_u64's first two mixes). */
static inline uint64_t fsdp_rng_key(uint64_t seed, uint64_t stream)
{
    return fsdp_rng_mix(fsdp_rng_mix(seed) ^ stream);
}

/* 64 random bits for (seed, stream, index). */
static inline uint64_t fsdp_rng_u64(uint64_t seed, uint64_t stream, uint64_t index)
{
    return fsdp_rng_mix(fsdp_rng_key(seed, stream) ^ index);
}

/* Uniform in (0, 1): 24 random bits, never 0. */
static inline float fsdp_rng_uniform(uint64_t seed, uint64_t stream, uint64_t index)
{
    return ((float)(fsdp_rng_u64(seed, stream, index) >> 40) + 0.5f) * (1.0f / 16777216.0f);
}

/* Box-Muller's two uniforms from 64 random bits each: u1 in (0, 1), log's
 * argument, and u2 in [0, 1), the angle's turn (53 bits each). */
static inline double fsdp_rng_bm_u1(uint64_t a)
{
    return ((double)(a >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

static inline double fsdp_rng_bm_u2(uint64_t b)
{
    return (double)(b >> 11) * (1.0 / 9007199254740992.0);
}

/* Box-Muller's normal from the 64 random bits a and b, computed in double
 * with libm's log and cos (so the value does not depend on the compiler's
 * float contraction): the definition of every normal fsdp draws. */
static inline float fsdp_rng_box_muller_libm(uint64_t a, uint64_t b)
{
    return (float)(sqrt(-2.0 * log(fsdp_rng_bm_u1(a))) *
                   cos(6.283185307179586 * fsdp_rng_bm_u2(b)));
}

/* Standard normal for (seed, stream, index). */
static inline float fsdp_rng_normal(uint64_t seed, uint64_t stream, uint64_t index)
{
    return fsdp_rng_box_muller_libm(fsdp_rng_u64(seed, stream, 2 * index),
                                    fsdp_rng_u64(seed, stream, 2 * index + 1));
}

/* The same float as fsdp_rng_box_muller_libm, bit for bit, about three times
 * faster (rng.c: polynomials, and libm where a value lies too close to a
 * float's rounding boundary to tell). */
float fsdp_rng_box_muller(uint64_t a, uint64_t b);

/* dst[i] = scale * fsdp_rng_normal(seed, stream, first + i) for i < n, bit
 * for bit, through fsdp_rng_box_muller. */
void fsdp_rng_normal_fill(uint64_t seed, uint64_t stream, uint64_t first, size_t n, float scale,
                          float *dst);

/* Hash of a string, to key an RNG stream by parameter name. */
static inline uint64_t fsdp_rng_hash_str(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    while (*s)
        h = (h ^ (uint8_t)*s++) * 1099511628211ull;
    return h;
}

#endif /* FSDP_CORE_RNG_H */
