/*
 * test_cuda.c - the cuda device: the block cache behind its allocations
 * (with a fake driver and fences, so it runs everywhere), then on a GPU:
 * the allocator serves the engine's per-unit alloc/free pattern, and the
 * engine's steps themselves, without a single cudaMalloc after the
 * engine's warm-up (fsdp_device_reserve), counts exactly the bytes
 * asked for (as cpu and meta do) and reports the rest as reserved; copies
 * from and to pageable host memory go through pinned staging and give the
 * same bytes in any size; without a GPU (or CUDA) the backend fails
 * cleanly with a message.
 *
 * The op comparisons live in test_cuda_ops.c, the collectives in
 * test_cuda_comm.c. GPU tests skip cleanly without a device (cuda_test.h).
 */
#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/cuda_comm.h"
#include "core/world.h"
#include "cuda_test.h"
#include "data/data.h"
#include "device/block_cache.h"
#include "device/cuda_device.h"
#include "device/device.h"
#include "engine/engine.h"
#include "models/registry.h"
#include "ops/ops.h"
#include "testutil.h"
#include "train/fit.h"

/* ---- the block cache with a fake driver ------------------------------------ */

/* Fences are tickets: a fence records the number of the last piece of
 * "stream work" issued; the fake device has finished work up to `done`. */
struct fake {
    size_t limit;       /* bytes the fake driver can hand out */
    size_t raw_in_use;
    long issued, done;
    int n_raw_alloc, n_raw_free, n_order, n_wait, n_fences;
    long last_order;    /* the ticket the streams were last made to wait for */
    int fail_record;    /* fence_record fails when set */
};

static fsdp_status fake_raw_alloc(void *ctx, size_t bytes, void **out)
{
    struct fake *f = ctx;
    if (f->raw_in_use + bytes > f->limit)
        return FSDP_STATUS_OOM;
    *out = malloc(bytes);
    if (!*out)
        return FSDP_STATUS_OOM;
    memset(*out, 0xA5, bytes < 64 ? bytes : 64);
    f->raw_in_use += bytes;
    f->n_raw_alloc++;
    return FSDP_STATUS_OK;
}

/* The fake stores each block's size in front of nothing: track by a
 * side table instead of reading the block. */
static struct { void *p; size_t bytes; } fake_sizes[256];

static void fake_note(void *p, size_t bytes)
{
    for (int i = 0; i < 256; i++)
        if (!fake_sizes[i].p) {
            fake_sizes[i].p = p;
            fake_sizes[i].bytes = bytes;
            return;
        }
    ck_abort_msg("fake size table full");
}

static fsdp_status fake_raw_alloc_noted(void *ctx, size_t bytes, void **out)
{
    FSDP_TRY(fake_raw_alloc(ctx, bytes, out));
    fake_note(*out, bytes);
    return FSDP_STATUS_OK;
}

static void fake_raw_free(void *ctx, void *p)
{
    struct fake *f = ctx;
    for (int i = 0; i < 256; i++)
        if (fake_sizes[i].p == p) {
            f->raw_in_use -= fake_sizes[i].bytes;
            fake_sizes[i].p = NULL;
        }
    free(p);
    f->n_raw_free++;
}

static fsdp_status fake_record(void *ctx, void **fence)
{
    struct fake *f = ctx;
    if (f->fail_record)
        return fsdp_error_set(FSDP_STATUS_CUDA, "fake: cannot record");
    if (!*fence) {
        *fence = malloc(sizeof(long));
        f->n_fences++;
    }
    *(long *)*fence = f->issued;
    return FSDP_STATUS_OK;
}

static fsdp_status fake_query(void *ctx, void *fence, bool *done)
{
    struct fake *f = ctx;
    *done = *(long *)fence <= f->done;
    return FSDP_STATUS_OK;
}

static fsdp_status fake_order(void *ctx, void *fence)
{
    struct fake *f = ctx;
    f->n_order++;
    f->last_order = *(long *)fence;
    return FSDP_STATUS_OK;
}

static fsdp_status fake_wait(void *ctx, void *fence)
{
    struct fake *f = ctx;
    f->n_wait++;
    if (f->done < *(long *)fence)
        f->done = *(long *)fence;
    return FSDP_STATUS_OK;
}

static void fake_destroy(void *ctx, void *fence)
{
    struct fake *f = ctx;
    f->n_fences--;
    free(fence);
}

static const fsdp_block_cache_i fake_i = {
    .raw_alloc = fake_raw_alloc_noted,
    .raw_free = fake_raw_free,
    .fence_record = fake_record,
    .fence_query = fake_query,
    .fence_order = fake_order,
    .fence_wait = fake_wait,
    .fence_destroy = fake_destroy,
};

