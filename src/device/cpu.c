/*
 * cpu.c - simulated devices backed by host memory, each computing with a
 * team of threads (cpu.h).
 *
 * Real math, real bytes. In the default mode stream work runs inline on
 * the calling thread, so the stream and event slots are NULL; the async
 * mode (cpu_stream.c) gives each stream a worker thread. "Pinned" host
 * memory is ordinary aligned memory here. Device memory comes from the
 * block cache the cuda backend uses (cpu_dev.h): without it, every unit
 * gathered again mapped fresh pages (glibc gives blocks over 32 MiB back
 * to the kernel at once), and the Llama bench shape's LoRA step faulted
 * in its 197 MB root unit each time (48k page faults a step). Under
 * AddressSanitizer a free block is poisoned, so a use after free is still
 * reported although the memory stays mapped.
 *
 * The team: the rank thread plus n - 1 helpers, started on the first
 * parallel call (so devices that never compute start none). A job is
 * published under the team's mutex with a new generation number; chunks are
 * claimed with an atomic counter. A helper counts itself in n_active (under
 * the mutex) before claiming, so once every chunk is claimed and n_active is
 * 0, every chunk has finished: the rank thread waits for exactly that, then
 * retires the job. A helper that wakes after the job was retired finds it
 * gone and sleeps again: a late helper never delays the rank thread, which
 * matters when the ranks share fewer cores than they have threads. Jobs of
 * one team run one at a time (run_mu): in the async mode the compute and
 * comm streams' workers and the rank thread (host-side kernels of offload)
 * may each start one.
 */
#include <errno.h>
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
#include "device/cpu_dev.h"

#if defined(__SANITIZE_ADDRESS__)
#define CPU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define CPU_ASAN 1
#endif
#endif
#ifdef CPU_ASAN
#include <sanitizer/asan_interface.h>
#endif

struct cpu_team {
    pthread_mutex_t run_mu;   /* one job at a time: held by the thread that runs it */
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
};


typedef struct helper_arg {
    cpu_team *team;
    int worker;
} helper_arg;

static atomic_int g_threads_setting; /* 0: default */
static atomic_int g_test_cores;      /* test hook: > 0 pretends this many cores */
static _Thread_local bool in_task;   /* this thread is running a chunk */

void fsdp_device_cpu_set_threads(int n) { atomic_store(&g_threads_setting, n > 0 ? n : 0); }

int fsdp_device_cpu_get_threads(void) { return atomic_load(&g_threads_setting); }

static const fsdp_name cpu_streams_names[] = {
    {"inline", FSDP_CPU_STREAMS_INLINE,
     "run stream work at once on the calling thread (default; the faster)"},
    {"async", FSDP_CPU_STREAMS_ASYNC,
     "a worker thread per stream and events as fences, as on a GPU: a missing wait shows "
     "(FSDP_CPU_STREAM_JITTER=SEED adds random delays)"},
};
const fsdp_name_table fsdp_cpu_streams_names = FSDP_NAME_TABLE(cpu_streams_names);

static atomic_int g_streams_setting; /* FSDP_CPU_STREAMS_DEFAULT: the environment's */
static _Atomic uint64_t g_jitter_setting;

void fsdp_device_cpu_set_streams(fsdp_cpu_streams mode, uint64_t jitter_seed)
{
    atomic_store(&g_jitter_setting, jitter_seed);
    atomic_store(&g_streams_setting, mode > 0 && mode < FSDP_CPU_STREAMS_COUNT ? (int)mode : 0);
}

fsdp_status fsdp_device_cpu_get_streams(fsdp_cpu_streams *mode, uint64_t *jitter_seed)
{
    int set = atomic_load(&g_streams_setting);
    uint64_t seed = atomic_load(&g_jitter_setting);
    *mode = set ? (fsdp_cpu_streams)set : FSDP_CPU_STREAMS_INLINE;
    *jitter_seed = seed;
    const char *m = fsdp_env_get(FSDP_ENV_CPU_STREAMS);
    const fsdp_name *e = fsdp_names_find(&fsdp_cpu_streams_names, m);
    if (!set && !e)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "FSDP_CPU_STREAMS='%s' is not one of inline, async", m);
    if (!set)
        *mode = (fsdp_cpu_streams)e->value;
    if (seed)
        return FSDP_STATUS_OK;
    const char *j = fsdp_env_get(FSDP_ENV_CPU_STREAM_JITTER);
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(j, &end, 10);
    if (errno || end == j || *end || *j == '-')
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "FSDP_CPU_STREAM_JITTER='%s' is not a seed (a number >= 0; 0: no "
                              "delays)", j);
    *jitter_seed = v;
    return FSDP_STATUS_OK;
}

const struct fsdp_device_i *fsdp_device_cpu_iface(void)
{
    fsdp_cpu_streams mode;
    uint64_t seed;
    if (fsdp_device_cpu_get_streams(&mode, &seed) != FSDP_STATUS_OK) {
        FSDP_WARN(FSDP_SUB_CORE, "%s; running the cpu streams inline", fsdp_error_msg());
        fsdp_error_clear();
    }
    return mode == FSDP_CPU_STREAMS_ASYNC ? &fsdp_device_cpu_async_i : &fsdp_device_cpu_i;
}

