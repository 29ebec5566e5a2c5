/*
 * cpu_stream.c - the cpu backend's async mode (--cpu-streams async): each
 * of a device's streams is a worker thread that runs its queued work in
 * order, events are fences, and host calls return as soon as the work is
 * queued, as with CUDA. Code that forgets an event wait between two
 * streams then reads a buffer before another stream has written it, and a
 * test on a machine without a GPU fails (or ThreadSanitizer reports the
 * race) instead of a GPU run going subtly wrong.
 *
 * What runs where:
 *   - a stream is a FIFO of items (host functions with a copy of their
 *     argument, or waits) and one worker thread; `submitted` counts items
 *     queued by the host, `completed` items run, both under the stream's
 *     mutex, so completion publishes the item's writes to every waiter;
 *   - an event records (stream, submitted) at record time; a stream waits
 *     for it by queueing a wait item, the host by waiting for completed to
 *     reach it (CUDA semantics: a wait sees the event's latest record);
 *   - ops (ops/cpu/async.c), host collectives (comm/comm.c) and trace
 *     stamps reach a stream through the device's launch_host slot;
 *   - memcpy and memset are queued items, except that pageable host memory
 *     (anything neither pinned by host_alloc nor a block of this device)
 *     behaves as with CUDA: a copy from it reads the source before the call
 *     returns, a copy into it has finished when the call returns;
 *   - device memory comes from the block cache that the cuda backend uses
 *     (device/block_cache.h), with fences made of the three streams'
 *     positions: a freed block is reused only in stream order after its
 *     last users, exactly as on a GPU.
 *
 * Failures: the first failing item's status and message stay with the
 * device (as CUDA's sticky errors do); every later item is skipped (waits
 * still complete, so nothing hangs), and every sync returns the failure.
 *
 * Jitter: with a seed, each item waits a random while before it runs (75%
 * none, 20% 1-30 us, 5% 50 us-1 ms), so that a missing wait turns into a
 * wrong result or a race report instead of luck. The delays come from a
 * per-stream generator seeded by (seed, rank, stream); they move only the
 * timing, never the results.
 */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/log.h"
#include "device/block_cache.h"
#include "device/cpu.h"
#include "device/cpu_dev.h"

enum { STREAM_COMPUTE = 0, STREAM_COMM, STREAM_COPY, N_STREAMS };
static const char *const stream_names[N_STREAMS] = {"compute", "comm", "copy"};

typedef struct item {
    struct item *next;
    fsdp_host_fn fn;             /* NULL: a wait for (wait_s, wait_seq) */
    struct fsdp_stream *wait_s;
    uint64_t wait_seq;
    char label[64];
    _Alignas(max_align_t) unsigned char arg[];
} item;

struct fsdp_stream {
    struct cpu_async *as;
    int id;                      /* STREAM_* */
    pthread_t thread;
    bool started;
    pthread_mutex_t mu;
    pthread_cond_t work_cv;      /* an item was queued, or stop */
    pthread_cond_t done_cv;      /* completed went up */
    item *head, *tail;
    uint64_t submitted, completed;
    bool stop;
    uint64_t rng;                /* jitter generator; 0: no delays */
};

struct fsdp_event {
    struct fsdp_stream *s;       /* NULL: never recorded (complete) */
    uint64_t seq;
};

/* A block's fence: how many items each stream had been given. */
struct cpu_fence {
    uint64_t seq[N_STREAMS];
};

typedef struct cpu_async {
    fsdp_device *d;
    struct fsdp_stream *streams[N_STREAMS]; /* in creation order: compute, comm, copy */
    int n_streams;
    uint64_t jitter_seed;
    pthread_mutex_t err_mu;
    atomic_bool failed;          /* err is set: skip queued work */
    fsdp_status err;
    char err_msg[FSDP_ERROR_MSG_MAX];
    struct pinned { char *p; size_t bytes; } *pinned; /* host_alloc'd ranges; rank thread only */
    size_t n_pinned, cap_pinned;
} cpu_async;

static cpu_async *async_of(const fsdp_device *d) { return ((const cpu_dev *)d->ctx)->async; }

/* ---- jitter ----------------------------------------------------------------- */

static uint64_t mix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Before an item: 75% no delay, 20% 1-30 us (yielding the core: a sleep
 * that short would last the timer slack, ~50 us), 5% 50 us-1 ms (asleep). */
