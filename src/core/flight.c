/*
 * flight.c - the stall watchdog's deadline, the flight record of each
 * local rank's last collectives, and the report of a stall (contract in
 * flight.h). The record's file is JSON (docs/formats.md, "Flight record").
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "core/clock.h"
#include "core/fileio.h"
#include "core/flight.h"
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
    double t_issue, t_start, t_end; /* fsdp_now_s; 0: not yet */
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
    char path[4096];          /* "" : no file */
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

void fsdp_flight_free(fsdp_world *w)
{
    struct fsdp_flight *f = w->flight;
    if (!f)
        return;
    for (int i = 0; i < f->n_local; i++)
        pthread_mutex_destroy(&f->ranks[i].mu);
    free(f->ranks);
    free(f);
    w->flight = NULL;
}

fsdp_status fsdp_world_set_watchdog(fsdp_world *w, double seconds, const char *record_path)
{
    if (!(seconds >= 0) || seconds > FSDP_WATCHDOG_MAX_S)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "the watchdog's deadline must be 0..%g seconds (got %g)",
                              FSDP_WATCHDOG_MAX_S, seconds);
    if (record_path && strlen(record_path) >= sizeof w->flight->path)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "flight record path too long: '%.64s...'",
                              record_path);
    w->watchdog_s = seconds;
    if (seconds == 0) {
        fsdp_flight_free(w);
        return FSDP_STATUS_OK;
    }
    if (!w->flight) {
        struct fsdp_flight *f = calloc(1, sizeof *f);
        struct flight_rank *r = calloc((size_t)w->n_local, sizeof *r);
        if (!f || !r) {
            free(f);
            free(r);
            return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory for the flight record");
        }
        f->n_local = w->n_local;
        f->rank_offset = w->rank_offset;
        f->ranks = r;
        for (int i = 0; i < w->n_local; i++)
            pthread_mutex_init(&r[i].mu, NULL);
        w->flight = f;
    }
    snprintf(w->flight->path, sizeof w->flight->path, "%s", record_path ? record_path : "");
    return FSDP_STATUS_OK;
}

double fsdp_watchdog_deadline(const fsdp_world *w, bool remote)
{
    if (!w || !w->flight || w->watchdog_s <= 0 || !atomic_load(&w->running))
        return 0;
    double s = w->watchdog_s;
    return remote ? s + (s < 10 ? s : 10) : s;
}

/* ---- the record ---------------------------------------------------------------- */

static struct flight_rank *rank_of(fsdp_world *w, int rank)
{
    struct fsdp_flight *f = w ? w->flight : NULL;
    if (!f || rank < f->rank_offset || rank >= f->rank_offset + f->n_local)
        return NULL;
    return &f->ranks[rank - f->rank_offset];
}

