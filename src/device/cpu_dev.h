/*
 * cpu_dev.h - the cpu device's private state, shared by its two modes:
 * cpu.c (the thread team, the inline mode's table) and cpu_stream.c (the
 * async mode: stream workers, events, the block cache). Not for use
 * outside src/device.
 */
#ifndef FSDP_DEVICE_CPU_DEV_H
#define FSDP_DEVICE_CPU_DEV_H

#include <pthread.h>
#include <stdbool.h>

#include "device/device.h"

typedef struct cpu_team cpu_team;
struct cpu_async;

typedef struct cpu_dev {
    int n_threads;
    pthread_mutex_t team_mu;  /* starting the team (several threads may ask in async mode) */
    cpu_team *team;           /* NULL until the first parallel call */
    bool team_failed;         /* helpers could not be started: run serially */
    struct cpu_async *async;  /* the async mode's state; NULL inline */
} cpu_dev;

/* The parts both modes' tables share (cpu.c): the device state and its
 * team, and aligned host memory (device memory of the inline mode, pinned
 * memory of both). */
fsdp_status fsdp_cpu_dev_init(fsdp_device *d);
void fsdp_cpu_dev_fini(fsdp_device *d);
fsdp_status fsdp_cpu_host_alloc(fsdp_device *d, size_t bytes, void **out);
void fsdp_cpu_host_free(fsdp_device *d, void *p);

#endif /* FSDP_DEVICE_CPU_DEV_H */
