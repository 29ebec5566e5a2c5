/*
 * trace.c - per-rank event buffers and the Chrome trace-event writer.
 */
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/fileio.h"
#include "core/error.h"
#include "device/device.h"
#include "engine/trace.h"

struct trace_event {
    uint64_t t0, t1;   /* ns; t1 = 0 for a counter */
    size_t bytes;      /* duration: bytes moved; counter: memory in use */
    uint8_t track;
    uint8_t counter;
    char name[24];
    char detail[40];
};

struct rank_buf {
    pthread_mutex_t mu;                /* ev: stamps come from the rank's stream threads */
    struct trace_event *ev;
    size_t n, cap;
    long open[FSDP_TRACE_TRACK_COUNT]; /* index of the open event per track, -1 none (rank
                                          thread only) */
};

struct fsdp_trace {
    int n_ranks;
    uint64_t t_origin;
    struct rank_buf *ranks;
};

uint64_t fsdp_trace_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

fsdp_status fsdp_trace_init(fsdp_trace **out, int n_ranks)
{
    fsdp_trace *t = calloc(1, sizeof *t);
    if (!t || !(t->ranks = calloc((size_t)n_ranks, sizeof *t->ranks))) {
        free(t);
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory for the trace");
    }
    t->n_ranks = n_ranks;
    t->t_origin = fsdp_trace_now_ns();
    for (int r = 0; r < n_ranks; r++) {
        pthread_mutex_init(&t->ranks[r].mu, NULL);
        for (int k = 0; k < FSDP_TRACE_TRACK_COUNT; k++)
            t->ranks[r].open[k] = -1;
    }
    *out = t;
    return FSDP_STATUS_OK;
}

void fsdp_trace_free(fsdp_trace *t)
{
    if (!t)
        return;
    for (int r = 0; r < t->n_ranks; r++) {
        free(t->ranks[r].ev);
        pthread_mutex_destroy(&t->ranks[r].mu);
    }
    free(t->ranks);
    free(t);
}

/* Append an event (zeroed, filled by fill) under b's mutex; returns its
 * index, or -1 when out of memory (tracing is best effort: dropped). */
static long push(struct rank_buf *b, const struct trace_event *fill)
{
    long i = -1;
    pthread_mutex_lock(&b->mu);
    if (b->n == b->cap) {
        size_t ncap = b->cap ? b->cap * 2 : 1024;
        struct trace_event *nev = realloc(b->ev, ncap * sizeof *nev);
        if (nev) {
            b->ev = nev;
            b->cap = ncap;
        }
    }
    if (b->n < b->cap) {
        b->ev[b->n] = *fill;
        i = (long)b->n++;
    }
    pthread_mutex_unlock(&b->mu);
    return i;
}

static void counter(const fsdp_trace_rank *t, uint64_t now)
{
    struct trace_event ev = {.t0 = now, .counter = 1, .bytes = t->dev->mem.in_use_bytes};
    snprintf(ev.name, sizeof ev.name, "memory");
    push(&t->trace->ranks[t->rank], &ev);
}

/* A stamp queued on the track's stream: the time the stream reached it. */
struct stamp {
    struct rank_buf *b;
    long idx;
    bool end;
};

static fsdp_status run_stamp(void *p)
{
    const struct stamp *a = p;
    uint64_t now = fsdp_trace_now_ns();
    pthread_mutex_lock(&a->b->mu);
    struct trace_event *ev = &a->b->ev[a->idx];
    if (a->end)
        ev->t1 = now > ev->t0 ? now : ev->t0 + 1;
    else
        ev->t0 = now;
    pthread_mutex_unlock(&a->b->mu);
    return FSDP_STATUS_OK;
}

static fsdp_stream_t track_stream(const fsdp_trace_rank *t, fsdp_trace_track track)
{
    return track == FSDP_TRACE_COMM ? t->dev->comm : track == FSDP_TRACE_COPY ? t->dev->copy
                                                                               : t->dev->compute;
}

