/*
 * nccl.cu - the `nccl` collectives: one NCCL communicator per rank thread,
 * one rank per GPU (NCCL cannot put two ranks of a communicator on one
 * GPU; use `peer` for virtual ranks).
 *
 * Setup: member 0 of the group (comm.h: the whole job, or for hybrid
 * sharding a node's ranks or one rank of every node) creates the
 * ncclUniqueId and hands it to the others through the host rendezvous
 * (comm/rdv.c): the rank threads of this process and, in a job of several
 * processes (one per node), the other processes through MPI or the
 * rendezvous directory (comm/procs.h), so one communicator spans the group
 * wherever its ranks live. Every rank of the job takes part in that
 * exchange, each publishing its own group (the groups of one split are
 * set up at the same time: the engine makes the node groups, then the
 * cross groups, on every rank), so one exchange serves every group. Every
 * rank's host and GPU (PCI bus id) travel with it, so a GPU given to two
 * members of a group is refused by every member alike before NCCL sees it.
 * Each rank thread then calls ncclCommInitRankConfig on its own device
 * with a NON-BLOCKING config, so no host thread ever
 * blocks inside NCCL: init, every call and finalisation return at once (or
 * ncclInProgress) and this file polls ncclCommGetAsyncError, checking the
 * world's abort flag between polls. After init every rank passes a world
 * barrier, so no rank queues work while another is still setting up.
 *
 * Abort: a queued NCCL kernel that waits for a rank that will never come
 * spins for ever, and cudaFree (which waits for the whole device) would
 * then hang teardown. So the communicator is aborted (ncclCommAbort, which
 * ends such kernels) the moment this rank sees the world's abort flag or
 * an NCCL error: in this file's polls, and, through the stop hook each
 * communicator registers for its rank at init (core/world.h), in the cuda
 * device's stream and event waits and in teardown's fsdp_world_rank_stop, which runs before any
 * device memory is freed. Later calls on an aborted communicator fail.
 * When this rank's own failure ends its communicator (an NCCL error, the
 * fault hook, a failed rank's teardown), the world is failed first, so the
 * other ranks abort theirs at the same time: some NCCL versions make
 * ncclCommAbort wait for every rank of the node.
 * Teardown order: fsdp_world_rank_stop (after a failure or abort), then
 * fsdp_comm_fini, then free device memory and fsdp_device_fini. fini ends
 * the communicator gracefully (ncclCommFinalize, which waits for every
 * rank) unless the world is aborted or this communicator failed; so a rank
 * whose step failed must tell the world before its teardown
 * (fsdp_world_rank_stop with its status), or fini waits for ranks that
 * wait for it.
 *
 * Sums are NCCL's (ring/tree order chosen by NCCL): deterministic for a
 * fixed topology, size and NCCL version, but not comm.h's fixed tree, so
 * results are not bit-identical across world sizes (use --comm peer for
 * that); with one rank they are exact copies. AVG is ncclAvg.
 *
 * A barrier meets on the job's rendezvous, so on a communicator over part
 * of the job every rank of the job calls it at the same point (each on its
 * own group); the engine only calls the whole job's. Messages name the
 * job's rank (c->global_rank), not the index in the group.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <nccl.h>

#include "comm/cuda_comm.h"
#include "core/log.h"
#include "device/cuda_check.h"
#include "device/cuda_world.h"

struct nccl_ctx {
    ncclComm_t comm;     /* NULL once aborted */
    fsdp_comm_rdv *rdv;
    char *tokens;        /* (ranks of the job,) the barrier's records */
    bool broken;         /* an NCCL error or an abort: no more calls */
    bool stop_hook;      /* registered as the rank's stop hook */
    long n_coll;
};

/* What a rank publishes at setup (at most FSDP_RDV_REC_MAX bytes). */
struct nccl_rec {
    int ordinal;
    int backend;
    int status;          /* a group's member 0: whether ncclGetUniqueId worked */
    int first, stride, count; /* the rank's group */
    ncclUniqueId id;     /* a group's member 0: the group's */
    char host[64];       /* where the rank runs */
    char bus[32];        /* its GPU's PCI bus id ("" if unknown) */
};
static_assert(sizeof(struct nccl_rec) <= FSDP_RDV_REC_MAX, "nccl_rec outgrew the rendezvous");

