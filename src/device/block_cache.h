/*
 * block_cache.h - a caching allocator for memory that streams use: the
 * cuda device's cudaMalloc/cudaFree leave the training step through it.
 *
 * Why: cudaFree waits for the whole device (so a prefetch can never
 * overlap it) and allocation calls in one thread while another thread's
 * NCCL kernel waits for its peers are a known hang pattern. The engine
 * allocates and frees per unit (gathered parameters, gradient buffers,
 * accumulation slots), always with the same sizes step after step, so a
 * cache of freed blocks serves every allocation after the first step.
 *
 * How: a freed block keeps a fence, recorded at the free, that completes
 * when all the work queued before the free on the owner's streams is done
 * (cuda: one event on each of the compute, comm and copy streams; work of
 * other ranks that reads this rank's buffers is ordered into the comm
 * stream by the collectives). An allocation takes the smallest free block
 * of its size class (or up to a quarter larger); among blocks of that
 * size, one whose fence is done, else the one freed longest ago, with the
 * streams made to wait for its fence on the device (no host wait). Only
 * when no free block fits does it ask the driver for a new one; when the
 * driver is out of memory it gives free blocks back and retries, waiting
 * for pending ones last. Blocks are never split.
 *
 * So the cache holds, per size class, as many blocks as were ever live at
 * once (the host's alloc/free order decides which size a request takes,
 * never the device's progress), and a step that repeats the previous one's
 * allocations never calls the driver. fsdp_block_cache_reserve adds blocks
 * ahead of time, so that even the first step does not, and so that a
 * request can find a done block instead of waiting for a pending one.
 *
 * Accounting: the device layer (device.c) counts exactly the bytes asked
 * for, as the cpu and meta backends do; this cache knows what it holds.
 * reserved = held - the bytes asked for by counted allocations: cached
 * free blocks, size-class rounding, and the backend's own buffers
 * (uncounted allocations: cuBLAS workspace, op scratch, peer staging).
 *
 * Plain C, backend-neutral (the driver calls and fences come as a table),
 * so its logic is tested without a GPU (tests/test_cuda.c). One cache per
 * device, used by the device's rank thread only.
 */
#ifndef FSDP_DEVICE_BLOCK_CACHE_H
#define FSDP_DEVICE_BLOCK_CACHE_H

#include <stdbool.h>
#include <stddef.h>

#include "core/error.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What the backend provides. A fence is backend-owned (void *). */
typedef struct fsdp_block_cache_i {
    /* Memory from the driver: OK, OOM (out of device memory, no message
     * needed) or another error with a message. */
    fsdp_status (*raw_alloc)(void *ctx, size_t bytes, void **out);
    void (*raw_free)(void *ctx, void *p);
    /* Record, into *fence (created when NULL), the point reached by all of
     * the owner's streams now. NULL for an owner whose work is done when
     * the host frees (inline cpu): no fences, every free block is ready, and
     * the other fence slots are never called. */
    fsdp_status (*fence_record)(void *ctx, void **fence);
    /* *done = whether the fence's work has finished (no waiting). */
    fsdp_status (*fence_query)(void *ctx, void *fence, bool *done);
    /* Make all of the owner's streams wait for the fence (device side). */
    fsdp_status (*fence_order)(void *ctx, void *fence);
    /* Wait on the host until the fence is done (may return ABORTED). */
    fsdp_status (*fence_wait)(void *ctx, void *fence);
    void (*fence_destroy)(void *ctx, void *fence);
    /* Whose memory the driver hands out, for the out-of-memory messages
     * ("the GPU", "the host"); NULL: "the device". */
    const char *owner;
} fsdp_block_cache_i;

enum fsdp_block_state { FSDP_BLOCK_LIVE = 1, FSDP_BLOCK_FREE, FSDP_BLOCK_DEAD };

