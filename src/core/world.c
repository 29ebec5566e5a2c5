/*
 * world.c - rank threads, the abortable barrier (plain, or agreeing on a
 * value, with the stall watchdog's deadline), the stall watchdog (its
 * deadline, and the one report a stall ends the launch with; the flight
 * record it cites is core/flight.c), the first-error record, the placement
 * of ranks in processes and the fault-injection hook.
 *
 * Waiters block on one condition variable with a short timeout and re-check
 * the abort flag, so an abort is seen within milliseconds even if a wake-up
 * is missed. fsdp_world_fail() also broadcasts the condition variable.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "core/clock.h"
#include "core/log.h"
#include "core/world.h"

static const fsdp_name fault_kinds[] = {
    {"alloc", FSDP_FAULT_ALLOC, "device and pinned host allocations"},
    {"collective", FSDP_FAULT_COLLECTIVE, "collectives and their barriers"},
    {"write", FSDP_FAULT_WRITE, "metrics records, checkpoint blocks, manifests and commits"},
    {"stall", FSDP_FAULT_STALL, "collectives that never arrive (the stall watchdog's test)"},
};
const fsdp_name_table fsdp_fault_kind_names = FSDP_NAME_TABLE(fault_kinds);

/* Arm w's hook from FSDP_FAULT=RANK:OP:K (unset or empty: nothing). */
static fsdp_status fault_from_env(fsdp_world *w)
{
    const char *spec = fsdp_env_get(FSDP_ENV_FAULT);
    if (!*spec)
        return FSDP_STATUS_OK;
    char op[32];
    long rank = -1, k = 0;
    int used = 0;
    if (sscanf(spec, "%ld:%31[a-z]:%ld%n", &rank, op, &k, &used) != 3 || spec[used] ||
        rank < 0 || k < 1)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "FSDP_FAULT='%s' is not RANK:OP:K with OP alloc, collective, "
                              "write or stall and K >= 1 (a testing hook: unset it for normal "
                              "runs)",
                              spec);
    int kind;
    if (fsdp_names_parse(&fsdp_fault_kind_names, 0, op, &kind) != FSDP_STATUS_OK)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "FSDP_FAULT='%s': %s", spec,
                              fsdp_error_msg());
    if (rank >= w->n_ranks)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "FSDP_FAULT='%s' names rank %ld, but this run has %d rank%s", spec,
                              rank, w->n_ranks, w->n_ranks == 1 ? "" : "s");
    fsdp_world_set_fault(w, (fsdp_fault_kind)kind, (int)rank, k);
    w->fault_env = kind;
    return FSDP_STATUS_OK;
}

fsdp_status fsdp_world_init(fsdp_world **out, int n_ranks)
{
    return fsdp_world_init_span(out, n_ranks, NULL);
}

fsdp_status fsdp_world_init_span(fsdp_world **out, int n_local, const fsdp_world_span *span)
{
    *out = NULL;
    int n_proc = span ? span->n_processes : 1, proc = span ? span->process : 0;
    if (n_proc < 1 || n_proc > FSDP_MAX_RANKS || proc < 0 || proc >= n_proc)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "process %d of %d: a job has 1..%d processes, numbered from 0",
                              proc, n_proc, FSDP_MAX_RANKS);
    if (n_local < 1 || (long)n_local * n_proc > FSDP_MAX_RANKS) {
        if (n_proc == 1)
            return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "world size must be 1..%d, got %d",
                                  FSDP_MAX_RANKS, n_local);
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "world size must be 1..%d, got %d rank(s) in each of %d processes",
                              FSDP_MAX_RANKS, n_local, n_proc);
    }
    fsdp_world *w = calloc(1, sizeof *w);
    if (w) {
        w->stop = calloc((size_t)n_local, sizeof *w->stop);
        w->hosts = calloc((size_t)n_proc, sizeof *w->hosts);
        w->barrier_at = calloc((size_t)n_local, sizeof *w->barrier_at);
    }
    if (!w || !w->stop || !w->hosts || !w->barrier_at) {
        if (w) {
            free(w->stop);
            free(w->hosts);
            free(w->barrier_at);
        }
        free(w);
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory creating a world");
    }
    w->n_ranks = n_local * n_proc;
    w->n_local = n_local;
    w->process = proc;
    w->n_processes = n_proc;
    w->rank_offset = proc * n_local;
    for (int p = 0; p < n_proc; p++) {
        if (span && span->hosts && span->hosts[p])
            snprintf(w->hosts[p], FSDP_HOST_MAX, "%s", span->hosts[p]);
        else if (p == proc && gethostname(w->hosts[p], FSDP_HOST_MAX) == 0)
            w->hosts[p][FSDP_HOST_MAX - 1] = '\0';
        else
            snprintf(w->hosts[p], FSDP_HOST_MAX, "?");
    }
    if (span) {
        w->span_fail = span->fail;
        w->span_detach = span->detach;
        w->procs = span->ctx;
    }
    pthread_mutex_init(&w->mu, NULL);
    fsdp_cond_init_monotonic(&w->cv);
    for (int k = 0; k < FSDP_FAULT_KIND_COUNT; k++)
        w->fault[k].rank = -1;
    w->fault_env = -1;
    double watchdog_s = 0;
    fsdp_status st = fault_from_env(w);
    if (st == FSDP_STATUS_OK)
        st = fsdp_watchdog_env(&watchdog_s);
    if (st == FSDP_STATUS_OK)
        st = fsdp_world_set_watchdog(w, watchdog_s, NULL);
    return FSDP_OUT_OR_FREE(st, out, w, fsdp_world_free);
}