static void stamp(const fsdp_trace_rank *t, fsdp_trace_track track, long idx, bool end)
{
    struct stamp a = {&t->trace->ranks[t->rank], idx, end};
    if (fsdp_device_launch_host(t->dev, track_stream(t, track), run_stamp, &a, sizeof a,
                                "trace stamp") != FSDP_STATUS_OK)
        fsdp_error_clear(); /* best effort: the event keeps no time and is left out */
}

void fsdp_trace_begin(const fsdp_trace_rank *t, fsdp_trace_track track, const char *name,
                      const char *detail, size_t bytes)
{
    if (!t->trace)
        return;
    struct rank_buf *b = &t->trace->ranks[t->rank];
    counter(t, fsdp_trace_now_ns());
    struct trace_event ev = {.track = (uint8_t)track, .bytes = bytes};
    snprintf(ev.name, sizeof ev.name, "%s", name);
    snprintf(ev.detail, sizeof ev.detail, "%s", detail ? detail : "");
    long i = push(b, &ev);
    b->open[track] = i;
    if (i >= 0)
        stamp(t, track, i, false);
}

void fsdp_trace_end(const fsdp_trace_rank *t, fsdp_trace_track track)
{
    if (!t->trace)
        return;
    struct rank_buf *b = &t->trace->ranks[t->rank];
    if (b->open[track] < 0)
        return;
    stamp(t, track, b->open[track], true);
    b->open[track] = -1;
    counter(t, fsdp_trace_now_ns());
}

void fsdp_trace_span(const fsdp_trace_rank *t, fsdp_trace_track track, const char *name,
                     const char *detail, size_t bytes, uint64_t t0_ns, uint64_t t1_ns)
{
    if (!t->trace)
        return;
    struct trace_event ev = {.t0 = t0_ns, .t1 = t1_ns > t0_ns ? t1_ns : t0_ns + 1,
                             .track = (uint8_t)track, .bytes = bytes};
    snprintf(ev.name, sizeof ev.name, "%s", name);
    snprintf(ev.detail, sizeof ev.detail, "%s", detail ? detail : "");
    push(&t->trace->ranks[t->rank], &ev);
}

/* Lanes. Trace viewers draw a (pid, tid) track as a stack of properly
 * nested slices. Begin/end pairs on one track never overlap, but spans can:
 * the CPU optimizer updates of several units run at once when the pool has
 * several workers. Such events go to extra lanes of their track (tid =
 * track + FSDP_TRACE_TRACK_COUNT * lane, named "<track> (lane+1)"), so every
 * track the file declares is properly nested and concurrency stays visible. */
#define TRACE_MAX_LANES 32

static int by_start(const void *a, const void *b, void *arg)
{
    const struct trace_event *ev = arg;
    const struct trace_event *x = &ev[*(const size_t *)a], *y = &ev[*(const size_t *)b];
    if (x->t0 != y->t0)
        return x->t0 < y->t0 ? -1 : 1;
    return x->t1 > y->t1 ? -1 : x->t1 < y->t1; /* the longer first */
}

/* lane[i] for every duration event of b; used[track] = bit mask of lanes.
 * Returns false when out of memory (then every event stays in lane 0). */
static bool assign_lanes(const struct rank_buf *b, uint8_t *lane, uint32_t *used)
{
    memset(lane, 0, b->n);
    for (int k = 0; k < FSDP_TRACE_TRACK_COUNT; k++)
        used[k] = 1;
    size_t *idx = malloc((b->n + 1) * sizeof *idx);
    if (!idx)
        return false;
    for (int k = 0; k < FSDP_TRACE_TRACK_COUNT; k++) {
        size_t n = 0;
        for (size_t i = 0; i < b->n; i++)
            if (!b->ev[i].counter && b->ev[i].t1 && b->ev[i].track == k)
                idx[n++] = i;
        qsort_r(idx, n, sizeof *idx, by_start, b->ev);
        uint64_t end[TRACE_MAX_LANES] = {0};
        for (size_t j = 0; j < n; j++) {
            const struct trace_event *ev = &b->ev[idx[j]];
            int l = 0;
            while (l < TRACE_MAX_LANES - 1 && end[l] > ev->t0)
                l++;
            lane[idx[j]] = (uint8_t)l;
            if (ev->t1 > end[l])
                end[l] = ev->t1;
            used[k] |= 1u << l;
        }
    }
    free(idx);
    return true;
}

