/*
 * flight.c - the flight record of each local rank's last collectives, the
 * report of a stall and FSDP_WATCHDOG's value (contract in flight.h). The
 * record's file is JSON (docs/formats.md, "Flight record"). The deadline
 * and the once-per-launch report are the world's (core/world.c).
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "core/clock.h"
#include "core/fileio.h"
#include "core/flight.h"
#include "core/str.h"
#include "core/json.h"
#include "core/log.h"

#define LABEL_MAX 96

enum { ENTRY_QUEUED = 0, ENTRY_RUNNING, ENTRY_DONE, ENTRY_FAILED };
static const char *const state_names[] = {"queued", "running", "done", "failed"};

typedef struct entry {
    long seq;                 /* 0: empty */
    long step;
    const char *kind, *dtype;
    size_t numel;
    int first, stride, count;
    char label[LABEL_MAX];
    double t_issue, t_start, t_end; /* fsdp_now_coarse_s; 0: not yet */
    int state;
} entry;

struct flight_rank {
    pthread_mutex_t mu;
    long step;                /* the rank's current step */
    long n;                   /* entries made so far (the newest's seq) */
    entry ring[FSDP_FLIGHT_RING];
};

struct fsdp_flight {
    int n_local, rank_offset;
    struct flight_rank *ranks; /* (n_local,) */
};

fsdp_status fsdp_watchdog_env(double *seconds)
{
    const char *v = fsdp_env_get(FSDP_ENV_WATCHDOG);
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (!*v || errno || end == v || *end || !(x >= 0) || x > FSDP_WATCHDOG_MAX_S)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "FSDP_WATCHDOG='%s': expected the seconds a wait in a collective "
                              "may last, 0..%g (0: no watchdog)", v, FSDP_WATCHDOG_MAX_S);
    *seconds = x;
    return FSDP_STATUS_OK;
}

fsdp_status fsdp_flight_init(fsdp_flight **out, int n_local, int rank_offset)
{
    fsdp_flight *f = calloc(1, sizeof *f);
    struct flight_rank *r = calloc((size_t)n_local, sizeof *r);
    *out = NULL;
    if (!f || !r) {
        free(f);
        free(r);
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory for the flight record");
    }
    f->n_local = n_local;
    f->rank_offset = rank_offset;
    f->ranks = r;
    for (int i = 0; i < n_local; i++)
        pthread_mutex_init(&r[i].mu, NULL);
    *out = f;
    return FSDP_STATUS_OK;
}

void fsdp_flight_free(fsdp_flight *f)
{
    if (!f)
        return;
    for (int i = 0; i < f->n_local; i++)
        pthread_mutex_destroy(&f->ranks[i].mu);
    free(f->ranks);
    free(f);
}

/* ---- the record ---------------------------------------------------------------- */

static struct flight_rank *rank_of(fsdp_flight *f, int rank)
{
    if (!f || rank < f->rank_offset || rank >= f->rank_offset + f->n_local)
        return NULL;
    return &f->ranks[rank - f->rank_offset];
}

long fsdp_flight_issue(fsdp_flight *f, int rank, const fsdp_flight_coll *c)
{
    struct flight_rank *r = rank_of(f, rank);
    if (!r)
        return 0;
    pthread_mutex_lock(&r->mu);
    long seq = ++r->n;
    entry *e = &r->ring[seq % FSDP_FLIGHT_RING];
    *e = (entry){.seq = seq, .step = r->step, .kind = c->kind, .dtype = c->dtype,
                 .numel = c->numel, .first = c->first, .stride = c->stride, .count = c->count,
                 .t_issue = fsdp_now_coarse_s(), .state = ENTRY_QUEUED};
    fsdp_str_copy(e->label, sizeof e->label, c->label);
    pthread_mutex_unlock(&r->mu);
    return seq;
}