void fsdp_world_free(fsdp_world *w)
{
    if (!w)
        return;
    if (w->fault_env >= 0) {
        int kind = w->fault_env;
        long seen = atomic_load(&w->fault[kind].count);
        if (seen < atomic_load(&w->fault[kind].k))
            FSDP_WARN(FSDP_SUB_CORE,
                      "FSDP_FAULT=%s: rank %d made %ld %s operation%s; none failed",
                      fsdp_env_get(FSDP_ENV_FAULT), atomic_load(&w->fault[kind].rank), seen,
                      fsdp_names_name(&fsdp_fault_kind_names, kind), seen == 1 ? "" : "s");
    }
    if (w->span_detach)
        w->span_detach(w->procs, w);
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->mu);
    fsdp_flight_free(w->flight);
    free(w->stop);
    free(w->hosts);
    free(w->barrier_at);
    free(w);
}

const char *fsdp_world_where(const fsdp_world *w, int rank, char *buf, size_t n)
{
    if (!w || w->n_processes == 1 || rank < 0 || rank >= w->n_ranks)
        snprintf(buf, n, "%s", "");
    else {
        int p = fsdp_world_process_of(w, rank);
        snprintf(buf, n, " (process %d of %d, host %s)", p, w->n_processes, w->hosts[p]);
    }
    return buf;
}

fsdp_status fsdp_world_add_rank_stop(fsdp_world *w, int rank, fsdp_rank_stop_fn fn, void *arg)
{
    FSDP_ASSERT(w && fn && fsdp_world_is_local(w, rank));
    struct fsdp_rank_stop *s = &w->stop[rank - w->rank_offset];
    if (s->n == FSDP_RANK_STOP_MAX)
        return fsdp_error_set(FSDP_STATUS_INTERNAL, "rank %d: more than %d stop hooks", rank,
                              FSDP_RANK_STOP_MAX);
    s->fn[s->n] = fn;
    s->arg[s->n++] = arg;
    return FSDP_STATUS_OK;
}

void fsdp_world_remove_rank_stop(fsdp_world *w, int rank, fsdp_rank_stop_fn fn, void *arg)
{
    FSDP_ASSERT(w && fsdp_world_is_local(w, rank));
    struct fsdp_rank_stop *s = &w->stop[rank - w->rank_offset];
    for (int i = 0; i < s->n; i++)
        if (s->fn[i] == fn && s->arg[i] == arg) {
            for (int j = i + 1; j < s->n; j++) {
                s->fn[j - 1] = s->fn[j];
                s->arg[j - 1] = s->arg[j];
            }
            s->n--;
            return;
        }
}

/* The message of a rank that failed with st: its thread's first error when
 * that has the same status (teardown errors come later), else the current
 * one. */
static const char *rank_failure_msg(fsdp_status st)
{
    const char *first = NULL;
    return fsdp_error_first(&first) == st ? first : fsdp_error_msg();
}

