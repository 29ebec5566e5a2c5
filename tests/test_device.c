/*
 * test_device.c - the device layer on the cpu and meta backends: exact
 * memory accounting (in use, peak, live count, by kind, the by-kind
 * snapshot at the peak), alignment, the memory cap and its error message,
 * pinned host memory, the cpu device's block cache (freed blocks reused,
 * their bytes in mem.reserved_bytes, reservations made ahead), injected
 * allocation failures in a launched world,
 * meta's unbacked allocations, the NULL stream/event slots, and the backend
 * table (names, devices offered, defaults, fsdp_backend_check).
 */
#include <check.h>
#include <stdint.h>
#include <string.h>

#include "core/world.h"
#include "device/block_cache.h"
#include "device/device.h"
#include "testutil.h"

/* The simulated backends, which run here (the _i of the loop tests). */
static const fsdp_backend backends[] = {FSDP_BACKEND_CPU, FSDP_BACKEND_META};

static void dev_init(fsdp_device *d, fsdp_backend be, size_t cap)
{
    fsdp_status st = fsdp_device_init(d, be, NULL, 0, 0, cap);
    ck_assert_msg(st == FSDP_STATUS_OK, "%s", fsdp_error_msg());
    ck_assert_int_eq(d->backend, be);
    ck_assert_uint_eq(d->cap_bytes, cap);
}

static void expect_empty(const fsdp_mem_stats *s)
{
    ck_assert_uint_eq(s->in_use_bytes, 0);
    ck_assert_uint_eq(s->n_live, 0);
    for (int k = 0; k < FSDP_MEM_KIND_COUNT; k++)
        ck_assert_uint_eq(s->kind_bytes[k], 0);
}

START_TEST(test_accounting_exact)
{
    fsdp_backend be = backends[_i];
    fsdp_device d;
    dev_init(&d, be, 0);
    expect_empty(&d.mem);
    ck_assert_uint_eq(d.mem.peak_bytes, 0);

    void *p1, *p2, *p3, *p4;
    ck_assert_int_eq(fsdp_device_alloc(&d, 1000, FSDP_MEM_PARAM, "params", &p1), FSDP_STATUS_OK);
    ck_assert_int_eq(fsdp_device_alloc(&d, 3, FSDP_MEM_GRAD, "grads", &p2), FSDP_STATUS_OK);
    ck_assert_int_eq(fsdp_device_alloc(&d, 5000, FSDP_MEM_ACT, "acts", &p3), FSDP_STATUS_OK);
    /* accounting counts exactly the requested bytes, not the rounded ones */
    ck_assert_uint_eq(d.mem.in_use_bytes, 6003);
    ck_assert_uint_eq(d.mem.peak_bytes, 6003);
    ck_assert_uint_eq(d.mem.n_live, 3);
    ck_assert_uint_eq(d.mem.n_allocs, 3);
    ck_assert_uint_eq(d.mem.kind_bytes[FSDP_MEM_PARAM], 1000);
    ck_assert_uint_eq(d.mem.kind_bytes[FSDP_MEM_GRAD], 3);
    ck_assert_uint_eq(d.mem.kind_bytes[FSDP_MEM_ACT], 5000);
    ck_assert_uint_eq(d.mem.peak_kind_bytes[FSDP_MEM_ACT], 5000);

    fsdp_device_free(&d, p3); /* 1003 in use; the peak stays at 6003 */
    ck_assert_uint_eq(d.mem.in_use_bytes, 1003);
    ck_assert_uint_eq(d.mem.peak_bytes, 6003);
    ck_assert_uint_eq(d.mem.kind_bytes[FSDP_MEM_ACT], 0);
    ck_assert_uint_eq(d.mem.n_live, 2);

    /* a smaller new high-water mark is not a peak; the snapshot is kept */
    ck_assert_int_eq(fsdp_device_alloc(&d, 4000, FSDP_MEM_OPTIM, "adam m", &p4), FSDP_STATUS_OK);
    ck_assert_uint_eq(d.mem.in_use_bytes, 5003);
    ck_assert_uint_eq(d.mem.peak_bytes, 6003);
    ck_assert_uint_eq(d.mem.peak_kind_bytes[FSDP_MEM_ACT], 5000);
    ck_assert_uint_eq(d.mem.peak_kind_bytes[FSDP_MEM_OPTIM], 0);

    /* past the old peak: a new snapshot of every kind at that moment */
    ck_assert_int_eq(fsdp_device_alloc(&d, 2000, FSDP_MEM_GATHER, "gather", &p3), FSDP_STATUS_OK);
    ck_assert_uint_eq(d.mem.peak_bytes, 7003);
    ck_assert_uint_eq(d.mem.peak_kind_bytes[FSDP_MEM_PARAM], 1000);
    ck_assert_uint_eq(d.mem.peak_kind_bytes[FSDP_MEM_GRAD], 3);
    ck_assert_uint_eq(d.mem.peak_kind_bytes[FSDP_MEM_OPTIM], 4000);
    ck_assert_uint_eq(d.mem.peak_kind_bytes[FSDP_MEM_GATHER], 2000);
    ck_assert_uint_eq(d.mem.peak_kind_bytes[FSDP_MEM_ACT], 0);
    size_t sum = 0;
    for (int k = 0; k < FSDP_MEM_KIND_COUNT; k++)
        sum += d.mem.peak_kind_bytes[k];
    ck_assert_uint_eq(sum, d.mem.peak_bytes);

    /* reset_peak: peak = now, snapshot = now */
    fsdp_device_free(&d, p3);
    fsdp_device_reset_peak(&d);
    ck_assert_uint_eq(d.mem.peak_bytes, 5003);
    ck_assert_uint_eq(d.mem.peak_kind_bytes[FSDP_MEM_GATHER], 0);
    ck_assert_uint_eq(d.mem.peak_kind_bytes[FSDP_MEM_OPTIM], 4000);

    fsdp_device_free(&d, p1);
    fsdp_device_free(&d, p2);
    fsdp_device_free(&d, p4);
    fsdp_device_free(&d, NULL); /* no-op */
    expect_empty(&d.mem);
    ck_assert_uint_eq(d.mem.n_allocs, 5);
    expect_empty(&d.host);
    ck_assert_uint_eq(d.host.n_allocs, 0);
    fsdp_device_fini(&d);
}
END_TEST