static void *cache_alloc(fsdp_block_cache *c, size_t bytes, bool counted)
{
    void *p = NULL;
    fsdp_status st = fsdp_block_cache_alloc(c, bytes, counted, &p);
    ck_assert_msg(st == FSDP_STATUS_OK, "alloc %zu: %s", bytes, fsdp_error_msg());
    ck_assert_ptr_nonnull(p);
    return p;
}

START_TEST(test_block_cache_classes)
{
    ck_assert_uint_eq(fsdp_block_cache_class(1), 512);
    ck_assert_uint_eq(fsdp_block_cache_class(512), 512);
    ck_assert_uint_eq(fsdp_block_cache_class(513), 1024);
    ck_assert_uint_eq(fsdp_block_cache_class((size_t)1 << 20), (size_t)1 << 20);
    ck_assert_uint_eq(fsdp_block_cache_class(((size_t)1 << 20) + 1), ((size_t)1 << 20) + (128 << 10));
    ck_assert_uint_eq(fsdp_block_cache_class((size_t)33 << 20), (size_t)34 << 20);
    ck_assert_uint_eq(fsdp_block_cache_class(((size_t)64 << 20) + 1), (size_t)66 << 20);
}
END_TEST

/* The engine's per-unit pattern: alloc gathered(u+1), use, free gathered(u),
 * for many units and steps, the device lagging one piece of work behind.
 * The cache holds exactly the blocks live at once (root + 2 units) and never
 * asks the driver again after the first step; a pending block is reused
 * with the streams ordered after its fence. With one more block reserved
 * ahead, the driver is not asked during the steps at all and every
 * request finds a done block. */
static void steady_pattern(fsdp_block_cache *c, struct fake *f, size_t unit, int steps,
                           int *raw_after_step1)
{
    for (int step = 0; step < steps; step++) {
        void *cur = cache_alloc(c, unit, true);
        f->issued++; /* gather(0) queued */
        for (int u = 1; u < 12; u++) {
            void *next = cache_alloc(c, unit, true);
            ck_assert_ptr_ne(next, cur);
            f->issued++; /* gather(u) and forward(u-1) queued */
            f->done = f->issued - 1; /* the device lags one piece of work behind */
            ck_assert_int_eq(fsdp_block_cache_free(c, cur), FSDP_STATUS_OK);
            cur = next;
        }
        f->done = f->issued;
        ck_assert_int_eq(fsdp_block_cache_free(c, cur), FSDP_STATUS_OK);
        if (step == 0)
            *raw_after_step1 = f->n_raw_alloc;
    }
}

START_TEST(test_block_cache_steady_state)
{
    struct fake f = {.limit = (size_t)1 << 30};
    memset(fake_sizes, 0, sizeof fake_sizes);
    fsdp_block_cache c;
    fsdp_block_cache_init(&c, &fake_i, &f);
    const size_t unit = 3000000, root = 1000000;
    void *r = cache_alloc(&c, root, true); /* stays for the whole run */
    int raw_after_step1 = 0;
    steady_pattern(&c, &f, unit, 5, &raw_after_step1);
    ck_assert_int_eq(f.n_raw_alloc, raw_after_step1);
    ck_assert_int_eq(raw_after_step1, 1 + 2); /* root + the two units live at once */
    ck_assert_int_gt(f.n_order, 0);           /* the pending one, ordered on the device */
    ck_assert_int_eq(f.n_wait, 0);            /* never a host wait */
    /* counted bytes are exactly what was asked; the rest is reserved */
    ck_assert_uint_eq(c.counted_bytes, root);
    ck_assert_uint_eq(fsdp_block_cache_reserved(&c), c.held_bytes - root);
    ck_assert_uint_eq(c.free_bytes, c.held_bytes - fsdp_block_cache_class(root));
    ck_assert_int_eq(fsdp_block_cache_free(&c, r), FSDP_STATUS_OK);
    ck_assert_uint_eq(c.counted_bytes, 0);
    fsdp_block_cache_fini(&c);
    ck_assert_int_eq(f.n_raw_free, f.n_raw_alloc);
    ck_assert_uint_eq(f.raw_in_use, 0);
    ck_assert_int_eq(f.n_fences, 0);

    /* three blocks reserved ahead: no driver call in any step, no ordering */
    struct fake g = {.limit = (size_t)1 << 30};
    memset(fake_sizes, 0, sizeof fake_sizes);
    fsdp_block_cache_init(&c, &fake_i, &g);
    ck_assert_int_eq(fsdp_block_cache_reserve(&c, unit, 3), FSDP_STATUS_OK);
    ck_assert_int_eq(g.n_raw_alloc, 3);
    ck_assert_uint_eq(fsdp_block_cache_reserved(&c), 3 * fsdp_block_cache_class(unit));
    ck_assert_uint_eq(c.counted_bytes, 0);
    steady_pattern(&c, &g, unit, 3, &raw_after_step1);
    ck_assert_int_eq(g.n_raw_alloc, 3);
    ck_assert_int_eq(g.n_order, 0);
    ck_assert_int_eq(g.n_wait, 0);
    fsdp_block_cache_fini(&c);
    ck_assert_uint_eq(g.raw_in_use, 0);
}
END_TEST

