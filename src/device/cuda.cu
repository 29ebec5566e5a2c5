/*
 * cuda.cu - the cuda device: stream-ordered cached device memory, three
 * streams per rank, events, pinned host memory (cudaHostAlloc), and copies
 * that never wait on the GPU where an abort could not interrupt them.
 *
 * Each rank thread owns one device context. init() calls cudaSetDevice
 * first (the runtime's current device is per thread).
 *
 * Memory: every device allocation goes through a block cache
 * (device/block_cache.h): a freed block keeps a fence (one event on each of
 * the compute, comm and copy streams, recorded at the free) and is handed
 * out again once the fence is done, so after the first step the training
 * step never calls cudaMalloc or cudaFree (cudaFree waits for the whole
 * device, and allocation calls while another thread's NCCL kernel waits
 * for peers are a known hang pattern); the engine reserves the step's
 * blocks before the first step (fsdp_device_reserve), so not even the
 * first one does. The device layer still counts
 * exactly the bytes asked for; what the cache holds beyond that is
 * d->mem.reserved_bytes. Blocks go back to the driver at fini, after the
 * communicator has been stopped.
 *
 * Copies use cudaMemcpyAsync with cudaMemcpyDefault: unified addressing
 * resolves host, device and peer pointers, so peer copies between ranks'
 * buffers in this process need no IPC handles. Pageable host memory is
 * staged through two pinned buffers: host-to-device returns once the data
 * is in a pinned buffer (the source may be reused), device-to-host returns
 * when the data has arrived; the waits poll like every other wait.
 *
 * Stream and event syncs of a rank in a world of several ranks poll instead
 * of blocking, and give up with ABORTED when another rank fails: the GPU
 * may be waiting for that rank (a queued NCCL collective whose peer never
 * comes), and a blocking sync would then hang the thread for ever. On
 * seeing the abort flag they first run the rank's stop hook (nccl:
 * ncclCommAbort, which ends such kernels), so that teardown can free.
 */
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "device/cuda_check.h"
#include "device/cuda_device.h"
#include "device/cuda_world.h"
#include "device/device.h"

/* Bytes of each of the two pinned buffers that stage pageable copies. */
#define CUDA_STAGE_BYTES ((size_t)8 << 20)

/* A block's fence: where each of the device's three streams was. */
struct cuda_fence {
    cudaEvent_t ev[3];
};

struct cuda_dev {
    fsdp_device *d;
    pthread_mutex_t host_mu;    /* host_err: written by CUDA's callback thread */
    fsdp_status host_err;       /* first failure of host work queued by launch_host */
    char host_msg[FSDP_ERROR_MSG_MAX];
    fsdp_block_cache cache;
    void *stage[2];          /* pinned, CUDA_STAGE_BYTES each, made at the first pageable copy */
    cudaEvent_t stage_ev[2]; /* the last copy that used each */
    bool stage_used[2];
    int stage_next;
};

static struct cuda_dev *cuda_dev_of(const fsdp_device *d) { return (struct cuda_dev *)d->ctx; }

/* Wait for query() to stop returning cudaErrorNotReady: spin briefly, then
 * sleep in short naps, checking the world's abort flag; when it is set,
 * stop this rank's collectives first, then return ABORTED. */
template <typename Q>
static fsdp_status cuda_poll(fsdp_device *d, Q query, const char *what)
{
    for (unsigned spins = 0;; spins++) {
        /* "not ready" is not an error: the take keeps it out of later checks */
        cudaError_t rc = fsdp_cuda_error_take(query());
        if (rc == cudaSuccess)
            return FSDP_STATUS_OK;
        if (rc != cudaErrorNotReady)
            return fsdp_error_set(FSDP_STATUS_CUDA, "rank %d (GPU %d): %s failed: %s", d->rank,
                                  d->ordinal, what, cudaGetErrorString(rc));
        if (fsdp_cuda_world_aborted(d->world)) {
            fsdp_cuda_world_rank_stop(d->world, d->rank, FSDP_STATUS_OK);
            return fsdp_error_set(FSDP_STATUS_ABORTED,
                                  "rank %d: stopped waiting for GPU %d (%s): another rank failed",
                                  d->rank, d->ordinal, what);
        }
        if (spins >= 100) {
            struct timespec ts = {0, spins < 2000 ? 10 * 1000 : 100 * 1000};
            nanosleep(&ts, NULL);
        }
    }
}