START_TEST(test_zero_bytes_is_null)
{
    fsdp_device d;
    dev_init(&d, backends[_i], 0);
    void *p = (void *)1;
    ck_assert_int_eq(fsdp_device_alloc(&d, 0, FSDP_MEM_OTHER, "nothing", &p), FSDP_STATUS_OK);
    ck_assert_ptr_null(p);
    ck_assert_uint_eq(d.mem.n_allocs, 0);
    fsdp_device_fini(&d);
}
END_TEST

START_TEST(test_cpu_alignment_and_backing)
{
    fsdp_device d;
    dev_init(&d, FSDP_BACKEND_CPU, 0);
    static const size_t sizes[] = {1, 7, 63, 64, 65, 1000, 4097, (size_t)1 << 20};
    void *ps[8];
    for (int i = 0; i < 8; i++) {
        ck_assert_int_eq(fsdp_device_alloc(&d, sizes[i], FSDP_MEM_OTHER, "t", &ps[i]),
                         FSDP_STATUS_OK);
        ck_assert_uint_eq((uintptr_t)ps[i] % FSDP_DEVICE_ALIGN, 0);
        /* the memory is real: every byte can be written and read back */
        ck_assert_int_eq(fsdp_device_memset(&d, ps[i], 0x3c, sizes[i], NULL), FSDP_STATUS_OK);
        ck_assert_int_eq(((unsigned char *)ps[i])[sizes[i] - 1], 0x3c);
    }
    ck_assert_int_eq(fsdp_device_memcpy(&d, ps[0], "x", 1, NULL), FSDP_STATUS_OK);
    ck_assert_int_eq(*(char *)ps[0], 'x');
    ck_assert_int_eq(fsdp_device_memcpy(&d, ps[7], ps[6], 4097, d.copy), FSDP_STATUS_OK);
    ck_assert_int_eq(((unsigned char *)ps[7])[4096], 0x3c);
    for (int i = 0; i < 8; i++)
        fsdp_device_free(&d, ps[i]);
    expect_empty(&d.mem);
    fsdp_device_fini(&d);
}
END_TEST

/* The cap: over it fails with OOM and a message naming the device, the
 * request, what it was for, the memory in use and the cap; nothing is
 * counted for the failed request; exactly up to the cap succeeds. */
