/*
 * error.c - per-thread error messages, status names, dtype sizes, byte sizes.
 */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <string.h>
#include <strings.h>

#include "core/error.h"

static _Thread_local char tls_msg[FSDP_ERROR_MSG_MAX];

fsdp_status fsdp_error_set(fsdp_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tls_msg, sizeof tls_msg, fmt, ap);
    va_end(ap);
    return st;
}

void fsdp_error_prefix(const char *fmt, ...)
{
    char head[FSDP_ERROR_MSG_MAX], old[FSDP_ERROR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(head, sizeof head, fmt, ap);
    va_end(ap);
    memcpy(old, tls_msg, sizeof old);
    snprintf(tls_msg, sizeof tls_msg, "%s: %s", head, old);
}

void fsdp_error_copy(const char *msg)
{
    snprintf(tls_msg, sizeof tls_msg, "%s", msg ? msg : "");
}

void fsdp_error_clear(void) { tls_msg[0] = '\0'; }

const char *fsdp_error_msg(void) { return tls_msg; }

const char *fsdp_status_name(fsdp_status st)
{
    static const char *const names[FSDP_STATUS_COUNT] = {
        "OK", "INVALID_ARG", "OOM", "IO", "FORMAT", "CUDA", "NCCL",
        "ABORTED", "UNSUPPORTED", "INTERNAL",
    };
    if ((unsigned)st >= FSDP_STATUS_COUNT)
        return "UNKNOWN";
    return names[st];
}

size_t fsdp_dtype_size(fsdp_dtype dt) { return dt == FSDP_DTYPE_BF16 ? 2 : 4; }

char *fsdp_fmt_bytes(char *buf, size_t n, double bytes)
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    int u = 0;
    while (fabs(bytes) >= 1024.0 && u < 5) {
        bytes /= 1024.0;
        u++;
    }
    if (u == 0)
        snprintf(buf, n, "%.0f B", bytes);
    else
        snprintf(buf, n, "%.*f %s", bytes < 10 ? 2 : 1, bytes, units[u]);
    return buf;
}

fsdp_status fsdp_parse_bytes(const char *s, size_t *out)
{
    if (!s || !*s)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "empty size");
    errno = 0;
    char *end;
    double v = strtod(s, &end);
    if (end == s || errno || !(v >= 0))
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "bad size '%s' (expected e.g. 4096, 512M, 24GiB)", s);
    while (*end == ' ')
        end++;
    double mul = 1;
    char c = (char)toupper((unsigned char)*end);
    if (c) {
        const char *p = "KMGTP";
        const char *hit = strchr(p, c);
        if (!hit && c != 'B')
            goto bad;
        if (hit) {
            int pow_i = (int)(hit - p) + 1;
            const char *rest = end + 1;
            double base = 1024;
            if (!strcasecmp(rest, "B"))
                base = 1000;
            else if (*rest && strcasecmp(rest, "iB"))
                goto bad;
            mul = pow(base, pow_i);
        } else if (strcasecmp(end, "B")) {
            goto bad;
        }
    }
    v *= mul;
    if (v > 1.8e19)
        goto bad;
    *out = (size_t)v;
    return FSDP_STATUS_OK;
bad:
    return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                          "bad size '%s' (expected e.g. 4096, 512M, 24GiB)", s);
}
