/*
 * meta.c - the accounting-only device: allocations are counted and handed
 * fake, never-dereferenced addresses; copies, sets and ops do nothing. Lets
 * `fsdp plan` run the real step schedule for any model size in seconds.
 */
#include <stdint.h>

#include "device/device.h"

static fsdp_status meta_alloc(fsdp_device *d, size_t bytes, void **out)
{
    /* Fake addresses must not wrap around onto earlier ones. */
    if (bytes > SIZE_MAX - (FSDP_DEVICE_ALIGN - 1) ||
        (bytes + FSDP_DEVICE_ALIGN - 1) / FSDP_DEVICE_ALIGN * FSDP_DEVICE_ALIGN >
            UINTPTR_MAX - d->meta_next)
        return fsdp_error_set(FSDP_STATUS_OOM,
                              "meta device %d: %zu bytes do not fit in the address space left",
                              d->rank, bytes);
    size_t rounded = (bytes + FSDP_DEVICE_ALIGN - 1) / FSDP_DEVICE_ALIGN * FSDP_DEVICE_ALIGN;
    *out = (void *)d->meta_next;
    d->meta_next += rounded;
    return FSDP_STATUS_OK;
}

static void meta_free(fsdp_device *d, void *p)
{
    (void)d;
    (void)p;
}

const struct fsdp_device_i fsdp_device_meta_i = {
    .name = "meta",
    .alloc = meta_alloc,
    .free = meta_free,
    .host_alloc = meta_alloc,
    .host_free = meta_free,
    /* every other slot NULL: nothing is backed, so nothing moves, nothing
     * waits, and host work runs at once */
};