fsdp_status fsdp_trace_write(const fsdp_trace *t, const char *path)
{
    static const char *const tracks[FSDP_TRACE_TRACK_COUNT] = {"compute", "comm", "copy",
                                                               "cpu optimizer"};
    /* atomic: never a half-written trace, never over a device node or FIFO */
    fsdp_atomic_file af;
    FSDP_TRY(fsdp_atomic_open(&af, path, "trace"));
    FILE *f = af.f;
    fprintf(f, "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n");
    int first = 1;
    for (int r = 0; r < t->n_ranks; r++) {
        const struct rank_buf *b = &t->ranks[r];
        if (!b->n)
            continue; /* a rank of another process (its process writes its track) */
        uint8_t *lane = malloc(b->n + 1);
        uint32_t used[FSDP_TRACE_TRACK_COUNT];
        if (!lane || !assign_lanes(b, lane, used)) {
            free(lane);
            fsdp_atomic_abort(&af);
            return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory writing trace '%s'", path);
        }
        fprintf(f, "%s{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":%d,\"args\":{\"name\":\"rank %d\"}}",
                first ? "" : ",\n", r, r);
        first = 0;
        for (int k = 0; k < FSDP_TRACE_TRACK_COUNT; k++)
            for (int l = 0; l < TRACE_MAX_LANES; l++) {
                if (!(used[k] & (1u << l)))
                    continue;
                int tid = k + FSDP_TRACE_TRACK_COUNT * l;
                char name[48];
                if (l)
                    snprintf(name, sizeof name, "%s (%d)", tracks[k], l + 1);
                else
                    snprintf(name, sizeof name, "%s", tracks[k]);
                fprintf(f, ",\n{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":%d,\"tid\":%d,\"args\":{\"name\":\"%s\"}}",
                        r, tid, name);
                fprintf(f, ",\n{\"ph\":\"M\",\"name\":\"thread_sort_index\",\"pid\":%d,\"tid\":%d,\"args\":{\"sort_index\":%d}}",
                        r, tid, k * TRACE_MAX_LANES + l);
            }
        for (size_t i = 0; i < b->n; i++) {
            const struct trace_event *ev = &b->ev[i];
            double ts = (double)(ev->t0 - t->t_origin) / 1000.0;
            if (ev->counter) {
                fprintf(f, ",\n{\"ph\":\"C\",\"name\":\"device memory\",\"pid\":%d,\"ts\":%.3f,\"args\":{\"bytes\":%zu}}",
                        r, ts, ev->bytes);
                continue;
            }
            if (!ev->t0 || !ev->t1)
                continue; /* never reached or never closed (error path) */
            fprintf(f, ",\n{\"ph\":\"X\",\"name\":\"%s\",\"cat\":\"%s\",\"pid\":%d,\"tid\":%d,"
                       "\"ts\":%.3f,\"dur\":%.3f,\"args\":{\"unit\":\"%s\",\"bytes\":%zu}}",
                    ev->name, tracks[ev->track], r, ev->track + FSDP_TRACE_TRACK_COUNT * lane[i], ts,
                    (double)(ev->t1 - ev->t0) / 1000.0, ev->detail, ev->bytes);
        }
        free(lane);
    }
    fprintf(f, "\n]}\n");
    return fsdp_atomic_commit(&af, !ferror(f));
}