START_TEST(test_cap_refuses_with_message)
{
    fsdp_backend be = backends[_i];
    size_t cap = (size_t)1 << 20;
    fsdp_device d;
    dev_init(&d, be, cap);
    void *a = NULL, *b = NULL, *c = NULL;
    ck_assert_int_eq(fsdp_device_alloc(&d, 600 << 10, FSDP_MEM_PARAM, "shard", &a),
                     FSDP_STATUS_OK);
    fsdp_status st = fsdp_device_alloc(&d, 500 << 10, FSDP_MEM_GATHER, "unit 'h.7' gather", &b);
    ck_assert_int_eq(st, FSDP_STATUS_OOM);
    ck_assert_ptr_null(b);
    const char *msg = fsdp_error_msg();
    ck_assert_msg(strstr(msg, "device 0"), "%s", msg);
    ck_assert_msg(strstr(msg, "500.0 KiB"), "%s", msg);        /* requested */
    ck_assert_msg(strstr(msg, "unit 'h.7' gather"), "%s", msg); /* for what */
    ck_assert_msg(strstr(msg, "in use 600.0 KiB"), "%s", msg);
    ck_assert_msg(strstr(msg, "cap 1.00 MiB"), "%s", msg);
    ck_assert_msg(strstr(msg, "out of memory"), "%s", msg);
    ck_assert_uint_eq(d.mem.in_use_bytes, 600 << 10);
    ck_assert_uint_eq(d.mem.n_live, 1);
    ck_assert_uint_eq(d.mem.n_allocs, 1);
    /* exactly the rest fits */
    ck_assert_int_eq(fsdp_device_alloc(&d, cap - (600 << 10), FSDP_MEM_GATHER, "rest", &b),
                     FSDP_STATUS_OK);
    ck_assert_int_eq(fsdp_device_alloc(&d, 1, FSDP_MEM_OTHER, "one byte", &c), FSDP_STATUS_OOM);
    ck_assert_uint_eq(d.mem.in_use_bytes, cap);
    fsdp_device_free(&d, a);
    fsdp_device_free(&d, b);
    /* one request larger than the cap, and one near SIZE_MAX (no overflow) */
    ck_assert_int_eq(fsdp_device_alloc(&d, cap + 1, FSDP_MEM_OTHER, "big", &c), FSDP_STATUS_OOM);
    ck_assert_int_eq(fsdp_device_alloc(&d, SIZE_MAX - 10, FSDP_MEM_OTHER, "huge", &c),
                     FSDP_STATUS_OOM);
    expect_empty(&d.mem);
    fsdp_device_fini(&d);
}
END_TEST

/* Pinned host memory is counted in d->host, never in d->mem, and never
 * against the device cap. */
START_TEST(test_host_memory_separate_from_cap)
{
    fsdp_backend be = backends[_i];
    fsdp_device d;
    dev_init(&d, be, 4096);
    void *h1 = NULL, *h2 = NULL, *m = NULL;
    ck_assert_int_eq(fsdp_device_host_alloc(&d, 1 << 20, FSDP_MEM_OPTIM, "adam state", &h1),
                     FSDP_STATUS_OK);
    ck_assert_int_eq(fsdp_device_host_alloc(&d, 100, FSDP_MEM_PARAM, "master", &h2),
                     FSDP_STATUS_OK);
    if (be == FSDP_BACKEND_CPU) {
        ck_assert_uint_eq((uintptr_t)h1 % FSDP_DEVICE_ALIGN, 0);
        memset(h1, 1, 1 << 20);
    }
    ck_assert_uint_eq(d.host.in_use_bytes, (1 << 20) + 100);
    ck_assert_uint_eq(d.host.kind_bytes[FSDP_MEM_OPTIM], 1 << 20);
    ck_assert_uint_eq(d.host.peak_bytes, (1 << 20) + 100);
    ck_assert_uint_eq(d.host.n_live, 2);
    expect_empty(&d.mem);
    /* the device cap still applies to device memory, not counting host */
    ck_assert_int_eq(fsdp_device_alloc(&d, 4096, FSDP_MEM_ACT, "acts", &m), FSDP_STATUS_OK);
    ck_assert_uint_eq(d.mem.in_use_bytes, 4096);
    fsdp_device_free(&d, m);
    fsdp_device_host_free(&d, h1);
    fsdp_device_host_free(&d, h2);
    fsdp_device_host_free(&d, NULL);
    expect_empty(&d.host);
    ck_assert_uint_eq(d.host.peak_bytes, (1 << 20) + 100);
    fsdp_device_fini(&d);
}
END_TEST

/* Meta backs nothing: a terabyte is counted, handed a distinct aligned
 * fake address, and never touched (copies and sets are no-ops). */
