/*
 * str.h - bounded string copies for hot paths (a collective's label, copied
 * several times per collective): snprintf("%s") does the same but goes
 * through the whole printf machinery, which showed as a third of a plan
 * --fit search's time.
 */
#ifndef FSDP_CORE_STR_H
#define FSDP_CORE_STR_H

#include <stddef.h>
#include <string.h>

/* Copy src (NULL: "") into dst[0..n), truncated to n - 1 bytes and NUL-terminated (n > 0). */
static inline void fsdp_str_copy(char *dst, size_t n, const char *src)
{
    size_t len = src ? strnlen(src, n - 1) : 0;
    memcpy(dst, src ? src : "", len);
    dst[len] = '\0';
}

#endif /* FSDP_CORE_STR_H */