/* Only a world of several ranks can be aborted while this thread waits. */
static bool cuda_can_abort(const fsdp_device *d)
{
    return d->world && fsdp_cuda_world_n_ranks(d->world) > 1;
}

static fsdp_status cuda_wait_event(fsdp_device *d, cudaEvent_t e, const char *what)
{
    if (cuda_can_abort(d))
        return cuda_poll(d, [e] { return cudaEventQuery(e); }, what);
    cudaError_t rc = fsdp_cuda_error_take(cudaEventSynchronize(e));
    if (rc != cudaSuccess)
        return fsdp_error_set(FSDP_STATUS_CUDA, "rank %d (GPU %d): %s failed: %s", d->rank,
                              d->ordinal, what, cudaGetErrorString(rc));
    return FSDP_STATUS_OK;
}

/* ---- the block cache's driver and fences ----------------------------------- */

static fsdp_status cache_raw_alloc(void *ctx, size_t bytes, void **out)
{
    struct cuda_dev *cd = (struct cuda_dev *)ctx;
    cudaError_t rc = fsdp_cuda_error_take(cudaMalloc(out, bytes));
    if (rc == cudaSuccess)
        return FSDP_STATUS_OK;
    if (rc == cudaErrorMemoryAllocation)
        return FSDP_STATUS_OOM;
    return fsdp_error_set(FSDP_STATUS_CUDA, "rank %d (GPU %d): cudaMalloc of %zu bytes: %s",
                          cd->d->rank, cd->d->ordinal, bytes, cudaGetErrorString(rc));
}

static void cache_raw_free(void *ctx, void *p)
{
    (void)ctx;
    (void)fsdp_cuda_error_take(cudaFree(p));
}

static fsdp_status cache_fence_record(void *ctx, void **fence)
{
    struct cuda_dev *cd = (struct cuda_dev *)ctx;
    fsdp_device *d = cd->d;
    struct cuda_fence *f = (struct cuda_fence *)*fence;
    if (!f) {
        f = (struct cuda_fence *)calloc(1, sizeof *f);
        if (!f)
            return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory for a block fence");
        for (int i = 0; i < 3; i++) {
            cudaError_t rc =
                fsdp_cuda_error_take(cudaEventCreateWithFlags(&f->ev[i], cudaEventDisableTiming));
            if (rc != cudaSuccess) {
                while (i-- > 0)
                    (void)fsdp_cuda_error_take(cudaEventDestroy(f->ev[i]));
                free(f);
                return fsdp_error_set(FSDP_STATUS_CUDA, "rank %d (GPU %d): creating a fence: %s",
                                      d->rank, d->ordinal, cudaGetErrorString(rc));
            }
        }
        *fence = f;
    }
    fsdp_stream_t s[3] = {d->compute, d->comm, d->copy};
    for (int i = 0; i < 3; i++)
        CUDA_TRY(cudaEventRecord(f->ev[i], (cudaStream_t)s[i]));
    return FSDP_STATUS_OK;
}

static fsdp_status cache_fence_query(void *ctx, void *fence, bool *done)
{
    struct cuda_dev *cd = (struct cuda_dev *)ctx;
    struct cuda_fence *f = (struct cuda_fence *)fence;
    *done = true;
    for (int i = 0; i < 3 && *done; i++) {
        cudaError_t rc = fsdp_cuda_error_take(cudaEventQuery(f->ev[i]));
        if (rc == cudaErrorNotReady) {
            *done = false;
        } else if (rc != cudaSuccess) {
            return fsdp_error_set(FSDP_STATUS_CUDA, "rank %d (GPU %d): a cached block's fence: %s",
                                  cd->d->rank, cd->d->ordinal, cudaGetErrorString(rc));
        }
    }
    return FSDP_STATUS_OK;
}

static fsdp_status cache_fence_order(void *ctx, void *fence)
{
    fsdp_device *d = ((struct cuda_dev *)ctx)->d;
    struct cuda_fence *f = (struct cuda_fence *)fence;
    fsdp_stream_t s[3] = {d->compute, d->comm, d->copy};
    for (int i = 0; i < 3; i++)
        for (int k = 0; k < 3; k++)
            CUDA_TRY(cudaStreamWaitEvent((cudaStream_t)s[i], f->ev[k], 0));
    return FSDP_STATUS_OK;
}

static fsdp_status cache_fence_wait(void *ctx, void *fence)
{
    fsdp_device *d = ((struct cuda_dev *)ctx)->d;
    struct cuda_fence *f = (struct cuda_fence *)fence;
    for (int i = 0; i < 3; i++)
        FSDP_TRY(cuda_wait_event(d, f->ev[i], "waiting for a cached block's last user"));
    return FSDP_STATUS_OK;
}

