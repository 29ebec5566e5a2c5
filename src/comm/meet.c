/*
 * meet.c - the in-process meeting of a collective's members (contract in
 * meet.h).
 */
#include <sched.h>
#include <stdlib.h>
#include <unistd.h>

#include "comm/meet.h"
#include "core/clock.h"
#include "core/flight.h"

#define MEET_SPIN 4000 /* polls of the meeting before sleeping */
#define MEET_YIELDS 16 /* polls (each after a yield) when ranks outnumber cores */

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

bool fsdp_meet_init(fsdp_meet *m, int n)
{
    m->n = n;
    m->n_refs = 0;
    atomic_init(&m->arrived, 0);
    atomic_init(&m->done, 0);
    atomic_init(&m->n_sleepers, 0);
    m->slots = calloc((size_t)n, sizeof *m->slots);
    for (int i = 0; m->slots && i < n; i++)
        atomic_init(&m->slots[i].at, 0);
    return m->slots != NULL;
}

void fsdp_meet_fini(fsdp_meet *m)
{
    free(m->slots);
    m->slots = NULL;
}

/* ---- meetings ---------------------------------------------------------------- */

static bool reached(fsdp_meet *m, unsigned long seq) { return atomic_load(&m->done) >= seq; }

/* The last member's part of meeting seq: the hook, then the meeting is
 * done for everyone. Sleepers register (under w->mu) before they re-check
 * `done`, so either a sleeper sees it or this sees the sleeper. */
static void complete(fsdp_meet *m, fsdp_comm *c, unsigned long seq, void (*hook)(fsdp_comm *c))
{
    if (hook)
        hook(c);
    atomic_store(&m->done, seq);
    if (atomic_load(&m->n_sleepers) > 0) {
        pthread_mutex_lock(&c->world->mu);
        pthread_cond_broadcast(&c->world->cv);
        pthread_mutex_unlock(&c->world->mu);
    }
}

/* Who of a table's members has arrived at meeting `seq` (the stall report). */
struct arrivals {
    const fsdp_meet *m;
    unsigned long seq;
};

static int member_rank(const void *ctx, int i)
{
    const fsdp_meet *m = ((const struct arrivals *)ctx)->m;
    return fsdp_comm_group_rank(&m->g, m->base + i);
}

static bool member_arrived(const void *ctx, int i)
{
    const struct arrivals *a = ctx;
    return atomic_load(&a->m->slots[i].at) >= a->seq;
}

/* The stall watchdog's report (core/flight.h) of meeting seq, the first of
 * r's collective, which r has waited in for waited_s: who of this
 * process's members has arrived. */
static fsdp_status stall_report(fsdp_meet_rank *r, fsdp_comm *c, unsigned long seq,
                                double waited_s)
{
    const fsdp_meet *m = r->m;
    const fsdp_coll_args *a = &m->slots[r->index].args;
    char wait[256], group[96];
    fsdp_comm_group_format(&m->g, group, sizeof group);
    if (a->kind == FSDP_COLL_BARRIER)
        snprintf(wait, sizeof wait, "collective %ld (barrier of %s)", r->n_coll, group);
    else
        snprintf(wait, sizeof wait, "collective %ld (%s of %zu x %s over %s)", r->n_coll,
                 fsdp_coll_kind_name(a->kind), a->numel, fsdp_dtype_name(a->dt), group);
    struct arrivals at = {m, seq};
    return fsdp_world_stall_among(c->world, c->global_rank, c->flight_seq, waited_s, wait, m->n,
                                  member_rank, member_arrived, &at,
                                  m->n < m->g.count ? "(this process's ranks; the other "
                                                      "processes' are met later, between "
                                                      "processes)" : NULL);
}

/* Arrive at r's next meeting and wait until it is complete (OK).
 * abortable: give up when the world's abort flag is set (ABORTED, no
 * message) or when the wait passes the stall watchdog's deadline (its
 * report: STALLED with the message, or ABORTED if another rank reported
 * first), withdrawing the arrival; a meeting completed meanwhile is kept
 * (OK). */