/* Whether ranks a and b were given the same GPU. */
static bool same_gpu(const struct nccl_rec *a, const struct nccl_rec *b)
{
    if (strcmp(a->host, b->host))
        return false;
    return a->bus[0] && b->bus[0] ? !strcmp(a->bus, b->bus) : a->ordinal == b->ordinal;
}

static void nccl_nap(unsigned *spins)
{
    if (++*spins < 200)
        return;
    struct timespec ts = {0, *spins < 2000 ? 20 * 1000 : 200 * 1000};
    nanosleep(&ts, NULL);
}

/* End the communicator now (ncclCommAbort also ends this rank's queued
 * NCCL kernels); every later call fails. Idempotent. */
static void nccl_abort_now(fsdp_comm *c)
{
    struct nccl_ctx *p = (struct nccl_ctx *)c->ctx;
    p->broken = true;
    if (p->comm) {
        ncclCommAbort(p->comm);
        p->comm = NULL;
    }
}

/* The rank's stop hook (core/world.h): runs on this rank's thread. */
static void nccl_stop_hook(void *arg) { nccl_abort_now((fsdp_comm *)arg); }

/* This rank failed with st (its message set): tell the world first, so the
 * other ranks abort their communicators too (some NCCL versions make
 * ncclCommAbort wait for every rank of the node), then end this one. The
 * world's stop call runs the stop hook; without a world, or before the
 * hook is registered, the abort is direct. Returns st. */
static fsdp_status nccl_fail(fsdp_comm *c, fsdp_status st)
{
    fsdp_cuda_world_rank_stop(c->world, c->global_rank, st);
    nccl_abort_now(c);
    return st;
}

static ncclDataType_t nccl_type(fsdp_dtype dt)
{
    return dt == FSDP_DTYPE_BF16 ? ncclBfloat16 : ncclFloat32;
}

/* Wait until the communicator has no operation in progress. what: a phrase
 * for messages ("all_gather"). */
static fsdp_status nccl_settle(fsdp_comm *c, const char *what)
{
    struct nccl_ctx *p = (struct nccl_ctx *)c->ctx;
    unsigned spins = 0;
    time_t t0 = time(NULL);
    bool warned = false;
    for (;;) {
        ncclResult_t state = ncclSuccess;
        if (!p->comm)
            return fsdp_error_set(FSDP_STATUS_ABORTED,
                                  "rank %d: NCCL %s: the communicator was aborted", c->global_rank,
                                  what);
        ncclResult_t rc = ncclCommGetAsyncError(p->comm, &state);
        if (rc != ncclSuccess)
            return nccl_fail(c, fsdp_error_set(FSDP_STATUS_NCCL,
                                               "rank %d (GPU %d): NCCL %s: querying the "
                                               "communicator failed: %s",
                                               c->global_rank, c->dev->ordinal, what,
                                               ncclGetErrorString(rc)));
        if (state == ncclSuccess)
            return FSDP_STATUS_OK;
        if (state != ncclInProgress)
            return nccl_fail(c, fsdp_error_set(FSDP_STATUS_NCCL,
                                               "rank %d (GPU %d): NCCL %s failed: %s (%s); set "
                                               "NCCL_DEBUG=WARN for NCCL's own report",
                                               c->global_rank, c->dev->ordinal, what,
                                               ncclGetErrorString(state),
                                               ncclGetLastError(p->comm)));
        if (fsdp_cuda_world_aborted(c->world)) {
            nccl_abort_now(c);
            return fsdp_error_set(FSDP_STATUS_ABORTED,
                                  "rank %d: NCCL %s abandoned: another rank failed", c->global_rank,
                                  what);
        }
        if (!warned && time(NULL) - t0 >= 60) {
            warned = true;
            FSDP_WARN(FSDP_SUB_COMM,
                      "rank %d: NCCL %s has waited 60 s for the other ranks; if one of them "
                      "failed without telling the world (fsdp_world_rank_stop), it never ends",
                      c->global_rank, what);
        }
        nccl_nap(&spins);
    }
}

