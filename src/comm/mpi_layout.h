/*
 * mpi_layout.h - where the bytes of one collective of the `mpi` transport
 * go between processes (comm/mpi_coll.c): which part of the staging
 * buffers each other process is sent or sends, for a job of P processes of
 * L ranks, as seen by one process. Shared with the inter-process byte
 * formula (fsdp_comm_mpi_inter_bytes), so what is counted is what moves.
 *
 *   all_gather      my L chunks to every other process; their L chunks back
 *   broadcast       the root's process sends the buffer to every other one
 *   reduce_scatter  for each of process q's L chunks, my nodes' payloads
 *                   (mpi_tree.h) to q; theirs for my chunks back
 *   all_reduce      round 1: as reduce_scatter over N slices (slice g for
 *                   global rank g); round 2: my L finished slices to every
 *                   other process, theirs back
 *   barrier         nothing (the headers alone)
 */
#ifndef FSDP_COMM_MPI_LAYOUT_H
#define FSDP_COMM_MPI_LAYOUT_H

#include <stdbool.h>

#include "comm/comm.h"
#include "comm/mpi_tree.h"

/* Round 1: region q of the send stage goes to process q, region q of the
 * recv stage comes from it (the regions of several processes may be the
 * same bytes when every one gets the same data). Round 2 (all_reduce):
 * one send region for every process, one recv region from each. Bytes. */
typedef struct fsdp_mpi_layout {
    size_t *s_off, *s_len, *r_off, *r_len; /* (n_procs,) round 1 */
    size_t *r2_off, *r2_len;               /* (n_procs,) round 2 */
    size_t s2_off, s2_len;
    size_t send_bytes, recv_bytes;         /* staging this collective needs */
} fsdp_mpi_layout;

fsdp_status fsdp_mpi_layout_alloc(fsdp_mpi_layout *l, int n_procs);
void fsdp_mpi_layout_free(fsdp_mpi_layout *l);

/* Lay out one collective (kind: fsdp_coll_kind, or any other value for a
 * barrier) of process me. */
void fsdp_mpi_layout_of(const fsdp_mpi_cover *cv, int me, int kind, size_t numel, fsdp_dtype dt,
                        int root, fsdp_mpi_layout *l);

/* The payload bytes process me of n_procs sends to and receives from the
 * others under layout l (both rounds). */
void fsdp_mpi_layout_inter_bytes(const fsdp_mpi_layout *l, int n_procs, int me, size_t *sent,
                                 size_t *recv);

/* The payload bytes one process sends to and receives from the others
 * for one collective (what the `mpi` transport counts in bytes_inter_*;
 * per-message headers are not counted): a job of n_processes processes of
 * n_local ranks, `process` being the one asked about, numel and dt as
 * passed to the collective, root the broadcast's global root. For the
 * planner, which lays out any job on paper. OOM or INVALID_ARG only. */
fsdp_status fsdp_comm_mpi_inter_bytes(fsdp_coll_kind kind, size_t numel, fsdp_dtype dt,
                                      int n_processes, int n_local, int process, int root,
                                      size_t *sent, size_t *recv);

/* First element of all_reduce slice g (one slice per global rank, the
 * last ones shorter or empty). */
size_t fsdp_mpi_slice_start(size_t numel, int n_ranks, int g);
/* Elements of chunk j of process `to` (reduce_scatter: numel; all_reduce:
 * slice to * L + j). */
size_t fsdp_mpi_chunk_len(int kind, size_t numel, int n_ranks, int n_local, int to, int j);
/* Offset of process q's payloads for chunk j of process `to` in the
 * region q sends `to` (j = L: the region's size). */
size_t fsdp_mpi_chunk_off(const fsdp_mpi_cover *cv, int kind, size_t numel, fsdp_dtype dt, int q,
                          int to, int j);

#endif /* FSDP_COMM_MPI_LAYOUT_H */