static void jitter(struct fsdp_stream *s)
{
    if (!s->rng)
        return;
    s->rng ^= s->rng << 13;
    s->rng ^= s->rng >> 7;
    s->rng ^= s->rng << 17;
    uint64_t r = s->rng % 100, v = s->rng >> 20;
    if (r < 75)
        return;
    if (r < 95) {
        uint64_t until = now_ns() + 1000 + v % 29000;
        while (now_ns() < until)
            sched_yield();
        return;
    }
    struct timespec ts = {0, (long)(50000 + v % 950000)};
    nanosleep(&ts, NULL);
}

/* ---- failures ----------------------------------------------------------------- */

/* Keep the first failure of queued work: st with the calling thread's
 * message, prefixed by where it ran. */
static void note_failure(cpu_async *as, const struct fsdp_stream *s, const char *label,
                         fsdp_status st)
{
    const char *msg = NULL;
    if (fsdp_error_first(&msg) == FSDP_STATUS_OK || !msg)
        msg = fsdp_error_msg();
    pthread_mutex_lock(&as->err_mu);
    if (as->err == FSDP_STATUS_OK) {
        as->err = st;
        snprintf(as->err_msg, sizeof as->err_msg, "%s: %s (on rank %d's %s stream)", label,
                 msg && *msg ? msg : fsdp_status_name(st), as->d->rank, stream_names[s->id]);
        atomic_store(&as->failed, true);
    }
    pthread_mutex_unlock(&as->err_mu);
    fsdp_error_clear();
}

/* OK, or the device's failure with its message on the calling thread. */
static fsdp_status device_status(cpu_async *as)
{
    if (!atomic_load(&as->failed))
        return FSDP_STATUS_OK;
    pthread_mutex_lock(&as->err_mu);
    fsdp_status st = as->err;
    char msg[FSDP_ERROR_MSG_MAX];
    snprintf(msg, sizeof msg, "%s", as->err_msg);
    pthread_mutex_unlock(&as->err_mu);
    return fsdp_error_set(st, "%s", msg);
}

/* ---- the worker ---------------------------------------------------------------- */

/* Wait until s has run `seq` items. */
static void wait_for(struct fsdp_stream *s, uint64_t seq)
{
    pthread_mutex_lock(&s->mu);
    while (s->completed < seq)
        pthread_cond_wait(&s->done_cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
}

static void *worker_main(void *p)
{
    struct fsdp_stream *s = p;
    cpu_async *as = s->as;
    fsdp_log_set_rank(as->d->rank);
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!s->head && !s->stop)
            pthread_cond_wait(&s->work_cv, &s->mu);
        if (!s->head)
            break; /* stop, and nothing left */
        item *it = s->head;
        s->head = it->next;
        if (!s->head)
            s->tail = NULL;
        pthread_mutex_unlock(&s->mu);

        jitter(s);
        if (!it->fn) {
            wait_for(it->wait_s, it->wait_seq);
        } else if (!atomic_load(&as->failed)) {
            fsdp_status st = it->fn(it->arg);
            if (st != FSDP_STATUS_OK)
                note_failure(as, s, it->label, st);
        }
        free(it);

        pthread_mutex_lock(&s->mu);
        s->completed++;
        pthread_cond_broadcast(&s->done_cv);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

static fsdp_status enqueue(struct fsdp_stream *s, item *it)
{
    it->next = NULL;
    pthread_mutex_lock(&s->mu);
    if (s->tail)
        s->tail->next = it;
    else
        s->head = it;
    s->tail = it;
    s->submitted++;
    pthread_cond_signal(&s->work_cv);
    pthread_mutex_unlock(&s->mu);
    return FSDP_STATUS_OK;
}

static item *item_new(size_t arg_bytes, const char *label)
{
    item *it = malloc(sizeof *it + arg_bytes);
    if (!it) {
        fsdp_error_set(FSDP_STATUS_OOM, "out of host memory queueing '%s' on a cpu stream",
                       label ? label : "work");
        return NULL;
    }
    memset(it, 0, sizeof *it);
    snprintf(it->label, sizeof it->label, "%s", label ? label : "work");
    return it;
}

/* Queue fn with a copy of arg on s. */
static fsdp_status launch(struct fsdp_stream *s, fsdp_host_fn fn, const void *arg,
                          size_t arg_bytes, const char *label)
{
    item *it = item_new(arg_bytes, label);
    if (!it)
        return FSDP_STATUS_OOM;
    it->fn = fn;
    if (arg_bytes)
        memcpy(it->arg, arg, arg_bytes);
    return enqueue(s, it);
}

/* Queue on s a wait until `other` has run seq items. */
static fsdp_status launch_wait(struct fsdp_stream *s, struct fsdp_stream *other, uint64_t seq)
{
    if (other == s || !other)
        return FSDP_STATUS_OK; /* a stream is in order with itself */
    item *it = item_new(0, "event wait");
    if (!it)
        return FSDP_STATUS_OOM;
    it->wait_s = other;
    it->wait_seq = seq;
    return enqueue(s, it);
}

static uint64_t submitted(struct fsdp_stream *s)
{
    pthread_mutex_lock(&s->mu);
    uint64_t n = s->submitted;
    pthread_mutex_unlock(&s->mu);
    return n;
}

/* ---- streams and events ----------------------------------------------------------- */

static fsdp_status as_stream_create(fsdp_device *d, fsdp_stream_t *out)
{
    cpu_async *as = async_of(d);
    if (as->n_streams >= N_STREAMS)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "device %d: a cpu device has %d streams (compute, comm, copy)",
                              d->rank, N_STREAMS);
    struct fsdp_stream *s = calloc(1, sizeof *s);
    if (!s)
        return fsdp_error_set(FSDP_STATUS_OOM, "device %d: out of host memory for a stream",
                              d->rank);
    s->as = as;
    s->id = as->n_streams;
    if (as->jitter_seed)
        s->rng = mix64(as->jitter_seed ^ mix64(((uint64_t)d->rank << 8) | (uint64_t)s->id)) | 1;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->work_cv, NULL);
    pthread_cond_init(&s->done_cv, NULL);
    int rc = pthread_create(&s->thread, NULL, worker_main, s);
    if (rc != 0) {
        pthread_cond_destroy(&s->work_cv);
        pthread_cond_destroy(&s->done_cv);
        pthread_mutex_destroy(&s->mu);
        free(s);
        return fsdp_error_set(FSDP_STATUS_INTERNAL,
                              "device %d: cannot start the %s stream's thread: %s", d->rank,
                              stream_names[as->n_streams], strerror(rc));
    }
    char name[16];
    snprintf(name, sizeof name, "fsdp-d%d-%.4s", d->rank, stream_names[s->id]);
    pthread_setname_np(s->thread, name); /* for top -H; failure is harmless */
    s->started = true;
    as->streams[as->n_streams++] = s;
    *out = s;
    return FSDP_STATUS_OK;
}