START_TEST(test_meta_terabyte)
{
    fsdp_device d;
    dev_init(&d, FSDP_BACKEND_META, 0);
    ck_assert(!fsdp_device_computes(&d));
    size_t tib = (size_t)1 << 40;
    void *a = NULL, *b = NULL, *h = NULL;
    ck_assert_int_eq(fsdp_device_alloc(&d, tib, FSDP_MEM_PARAM, "1 TiB", &a), FSDP_STATUS_OK);
    ck_assert_int_eq(fsdp_device_alloc(&d, tib + 3, FSDP_MEM_GRAD, "1 TiB + 3", &b),
                     FSDP_STATUS_OK);
    ck_assert_int_eq(fsdp_device_host_alloc(&d, 4 * tib, FSDP_MEM_OPTIM, "4 TiB", &h),
                     FSDP_STATUS_OK);
    ck_assert_ptr_nonnull(a);
    ck_assert_ptr_nonnull(b);
    ck_assert_ptr_ne(a, b);
    ck_assert_uint_eq((uintptr_t)a % FSDP_DEVICE_ALIGN, 0);
    ck_assert_uint_eq((uintptr_t)b % FSDP_DEVICE_ALIGN, 0);
    ck_assert_uint_ge((uintptr_t)b - (uintptr_t)a, tib); /* no overlap */
    ck_assert_uint_eq(d.mem.in_use_bytes, 2 * tib + 3);
    ck_assert_uint_eq(d.mem.kind_bytes[FSDP_MEM_GRAD], tib + 3);
    ck_assert_uint_eq(d.host.in_use_bytes, 4 * tib);
    /* would crash if meta touched the fake addresses */
    ck_assert_int_eq(fsdp_device_memset(&d, a, 0, tib, NULL), FSDP_STATUS_OK);
    ck_assert_int_eq(fsdp_device_memcpy(&d, a, b, tib, NULL), FSDP_STATUS_OK);
    fsdp_device_free(&d, a);
    fsdp_device_free(&d, b);
    fsdp_device_host_free(&d, h);
    expect_empty(&d.mem);
    expect_empty(&d.host);
    ck_assert_uint_eq(d.mem.peak_bytes, 2 * tib + 3);
    fsdp_device_fini(&d);

    /* with a cap, meta refuses like a real device */
    dev_init(&d, FSDP_BACKEND_META, (size_t)80 << 30);
    ck_assert_int_eq(fsdp_device_alloc(&d, tib, FSDP_MEM_PARAM, "params", &a), FSDP_STATUS_OOM);
    ck_assert_msg(strstr(fsdp_error_msg(), "cap 80.0 GiB"), "%s", fsdp_error_msg());
    fsdp_device_fini(&d);
}
END_TEST

/* A request so large that rounding it up to the alignment would wrap
 * around fails cleanly on both backends (without a cap), and meta never
 * hands out a fake address range that wraps onto earlier ones. */
START_TEST(test_impossible_sizes_fail)
{
    fsdp_backend be = backends[_i];
    fsdp_device d;
    dev_init(&d, be, 0);
    void *p = (void *)1;
    ck_assert_int_eq(fsdp_device_alloc(&d, SIZE_MAX - 10, FSDP_MEM_OTHER, "huge", &p),
                     FSDP_STATUS_OOM);
    ck_assert_ptr_null(p);
    ck_assert_msg(strstr(fsdp_error_msg(), "device 0"), "%s", fsdp_error_msg());
    ck_assert_int_eq(fsdp_device_host_alloc(&d, SIZE_MAX - 1, FSDP_MEM_OTHER, "huge", &p),
                     FSDP_STATUS_OOM);
    expect_empty(&d.mem);
    expect_empty(&d.host);
    ck_assert_uint_eq(d.mem.n_allocs, 0);
    if (be == FSDP_BACKEND_META) {
        void *a, *b;
        size_t half = (size_t)1 << 63;
        ck_assert_int_eq(fsdp_device_alloc(&d, half, FSDP_MEM_PARAM, "2^63", &a),
                         FSDP_STATUS_OK);
        ck_assert_int_eq(fsdp_device_alloc(&d, half, FSDP_MEM_PARAM, "2^63 more", &b),
                         FSDP_STATUS_OOM);
        ck_assert_int_eq(fsdp_device_alloc(&d, 4096, FSDP_MEM_PARAM, "small", &b),
                         FSDP_STATUS_OK);
        ck_assert_uint_ge((uintptr_t)b, (uintptr_t)a + half);
        fsdp_device_free(&d, a);
        fsdp_device_free(&d, b);
    }
    fsdp_device_fini(&d);
}
END_TEST

/* Many allocations, freed out of order: the pointer table finds every one
 * (a deletion that broke a probe run would lose a later entry: its free
 * asserts), and after long alloc/free churn it stays small. */