/* Entry seq of r if the ring still holds it; r->mu held. */
static entry *entry_locked(struct flight_rank *r, long seq)
{
    entry *e = &r->ring[seq % FSDP_FLIGHT_RING];
    return seq > 0 && e->seq == seq ? e : NULL;
}

/* Entry seq of rank enters `state` now (its start time, or its end's). */
static void entry_mark(fsdp_flight *f, int rank, long seq, int state, bool end)
{
    struct flight_rank *r = rank_of(f, rank);
    if (!r || seq <= 0)
        return;
    pthread_mutex_lock(&r->mu);
    entry *e = entry_locked(r, seq);
    if (e) {
        e->state = state;
        *(end ? &e->t_end : &e->t_start) = fsdp_now_coarse_s();
    }
    pthread_mutex_unlock(&r->mu);
}

void fsdp_flight_start(fsdp_flight *f, int rank, long seq)
{
    entry_mark(f, rank, seq, ENTRY_RUNNING, false);
}

void fsdp_flight_end(fsdp_flight *f, int rank, long seq, bool ok)
{
    entry_mark(f, rank, seq, ok ? ENTRY_DONE : ENTRY_FAILED, true);
}

void fsdp_flight_step(fsdp_flight *f, int rank, long step)
{
    struct flight_rank *r = rank_of(f, rank);
    if (!r)
        return;
    pthread_mutex_lock(&r->mu);
    r->step = step;
    pthread_mutex_unlock(&r->mu);
}

/* A copy of rank's entry seq (0: its newest running one; -1: its newest
 * of any state); false when there is none. */
static bool entry_copy(fsdp_flight *f, int rank, long seq, entry *out)
{
    struct flight_rank *r = rank_of(f, rank);
    if (!r)
        return false;
    bool found = false;
    pthread_mutex_lock(&r->mu);
    if (seq > 0) {
        entry *e = entry_locked(r, seq);
        if ((found = e != NULL))
            *out = *e;
    } else {
        for (long s = r->n; s > 0 && s > r->n - FSDP_FLIGHT_RING && !found; s--) {
            entry *e = entry_locked(r, s);
            if (e && (seq < 0 || e->state == ENTRY_RUNNING)) {
                *out = *e;
                found = true;
            }
        }
    }
    pthread_mutex_unlock(&r->mu);
    return found;
}

/* ---- the report ---------------------------------------------------------------- */

const char *fsdp_flight_ranks(const int *ranks, int n, char *buf, size_t len)
{
    size_t at = 0;
    buf[0] = '\0';
    for (int i = 0; i < n && at < len;) {
        int j = i;
        while (j + 1 < n && ranks[j + 1] == ranks[j] + 1)
            j++;
        if (j == i)
            at += (size_t)snprintf(buf + at, len - at, "%s%d", i ? ", " : "", ranks[i]);
        else
            at += (size_t)snprintf(buf + at, len - at, "%s%d-%d", i ? ", " : "", ranks[i],
                                   ranks[j]);
        i = j + 1;
    }
    return buf;
}

/* One entry as JSON; times in seconds before `now` (null: not yet). */
static void entry_json(FILE *f, const entry *e, double now)
{
    fprintf(f, "{\"entry\":%ld,\"step\":%ld,\"kind\":", e->seq, e->step);
    fsdp_json_write_str(f, e->kind ? e->kind : "?");
    fprintf(f, ",\"label\":");
    fsdp_json_write_str(f, e->label);
    fprintf(f, ",\"numel\":%zu,\"dtype\":", e->numel);
    fsdp_json_write_str(f, e->dtype ? e->dtype : "");
    fprintf(f, ",\"group\":{\"first\":%d,\"stride\":%d,\"count\":%d},\"state\":\"%s\"", e->first,
            e->stride, e->count, state_names[e->state]);
    const double t[3] = {e->t_issue, e->t_start, e->t_end};
    static const char *const names[3] = {"issued_s_ago", "started_s_ago", "ended_s_ago"};
    for (int k = 0; k < 3; k++)
        if (t[k] > 0)
            fprintf(f, ",\"%s\":%.6f", names[k], now - t[k]);
        else
            fprintf(f, ",\"%s\":null", names[k]);
    fputc('}', f);
}

