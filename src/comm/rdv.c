/*
 * rdv.c - the host rendezvous of the CUDA collectives (contract in
 * comm/cuda_comm.h): an all-gather of one small record per rank among
 * every rank of a job, its own threads and, in a job of several processes,
 * the other processes' (through comm/procs.h: MPI or the rendezvous
 * directory; that is how NCCL's unique id reaches every process).
 *
 * Exchange g writes its records into buffer g % 2 (laid out by global
 * rank) and completes when the last local rank arrives: in a job of one
 * process it bumps the generation and wakes the others at once; otherwise
 * it first trades this process's block of records for the others' through
 * the procs exchange, the mutex released meanwhile. Waiters copy the
 * records out under the world's mutex. Two buffers suffice: a rank can
 * only start writing exchange g + 2 into buffer g % 2 after exchange g + 1
 * completed, which needs every local rank, so every one has already copied
 * out exchange g. A waiter that gives up on abort withdraws its arrival,
 * unless the last rank is already trading with the other processes (that
 * trade polls the abort flag itself), so the counts stay right for a
 * later launch of the same world. Waiters and the trade have the stall
 * watchdog's deadline (core/flight.h): the first to pass it reports who
 * has arrived and leaves as on an abort.
 */
#include <string.h>

#include "comm/cuda_comm.h"
#include "comm/procs.h"
#include "core/clock.h"
#include "core/flight.h"
#include "core/world.h"

struct fsdp_comm_rdv {
    int n_local, n_ranks;
    int refs;               /* attached ranks */
    unsigned long gen;      /* completed exchanges */
    int arrived;            /* ranks arrived at exchange `gen` */
    bool trading;           /* the last arriver trades with the other processes */
    fsdp_status trade_st[2];/* per buffer: the trade's outcome */
    char trade_msg[2][FSDP_ERROR_MSG_MAX];
    unsigned char *recs;    /* [2][n_ranks][FSDP_RDV_REC_MAX], by global rank */
    unsigned char *theirs;  /* [n_ranks][FSDP_RDV_REC_MAX]: what the trade brings */
    atomic_ulong *at;       /* (n_local,) the exchange each local rank arrived at last, plus
                             * one (the stall report) */
};

fsdp_status fsdp_comm_rdv_attach(fsdp_world *w, fsdp_comm_rdv **out)
{
    *out = NULL;
    pthread_mutex_lock(&w->mu);
    fsdp_comm_rdv *r = w->rdv_shared;
    if (!r) {
        r = calloc(1, sizeof *r);
        unsigned char *recs = calloc(3 * (size_t)w->n_ranks, FSDP_RDV_REC_MAX);
        atomic_ulong *at = calloc((size_t)w->n_local, sizeof *at);
        if (!r || !recs || !at) {
            free(r);
            free(recs);
            free(at);
            pthread_mutex_unlock(&w->mu);
            return fsdp_error_set(FSDP_STATUS_OOM,
                                  "out of host memory creating the rendezvous of %d ranks",
                                  w->n_ranks);
        }
        r->n_local = w->n_local;
        r->n_ranks = w->n_ranks;
        r->recs = recs;
        r->at = at;
        r->theirs = recs + 2 * (size_t)w->n_ranks * FSDP_RDV_REC_MAX;
        w->rdv_shared = r;
    }
    r->refs++;
    *out = r;
    pthread_mutex_unlock(&w->mu);
    return FSDP_STATUS_OK;
}

void fsdp_comm_rdv_detach(fsdp_world *w, fsdp_comm_rdv *r)
{
    if (!r)
        return;
    pthread_mutex_lock(&w->mu);
    if (--r->refs == 0) {
        if (w->rdv_shared == r)
            w->rdv_shared = NULL;
        free(r->recs);
        free(r->at);
        free(r);
    }
    pthread_mutex_unlock(&w->mu);
}

/* The stall watchdog's report (core/flight.h) of exchange g by `rank`,
 * which has waited waited_s: who of this process's ranks arrived, or, with
 * every local rank arrived and trading, what the other processes answered
 * (`trade`). */
static fsdp_status stall_report(fsdp_comm_rdv *r, fsdp_world *w, int rank, unsigned long g,
                                double waited_s, const char *trade)
{
    char wait[128];
    snprintf(wait, sizeof wait, "the collective handshake %lu of the job's ranks (the cuda "
             "collectives' rendezvous)", g + 1);
    if (trade) {
        char who[FSDP_ERROR_MSG_MAX];
        snprintf(who, sizeof who, "every rank of this process arrived; %s", trade);
        fsdp_stall st = {.rank = rank, .waited_s = waited_s, .wait = wait, .who = who};
        return fsdp_world_stall(w, &st);
    }
    return fsdp_world_stall_local(w, rank, 0, waited_s, wait, r->at, g,
                                  w->n_processes > 1 ? "(of this process's ranks)" : NULL);
}

