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
 * stream; on meta, and on host and mpi where the cpu backend runs stream
 * work inline, they complete before returning (and return their failure);
 * in the cpu backend's async mode host and mpi collectives run on the
 * stream's worker thread and a failure surfaces at the next sync. Every
 * rank must issue the same collectives in the same order with the same
 * sizes.
 *
 * Sums are added in a fixed balanced binary tree over ranks:
 *   tree(lo, hi) = tree(lo, mid) + tree(mid, hi), mid = lo + (hi - lo) / 2,
 * accumulated in fp32 for bf16 data (then rounded once), so results do not
 * depend on timing and match fsdp_tree_sum() (core/tree_sum.h) exactly.
 *
 * Groups: a communicator spans a group of the job's ranks, the global ranks
 * first + i * stride for i = 0 .. count - 1 (fsdp_comm_group); its `rank`
 * is i and its n_ranks is count, so everything below speaks of group
 * ranks. The group of every rank (first 0, stride 1, count n_ranks) is
 * the usual one; hybrid sharding uses the ranks of one node (stride 1)
 * and the ranks with the same local index on every node (stride = ranks
 * per node). Collectives of different groups may run at the same time.
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
 * fsdp_comm_mpi_inter_bytes (comm/mpi_layout.h) gives them for any layout.
 * The `meta` transport counts the same for the nodes its group says
 * (node_ranks), so a plan of P nodes in one process shows the bytes a job
 * of P processes moves between them.
 */
#ifndef FSDP_COMM_COMM_H
#define FSDP_COMM_COMM_H

#include "core/tree_sum.h"
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
    FSDP_COLL_KIND_COUNT,
    /* not counted in the per-kind statistics: the kind a transport gives a
     * barrier in its records and messages */
    FSDP_COLL_BARRIER = FSDP_COLL_KIND_COUNT
} fsdp_coll_kind;

/* "all_gather", ..., "broadcast", "barrier" (FSDP_COLL_BARRIER); "?" for
 * anything else. */
const char *fsdp_coll_kind_name(int kind);

/* Whether a collective of `kind` reduces (its reduce op matters). */
static inline bool fsdp_coll_kind_is_reduction(int kind)
{
    return kind == FSDP_COLL_REDUCE_SCATTER || kind == FSDP_COLL_ALL_REDUCE;
}

/* The ranks of a communicator: global ranks first + i * stride, i = 0 ..
 * count - 1; member i is the communicator's rank i. node_ranks: ranks per
 * node of the job, for the inter-node byte counts of `meta` (0: a node
 * per process of the world). */
typedef struct fsdp_comm_group {
    int first, stride, count;
    int node_ranks;
} fsdp_comm_group;

/* Every rank of a job of n_ranks. */
static inline fsdp_comm_group fsdp_comm_group_all(int n_ranks)
{
    return (fsdp_comm_group){0, 1, n_ranks, 0};
}

/* Global rank of member i. */
static inline int fsdp_comm_group_rank(const fsdp_comm_group *g, int i)
{
    return g->first + i * g->stride;
}

/* Member index of global rank `rank`, or -1 if it is not a member. */
int fsdp_comm_group_index(const fsdp_comm_group *g, int rank);

/* How g's members sit on nodes of node_ranks ranks each (node of global
 * rank r: r / node_ranks): *n_blocks blocks of *per_block consecutive
 * members, block k on node nodes[k] (nodes: room for g->count), each node
 * holding one block. INVALID_ARG for a group not laid out so. */
fsdp_status fsdp_comm_group_layout(const fsdp_comm_group *g, int node_ranks, int *n_blocks,
                                   int *per_block, int *nodes);

/* INVALID_ARG unless g is a group of w's n_ranks ranks (count >= 1,
 * stride >= 1, every member in range) that holds `rank`; names `who`. */
fsdp_status fsdp_comm_group_check(const fsdp_comm_group *g, const fsdp_world *w, int rank,
                                  const char *who);

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
    /* The collectives are host code (host, mpi): the wrappers run them in
     * stream order through fsdp_device_launch_host, so they run on the
     * stream's worker thread in the cpu backend's async mode, and a
     * barrier first waits for the device's streams. false: the transport
     * queues device work on the stream itself (nccl, peer), or has nothing
     * to do (meta). */
    bool host_code;
    /* The collectives move nothing and never wait (meta): no flight-recorder
     * entry (core/flight.h), which the planner's thousands of meta steps
     * would otherwise pay for on every collective. */
    bool inert;
};

struct fsdp_comm {
    const struct fsdp_comm_i *iface;
    fsdp_world *world;
    fsdp_device *dev;
    int rank, n_ranks;                         /* within the group */
    fsdp_comm_group group;
    int global_rank;                           /* the job's rank of this member */
    size_t bytes_sent[FSDP_COLL_KIND_COUNT];  /* since init or the last reset */
    size_t bytes_recv[FSDP_COLL_KIND_COUNT];
    size_t n_calls[FSDP_COLL_KIND_COUNT];
    size_t bytes_inter_sent[FSDP_COLL_KIND_COUNT]; /* to other processes (see above) */
    size_t bytes_inter_recv[FSDP_COLL_KIND_COUNT]; /* from other processes */
    char label[96];                            /* names the next collective (fsdp_comm_label) */
    long flight_seq;                           /* the flight record's entry (core/flight.h) of
                                                * the collective running, written by the
                                                * thread that runs it before its waits */
    void *ctx;                                 /* implementation private */
};