/* A pending block of the size is reused before the driver is asked (the
 * streams ordered after its fence); the smallest fitting size wins over a
 * larger done block, so which size a request takes never depends on the
 * device's progress; when the driver has no memory, free blocks of other
 * sizes go back to it (pending ones after a host wait); reserving more
 * than the driver has fails with a message and keeps what it got. */
START_TEST(test_block_cache_pressure)
{
    memset(fake_sizes, 0, sizeof fake_sizes);
    const size_t MB = (size_t)1 << 20;
    struct fake f = {.limit = 10 * MB};
    fsdp_block_cache c;
    fsdp_block_cache_init(&c, &fake_i, &f);
    void *a = cache_alloc(&c, 4 * MB, true);
    f.issued = 7; /* work that uses a */
    ck_assert_int_eq(fsdp_block_cache_free(&c, a), FSDP_STATUS_OK);
    /* pending: reused at once, ordered after ticket 7, no new block */
    void *b = cache_alloc(&c, 4 * MB - 100, false);
    ck_assert_ptr_eq(b, a);
    ck_assert_int_eq(f.n_raw_alloc, 1);
    ck_assert_int_eq(f.n_order, 1);
    ck_assert_int_eq(f.last_order, 7);
    ck_assert_uint_eq(c.counted_bytes, 0); /* b is the backend's own */
    ck_assert_uint_eq(fsdp_block_cache_reserved(&c), 4 * MB);
    /* none free: a new block */
    void *a2 = cache_alloc(&c, 4 * MB, true);
    ck_assert_ptr_ne(a2, b);
    ck_assert_int_eq(f.n_raw_alloc, 2);
    ck_assert_uint_eq(c.counted_bytes, 4 * MB);
    /* a different size: the two free blocks are given back (one after a
     * host wait), then the driver has room */
    f.issued = 8;
    ck_assert_int_eq(fsdp_block_cache_free(&c, b), FSDP_STATUS_OK);
    f.done = 8;
    f.issued = 9;
    ck_assert_int_eq(fsdp_block_cache_free(&c, a2), FSDP_STATUS_OK);
    void *big = cache_alloc(&c, 9 * MB, true);
    ck_assert_int_eq(f.n_raw_free, 2);
    ck_assert_int_eq(f.n_wait, 1);
    ck_assert_uint_eq(c.held_bytes, 9 * MB);
    /* nothing fits at all: OOM with a message */
    void *none = NULL;
    ck_assert_int_eq(fsdp_block_cache_alloc(&c, 2 * MB, true, &none), FSDP_STATUS_OOM);
    ck_assert_ptr_null(none);
    ck_assert_ptr_nonnull(strstr(fsdp_error_msg(), "no memory left"));
    /* a block much larger than asked is not handed out */
    ck_assert_int_eq(fsdp_block_cache_free(&c, big), FSDP_STATUS_OK);
    f.done = f.issued;
    void *small = cache_alloc(&c, 1 * MB, true);
    ck_assert_ptr_ne(small, big);
    /* trim gives back the done free blocks */
    ck_assert_int_eq(fsdp_block_cache_trim(&c), FSDP_STATUS_OK);
    ck_assert_uint_eq(c.held_bytes, 1 * MB);
    /* the smallest fitting size, pending, beats a larger done one (a block
     * up to a quarter larger fits too) */
    void *x = cache_alloc(&c, MB + (200 << 10), true); /* class 1.25 MiB */
    ck_assert_int_eq(fsdp_block_cache_free(&c, x), FSDP_STATUS_OK);
    f.done = f.issued;        /* x done */
    f.issued = 30;
    ck_assert_int_eq(fsdp_block_cache_free(&c, small), FSDP_STATUS_OK); /* pending */
    int raw = f.n_raw_alloc, orders = f.n_order;
    void *s2 = cache_alloc(&c, 1 * MB, true);
    ck_assert_ptr_eq(s2, small);
    ck_assert_int_eq(f.n_order, orders + 1);
    void *x2 = cache_alloc(&c, MB + (200 << 10), true);
    ck_assert_ptr_eq(x2, x);
    ck_assert_int_eq(f.n_raw_alloc, raw);
    ck_assert_int_eq(fsdp_block_cache_free(&c, s2), FSDP_STATUS_OK);
    ck_assert_int_eq(fsdp_block_cache_free(&c, x2), FSDP_STATUS_OK);
    f.done = f.issued;
    ck_assert_int_eq(fsdp_block_cache_trim(&c), FSDP_STATUS_OK);
    ck_assert_uint_eq(c.held_bytes, 0);
    /* a fence that cannot be recorded retires the block */
    void *y = cache_alloc(&c, 1 * MB, true);
    f.fail_record = 1;
    ck_assert_int_eq(fsdp_block_cache_free(&c, y), FSDP_STATUS_CUDA);
    f.fail_record = 0;
    void *other = cache_alloc(&c, 1 * MB, true);
    ck_assert_ptr_ne(other, y);
    ck_assert_int_eq(fsdp_block_cache_free(&c, other), FSDP_STATUS_OK);
    /* reserving past the driver's memory: OOM naming the block, the rest kept */
    size_t held = c.held_bytes;
    ck_assert_int_eq(fsdp_block_cache_reserve(&c, 3 * MB, 4), FSDP_STATUS_OOM);
    ck_assert_ptr_nonnull(strstr(fsdp_error_msg(), "reserve block 3 of 4"));
    ck_assert_uint_eq(c.held_bytes, held + 6 * MB);
    fsdp_block_cache_fini(&c);
    ck_assert_uint_eq(f.raw_in_use, 0);
    ck_assert_int_eq(f.n_raw_free, f.n_raw_alloc);
}
END_TEST