static void cache_fence_destroy(void *ctx, void *fence)
{
    (void)ctx;
    struct cuda_fence *f = (struct cuda_fence *)fence;
    for (int i = 0; i < 3; i++)
        (void)fsdp_cuda_error_take(cudaEventDestroy(f->ev[i]));
    free(f);
}

static const fsdp_block_cache_i cuda_cache_i = {
    /* .raw_alloc     = */ cache_raw_alloc,
    /* .raw_free      = */ cache_raw_free,
    /* .fence_record  = */ cache_fence_record,
    /* .fence_query   = */ cache_fence_query,
    /* .fence_order   = */ cache_fence_order,
    /* .fence_wait    = */ cache_fence_wait,
    /* .fence_destroy = */ cache_fence_destroy,
    /* .owner         = */ "the GPU",
};

/* ---- the device table ------------------------------------------------------ */

static fsdp_status cuda_init(fsdp_device *d)
{
    CUDA_TRY(cudaSetDevice(d->ordinal));
    struct cuda_dev *cd = (struct cuda_dev *)calloc(1, sizeof *cd);
    if (!cd)
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory creating the cuda device");
    cd->d = d;
    pthread_mutex_init(&cd->host_mu, NULL);
    fsdp_block_cache_init(&cd->cache, &cuda_cache_i, cd);
    d->ctx = cd;
    return FSDP_STATUS_OK;
}

static void cuda_fini(fsdp_device *d)
{
    struct cuda_dev *cd = cuda_dev_of(d);
    if (!cd)
        return;
    /* cudaFree waits for the whole device: a collective kernel left
     * waiting for a failed rank must be stopped first (a no-op unless the
     * world was aborted and the communicator is still up). */
    fsdp_cuda_world_rank_stop(d->world, d->rank, FSDP_STATUS_OK);
    fsdp_block_cache_fini(&cd->cache);
    for (int k = 0; k < 2; k++) {
        if (cd->stage[k])
            (void)fsdp_cuda_error_take(cudaFreeHost(cd->stage[k]));
        if (cd->stage_ev[k])
            (void)fsdp_cuda_error_take(cudaEventDestroy(cd->stage_ev[k]));
    }
    pthread_mutex_destroy(&cd->host_mu);
    free(cd);
    d->ctx = NULL;
    d->mem.reserved_bytes = 0;
}

static void cuda_note_reserved(fsdp_device *d)
{
    d->mem.reserved_bytes = fsdp_block_cache_reserved(&cuda_dev_of(d)->cache);
}

static fsdp_status cuda_alloc(fsdp_device *d, size_t bytes, void **out)
{
    return fsdp_block_cache_dev_alloc(&cuda_dev_of(d)->cache, &d->mem.reserved_bytes, bytes, out);
}

static void cuda_free(fsdp_device *d, void *p)
{
    fsdp_block_cache_dev_free(&cuda_dev_of(d)->cache, &d->mem.reserved_bytes, p);
}

static fsdp_status cuda_reserve(fsdp_device *d, size_t bytes, size_t n)
{
    return fsdp_block_cache_dev_reserve(&cuda_dev_of(d)->cache, &d->mem.reserved_bytes, bytes,
                                        n);
}

extern "C" fsdp_status fsdp_cuda_device_alloc_own(fsdp_device *d, size_t bytes, const char *what,
                                                  void **out)
{
    *out = NULL;
    if (!bytes)
        return FSDP_STATUS_OK;
    fsdp_status st = fsdp_block_cache_alloc(&cuda_dev_of(d)->cache, bytes, false, out);
    cuda_note_reserved(d);
    if (st != FSDP_STATUS_OK)
        fsdp_error_prefix("device %d: allocating %zu bytes for %s", d->rank, bytes, what);
    return st;
}

extern "C" void fsdp_cuda_device_free_own(fsdp_device *d, void *p)
{
    if (!p)
        return;
    fsdp_block_cache_free(&cuda_dev_of(d)->cache, p);
    cuda_note_reserved(d);
}

extern "C" const fsdp_block_cache *fsdp_cuda_device_cache(const fsdp_device *d)
{
    return d && d->backend == FSDP_BACKEND_CUDA && d->ctx ? &cuda_dev_of(d)->cache : NULL;
}