fsdp_status fsdp_flight_record_write(fsdp_flight *fl, const fsdp_flight_where *at,
                                     const char *report, const char *path)
{
    fsdp_atomic_file af = {0};
    FSDP_TRY(fsdp_atomic_open(&af, path, "flight record"));
    FILE *f = af.f;
    double now = fsdp_now_coarse_s();
    fprintf(f, "{\"fsdp_flight_record\":1,\"process\":%d,\"n_processes\":%d,\"host\":",
            at->process, at->n_processes);
    fsdp_json_write_str(f, at->host);
    fprintf(f, ",\"watchdog_s\":%g,\"report\":", at->watchdog_s);
    fsdp_json_write_str(f, report);
    fprintf(f, ",\"ranks\":[");
    for (int i = 0; i < fl->n_local; i++) {
        struct flight_rank *r = &fl->ranks[i];
        pthread_mutex_lock(&r->mu);
        fprintf(f, "%s\n{\"rank\":%d,\"step\":%ld,\"collectives\":[", i ? "," : "",
                fl->rank_offset + i, r->step);
        long lo = r->n - FSDP_FLIGHT_RING + 1 > 1 ? r->n - FSDP_FLIGHT_RING + 1 : 1;
        for (long s = lo; s <= r->n; s++) {
            const entry *e = entry_locked(r, s);
            if (!e)
                continue;
            fputs(s > lo ? ",\n " : "\n ", f);
            entry_json(f, e, now);
        }
        fprintf(f, "]}");
        pthread_mutex_unlock(&r->mu);
    }
    fprintf(f, "\n]}\n");
    return fsdp_atomic_commit(&af, !ferror(f));
}

/* What a missing rank ran last, appended to b. */
static void missing_last(fsdp_flight *f, int rank, double now, fsdp_sbuf *b)
{
    entry e;
    if (!entry_copy(f, rank, -1, &e)) {
        fsdp_sbuf_printf(b, "; rank %d issued no collective yet", rank);
        return;
    }
    double t = e.t_end > 0 ? e.t_end : e.t_start > 0 ? e.t_start : e.t_issue;
    fsdp_sbuf_printf(b, "; rank %d's newest collective: %s%s%s at step %ld (record entry %ld), ",
                     rank, e.label[0] ? e.label : e.kind, e.label[0] ? ", " : "",
                     e.label[0] ? e.kind : "", e.step, e.seq);
    if (e.state == ENTRY_RUNNING)
        fsdp_sbuf_printf(b, "begun %.1f s ago and not arrived at", now - t);
    else
        fsdp_sbuf_printf(b, "%s %.1f s ago", state_names[e.state], now - t);
}

void fsdp_flight_report(fsdp_flight *f, const fsdp_flight_where *at, const fsdp_stall *s,
                        fsdp_sbuf *b)
{
    double now = fsdp_now_coarse_s();
    entry e;
    bool have = entry_copy(f, s->rank, s->seq, &e);
    fsdp_sbuf_printf(b, "rank %d: stalled: waited %.1f s (the watchdog's limit, --watchdog "
                     "%g) ", s->rank, s->waited_s, at->watchdog_s);
    if (have)
        fsdp_sbuf_printf(b, "at step %ld in %s%s", e.step, e.label[0] ? e.label : e.kind,
                         e.label[0] ? ", " : " ");
    else
        fsdp_sbuf_printf(b, "in ");
    fsdp_sbuf_printf(b, "%s: %s", s->wait, s->who);
    for (int i = 0; i < s->n_missing; i++)
        missing_last(f, s->missing[i], now, b);
}
