/*
 * crc32c.c - CRC-32C, bit by bit (crc32c.h).
 */
#include "core/crc32c.h"

uint32_t fsdp_crc32c(uint32_t crc, const void *data, size_t n)
{
    const unsigned char *p = data;
    crc = ~crc;
    for (size_t i = 0; i < n; i++) {
        crc ^= p[i];
        for (int k = 0; k < 8; k++)
            crc = (crc >> 1) ^ (0x82F63B78u & (0u - (crc & 1u)));
    }
    return ~crc;
}
