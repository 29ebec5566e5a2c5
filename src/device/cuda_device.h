/*
 * cuda_device.h - what the cuda device (device/cuda.cu) offers the other
 * CUDA files beyond the device table: memory for the backend's own
 * buffers, and a wait that gives up when the world is aborted. Plain C
 * types, so C tests can include it; a build without CUDA has stubs
 * (device/cuda_stub.c).
 */
#ifndef FSDP_DEVICE_CUDA_DEVICE_H
#define FSDP_DEVICE_CUDA_DEVICE_H

#include "device/block_cache.h"
#include "device/device.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The backend's own device buffers (cuBLAS workspace, op scratch, peer
 * staging): from the device's block cache like every allocation, but not
 * counted in d->mem.in_use_bytes (cpu and meta have no such buffers, so the
 * planner's peaks stay exact); they show in d->mem.reserved_bytes. Stream
 * ordered: the free may come while queued work on the device's streams
 * still uses the buffer. what: a phrase for the error message. */
fsdp_status fsdp_cuda_device_alloc_own(fsdp_device *d, size_t bytes, const char *what,
                                       void **out);
void fsdp_cuda_device_free_own(fsdp_device *d, void *p);

/* The device's block cache (statistics for tests and reports); NULL for
 * a device that is not cuda, or without CUDA. */
const fsdp_block_cache *fsdp_cuda_device_cache(const fsdp_device *d);

#ifdef __cplusplus
}
#endif

#endif /* FSDP_DEVICE_CUDA_DEVICE_H */
