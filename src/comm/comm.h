/*
 * comm.h - the collectives interface, bound to one rank.
 *
 * Implementations ("transports"): `host` (cpu ranks: shared memory among
 * the rank threads, comm/host.c), `meta` (counts bytes, moves nothing), and
 * on cuda `nccl` and `peer` (comm/cuda_comm.h). Which one a run uses is
 * decided in one place, comm/transport.h. The generic wrappers count bytes
 * (one formula for every backend, below), call the fault hook through the
 * backend, and skip NULL slots.
 *
 * Buffers live on the rank's device. Calls are asynchronous on stream s
 * (NULL = the device's comm stream) and complete in issue order on that
 * stream; on host and meta they complete before returning. Every rank must
 * issue the same collectives in the same order with the same sizes.
 *
 * Sums are added in a fixed balanced binary tree over ranks:
 *   tree(lo, hi) = tree(lo, mid) + tree(mid, hi), mid = lo + (hi - lo) / 2,
 * accumulated in fp32 for bf16 data (then rounded once), so results do not
 * depend on timing and match fsdp_tree_sum() exactly.
 *
 * Bytes counted per rank (S = bytes of the full buffer, c = S / N):
 *   all_gather      sent c(N-1)      recv c(N-1)       (recv buffer is S)
 *   reduce_scatter  sent c(N-1)      recv c(N-1)       (send buffer is S)
 *   all_reduce      sent 2c(N-1)     recv 2c(N-1)      (c = S / N, integer division of S(N-1))
 *   broadcast       root sent S, others recv S
 * These are the logical counts, whatever the ranks' processes. Bytes that
 * really cross between processes (the `mpi` transport) are counted apart,
 * in bytes_inter_*, once per process on its first local rank (the one that
 * moves them), so their sum over ranks is the job's inter-process traffic;
 * fsdp_comm_mpi_inter_bytes (comm/mpi_coll.h) gives them for any layout.
 */
#ifndef FSDP_COMM_COMM_H
#define FSDP_COMM_COMM_H

#include "device/device.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum fsdp_reduce_op { FSDP_REDUCE_SUM = 0, FSDP_REDUCE_AVG } fsdp_reduce_op;

typedef enum fsdp_coll_kind {
    FSDP_COLL_ALL_GATHER = 0,
    FSDP_COLL_REDUCE_SCATTER,
    FSDP_COLL_ALL_REDUCE,
    FSDP_COLL_BROADCAST,
    FSDP_COLL_KIND_COUNT
} fsdp_coll_kind;

const char *fsdp_coll_kind_name(fsdp_coll_kind k);

typedef struct fsdp_comm fsdp_comm;

struct fsdp_comm_i {
    const char *name;
    /* recv[r * numel .. (r+1) * numel) = send of rank r. send may alias
     * recv + rank * numel (in place). */
    fsdp_status (*all_gather)(fsdp_comm *c, const void *send, void *recv, size_t numel,
                              fsdp_dtype dt, fsdp_stream_t s);
    /* recv[0..numel) = op over ranks of send[rank * numel .. (rank+1) * numel). */
    fsdp_status (*reduce_scatter)(fsdp_comm *c, const void *send, void *recv, size_t numel,
                                  fsdp_dtype dt, fsdp_reduce_op op, fsdp_stream_t s);
    /* recv[0..numel) = op over ranks of send[0..numel); send may equal recv. */
    fsdp_status (*all_reduce)(fsdp_comm *c, const void *send, void *recv, size_t numel,
                              fsdp_dtype dt, fsdp_reduce_op op, fsdp_stream_t s);
    /* buf[0..numel) of every rank = buf of rank root. */
    fsdp_status (*broadcast)(fsdp_comm *c, void *buf, size_t numel, fsdp_dtype dt, int root,
                             fsdp_stream_t s);
    /* All ranks arrive before any leaves (and prior stream work is done). */
    fsdp_status (*barrier)(fsdp_comm *c);
    void (*fini)(fsdp_comm *c);
};

struct fsdp_comm {
    const struct fsdp_comm_i *iface;
    fsdp_world *world;
    fsdp_device *dev;
    int rank, n_ranks;
    size_t bytes_sent[FSDP_COLL_KIND_COUNT];  /* since init or the last reset */
    size_t bytes_recv[FSDP_COLL_KIND_COUNT];
    size_t n_calls[FSDP_COLL_KIND_COUNT];
    size_t bytes_inter_sent[FSDP_COLL_KIND_COUNT]; /* to other processes (see above) */
    size_t bytes_inter_recv[FSDP_COLL_KIND_COUNT]; /* from other processes */
    void *ctx;                                 /* implementation private */
};

/* Host collectives among cpu rank threads. All ranks of `w` must call it
 * (on their own threads) before the first collective. */
fsdp_status fsdp_comm_host_init(fsdp_comm *c, fsdp_world *w, fsdp_device *dev, int rank);
/* Meta collectives: count bytes only. */
fsdp_status fsdp_comm_meta_init(fsdp_comm *c, fsdp_world *w, fsdp_device *dev, int rank);
void fsdp_comm_fini(fsdp_comm *c);

fsdp_status fsdp_comm_all_gather(fsdp_comm *c, const void *send, void *recv, size_t numel,
                                 fsdp_dtype dt, fsdp_stream_t s);
fsdp_status fsdp_comm_reduce_scatter(fsdp_comm *c, const void *send, void *recv, size_t numel,
                                     fsdp_dtype dt, fsdp_reduce_op op, fsdp_stream_t s);
fsdp_status fsdp_comm_all_reduce(fsdp_comm *c, const void *send, void *recv, size_t numel,
                                 fsdp_dtype dt, fsdp_reduce_op op, fsdp_stream_t s);
fsdp_status fsdp_comm_broadcast(fsdp_comm *c, void *buf, size_t numel, fsdp_dtype dt, int root,
                                fsdp_stream_t s);
fsdp_status fsdp_comm_barrier(fsdp_comm *c);

/* Zero the byte and call counters (inter-process ones included). */
void fsdp_comm_reset_stats(fsdp_comm *c);
size_t fsdp_comm_total_sent(const fsdp_comm *c);
size_t fsdp_comm_total_recv(const fsdp_comm *c);

/* The reference tree: sum of x[0..n) in the balanced binary tree order
 * above, in fp32. Used by the host collectives per element and by the
 * engine for losses and norm partial sums. */
float fsdp_tree_sum(const float *x, int n);

#ifdef __cplusplus
}
#endif

#endif /* FSDP_COMM_COMM_H */
