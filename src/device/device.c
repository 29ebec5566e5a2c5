/*
 * device.c - the backend table, and the generic device wrappers:
 * accounting by kind, the memory cap, the allocation table, the fault hook,
 * and NULL-slot handling.
 *
 * Every allocation is recorded in an open-addressed table keyed by pointer,
 * so frees need no size, leaks can be listed, and meta's fake pointers are
 * handled like real ones.
 */
#include <stdint.h>
#include <string.h>

#include "core/log.h"
#include "core/world.h"
#include "device/device.h"

/* ---- the backends ---------------------------------------------------------- */

static const fsdp_name backend_names[] = {
    {"cpu", FSDP_BACKEND_CPU,
     "simulated devices in host memory: real math (OpenBLAS), memory capped by --device-mem"},
    {"cuda", FSDP_BACKEND_CUDA, "one GPU per rank (or --ranks-per-device ranks per GPU)"},
    {"meta", FSDP_BACKEND_META, "accounting only: nothing is allocated or computed"},
};
const fsdp_name_table fsdp_backend_names = FSDP_NAME_TABLE(backend_names);

static const struct fsdp_device_i *meta_iface(void) { return &fsdp_device_meta_i; }

static const struct backend {
    const struct fsdp_device_i *(*iface)(void); /* NULL result: not built in */
    int (*n_devices)(void);                     /* NULL: simulated, FSDP_MAX_RANKS */
    int default_devices;                        /* 0: every device it offers */
    /* one device's total and free bytes; NULL: simulated, no size of its own */
    fsdp_status (*memory)(int ordinal, size_t *total_bytes, size_t *free_bytes);
} backends[FSDP_BACKEND_COUNT] = {
    [FSDP_BACKEND_CPU] = {fsdp_device_cpu_iface, NULL, 4, NULL},
    [FSDP_BACKEND_CUDA] = {fsdp_device_cuda_iface, fsdp_cuda_device_count, 0,
                           fsdp_cuda_device_memory},
    [FSDP_BACKEND_META] = {meta_iface, NULL, 4, NULL},
};

const char *fsdp_backend_name(fsdp_backend b)
{
    const fsdp_name *e = fsdp_names_of(&fsdp_backend_names, (int)b);
    return e ? e->name : "unknown";
}

fsdp_backend fsdp_backend_default(void)
{
    return fsdp_backend_n_devices(FSDP_BACKEND_CUDA) > 0 ? FSDP_BACKEND_CUDA : FSDP_BACKEND_CPU;
}

int fsdp_backend_n_devices(fsdp_backend b)
{
    if ((unsigned)b >= FSDP_BACKEND_COUNT)
        return 0;
    return backends[b].n_devices ? backends[b].n_devices() : FSDP_MAX_RANKS;
}

int fsdp_backend_default_devices(fsdp_backend b)
{
    if ((unsigned)b >= FSDP_BACKEND_COUNT)
        return 0;
    return backends[b].default_devices ? backends[b].default_devices : fsdp_backend_n_devices(b);
}

fsdp_status fsdp_backend_check(fsdp_backend b, int n_ranks, int ranks_per_device)
{
    if ((unsigned)b >= FSDP_BACKEND_COUNT)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "backend %d is not one of this build's",
                              (int)b);
    const char *name = fsdp_backend_name(b);
    int n_dev = fsdp_backend_n_devices(b);
    if (n_dev == 0)
        return fsdp_error_set(FSDP_STATUS_UNSUPPORTED, "--backend %s: no %s device is visible%s",
                              name, b == FSDP_BACKEND_CUDA ? "CUDA" : name,
                              backends[b].iface()
                                  ? ""
                                  : " (this build has no CUDA: built with CUDA=0)");
    if (n_ranks < 1 || n_ranks > FSDP_MAX_RANKS)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "--devices must be 1..%d (got %d)",
                              FSDP_MAX_RANKS, n_ranks);
    if (ranks_per_device < 1 || ranks_per_device > FSDP_MAX_RANKS)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "--ranks-per-device must be 1..%d (got %d)",
                              FSDP_MAX_RANKS, ranks_per_device);
    if (backends[b].n_devices && (long)n_ranks > (long)n_dev * ranks_per_device)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "--devices %d but only %d %s device(s) x %d rank(s) per device are "
                              "available",
                              n_ranks, n_dev, name, ranks_per_device);
    return FSDP_STATUS_OK;
}

