/*
 * crc32c.h - CRC-32C (Castagnoli: reflected polynomial 0x82F63B78, initial
 * and final XOR 0xFFFFFFFF), the checksum of TFRecord framing
 * (report/tensorboard.h), with TensorFlow's mask for CRCs stored beside the
 * data they cover.
 *
 * Bitwise, without a table: the records it checks are a few hundred bytes
 * per training step, so simplicity wins over speed, and nothing needs
 * initialising.
 */
#ifndef FSDP_CORE_CRC32C_H
#define FSDP_CORE_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* The CRC-32C of n bytes at data, continuing from crc: 0 to start, the
 * previous result to extend a checksum over more bytes
 * (crc32c(crc32c(0, a), b) == crc32c(0, a || b)). data may be NULL when n is 0. */
uint32_t fsdp_crc32c(uint32_t crc, const void *data, size_t n);

/* TensorFlow's masked form of a CRC (rotated right by 15 bits, plus
 * 0xa282ead8), stored so that the CRC of data holding CRCs stays strong. */
static inline uint32_t fsdp_crc32c_mask(uint32_t crc)
{
    return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

#endif /* FSDP_CORE_CRC32C_H */
