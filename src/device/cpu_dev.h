/*
 * cpu_dev.h - the cpu device's private state, shared by its two modes:
 * cpu.c (the thread team, the inline mode's table) and cpu_stream.c (the
 * async mode: stream workers, events, its fences). Not for use outside
 * src/device.
 */
#ifndef FSDP_DEVICE_CPU_DEV_H
#define FSDP_DEVICE_CPU_DEV_H

#include <pthread.h>
#include <stdbool.h>

#include "device/block_cache.h"
#include "device/device.h"

typedef struct cpu_team cpu_team;
struct cpu_async;

typedef struct cpu_dev {
    int n_threads;
    pthread_mutex_t team_mu;  /* starting the team (several threads may ask in async mode) */
    cpu_team *team;           /* NULL until the first parallel call */
    bool team_failed;         /* helpers could not be started: run serially */
    struct cpu_async *async;  /* the async mode's state; NULL inline */
    /* Device memory in both modes, as on cuda (device/block_cache.h):
     * blocks of aligned host memory kept for reuse, so that a step that
     * repeats the last one's allocations maps no new pages. The inline
     * mode's fences are none (its work is done when the call returns, so a
     * freed block is free at once); the async mode installs its streams'. */
    fsdp_block_cache cache;
} cpu_dev;

/* The parts both modes' tables share (cpu.c): the device state, its team
 * and its block cache (with the inline mode's fences), and aligned host
 * memory (pinned memory of both modes, and the cache's blocks through the
 * raw calls, which take any ctx). */
fsdp_status fsdp_cpu_dev_init(fsdp_device *d);
void fsdp_cpu_dev_fini(fsdp_device *d);
fsdp_status fsdp_cpu_host_alloc(fsdp_device *d, size_t bytes, void **out);
void fsdp_cpu_host_free(fsdp_device *d, void *p);
fsdp_status fsdp_cpu_block_raw_alloc(void *ctx, size_t bytes, void **out);
void fsdp_cpu_block_raw_free(void *ctx, void *p);
/* Device memory of both modes' tables: the cache's counted calls
 * (poisoned under ASan in the inline mode). */
fsdp_status fsdp_cpu_dev_alloc(fsdp_device *d, size_t bytes, void **out);
void fsdp_cpu_dev_free(fsdp_device *d, void *p);
fsdp_status fsdp_cpu_dev_reserve(fsdp_device *d, size_t bytes, size_t n);

static inline fsdp_block_cache *fsdp_cpu_dev_cache(fsdp_device *d)
{
    return &((cpu_dev *)d->ctx)->cache;
}

#endif /* FSDP_DEVICE_CPU_DEV_H */