fsdp_status fsdp_backend_device_total(fsdp_backend b, int n_devices, size_t *total_bytes)
{
    *total_bytes = 0;
    if ((unsigned)b >= FSDP_BACKEND_COUNT)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "backend %d is not one of this build's",
                              (int)b);
    if (!backends[b].memory)
        return FSDP_STATUS_OK;
    int n = fsdp_backend_n_devices(b);
    if (n_devices < n)
        n = n_devices;
    if (n < 1)
        return fsdp_error_set(FSDP_STATUS_UNSUPPORTED, "--backend %s: no %s device is visible",
                              fsdp_backend_name(b), fsdp_backend_name(b));
    size_t least = SIZE_MAX;
    for (int i = 0; i < n; i++) {
        size_t total = 0, free_bytes = 0;
        FSDP_TRY(backends[b].memory(i, &total, &free_bytes));
        if (total < least)
            least = total;
    }
    *total_bytes = least;
    return FSDP_STATUS_OK;
}

/* ---- accounting ------------------------------------------------------------ */

const char *fsdp_mem_kind_name(fsdp_mem_kind k)
{
    static const char *const names[FSDP_MEM_KIND_COUNT] = {
        "param", "grad", "optim", "gather", "act", "comm", "other",
    };
    return (unsigned)k < FSDP_MEM_KIND_COUNT ? names[k] : "?";
}

static size_t rec_hash(const void *p, size_t cap)
{
    uint64_t x = (uint64_t)(uintptr_t)p;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return (size_t)x & (cap - 1);
}

/* The allocation table: open addressing with linear probing, kept at most
 * half full, and deletion by backward shift (no tombstones: a meta run
 * allocates and frees per collective, and tombstones made probes long and
 * sweeps frequent). */
static fsdp_status recs_grow(fsdp_device *d)
{
    size_t ncap = d->n_recs_cap ? d->n_recs_cap * 2 : 256;
    struct fsdp_alloc_rec *nr = calloc(ncap, sizeof *nr);
    if (!nr)
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory for the allocation table");
    for (size_t i = 0; i < d->n_recs_cap; i++) {
        if (!d->recs[i].used)
            continue;
        size_t h = rec_hash(d->recs[i].ptr, ncap);
        while (nr[h].used)
            h = (h + 1) & (ncap - 1);
        nr[h] = d->recs[i];
    }
    free(d->recs);
    d->recs = nr;
    d->n_recs_cap = ncap;
    return FSDP_STATUS_OK;
}

static fsdp_status recs_insert(fsdp_device *d, void *p, size_t bytes, fsdp_mem_kind kind, int host,
                               bool resv)
{
    if ((d->n_recs_used + 1) * 2 > d->n_recs_cap)
        FSDP_TRY(recs_grow(d));
    size_t h = rec_hash(p, d->n_recs_cap);
    while (d->recs[h].used)
        h = (h + 1) & (d->n_recs_cap - 1);
    d->n_recs_used++;
    d->recs[h] = (struct fsdp_alloc_rec){
        .ptr = p, .bytes = bytes, .kind = (unsigned char)kind, .host = (unsigned char)host, .used = 1,
        .resv = resv};
    return FSDP_STATUS_OK;
}

static struct fsdp_alloc_rec *recs_find(fsdp_device *d, const void *p)
{
    if (!d->n_recs_cap)
        return NULL;
    size_t h = rec_hash(p, d->n_recs_cap);
    while (d->recs[h].used) {
        if (d->recs[h].ptr == p)
            return &d->recs[h];
        h = (h + 1) & (d->n_recs_cap - 1);
    }
    return NULL;
}

/* Empty slot r, then move back each later entry of its run whose home slot
 * does not lie cyclically in (hole, its slot], so every entry stays
 * reachable from its home without a tombstone. */