START_TEST(test_allocation_table_churn)
{
    fsdp_backend be = backends[_i];
    fsdp_device d;
    dev_init(&d, be, 0);
    enum { LIVE = 3000 };
    void **ps = calloc(LIVE, sizeof *ps);
    size_t want = 0;
    for (int i = 0; i < LIVE; i++) {
        fsdp_mem_kind kind = (fsdp_mem_kind)(i % FSDP_MEM_KIND_COUNT);
        ck_assert_int_eq(fsdp_device_alloc(&d, (size_t)i + 1, kind, "t", &ps[i]),
                         FSDP_STATUS_OK);
        want += (size_t)i + 1;
    }
    ck_assert_uint_eq(d.mem.in_use_bytes, want);
    for (int i = 0; i < LIVE; i += 2) { /* every other one */
        fsdp_device_free(&d, ps[i]);
        want -= (size_t)i + 1;
    }
    ck_assert_uint_eq(d.mem.in_use_bytes, want);
    ck_assert_uint_eq(d.mem.n_live, LIVE / 2);
    for (int i = 1; i < LIVE; i += 2)
        fsdp_device_free(&d, ps[i]);
    expect_empty(&d.mem);
    size_t cap_after_peak = d.n_recs_cap;
    /* churn: a few live allocations, 30000 alloc/free pairs */
    void *keep[8];
    for (int i = 0; i < 8; i++)
        ck_assert_int_eq(fsdp_device_alloc(&d, 64, FSDP_MEM_ACT, "keep", &keep[i]),
                         FSDP_STATUS_OK);
    for (int i = 0; i < 30000; i++) {
        void *p;
        ck_assert_int_eq(fsdp_device_alloc(&d, 128, FSDP_MEM_ACT, "churn", &p), FSDP_STATUS_OK);
        fsdp_device_free(&d, p);
    }
    ck_assert_msg(d.n_recs_cap <= cap_after_peak, "table grew from %zu to %zu slots",
                  cap_after_peak, d.n_recs_cap);
    for (int i = 0; i < 8; i++)
        fsdp_device_free(&d, keep[i]);
    expect_empty(&d.mem);
    ck_assert_uint_eq(d.mem.n_allocs, LIVE + 8 + 30000);
    /* random order: each turn frees a random live allocation or makes one */
    uint64_t x = 88172645463325252ull;
    size_t n_live = 0, n_made = 0;
    for (int i = 0; i < 200000; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        if (n_live && (n_live == LIVE || (x >> 20) % 2)) {
            size_t k = (size_t)(x >> 32) % n_live;
            fsdp_device_free(&d, ps[k]);
            ps[k] = ps[--n_live];
        } else {
            ck_assert_int_eq(fsdp_device_alloc(&d, 32, FSDP_MEM_ACT, "random", &ps[n_live++]),
                             FSDP_STATUS_OK);
            n_made++;
        }
        ck_assert_uint_eq(d.n_recs_used, n_live);
    }
    ck_assert_uint_eq(d.mem.n_live, n_live);
    while (n_live)
        fsdp_device_free(&d, ps[--n_live]);
    expect_empty(&d.mem);
    ck_assert_uint_eq(d.mem.n_allocs, LIVE + 8 + 30000 + n_made);
    free(ps);
    fsdp_device_fini(&d);
}
END_TEST

/* fini releases what was not freed (ASan's leak check sees the result). */
START_TEST(test_fini_releases_leaks)
{
    fsdp_device d;
    dev_init(&d, backends[_i], 0);
    void *p;
    for (int i = 0; i < 10; i++) {
        ck_assert_int_eq(fsdp_device_alloc(&d, 1000, FSDP_MEM_ACT, "leak", &p), FSDP_STATUS_OK);
        ck_assert_int_eq(fsdp_device_host_alloc(&d, 1000, FSDP_MEM_OPTIM, "leak", &p),
                         FSDP_STATUS_OK);
    }
    fsdp_device_fini(&d);
    ck_assert_ptr_null(d.iface);
    ck_assert_ptr_null(d.recs);
    fsdp_device_fini(&d); /* twice is harmless */
}
END_TEST

/* The cpu device keeps freed memory for reuse, as cuda does: a unit gathered
 * again gets the block it had (no new pages to fault in), a request up to a
 * quarter smaller takes it too, the cached bytes show in reserved_bytes
 * (never in the counted figures), and a reservation adds blocks that the
 * next allocations of that size take. */