/* ---- the cuda device ------------------------------------------------------- */

/* Without a GPU (or without CUDA) the cuda backend fails cleanly, with a
 * message, and so does the query of its memory (simulated devices have no
 * size: 0); with a GPU it initialises. */
START_TEST(test_cuda_init_or_clean_error)
{
    size_t total = 1, free_bytes = 1;
    ck_assert_int_eq(fsdp_backend_device_total(FSDP_BACKEND_CPU, 4, &total), FSDP_STATUS_OK);
    ck_assert_uint_eq(total, 0);
    ck_assert_int_eq(fsdp_backend_device_total(FSDP_BACKEND_META, 4, &total), FSDP_STATUS_OK);
    ck_assert_uint_eq(total, 0);
    if (fsdp_cuda_device_count() == 0) {
        ck_assert_int_eq(fsdp_backend_device_total(FSDP_BACKEND_CUDA, 1, &total),
                         FSDP_STATUS_UNSUPPORTED);
        ck_assert_ptr_nonnull(strstr(fsdp_error_msg(), "no cuda device is visible"));
        ck_assert_int_eq(fsdp_cuda_device_memory(0, &total, &free_bytes), FSDP_STATUS_UNSUPPORTED);
        ck_assert_uint_eq(total, 0);
        ck_assert_ptr_nonnull(strstr(fsdp_error_msg(), built_with_cuda ? "0 GPU(s) are visible"
                                                                       : "CUDA=0"));
    }
    fsdp_device d;
    fsdp_status st = fsdp_device_init(&d, FSDP_BACKEND_CUDA, NULL, 0, 0, 0);
    if (!built_with_cuda) {
        ck_assert_int_eq(st, FSDP_STATUS_UNSUPPORTED);
        ck_assert(strlen(fsdp_error_msg()) > 0);
        fsdp_comm c;
        ck_assert_int_eq(fsdp_comm_nccl_init(&c, NULL, &d, 0), FSDP_STATUS_UNSUPPORTED);
        ck_assert(strstr(fsdp_error_msg(), "CUDA=0") != NULL);
        ck_assert_int_eq(fsdp_comm_peer_init(&c, NULL, &d, 0), FSDP_STATUS_UNSUPPORTED);
        ck_assert(strstr(fsdp_error_msg(), "CUDA=0") != NULL);
        fsdp_op_ctx ctx = {0};
        ck_assert_int_eq(fsdp_ops_cuda_init(&ctx), FSDP_STATUS_UNSUPPORTED);
        ck_assert_ptr_null(fsdp_cuda_device_cache(&d));
        return;
    }
    if (fsdp_cuda_device_count() == 0) {
        ck_assert_int_ne(st, FSDP_STATUS_OK);
        ck_assert(strlen(fsdp_error_msg()) > 0);
        return;
    }
    ck_assert_msg(st == FSDP_STATUS_OK, "%s", fsdp_error_msg());
    fsdp_op_ctx ctx;
    ck_assert_msg(fsdp_ops_init(&ctx, &d, FSDP_DTYPE_BF16) == FSDP_STATUS_OK, "%s",
                  fsdp_error_msg());
    ck_assert_ptr_nonnull(ctx.backend);
    /* the cuBLAS workspace is the backend's own: reserved, not in use
     * (cpu and meta have none, and the planner counts none) */
    ck_assert_uint_eq(d.mem.in_use_bytes, 0);
    ck_assert_uint_ge(d.mem.reserved_bytes, (size_t)32 << 20);
    fsdp_ops_fini(&ctx);
    fsdp_device_fini(&d);
}
END_TEST