bool fsdp_world_rank_stop(fsdp_world *w, int rank, fsdp_status st)
{
    if (!w || (st == FSDP_STATUS_OK && !fsdp_world_aborted(w)))
        return false;
    FSDP_ASSERT(fsdp_world_is_local(w, rank));
    if (st != FSDP_STATUS_OK && !fsdp_world_aborted(w))
        fsdp_world_fail(w, rank, st, rank_failure_msg(st));
    struct fsdp_rank_stop *slot = &w->stop[rank - w->rank_offset], s = *slot;
    slot->n = 0;
    for (int i = s.n - 1; i >= 0; i--)
        s.fn[i](s.arg[i]);
    return true;
}

void fsdp_world_fail(fsdp_world *w, int rank, fsdp_status st, const char *msg)
{
    pthread_mutex_lock(&w->mu);
    /* A real error beats an ABORTED report that raced ahead of it. */
    bool take = w->first_status == FSDP_STATUS_OK ||
                (w->first_status == FSDP_STATUS_ABORTED && st != FSDP_STATUS_ABORTED);
    if (take) {
        w->first_status = st;
        w->first_rank = rank;
        snprintf(w->first_msg, sizeof w->first_msg, "%s", msg ? msg : "");
    }
    if (!fsdp_world_is_local(w, rank))
        w->peer_failed = true;
    /* The other processes hear of this process's first real failure. */
    bool tell = w->span_fail && !w->span_failed && st != FSDP_STATUS_ABORTED &&
                fsdp_world_is_local(w, rank);
    if (tell)
        w->span_failed = true;
    atomic_store_explicit(&w->aborted, 1, memory_order_release);
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    if (tell)
        w->span_fail(w->procs, w, rank, st, msg ? msg : "");
}

void fsdp_world_wait_locked(fsdp_world *w)
{
    fsdp_cond_wait_ns(&w->cv, &w->mu, 10 * 1000 * 1000);
}

void fsdp_world_wait_aborted(fsdp_world *w)
{
    pthread_mutex_lock(&w->mu);
    while (!fsdp_world_aborted(w))
        fsdp_world_wait_locked(w);
    pthread_mutex_unlock(&w->mu);
}

fsdp_status fsdp_world_barrier(fsdp_world *w)
{
    unsigned all;
    return fsdp_world_barrier_or(w, 0, &all);
}

/* The stall watchdog's report of barrier round `gen`, which `rank` has
 * waited in for waited_s (its flight entry seq). */
static fsdp_status barrier_stall(fsdp_world *w, int rank, long seq, unsigned long gen,
                                 double waited_s)
{
    char wait[128];
    snprintf(wait, sizeof wait, "the barrier of this process's ranks (%d-%d)", w->rank_offset,
             w->rank_offset + w->n_local - 1);
    return fsdp_world_stall_local(w, rank, seq, waited_s, wait, w->barrier_at, gen, NULL);
}

/* The round's OR is published by the rank that completes it; the others
 * read it after waking. It stays valid until they leave: the next round
 * cannot complete without them. */
fsdp_status fsdp_world_barrier_or(fsdp_world *w, unsigned mine, unsigned *all)
{
    *all = 0;
    if (w->n_local == 1) {
        if (fsdp_world_aborted(w))
            return fsdp_error_set(FSDP_STATUS_ABORTED, "aborted");
        *all = mine;
        return FSDP_STATUS_OK;
    }
    int rank = fsdp_log_rank(), local = fsdp_world_is_local(w, rank) ? rank - w->rank_offset : -1;
    const fsdp_flight_coll rec = {.kind = "barrier", .first = w->rank_offset, .stride = 1,
                                  .count = w->n_local, .label = "barrier of this process's ranks"};
    long seq = local >= 0 ? fsdp_flight_issue(w->flight, rank, &rec) : 0;
    fsdp_flight_start(w->flight, rank, seq);
    double deadline = local >= 0 ? fsdp_watchdog_deadline(w, false) : 0, t0 = fsdp_now_s();
    bool stalled = false;
    pthread_mutex_lock(&w->mu);
    unsigned long gen = w->barrier_gen;
    w->barrier_or |= mine;
    if (local >= 0)
        atomic_store(&w->barrier_at[local], gen + 1);
    if (++w->barrier_waiting == w->n_local) {
        w->barrier_waiting = 0;
        w->barrier_result = w->barrier_or;
        w->barrier_or = 0;
        w->barrier_gen++;
        pthread_cond_broadcast(&w->cv);
    } else {
        while (gen == w->barrier_gen && !fsdp_world_aborted(w)) {
            if (deadline > 0 && fsdp_now_s() - t0 > deadline) {
                stalled = true;
                break;
            }
            fsdp_world_wait_locked(w);
        }
    }
    bool done = gen != w->barrier_gen;
    if (done)
        *all = w->barrier_result;
    pthread_mutex_unlock(&w->mu);
    fsdp_status st = done      ? FSDP_STATUS_OK
                     : stalled ? barrier_stall(w, rank, seq, gen, fsdp_now_s() - t0)
                               : fsdp_error_set(FSDP_STATUS_ABORTED, "aborted while waiting at "
                                                "a barrier: another rank failed");
    fsdp_flight_end(w->flight, rank, seq, done);
    return st;
}