START_TEST(test_cpu_blocks_reused)
{
    fsdp_device d;
    dev_init(&d, FSDP_BACKEND_CPU, 0);
    const size_t big = (size_t)197 << 20, cls = fsdp_block_cache_class(big);
    void *p, *q, *r;
    ck_assert_int_eq(fsdp_device_alloc(&d, big, FSDP_MEM_GATHER, "root", &p), FSDP_STATUS_OK);
    memset(p, 0x5a, big);
    ck_assert_uint_eq(d.mem.reserved_bytes, cls - big);
    fsdp_device_free(&d, p);
    expect_empty(&d.mem);
    ck_assert_uint_eq(d.mem.reserved_bytes, cls);
    ck_assert_int_eq(fsdp_device_alloc(&d, big, FSDP_MEM_GATHER, "root again", &q),
                     FSDP_STATUS_OK);
    ck_assert_ptr_eq(q, p);
    ck_assert_uint_eq(d.mem.in_use_bytes, big);
    ck_assert_uint_eq(d.mem.peak_bytes, big);
    fsdp_device_free(&d, q);
    ck_assert_int_eq(fsdp_device_alloc(&d, big - big / 8, FSDP_MEM_ACT, "smaller", &q),
                     FSDP_STATUS_OK);
    ck_assert_ptr_eq(q, p);
    /* a block more than a quarter larger than the request is not taken */
    ck_assert_int_eq(fsdp_device_alloc(&d, big / 2, FSDP_MEM_ACT, "half", &r), FSDP_STATUS_OK);
    ck_assert_ptr_ne(r, p);
    fsdp_device_free(&d, q);
    fsdp_device_free(&d, r);
    const size_t held = cls + fsdp_block_cache_class(big / 2);
    ck_assert_uint_eq(d.mem.reserved_bytes, held);
    const size_t unit = (size_t)25 << 20;
    ck_assert_int_eq(fsdp_device_reserve(&d, unit, 2), FSDP_STATUS_OK);
    ck_assert_uint_eq(d.mem.reserved_bytes, held + 2 * fsdp_block_cache_class(unit));
    ck_assert_uint_eq(d.mem.n_allocs, 4); /* a reservation counts nothing */
    void *u[3];
    for (int i = 0; i < 3; i++)
        ck_assert_int_eq(fsdp_device_alloc(&d, unit, FSDP_MEM_GATHER, "unit", &u[i]),
                         FSDP_STATUS_OK);
    ck_assert_uint_eq(d.n_resv_misses, 1); /* the third was not reserved */
    ck_assert_uint_eq(d.mem.reserved_bytes,
                      held + 3 * fsdp_block_cache_class(unit) - 3 * unit);
    for (int i = 0; i < 3; i++)
        fsdp_device_free(&d, u[i]);
    expect_empty(&d.mem);
    fsdp_device_fini(&d);
    ck_assert_uint_eq(d.mem.reserved_bytes, 0);
}
END_TEST

/* cpu and meta run stream work inline: the stream and event wrappers
 * succeed and hand out NULL handles. */
START_TEST(test_inline_streams_and_events)
{
    fsdp_device d;
    dev_init(&d, backends[_i], 0);
    ck_assert_ptr_null(d.compute);
    fsdp_event_t e = (fsdp_event_t)1;
    ck_assert_int_eq(fsdp_device_event_create(&d, &e), FSDP_STATUS_OK);
    ck_assert_ptr_null(e);
    ck_assert_int_eq(fsdp_device_event_record(&d, e, d.comm), FSDP_STATUS_OK);
    ck_assert_int_eq(fsdp_device_stream_wait_event(&d, d.compute, e), FSDP_STATUS_OK);
    ck_assert_int_eq(fsdp_device_event_sync(&d, e), FSDP_STATUS_OK);
    ck_assert_int_eq(fsdp_device_stream_sync(&d, d.copy), FSDP_STATUS_OK);
    fsdp_device_event_destroy(&d, e);
    fsdp_device_fini(&d);
}
END_TEST

START_TEST(test_names_and_unbuilt_backend)
{
    ck_assert_str_eq(fsdp_mem_kind_name(FSDP_MEM_PARAM), "param");
    ck_assert_str_eq(fsdp_mem_kind_name(FSDP_MEM_GATHER), "gather");
    ck_assert_str_eq(fsdp_mem_kind_name(FSDP_MEM_OTHER), "other");
    ck_assert_str_eq(fsdp_mem_kind_name(FSDP_MEM_KIND_COUNT), "?");
    ck_assert_str_eq(fsdp_device_cpu_i.name, "cpu");
    ck_assert_str_eq(fsdp_device_meta_i.name, "meta");
    fsdp_device d;
    ck_assert_int_eq(fsdp_device_init(&d, FSDP_BACKEND_COUNT, NULL, 0, 0, 0),
                     FSDP_STATUS_UNSUPPORTED);
    ck_assert_msg(strstr(fsdp_error_msg(), "not built in"), "%s", fsdp_error_msg());
}
END_TEST

/* ---- the backend table ------------------------------------------------------ */

