/*
 * device.h - the device interface: memory (accounted, capped), streams,
 * events and pinned host memory, bound to one rank.
 *
 * A backend is a table of functions (struct fsdp_device_i) plus the device
 * object that carries the accounting; the generic wrappers below do the
 * accounting, the cap and the fault hook, and treat NULL slots as "nothing
 * to do" (the cpu backend's default mode runs stream work inline, so its
 * stream and event slots are NULL; meta backs nothing and copies nothing).
 * Code above this layer must still create streams and record/wait events
 * as if streams were asynchronous, so the same code is right on cuda; the
 * cpu backend's async mode (device/cpu_stream.h: a worker thread per
 * stream, events as fences, optional random delays) makes it so here too,
 * so that a missing wait fails a test on a machine without a GPU.
 *
 * A device is used by its own rank thread only; its statistics may be read
 * by other threads after the ranks are joined.
 */
#ifndef FSDP_DEVICE_DEVICE_H
#define FSDP_DEVICE_DEVICE_H

#include <stdbool.h>
#include <stddef.h>

#include "core/error.h"
#include "core/names.h"
#include "fsdp/fsdp.h"

#ifdef __cplusplus
extern "C" {
#endif

#define FSDP_DEVICE_ALIGN 64

typedef struct fsdp_device fsdp_device;
typedef struct fsdp_world fsdp_world;
typedef struct fsdp_stream *fsdp_stream_t; /* backend-defined; NULL on cpu/meta */
typedef struct fsdp_event *fsdp_event_t;   /* backend-defined; NULL on cpu/meta */

/* Host code queued on a stream (fsdp_device_launch_host): runs once the
 * work queued before it is done; work queued after it waits for it. Its
 * status is the stream's: a failure is kept and returned by the next sync
 * (or at once, where the backend runs it inline). */
typedef fsdp_status (*fsdp_host_fn)(void *arg);

/* What an allocation holds, for the memory breakdown of `fsdp plan`. */
typedef enum fsdp_mem_kind {
    FSDP_MEM_PARAM = 0,  /* parameter shards (master or compute dtype) */
    FSDP_MEM_GRAD,       /* gradient shards and unit gradient buffers */
    FSDP_MEM_OPTIM,      /* optimizer state (Adam m, v) */
    FSDP_MEM_GATHER,     /* gathered (unsharded) unit parameters */
    FSDP_MEM_ACT,        /* activations and their gradients */
    FSDP_MEM_COMM,       /* communication staging buffers */
    FSDP_MEM_OTHER,
    FSDP_MEM_KIND_COUNT
} fsdp_mem_kind;

const char *fsdp_mem_kind_name(fsdp_mem_kind k);

typedef struct fsdp_mem_stats {
    size_t in_use_bytes;                          /* now */
    size_t peak_bytes;                            /* high-water mark */
    size_t n_live;                                /* allocations not yet freed */
    size_t n_allocs;                              /* allocations ever made */
    size_t kind_bytes[FSDP_MEM_KIND_COUNT];       /* in use now, by kind */
    size_t peak_kind_bytes[FSDP_MEM_KIND_COUNT];  /* by kind, at the moment of the peak */
    size_t reserved_bytes;  /* held by the backend beyond in_use_bytes, now: cached free
                               blocks, rounding, its own buffers (cuda); 0 on meta */
} fsdp_mem_stats;

struct fsdp_device_i {
    const char *name;
    /* Backend setup/teardown (optional). For cuda, init runs on the rank's
     * thread and calls cudaSetDevice first. */
    fsdp_status (*init)(fsdp_device *d);
    void (*fini)(fsdp_device *d);
    /* Back `bytes` bytes, 64-byte aligned; accounting is done by the caller. */
    fsdp_status (*alloc)(fsdp_device *d, size_t bytes, void **out);
    void (*free)(fsdp_device *d, void *p);
    /* Pinned (page-locked) host memory for offload. */
    fsdp_status (*host_alloc)(fsdp_device *d, size_t bytes, void **out);
    void (*host_free)(fsdp_device *d, void *p);
    /* Copies between any two of: this device, host memory, another rank's
     * device in this process (peer). Asynchronous on stream s (optional:
     * NULL slot = no data is moved, as on meta). */
    fsdp_status (*memcpy)(fsdp_device *d, void *dst, const void *src, size_t bytes,
                          fsdp_stream_t s);
    fsdp_status (*memset)(fsdp_device *d, void *dst, int value, size_t bytes, fsdp_stream_t s);
    /* Streams and events (optional: NULL = work runs inline, in order). */
    fsdp_status (*stream_create)(fsdp_device *d, fsdp_stream_t *out);
    void (*stream_destroy)(fsdp_device *d, fsdp_stream_t s);
    fsdp_status (*stream_sync)(fsdp_device *d, fsdp_stream_t s);
    fsdp_status (*event_create)(fsdp_device *d, fsdp_event_t *out);
    void (*event_destroy)(fsdp_device *d, fsdp_event_t e);
    fsdp_status (*event_record)(fsdp_device *d, fsdp_event_t e, fsdp_stream_t s);
    fsdp_status (*stream_wait_event)(fsdp_device *d, fsdp_stream_t s, fsdp_event_t e);
    fsdp_status (*event_sync)(fsdp_device *d, fsdp_event_t e);
    /* Make ready n blocks for later allocations of `bytes` without
     * counting them (optional: NULL = nothing to prepare; cuda: its block
     * cache). */
    fsdp_status (*reserve)(fsdp_device *d, size_t bytes, size_t n);
    /* Queue fn on stream s with a copy of arg_bytes of arg; label names the
     * work in errors (optional: NULL = run it now, on the calling thread). */
    fsdp_status (*launch_host)(fsdp_device *d, fsdp_stream_t s, fsdp_host_fn fn, const void *arg,
                               size_t arg_bytes, const char *label);
    /* `height` rows of `width` bytes, row i from src + i * spitch to dst +
     * i * dpitch, both in this device's memory (optional: NULL = one memcpy
     * per row). */
    fsdp_status (*memcpy2d)(fsdp_device *d, void *dst, size_t dpitch, const void *src,
                            size_t spitch, size_t width, size_t height, fsdp_stream_t s);
};

/* One live allocation (open-addressed table keyed by pointer). */
struct fsdp_alloc_rec {
    void *ptr;
    size_t bytes;
    unsigned char kind;  /* fsdp_mem_kind */
    unsigned char host;  /* 1: pinned host allocation */
    unsigned char used;  /* 0 empty, 1 live */
    unsigned char resv;  /* counted in the warm-up ledger's live count of its size */
};

/* The warm-up ledger: a size given to fsdp_device_reserve, how many were
 * reserved, how many allocations of exactly that size (made since the
 * first reservation) are live, were live at most, and were made. */
struct fsdp_reservation {
    size_t bytes, n, live, peak_live, n_allocs;
};

struct fsdp_device {
    const struct fsdp_device_i *iface;
    fsdp_backend backend;
    fsdp_world *world;   /* for the fault hook; may be NULL */
    int rank;            /* the rank that owns this device */
    int ordinal;         /* physical device index (cuda); = rank on cpu/meta */
    size_t cap_bytes;    /* device memory cap; 0 = none (cpu/meta) or the GPU's size */
    const char *oom_hint; /* what an out-of-memory message suggests ("--offload optimizer
                             or more devices"), set by the device's user; NULL: nothing */

    fsdp_mem_stats mem;  /* device memory */
    fsdp_mem_stats host; /* pinned host memory */

    struct fsdp_alloc_rec *recs;
    size_t n_recs_cap;   /* table size (power of two) */
    size_t n_recs_used;  /* live entries */
    uintptr_t meta_next; /* next fake address handed out by meta */

    struct fsdp_reservation *resv; /* the warm-up ledger (fsdp_device_reserve) */
    size_t n_resv;
    size_t n_resv_misses; /* allocations of a reserved size made while as many of
                           * it as were reserved were live already */

    fsdp_stream_t compute, comm, copy; /* created by fsdp_device_init */

    void *ctx;           /* backend private (cuda: handles) */
};

/* Create the device for `rank` on `backend` (ordinal: the physical device;
 * cap_bytes: 0 for none). Runs the backend's init and creates the compute,
 * comm and copy streams. Call on the rank's own thread. */
fsdp_status fsdp_device_init(fsdp_device *d, fsdp_backend backend, fsdp_world *w, int rank,
                             int ordinal, size_t cap_bytes);
/* Release streams and backend state. Live allocations are reported at debug
 * level and released. */
void fsdp_device_fini(fsdp_device *d);

/* Allocate `bytes` of device memory for `what` (a phrase used in the error
 * message: "unit 'h.7' gather"). Fails with OOM and a message naming the
 * device, the request, the memory in use and the cap, then "; try " and
 * d->oom_hint when one is set. bytes = 0 gives NULL
 * and OK. Accounting counts exactly `bytes`. */
fsdp_status fsdp_device_alloc(fsdp_device *d, size_t bytes, fsdp_mem_kind kind, const char *what,
                              void **out);
/* Free a pointer from fsdp_device_alloc (NULL is a no-op). Stream-ordered:
 * work already queued on the device's streams may still use p (inline cpu
 * and meta have run it already; cuda and async cpu hand the memory out
 * again only after that work, device/block_cache.h), so no host wait is
 * needed before it.
 * The accounting drops the bytes at once. */
void fsdp_device_free(fsdp_device *d, void *p);

/* Warm-up: prepare the backend to serve n allocations of `bytes` live at
 * once without asking its driver (cuda and cpu: n blocks added to the
 * block cache, shown in mem.reserved_bytes; meta: nothing). Counts nothing: in
 * use bytes, peaks and allocation counts stay as they were on every
 * backend. Every backend keeps a ledger of it: d->n_resv_misses counts the
 * later allocations of exactly a reserved size made while n of that size
 * (allocated after the reservation) were live, so a cpu or meta run shows
 * whether a reservation covers what a cuda run would hold. Calls add up.
 * OOM with a message when the GPU has no room (what was reserved before
 * stays: the allocations themselves will then ask the driver). */
fsdp_status fsdp_device_reserve(fsdp_device *d, size_t bytes, size_t n);

/* Pinned host memory, counted in d->host (never against the device cap). */
fsdp_status fsdp_device_host_alloc(fsdp_device *d, size_t bytes, fsdp_mem_kind kind,
                                   const char *what, void **out);
void fsdp_device_host_free(fsdp_device *d, void *p);

/* Copies and sets, asynchronous on s (s may be NULL = the compute stream). */
fsdp_status fsdp_device_memcpy(fsdp_device *d, void *dst, const void *src, size_t bytes,
                               fsdp_stream_t s);
fsdp_status fsdp_device_memset(fsdp_device *d, void *dst, int value, size_t bytes,
                               fsdp_stream_t s);
/* `height` rows of `width` bytes between two buffers of this device's
 * memory: row i from src + i * spitch to dst + i * dpitch. */
fsdp_status fsdp_device_memcpy2d(fsdp_device *d, void *dst, size_t dpitch, const void *src,
                                 size_t spitch, size_t width, size_t height, fsdp_stream_t s);

/* Wait on the host for the work queued on s. Returns the device's first
 * failure of queued work (its message set on the calling thread), if any:
 * a failure stays with the device, as CUDA's sticky errors do. */
fsdp_status fsdp_device_stream_sync(fsdp_device *d, fsdp_stream_t s);
/* Run fn(arg) in stream order on s (fsdp_host_fn above): queued with a
 * copy of arg_bytes of arg where the backend has asynchronous host work
 * (cpu async), else now on the calling thread, with its status returned.
 * s NULL is the compute stream. Queued host work must not call the device
 * layer's stream functions. */
fsdp_status fsdp_device_launch_host(fsdp_device *d, fsdp_stream_t s, fsdp_host_fn fn, void *arg,
                                    size_t arg_bytes, const char *label);
fsdp_status fsdp_device_event_create(fsdp_device *d, fsdp_event_t *out);
void fsdp_device_event_destroy(fsdp_device *d, fsdp_event_t e);
fsdp_status fsdp_device_event_record(fsdp_device *d, fsdp_event_t e, fsdp_stream_t s);
fsdp_status fsdp_device_stream_wait_event(fsdp_device *d, fsdp_stream_t s, fsdp_event_t e);
fsdp_status fsdp_device_event_sync(fsdp_device *d, fsdp_event_t e);

/* Reset peak to the current use (per-step peaks). */
void fsdp_device_reset_peak(fsdp_device *d);

/* ---- the backends ----------------------------------------------------------
 * One table (device.c) says, per backend, its name and help line, its
 * function table, how many devices it offers and how many a run uses by
 * default. fsdp_device_init, fsdp_backend_name and the CLI's --backend read
 * it; nothing else switches on which backends exist. */

/* The --backend values: cpu, cuda, meta. */
extern const fsdp_name_table fsdp_backend_names;

/* The backend a run uses when none is named: cuda when a GPU is visible,
 * else cpu. */
fsdp_backend fsdp_backend_default(void);

/* Devices `b` offers here: FSDP_MAX_RANKS simulated devices on cpu and meta,
 * the visible GPUs on cuda (0 without a GPU or in a build without CUDA). */
int fsdp_backend_n_devices(fsdp_backend b);

/* Devices a run on `b` uses when --devices is not given: 4 simulated
 * devices on cpu and meta, every visible GPU on cuda. */
int fsdp_backend_default_devices(fsdp_backend b);

/* Whether `b` can run n_ranks ranks with ranks_per_device of them sharing
 * each device: OK, or INVALID_ARG (a count out of range) or UNSUPPORTED
 * (a backend this build or machine lacks) with a message that names the
 * option to change. Whether the transport lets ranks share a device is
 * fsdp_transport_pick's question (comm/transport.h). */
fsdp_status fsdp_backend_check(fsdp_backend b, int n_ranks, int ranks_per_device);

/* The memory of the devices a run on `b` uses, devices 0 .. n_devices-1
 * (those visible, if fewer): *total_bytes the smallest one's size. cuda:
 * each GPU's total from cudaMemGetInfo (which creates the GPU's primary
 * context, shared later by the rank threads; the calling thread's current
 * device is kept). cpu and meta: OK with 0, as simulated devices have no
 * size of their own (--device-mem caps them). UNSUPPORTED when the backend
 * has no device here, CUDA with the driver's message. Call it before the
 * ranks start (it is for the checks that run first, not the step). */
fsdp_status fsdp_backend_device_total(fsdp_backend b, int n_devices, size_t *total_bytes);

/* Backend function tables. cuda's is NULL when built without CUDA;
 * fsdp_cuda_device_count() returns 0 then, or when no GPU is visible, and
 * fsdp_cuda_device_memory (one GPU's total and free bytes) UNSUPPORTED
 * (device/cuda.cu, or device/cuda_device_stub.c in a build without CUDA). */
extern const struct fsdp_device_i fsdp_device_cpu_i;
extern const struct fsdp_device_i fsdp_device_meta_i;
/* The cpu table of the stream mode devices created now get: inline
 * (fsdp_device_cpu_i) or async (device/cpu.h); inline, with a warning,
 * when the environment's setting is not valid (the CLI reports that
 * first). */
const struct fsdp_device_i *fsdp_device_cpu_iface(void);
const struct fsdp_device_i *fsdp_device_cuda_iface(void);
int fsdp_cuda_device_count(void);
fsdp_status fsdp_cuda_device_memory(int ordinal, size_t *total_bytes, size_t *free_bytes);

/* True when the backend computes (cpu, cuda), false for meta. */
static inline bool fsdp_device_computes(const fsdp_device *d)
{
    return d->backend != FSDP_BACKEND_META;
}

#ifdef __cplusplus
}
#endif

#endif /* FSDP_DEVICE_DEVICE_H */
