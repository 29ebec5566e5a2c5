/*
 * cpu.c - simulated devices backed by host memory, each computing with a
 * team of threads (cpu.h).
 *
 * Real math, real bytes; the only difference from a GPU is that stream work
 * runs inline on the rank's thread, so the stream and event slots are NULL.
 * "Pinned" host memory is ordinary aligned memory here.
 *
 * The team: the rank thread plus n - 1 helpers, started on the first
 * parallel call (so devices that never compute start none). A job is
 * published under the team's mutex with a new generation number; chunks are
 * claimed with an atomic counter. A helper counts itself in n_active (under
 * the mutex) before claiming, so once every chunk is claimed and n_active is
 * 0, every chunk has finished: the rank thread waits for exactly that, then
 * retires the job. A helper that wakes after the job was retired finds it
 * gone and sleeps again: a late helper never delays the rank thread, which
 * matters when the ranks share fewer cores than they have threads.
 */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/log.h"
#include "core/threads.h"
#include "core/world.h"
#include "device/cpu.h"

typedef struct cpu_team {
    pthread_mutex_t mu;
    pthread_cond_t work_cv;   /* a job was published, or stop */
    pthread_cond_t done_cv;   /* n_active dropped to 0 */
    pthread_t *helpers;       /* (n_helpers,) */
    int n_helpers;
    bool stop;
    /* the current job; valid while live */
    bool live;
    uint64_t gen;
    fsdp_device_cpu_task task;
    void *arg;
    size_t n_chunks;
    atomic_size_t next;       /* next chunk to claim */
    int n_active;             /* helpers inside the job */
} cpu_team;

typedef struct cpu_dev {
    int n_threads;
    cpu_team *team;           /* NULL until the first parallel call */
    bool team_failed;         /* helpers could not be started: run serially */
} cpu_dev;

typedef struct helper_arg {
    cpu_team *team;
    int worker;
} helper_arg;

static atomic_int g_threads_setting; /* 0: default */
static atomic_int g_test_cores;      /* test hook: > 0 pretends this many cores */
static _Thread_local bool in_task;   /* this thread is running a chunk */

void fsdp_device_cpu_set_threads(int n) { atomic_store(&g_threads_setting, n > 0 ? n : 0); }

int fsdp_device_cpu_get_threads(void) { return atomic_load(&g_threads_setting); }

void fsdp_device_cpu_test_cores(int n) { atomic_store(&g_test_cores, n > 0 ? n : 0); }

int fsdp_device_cpu_cores(void)
{
    if (atomic_load(&g_test_cores) > 0)
        return atomic_load(&g_test_cores);
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0)
        return CPU_COUNT(&set);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

int fsdp_device_cpu_threads_for(int requested, int n_devices, int n_cores, bool *capped)
{
    if (n_devices < 1)
        n_devices = 1;
    int fair = n_cores / n_devices > 1 ? n_cores / n_devices : 1;
    int n = requested > 0 ? requested : fair;
    if (capped)
        *capped = n > fair;
    return n > fair ? fair : n;
}

int fsdp_device_cpu_threads(const fsdp_device *d)
{
    const cpu_dev *c = d->backend == FSDP_BACKEND_CPU ? d->ctx : NULL;
    return c ? c->n_threads : 1;
}

/* Claim and run chunks of the current job until none is left. */
static void job_run(cpu_team *t, int worker)
{
    in_task = true;
    for (;;) {
        size_t c = atomic_fetch_add_explicit(&t->next, 1, memory_order_relaxed);
        if (c >= t->n_chunks)
            break;
        t->task(t->arg, c, worker);
    }
    in_task = false;
}

static void *helper_main(void *p)
{
    helper_arg a = *(helper_arg *)p;
    free(p);
    cpu_team *t = a.team;
    uint64_t seen = 0;
    pthread_mutex_lock(&t->mu);
    for (;;) {
        while (!t->stop && (!t->live || t->gen == seen))
            pthread_cond_wait(&t->work_cv, &t->mu);
        if (t->stop)
            break;
        seen = t->gen;
        t->n_active++;
        pthread_mutex_unlock(&t->mu);
        job_run(t, a.worker);
        pthread_mutex_lock(&t->mu);
        if (--t->n_active == 0)
            pthread_cond_signal(&t->done_cv);
    }
    pthread_mutex_unlock(&t->mu);
    return NULL;
}