/* Fault hook, argument checks and the state checks every collective does. */
static fsdp_status nccl_begin(fsdp_comm *c, const char *what, fsdp_dtype dt, fsdp_reduce_op op)
{
    struct nccl_ctx *p = (struct nccl_ctx *)c->ctx;
    long k = ++p->n_coll;
    if (fsdp_cuda_world_fault_hit_collective(c->world, c->global_rank))
        return nccl_fail(c, fsdp_error_set(FSDP_STATUS_INTERNAL,
                                           "rank %d: injected failure in collective %ld (%s)",
                                           c->global_rank, k, what));
    if ((unsigned)dt >= FSDP_DTYPE_COUNT || (unsigned)op > FSDP_REDUCE_AVG)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "rank %d: %s: unknown dtype %d or reduce op %d", c->global_rank, what,
                              (int)dt, (int)op);
    if (p->broken)
        return fsdp_error_set(FSDP_STATUS_NCCL,
                              "rank %d: %s on a communicator that already failed or was aborted",
                              c->global_rank, what);
    if (fsdp_cuda_world_aborted(c->world)) {
        nccl_abort_now(c);
        return fsdp_error_set(FSDP_STATUS_ABORTED,
                              "rank %d: collective %ld (%s) not started: another rank failed",
                              c->global_rank, k, what);
    }
    return FSDP_STATUS_OK;
}

/* After issuing: an immediate error, or poll until the call is enqueued. */
static fsdp_status nccl_issued(fsdp_comm *c, const char *what, ncclResult_t rc)
{
    struct nccl_ctx *p = (struct nccl_ctx *)c->ctx;
    if (rc != ncclSuccess && rc != ncclInProgress)
        return nccl_fail(c, fsdp_error_set(FSDP_STATUS_NCCL,
                                           "rank %d (GPU %d): NCCL %s failed: %s (%s)",
                                           c->global_rank, c->dev->ordinal, what,
                                           ncclGetErrorString(rc), ncclGetLastError(p->comm)));
    return nccl_settle(c, what);
}

static fsdp_status nccl_all_gather(fsdp_comm *c, const void *send, void *recv, size_t numel,
                                   fsdp_dtype dt, fsdp_stream_t s)
{
    struct nccl_ctx *p = (struct nccl_ctx *)c->ctx;
    FSDP_TRY(nccl_begin(c, "all_gather", dt, FSDP_REDUCE_SUM));
    return nccl_issued(c, "all_gather",
                       ncclAllGather(send, recv, numel, nccl_type(dt), p->comm, (cudaStream_t)s));
}

static ncclRedOp_t nccl_op(fsdp_reduce_op op) { return op == FSDP_REDUCE_AVG ? ncclAvg : ncclSum; }

/* The two reductions: the same arguments, a different NCCL call. */
typedef ncclResult_t (*nccl_reduce_fn)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t,
                                       ncclComm_t, cudaStream_t);

static fsdp_status nccl_reduce(fsdp_comm *c, const char *what, nccl_reduce_fn fn, const void *send,
                               void *recv, size_t numel, fsdp_dtype dt, fsdp_reduce_op op,
                               fsdp_stream_t s)
{
    struct nccl_ctx *p = (struct nccl_ctx *)c->ctx;
    FSDP_TRY(nccl_begin(c, what, dt, op));
    return nccl_issued(c, what,
                       fn(send, recv, numel, nccl_type(dt), nccl_op(op), p->comm, (cudaStream_t)s));
}

static fsdp_status nccl_reduce_scatter(fsdp_comm *c, const void *send, void *recv, size_t numel,
                                       fsdp_dtype dt, fsdp_reduce_op op, fsdp_stream_t s)
{
    return nccl_reduce(c, "reduce_scatter", ncclReduceScatter, send, recv, numel, dt, op, s);
}

static fsdp_status nccl_all_reduce(fsdp_comm *c, const void *send, void *recv, size_t numel,
                                   fsdp_dtype dt, fsdp_reduce_op op, fsdp_stream_t s)
{
    return nccl_reduce(c, "all_reduce", ncclAllReduce, send, recv, numel, dt, op, s);
}

static fsdp_status nccl_broadcast(fsdp_comm *c, void *buf, size_t numel, fsdp_dtype dt, int root,
                                  fsdp_stream_t s)
{
    struct nccl_ctx *p = (struct nccl_ctx *)c->ctx;
    FSDP_TRY(nccl_begin(c, "broadcast", dt, FSDP_REDUCE_SUM));
    if (root < 0 || root >= c->n_ranks)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "rank %d: broadcast root %d is not a member of the communicator "
                              "(0..%d)",
                              c->global_rank, root, c->n_ranks - 1);
    return nccl_issued(c, "broadcast",
                       ncclBroadcast(buf, buf, numel, nccl_type(dt), root, p->comm,
                                     (cudaStream_t)s));
}

/* Every rank of the job, in every process, meets on the host (the
 * rendezvous: an exchange of one byte; see the top for groups). */
