/*
 * rdv.c - the host rendezvous of the CUDA collectives (contract in
 * comm/cuda_comm.h): an all-gather of one small record per rank among the
 * rank threads of a world.
 *
 * Exchange g writes its records into buffer g % 2 and completes when the
 * last rank arrives (it bumps the generation and wakes the others). Waiters
 * copy the records out under the world's mutex. Two buffers suffice: a rank
 * can only start writing exchange g + 2 into buffer g % 2 after exchange
 * g + 1 completed, which needs every rank, so every rank has already copied
 * out exchange g. A waiter that gives up on abort withdraws its arrival, so
 * the counts stay right for a later launch of the same world.
 */
#include <string.h>

#include "comm/cuda_comm.h"
#include "core/world.h"

struct fsdp_comm_rdv {
    int n_ranks;
    int refs;               /* attached ranks */
    unsigned long gen;      /* completed exchanges */
    int arrived;            /* ranks arrived at exchange `gen` */
    unsigned char *recs;    /* [2][n_ranks][FSDP_RDV_REC_MAX] */
};

fsdp_status fsdp_comm_rdv_attach(fsdp_world *w, fsdp_comm_rdv **out)
{
    fsdp_status st = FSDP_STATUS_OK;
    *out = NULL;
    pthread_mutex_lock(&w->mu);
    fsdp_comm_rdv *r = w->rdv_shared;
    if (!r) {
        r = calloc(1, sizeof *r);
        unsigned char *recs = calloc(2 * (size_t)w->n_ranks, FSDP_RDV_REC_MAX);
        if (!r || !recs) {
            free(r);
            free(recs);
            pthread_mutex_unlock(&w->mu);
            return fsdp_error_set(FSDP_STATUS_OOM,
                                  "out of host memory creating the rendezvous of %d ranks",
                                  w->n_ranks);
        }
        r->n_ranks = w->n_ranks;
        r->recs = recs;
        w->rdv_shared = r;
    }
    r->refs++;
    *out = r;
    pthread_mutex_unlock(&w->mu);
    return st;
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
        free(r);
    }
    pthread_mutex_unlock(&w->mu);
}

fsdp_status fsdp_comm_rdv_exchange(fsdp_comm_rdv *r, fsdp_world *w, int rank, const void *mine,
                                   size_t bytes, void *all, bool abortable)
{
    FSDP_ASSERT(bytes <= FSDP_RDV_REC_MAX && rank >= 0 && rank < r->n_ranks);
    const size_t half = (size_t)r->n_ranks * FSDP_RDV_REC_MAX;
    pthread_mutex_lock(&w->mu);
    unsigned long g = r->gen;
    unsigned char *buf = r->recs + (g & 1) * half;
    memcpy(buf + (size_t)rank * FSDP_RDV_REC_MAX, mine, bytes);
    if (++r->arrived == r->n_ranks) {
        r->arrived = 0;
        r->gen++;
        pthread_cond_broadcast(&w->cv);
    } else {
        while (r->gen == g && !(abortable && fsdp_world_aborted(w)))
            fsdp_world_wait_locked(w);
    }
    bool done = r->gen != g;
    if (done) {
        for (int q = 0; q < r->n_ranks; q++)
            memcpy((unsigned char *)all + (size_t)q * bytes, buf + (size_t)q * FSDP_RDV_REC_MAX,
                   bytes);
    } else {
        r->arrived--;
    }
    pthread_mutex_unlock(&w->mu);
    if (!done)
        return fsdp_error_set(FSDP_STATUS_ABORTED,
                              "rank %d: aborted while waiting for the other ranks' collective "
                              "handshake: another rank failed",
                              rank);
    return FSDP_STATUS_OK;
}
