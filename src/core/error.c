/*
 * error.c - per-thread error messages (the current one and the first one
 * since the last clear, see error.h), status names, dtype sizes, byte sizes.
 */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdarg.h>
#include <string.h>
#include <strings.h>

#include "core/error.h"

static _Thread_local char tls_msg[FSDP_ERROR_MSG_MAX];

/* The first error since the last clear; `current`: tls_msg still is it (a
 * prefix then applies to both). */
static _Thread_local struct {
    fsdp_status st;
    bool current;
    char msg[FSDP_ERROR_MSG_MAX];
} tls_first;

fsdp_status fsdp_error_set(fsdp_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fsdp_error_setv(st, fmt, ap);
    va_end(ap);
    return st;
}

fsdp_status fsdp_error_setv(fsdp_status st, const char *fmt, va_list ap)
{
    /* Through a copy: the arguments may include fsdp_error_msg() itself. */
    char msg[FSDP_ERROR_MSG_MAX];
    vsnprintf(msg, sizeof msg, fmt, ap);
    memcpy(tls_msg, msg, sizeof msg);
    bool take = st != FSDP_STATUS_OK &&
                (tls_first.st == FSDP_STATUS_OK || strstr(tls_msg, tls_first.msg) != NULL);
    if (take) {
        tls_first.st = st;
        memcpy(tls_first.msg, tls_msg, sizeof tls_msg);
    }
    tls_first.current = take;
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
    /* a head that already ends in its separator ("...unit 'h.0': ") gets no second one */
    size_t n = strlen(head);
    while (n > 0 && head[n - 1] == ' ')
        head[--n] = '\0';
    if (n > 0 && head[n - 1] == ':')
        head[--n] = '\0';
    snprintf(tls_msg, sizeof tls_msg, "%s: %s", head, old);
    if (tls_first.current)
        memcpy(tls_first.msg, tls_msg, sizeof tls_msg);
}

void fsdp_error_copy(const char *msg)
{
    snprintf(tls_msg, sizeof tls_msg, "%s", msg ? msg : "");
    tls_first.current = false;
}

void fsdp_error_clear(void)
{
    tls_msg[0] = '\0';
    tls_first.st = FSDP_STATUS_OK;
    tls_first.current = false;
    tls_first.msg[0] = '\0';
}

fsdp_status fsdp_error_first(const char **msg)
{
    if (msg)
        *msg = tls_first.msg;
    return tls_first.st;
}

const char *fsdp_error_msg(void) { return tls_msg; }

const char *fsdp_status_name(fsdp_status st)
{
    static const char *const names[FSDP_STATUS_COUNT] = {
        "OK", "INVALID_ARG", "OOM", "IO", "FORMAT", "CUDA", "NCCL",
        "ABORTED", "UNSUPPORTED", "INTERNAL", "NONFINITE", "STALLED",
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
    if (v != floor(v))
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "size '%s' is %.6g bytes, not a whole number of bytes", s, v);
    *out = (size_t)v;
    return FSDP_STATUS_OK;
bad:
    return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                          "bad size '%s' (expected e.g. 4096, 512M, 24GiB)", s);
}