static fsdp_status cuda_host_alloc(fsdp_device *d, size_t bytes, void **out)
{
    (void)d;
    CUDA_TRY(cudaHostAlloc(out, bytes, cudaHostAllocPortable));
    return FSDP_STATUS_OK;
}

static void cuda_host_free(fsdp_device *d, void *p)
{
    (void)d;
    (void)fsdp_cuda_error_take(cudaFreeHost(p));
}

/* ---- copies ------------------------------------------------------------------ */

/* Ordinary (pageable) host memory, which the copy engines cannot read
 * asynchronously. */
static bool host_pageable(const void *p)
{
    cudaPointerAttributes a;
    if (fsdp_cuda_error_take(cudaPointerGetAttributes(&a, p)) != cudaSuccess)
        return true;
    return a.type == cudaMemoryTypeUnregistered;
}

static fsdp_status stage_ready(fsdp_device *d)
{
    struct cuda_dev *cd = cuda_dev_of(d);
    for (int k = 0; k < 2; k++) {
        if (!cd->stage[k])
            CUDA_TRY(cudaHostAlloc(&cd->stage[k], CUDA_STAGE_BYTES, cudaHostAllocPortable));
        if (!cd->stage_ev[k])
            CUDA_TRY(cudaEventCreateWithFlags(&cd->stage_ev[k], cudaEventDisableTiming));
    }
    return FSDP_STATUS_OK;
}

/* Take pinned buffer k for a new copy: its previous copy is done. */
static fsdp_status stage_take(fsdp_device *d, int k)
{
    struct cuda_dev *cd = cuda_dev_of(d);
    if (cd->stage_used[k])
        FSDP_TRY(cuda_wait_event(d, cd->stage_ev[k], "waiting for a pinned staging buffer"));
    cd->stage_used[k] = false;
    return FSDP_STATUS_OK;
}

static fsdp_status stage_issue(fsdp_device *d, int k, void *dst, const void *src, size_t n,
                               cudaStream_t s)
{
    struct cuda_dev *cd = cuda_dev_of(d);
    CUDA_TRY(cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, s));
    CUDA_TRY(cudaEventRecord(cd->stage_ev[k], s));
    cd->stage_used[k] = true;
    return FSDP_STATUS_OK;
}

/* Pageable host -> device, through the two pinned buffers in turn. */
static fsdp_status copy_from_pageable(fsdp_device *d, char *dst, const char *src, size_t bytes,
                                      cudaStream_t s)
{
    struct cuda_dev *cd = cuda_dev_of(d);
    FSDP_TRY(stage_ready(d));
    for (size_t off = 0; off < bytes; off += CUDA_STAGE_BYTES) {
        size_t n = bytes - off < CUDA_STAGE_BYTES ? bytes - off : CUDA_STAGE_BYTES;
        int k = cd->stage_next;
        cd->stage_next ^= 1;
        FSDP_TRY(stage_take(d, k));
        memcpy(cd->stage[k], src + off, n);
        FSDP_TRY(stage_issue(d, k, dst + off, cd->stage[k], n, s));
    }
    return FSDP_STATUS_OK;
}

/* Device -> pageable host: chunk i is copied into buffer i % 2 while the
 * host drains chunk i - 1 from the other one. Returns with dst written. */
static fsdp_status copy_to_pageable(fsdp_device *d, char *dst, const char *src, size_t bytes,
                                    cudaStream_t s)
{
    struct cuda_dev *cd = cuda_dev_of(d);
    FSDP_TRY(stage_ready(d));
    size_t n_chunks = (bytes + CUDA_STAGE_BYTES - 1) / CUDA_STAGE_BYTES;
    for (size_t i = 0; i <= n_chunks; i++) {
        if (i < n_chunks) {
            size_t off = i * CUDA_STAGE_BYTES;
            size_t n = bytes - off < CUDA_STAGE_BYTES ? bytes - off : CUDA_STAGE_BYTES;
            FSDP_TRY(stage_take(d, (int)(i & 1)));
            FSDP_TRY(stage_issue(d, (int)(i & 1), cd->stage[i & 1], src + off, n, s));
        }
        if (i > 0) {
            size_t off = (i - 1) * CUDA_STAGE_BYTES;
            size_t n = bytes - off < CUDA_STAGE_BYTES ? bytes - off : CUDA_STAGE_BYTES;
            int k = (int)((i - 1) & 1);
            FSDP_TRY(stage_take(d, k));
            memcpy(dst + off, cd->stage[k], n);
        }
    }
    return FSDP_STATUS_OK;
}