long fsdp_flight_issue(fsdp_world *w, int rank, const fsdp_flight_coll *c)
{
    struct flight_rank *r = rank_of(w, rank);
    if (!r)
        return 0;
    pthread_mutex_lock(&r->mu);
    long seq = ++r->n;
    entry *e = &r->ring[seq % FSDP_FLIGHT_RING];
    *e = (entry){.seq = seq, .step = r->step, .kind = c->kind, .dtype = c->dtype,
                 .numel = c->numel, .first = c->first, .stride = c->stride, .count = c->count,
                 .t_issue = fsdp_now_s(), .state = ENTRY_QUEUED};
    snprintf(e->label, sizeof e->label, "%s", c->label ? c->label : "");
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
static void entry_mark(fsdp_world *w, int rank, long seq, int state, bool end)
{
    struct flight_rank *r = rank_of(w, rank);
    if (!r || seq <= 0)
        return;
    pthread_mutex_lock(&r->mu);
    entry *e = entry_locked(r, seq);
    if (e) {
        e->state = state;
        *(end ? &e->t_end : &e->t_start) = fsdp_now_s();
    }
    pthread_mutex_unlock(&r->mu);
}

void fsdp_flight_start(fsdp_world *w, int rank, long seq)
{
    entry_mark(w, rank, seq, ENTRY_RUNNING, false);
}

void fsdp_flight_end(fsdp_world *w, int rank, long seq, bool ok)
{
    entry_mark(w, rank, seq, ok ? ENTRY_DONE : ENTRY_FAILED, true);
}

void fsdp_flight_step(fsdp_world *w, int rank, long step)
{
    struct flight_rank *r = rank_of(w, rank);
    if (!r)
        return;
    pthread_mutex_lock(&r->mu);
    r->step = step;
    pthread_mutex_unlock(&r->mu);
}

/* A copy of rank's entry seq (0: its newest running one; -1: its newest
 * of any state); false when there is none. */
static bool entry_copy(fsdp_world *w, int rank, long seq, entry *out)
{
    struct flight_rank *r = rank_of(w, rank);
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

/* The flight record of every local rank, with the report, into the file
 * the world was given. */
static fsdp_status record_write(fsdp_world *w, const char *report)
{
    struct fsdp_flight *fl = w->flight;
    fsdp_atomic_file af = {0};
    FSDP_TRY(fsdp_atomic_open(&af, fl->path, "flight record"));
    FILE *f = af.f;
    double now = fsdp_now_s();
    fprintf(f, "{\"fsdp_flight_record\":1,\"process\":%d,\"n_processes\":%d,\"host\":",
            w->process, w->n_processes);
    fsdp_json_write_str(f, w->hosts[w->process]);
    fprintf(f, ",\"watchdog_s\":%g,\"report\":", w->watchdog_s);
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
static void missing_last(fsdp_world *w, int rank, double now, fsdp_sbuf *b)
{
    entry e;
    if (!entry_copy(w, rank, -1, &e)) {
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

fsdp_status fsdp_flight_stall(fsdp_world *w, const fsdp_stall *s)
{
    int first = 0;
    if (!atomic_compare_exchange_strong(&w->stall_reported, &first, 1))
        return fsdp_error_set(FSDP_STATUS_ABORTED, "rank %d: stopped waiting: the stall "
                              "watchdog has reported a stall", s->rank);
    double now = fsdp_now_s();
    entry e;
    bool have = entry_copy(w, s->rank, s->seq, &e);
    fsdp_sbuf b = {0};
    fsdp_sbuf_printf(&b, "rank %d: stalled: waited %.1f s (the watchdog's limit, --watchdog "
                     "%g) ", s->rank, s->waited_s, w->watchdog_s);
    if (have)
        fsdp_sbuf_printf(&b, "at step %ld in %s%s", e.step, e.label[0] ? e.label : e.kind,
                         e.label[0] ? ", " : " ");
    else
        fsdp_sbuf_printf(&b, "in ");
    fsdp_sbuf_printf(&b, "%s: %s", s->wait, s->who);
    for (int i = 0; i < s->n_missing; i++)
        missing_last(w, s->missing[i], now, &b);
    fsdp_status st = FSDP_STATUS_OK;
    if (w->flight->path[0]) {
        /* the file holds the report without the line about itself */
        st = record_write(w, b.oom ? "" : b.p);
        if (st == FSDP_STATUS_OK)
            fsdp_sbuf_printf(&b, "; the last collectives of this process's ranks are in %s",
                             w->flight->path);
        else
            fsdp_sbuf_printf(&b, "; the flight record could not be written: %s",
                             fsdp_error_msg());
    }
    fsdp_sbuf_printf(&b, ". A rank that does not arrive is stuck in its own work or took "
                     "another path (a bug, unreadable data, settings that differ); raise "
                     "--watchdog if such waits are expected (0: off)");
    fsdp_status ret = fsdp_error_set(FSDP_STATUS_STALLED, "%s",
                                     b.oom ? "stalled (out of host memory for the report)"
                                           : b.p);
    free(b.p);
    fsdp_world_fail(w, s->rank, FSDP_STATUS_STALLED, fsdp_error_msg());
    return ret;
}

fsdp_status fsdp_flight_stall_among(fsdp_world *w, int rank, long seq, double waited_s,
                                    const char *wait, int n,
                                    int (*rank_at)(const void *ctx, int i),
                                    bool (*arrived)(const void *ctx, int i), const void *ctx,
                                    const char *note)
{
    int *in = calloc(2 * (size_t)n + 1, sizeof *in), n_in = 0, n_out = 0;
    int *out = in ? in + n : NULL;
    char who[700];
    if (in) {
        for (int i = 0; i < n; i++) {
            if (arrived(ctx, i))
                in[n_in++] = rank_at(ctx, i);
            else
                out[n_out++] = rank_at(ctx, i);
        }
        char in_s[256], out_s[256];
        snprintf(who, sizeof who, "arrived: rank%s %s; not arrived: rank%s %s%s%s",
                 n_in == 1 ? "" : "s", fsdp_flight_ranks(in, n_in, in_s, sizeof in_s),
                 n_out == 1 ? "" : "s", fsdp_flight_ranks(out, n_out, out_s, sizeof out_s),
                 note ? " " : "", note ? note : "");
    } else {
        snprintf(who, sizeof who, "who has arrived is not known (out of host memory)");
    }
    fsdp_stall st = {.rank = rank, .seq = seq, .waited_s = waited_s, .wait = wait, .who = who,
                     .missing = out, .n_missing = n_out};
    fsdp_status ret = fsdp_flight_stall(w, &st);
    free(in);
    return ret;
}
