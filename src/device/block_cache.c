/*
 * block_cache.c - the caching allocator of block_cache.h: a flat array of
 * blocks, searched linearly (a device holds a few hundred blocks; a search
 * costs far less than one cudaMalloc).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "device/block_cache.h"

#define KIB ((size_t)1 << 10)
#define MIB ((size_t)1 << 20)

static size_t round_up(size_t n, size_t q) { return (n + q - 1) / q * q; }

static const char *owner(const fsdp_block_cache *c)
{
    return c->iface->owner ? c->iface->owner : "the device";
}

size_t fsdp_block_cache_class(size_t bytes)
{
    if (bytes > SIZE_MAX - 2 * MIB)
        return SIZE_MAX; /* no driver has it: the raw allocation fails */
    if (bytes <= MIB)
        return round_up(bytes ? bytes : 1, 512);
    if (bytes <= 32 * MIB)
        return round_up(bytes, 128 * KIB);
    return round_up(bytes, 2 * MIB);
}

void fsdp_block_cache_init(fsdp_block_cache *c, const fsdp_block_cache_i *iface, void *ctx)
{
    memset(c, 0, sizeof *c);
    c->iface = iface;
    c->ctx = ctx;
}

/* Remove block i (its memory already given back), keeping the array dense. */
static void drop(fsdp_block_cache *c, size_t i)
{
    struct fsdp_block *b = &c->blocks[i];
    if (b->fence)
        c->iface->fence_destroy(c->ctx, b->fence);
    c->held_bytes -= b->bytes;
    c->blocks[i] = c->blocks[--c->n_blocks];
}

static void release(fsdp_block_cache *c, size_t i)
{
    struct fsdp_block *b = &c->blocks[i];
    if (b->state == FSDP_BLOCK_FREE)
        c->free_bytes -= b->bytes;
    c->iface->raw_free(c->ctx, b->ptr);
    c->n_raw_frees++;
    drop(c, i);
}

void fsdp_block_cache_fini(fsdp_block_cache *c)
{
    while (c->n_blocks)
        release(c, c->n_blocks - 1);
    free(c->blocks);
    c->blocks = NULL;
    c->cap_blocks = 0;
    c->free_bytes = c->counted_bytes = 0;
}

/* Hand out block i for a request of `bytes`. */
static void *take(fsdp_block_cache *c, size_t i, size_t bytes, bool counted)
{
    struct fsdp_block *b = &c->blocks[i];
    b->state = FSDP_BLOCK_LIVE;
    b->asked = bytes;
    b->counted = counted;
    c->free_bytes -= b->bytes;
    if (counted)
        c->counted_bytes += bytes;
    return b->ptr;
}

/* The FREE block for a request of class cls: the smallest size that fits
 * (at most a quarter larger), and of that size a done one, else the one
 * freed longest ago. *out = SIZE_MAX if none fits; *done says whether its
 * fence is done. Which size is taken depends only on the host's order of
 * allocations and frees. */
static fsdp_status find_free(fsdp_block_cache *c, size_t cls, size_t *out, bool *done)
{
    size_t best = SIZE_MAX;
    bool best_done = false;
    for (size_t i = 0; i < c->n_blocks; i++) {
        struct fsdp_block *b = &c->blocks[i];
        if (b->state != FSDP_BLOCK_FREE || b->bytes < cls || b->bytes > cls + cls / 4)
            continue;
        if (best != SIZE_MAX) {
            const struct fsdp_block *o = &c->blocks[best];
            if (b->bytes > o->bytes || (b->bytes == o->bytes && best_done))
                continue;
        }
        bool d = true;
        if (b->fence)
            FSDP_TRY(c->iface->fence_query(c->ctx, b->fence, &d));
        if (best != SIZE_MAX && b->bytes == c->blocks[best].bytes && !d &&
            b->freed_at > c->blocks[best].freed_at)
            continue; /* both pending: keep the older */
        best = i;
        best_done = d;
    }
    *out = best;
    *done = best_done;
    return FSDP_STATUS_OK;
}

static fsdp_status raw_new(fsdp_block_cache *c, size_t cls, void **out)
{
    if (c->n_blocks == c->cap_blocks) {
        size_t ncap = c->cap_blocks ? 2 * c->cap_blocks : 64;
        struct fsdp_block *nb = realloc(c->blocks, ncap * sizeof *nb);
        if (!nb)
            return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory for the block cache");
        c->blocks = nb;
        c->cap_blocks = ncap;
    }
    FSDP_TRY(c->iface->raw_alloc(c->ctx, cls, out));
    c->blocks[c->n_blocks++] = (struct fsdp_block){
        .ptr = *out, .bytes = cls, .state = FSDP_BLOCK_FREE};
    c->held_bytes += cls;
    c->free_bytes += cls;
    c->n_raw_allocs++;
    return FSDP_STATUS_OK;
}

/* Give back FREE blocks: the done ones, or (pending) every one after a
 * host wait for its fence. Returns how many bytes went back. */
static fsdp_status give_back(fsdp_block_cache *c, bool pending, size_t *n_bytes)
{
    *n_bytes = 0;
    for (size_t i = c->n_blocks; i-- > 0;) {
        struct fsdp_block *b = &c->blocks[i];
        if (b->state != FSDP_BLOCK_FREE)
            continue;
        bool done = true;
        if (b->fence)
            FSDP_TRY(c->iface->fence_query(c->ctx, b->fence, &done));
        if (!done && !pending)
            continue;
        if (!done)
            FSDP_TRY(c->iface->fence_wait(c->ctx, b->fence));
        *n_bytes += b->bytes;
        release(c, i);
    }
    return FSDP_STATUS_OK;
}