/* ---- the stall watchdog ---------------------------------------------------------- */

fsdp_status fsdp_world_set_watchdog(fsdp_world *w, double seconds, const char *record_path)
{
    if (!(seconds >= 0) || seconds > FSDP_WATCHDOG_MAX_S)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "the watchdog's deadline must be 0..%g seconds (got %g)",
                              FSDP_WATCHDOG_MAX_S, seconds);
    if (record_path && strlen(record_path) >= sizeof w->flight_path)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "flight record path too long: '%.64s...'",
                              record_path);
    w->watchdog_s = seconds;
    snprintf(w->flight_path, sizeof w->flight_path, "%s", record_path ? record_path : "");
    if (seconds == 0) {
        fsdp_flight_free(w->flight);
        w->flight = NULL;
        return FSDP_STATUS_OK;
    }
    return w->flight ? FSDP_STATUS_OK : fsdp_flight_init(&w->flight, w->n_local, w->rank_offset);
}

double fsdp_watchdog_deadline(const fsdp_world *w, bool remote)
{
    if (!w || !w->flight || w->watchdog_s <= 0 || !atomic_load(&w->running))
        return 0;
    double s = w->watchdog_s;
    return remote ? s + (s < 10 ? s : 10) : s;
}

fsdp_status fsdp_world_stall(fsdp_world *w, const fsdp_stall *s)
{
    int first = 0;
    if (!atomic_compare_exchange_strong(&w->stall_reported, &first, 1))
        return fsdp_error_set(FSDP_STATUS_ABORTED, "rank %d: stopped waiting: the stall "
                              "watchdog has reported a stall", s->rank);
    const fsdp_flight_where at = {w->process, w->n_processes, w->hosts[w->process],
                                  w->watchdog_s};
    fsdp_sbuf b = {0};
    fsdp_flight_report(w->flight, &at, s, &b);
    if (w->flight && w->flight_path[0]) {
        /* the file holds the report without the line about itself */
        if (fsdp_flight_record_write(w->flight, &at, b.oom ? "" : b.p, w->flight_path) ==
            FSDP_STATUS_OK)
            fsdp_sbuf_printf(&b, "; the last collectives of this process's ranks are in %s",
                             w->flight_path);
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

fsdp_status fsdp_world_stall_among(fsdp_world *w, int rank, long seq, double waited_s,
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
    fsdp_status ret = fsdp_world_stall(w, &st);
    free(in);
    return ret;
}

/* Who of the local ranks has arrived at round `round` (fsdp_world_stall_local). */
struct local_round {
    const fsdp_world *w;
    const atomic_ulong *at;
    unsigned long round;
};

static int local_round_rank(const void *ctx, int i)
{
    return ((const struct local_round *)ctx)->w->rank_offset + i;
}

static bool local_round_arrived(const void *ctx, int i)
{
    const struct local_round *x = ctx;
    return atomic_load(&x->at[i]) == x->round + 1;
}

fsdp_status fsdp_world_stall_local(fsdp_world *w, int rank, long seq, double waited_s,
                                   const char *wait, const atomic_ulong *at, unsigned long round,
                                   const char *note)
{
    const struct local_round x = {w, at, round};
    return fsdp_world_stall_among(w, rank, seq, waited_s, wait, w->n_local, local_round_rank,
                                  local_round_arrived, &x, note);
}

/* Disarmed while it changes: a rank counting at the same time sees the old
 * fault or the new one, never a mix. */
void fsdp_world_set_fault(fsdp_world *w, fsdp_fault_kind kind, int rank, long k)
{
    atomic_store(&w->fault[kind].k, 0);
    atomic_store(&w->fault[kind].rank, rank);
    atomic_store(&w->fault[kind].count, 0);
    atomic_store(&w->fault[kind].k, k);
}

bool fsdp_world_fault_hit(fsdp_world *w, fsdp_fault_kind kind, int rank)
{
    long k = atomic_load(&w->fault[kind].k);
    if (k <= 0 || atomic_load(&w->fault[kind].rank) != rank)
        return false;
    return atomic_fetch_add(&w->fault[kind].count, 1) + 1 == k;
}

struct rank_thread {
    fsdp_world *w;
    int rank;
    fsdp_rank_fn fn;
    void *arg;
    fsdp_status st;
    pthread_t tid;
};

static void *rank_main(void *p)
{
    struct rank_thread *t = p;
    fsdp_log_set_rank(t->rank);
    fsdp_error_clear();
    t->st = t->fn(t->w, t->rank, t->arg);
    /* A hook left registered may point into the rank function's frame. */
    t->w->stop[t->rank - t->w->rank_offset].n = 0;
    if (t->st != FSDP_STATUS_OK)
        fsdp_world_fail(t->w, t->rank, t->st, rank_failure_msg(t->st));
    fsdp_error_clear();
    return NULL;
}

fsdp_status fsdp_world_launch(fsdp_world *w, fsdp_rank_fn fn, void *arg)
{
    int n = w->n_local;
    struct rank_thread *ts = calloc((size_t)n, sizeof *ts);
    if (!ts)
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory launching %d ranks", n);
    /* Under the mutex: another process's failure may arrive any time. */
    pthread_mutex_lock(&w->mu);
    if (!w->peer_failed) {
        atomic_store(&w->aborted, 0);
        w->first_status = FSDP_STATUS_OK;
        w->first_rank = -1;
        w->first_msg[0] = '\0';
    }
    w->barrier_waiting = 0;
    w->barrier_or = 0;
    w->span_failed = false;
    for (int i = 0; i < n; i++)
        atomic_store(&w->barrier_at[i], 0);
    atomic_store(&w->stall_reported, 0);
    atomic_store(&w->running, 1);
    pthread_mutex_unlock(&w->mu);
    memset(w->stop, 0, (size_t)n * sizeof *w->stop);

    int started = 0;
    for (; started < n; started++) {
        int rank = w->rank_offset + started;
        ts[started] = (struct rank_thread){.w = w, .rank = rank, .fn = fn, .arg = arg};
        int rc = pthread_create(&ts[started].tid, NULL, rank_main, &ts[started]);
        if (rc) {
            char msg[128];
            snprintf(msg, sizeof msg, "cannot start the thread of rank %d: %s", rank,
                     strerror(rc));
            fsdp_world_fail(w, rank, FSDP_STATUS_INTERNAL, msg);
            break;
        }
    }
    for (int r = 0; r < started; r++)
        pthread_join(ts[r].tid, NULL);
    free(ts);
    atomic_store(&w->running, 0);

    pthread_mutex_lock(&w->mu);
    fsdp_status st = w->first_status;
    int rank = w->first_rank;
    char msg[FSDP_ERROR_MSG_MAX];
    snprintf(msg, sizeof msg, "%s", w->first_msg);
    pthread_mutex_unlock(&w->mu);
    if (st == FSDP_STATUS_OK)
        return FSDP_STATUS_OK;
    /* messages that already name their rank ("rank 1: injected failure in
     * collective 3") are not prefixed twice */
    char head[32], where[96];
    int len = snprintf(head, sizeof head, "rank %d: ", rank);
    const char *body = strncmp(msg, head, (size_t)len) ? msg : msg + len;
    return fsdp_error_set(st, "rank %d%s: %s", rank, fsdp_world_where(w, rank, where, sizeof where),
                          body);
}