static void recs_remove(fsdp_device *d, struct fsdp_alloc_rec *r)
{
    size_t mask = d->n_recs_cap - 1, hole = (size_t)(r - d->recs);
    for (size_t j = (hole + 1) & mask; d->recs[j].used; j = (j + 1) & mask) {
        size_t home = rec_hash(d->recs[j].ptr, d->n_recs_cap);
        if (((j - home) & mask) >= ((j - hole) & mask)) {
            d->recs[hole] = d->recs[j];
            hole = j;
        }
    }
    d->recs[hole].used = 0;
    d->n_recs_used--;
}

/* The warm-up ledger's entry for exactly `bytes`, or NULL. */
static struct fsdp_reservation *resv_find(fsdp_device *d, size_t bytes)
{
    for (size_t i = 0; i < d->n_resv; i++)
        if (d->resv[i].bytes == bytes)
            return &d->resv[i];
    return NULL;
}

static void stats_add(fsdp_mem_stats *s, size_t bytes, fsdp_mem_kind kind)
{
    s->in_use_bytes += bytes;
    s->kind_bytes[kind] += bytes;
    s->n_live++;
    s->n_allocs++;
    if (s->in_use_bytes > s->peak_bytes) {
        s->peak_bytes = s->in_use_bytes;
        memcpy(s->peak_kind_bytes, s->kind_bytes, sizeof s->kind_bytes);
    }
}

static void stats_sub(fsdp_mem_stats *s, size_t bytes, fsdp_mem_kind kind)
{
    FSDP_ASSERT(s->in_use_bytes >= bytes && s->kind_bytes[kind] >= bytes && s->n_live > 0);
    s->in_use_bytes -= bytes;
    s->kind_bytes[kind] -= bytes;
    s->n_live--;
}

void fsdp_device_reset_peak(fsdp_device *d)
{
    d->mem.peak_bytes = d->mem.in_use_bytes;
    memcpy(d->mem.peak_kind_bytes, d->mem.kind_bytes, sizeof d->mem.kind_bytes);
    d->host.peak_bytes = d->host.in_use_bytes;
    memcpy(d->host.peak_kind_bytes, d->host.kind_bytes, sizeof d->host.kind_bytes);
}

fsdp_status fsdp_device_init(fsdp_device *d, fsdp_backend backend, fsdp_world *w, int rank,
                             int ordinal, size_t cap_bytes)
{
    memset(d, 0, sizeof *d);
    if ((unsigned)backend < FSDP_BACKEND_COUNT)
        d->iface = backends[backend].iface();
    if (!d->iface)
        return fsdp_error_set(FSDP_STATUS_UNSUPPORTED, "backend '%s' is not built in",
                              fsdp_backend_name(backend));
    d->backend = backend;
    d->world = w;
    d->rank = rank;
    d->ordinal = ordinal;
    d->cap_bytes = cap_bytes;
    d->meta_next = (uintptr_t)1 << 40;
    if (d->iface->init)
        FSDP_TRY(d->iface->init(d));
    if (d->iface->stream_create) {
        FSDP_TRY(d->iface->stream_create(d, &d->compute));
        FSDP_TRY(d->iface->stream_create(d, &d->comm));
        FSDP_TRY(d->iface->stream_create(d, &d->copy));
    }
    return FSDP_STATUS_OK;
}

void fsdp_device_fini(fsdp_device *d)
{
    if (!d->iface)
        return;
    for (size_t i = 0; i < d->n_recs_cap; i++) {
        struct fsdp_alloc_rec *r = &d->recs[i];
        if (!r->used)
            continue;
        FSDP_DEBUG(FSDP_SUB_ALLOC, "device %d: releasing leaked %s allocation of %zu bytes",
                   d->rank, fsdp_mem_kind_name((fsdp_mem_kind)r->kind), r->bytes);
        if (r->host)
            d->iface->host_free(d, r->ptr);
        else
            d->iface->free(d, r->ptr);
    }
    free(d->recs);
    d->recs = NULL;
    d->n_recs_cap = d->n_recs_used = 0;
    free(d->resv);
    d->resv = NULL;
    d->n_resv = 0;
    if (d->iface->stream_destroy) {
        d->iface->stream_destroy(d, d->compute);
        d->iface->stream_destroy(d, d->comm);
        d->iface->stream_destroy(d, d->copy);
    }
    if (d->iface->fini)
        d->iface->fini(d);
    d->iface = NULL;
}