bool fsdp_device_cpu_async(const fsdp_device *d)
{
    return d->backend == FSDP_BACKEND_CPU && d->ctx && ((const cpu_dev *)d->ctx)->async;
}

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
    pthread_mutex_destroy(&t->run_mu);
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
    pthread_mutex_init(&t->run_mu, NULL);
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
    if (c && c->n_threads > 1) {
        pthread_mutex_lock(&c->team_mu);
        if (!c->team && !c->team_failed) {
            c->team = team_start(d->rank, c->n_threads);
            c->team_failed = !c->team;
        }
        pthread_mutex_unlock(&c->team_mu);
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
    pthread_mutex_lock(&t->run_mu);
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
    pthread_mutex_unlock(&t->run_mu);
}

int fsdp_device_cpu_devices_on_host(const fsdp_world *w)
{
    int same = 0;
    for (int p = 0; p < w->n_processes; p++)
        same += !strcmp(w->hosts[p], w->hosts[w->process]);
    return w->n_local * (same > 0 ? same : 1);
}

/* ---- device memory: the block cache ------------------------------------------ */

fsdp_status fsdp_cpu_block_raw_alloc(void *ctx, size_t bytes, void **out)
{
    (void)ctx;
    if (fsdp_cpu_host_alloc(NULL, bytes, out) == FSDP_STATUS_OK)
        return FSDP_STATUS_OK;
    fsdp_error_clear(); /* the cache gives blocks back and retries, or says why */
    return FSDP_STATUS_OOM;
}

void fsdp_cpu_block_raw_free(void *ctx, void *p)
{
    (void)ctx;
    fsdp_cpu_host_free(NULL, p);
}

/* The inline mode's blocks need no fences: its work has run by the time
 * the host frees one (the async mode installs its streams'). */
static const fsdp_block_cache_i inline_cache_i = {
    .raw_alloc = fsdp_cpu_block_raw_alloc,
    .raw_free = fsdp_cpu_block_raw_free,
    .owner = "the host",
};

/* Under ASan, inline only: the bytes asked for addressable, the rest of the
 * block (and all of a free one) poisoned. Async work queued before a free
 * may still use the block, so the async mode poisons nothing. */
static void poison_block(fsdp_device *d, void *p, size_t usable)
{
#ifdef CPU_ASAN
    if (((cpu_dev *)d->ctx)->async)
        return;
    size_t bytes = fsdp_block_cache_block_bytes(fsdp_cpu_dev_cache(d), p);
    ASAN_UNPOISON_MEMORY_REGION(p, usable);
    ASAN_POISON_MEMORY_REGION((char *)p + usable, bytes - usable);
#else
    (void)d;
    (void)p;
    (void)usable;
#endif
}

fsdp_status fsdp_cpu_dev_alloc(fsdp_device *d, size_t bytes, void **out)
{
    FSDP_TRY(fsdp_block_cache_dev_alloc(fsdp_cpu_dev_cache(d), &d->mem.reserved_bytes, bytes,
                                        out));
    poison_block(d, *out, bytes);
    return FSDP_STATUS_OK;
}

void fsdp_cpu_dev_free(fsdp_device *d, void *p)
{
    poison_block(d, p, 0);
    fsdp_block_cache_dev_free(fsdp_cpu_dev_cache(d), &d->mem.reserved_bytes, p);
}

fsdp_status fsdp_cpu_dev_reserve(fsdp_device *d, size_t bytes, size_t n)
{
    return fsdp_block_cache_dev_reserve(fsdp_cpu_dev_cache(d), &d->mem.reserved_bytes, bytes,
                                        n);
}

/* ---- the device ----------------------------------------------------------------- */

fsdp_status fsdp_cpu_dev_init(fsdp_device *d)
{
    cpu_dev *c = calloc(1, sizeof *c);
    if (!c)
        return fsdp_error_set(FSDP_STATUS_OOM, "device %d: out of host memory", d->rank);
    int n_devices = d->world ? fsdp_device_cpu_devices_on_host(d->world) : 1;
    c->n_threads = fsdp_device_cpu_threads_for(fsdp_device_cpu_get_threads(), n_devices,
                                               fsdp_device_cpu_cores(), NULL);
    pthread_mutex_init(&c->team_mu, NULL);
    fsdp_block_cache_init(&c->cache, &inline_cache_i, c);
    d->ctx = c;
    return FSDP_STATUS_OK;
}

void fsdp_cpu_dev_fini(fsdp_device *d)
{
    cpu_dev *c = d->ctx;
    if (!c)
        return;
    team_free(c->team);
    pthread_mutex_destroy(&c->team_mu);
    fsdp_block_cache_fini(&c->cache);
    d->mem.reserved_bytes = 0;
    free(c);
    d->ctx = NULL;
}

fsdp_status fsdp_cpu_host_alloc(fsdp_device *d, size_t bytes, void **out)
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

void fsdp_cpu_host_free(fsdp_device *d, void *p)
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
    .name = "cpu",
    .init = fsdp_cpu_dev_init,
    .fini = fsdp_cpu_dev_fini,
    .alloc = fsdp_cpu_dev_alloc,
    .free = fsdp_cpu_dev_free,
    .host_alloc = fsdp_cpu_host_alloc,
    .host_free = fsdp_cpu_host_free,
    .memcpy = cpu_memcpy,
    .memset = cpu_memset,
    .reserve = fsdp_cpu_dev_reserve,
    /* stream, event and launch_host slots NULL: work runs inline, in
     * order, on the calling thread (the async mode is cpu_stream.c) */
};