/* The engine's pattern (gather u+1 on the comm stream while u computes,
 * a gradient buffer per unit, accumulation slots kept, frees stream-ordered
 * with no host wait before them, as the engine's release does) for three
 * steps on a cuda and a cpu device side by side, after the engine's kind
 * of warm-up (fsdp_device_reserve): the cuda device never asks the driver
 * for memory during the steps; in-use bytes, peaks, kind breakdown and
 * allocation counts equal the cpu's exactly, and so do the warm-up
 * ledgers; every gathered unit still holds what was written into it. */
#define PAT_ROOT ((size_t)300000)
#define PAT_UNIT ((size_t)2100000)
#define PAT_GRAD ((size_t)4200000)
#define PAT_ACC ((size_t)525000)

/* What the pattern holds at once: the root, two units, one gradient, the
 * twelve accumulation slots. */
static void reserve_pattern(fsdp_device *d)
{
    ck_assert_int_eq(fsdp_device_reserve(d, PAT_ROOT, 1), FSDP_STATUS_OK);
    ck_assert_int_eq(fsdp_device_reserve(d, PAT_UNIT, 2), FSDP_STATUS_OK);
    ck_assert_int_eq(fsdp_device_reserve(d, PAT_GRAD, 1), FSDP_STATUS_OK);
    ck_assert_int_eq(fsdp_device_reserve(d, PAT_ACC, 12), FSDP_STATUS_OK);
}

static void run_pattern(fsdp_device *d, void **acc, int check_data, int *bad)
{
    const size_t root = PAT_ROOT, unit = PAT_UNIT, grad = PAT_GRAD, acc_bytes = PAT_ACC;
    void *r = NULL, *cur = NULL, *next = NULL, *g = NULL;
    ck_assert_int_eq(fsdp_device_alloc(d, root, FSDP_MEM_GATHER, "root", &r), FSDP_STATUS_OK);
    ck_assert_int_eq(fsdp_device_alloc(d, unit, FSDP_MEM_GATHER, "unit 0", &cur), FSDP_STATUS_OK);
    fsdp_device_memset(d, cur, 1, unit, d->comm);
    for (int u = 1; u <= 12; u++) {
        if (u < 12) {
            ck_assert_int_eq(fsdp_device_alloc(d, unit, FSDP_MEM_GATHER, "unit", &next),
                             FSDP_STATUS_OK);
            fsdp_device_memset(d, next, (u + 1) & 0xff, unit, d->comm); /* the "gather" */
        }
        ck_assert_int_eq(fsdp_device_alloc(d, grad, FSDP_MEM_GRAD, "grad", &g), FSDP_STATUS_OK);
        fsdp_device_memset(d, g, 0x40 + u, grad, d->compute);
        if (!acc[u - 1])
            ck_assert_int_eq(fsdp_device_alloc(d, acc_bytes, FSDP_MEM_GRAD, "acc", &acc[u - 1]),
                             FSDP_STATUS_OK);
        if (check_data) {
            /* the gathered unit holds its own bytes (read in order after
             * its writer, on the comm stream) */
            unsigned char probe[4096];
            ck_assert_int_eq(fsdp_device_memcpy(d, probe, (char *)cur + unit - sizeof probe,
                                                sizeof probe, d->comm),
                             FSDP_STATUS_OK);
            for (size_t i = 0; i < sizeof probe; i++)
                *bad += probe[i] != (unsigned char)(u & 0xff);
        }
        fsdp_device_free(d, g);
        fsdp_device_free(d, cur);
        cur = next;
        next = NULL;
    }
    fsdp_device_free(d, r);
}