START_TEST(test_backend_table)
{
    const fsdp_name_table *t = &fsdp_backend_names;
    ck_assert_int_eq(t->n, FSDP_BACKEND_COUNT);
    int n_gpu = fsdp_cuda_device_count();
    for (int i = 0; i < t->n; i++) {
        fsdp_backend b = (fsdp_backend)t->v[i].value;
        ck_assert_str_eq(fsdp_backend_name(b), t->v[i].name);
        int v = -1;
        ck_assert_int_eq(fsdp_names_parse(t, 0, t->v[i].name, &v), FSDP_STATUS_OK);
        ck_assert_int_eq(v, (int)b);
        ck_assert_ptr_nonnull(t->v[i].help);
        bool simulated = b != FSDP_BACKEND_CUDA;
        ck_assert_int_eq(fsdp_backend_n_devices(b), simulated ? FSDP_MAX_RANKS : n_gpu);
        ck_assert_int_eq(fsdp_backend_default_devices(b), simulated ? 4 : n_gpu);
        /* a backend that offers devices initialises one whose table bears its name */
        if (fsdp_backend_n_devices(b) > 0 && simulated) {
            fsdp_device d;
            dev_init(&d, b, 0);
            ck_assert_str_eq(d.iface->name, t->v[i].name);
            fsdp_device_fini(&d);
        }
    }
    ck_assert_str_eq(fsdp_backend_name(FSDP_BACKEND_COUNT), "unknown");
    ck_assert_int_eq(fsdp_backend_n_devices(FSDP_BACKEND_COUNT), 0);
    ck_assert_int_eq(fsdp_backend_default(), n_gpu > 0 ? FSDP_BACKEND_CUDA : FSDP_BACKEND_CPU);
    int v;
    ck_assert_int_eq(fsdp_names_parse(t, 0, "tpu", &v), FSDP_STATUS_INVALID_ARG);
    ck_assert_str_eq(fsdp_error_msg(), "unknown value 'tpu' (expected cpu, cuda or meta)");
}
END_TEST

START_TEST(test_backend_check)
{
    static const struct {
        fsdp_backend b;
        int n, rpd;
        fsdp_status want;
        const char *msg;
    } cases[] = {
        {FSDP_BACKEND_CPU, 4, 1, FSDP_STATUS_OK, NULL},
        {FSDP_BACKEND_META, FSDP_MAX_RANKS, 1, FSDP_STATUS_OK, NULL},
        {FSDP_BACKEND_CPU, 0, 1, FSDP_STATUS_INVALID_ARG, "--devices must be 1..1024 (got 0)"},
        {FSDP_BACKEND_META, FSDP_MAX_RANKS + 1, 1, FSDP_STATUS_INVALID_ARG,
         "--devices must be 1..1024 (got 1025)"},
        {FSDP_BACKEND_CPU, 2, 0, FSDP_STATUS_INVALID_ARG, "--ranks-per-device must be 1..1024"},
        {FSDP_BACKEND_COUNT, 1, 1, FSDP_STATUS_INVALID_ARG, "not one of this build's"},
    };
    for (size_t i = 0; i < FSDP_TEST_LEN(cases); i++) {
        fsdp_status st = fsdp_backend_check(cases[i].b, cases[i].n, cases[i].rpd);
        ck_assert_msg(st == cases[i].want, "case %zu: %s (%s)", i, fsdp_status_name(st),
                      fsdp_error_msg());
        if (cases[i].msg)
            ck_assert_msg(strstr(fsdp_error_msg(), cases[i].msg), "case %zu: %s", i,
                          fsdp_error_msg());
    }
    /* cuda: refused without a GPU (saying whether the build has CUDA at
     * all), else bounded by GPUs x ranks per device */
    int n_gpu = fsdp_cuda_device_count();
    fsdp_status st = fsdp_backend_check(FSDP_BACKEND_CUDA, 1, 1);
    if (n_gpu == 0) {
        ck_assert_int_eq(st, FSDP_STATUS_UNSUPPORTED);
        ck_assert_msg(strstr(fsdp_error_msg(), "--backend cuda: no CUDA device is visible"), "%s",
                      fsdp_error_msg());
        ck_assert(!strstr(fsdp_error_msg(), "CUDA=0") == (fsdp_device_cuda_iface() != NULL));
    } else {
        ck_assert_int_eq(st, FSDP_STATUS_OK);
        ck_assert_int_eq(fsdp_backend_check(FSDP_BACKEND_CUDA, 2 * n_gpu, 1),
                         FSDP_STATUS_INVALID_ARG);
        ck_assert_msg(strstr(fsdp_error_msg(), "rank(s) per device are available"), "%s",
                      fsdp_error_msg());
        ck_assert_int_eq(fsdp_backend_check(FSDP_BACKEND_CUDA, 2 * n_gpu, 2), FSDP_STATUS_OK);
    }
}
END_TEST

/* ---- injected allocation failure in a launched world --------------------- */

struct alloc_fault_arg {
    fsdp_backend be;
    fsdp_status st[8];
    char msg[8][FSDP_ERROR_MSG_MAX];
    size_t in_use_after_fail[8];
};

