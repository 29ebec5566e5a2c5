/*
 * accum.c - micro-step gradient sums: the tree's binary counter of partial
 * sums and flat's running sum (contract in accum.h).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "engine/accum.h"

static const fsdp_name accum_names[] = {
    {"tree", FSDP_ACCUM_TREE,
     "a binary tree of partial sums: the same bits for any split of the global batch over "
     "devices x grad-accum (docs/determinism.md), one more fp32 gradient shard per doubling of "
     "--grad-accum"},
    {"flat", FSDP_ACCUM_FLAT,
     "one running sum in micro-step order: gradient memory independent of --grad-accum, the "
     "same bits run to run (and the tree's below --grad-accum 4), but from --grad-accum 4 on "
     "not those of another split of the same global batch (e.g. --devices 1 --grad-accum 4 "
     "against --devices 2 --grad-accum 2)"},
};
const fsdp_name_table fsdp_accum_names = FSDP_NAME_TABLE(accum_names);

int fsdp_accum_depth(int A)
{
    if (A <= 1)
        return 1;
    /* the most ones among 0..m: all b bits of m if m = 2^b - 1, else b - 1 */
    unsigned m = (unsigned)A - 1;
    int b = 32 - __builtin_clz(m);
    int ones = m == (1u << b) - 1u ? b : b - 1;
    return ones + 1;
}

int fsdp_accum_buffers(fsdp_accum_mode mode, int A)
{
    return mode == FSDP_ACCUM_FLAT ? 1 : fsdp_accum_depth(A);
}

fsdp_status fsdp_accum_init(fsdp_accum *a, fsdp_device *dev, fsdp_op_ctx *ops, int n_units,
                            int grad_accum, fsdp_accum_mode mode, size_t max_numel, bool host)
{
    memset(a, 0, sizeof *a);
    if ((int)mode < 0 || mode >= FSDP_ACCUM_MODE_COUNT)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "unknown accumulation mode %d", (int)mode);
    a->mode = mode;
    a->max_numel = max_numel;
    a->n_buf = fsdp_accum_buffers(mode, grad_accum);
    if (a->n_buf > FSDP_ACCUM_MAX)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "--grad-accum %d needs %d accumulation buffers per unit, more than "
                              "%d", grad_accum, a->n_buf, FSDP_ACCUM_MAX);
    a->units = calloc((size_t)n_units + 1, sizeof *a->units);
    if (!a->units)
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory for accumulation counters");
    a->dev = dev;
    a->ops = ops;
    a->n_units = n_units;
    a->host = host;
    return FSDP_STATUS_OK;
}

void fsdp_accum_free(fsdp_accum *a)
{
    free(a->units);
    memset(a, 0, sizeof *a);
}

void fsdp_accum_adopt(fsdp_accum *a, int u, float *buf) { a->units[u].buf[0] = buf; }

/* *p = a new FSDP_MEM_GRAD buffer of numel floats, device or pinned host. */
static fsdp_status buf_alloc(fsdp_accum *a, size_t numel, const char *what, float **p)
{
    size_t bytes = numel * sizeof(float);
    return a->host ? fsdp_device_host_alloc(a->dev, bytes, FSDP_MEM_GRAD, what, (void **)p)
                   : fsdp_device_alloc(a->dev, bytes, FSDP_MEM_GRAD, what, (void **)p);
}

fsdp_status fsdp_accum_slot(fsdp_accum *a, int u, size_t numel, const char *unit_name,
                            float **buf, int *slot)
{
    fsdp_accum_unit *au = &a->units[u];
    if (a->mode == FSDP_ACCUM_FLAT && au->depth > 0) {
        /* a later micro-step: the shared scratch, added to buffer 0 by push */
        FSDP_ASSERT(numel <= a->max_numel);
        if (!a->scratch)
            FSDP_TRY(buf_alloc(a, a->max_numel, "flat gradient accumulation scratch",
                               &a->scratch));
        *buf = a->scratch;
        *slot = -1;
        return FSDP_STATUS_OK;
    }
    int k = 0;
    while (k < a->n_buf && (au->busy & (1u << k)))
        k++;
    FSDP_ASSERT(k < a->n_buf); /* fsdp_accum_depth bounds the live entries */
    if (!au->buf[k]) {
        char what[96];
        snprintf(what, sizeof what, "unit '%s' gradient accumulation", unit_name);
        FSDP_TRY(buf_alloc(a, numel, what, &au->buf[k]));
    }
    *buf = au->buf[k];
    *slot = k;
    return FSDP_STATUS_OK;
}

void fsdp_accum_push(fsdp_accum *a, int u, int slot, size_t numel)
{
    fsdp_accum_unit *au = &a->units[u];
    if (slot < 0) { /* flat: the running sum in buffer 0, then this micro-step */
        FSDP_OP(a->ops, add, au->buf[0], au->buf[0], a->scratch, numel);
        return;
    }
    int level = 0;
    au->busy |= 1u << slot;
    /* merge equal levels, the older partial sum on the left */
    while (au->depth > 0 && au->level[au->depth - 1] == level) {
        int top = au->stack[au->depth - 1];
        FSDP_OP(a->ops, add, au->buf[top], au->buf[top], au->buf[slot], numel);
        au->busy &= ~(1u << slot);
        slot = top;
        au->depth--;
        level++;
    }
    au->stack[au->depth] = slot;
    au->level[au->depth] = level;
    au->depth++;
}

float *fsdp_accum_fold(fsdp_accum *a, int u, size_t numel)
{
    fsdp_accum_unit *au = &a->units[u];
    FSDP_ASSERT(au->depth >= 1);
    int top = au->stack[--au->depth];
    while (au->depth > 0) {
        int below = au->stack[--au->depth];
        FSDP_OP(a->ops, add, au->buf[below], au->buf[below], au->buf[top], numel);
        top = below;
    }
    au->busy = 0;
    return au->buf[top];
}

void fsdp_accum_release(fsdp_accum *a, int u)
{
    fsdp_accum_unit *au = &a->units[u];
    for (int k = 0; k < a->n_buf; k++) {
        if (a->host)
            fsdp_device_host_free(a->dev, au->buf[k]);
        else
            fsdp_device_free(a->dev, au->buf[k]);
        au->buf[k] = NULL;
    }
}
