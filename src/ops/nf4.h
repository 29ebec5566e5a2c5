/*
 * nf4.h - bitsandbytes' 4-bit NormalFloat format (NF4) with double
 * quantization, on the host: the quantizer a model load and `fsdp convert
 * --quantize nf4` use, and the reference dequantizer the op kernels
 * (ops.h nf4_dequant) are checked against.
 *
 * A tensor of n elements (row-major, flattened) is cut into blocks of
 * FSDP_NF4_BLOCK elements (the last one may be short). Each block keeps its
 * absolute maximum (absmax) and every element the index of the nearest of
 * the 16 NF4 code values to x / absmax, two per byte, the even element in
 * the high nibble. Double quantization then stores a tensor's absmax values
 * in 8 bits: offset = their mean, and (absmax - offset) quantized blockwise
 * in blocks of FSDP_NF4_NESTED values against bitsandbytes' signed dynamic
 * 8-bit map, each nested block with its own absmax (nested absmax).
 *
 * Dequantization, element i of block b (nested block b / FSDP_NF4_NESTED):
 *   absmax[b] = dynamic_map[qabsmax[b]] * nested[b / NESTED] + offset
 *   x[i]      = nf4_code[code of i] * absmax[b]
 * each product and sum in fp32, as bitsandbytes' dequantize_4bit computes
 * them, so values are bit-identical to it.
 *
 * At run time a frozen NF4 parameter's shard is its codes plus each block's
 * absmax already in fp32 (fsdp_nf4_absmax): 0.5 + 4/64 bytes per element,
 * 0.28x bf16, and the device kernel is one multiply per element.
 */
#ifndef FSDP_OPS_NF4_H
#define FSDP_OPS_NF4_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FSDP_NF4_BLOCK 64   /* elements per absmax */
#define FSDP_NF4_NESTED 256 /* absmax values per nested absmax (double quantization) */

/* bitsandbytes' NF4 code values, index 0..15 (index 7 is 0.0). */
extern const float fsdp_nf4_code[16];
/* bitsandbytes' signed dynamic 8-bit map (create_dynamic_map(signed=True)),
 * the absmax codes' values, index 0..255. */
extern const float fsdp_nf4_dynamic_map[256];

/* Blocks of an n-element tensor: ceil(n / FSDP_NF4_BLOCK). */
static inline size_t fsdp_nf4_blocks(size_t n)
{
    return (n + FSDP_NF4_BLOCK - 1) / FSDP_NF4_BLOCK;
}
/* Nested blocks of nblocks absmax values: ceil(nblocks / FSDP_NF4_NESTED). */
static inline size_t fsdp_nf4_nested_blocks(size_t nblocks)
{
    return (nblocks + FSDP_NF4_NESTED - 1) / FSDP_NF4_NESTED;
}

/* Quantize x (n elements) as bitsandbytes' quantize_4bit(quant_type="nf4",
 * blocksize=64) does: codes (ceil(n / 2) bytes; an odd n's last low nibble
 * 7, a scaled 0, as bitsandbytes pads) and absmax (fsdp_nf4_blocks(n) fp32 values). */
void fsdp_nf4_quantize(const float *x, size_t n, uint8_t *codes, float *absmax);

/* Double-quantize one tensor's nblocks absmax values as bitsandbytes
 * (compress_statistics=True): *offset their mean, qabsmax (nblocks bytes),
 * nested (fsdp_nf4_nested_blocks(nblocks) fp32 values). */
void fsdp_nf4_double_quant(const float *absmax, size_t nblocks, uint8_t *qabsmax, float *nested,
                           float *offset);

/* The fp32 absmax of blocks [first, first + count) of a double-quantized
 * tensor (qabsmax and nested of the whole tensor), as dequantize_4bit
 * computes it. */
void fsdp_nf4_absmax(const uint8_t *qabsmax, const float *nested, float offset, size_t first,
                     size_t count, float *absmax);

/* A whole tensor as its stored form gives it back at run time: fsdp_nf4_quantize's codes,
 * and every block's absmax (fsdp_nf4_blocks(n) fp32) after the double quantization's round
 * trip (fsdp_nf4_double_quant, then fsdp_nf4_absmax). false when the scratch cannot be
 * allocated. */
bool fsdp_nf4_quantize_tensor(const float *x, size_t n, uint8_t *codes, float *absmax);

/* The reference dequantizer: x[i] = fsdp_nf4_code[code i] * absmax[i / 64],
 * n elements from codes starting at an even element. */
void fsdp_nf4_dequant_ref(const uint8_t *codes, const float *absmax, size_t n, float *x);

#ifdef __cplusplus
}
#endif

#endif /* FSDP_OPS_NF4_H */