/* The last local rank of exchange g, w->mu held: trade this process's
 * block of buf with the other processes' (released meanwhile). */
static void trade_locked(fsdp_comm_rdv *r, fsdp_world *w, int rank, unsigned char *buf,
                         unsigned long g)
{
    fsdp_procs *p = w->procs;
    const size_t block = (size_t)r->n_local * FSDP_RDV_REC_MAX;
    r->trading = true;
    pthread_mutex_unlock(&w->mu);
    double t0 = fsdp_now_s();
    fsdp_status st = p->iface->exchange(p, w, buf + (size_t)w->rank_offset * FSDP_RDV_REC_MAX,
                                        block, r->theirs);
    if (st == FSDP_STATUS_STALLED) {
        char trade[FSDP_ERROR_MSG_MAX];
        snprintf(trade, sizeof trade, "%s", fsdp_error_msg());
        st = stall_report(r, w, rank, g, fsdp_now_s() - t0, trade);
    }
    pthread_mutex_lock(&w->mu);
    r->trading = false;
    r->trade_st[g & 1] = st;
    if (st == FSDP_STATUS_OK)
        memcpy(buf, r->theirs, (size_t)r->n_ranks * FSDP_RDV_REC_MAX);
    else
        snprintf(r->trade_msg[g & 1], sizeof r->trade_msg[g & 1], "%s", fsdp_error_msg());
}

fsdp_status fsdp_comm_rdv_exchange(fsdp_comm_rdv *r, fsdp_world *w, int rank, const void *mine,
                                   size_t bytes, void *all, bool abortable)
{
    FSDP_ASSERT(bytes <= FSDP_RDV_REC_MAX && fsdp_world_is_local(w, rank));
    const size_t half = (size_t)r->n_ranks * FSDP_RDV_REC_MAX;
    double t0 = fsdp_now_s(), deadline = abortable ? fsdp_watchdog_deadline(w, false) : 0;
    fsdp_status report = FSDP_STATUS_OK;
    pthread_mutex_lock(&w->mu);
    unsigned long g = r->gen;
    unsigned char *buf = r->recs + (g & 1) * half;
    memcpy(buf + (size_t)rank * FSDP_RDV_REC_MAX, mine, bytes);
    atomic_store(&r->at[rank - w->rank_offset], g + 1);
    if (++r->arrived == r->n_local) {
        r->trade_st[g & 1] = FSDP_STATUS_OK;
        if (w->n_processes > 1)
            trade_locked(r, w, rank, buf, g);
        r->arrived = 0;
        r->gen++;
        pthread_cond_broadcast(&w->cv);
    } else {
        while (r->gen == g && !(abortable && fsdp_world_aborted(w) && !r->trading)) {
            double waited = fsdp_now_s() - t0;
            if (deadline > 0 && waited > deadline && !r->trading && report == FSDP_STATUS_OK) {
                pthread_mutex_unlock(&w->mu); /* the report aborts the world */
                report = stall_report(r, w, rank, g, waited, NULL);
                pthread_mutex_lock(&w->mu);
                continue;
            }
            fsdp_world_wait_locked(w);
        }
    }
    bool done = r->gen != g;
    fsdp_status st = done ? r->trade_st[g & 1] : FSDP_STATUS_ABORTED;
    char msg[FSDP_ERROR_MSG_MAX];
    if (done && st == FSDP_STATUS_OK) {
        for (int q = 0; q < r->n_ranks; q++)
            memcpy((unsigned char *)all + (size_t)q * bytes, buf + (size_t)q * FSDP_RDV_REC_MAX,
                   bytes);
    } else if (done) {
        snprintf(msg, sizeof msg, "%s", r->trade_msg[g & 1]);
    } else {
        r->arrived--;
        atomic_store(&r->at[rank - w->rank_offset], g);
    }
    pthread_mutex_unlock(&w->mu);
    if (!done && report == FSDP_STATUS_STALLED)
        return report; /* the watchdog's report is this thread's message */
    if (!done)
        return fsdp_error_set(FSDP_STATUS_ABORTED,
                              "rank %d: aborted while waiting for the other ranks' collective "
                              "handshake: another rank failed",
                              rank);
    if (st != FSDP_STATUS_OK)
        return fsdp_error_set(st, "rank %d: collective handshake with the other processes "
                              "failed: %s", rank, msg);
    return FSDP_STATUS_OK;
}