static void team_free(cpu_team *t)
{
    if (!t)
        return;
    fsdp_threads_stop(&t->mu, &t->work_cv, &t->stop, t->helpers, t->n_helpers);
    pthread_cond_destroy(&t->work_cv);
    pthread_cond_destroy(&t->done_cv);
    pthread_mutex_destroy(&t->mu);
    free(t->helpers);
    free(t);
}

/* A team of n threads (n - 1 helpers), or NULL with a warning. */
static cpu_team *team_start(int rank, int n)
{
    cpu_team *t = calloc(1, sizeof *t);
    if (!t || !(t->helpers = calloc((size_t)n, sizeof *t->helpers))) {
        free(t);
        FSDP_WARN(FSDP_SUB_OPS, "device %d: out of host memory for its thread team; computing "
                                "on 1 thread", rank);
        return NULL;
    }
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->work_cv, NULL);
    pthread_cond_init(&t->done_cv, NULL);
    for (int i = 1; i < n; i++) {
        helper_arg *a = malloc(sizeof *a);
        int rc = a ? 0 : -1;
        if (a) {
            *a = (helper_arg){.team = t, .worker = i};
            rc = pthread_create(&t->helpers[t->n_helpers], NULL, helper_main, a);
        }
        if (rc != 0) {
            free(a);
            FSDP_WARN(FSDP_SUB_OPS, "device %d: could not start helper thread %d of %d (%s); "
                                    "computing on 1 thread", rank, i, n - 1,
                      rc > 0 ? strerror(rc) : "out of memory");
            team_free(t);
            return NULL;
        }
        char name[16];
        snprintf(name, sizeof name, "fsdp-d%d-t%d", rank, i);
        pthread_setname_np(t->helpers[t->n_helpers], name); /* for top -H; failure is harmless */
        t->n_helpers++;
    }
    return t;
}

void fsdp_device_cpu_parallel(fsdp_device *d, size_t n_chunks, fsdp_device_cpu_task task,
                              void *arg)
{
    cpu_dev *c = d->backend == FSDP_BACKEND_CPU ? d->ctx : NULL;
    if (n_chunks == 0)
        return;
    if (c && c->n_threads > 1 && !c->team && !c->team_failed) {
        c->team = team_start(d->rank, c->n_threads);
        c->team_failed = !c->team;
    }
    if (!c || !c->team || in_task || n_chunks == 1) {
        bool outer = !in_task;
        in_task = true;
        for (size_t k = 0; k < n_chunks; k++)
            task(arg, k, 0);
        in_task = !outer;
        return;
    }
    cpu_team *t = c->team;
    pthread_mutex_lock(&t->mu);
    t->task = task;
    t->arg = arg;
    t->n_chunks = n_chunks;
    atomic_store_explicit(&t->next, 0, memory_order_relaxed);
    t->gen++;
    t->live = true;
    pthread_cond_broadcast(&t->work_cv);
    pthread_mutex_unlock(&t->mu);

    job_run(t, 0);

    pthread_mutex_lock(&t->mu);
    while (t->n_active > 0)
        pthread_cond_wait(&t->done_cv, &t->mu);
    t->live = false; /* helpers that wake from now on skip this job */
    pthread_mutex_unlock(&t->mu);
}

int fsdp_device_cpu_devices_on_host(const fsdp_world *w)
{
    int same = 0;
    for (int p = 0; p < w->n_processes; p++)
        same += !strcmp(w->hosts[p], w->hosts[w->process]);
    return w->n_local * (same > 0 ? same : 1);
}

static fsdp_status cpu_init(fsdp_device *d)
{
    cpu_dev *c = calloc(1, sizeof *c);
    if (!c)
        return fsdp_error_set(FSDP_STATUS_OOM, "device %d: out of host memory", d->rank);
    int n_devices = d->world ? fsdp_device_cpu_devices_on_host(d->world) : 1;
    c->n_threads = fsdp_device_cpu_threads_for(fsdp_device_cpu_get_threads(), n_devices,
                                               fsdp_device_cpu_cores(), NULL);
    d->ctx = c;
    return FSDP_STATUS_OK;
}

static void cpu_fini(fsdp_device *d)
{
    cpu_dev *c = d->ctx;
    if (!c)
        return;
    team_free(c->team);
    free(c);
    d->ctx = NULL;
}

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
    /* .init              = */ cpu_init,
    /* .fini              = */ cpu_fini,
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
