/*
 * cuda_comm.h - internal pieces of the CUDA collectives (comm/nccl.cu,
 * comm/peer.cu): their init functions, and the host rendezvous they use to
 * hand pointers, CUDA events and NCCL ids between the rank threads
 * (comm/rdv.c, plain C, so it is also built and tested without CUDA).
 *
 * Rendezvous: one object per world, hung off world->rdv_shared, created by
 * the first rank that attaches and freed by the last one that detaches.
 * fsdp_comm_rdv_exchange is an all-gather of one small record per rank
 * among every rank of the job: this process's rank threads and, in a job
 * of several processes, the others' (through comm/procs.h). Every rank
 * must call it the same number of times, in the same order.
 */
#ifndef FSDP_COMM_CUDA_COMM_H
#define FSDP_COMM_CUDA_COMM_H

#include <stdbool.h>
#include <stddef.h>

#include "comm/comm.h"
#include "device/cuda_world.h"

#ifdef __cplusplus
extern "C" {
#endif

/* NCCL among the GPUs of group g's ranks (one rank per GPU); `rank` is
 * global. Every rank of the job calls it on its own thread after
 * fsdp_device_init, at the same time, each for its own group (one exchange
 * carries every group's id). UNSUPPORTED without CUDA and NCCL. */
fsdp_status fsdp_comm_nccl_init_group(fsdp_comm *c, fsdp_world *w, fsdp_device *dev,
                                      const fsdp_comm_group *g, int rank);
/* Peer copies between the buffers of group g's ranks (several ranks may
 * share a GPU). Same calling rules; every rank of the job then issues its
 * groups' collectives in the same order (peer.cu). UNSUPPORTED without
 * CUDA. */
fsdp_status fsdp_comm_peer_init_group(fsdp_comm *c, fsdp_world *w, fsdp_device *dev,
                                      const fsdp_comm_group *g, int rank);

/* The same over every rank of the job. */
static inline fsdp_status fsdp_comm_nccl_init(fsdp_comm *c, fsdp_world *w, fsdp_device *dev,
                                              int rank)
{
    fsdp_comm_group g = fsdp_comm_group_all(fsdp_cuda_world_n_ranks(w));
    return fsdp_comm_nccl_init_group(c, w, dev, &g, rank);
}
static inline fsdp_status fsdp_comm_peer_init(fsdp_comm *c, fsdp_world *w, fsdp_device *dev,
                                              int rank)
{
    fsdp_comm_group g = fsdp_comm_group_all(fsdp_cuda_world_n_ranks(w));
    return fsdp_comm_peer_init_group(c, w, dev, &g, rank);
}

/* Largest record fsdp_comm_rdv_exchange carries per rank. */
#define FSDP_RDV_REC_MAX 256

typedef struct fsdp_comm_rdv fsdp_comm_rdv;

/* Join w's rendezvous (creating it if this is the first rank). */
fsdp_status fsdp_comm_rdv_attach(fsdp_world *w, fsdp_comm_rdv **out);
/* Leave it; the last rank to leave frees it. NULL is a no-op. */
void fsdp_comm_rdv_detach(fsdp_world *w, fsdp_comm_rdv *r);

/* Publish `bytes` (<= FSDP_RDV_REC_MAX) from `mine` as this (local) rank's
 * record, wait for every rank's record of the same exchange, and copy them
 * to all[0 .. n_ranks * bytes) in global rank order. abortable: return
 * ABORTED (this rank's record withdrawn) if the world is aborted before
 * every local rank arrived; non-abortable waits are for exchanges that
 * every rank is certain to reach (see peer.cu). The part with the other
 * processes always polls the abort flag and the peer timeout; its failure
 * is every local rank's. */
fsdp_status fsdp_comm_rdv_exchange(fsdp_comm_rdv *r, fsdp_world *w, int rank, const void *mine,
                                   size_t bytes, void *all, bool abortable);

#ifdef __cplusplus
}
#endif

#endif /* FSDP_COMM_CUDA_COMM_H */