static fsdp_status nccl_barrier(fsdp_comm *c)
{
    struct nccl_ctx *p = (struct nccl_ctx *)c->ctx;
    FSDP_TRY(nccl_begin(c, "barrier", FSDP_DTYPE_F32, FSDP_REDUCE_SUM));
    FSDP_TRY(fsdp_device_stream_sync(c->dev, c->dev->compute));
    FSDP_TRY(fsdp_device_stream_sync(c->dev, c->dev->comm));
    FSDP_TRY(fsdp_device_stream_sync(c->dev, c->dev->copy));
    char token = 1;
    return fsdp_comm_rdv_exchange(p->rdv, c->world, c->global_rank, &token, 1, p->tokens, true);
}

static void nccl_fini(fsdp_comm *c)
{
    struct nccl_ctx *p = (struct nccl_ctx *)c->ctx;
    if (!p)
        return;
    /* Every rank must choose alike: ncclCommFinalize waits until every
     * rank's communicator is quiescent, and ncclCommAbort may wait for every
     * rank of the node. The world's abort flag is what all ranks see; a rank
     * that failed sets it first (fsdp_world_rank_stop with its status). */
    bool clean = !p->broken && !fsdp_cuda_world_aborted(c->world);
    if (p->comm && clean) {
        ncclResult_t rc = ncclCommFinalize(p->comm);
        if ((rc == ncclSuccess || rc == ncclInProgress) &&
            nccl_settle(c, "finalize") == FSDP_STATUS_OK) {
            ncclCommDestroy(p->comm);
            p->comm = NULL;
        }
    }
    if (p->comm) /* an abort, or a failed finalize */
        nccl_fail(c, fsdp_cuda_world_aborted(c->world) ? FSDP_STATUS_OK : fsdp_error_first(NULL));
    if (p->stop_hook)
        fsdp_cuda_world_remove_rank_stop(c->world, c->global_rank, nccl_stop_hook, c);
    fsdp_comm_rdv_detach(c->world, p->rdv);
    free(p->tokens);
    free(p);
    c->ctx = NULL;
}

static const struct fsdp_comm_i nccl_comm_i = {
    /* .name           = */ "nccl",
    /* .all_gather     = */ nccl_all_gather,
    /* .reduce_scatter = */ nccl_reduce_scatter,
    /* .all_reduce     = */ nccl_all_reduce,
    /* .broadcast      = */ nccl_broadcast,
    /* .barrier        = */ nccl_barrier,
    /* .fini           = */ nccl_fini,
    /* .host_code      = */ false, /* queues its own device work on the stream */
    /* .inert          = */ false,
};


/* OK if every member of g published g as its group, runs on cuda, no two
 * share a GPU, and member 0 made the id; else the first of these that
 * fails, named. */
static fsdp_status nccl_check_members(const fsdp_comm *c, const fsdp_comm_group *g,
                                      const struct nccl_rec *all)
{
    int rank = c->global_rank;
    for (int i = 0; i < g->count; i++) {
        int q = fsdp_comm_group_rank(g, i);
        const struct nccl_rec *r = &all[q];
        if (r->first != g->first || r->stride != g->stride || r->count != g->count)
            return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                                  "rank %d: the ranks of an NCCL communicator disagree on it: "
                                  "this rank's group is {first %d, stride %d, count %d}, rank "
                                  "%d's {first %d, stride %d, count %d}", rank, g->first,
                                  g->stride, g->count, q, r->first, r->stride, r->count);
        if (r->backend != (int)FSDP_BACKEND_CUDA)
            return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                                  "rank %d: --comm nccl needs --backend cuda on every rank (rank "
                                  "%d has a %s device)", rank, q,
                                  fsdp_backend_name((fsdp_backend)r->backend));
        for (int j = 0; j < i; j++) {
            int o = fsdp_comm_group_rank(g, j);
            if (same_gpu(&all[o], r))
                return fsdp_error_set(FSDP_STATUS_UNSUPPORTED,
                                      "rank %d: NCCL cannot run two ranks on one GPU (ranks %d "
                                      "and %d are both on GPU %d%s%s of host %s); use --comm "
                                      "peer for several ranks per GPU, or one rank per GPU (two "
                                      "processes on one host: give each its own "
                                      "CUDA_VISIBLE_DEVICES)", rank, o, q, r->ordinal,
                                      r->bus[0] ? ", bus " : "", r->bus, r->host);
        }
    }
    if (all[g->first].status != (int)FSDP_STATUS_OK)
        return fsdp_error_set(FSDP_STATUS_NCCL, "rank %d: rank %d could not create the NCCL id",
                              rank, g->first);
    return FSDP_STATUS_OK;
}

