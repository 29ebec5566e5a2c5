/*
 * cpu.h - the threads of a simulated cpu device.
 *
 * Each cpu device (rank) computes with a team of threads: its rank thread
 * plus helpers, started on the first parallel call and joined by
 * fsdp_device_fini. The count is a process setting read when a device is
 * created: --threads-per-device N, or by default the online cores divided
 * by the ranks of the device's world (at least 1). It is capped so that
 * devices x threads never exceeds the cores (no oversubscription); with
 * more devices than cores each device gets one thread and the ranks share
 * the cores.
 *
 * Work is split into chunks fixed by the caller; the team only decides which
 * thread runs which chunk. So as long as a chunk's result does not depend on
 * the thread that runs it, results are bit-identical for any thread count.
 */
#ifndef FSDP_DEVICE_CPU_H
#define FSDP_DEVICE_CPU_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "device/device.h"

/* How a cpu device runs the work queued on its streams (--cpu-streams):
 * inline (at once, on the calling thread: the default, and the faster), or
 * async (device/cpu_stream.c: a worker thread per stream, events as real
 * fences, host calls that return as soon as the work is queued, as on a
 * GPU), optionally with seeded random delays before each queued item.
 * Results are bit-identical in both modes. */
typedef enum fsdp_cpu_streams {
    FSDP_CPU_STREAMS_DEFAULT = 0, /* the environment's (below): a zeroed config means it */
    FSDP_CPU_STREAMS_INLINE,
    FSDP_CPU_STREAMS_ASYNC,
    FSDP_CPU_STREAMS_COUNT
} fsdp_cpu_streams;

/* The --cpu-streams values: inline, async. */
extern const fsdp_name_table fsdp_cpu_streams_names;

/* The mode and jitter seed (0: no delays) of cpu devices created from now
 * on; FSDP_CPU_STREAMS_DEFAULT goes back to the environment's:
 * FSDP_CPU_STREAMS=inline|async and FSDP_CPU_STREAM_JITTER=SEED (unset:
 * inline; a seed given here wins over the variable's). Call while no
 * device is being created. */
void fsdp_device_cpu_set_streams(fsdp_cpu_streams mode, uint64_t jitter_seed);
/* The mode a device created now gets (never DEFAULT), and its jitter
 * seed. INVALID_ARG with a message naming the variable when the
 * environment holds a value that is not a mode or a seed (the mode is then
 * inline, without delays). */
fsdp_status fsdp_device_cpu_get_streams(fsdp_cpu_streams *mode, uint64_t *jitter_seed);
/* Whether d is a cpu device in the async mode. */
bool fsdp_device_cpu_async(const fsdp_device *d);
/* The async mode's device table (cpu_stream.c); fsdp_device_init picks it
 * for cpu devices when fsdp_device_cpu_get_streams says async. */
extern const struct fsdp_device_i fsdp_device_cpu_async_i;

/* Threads per cpu device for devices created from now on: n >= 1, or 0 for
 * the default. Call while no device is being created (before the ranks
 * start). */
void fsdp_device_cpu_set_threads(int n);
int fsdp_device_cpu_get_threads(void);

/* Online cores available to this process (its CPU affinity mask). */
int fsdp_device_cpu_cores(void);

/* Test hook: make fsdp_device_cpu_cores() report n (0: the real count), so
 * that tests can run 3 threads per device on a 2-core machine. */
void fsdp_device_cpu_test_cores(int n);

/* Threads each of n_devices cpu devices gets when `requested` (0: the
 * default) are asked for on n_cores cores: requested or n_cores / n_devices,
 * lowered to max(1, n_cores / n_devices) if devices x threads would exceed
 * the cores (*capped then says a request was lowered; may be NULL). */
int fsdp_device_cpu_threads_for(int requested, int n_devices, int n_cores, bool *capped);

/* The cpu devices of world w that share this machine's cores, the count the
 * default divides them by: this process's ranks times the job's processes on
 * the same host (mpirun -np P on one machine), so that P processes do not
 * each take every core. */
int fsdp_device_cpu_devices_on_host(const fsdp_world *w);

/* The thread count of device d (1 for devices of other backends). */
int fsdp_device_cpu_threads(const fsdp_device *d);

/* A unit of parallel work: chunk `chunk` of a job, run by team member
 * `worker` (0 = the calling thread, < fsdp_device_cpu_threads(d)). */
typedef void (*fsdp_device_cpu_task)(void *arg, size_t chunk, int worker);

/* Run task(arg, c, w) once for every chunk c in [0, n_chunks) on d's team,
 * the calling thread (d's rank thread) included; returns when every chunk
 * is done, and their writes are visible to the caller. Which worker runs
 * which chunk varies from call to call. A call from inside a task, or on a
 * device of another backend or with one thread, runs the chunks in order on
 * the calling thread; so does any call if the helper threads could not be
 * started (logged once as a warning). */
void fsdp_device_cpu_parallel(fsdp_device *d, size_t n_chunks, fsdp_device_cpu_task task,
                              void *arg);

#endif /* FSDP_DEVICE_CPU_H */