START_TEST(test_cuda_alloc_cached_and_counted_exactly)
{
    NEED_GPU("test_cuda_alloc_cached_and_counted_exactly");
    fsdp_device g, c;
    device_init_ok(&g, FSDP_BACKEND_CUDA);
    ck_assert_int_eq(fsdp_device_init(&c, FSDP_BACKEND_CPU, NULL, 0, 0, 0), FSDP_STATUS_OK);
    const fsdp_block_cache *cache = fsdp_cuda_device_cache(&g);
    ck_assert_ptr_nonnull(cache);
    void *acc_g[12] = {0}, *acc_c[12] = {0};
    int bad = 0;
    reserve_pattern(&g);
    reserve_pattern(&c);
    ck_assert_uint_eq(g.mem.n_allocs, 0);
    ck_assert_uint_eq(g.mem.in_use_bytes, 0);
    /* the cpu device reserves the same blocks in its own cache */
    const size_t c_held = fsdp_block_cache_class(PAT_ROOT) + 2 * fsdp_block_cache_class(PAT_UNIT) +
                          fsdp_block_cache_class(PAT_GRAD) + 12 * fsdp_block_cache_class(PAT_ACC);
    ck_assert_uint_eq(c.mem.reserved_bytes, c_held);
    size_t raw_after_reserve = cache->n_raw_allocs;
    ck_assert_uint_eq(raw_after_reserve, 1 + 2 + 1 + 12);
    ck_assert_uint_eq(g.mem.reserved_bytes, cache->held_bytes);
    for (int step = 0; step < 3; step++) {
        run_pattern(&g, acc_g, 1, &bad);
        run_pattern(&c, acc_c, 0, &bad);
        ck_assert_uint_eq(g.mem.in_use_bytes, c.mem.in_use_bytes);
        ck_assert_uint_eq(g.mem.peak_bytes, c.mem.peak_bytes);
        ck_assert_uint_eq(g.mem.n_allocs, c.mem.n_allocs);
        for (int k = 0; k < FSDP_MEM_KIND_COUNT; k++) {
            ck_assert_uint_eq(g.mem.kind_bytes[k], c.mem.kind_bytes[k]);
            ck_assert_uint_eq(g.mem.peak_kind_bytes[k], c.mem.peak_kind_bytes[k]);
        }
        ck_assert_uint_eq(g.mem.reserved_bytes, cache->held_bytes - g.mem.in_use_bytes);
        ck_assert_uint_eq(c.mem.reserved_bytes, c_held - c.mem.in_use_bytes);
    }
    ck_assert_int_eq(bad, 0);
    /* no driver call in any step: every allocation was a reserved block */
    ck_assert_uint_eq(cache->n_raw_allocs, raw_after_reserve);
    ck_assert_uint_eq(cache->n_reused, g.mem.n_allocs);
    ck_assert_uint_eq(cache->n_raw_frees, 0);
    ck_assert_uint_eq(g.n_resv_misses, 0);
    ck_assert_uint_eq(c.n_resv_misses, 0);
    ck_assert_uint_eq(g.n_resv, c.n_resv);
    for (size_t i = 0; i < g.n_resv; i++) {
        ck_assert_uint_eq(g.resv[i].peak_live, c.resv[i].peak_live);
        ck_assert_uint_eq(g.resv[i].peak_live, g.resv[i].n);
    }
    for (int u = 0; u < 12; u++) {
        fsdp_device_free(&g, acc_g[u]);
        fsdp_device_free(&c, acc_c[u]);
    }
    ck_assert_uint_eq(g.mem.in_use_bytes, 0);
    ck_assert_uint_eq(g.mem.reserved_bytes, cache->held_bytes);
    fsdp_device_fini(&g);
    fsdp_device_fini(&c);
}
END_TEST

/* The GPU's memory as the device layer reports it, and `fsdp train`'s fit
 * check against it: a run the plan says needs more than the GPU has is
 * refused before anything is allocated, naming the GPU's memory. */
START_TEST(test_cuda_memory_and_fit_check)
{
    NEED_GPU("test_cuda_memory_and_fit_check");
    size_t total = 0, free_bytes = 0, least = 0;
    ck_assert_msg(fsdp_cuda_device_memory(0, &total, &free_bytes) == FSDP_STATUS_OK, "%s",
                  fsdp_error_msg());
    ck_assert_uint_gt(total, (size_t)1 << 30);
    ck_assert_uint_le(free_bytes, total);
    int n = fsdp_cuda_device_count();
    ck_assert_int_eq(fsdp_cuda_device_memory(n, &total, &free_bytes), FSDP_STATUS_UNSUPPORTED);
    ck_assert_int_eq(fsdp_backend_device_total(FSDP_BACKEND_CUDA, 64, &least), FSDP_STATUS_OK);
    ck_assert_uint_gt(least, (size_t)1 << 30);
    fsdp_train_config c;
    fsdp_train_config_default(&c);
    c.model = "gpt2-xl";
    c.eng.backend = FSDP_BACKEND_CUDA;
    c.eng.n_ranks = 1;
    c.eng.batch = 64; /* about 650 GiB: beyond any GPU's memory */
    c.eng.seq = 1024;
    c.out = NULL;
    ck_assert_int_eq(fsdp_fit_check_train(&c, least), FSDP_STATUS_OOM);
    ck_assert_msg(strstr(fsdp_error_msg(), "the GPU's memory") &&
                      strstr(fsdp_error_msg(), "does not fit"),
                  "%s", fsdp_error_msg());
    c.eng.batch = 1;
    c.eng.seq = 64;
    c.model = "tiny";
    ck_assert_msg(fsdp_fit_check_train(&c, least) == FSDP_STATUS_OK, "%s", fsdp_error_msg());
}
END_TEST

/* The engine on a GPU (two virtual ranks, peer): after its warm-up, none
 * of its steps asks the driver for a counted buffer (gathered units, full
 * gradients, accumulation), the first one included, and after the first
 * step not even for the backend's own buffers (op scratch, peer staging,
 * which grow on first use); bf16 and fp32, with and without prefetch. */
struct engine_raw {
    fsdp_engine_shared *sh;
    size_t counted[2][4], raw[2][4]; /* per rank: after init, after steps 1..3 */
};