fsdp_status fsdp_block_cache_alloc(fsdp_block_cache *c, size_t bytes, bool counted, void **out)
{
    *out = NULL;
    FSDP_ASSERT(bytes > 0);
    size_t cls = fsdp_block_cache_class(bytes), i;
    bool done;
    FSDP_TRY(find_free(c, cls, &i, &done));
    if (i != SIZE_MAX) {
        if (!done) {
            /* its previous users may still run: the streams wait for them */
            FSDP_TRY(c->iface->fence_order(c->ctx, c->blocks[i].fence));
            c->n_ordered++;
        }
        c->n_reused++;
        *out = take(c, i, bytes, counted);
        return FSDP_STATUS_OK;
    }
    void *p = NULL;
    c->n_raw_counted += counted;
    fsdp_status st = raw_new(c, cls, &p);
    if (st == FSDP_STATUS_OK) {
        *out = take(c, c->n_blocks - 1, bytes, counted);
        return FSDP_STATUS_OK;
    }
    if (st != FSDP_STATUS_OOM)
        return st;
    /* The driver is out of memory: give cached blocks of other sizes back
     * (the done ones, then all) and retry. */
    for (int pending = 0; pending < 2; pending++) {
        size_t back = 0;
        FSDP_TRY(give_back(c, pending, &back));
        if (!back)
            continue;
        st = raw_new(c, cls, &p);
        if (st == FSDP_STATUS_OK) {
            *out = take(c, c->n_blocks - 1, bytes, counted);
            return FSDP_STATUS_OK;
        }
        if (st != FSDP_STATUS_OOM)
            return st;
    }
    char b_cls[32], b_held[32], b_live[32];
    return fsdp_error_set(FSDP_STATUS_OOM,
                          "%s has no memory left for %s, even after every cached free block "
                          "was given back (this rank holds %s in %zu blocks, %s of them in use)",
                          owner(c), fsdp_fmt_bytes(b_cls, 32, (double)cls),
                          fsdp_fmt_bytes(b_held, 32, (double)c->held_bytes), c->n_blocks,
                          fsdp_fmt_bytes(b_live, 32, (double)(c->held_bytes - c->free_bytes)));
}

fsdp_status fsdp_block_cache_reserve(fsdp_block_cache *c, size_t bytes, size_t n)
{
    size_t cls = fsdp_block_cache_class(bytes);
    for (size_t k = 0; k < n; k++) {
        void *p = NULL;
        fsdp_status st = raw_new(c, cls, &p);
        if (st == FSDP_STATUS_OOM) {
            char b_cls[32], b_held[32];
            return fsdp_error_set(FSDP_STATUS_OOM,
                                  "%s has no memory left to reserve block %zu of %zu of %s "
                                  "(this rank holds %s)",
                                  owner(c), k + 1, n, fsdp_fmt_bytes(b_cls, 32, (double)cls),
                                  fsdp_fmt_bytes(b_held, 32, (double)c->held_bytes));
        }
        FSDP_TRY(st);
    }
    return FSDP_STATUS_OK;
}

fsdp_status fsdp_block_cache_free(fsdp_block_cache *c, void *p)
{
    size_t i = 0;
    while (i < c->n_blocks && c->blocks[i].ptr != p)
        i++;
    FSDP_ASSERT(i < c->n_blocks && c->blocks[i].state == FSDP_BLOCK_LIVE);
    struct fsdp_block *b = &c->blocks[i];
    if (b->counted)
        c->counted_bytes -= b->asked;
    b->asked = 0;
    b->counted = false;
    fsdp_status st =
        c->iface->fence_record ? c->iface->fence_record(c->ctx, &b->fence) : FSDP_STATUS_OK;
    if (st != FSDP_STATUS_OK) {
        b->state = FSDP_BLOCK_DEAD;
        return st;
    }
    b->state = FSDP_BLOCK_FREE;
    b->freed_at = ++c->n_frees;
    c->free_bytes += b->bytes;
    return FSDP_STATUS_OK;
}

size_t fsdp_block_cache_block_bytes(const fsdp_block_cache *c, const void *p)
{
    for (size_t i = 0; i < c->n_blocks; i++)
        if (c->blocks[i].ptr == p)
            return c->blocks[i].bytes;
    return 0;
}

fsdp_status fsdp_block_cache_trim(fsdp_block_cache *c)
{
    size_t back = 0;
    return give_back(c, false, &back);
}

fsdp_status fsdp_block_cache_dev_alloc(fsdp_block_cache *c, size_t *reserved_bytes, size_t bytes,
                                       void **out)
{
    fsdp_status st = fsdp_block_cache_alloc(c, bytes, true, out);
    *reserved_bytes = fsdp_block_cache_reserved(c);
    return st;
}

void fsdp_block_cache_dev_free(fsdp_block_cache *c, size_t *reserved_bytes, void *p)
{
    /* A fence that cannot be recorded (a sticky error) retires the block;
     * the error is left on the thread for the next check to find. */
    fsdp_block_cache_free(c, p);
    *reserved_bytes = fsdp_block_cache_reserved(c);
}

fsdp_status fsdp_block_cache_dev_reserve(fsdp_block_cache *c, size_t *reserved_bytes,
                                         size_t bytes, size_t n)
{
    fsdp_status st = fsdp_block_cache_reserve(c, bytes, n);
    *reserved_bytes = fsdp_block_cache_reserved(c);
    return st;
}