static fsdp_status cuda_memcpy(fsdp_device *d, void *dst, const void *src, size_t bytes,
                               fsdp_stream_t s)
{
    bool from_host = host_pageable(src), to_host = host_pageable(dst);
    if (from_host && to_host) {
        /* nothing on the GPU writes pageable memory (copies into it are
         * finished before they return), so it can be copied now */
        memmove(dst, src, bytes);
        return FSDP_STATUS_OK;
    }
    if (from_host)
        return copy_from_pageable(d, (char *)dst, (const char *)src, bytes, (cudaStream_t)s);
    if (to_host)
        return copy_to_pageable(d, (char *)dst, (const char *)src, bytes, (cudaStream_t)s);
    CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, (cudaStream_t)s));
    return FSDP_STATUS_OK;
}

static fsdp_status cuda_memcpy2d(fsdp_device *d, void *dst, size_t dpitch, const void *src,
                                 size_t spitch, size_t width, size_t height, fsdp_stream_t s)
{
    (void)d;
    CUDA_TRY(cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, height, cudaMemcpyDefault,
                               (cudaStream_t)s));
    return FSDP_STATUS_OK;
}

static fsdp_status cuda_memset(fsdp_device *d, void *dst, int value, size_t bytes, fsdp_stream_t s)
{
    (void)d;
    CUDA_TRY(cudaMemsetAsync(dst, value, bytes, (cudaStream_t)s));
    return FSDP_STATUS_OK;
}

/* ---- streams and events ------------------------------------------------------ */

static fsdp_status cuda_stream_create(fsdp_device *d, fsdp_stream_t *out)
{
    (void)d;
    cudaStream_t s;
    CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    *out = (fsdp_stream_t)s;
    return FSDP_STATUS_OK;
}

static void cuda_stream_destroy(fsdp_device *d, fsdp_stream_t s)
{
    (void)d;
    if (s)
        (void)fsdp_cuda_error_take(cudaStreamDestroy((cudaStream_t)s));
}

/* OK, or the first failure of host work queued by launch_host (its
 * message set on the calling thread): it stays, as CUDA's sticky errors. */
static fsdp_status host_work_status(fsdp_device *d)
{
    struct cuda_dev *cd = cuda_dev_of(d);
    pthread_mutex_lock(&cd->host_mu);
    fsdp_status st = cd->host_err;
    char msg[FSDP_ERROR_MSG_MAX];
    snprintf(msg, sizeof msg, "%s", cd->host_msg);
    pthread_mutex_unlock(&cd->host_mu);
    return st == FSDP_STATUS_OK ? st : fsdp_error_set(st, "%s", msg);
}

static fsdp_status cuda_stream_sync(fsdp_device *d, fsdp_stream_t s)
{
    if (cuda_can_abort(d))
        FSDP_TRY(cuda_poll(d, [s] { return cudaStreamQuery((cudaStream_t)s); }, "stream sync"));
    else
        CUDA_TRY(cudaStreamSynchronize((cudaStream_t)s));
    return host_work_status(d);
}