static fsdp_status do_alloc(fsdp_device *d, size_t bytes, fsdp_mem_kind kind, const char *what,
                            int host, void **out)
{
    *out = NULL;
    if (bytes == 0)
        return FSDP_STATUS_OK;
    fsdp_mem_stats *s = host ? &d->host : &d->mem;
    char b_req[32], b_use[32], b_cap[32];
    if (d->world && fsdp_world_fault_hit(d->world, FSDP_FAULT_ALLOC, d->rank))
        return fsdp_error_set(FSDP_STATUS_OOM,
                              "device %d: injected allocation failure (%s for %s)",
                              d->rank, fsdp_fmt_bytes(b_req, 32, (double)bytes), what);
    if (!host && d->cap_bytes && (bytes > d->cap_bytes || s->in_use_bytes > d->cap_bytes - bytes))
        return fsdp_error_set(
            FSDP_STATUS_OOM, "device %d out of memory allocating %s for %s (cap %s, in use %s)%s%s",
            d->rank, fsdp_fmt_bytes(b_req, 32, (double)bytes), what,
            fsdp_fmt_bytes(b_cap, 32, (double)d->cap_bytes),
            fsdp_fmt_bytes(b_use, 32, (double)s->in_use_bytes), d->oom_hint ? "; try " : "",
            d->oom_hint ? d->oom_hint : "");
    void *p = NULL;
    fsdp_status st = host ? d->iface->host_alloc(d, bytes, &p) : d->iface->alloc(d, bytes, &p);
    if (st != FSDP_STATUS_OK) {
        fsdp_error_prefix("device %d: allocating %s for %s (in use %s)", d->rank,
                          fsdp_fmt_bytes(b_req, 32, (double)bytes), what,
                          fsdp_fmt_bytes(b_use, 32, (double)s->in_use_bytes));
        return st;
    }
    struct fsdp_reservation *rv = host ? NULL : resv_find(d, bytes);
    st = recs_insert(d, p, bytes, kind, host, rv != NULL);
    if (st != FSDP_STATUS_OK) {
        if (host)
            d->iface->host_free(d, p);
        else
            d->iface->free(d, p);
        return st;
    }
    stats_add(s, bytes, kind);
    if (rv) {
        rv->n_allocs++;
        if (++rv->live > rv->n)
            d->n_resv_misses++;
        if (rv->live > rv->peak_live)
            rv->peak_live = rv->live;
    }
    FSDP_DEBUG(FSDP_SUB_ALLOC, "alloc %s %zu bytes (%s) for %s -> in use %zu",
               host ? "host" : "device", bytes, fsdp_mem_kind_name(kind), what, s->in_use_bytes);
    *out = p;
    return FSDP_STATUS_OK;
}

static void do_free(fsdp_device *d, void *p, int host)
{
    if (!p)
        return;
    struct fsdp_alloc_rec *r = recs_find(d, p);
    FSDP_ASSERT(r && r->host == host); /* freeing a pointer this device did not allocate */
    stats_sub(host ? &d->host : &d->mem, r->bytes, (fsdp_mem_kind)r->kind);
    if (r->resv)
        resv_find(d, r->bytes)->live--;
    recs_remove(d, r);
    if (host)
        d->iface->host_free(d, p);
    else
        d->iface->free(d, p);
}

fsdp_status fsdp_device_alloc(fsdp_device *d, size_t bytes, fsdp_mem_kind kind, const char *what,
                              void **out)
{
    return do_alloc(d, bytes, kind, what, 0, out);
}

void fsdp_device_free(fsdp_device *d, void *p) { do_free(d, p, 0); }

