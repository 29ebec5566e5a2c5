/*
 * mpi_coll.h - the `mpi` transport: collectives among cpu ranks spread
 * over the processes of a job (comm/procs.h), bit-identical to the `host`
 * transport of one process with the same number of ranks.
 */
#ifndef FSDP_COMM_MPI_COLL_H
#define FSDP_COMM_MPI_COLL_H

#include "comm/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Per-rank init on the rank's thread; every local rank of w calls it
 * before the first collective, and every process of the job creates its
 * communicators in the same order. The world's procs must carry data
 * (procs xfer): under a rendezvous directory it is UNSUPPORTED. A world
 * of one process works too (nothing leaves the process). */
fsdp_status fsdp_comm_mpi_init(fsdp_comm *c, fsdp_world *w, fsdp_device *dev, int rank);
/* The same over group g (comm.h), `rank` global: every member calls it.
 * The group must hold the same number of consecutive members in each
 * process it touches (INVALID_ARG otherwise); one inside a single process
 * gets the host transport. */
fsdp_status fsdp_comm_mpi_init_group(fsdp_comm *c, fsdp_world *w, fsdp_device *dev,
                                     const fsdp_comm_group *g, int rank);

#ifdef __cplusplus
}
#endif

#endif /* FSDP_COMM_MPI_COLL_H */
