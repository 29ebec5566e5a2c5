/*
 * cuda.cu - the cuda device: cudaMalloc'd memory, three streams per rank,
 * events, pinned host memory (cudaHostAlloc).
 *
 * Each rank thread owns one device context. init() calls cudaSetDevice
 * first (the runtime's current device is per thread). Copies use
 * cudaMemcpyAsync with cudaMemcpyDefault: unified addressing resolves host,
 * device and peer pointers, so peer copies between ranks' buffers in this
 * process need no IPC handles.
 *
 * Stream and event syncs of a rank in a world of several ranks poll instead
 * of blocking, and give up with ABORTED when another rank fails: the GPU
 * may be waiting for that rank (a queued NCCL collective whose peer never
 * comes), and a blocking sync would then hang the thread for ever.
 */
#include <time.h>

#include "device/cuda_check.h"
#include "device/cuda_world.h"
#include "device/device.h"

/* Wait for query() to stop returning cudaErrorNotReady: spin briefly, then
 * sleep in short naps, checking the world's abort flag. */
template <typename Q>
static fsdp_status cuda_poll(fsdp_device *d, Q query, const char *what)
{
    for (unsigned spins = 0;; spins++) {
        cudaError_t rc = query();
        if (rc == cudaSuccess)
            return FSDP_STATUS_OK;
        if (rc != cudaErrorNotReady)
            return fsdp_error_set(FSDP_STATUS_CUDA, "rank %d (GPU %d): %s failed: %s", d->rank,
                                  d->ordinal, what, cudaGetErrorString(rc));
        cudaGetLastError(); /* "not ready" is not an error; keep it out of later checks */
        if (fsdp_cuda_world_aborted(d->world))
            return fsdp_error_set(FSDP_STATUS_ABORTED,
                                  "rank %d: stopped waiting for GPU %d (%s): another rank failed",
                                  d->rank, d->ordinal, what);
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

static fsdp_status cuda_init(fsdp_device *d)
{
    CUDA_TRY(cudaSetDevice(d->ordinal));
    return FSDP_STATUS_OK;
}

static fsdp_status cuda_alloc(fsdp_device *d, size_t bytes, void **out)
{
    (void)d;
    cudaError_t rc = cudaMalloc(out, bytes);
    if (rc == cudaErrorMemoryAllocation) {
        cudaGetLastError();
        return fsdp_error_set(FSDP_STATUS_OOM, "cudaMalloc of %zu bytes failed: GPU %d is full",
                              bytes, d->ordinal);
    }
    CUDA_TRY(rc);
    return FSDP_STATUS_OK;
}

static void cuda_free(fsdp_device *d, void *p)
{
    (void)d;
    cudaFree(p);
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
    cudaFreeHost(p);
}

static fsdp_status cuda_memcpy(fsdp_device *d, void *dst, const void *src, size_t bytes,
                               fsdp_stream_t s)
{
    (void)d;
    CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, (cudaStream_t)s));
    return FSDP_STATUS_OK;
}

static fsdp_status cuda_memset(fsdp_device *d, void *dst, int value, size_t bytes, fsdp_stream_t s)
{
    (void)d;
    CUDA_TRY(cudaMemsetAsync(dst, value, bytes, (cudaStream_t)s));
    return FSDP_STATUS_OK;
}

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
        cudaStreamDestroy((cudaStream_t)s);
}

static fsdp_status cuda_stream_sync(fsdp_device *d, fsdp_stream_t s)
{
    if (cuda_can_abort(d))
        return cuda_poll(d, [s] { return cudaStreamQuery((cudaStream_t)s); }, "stream sync");
    CUDA_TRY(cudaStreamSynchronize((cudaStream_t)s));
    return FSDP_STATUS_OK;
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
    cudaEventDestroy((cudaEvent_t)e);
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
    if (cuda_can_abort(d))
        return cuda_poll(d, [e] { return cudaEventQuery((cudaEvent_t)e); }, "event sync");
    CUDA_TRY(cudaEventSynchronize((cudaEvent_t)e));
    return FSDP_STATUS_OK;
}

static const struct fsdp_device_i cuda_device_i = {
    /* .name              = */ "cuda",
    /* .init              = */ cuda_init,
    /* .fini              = */ NULL,
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
};

extern "C" const struct fsdp_device_i *fsdp_device_cuda_iface(void) { return &cuda_device_i; }

extern "C" int fsdp_cuda_device_count(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n;
}