extern "C" fsdp_status fsdp_comm_nccl_init_group(fsdp_comm *c, fsdp_world *w, fsdp_device *dev,
                                                 const fsdp_comm_group *g, int rank)
{
    fsdp_status st = FSDP_STATUS_OK;
    struct nccl_rec me, *all = NULL;
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    ncclResult_t rc;
    cudaError_t crc;
    int n_job = fsdp_cuda_world_n_ranks(w);
    memset(c, 0, sizeof *c);
    FSDP_TRY(fsdp_comm_group_check(g, w, rank, "--comm nccl"));
    fsdp_comm_bind(c, &nccl_comm_i, w, dev, g, rank, NULL);
    struct nccl_ctx *p = (struct nccl_ctx *)calloc(1, sizeof *p);
    if (!p) {
        c->iface = NULL;
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory creating the NCCL communicator");
    }
    c->ctx = p;
    all = (struct nccl_rec *)calloc((size_t)n_job, sizeof *all);
    p->tokens = (char *)calloc((size_t)n_job, 1);
    if (!all || !p->tokens) {
        st = fsdp_error_set(FSDP_STATUS_OOM, "out of host memory creating the NCCL communicator");
        goto fail;
    }
    FSDP_CHECK(fsdp_comm_rdv_attach(w, &p->rdv));
    memset(&me, 0, sizeof me);
    me.ordinal = dev->ordinal;
    me.backend = (int)dev->backend;
    me.first = g->first;
    me.stride = g->stride;
    me.count = g->count;
    if (gethostname(me.host, sizeof me.host))
        snprintf(me.host, sizeof me.host, "?");
    me.host[sizeof me.host - 1] = '\0';
    if (dev->backend == FSDP_BACKEND_CUDA &&
        cudaDeviceGetPCIBusId(me.bus, (int)sizeof me.bus, dev->ordinal) != cudaSuccess) {
        cudaGetLastError(); /* unknown: compare ordinals on one host */
        me.bus[0] = '\0';
    }
    if (c->rank == 0) { /* the group's first member */
        rc = ncclGetUniqueId(&me.id);
        if (rc != ncclSuccess) {
            me.status = (int)FSDP_STATUS_NCCL;
            st = fsdp_error_set(FSDP_STATUS_NCCL, "rank %d: ncclGetUniqueId failed: %s", rank,
                                ncclGetErrorString(rc));
        }
    }
    /* Every rank takes part even if one already failed, so all agree. */
    {
        fsdp_status xst = fsdp_comm_rdv_exchange(p->rdv, w, rank, &me, sizeof me, all, true);
        if (st != FSDP_STATUS_OK)
            goto fail;
        FSDP_CHECK(xst);
    }
    FSDP_CHECK(nccl_check_members(c, g, all));
    crc = fsdp_cuda_error_take(cudaSetDevice(dev->ordinal));
    if (crc != cudaSuccess) {
        st = fsdp_error_set(FSDP_STATUS_CUDA, "rank %d: cudaSetDevice(%d): %s", rank,
                            dev->ordinal, cudaGetErrorString(crc));
        goto fail;
    }
    config.blocking = 0;
    rc = ncclCommInitRankConfig(&p->comm, c->n_ranks, all[g->first].id, c->rank, &config);
    if (rc != ncclSuccess && rc != ncclInProgress) {
        st = fsdp_error_set(FSDP_STATUS_NCCL,
                            "rank %d (GPU %d): ncclCommInitRankConfig over %d ranks failed: %s",
                            rank, dev->ordinal, c->n_ranks, ncclGetErrorString(rc));
        goto fail;
    }
    FSDP_CHECK(nccl_settle(c, "communicator setup"));
    FSDP_CHECK(fsdp_cuda_world_add_rank_stop(w, rank, nccl_stop_hook, c));
    p->stop_hook = true;
    /* Nobody queues work before every communicator is up. */
    FSDP_CHECK(fsdp_cuda_world_barrier(w));
    free(all);
    return FSDP_STATUS_OK;
fail:
    free(all);
    nccl_fini(c);
    c->iface = NULL;
    return st;
}