static fsdp_status engine_raw_rank(fsdp_world *w, int rank, void *arg)
{
    (void)w;
    struct engine_raw *a = arg;
    fsdp_engine *e = NULL;
    FSDP_TRY(fsdp_engine_init(&e, a->sh, rank));
    const fsdp_block_cache *cache = fsdp_cuda_device_cache(fsdp_engine_device(e));
    fsdp_status st = FSDP_STATUS_OK;
    for (int s = 0; s <= 3 && st == FSDP_STATUS_OK; s++) {
        if (s > 0) {
            fsdp_step_result res;
            st = fsdp_engine_step(e, (uint64_t)(s - 1), 1e-3f, &res);
        }
        a->counted[rank][s] = cache->n_raw_counted;
        a->raw[rank][s] = cache->n_raw_allocs;
    }
    fsdp_engine_free(e);
    return st;
}

START_TEST(test_cuda_engine_steps_never_ask_the_driver)
{
    NEED_GPU("test_cuda_engine_steps_never_ask_the_driver");
    fsdp_model m;
    ck_assert_int_eq(fsdp_model_from_spec("tiny", &m), FSDP_STATUS_OK);
    fsdp_data *data = NULL;
    ck_assert_int_eq(fsdp_data_open(&data, "synthetic", m.vocab_size, 7), FSDP_STATUS_OK);
    for (int v = 0; v < 4; v++) {
        fsdp_world *w = NULL;
        ck_assert_int_eq(fsdp_world_init(&w, 2), FSDP_STATUS_OK);
        fsdp_engine_config c = {.backend = FSDP_BACKEND_CUDA, .comm = FSDP_COMM_PEER,
                                .n_ranks = 2, .ranks_per_device = 2, .shard = FSDP_SHARD_FULL,
                                .compute_dtype = (v & 1) ? FSDP_DTYPE_BF16 : FSDP_DTYPE_F32,
                                .prefetch = (v & 2) != 0, .batch = 2, .seq = 16,
                                .grad_accum = 2, .clip = 1.0f, .seed = 1}; /* AdamW: defaults */
        fsdp_engine_shared sh;
        ck_assert_int_eq(fsdp_engine_shared_init(&sh, &c, &m, data, w), FSDP_STATUS_OK);
        struct engine_raw a = {.sh = &sh};
        ck_assert_msg(fsdp_world_launch(w, engine_raw_rank, &a) == FSDP_STATUS_OK, "%s",
                      fsdp_error_msg());
        for (int r = 0; r < 2; r++) {
            ck_assert_msg(a.counted[r][3] == a.counted[r][0],
                          "variant %d rank %d: %zu counted buffers came from the driver in the "
                          "steps", v, r, a.counted[r][3] - a.counted[r][0]);
            ck_assert_msg(a.raw[r][3] == a.raw[r][1],
                          "variant %d rank %d: %zu driver allocations after the first step", v,
                          r, a.raw[r][3] - a.raw[r][1]);
        }
        fsdp_engine_shared_free(&sh);
        fsdp_world_free(w);
    }
    fsdp_data_close(data);
    fsdp_model_free(&m);
}
END_TEST

/* A block freed while a stream still writes it is not handed out before
 * that write is done: the copy stream is kept busy writing 0x11 into a
 * block that is freed at once; a block of the same size is then filled
 * with 0x22 on the compute stream and must read back as 0x22 everywhere. */
START_TEST(test_cuda_alloc_waits_for_last_user)
{
    NEED_GPU("test_cuda_alloc_waits_for_last_user");
    fsdp_device d;
    device_init_ok(&d, FSDP_BACKEND_CUDA);
    const size_t n = (size_t)256 << 20;
    unsigned char *h = malloc(n);
    ck_assert_ptr_nonnull(h);
    size_t bad = 0;
    for (int round = 0; round < 4; round++) {
        void *a = NULL, *b = NULL;
        ck_assert_int_eq(fsdp_device_alloc(&d, n, FSDP_MEM_ACT, "busy", &a), FSDP_STATUS_OK);
        for (int k = 0; k < 16; k++) /* ~4 GiB of writes queued */
            ck_assert_int_eq(fsdp_device_memset(&d, a, 0x11, n, d.copy), FSDP_STATUS_OK);
        fsdp_device_free(&d, a);
        ck_assert_int_eq(fsdp_device_alloc(&d, n, FSDP_MEM_ACT, "next", &b), FSDP_STATUS_OK);
        ck_assert_int_eq(fsdp_device_memset(&d, b, 0x22, n, d.compute), FSDP_STATUS_OK);
        ck_assert_int_eq(fsdp_device_memcpy(&d, h, b, n, d.compute), FSDP_STATUS_OK);
        for (size_t i = 0; i < n; i++)
            bad += h[i] != 0x22;
        ck_assert_int_eq(fsdp_device_stream_sync(&d, d.copy), FSDP_STATUS_OK);
        fsdp_device_free(&d, b);
    }
    ck_assert_msg(bad == 0, "%zu bytes of a reused block were overwritten by its previous user", bad);
    free(h);
    fsdp_device_fini(&d);
}
END_TEST