/* Each rank allocates 5 buffers (device, host alternately), meets the
 * others, frees. */
static fsdp_status alloc_rank(fsdp_world *w, int rank, void *p)
{
    struct alloc_fault_arg *a = p;
    fsdp_device d;
    void *bufs[5] = {0};
    int host[5] = {0, 1, 0, 1, 0};
    fsdp_status st;
    FSDP_CHECK(fsdp_device_init(&d, a->be, w, rank, rank, 0));
    for (int i = 0; i < 5; i++) {
        st = host[i] ? fsdp_device_host_alloc(&d, 4096, FSDP_MEM_OPTIM, "optimizer shard", &bufs[i])
                     : fsdp_device_alloc(&d, 4096, FSDP_MEM_PARAM, "param shard", &bufs[i]);
        if (st != FSDP_STATUS_OK) {
            a->in_use_after_fail[rank] = d.mem.in_use_bytes + d.host.in_use_bytes;
            goto out;
        }
    }
    st = fsdp_world_barrier(w);
out:
    for (int i = 0; i < 5; i++) {
        if (host[i])
            fsdp_device_host_free(&d, bufs[i]);
        else
            fsdp_device_free(&d, bufs[i]);
    }
    fsdp_device_fini(&d);
fail:
    a->st[rank] = st;
    snprintf(a->msg[rank], sizeof a->msg[rank], "%s", st ? fsdp_error_msg() : "");
    return st;
}

START_TEST(test_injected_alloc_failure_aborts_world)
{
    fsdp_backend be = backends[_i];
    int n = 4;
    fsdp_world *w = NULL;
    ck_assert_int_eq(fsdp_world_init(&w, n), FSDP_STATUS_OK);
    for (int k = 1; k <= 5; k++) {
        int bad = k % n;
        struct alloc_fault_arg a = {.be = be};
        fsdp_world_set_fault(w, FSDP_FAULT_ALLOC, bad, k);
        fsdp_status st = fsdp_world_launch(w, alloc_rank, &a);
        ck_assert_int_eq(st, FSDP_STATUS_OOM);
        char want[64];
        snprintf(want, sizeof want, "rank %d: device %d: injected allocation failure", bad, bad);
        ck_assert_msg(strstr(fsdp_error_msg(), want), "k=%d: %s", k, fsdp_error_msg());
        ck_assert_msg(strstr(fsdp_error_msg(), k % 2 ? "param shard" : "optimizer shard"),
                      "k=%d: %s", k, fsdp_error_msg());
        ck_assert_uint_eq(a.in_use_after_fail[bad], (size_t)(k - 1) * 4096);
        for (int r = 0; r < n; r++) {
            if (r == bad)
                ck_assert_int_eq(a.st[r], FSDP_STATUS_OOM);
            else
                ck_assert_msg(a.st[r] == FSDP_STATUS_ABORTED, "k=%d rank %d: %s", k, r,
                              a.msg[r]);
        }
    }
    /* disarmed: the same world runs cleanly */
    fsdp_world_set_fault(w, FSDP_FAULT_ALLOC, 0, 0);
    struct alloc_fault_arg a = {.be = be};
    ck_assert_int_eq(fsdp_world_launch(w, alloc_rank, &a), FSDP_STATUS_OK);
    fsdp_world_free(w);
}
END_TEST

int main(void)
{
    int nb = (int)FSDP_TEST_LEN(backends);
    const fsdp_test_tcase tcases[] = {
        {"memory", 60,
         FSDP_TESTS(FSDP_TEST_LOOP(test_accounting_exact, nb),
                    FSDP_TEST_LOOP(test_zero_bytes_is_null, nb), test_cpu_alignment_and_backing,
                    FSDP_TEST_LOOP(test_cap_refuses_with_message, nb),
                    FSDP_TEST_LOOP(test_host_memory_separate_from_cap, nb), test_meta_terabyte,
                    FSDP_TEST_LOOP(test_impossible_sizes_fail, nb),
                    FSDP_TEST_LOOP(test_allocation_table_churn, nb),
                    FSDP_TEST_LOOP(test_fini_releases_leaks, nb), test_cpu_blocks_reused,
                    FSDP_TEST_LOOP(test_inline_streams_and_events, nb),
                    test_names_and_unbuilt_backend)},
        {"backends", FSDP_TESTS(test_backend_table, test_backend_check)},
        {"faults", 60, FSDP_TESTS(FSDP_TEST_LOOP(test_injected_alloc_failure_aborts_world, nb))},
    };
    return fsdp_test_main("device", tcases, FSDP_TEST_LEN(tcases));
}