struct fsdp_block {
    void *ptr;
    size_t bytes;        /* the block's size (a size class) */
    size_t asked;        /* LIVE: bytes asked for */
    bool counted;        /* LIVE: counted by the device layer */
    unsigned char state; /* enum fsdp_block_state; DEAD: its fence failed, never reused */
    void *fence;         /* recorded at the last free; NULL before */
    size_t freed_at;     /* FREE: the cache's n_frees at its free (older = smaller) */
};

typedef struct fsdp_block_cache {
    const fsdp_block_cache_i *iface;
    void *ctx;
    struct fsdp_block *blocks; /* every block held, any state */
    size_t n_blocks, cap_blocks;
    size_t held_bytes;         /* sum of block sizes */
    size_t free_bytes;         /* in FREE blocks */
    size_t counted_bytes;      /* asked for by LIVE counted allocations */
    size_t n_raw_allocs, n_raw_frees, n_reused, n_ordered, n_frees;
    size_t n_raw_counted;      /* raw allocations made for counted requests */
} fsdp_block_cache;

/* Size class of a request: multiples of 512 B up to 1 MiB, of 128 KiB up
 * to 32 MiB, of 2 MiB above (SIZE_MAX for a request that cannot be
 * rounded up). */
size_t fsdp_block_cache_class(size_t bytes);

void fsdp_block_cache_init(fsdp_block_cache *c, const fsdp_block_cache_i *iface, void *ctx);
/* Give every block back to the driver and destroy the fences. Blocks still
 * LIVE are released too (the owner is gone). Streams must be idle or
 * stopped: the driver's free may wait for them. */
void fsdp_block_cache_fini(fsdp_block_cache *c);

/* A block of at least `bytes` (> 0) for the owner's streams, in stream
 * order after the previous users of its memory. counted: the device layer
 * counts these bytes (else the backend's own buffer). OOM with a message
 * naming the request and what the cache holds when the driver has no
 * memory left even after every free block was given back. */
fsdp_status fsdp_block_cache_alloc(fsdp_block_cache *c, size_t bytes, bool counted, void **out);
/* Add n free blocks of fsdp_block_cache_class(bytes) from the driver,
 * ready at once (no fence): the owner's later allocations of that size
 * take them instead of calling the driver. OOM (with a message naming the
 * request) when the driver runs out; the blocks added before stay. */
fsdp_status fsdp_block_cache_reserve(fsdp_block_cache *c, size_t bytes, size_t n);
/* Return p (from fsdp_block_cache_alloc) to the cache: its fence is
 * recorded now, so work already queued on the streams may still use it.
 * If the fence cannot be recorded the block is never reused (released at
 * fini) and the error is returned. A pointer the cache does not hold is a
 * bug (FSDP_ASSERT). */
fsdp_status fsdp_block_cache_free(fsdp_block_cache *c, void *p);
/* Give the FREE blocks whose fences are done back to the driver. */
fsdp_status fsdp_block_cache_trim(fsdp_block_cache *c);

/* The size of the block that starts at p (held by the cache, any state);
 * 0 if the cache holds none there. */
size_t fsdp_block_cache_block_bytes(const fsdp_block_cache *c, const void *p);

/* held - counted bytes (see above). */
static inline size_t fsdp_block_cache_reserved(const fsdp_block_cache *c)
{
    return c->held_bytes - c->counted_bytes;
}

/* The alloc, free and reserve of a device whose memory is this cache (cuda,
 * async cpu): the counted calls above, each then storing the cache's
 * reserved bytes in *reserved_bytes (the device's mem.reserved_bytes). */
fsdp_status fsdp_block_cache_dev_alloc(fsdp_block_cache *c, size_t *reserved_bytes, size_t bytes,
                                       void **out);
void fsdp_block_cache_dev_free(fsdp_block_cache *c, size_t *reserved_bytes, void *p);
fsdp_status fsdp_block_cache_dev_reserve(fsdp_block_cache *c, size_t *reserved_bytes,
                                         size_t bytes, size_t n);

#ifdef __cplusplus
}
#endif

#endif /* FSDP_DEVICE_BLOCK_CACHE_H */