fsdp_status fsdp_device_reserve(fsdp_device *d, size_t bytes, size_t n)
{
    if (!bytes || !n)
        return FSDP_STATUS_OK;
    struct fsdp_reservation *r = resv_find(d, bytes);
    if (!r) {
        struct fsdp_reservation *nr = realloc(d->resv, (d->n_resv + 1) * sizeof *nr);
        if (!nr)
            return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory for the warm-up ledger");
        d->resv = nr;
        r = &d->resv[d->n_resv++];
        *r = (struct fsdp_reservation){.bytes = bytes};
    }
    r->n += n;
    if (!d->iface->reserve)
        return FSDP_STATUS_OK;
    fsdp_status st = d->iface->reserve(d, bytes, n);
    if (st != FSDP_STATUS_OK) {
        char b[32];
        fsdp_error_prefix("device %d: reserving %zu blocks of %s", d->rank, n,
                          fsdp_fmt_bytes(b, sizeof b, (double)bytes));
    }
    return st;
}

fsdp_status fsdp_device_host_alloc(fsdp_device *d, size_t bytes, fsdp_mem_kind kind,
                                   const char *what, void **out)
{
    return do_alloc(d, bytes, kind, what, 1, out);
}

void fsdp_device_host_free(fsdp_device *d, void *p) { do_free(d, p, 1); }

fsdp_status fsdp_device_memcpy(fsdp_device *d, void *dst, const void *src, size_t bytes,
                               fsdp_stream_t s)
{
    if (!bytes || !d->iface->memcpy)
        return FSDP_STATUS_OK;
    return d->iface->memcpy(d, dst, src, bytes, s ? s : d->compute);
}

fsdp_status fsdp_device_memset(fsdp_device *d, void *dst, int value, size_t bytes, fsdp_stream_t s)
{
    if (!bytes || !d->iface->memset)
        return FSDP_STATUS_OK;
    return d->iface->memset(d, dst, value, bytes, s ? s : d->compute);
}

fsdp_status fsdp_device_memcpy2d(fsdp_device *d, void *dst, size_t dpitch, const void *src,
                                 size_t spitch, size_t width, size_t height, fsdp_stream_t s)
{
    if (!width || !height || !d->iface->memcpy)
        return FSDP_STATUS_OK;
    if (height == 1)
        return fsdp_device_memcpy(d, dst, src, width, s);
    if (d->iface->memcpy2d)
        return d->iface->memcpy2d(d, dst, dpitch, src, spitch, width, height, s ? s : d->compute);
    for (size_t i = 0; i < height; i++)
        FSDP_TRY(fsdp_device_memcpy(d, (char *)dst + i * dpitch, (const char *)src + i * spitch,
                                    width, s));
    return FSDP_STATUS_OK;
}

fsdp_status fsdp_device_stream_sync(fsdp_device *d, fsdp_stream_t s)
{
    return d->iface->stream_sync ? d->iface->stream_sync(d, s) : FSDP_STATUS_OK;
}

fsdp_status fsdp_device_launch_host(fsdp_device *d, fsdp_stream_t s, fsdp_host_fn fn, void *arg,
                                    size_t arg_bytes, const char *label)
{
    if (!d->iface->launch_host)
        return fn(arg);
    return d->iface->launch_host(d, s ? s : d->compute, fn, arg, arg_bytes, label);
}

fsdp_status fsdp_device_event_create(fsdp_device *d, fsdp_event_t *out)
{
    *out = NULL;
    return d->iface->event_create ? d->iface->event_create(d, out) : FSDP_STATUS_OK;
}

void fsdp_device_event_destroy(fsdp_device *d, fsdp_event_t e)
{
    if (d->iface->event_destroy && e)
        d->iface->event_destroy(d, e);
}

fsdp_status fsdp_device_event_record(fsdp_device *d, fsdp_event_t e, fsdp_stream_t s)
{
    return d->iface->event_record ? d->iface->event_record(d, e, s) : FSDP_STATUS_OK;
}

fsdp_status fsdp_device_stream_wait_event(fsdp_device *d, fsdp_stream_t s, fsdp_event_t e)
{
    return d->iface->stream_wait_event ? d->iface->stream_wait_event(d, s, e) : FSDP_STATUS_OK;
}

fsdp_status fsdp_device_event_sync(fsdp_device *d, fsdp_event_t e)
{
    return d->iface->event_sync ? d->iface->event_sync(d, e) : FSDP_STATUS_OK;
}