/* Copies from and to pageable host memory (staged through pinned buffers)
 * and pinned memory, of sizes around the staging buffer's, in stream order
 * with device work, give exactly the bytes; the source of a host-to-device
 * copy may be reused as soon as the call returns. */
START_TEST(test_cuda_copies_pageable_and_pinned)
{
    NEED_GPU("test_cuda_copies_pageable_and_pinned");
    fsdp_device d;
    device_init_ok(&d, FSDP_BACKEND_CUDA);
    const size_t MB = (size_t)1 << 20;
    const size_t sizes[] = {1, 4097, 8 * MB - 3, 8 * MB, 8 * MB + 5, 20 * MB + 7};
    const size_t max = 20 * MB + 7;
    unsigned char *src = malloc(max), *back = malloc(max), *pinned = NULL;
    ck_assert(src && back);
    ck_assert_int_eq(fsdp_device_host_alloc(&d, max, FSDP_MEM_OTHER, "test pinned", (void **)&pinned),
                     FSDP_STATUS_OK);
    void *dev = NULL;
    ck_assert_int_eq(fsdp_device_alloc(&d, max, FSDP_MEM_OTHER, "test", &dev), FSDP_STATUS_OK);
    for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
        size_t n = sizes[k];
        for (size_t i = 0; i < n; i++)
            src[i] = (unsigned char)(i * 131 + k * 7 + (i >> 13));
        /* pageable -> device, then the source is overwritten at once */
        ck_assert_int_eq(fsdp_device_memset(&d, dev, 0xEE, max, d.copy), FSDP_STATUS_OK);
        ck_assert_int_eq(fsdp_device_stream_sync(&d, d.copy), FSDP_STATUS_OK);
        ck_assert_int_eq(fsdp_device_memcpy(&d, dev, src, n, d.copy), FSDP_STATUS_OK);
        unsigned char keep0 = src[0];
        memset(src, 0x11, n);
        /* device -> pageable: returns with the data there */
        memset(back, 0, max);
        ck_assert_int_eq(fsdp_device_memcpy(&d, back, dev, n, d.copy), FSDP_STATUS_OK);
        ck_assert_int_eq(back[0], keep0);
        for (size_t i = 0; i < n; i++)
            if (back[i] != (unsigned char)(i * 131 + k * 7 + (i >> 13)))
                ck_abort_msg("size %zu: byte %zu is %d after a pageable round trip", n, i, back[i]);
        /* after device work on the same stream, in order */
        ck_assert_int_eq(fsdp_device_memset(&d, dev, 0x5A, n, d.compute), FSDP_STATUS_OK);
        ck_assert_int_eq(fsdp_device_memcpy(&d, back, dev, n, d.compute), FSDP_STATUS_OK);
        for (size_t i = 0; i < n; i++)
            if (back[i] != 0x5A)
                ck_abort_msg("size %zu: byte %zu read before the memset finished", n, i);
        /* pinned: asynchronous, complete after a sync */
        memset(pinned, 0, n);
        ck_assert_int_eq(fsdp_device_memcpy(&d, pinned, dev, n, d.compute), FSDP_STATUS_OK);
        ck_assert_int_eq(fsdp_device_stream_sync(&d, d.compute), FSDP_STATUS_OK);
        for (size_t i = 0; i < n; i++)
            if (pinned[i] != 0x5A)
                ck_abort_msg("size %zu: pinned byte %zu is %d", n, i, pinned[i]);
    }
    /* host to host */
    memset(src, 0x33, 100);
    ck_assert_int_eq(fsdp_device_memcpy(&d, back, src, 100, d.compute), FSDP_STATUS_OK);
    ck_assert_int_eq(back[99], 0x33);
    fsdp_device_free(&d, dev);
    fsdp_device_host_free(&d, pinned);
    free(src);
    free(back);
    fsdp_device_fini(&d);
}
END_TEST

int main(void)
{
    /* Nothing CUDA here: Check forks each test, and CUDA must not be
     * initialised in the parent. */
    const fsdp_test_tcase tcases[] = {
        {"everywhere", 60,
         FSDP_TESTS(test_block_cache_classes, test_block_cache_steady_state,
                    test_block_cache_pressure, test_cuda_init_or_clean_error)},
        {"device", 120,
         FSDP_TESTS(test_cuda_alloc_cached_and_counted_exactly, test_cuda_alloc_waits_for_last_user,
                    test_cuda_engine_steps_never_ask_the_driver, test_cuda_memory_and_fit_check,
                    test_cuda_copies_pageable_and_pinned)},
    };
    return fsdp_test_main("cuda", tcases, FSDP_TEST_LEN(tcases));
}
