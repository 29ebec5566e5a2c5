/*
 * mpi_tree.h - comm.h's fixed summation tree over global ranks, cut at
 * process boundaries, for the collectives across processes
 * (comm/mpi_coll.c).
 *
 * Sums over N = P x L ranks (P processes of L ranks, process q holding
 * ranks [qL, qL + L)) must be bit-identical to fsdp_tree_sum over the N
 * per-rank values, whatever P and L are. MPI's reductions promise no
 * order, so the processes exchange pieces and add them in that tree:
 * walking the tree down from (0, N), the first node that lies inside one
 * process is that process's to compute (its "nodes"); the others receive
 * its value, a partial sum in fp32 (or, for a single rank, the rank's own
 * input in its dtype, since widening bf16 to fp32 is exact), and finish
 * the sum above the nodes. When P is a power of two, each process has one
 * node (its whole block) and sends one partial per element; otherwise a
 * process may have up to ~2 log2 N nodes. The values are the same either
 * way: every addition of the tree is done, in the same order, on the same
 * fp32 operands.
 *
 * Payloads: a chunk of `len` elements carries every node of its process
 * in node order, node k taking round16(width_k x len) bytes (width: the
 * dtype's size for one rank, else 4), so fp32 partials stay aligned.
 */
#ifndef FSDP_COMM_MPI_TREE_H
#define FSDP_COMM_MPI_TREE_H

#include <stddef.h>

#include "fsdp/fsdp.h"

/* Most nodes of one process: 2 per tree level is enough for 1024 ranks. */
#define FSDP_MPI_COVER_MAX 24
/* Elements summed per step of the tree evaluation (scratch per level). */
#define FSDP_MPI_BLOCK 2048

typedef struct fsdp_mpi_cover {
    int n_procs, n_local;
    int *n_nodes;  /* (n_procs,) */
    int *node_lo;  /* (n_procs, FSDP_MPI_COVER_MAX) first global rank of node k */
    int *node_hi;  /* (n_procs, FSDP_MPI_COVER_MAX) one past its last */
    int depth;     /* levels of the global tree: scratch vectors an evaluation needs */
} fsdp_mpi_cover;

/* The nodes of every process for N = n_procs x n_local ranks. OOM only. */
fsdp_status fsdp_mpi_cover_init(fsdp_mpi_cover *cv, int n_procs, int n_local);
void fsdp_mpi_cover_fini(fsdp_mpi_cover *cv);

/* Bytes per element of node k of process q's payload. */
size_t fsdp_mpi_node_width(const fsdp_mpi_cover *cv, int q, int k, fsdp_dtype dt);
/* Offset of node k within process q's payload for a chunk of len
 * elements; k = n_nodes[q] gives the payload's size. */
size_t fsdp_mpi_node_off(const fsdp_mpi_cover *cv, int q, int k, fsdp_dtype dt, size_t len);

/* One block of a tree evaluation: elements [off, off + n) of a chunk of
 * len elements. leaf[j]: local rank j's input at the chunk's element 0
 * (dtype dt). remote[q]: the start of process q's payload for this chunk
 * (ignored for q == me). */
typedef struct fsdp_mpi_tree_job {
    const fsdp_mpi_cover *cv;
    int me;
    fsdp_dtype dt;
    const void *const *leaf;             /* (n_local,) */
    const unsigned char *const *remote;  /* (n_procs,) */
    size_t len, off, n;
} fsdp_mpi_tree_job;

/* The fp32 sum of the block over global ranks [lo, hi), a node of the
 * global tree that is this process's or contains another process's
 * nodes whole. Returns dst or a pointer into an input/payload; tmp holds
 * cv->depth scratch vectors of FSDP_MPI_BLOCK floats, distinct from dst. */
const float *fsdp_mpi_tree_eval(const fsdp_mpi_tree_job *j, int lo, int hi, float *dst,
                                float *const *tmp);

#endif /* FSDP_COMM_MPI_TREE_H */