/* Run what is queued on every stream of the device (s's work may wait for
 * another stream, and another's for s), then stop and free s. */
static void as_stream_destroy(fsdp_device *d, fsdp_stream_t s)
{
    if (!s)
        return;
    cpu_async *as = async_of(d);
    for (int i = 0; i < as->n_streams; i++)
        if (as->streams[i])
            wait_for(as->streams[i], submitted(as->streams[i]));
    pthread_mutex_lock(&s->mu);
    s->stop = true;
    pthread_cond_signal(&s->work_cv);
    pthread_mutex_unlock(&s->mu);
    if (s->started)
        pthread_join(s->thread, NULL);
    for (int i = 0; i < as->n_streams; i++)
        if (as->streams[i] == s)
            as->streams[i] = NULL;
    pthread_cond_destroy(&s->work_cv);
    pthread_cond_destroy(&s->done_cv);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

static fsdp_status as_stream_sync(fsdp_device *d, fsdp_stream_t s)
{
    wait_for(s, submitted(s));
    return device_status(async_of(d));
}

static fsdp_status as_event_create(fsdp_device *d, fsdp_event_t *out)
{
    struct fsdp_event *e = calloc(1, sizeof *e);
    if (!e)
        return fsdp_error_set(FSDP_STATUS_OOM, "device %d: out of host memory for an event",
                              d->rank);
    *out = e;
    return FSDP_STATUS_OK;
}

static void as_event_destroy(fsdp_device *d, fsdp_event_t e)
{
    (void)d;
    free(e);
}

static fsdp_status as_event_record(fsdp_device *d, fsdp_event_t e, fsdp_stream_t s)
{
    (void)d;
    e->s = s;
    e->seq = submitted(s);
    return FSDP_STATUS_OK;
}

static fsdp_status as_stream_wait_event(fsdp_device *d, fsdp_stream_t s, fsdp_event_t e)
{
    (void)d;
    return launch_wait(s, e->s, e->seq);
}

static fsdp_status as_event_sync(fsdp_device *d, fsdp_event_t e)
{
    if (e->s)
        wait_for(e->s, e->seq);
    return device_status(async_of(d));
}

static fsdp_status as_launch_host(fsdp_device *d, fsdp_stream_t s, fsdp_host_fn fn,
                                  const void *arg, size_t arg_bytes, const char *label)
{
    (void)d;
    return launch(s, fn, arg, arg_bytes, label);
}

/* ---- memory: device blocks from the block cache, pinned host ranges ------------- */

static fsdp_status cache_fence_record(void *ctx, void **fence)
{
    cpu_async *as = ctx;
    struct cpu_fence *f = *fence;
    if (!f) {
        f = calloc(1, sizeof *f);
        if (!f)
            return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory for a block fence");
        *fence = f;
    }
    for (int i = 0; i < N_STREAMS; i++)
        f->seq[i] = as->streams[i] ? submitted(as->streams[i]) : 0;
    return FSDP_STATUS_OK;
}

static fsdp_status cache_fence_query(void *ctx, void *fence, bool *done)
{
    cpu_async *as = ctx;
    const struct cpu_fence *f = fence;
    *done = true;
    for (int i = 0; i < N_STREAMS && *done; i++) {
        struct fsdp_stream *s = as->streams[i];
        if (!s)
            continue;
        pthread_mutex_lock(&s->mu);
        *done = s->completed >= f->seq[i];
        pthread_mutex_unlock(&s->mu);
    }
    return FSDP_STATUS_OK;
}

static fsdp_status cache_fence_order(void *ctx, void *fence)
{
    cpu_async *as = ctx;
    const struct cpu_fence *f = fence;
    for (int i = 0; i < N_STREAMS; i++)
        for (int k = 0; k < N_STREAMS; k++)
            if (as->streams[i])
                FSDP_TRY(launch_wait(as->streams[i], as->streams[k], f->seq[k]));
    return FSDP_STATUS_OK;
}

static fsdp_status cache_fence_wait(void *ctx, void *fence)
{
    cpu_async *as = ctx;
    const struct cpu_fence *f = fence;
    for (int i = 0; i < N_STREAMS; i++)
        if (as->streams[i])
            wait_for(as->streams[i], f->seq[i]);
    return FSDP_STATUS_OK;
}

static void cache_fence_destroy(void *ctx, void *fence)
{
    (void)ctx;
    free(fence);
}

static const fsdp_block_cache_i cpu_cache_i = {
    .raw_alloc = fsdp_cpu_block_raw_alloc,
    .raw_free = fsdp_cpu_block_raw_free,
    .fence_record = cache_fence_record,
    .fence_query = cache_fence_query,
    .fence_order = cache_fence_order,
    .fence_wait = cache_fence_wait,
    .fence_destroy = cache_fence_destroy,
    .owner = "the host",
};

static fsdp_status as_host_alloc(fsdp_device *d, size_t bytes, void **out)
{
    cpu_async *as = async_of(d);
    if (as->n_pinned == as->cap_pinned) {
        size_t ncap = as->cap_pinned ? 2 * as->cap_pinned : 16;
        struct pinned *np = realloc(as->pinned, ncap * sizeof *np);
        if (!np)
            return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory for the pinned list");
        as->pinned = np;
        as->cap_pinned = ncap;
    }
    FSDP_TRY(fsdp_cpu_host_alloc(d, bytes, out));
    as->pinned[as->n_pinned++] = (struct pinned){*out, bytes};
    return FSDP_STATUS_OK;
}

/* As cudaFreeHost: waits for the device's streams first. */
static void as_host_free(fsdp_device *d, void *p)
{
    cpu_async *as = async_of(d);
    for (int i = 0; i < N_STREAMS; i++)
        if (as->streams[i])
            wait_for(as->streams[i], submitted(as->streams[i]));
    for (size_t i = 0; i < as->n_pinned; i++)
        if (as->pinned[i].p == p) {
            as->pinned[i] = as->pinned[--as->n_pinned];
            break;
        }
    fsdp_cpu_host_free(d, p);
}

/* Whether p lies in pinned host memory or in a block of this device. */
static bool device_visible(cpu_async *as, const void *p)
{
    const char *c = p;
    for (size_t i = 0; i < as->n_pinned; i++)
        if (c >= as->pinned[i].p && c < as->pinned[i].p + as->pinned[i].bytes)
            return true;
    const fsdp_block_cache *cache = fsdp_cpu_dev_cache(as->d);
    for (size_t i = 0; i < cache->n_blocks; i++) {
        const struct fsdp_block *b = &cache->blocks[i];
        if (b->state == FSDP_BLOCK_LIVE && c >= (const char *)b->ptr &&
            c < (const char *)b->ptr + b->bytes)
            return true;
    }
    return false;
}

/* ---- copies ----------------------------------------------------------------------- */

struct copy_args {
    void *dst;
    const void *src;
    size_t bytes;
    void *owned;  /* staging to free after the copy, or NULL */
    int value;    /* memset: the byte */
};

static fsdp_status run_copy(void *p)
{
    struct copy_args *a = p;
    memmove(a->dst, a->src, a->bytes);
    free(a->owned);
    return FSDP_STATUS_OK;
}

static fsdp_status run_set(void *p)
{
    struct copy_args *a = p;
    memset(a->dst, a->value, a->bytes);
    return FSDP_STATUS_OK;
}

static fsdp_status as_memcpy(fsdp_device *d, void *dst, const void *src, size_t bytes,
                             fsdp_stream_t s)
{
    cpu_async *as = async_of(d);
    bool from_pageable = !device_visible(as, src), to_pageable = !device_visible(as, dst);
    if (from_pageable && to_pageable) {
        /* nothing queued writes pageable memory (copies into it are done
         * before they return), so it can be copied now */
        memmove(dst, src, bytes);
        return FSDP_STATUS_OK;
    }
    struct copy_args a = {.dst = dst, .src = src, .bytes = bytes};
    if (from_pageable) {
        /* the source may change once this returns: copy it now */
        if (!(a.owned = malloc(bytes)))
            return fsdp_error_set(FSDP_STATUS_OOM, "device %d: out of host memory staging a "
                                  "copy of %zu bytes", d->rank, bytes);
        memcpy(a.owned, src, bytes);
        a.src = a.owned;
    }
    fsdp_status st = launch(s, run_copy, &a, sizeof a, "memcpy");
    if (st != FSDP_STATUS_OK) {
        free(a.owned);
        return st;
    }
    if (to_pageable) /* returns with dst written */
        return as_stream_sync(d, s);
    return FSDP_STATUS_OK;
}

static fsdp_status as_memset(fsdp_device *d, void *dst, int value, size_t bytes, fsdp_stream_t s)
{
    (void)d;
    struct copy_args a = {.dst = dst, .bytes = bytes, .value = value};
    return launch(s, run_set, &a, sizeof a, "memset");
}

/* ---- the device -------------------------------------------------------------------- */

static fsdp_status as_init(fsdp_device *d)
{
    FSDP_TRY(fsdp_cpu_dev_init(d));
    cpu_async *as = calloc(1, sizeof *as);
    if (!as)
        return fsdp_error_set(FSDP_STATUS_OOM, "device %d: out of host memory", d->rank);
    as->d = d;
    fsdp_cpu_streams mode;
    if (fsdp_device_cpu_get_streams(&mode, &as->jitter_seed) != FSDP_STATUS_OK)
        fsdp_error_clear(); /* the mode was decided already; no delays */
    pthread_mutex_init(&as->err_mu, NULL);
    /* nothing is allocated yet: the inline fences give way to the streams' */
    fsdp_block_cache_init(fsdp_cpu_dev_cache(d), &cpu_cache_i, as);
    ((cpu_dev *)d->ctx)->async = as;
    return FSDP_STATUS_OK;
}

static void as_fini(fsdp_device *d)
{
    cpu_dev *c = d->ctx;
    if (!c)
        return;
    cpu_async *as = c->async;
    if (as) {
        /* the streams were destroyed (joined) first: fences are all done;
         * the blocks go while the fences' context (as) still exists */
        fsdp_block_cache_fini(fsdp_cpu_dev_cache(d));
        for (size_t i = 0; i < as->n_pinned; i++)
            fsdp_cpu_host_free(d, as->pinned[i].p);
        free(as->pinned);
        pthread_mutex_destroy(&as->err_mu);
        free(as);
        c->async = NULL;
    }
    fsdp_cpu_dev_fini(d);
}

const struct fsdp_device_i fsdp_device_cpu_async_i = {
    .name = "cpu",
    .init = as_init,
    .fini = as_fini,
    .alloc = fsdp_cpu_dev_alloc,
    .free = fsdp_cpu_dev_free,
    .host_alloc = as_host_alloc,
    .host_free = as_host_free,
    .memcpy = as_memcpy,
    .memset = as_memset,
    .stream_create = as_stream_create,
    .stream_destroy = as_stream_destroy,
    .stream_sync = as_stream_sync,
    .event_create = as_event_create,
    .event_destroy = as_event_destroy,
    .event_record = as_event_record,
    .stream_wait_event = as_stream_wait_event,
    .event_sync = as_event_sync,
    .reserve = fsdp_cpu_dev_reserve,
    .launch_host = as_launch_host,
};
