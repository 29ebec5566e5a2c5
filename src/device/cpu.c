/*
 * cpu.c - simulated devices backed by host memory.
 *
 * Real math, real bytes; the only difference from a GPU is that stream work
 * runs inline on the rank's thread, so the stream and event slots are NULL.
 * "Pinned" host memory is ordinary aligned memory here.
 */
#include <stdint.h>
#include <string.h>

#include "device/device.h"

static fsdp_status cpu_alloc(fsdp_device *d, size_t bytes, void **out)
{
    (void)d;
    if (bytes > SIZE_MAX - (FSDP_DEVICE_ALIGN - 1)) /* rounding up would wrap around */
        return fsdp_error_set(FSDP_STATUS_OOM, "host allocation of %zu bytes is impossible",
                              bytes);
    size_t rounded = (bytes + FSDP_DEVICE_ALIGN - 1) / FSDP_DEVICE_ALIGN * FSDP_DEVICE_ALIGN;
    void *p = aligned_alloc(FSDP_DEVICE_ALIGN, rounded);
    if (!p)
        return fsdp_error_set(FSDP_STATUS_OOM, "host allocation of %zu bytes failed", bytes);
    *out = p;
    return FSDP_STATUS_OK;
}

static void cpu_free(fsdp_device *d, void *p)
{
    (void)d;
    free(p);
}

static fsdp_status cpu_memcpy(fsdp_device *d, void *dst, const void *src, size_t bytes,
                              fsdp_stream_t s)
{
    (void)d;
    (void)s;
    memmove(dst, src, bytes);
    return FSDP_STATUS_OK;
}

static fsdp_status cpu_memset(fsdp_device *d, void *dst, int value, size_t bytes, fsdp_stream_t s)
{
    (void)d;
    (void)s;
    memset(dst, value, bytes);
    return FSDP_STATUS_OK;
}

const struct fsdp_device_i fsdp_device_cpu_i = {
    /* .name              = */ "cpu",
    /* .init              = */ NULL,
    /* .fini              = */ NULL,
    /* .alloc             = */ cpu_alloc,
    /* .free              = */ cpu_free,
    /* .host_alloc        = */ cpu_alloc,
    /* .host_free         = */ cpu_free,
    /* .memcpy            = */ cpu_memcpy,
    /* .memset            = */ cpu_memset,
    /* .stream_create     = */ NULL, /* optional: work runs inline */
    /* .stream_destroy    = */ NULL,
    /* .stream_sync       = */ NULL,
    /* .event_create      = */ NULL,
    /* .event_destroy     = */ NULL,
    /* .event_record      = */ NULL,
    /* .stream_wait_event = */ NULL,
    /* .event_sync        = */ NULL,
    /* .reserve           = */ NULL, /* optional: nothing to prepare */
};
