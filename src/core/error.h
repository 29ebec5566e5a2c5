/*
 * error.h - status propagation and error messages.
 *
 * Library code returns fsdp_status. The function that detects a failure
 * attaches a message with fsdp_error_set(); callers propagate the status with
 * FSDP_TRY (return at once) or FSDP_CHECK (goto fail for cleanup). Messages
 * are per thread, so rank threads never overwrite each other's. Broken
 * invariants use FSDP_ASSERT: file:line, then abort().
 *
 * The first error is kept. After a failure, teardown (stream syncs, freeing
 * handles) often fails too and sets messages of its own; the user must see
 * the failure that started it. So each thread also keeps its first error
 * since the last fsdp_error_clear(): later errors replace the current
 * message (fsdp_error_msg) but not the first one, unless they extend it
 * (a message that contains the first one's text, the wrap pattern
 * fsdp_error_set(st, "loading 'x': %s", fsdp_error_msg())). The world reads
 * the first error when a rank function returns a failure (core/world.c).
 */
#ifndef FSDP_CORE_ERROR_H
#define FSDP_CORE_ERROR_H

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "fsdp/fsdp.h"

#ifdef __cplusplus
extern "C" {
#endif

#define FSDP_ERROR_MSG_MAX 1024

/* Record st with a printf-style message on the calling thread; returns st.
 * Usage: return fsdp_error_set(FSDP_STATUS_IO, "cannot open '%s'", path); */
fsdp_status fsdp_error_set(fsdp_status st, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* fsdp_error_set with the arguments as a va_list (for wrappers that then
 * add context with fsdp_error_prefix). */
fsdp_status fsdp_error_setv(fsdp_status st, const char *fmt, va_list ap)
    __attribute__((format(printf, 2, 0)));

/* Prefix the calling thread's message with context ("loading 'x.bin': ...");
 * a head that ends in ":" or ": " is not given a second separator. */
void fsdp_error_prefix(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Replace the calling thread's current message (the first error is left
 * as it is). */
void fsdp_error_copy(const char *msg);

/* The error was handled: forget the current message and the first error. */
void fsdp_error_clear(void);

/* The calling thread's first error since the last fsdp_error_clear() (see
 * above): its status (OK if none) and, if msg is not NULL, its message
 * (valid until the thread's next error call). */
fsdp_status fsdp_error_first(const char **msg);

/* Propagate: return the status if it is not OK. */
#define FSDP_TRY(expr)                                  \
    do {                                                \
        fsdp_status fsdp_try_st_ = (expr);              \
        if (fsdp_try_st_ != FSDP_STATUS_OK)             \
            return fsdp_try_st_;                        \
    } while (0)

/* Propagate with cleanup: needs `fsdp_status st` and a `fail:` label. */
#define FSDP_CHECK(expr)                                \
    do {                                                \
        st = (expr);                                    \
        if (st != FSDP_STATUS_OK)                       \
            goto fail;                                  \
    } while (0)

/* A constructor's last step: on success store obj in *out and return OK;
 * otherwise release the half-built obj with free_fn and return st.
 * Usage: return FSDP_OUT_OR_FREE(st, out, w, fsdp_world_free); */
#define FSDP_OUT_OR_FREE(st, out, obj, free_fn)                                \
    ((st) == FSDP_STATUS_OK ? (*(out) = (obj), FSDP_STATUS_OK)                 \
                            : ((free_fn)(obj), (st)))

/* Broken invariant: a bug in fsdp, not a user error. */
#define FSDP_ASSERT(cond)                                                      \
    do {                                                                       \
        if (!(cond)) {                                                         \
            fprintf(stderr, "fsdp: %s:%d: assertion failed: %s\n", __FILE__,   \
                    __LINE__, #cond);                                          \
            abort();                                                           \
        }                                                                      \
    } while (0)

/* Format a byte count as "1.2 GiB" into buf (at least 32 bytes); returns buf. */
char *fsdp_fmt_bytes(char *buf, size_t n, double bytes);

/* Parse "24GiB", "512M", "1e9", "4096" into bytes. Suffixes K/M/G/T (powers
 * of 1024 with or without "iB"/"B"), KB/MB/GB/TB as powers of 1000.
 * Returns INVALID_ARG with a message for anything else, a fraction of a
 * byte included ("1.5" is refused, "1.5K" is 1536). */
fsdp_status fsdp_parse_bytes(const char *s, size_t *out);

#ifdef __cplusplus
}
#endif

#endif /* FSDP_CORE_ERROR_H */
