/*
 * manifest_lex.c - the bounded pieces every manifest line is read with:
 * the error naming the file and line, strict decimal and hex numbers,
 * names, and splitting a line into tokens (manifest_internal.h). Below
 * both halves of the reader (manifest.c, manifest_header.c).
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "ckpt/manifest_internal.h"
#include "core/error.h"

fsdp_status fsdp_mf_bad(const fsdp_mf_parser *ps, const char *fmt, ...)
{
    char msg[FSDP_ERROR_MSG_MAX / 2];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return fsdp_error_set(FSDP_STATUS_FORMAT, "checkpoint manifest '%s' line %d: %s", ps->path,
                          ps->line, msg);
}

/* Strict unsigned decimal: digits only, no sign, no overflow, <= max. */
bool fsdp_mf_u64(const char *s, uint64_t max, uint64_t *out)
{
    if (!*s)
        return false;
    uint64_t v = 0;
    for (; *s; s++) {
        if (*s < '0' || *s > '9')
            return false;
        if (v > (UINT64_MAX - 9) / 10)
            return false;
        v = v * 10 + (uint64_t)(*s - '0');
    }
    if (v > max)
        return false;
    *out = v;
    return true;
}

bool fsdp_mf_int(const char *s, int lo, int hi, int *out)
{
    uint64_t v;
    if (!fsdp_mf_u64(s, (uint64_t)hi, &v) || v < (uint64_t)lo)
        return false;
    *out = (int)v;
    return true;
}

bool fsdp_mf_hex64(const char *s, uint64_t *out)
{
    if (strlen(s) != 16)
        return false;
    uint64_t v = 0;
    for (; *s; s++) {
        int d = *s >= '0' && *s <= '9'   ? *s - '0'
                : *s >= 'a' && *s <= 'f' ? *s - 'a' + 10
                                         : -1;
        if (d < 0)
            return false;
        v = v << 4 | (uint64_t)d;
    }
    *out = v;
    return true;
}

/* Names of units and parameters: [A-Za-z0-9._-], 1..max-1 characters. */
bool fsdp_mf_name_valid(const char *s, size_t max)
{
    size_t n = strlen(s);
    if (n == 0 || n >= max)
        return false;
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') ||
              *s == '.' || *s == '_' || *s == '-'))
            return false;
    return true;
}

/* Split a line into space-separated tokens (in place). Returns the count,
 * or -1 if there are more than max. */
int fsdp_mf_tokenize(char *s, char **tok, int max)
{
    int n = 0;
    while (*s) {
        while (*s == ' ')
            s++;
        if (!*s)
            break;
        if (n == max)
            return -1;
        tok[n++] = s;
        while (*s && *s != ' ')
            s++;
        if (*s)
            *s++ = '\0';
    }
    return n;
}