static fsdp_status cuda_event_create(fsdp_device *d, fsdp_event_t *out)
{
    (void)d;
    cudaEvent_t e;
    CUDA_TRY(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    *out = (fsdp_event_t)e;
    return FSDP_STATUS_OK;
}

static void cuda_event_destroy(fsdp_device *d, fsdp_event_t e)
{
    (void)d;
    (void)fsdp_cuda_error_take(cudaEventDestroy((cudaEvent_t)e));
}

static fsdp_status cuda_event_record(fsdp_device *d, fsdp_event_t e, fsdp_stream_t s)
{
    (void)d;
    CUDA_TRY(cudaEventRecord((cudaEvent_t)e, (cudaStream_t)s));
    return FSDP_STATUS_OK;
}

static fsdp_status cuda_stream_wait_event(fsdp_device *d, fsdp_stream_t s, fsdp_event_t e)
{
    (void)d;
    CUDA_TRY(cudaStreamWaitEvent((cudaStream_t)s, (cudaEvent_t)e, 0));
    return FSDP_STATUS_OK;
}

static fsdp_status cuda_event_sync(fsdp_device *d, fsdp_event_t e)
{
    FSDP_TRY(cuda_wait_event(d, (cudaEvent_t)e, "event sync"));
    return host_work_status(d);
}

/* ---- host work in stream order ----------------------------------------------- */

struct host_call {
    fsdp_host_fn fn;
    struct cuda_dev *cd;
    char label[64];
    alignas(max_align_t) unsigned char arg[1];
};

/* Runs on CUDA's callback thread: no CUDA calls (the host functions queued
 * here are trace stamps and offload's job submission, which make none). */
static void CUDART_CB run_host_call(void *p)
{
    struct host_call *c = (struct host_call *)p;
    fsdp_status st = c->fn(c->arg);
    if (st != FSDP_STATUS_OK) {
        struct cuda_dev *cd = c->cd;
        pthread_mutex_lock(&cd->host_mu);
        if (cd->host_err == FSDP_STATUS_OK) {
            cd->host_err = st;
            snprintf(cd->host_msg, sizeof cd->host_msg, "%s: %s (host work queued by rank %d)",
                     c->label, fsdp_error_msg(), cd->d->rank);
        }
        pthread_mutex_unlock(&cd->host_mu);
        fsdp_error_clear();
    }
    free(c);
}

static fsdp_status cuda_launch_host(fsdp_device *d, fsdp_stream_t s, fsdp_host_fn fn,
                                    const void *arg, size_t arg_bytes, const char *label)
{
    struct host_call *c = (struct host_call *)malloc(sizeof *c + arg_bytes);
    if (!c)
        return fsdp_error_set(FSDP_STATUS_OOM, "rank %d: out of host memory queueing '%s'",
                              d->rank, label ? label : "host work");
    c->fn = fn;
    c->cd = cuda_dev_of(d);
    snprintf(c->label, sizeof c->label, "%s", label ? label : "host work");
    if (arg_bytes)
        memcpy(c->arg, arg, arg_bytes);
    cudaError_t rc = cudaLaunchHostFunc((cudaStream_t)s, run_host_call, c);
    if (rc != cudaSuccess) {
        free(c);
        cudaGetLastError();
        return fsdp_error_set(FSDP_STATUS_CUDA, "rank %d (GPU %d): queueing '%s': %s", d->rank,
                              d->ordinal, label ? label : "host work", cudaGetErrorString(rc));
    }
    return FSDP_STATUS_OK;
}

static const struct fsdp_device_i cuda_device_i = {
    /* .name              = */ "cuda",
    /* .init              = */ cuda_init,
    /* .fini              = */ cuda_fini,
    /* .alloc             = */ cuda_alloc,
    /* .free              = */ cuda_free,
    /* .host_alloc        = */ cuda_host_alloc,
    /* .host_free         = */ cuda_host_free,
    /* .memcpy            = */ cuda_memcpy,
    /* .memset            = */ cuda_memset,
    /* .stream_create     = */ cuda_stream_create,
    /* .stream_destroy    = */ cuda_stream_destroy,
    /* .stream_sync       = */ cuda_stream_sync,
    /* .event_create      = */ cuda_event_create,
    /* .event_destroy     = */ cuda_event_destroy,
    /* .event_record      = */ cuda_event_record,
    /* .stream_wait_event = */ cuda_stream_wait_event,
    /* .event_sync        = */ cuda_event_sync,
    /* .reserve           = */ cuda_reserve,
    /* .launch_host       = */ cuda_launch_host,
    /* .memcpy2d          = */ cuda_memcpy2d,
};

extern "C" const struct fsdp_device_i *fsdp_device_cuda_iface(void) { return &cuda_device_i; }

extern "C" fsdp_status fsdp_cuda_device_memory(int ordinal, size_t *total_bytes,
                                               size_t *free_bytes)
{
    *total_bytes = *free_bytes = 0;
    int n = fsdp_cuda_device_count();
    if (ordinal < 0 || ordinal >= n)
        return fsdp_error_set(FSDP_STATUS_UNSUPPORTED,
                              "the memory of GPU %d: %d GPU(s) are visible", ordinal, n);
    int prev = 0;
    CUDA_TRY(cudaGetDevice(&prev));
    CUDA_TRY(cudaSetDevice(ordinal));
    cudaError_t rc = fsdp_cuda_error_take(cudaMemGetInfo(free_bytes, total_bytes));
    (void)fsdp_cuda_error_take(cudaSetDevice(prev));
    if (rc != cudaSuccess)
        return fsdp_error_set(FSDP_STATUS_CUDA, "GPU %d: cudaMemGetInfo failed: %s", ordinal,
                              cudaGetErrorString(rc));
    return FSDP_STATUS_OK;
}

extern "C" int fsdp_cuda_device_count(void)
{
    int n = 0;
    if (fsdp_cuda_error_take(cudaGetDeviceCount(&n)) != cudaSuccess)
        return 0;
    return n;
}