/* Fill c for a transport's communicator over group g, for member `rank`
 * (a global rank of g): c->rank is its index in g; ctx is the transport's
 * own state. The statistics are left as they are. */
void fsdp_comm_bind(fsdp_comm *c, const struct fsdp_comm_i *iface, fsdp_world *w,
                    fsdp_device *dev, const fsdp_comm_group *g, int rank, void *ctx);

/* The first checks every transport makes as its collective number k, of
 * `kind` (FSDP_COLL_BARRIER included), starts on c's member `rank` (the
 * rank its messages name): the world's fault hook (FSDP_FAULT_COLLECTIVE:
 * INTERNAL, "injected failure in collective k (kind)"; FSDP_FAULT_STALL:
 * the collective never arrives: it waits until the world is aborted and
 * returns ABORTED), then, but for a
 * barrier, the arguments: a known dtype and reduce op, a root inside the
 * world, no NULL buffer under a non-empty collective (a broadcast reads
 * only recv): INVALID_ARG. Nothing is published; OK lets it go on. */
fsdp_status fsdp_comm_begin_check(const fsdp_comm *c, int rank, long k, int kind,
                                  const void *send, const void *recv, size_t numel,
                                  fsdp_dtype dt, fsdp_reduce_op op, int root);

/* Group g as a short list of global ranks into buf ("ranks 0-3", "ranks 1,
 * 3, 5, 7", "rank 2"). Returns buf. */
const char *fsdp_comm_group_format(const fsdp_comm_group *g, char *buf, size_t n);

/* What every rank of a collective must issue alike (buffers aside): a
 * transport publishes its rank's and compares them with
 * fsdp_coll_args_check once all have arrived. */
typedef struct fsdp_coll_args {
    int kind;          /* fsdp_coll_kind, or FSDP_COLL_BARRIER */
    fsdp_dtype dt;
    fsdp_reduce_op op; /* compared for reductions only */
    int root;          /* compared for broadcasts only */
    size_t numel;
} fsdp_coll_args;

/* Whether a and b are the same collective: kind, numel and dtype, the root
 * of a broadcast, the op of a reduce_scatter or all_reduce. */
bool fsdp_coll_args_match(const fsdp_coll_args *a, const fsdp_coll_args *b);

/* "all_reduce(1024 x f32, op 0, root 0)" into buf (n bytes, truncated). */
void fsdp_coll_args_format(const fsdp_coll_args *a, char *buf, size_t n);

/* OK if theirs matches mine; else INVALID_ARG, "rank <rank>: collective k
 * mismatch: this rank issued <mine> but rank <other> issued <theirs>; every
 * rank must issue ...". rank and other are the ranks the message names. */
fsdp_status fsdp_coll_args_check(int rank, long k, const fsdp_coll_args *mine, int other,
                                 const fsdp_coll_args *theirs);

/* Host collectives among cpu rank threads of one process. All ranks of `w`
 * must call it (on their own threads) before the first collective. */
fsdp_status fsdp_comm_host_init(fsdp_comm *c, fsdp_world *w, fsdp_device *dev, int rank);
/* The same over group g (every member in this process); `rank` is global.
 * Every member calls it; groups of one world live side by side. */
fsdp_status fsdp_comm_host_init_group(fsdp_comm *c, fsdp_world *w, fsdp_device *dev,
                                      const fsdp_comm_group *g, int rank);
/* Meta collectives: count bytes only (inter-node bytes as comm.h says). */
fsdp_status fsdp_comm_meta_init(fsdp_comm *c, fsdp_world *w, fsdp_device *dev, int rank);
fsdp_status fsdp_comm_meta_init_group(fsdp_comm *c, fsdp_world *w, fsdp_device *dev,
                                      const fsdp_comm_group *g, int rank);
/* Waits first, with a host-code transport, for the work queued on the
 * device's streams (collectives still queued read c), then frees c's state. */
void fsdp_comm_fini(fsdp_comm *c);

/* The shared state of one group's communicators on one transport (`tag`:
 * any address the transport owns), kept in a registry hung off
 * w->comm_shared. Caller holds w->mu. slot: the state's address for (tag,
 * g), created NULL when new (NULL return: out of host memory); drop:
 * forget the entry (the transport frees the state). */
void **fsdp_comm_shared_slot_locked(fsdp_world *w, const void *tag, const fsdp_comm_group *g);
void fsdp_comm_shared_drop_locked(fsdp_world *w, const void *tag, const fsdp_comm_group *g);

/* Name the next collective issued on c ("unit 'h.3' all-gather"): its
 * failure message starts with the name, whether it fails at once or, run
 * on a stream's thread (cpu async streams), at the next sync. Used once. */
void fsdp_comm_label(fsdp_comm *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The same with a finished string (no formatting: hot paths). */
void fsdp_comm_label_str(fsdp_comm *c, const char *label);

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

#ifdef __cplusplus
}
#endif

#endif /* FSDP_COMM_COMM_H */
