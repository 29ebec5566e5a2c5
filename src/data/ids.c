/*
 * ids.c - growing id and flag arrays (ids.h): capacity doubles, so n
 * appends cost O(n) in all.
 */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "data/ids.h"

static fsdp_status grow(void **p, size_t *cap, size_t n, size_t more, size_t size)
{
    if (*cap - n >= more)
        return FSDP_STATUS_OK;
    size_t c = *cap ? *cap : 256;
    while (c - n < more) {
        if (c > SIZE_MAX / 2 / size)
            return fsdp_error_set(FSDP_STATUS_OOM, "a token array of %zu + %zu entries is too "
                                  "large", n, more);
        c *= 2;
    }
    void *q = realloc(*p, c * size);
    if (!q)
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory holding %zu tokens (%zu "
                              "bytes)", c, c * size);
    *p = q;
    *cap = c;
    return FSDP_STATUS_OK;
}

fsdp_status fsdp_ids_reserve(fsdp_ids *v, size_t more)
{
    return grow((void **)&v->p, &v->cap, v->n, more, sizeof *v->p);
}

fsdp_status fsdp_flags_reserve(fsdp_flags *v, size_t more)
{
    return grow((void **)&v->p, &v->cap, v->n, more, sizeof *v->p);
}

fsdp_status fsdp_ids_append(fsdp_ids *v, const int *ids, size_t n)
{
    FSDP_TRY(fsdp_ids_reserve(v, n));
    if (n)
        memcpy(v->p + v->n, ids, n * sizeof *ids);
    v->n += n;
    return FSDP_STATUS_OK;
}

fsdp_status fsdp_flags_fill(fsdp_flags *v, uint8_t flag, size_t n)
{
    FSDP_TRY(fsdp_flags_reserve(v, n));
    memset(v->p + v->n, flag, n);
    v->n += n;
    return FSDP_STATUS_OK;
}

void fsdp_ids_free(fsdp_ids *v)
{
    free(v->p);
    memset(v, 0, sizeof *v);
}

void fsdp_flags_free(fsdp_flags *v)
{
    free(v->p);
    memset(v, 0, sizeof *v);
}
