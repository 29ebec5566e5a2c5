/*
 * vexp.h - a branch-free e^x that compilers vectorise, for the cpu ops'
 * element-wise loops (gelu's tanh, the cross-entropy's softmax).
 *
 * Range reduction to |r| <= ln2/2 with ln2 split in two, a degree-6
 * polynomial (~2 ulp), and 2^k built in the exponent bits. Every operation
 * is an explicit IEEE float operation (the build forbids contraction), so
 * scalar, SSE and AVX code give the same bits.
 */
#ifndef FSDP_OPS_CPU_VEXP_H
#define FSDP_OPS_CPU_VEXP_H

#include <stdint.h>
#include <string.h>

/* e^x for x in [-87, 88] (callers clamp; 2^k stays a normal float). */
static inline float fsdp_cpu_exp(float x)
{
    const float round_magic = 12582912.0f; /* 1.5 * 2^23: adds round-to-nearest */
    float t = x * 1.4426950408889634f;
    float k = (t + round_magic) - round_magic;
    float r = x - k * 0.693145751953125f; /* ln2 split: hi (exact product) ... */
    r = r - k * 1.4286067653e-06f;        /* ... and lo */
    float p = 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    int32_t bits = ((int32_t)k + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

#endif /* FSDP_OPS_CPU_VEXP_H */