static fsdp_status meet(fsdp_meet_rank *r, fsdp_comm *c, bool abortable,
                        void (*hook)(fsdp_comm *c))
{
    fsdp_meet *m = r->m;
    fsdp_world *w = c->world;
    unsigned long seq = ++r->seq, full = seq * (unsigned long)m->n;
    atomic_store(&m->slots[r->index].at, seq);
    if (atomic_fetch_add(&m->arrived, 1) + 1 == full) {
        complete(m, c, seq, hook);
        return FSDP_STATUS_OK;
    }
    double t0 = fsdp_now_s(), deadline = abortable ? fsdp_watchdog_deadline(w, false) : 0;
    /* Spin while the others are likely running on other cores; with more
     * ranks than cores, only yield a little so the late ranks get the CPU. */
    for (int i = 0; i < r->n_spin; i++) {
        if (reached(m, seq))
            return FSDP_STATUS_OK;
        if (abortable && fsdp_world_aborted(w))
            break;
        if (r->oversubscribed || (i & 127) == 127)
            sched_yield();
        else
            cpu_relax();
    }
    bool done;
    fsdp_status report = FSDP_STATUS_OK;
    pthread_mutex_lock(&w->mu);
    atomic_fetch_add(&m->n_sleepers, 1);
    while (!(done = reached(m, seq)) && !(abortable && fsdp_world_aborted(w))) {
        double waited = fsdp_now_s() - t0;
        if (deadline > 0 && waited > deadline && report == FSDP_STATUS_OK) {
            /* reported while still arrived; the report aborts the world */
            pthread_mutex_unlock(&w->mu);
            report = stall_report(r, c, seq, waited);
            pthread_mutex_lock(&w->mu);
            continue;
        }
        fsdp_world_wait_locked(w);
    }
    if (!done) {
        /* Withdraw the arrival, so that every member agrees again on the
         * meetings reached (the failed rank never arrived) and
         * communicators kept across a relaunch of the world stay in step;
         * unless the last member arrived meanwhile: then the meeting is
         * complete once its hook has run, and this member goes on. */
        unsigned long a = atomic_load(&m->arrived);
        while (a < full && !atomic_compare_exchange_weak(&m->arrived, &a, a - 1))
            ;
        if (a < full) {
            r->seq = seq - 1;
            atomic_store(&m->slots[r->index].at, seq - 1);
        } else {
            while (!(done = reached(m, seq)))
                fsdp_world_wait_locked(w);
        }
    }
    atomic_fetch_sub(&m->n_sleepers, 1);
    pthread_mutex_unlock(&w->mu);
    if (done)
        return FSDP_STATUS_OK;
    return report == FSDP_STATUS_STALLED ? report : FSDP_STATUS_ABORTED;
}

fsdp_status fsdp_meet_begin(fsdp_meet_rank *r, fsdp_comm *c, const fsdp_coll_args *a,
                            const void *send, void *recv, const char *refused,
                            void (*hook)(fsdp_comm *c))
{
    long k = ++r->n_coll;
    const char *what = fsdp_coll_kind_name(a->kind);
    FSDP_TRY(fsdp_comm_begin_check(c, c->global_rank, k, a->kind, send, recv, a->numel, a->dt,
                                   a->op, a->root));
    if (!refused && fsdp_world_aborted(c->world))
        refused = "another rank failed";
    if (refused)
        return fsdp_error_set(FSDP_STATUS_ABORTED, "rank %d: collective %ld (%s) not started: %s",
                              c->global_rank, k, what, refused);
    fsdp_meet_slot *me = &r->m->slots[r->index];
    me->args = *a;
    me->send = send;
    me->recv = recv;
    fsdp_status st = meet(r, c, true, hook);
    if (st == FSDP_STATUS_ABORTED)
        return fsdp_error_set(FSDP_STATUS_ABORTED,
                              "rank %d: aborted in collective %ld (%s) while waiting for the "
                              "other ranks: another rank failed",
                              c->global_rank, k, what);
    return st; /* OK, or the watchdog's report */
}

void fsdp_meet_arrive(fsdp_meet_rank *r, fsdp_comm *c) { (void)meet(r, c, false, NULL); }

/* ---- lifetime ---------------------------------------------------------------- */

static fsdp_status attach_locked(fsdp_meet_rank *r, fsdp_world *w, const fsdp_meet_kind *k,
                                 const fsdp_comm_group *g, int rank, void *arg)
{
    void **where = fsdp_comm_shared_slot_locked(w, k, g);
    if (!where)
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory for %s", k->what);
    fsdp_meet *m = *where;
    if (!m) {
        fsdp_status st = k->create(w, g, arg, &m);
        if (st != FSDP_STATUS_OK) {
            fsdp_comm_shared_drop_locked(w, k, g);
            return st;
        }
        m->g = *g;
        m->base = fsdp_comm_group_index(g, rank) - r->index;
        *where = m;
    }
    fsdp_meet_slot *s = &m->slots[r->index];
    if (s->attached)
        return fsdp_error_set(FSDP_STATUS_INTERNAL,
                              "rank %d: %s collectives initialised twice; call fsdp_comm_fini "
                              "on every rank (also after a failure) before initialising again",
                              rank, k->name);
    s->attached = 1;
    m->n_refs++;
    r->m = m;
    r->seq = s->seq;
    return FSDP_STATUS_OK;
}

fsdp_status fsdp_meet_attach(fsdp_meet_rank *r, fsdp_world *w, const fsdp_meet_kind *k,
                             const fsdp_comm_group *g, int rank, int index, void *arg)
{
    long n_cpus = sysconf(_SC_NPROCESSORS_ONLN);
    *r = (fsdp_meet_rank){.index = index};
    r->oversubscribed = n_cpus > 0 && w->n_local > n_cpus;
    r->n_spin = r->oversubscribed ? MEET_YIELDS : MEET_SPIN;
    pthread_mutex_lock(&w->mu);
    fsdp_status st = attach_locked(r, w, k, g, rank, arg);
    pthread_mutex_unlock(&w->mu);
    return st;
}

void fsdp_meet_detach(fsdp_meet_rank *r, fsdp_world *w, const fsdp_meet_kind *k,
                      const fsdp_comm_group *g)
{
    fsdp_meet *m = r->m;
    if (!m)
        return;
    pthread_mutex_lock(&w->mu);
    m->slots[r->index].attached = 0;
    m->slots[r->index].seq = r->seq;
    if (--m->n_refs == 0) {
        fsdp_comm_shared_drop_locked(w, k, g);
        k->destroy(m);
    }
    pthread_mutex_unlock(&w->mu);
    r->m = NULL;
}
