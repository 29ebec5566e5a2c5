/*
 * bf16.h - bfloat16 storage: round-to-nearest-even from fp32, exact widening.
 * NaN stays NaN (quiet) after rounding.
 */
#ifndef FSDP_CORE_BF16_H
#define FSDP_CORE_BF16_H

#include <stdint.h>
#include <string.h>

typedef uint16_t fsdp_bf16;

static inline fsdp_bf16 fsdp_f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u)           /* NaN: keep it a NaN */
        return (fsdp_bf16)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);                 /* round to nearest even */
    return (fsdp_bf16)(u >> 16);
}

static inline float fsdp_bf16_to_f32(fsdp_bf16 h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

#endif /* FSDP_CORE_BF16_H */
