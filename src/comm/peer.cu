/*
 * peer.cu - the `peer` collectives: device-to-device copies between the
 * ranks' own buffers plus a tree-reduction kernel, for ranks that are
 * threads of this process. Several ranks may share one GPU (virtual ranks),
 * which NCCL cannot do.
 *
 * Protocol of one collective on stream s (every rank):
 *   1. record ev_ready on s; exchange {kind, sizes, send/recv pointers,
 *      ev_ready} through the host rendezvous (comm/rdv.c) and check that
 *      every rank issued the same collective;
 *   2. make s wait on the other ranks' ev_ready, then pull: each rank
 *      copies what it needs from the other ranks' buffers into its own
 *      recv buffer or staging (it never writes another rank's memory);
 *   3. record ev_done on s; exchange it; make s wait on every rank's
 *      ev_done, so later work on s (overwriting send, reusing recv) cannot
 *      start before every reader of this rank's buffers has finished.
 * all_reduce adds a middle exchange (ev_mid) between its reduce-scatter and
 * all-gather halves. Only the first exchange of a collective can be
 * aborted: once all ranks passed it, every rank reaches the later ones
 * (errors in between are carried to them, not returned early), and
 * returning early would let a buffer be reused while another rank still
 * reads it. Nothing waits on the GPU for a rank that may never come: every
 * event is recorded before it is published, so an abort never hangs a
 * stream.
 *
 * Groups (comm.h; hybrid sharding's node and cross groups): a
 * communicator over part of the job reads only its members' records, but
 * its exchanges go through the job's one rendezvous, so every rank of the
 * job issues its groups' collectives in the same order, each on its own
 * group (the engine does: every rank reduce-scatters in its node, then
 * all-reduces across nodes). The first exchange checks that every rank of
 * the job issued the same kind of collective, so a rank that strays fails
 * with a message instead of waiting for ever; barriers meet every local
 * rank. Messages name the job's rank (c->global_rank).
 *
 * Sums: the N source slices are copied into a staging buffer (the
 * device's own memory, fsdp_cuda_device_alloc_own: reserved, not counted in
 * use, as the host collectives count none; at most PEER_STAGING_MAX bytes,
 * reused; larger collectives go in chunks; growing it hands the old one
 * back stream-ordered, no sync) and a kernel adds them per element in
 * comm.h's fixed balanced tree over ranks, in fp32 (bf16 widened exactly,
 * rounded once), so results are bit-identical to fsdp_tree_sum() and to
 * the host collectives. AVG = tree sum * (1.0f / N), one multiply.
 *
 *   all_gather      rank r copies every rank's send into recv[j]
 *   reduce_scatter  rank r reduces chunk r of every rank's send into recv
 *   all_reduce      rank r reduces slice r (numel*r/N .. numel*(r+1)/N)
 *                   into its own recv; middle exchange; rank r copies the
 *                   other slices from their owners' recv (in-place safe)
 *   broadcast       every rank but the root copies the root's buffer
 */
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_bf16.h>

#include "comm/cuda_comm.h"
#include "device/cuda_check.h"
#include "device/cuda_device.h"
#include "device/cuda_world.h"

#define PEER_STAGING_MAX ((size_t)64 << 20) /* bytes of staging per rank */
#define PEER_TREE_DEPTH 16                  /* enough for 2^15 ranks */

/* ---- kernels -------------------------------------------------------------- */

__device__ __forceinline__ float peer_ld(const float *p, size_t i) { return p[i]; }
__device__ __forceinline__ float peer_ld(const __nv_bfloat16 *p, size_t i)
{
    return __uint_as_float((uint32_t)__bfloat16_as_ushort(p[i]) << 16);
}
__device__ __forceinline__ void peer_st(float *p, size_t i, float v) { p[i] = v; }
/* Round to nearest even, NaN kept quiet as core/bf16.h does. */
__device__ __forceinline__ void peer_st(__nv_bfloat16 *p, size_t i, float v)
{
    uint32_t u = __float_as_uint(v);
    uint16_t h = (u & 0x7fffffffu) > 0x7f800000u ? (uint16_t)((u >> 16) | 0x40u)
                                                 : (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    p[i] = __ushort_as_bfloat16(h);
}

/* tree(0, n) over src[k * stride], k = 0..n-1: tree(lo, hi) = tree(lo, mid)
 * + tree(mid, hi), mid = lo + (hi - lo) / 2 — fsdp_tree_sum's order —
 * evaluated without recursion on a small explicit stack. */
template <typename T>
__device__ float peer_tree_sum(const T *src, size_t stride, int n)
{
    int lo_s[PEER_TREE_DEPTH], hi_s[PEER_TREE_DEPTH];
    unsigned char state[PEER_TREE_DEPTH];
    float left[PEER_TREE_DEPTH];
    int sp = 0;
    lo_s[0] = 0;
    hi_s[0] = n;
    state[0] = 0;
    float ret = 0.0f;
    while (sp >= 0) {
        int lo = lo_s[sp], hi = hi_s[sp];
        if (hi - lo == 1) {
            ret = peer_ld(src, (size_t)lo * stride);
            sp--;
            continue;
        }
        int mid = lo + (hi - lo) / 2;
        if (state[sp] == 0) {
            state[sp] = 1;
            sp++;
            lo_s[sp] = lo;
            hi_s[sp] = mid;
            state[sp] = 0;
        } else if (state[sp] == 1) {
            left[sp] = ret;
            state[sp] = 2;
            sp++;
            lo_s[sp] = mid;
            hi_s[sp] = hi;
            state[sp] = 0;
        } else {
            ret = __fadd_rn(left[sp], ret);
            sp--;
        }
    }
    return ret;
}

/* dst[e] = tree over the n_src slices of stage (slice k at k * cn). */
template <typename T>
__global__ void peer_reduce_kernel(T *dst, const T *stage, size_t cn, int n_src, float scale,
                                   int avg)
{
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < cn;
         e += (size_t)gridDim.x * blockDim.x) {
        float v = peer_tree_sum(stage + e, cn, n_src);
        if (avg)
            v = __fmul_rn(v, scale);
        peer_st(dst, e, v);
    }
}

/* ---- state ---------------------------------------------------------------- */

/* What a rank publishes at each exchange. */
struct peer_rec {
    fsdp_coll_args args; /* args.kind -1: the exchange at init */
    const void *send;
    void *recv;
    cudaEvent_t ev;
    int ordinal;
    int backend;
    int status; /* this rank's local status so far (later exchanges) */
};

/* Record of the group's member q in an exchange's records (by job rank). */
static const struct peer_rec *peer_of(const fsdp_comm *c, const struct peer_rec *recs, int q)
{
    return &recs[fsdp_comm_group_rank(&c->group, q)];
}

struct peer_ctx {
    fsdp_comm_rdv *rdv;
    cudaEvent_t ev_ready, ev_mid, ev_done; /* re-recorded by every collective */
    cudaEvent_t ev_staging;                /* last use of staging */
    bool staging_used;
    void *staging;
    size_t staging_bytes;
    int n_sms;
    long n_coll;
    struct peer_rec *all;  /* first exchange of the current collective, by job rank */
    struct peer_rec *all2; /* later exchanges */
};

static size_t peer_es(fsdp_dtype dt) { return fsdp_dtype_size(dt); }

/* Record a CUDA failure into *local unless one is there already; either
 * way the thread's last error is cleared (cuda_check.h). */
static void peer_note(fsdp_comm *c, fsdp_status *local, cudaError_t rc, const char *what)
{
    if (fsdp_cuda_error_take(rc) == cudaSuccess || *local != FSDP_STATUS_OK)
        return;
    *local = fsdp_error_set(FSDP_STATUS_CUDA, "rank %d (GPU %d): peer collective: %s failed: %s",
                            c->global_rank, c->dev->ordinal, what, cudaGetErrorString(rc));
}

/* Step 1: fault hook, checks, ev_ready, first (abortable) exchange, and the
 * check that every rank issued the same collective. */
static fsdp_status peer_begin(fsdp_comm *c, int kind, const void *send, void *recv, size_t numel,
                              fsdp_dtype dt, fsdp_reduce_op op, int root, cudaStream_t s)
{
    struct peer_ctx *p = (struct peer_ctx *)c->ctx;
    long k = ++p->n_coll;
    /* a broadcast passes its one buffer as both send and recv */
    FSDP_TRY(fsdp_comm_begin_check(c, c->global_rank, k, kind, send, recv, numel, dt, op, root));
    if (fsdp_cuda_world_aborted(c->world))
        return fsdp_error_set(FSDP_STATUS_ABORTED,
                              "rank %d: collective %ld (%s) not started: another rank failed",
                              c->global_rank, k, fsdp_coll_kind_name(kind));
    CUDA_TRY(cudaEventRecord(p->ev_ready, s));
    fsdp_coll_args args = {kind, dt, op, root, numel};
    struct peer_rec me;
    memset(&me, 0, sizeof me);
    me.args = args;
    me.send = send;
    me.recv = recv;
    me.ev = p->ev_ready;
    me.ordinal = c->dev->ordinal;
    FSDP_TRY(fsdp_comm_rdv_exchange(p->rdv, c->world, c->global_rank, &me, sizeof me, p->all,
                                    true));
    for (int q = 0; q < c->n_ranks; q++)
        FSDP_TRY(fsdp_coll_args_check(c->global_rank, k, &me.args,
                                      fsdp_comm_group_rank(&c->group, q),
                                      &peer_of(c, p->all, q)->args));
    /* the other groups' ranks meet in the same exchanges: they must be in
     * the same kind of collective, or the exchanges stop pairing up */
    for (int o = 0; o < fsdp_cuda_world_n_ranks(c->world); o++)
        if (p->all[o].args.kind != kind)
            return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                                  "rank %d: collective %ld is a %s on this rank's group but a %s "
                                  "on rank %d's; with --comm peer every rank of the job issues "
                                  "its groups' collectives in the same order", c->global_rank, k,
                                  fsdp_coll_kind_name(kind),
                                  fsdp_coll_kind_name(p->all[o].args.kind), o);
    return FSDP_STATUS_OK;
}

/* Make s wait on every other rank's event in recs. */
static void peer_wait_all(fsdp_comm *c, const struct peer_rec *recs, cudaStream_t s,
                          fsdp_status *local)
{
    for (int q = 0; q < c->n_ranks && *local == FSDP_STATUS_OK; q++)
        if (q != c->rank)
            peer_note(c, local, cudaStreamWaitEvent(s, peer_of(c, recs, q)->ev, 0),
                      "waiting for a rank's event");
}

/* A later exchange (not abortable): record ev on s, publish it with this
 * rank's status, make s wait on everyone's ev (also after a local failure:
 * what was queued still reads other ranks' buffers). Returns this rank's
 * status; another rank's failure is reported by that rank. */
static fsdp_status peer_sync_point(fsdp_comm *c, cudaEvent_t ev, cudaStream_t s,
                                   fsdp_status local)
{
    struct peer_ctx *p = (struct peer_ctx *)c->ctx;
    peer_note(c, &local, cudaEventRecord(ev, s), "recording an event");
    struct peer_rec me;
    memset(&me, 0, sizeof me);
    me.ev = ev;
    me.status = (int)local;
    fsdp_status st =
        fsdp_comm_rdv_exchange(p->rdv, c->world, c->global_rank, &me, sizeof me, p->all2, false);
    if (st != FSDP_STATUS_OK)
        return st;
    fsdp_status wait_st = FSDP_STATUS_OK;
    peer_wait_all(c, p->all2, s, &wait_st);
    return local != FSDP_STATUS_OK ? local : wait_st;
}

/* Staging of at least `bytes` for use on s (ordered after its last use). */
static void *peer_staging(fsdp_comm *c, size_t bytes, cudaStream_t s, fsdp_status *local)
{
    struct peer_ctx *p = (struct peer_ctx *)c->ctx;
    if (*local != FSDP_STATUS_OK)
        return NULL;
    if (bytes > p->staging_bytes) {
        /* The old buffer's last use may be on a stream other than the
         * device's three, whose state the cache's fence records: order it
         * into the comm stream before handing the buffer back. */
        if (p->staging_used) {
            cudaError_t rc = cudaStreamWaitEvent((cudaStream_t)c->dev->comm, p->ev_staging, 0);
            peer_note(c, local, rc, "ordering the old staging buffer");
            if (rc != cudaSuccess)
                return NULL;
        }
        fsdp_cuda_device_free_own(c->dev, p->staging);
        p->staging = NULL;
        p->staging_bytes = 0;
        p->staging_used = false;
        fsdp_status st = fsdp_cuda_device_alloc_own(c->dev, bytes, "peer collective staging",
                                                    &p->staging);
        if (st != FSDP_STATUS_OK) {
            *local = st;
            return NULL;
        }
        p->staging_bytes = bytes;
    }
    if (p->staging_used)
        peer_note(c, local, cudaStreamWaitEvent(s, p->ev_staging, 0), "ordering the staging buffer");
    return *local == FSDP_STATUS_OK ? p->staging : NULL;
}

static void peer_staging_done(fsdp_comm *c, cudaStream_t s, fsdp_status *local)
{
    struct peer_ctx *p = (struct peer_ctx *)c->ctx;
    if (!p->staging)
        return;
    peer_note(c, local, cudaEventRecord(p->ev_staging, s), "recording the staging event");
    p->staging_used = true;
}

/* dst[0..n) = tree over ranks q of srcs_q[off + 0..n) where srcs_q is
 * recs[q].send (elements of dt), through staging in chunks. */
static void peer_reduce(fsdp_comm *c, const struct peer_rec *recs, size_t off, size_t n,
                        void *dst, fsdp_dtype dt, fsdp_reduce_op op, cudaStream_t s,
                        fsdp_status *local)
{
    struct peer_ctx *p = (struct peer_ctx *)c->ctx;
    const int N = c->n_ranks;
    const size_t es = peer_es(dt);
    if (!n || *local != FSDP_STATUS_OK)
        return;
    size_t per = PEER_STAGING_MAX / ((size_t)N * es);
    if (per < 1)
        per = 1;
    if (per > n)
        per = n;
    char *stage = (char *)peer_staging(c, per * (size_t)N * es, s, local);
    if (!stage)
        return;
    const float scale = 1.0f / (float)N;
    for (size_t e0 = 0; e0 < n && *local == FSDP_STATUS_OK; e0 += per) {
        size_t cn = n - e0 < per ? n - e0 : per;
        for (int q = 0; q < N && *local == FSDP_STATUS_OK; q++)
            peer_note(c, local,
                      cudaMemcpyAsync(stage + (size_t)q * cn * es,
                                      (const char *)peer_of(c, recs, q)->send + (off + e0) * es,
                                      cn * es,
                                      cudaMemcpyDefault, s),
                      "copying a rank's slice into staging");
        if (*local != FSDP_STATUS_OK)
            break;
        size_t want = (cn + 255) / 256, cap = (size_t)p->n_sms * 8;
        unsigned grid = (unsigned)(want < cap ? want : cap);
        char *out = (char *)dst + e0 * es;
        if (dt == FSDP_DTYPE_BF16)
            peer_reduce_kernel<__nv_bfloat16><<<grid, 256, 0, s>>>(
                (__nv_bfloat16 *)out, (const __nv_bfloat16 *)stage, cn, N, scale,
                op == FSDP_REDUCE_AVG);
        else
            peer_reduce_kernel<float><<<grid, 256, 0, s>>>((float *)out, (const float *)stage,
                                                           cn, N, scale, op == FSDP_REDUCE_AVG);
        peer_note(c, local, cudaGetLastError(), "launching the reduction kernel");
    }
    peer_staging_done(c, s, local);
}

/* ---- the collectives ------------------------------------------------------ */

static fsdp_status peer_all_gather(fsdp_comm *c, const void *send, void *recv, size_t numel,
                                   fsdp_dtype dt, fsdp_stream_t stream)
{
    struct peer_ctx *p = (struct peer_ctx *)c->ctx;
    cudaStream_t s = (cudaStream_t)stream;
    FSDP_TRY(peer_begin(c, FSDP_COLL_ALL_GATHER, send, recv, numel, dt, FSDP_REDUCE_SUM, 0, s));
    fsdp_status local = FSDP_STATUS_OK;
    const size_t bytes = numel * peer_es(dt);
    peer_wait_all(c, p->all, s, &local);
    for (int q = 0; q < c->n_ranks && local == FSDP_STATUS_OK && bytes; q++) {
        char *dst = (char *)recv + (size_t)q * bytes;
        const void *src = peer_of(c, p->all, q)->send;
        if (src == dst)
            continue; /* in place */
        peer_note(c, &local, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s),
                  "copying a rank's chunk");
    }
    return peer_sync_point(c, p->ev_done, s, local);
}

static fsdp_status peer_reduce_scatter(fsdp_comm *c, const void *send, void *recv, size_t numel,
                                       fsdp_dtype dt, fsdp_reduce_op op, fsdp_stream_t stream)
{
    struct peer_ctx *p = (struct peer_ctx *)c->ctx;
    cudaStream_t s = (cudaStream_t)stream;
    FSDP_TRY(peer_begin(c, FSDP_COLL_REDUCE_SCATTER, send, recv, numel, dt, op, 0, s));
    fsdp_status local = FSDP_STATUS_OK;
    peer_wait_all(c, p->all, s, &local);
    peer_reduce(c, p->all, (size_t)c->rank * numel, numel, recv, dt, op, s, &local);
    return peer_sync_point(c, p->ev_done, s, local);
}

static fsdp_status peer_all_reduce(fsdp_comm *c, const void *send, void *recv, size_t numel,
                                   fsdp_dtype dt, fsdp_reduce_op op, fsdp_stream_t stream)
{
    struct peer_ctx *p = (struct peer_ctx *)c->ctx;
    cudaStream_t s = (cudaStream_t)stream;
    const int N = c->n_ranks;
    const size_t es = peer_es(dt);
    FSDP_TRY(peer_begin(c, FSDP_COLL_ALL_REDUCE, send, recv, numel, dt, op, 0, s));
    fsdp_status local = FSDP_STATUS_OK;
    peer_wait_all(c, p->all, s, &local);
    /* slice q = [numel*q/N, numel*(q+1)/N) */
#define SLICE_LO(q) ((size_t)((unsigned __int128)numel * (unsigned)(q) / (unsigned)N))
    size_t lo = SLICE_LO(c->rank), hi = SLICE_LO(c->rank + 1);
    peer_reduce(c, p->all, lo, hi - lo, (char *)recv + lo * es, dt, op, s, &local);
    local = peer_sync_point(c, p->ev_mid, s, local);
    for (int q = 0; q < N && local == FSDP_STATUS_OK; q++) {
        size_t qlo = SLICE_LO(q), qhi = SLICE_LO(q + 1);
        if (q == c->rank || qhi == qlo)
            continue;
        peer_note(c, &local,
                  cudaMemcpyAsync((char *)recv + qlo * es,
                                  (const char *)peer_of(c, p->all, q)->recv + qlo * es,
                                  (qhi - qlo) * es, cudaMemcpyDefault, s),
                  "copying a reduced slice");
    }
#undef SLICE_LO
    return peer_sync_point(c, p->ev_done, s, local);
}

static fsdp_status peer_broadcast(fsdp_comm *c, void *buf, size_t numel, fsdp_dtype dt, int root,
                                  fsdp_stream_t stream)
{
    struct peer_ctx *p = (struct peer_ctx *)c->ctx;
    cudaStream_t s = (cudaStream_t)stream;
    FSDP_TRY(peer_begin(c, FSDP_COLL_BROADCAST, buf, buf, numel, dt, FSDP_REDUCE_SUM, root, s));
    fsdp_status local = FSDP_STATUS_OK;
    const size_t bytes = numel * peer_es(dt);
    if (c->rank != root && bytes) {
        const struct peer_rec *r = peer_of(c, p->all, root);
        peer_note(c, &local, cudaStreamWaitEvent(s, r->ev, 0), "waiting for the root");
        if (local == FSDP_STATUS_OK)
            peer_note(c, &local, cudaMemcpyAsync(buf, r->recv, bytes, cudaMemcpyDefault, s),
                      "copying the root's buffer");
    }
    return peer_sync_point(c, p->ev_done, s, local);
}

static fsdp_status peer_barrier(fsdp_comm *c)
{
    struct peer_ctx *p = (struct peer_ctx *)c->ctx;
    long k = ++p->n_coll;
    FSDP_TRY(fsdp_comm_begin_check(c, c->global_rank, k, FSDP_COLL_BARRIER, NULL, NULL, 0,
                                   FSDP_DTYPE_F32, FSDP_REDUCE_SUM, 0));
    FSDP_TRY(fsdp_device_stream_sync(c->dev, c->dev->compute));
    FSDP_TRY(fsdp_device_stream_sync(c->dev, c->dev->comm));
    FSDP_TRY(fsdp_device_stream_sync(c->dev, c->dev->copy));
    return fsdp_cuda_world_barrier(c->world);
}

static void peer_fini(fsdp_comm *c)
{
    struct peer_ctx *p = (struct peer_ctx *)c->ctx;
    if (!p)
        return;
    if (p->staging_used)
        (void)fsdp_cuda_error_take(
            cudaStreamWaitEvent((cudaStream_t)c->dev->comm, p->ev_staging, 0));
    fsdp_cuda_device_free_own(c->dev, p->staging); /* stream-ordered */
    cudaEvent_t evs[4] = {p->ev_ready, p->ev_mid, p->ev_done, p->ev_staging};
    for (int i = 0; i < 4; i++)
        if (evs[i])
            (void)fsdp_cuda_error_take(cudaEventDestroy(evs[i]));
    fsdp_comm_rdv_detach(c->world, p->rdv);
    free(p->all);
    free(p->all2);
    free(p);
    c->ctx = NULL;
}

static const struct fsdp_comm_i peer_comm_i = {
    /* .name           = */ "peer",
    /* .all_gather     = */ peer_all_gather,
    /* .reduce_scatter = */ peer_reduce_scatter,
    /* .all_reduce     = */ peer_all_reduce,
    /* .broadcast      = */ peer_broadcast,
    /* .barrier        = */ peer_barrier,
    /* .fini           = */ peer_fini,
    /* .host_code      = */ false, /* queues its own device work on the stream */
    /* .inert          = */ false,
};

/* Let this GPU read and write the other ranks' GPUs directly where the
 * hardware allows (faster copies); without it copies still work, staged
 * by the driver. Peer access is per device and process: other ranks on the
 * same GPU may have enabled it already. */
static void peer_enable_access(fsdp_comm *c, const struct peer_rec *recs)
{
    int mine = c->dev->ordinal;
    for (int q = 0; q < c->n_ranks; q++) {
        int o = peer_of(c, recs, q)->ordinal;
        if (o == mine)
            continue;
        int can = 0;
        if (fsdp_cuda_error_take(cudaDeviceCanAccessPeer(&can, mine, o)) != cudaSuccess || !can)
            continue;
        /* cudaErrorPeerAccessAlreadyEnabled, or unusable: copies still work */
        (void)fsdp_cuda_error_take(cudaDeviceEnablePeerAccess(o, 0));
    }
}

extern "C" fsdp_status fsdp_comm_peer_init_group(fsdp_comm *c, fsdp_world *w, fsdp_device *dev,
                                                 const fsdp_comm_group *g, int rank)
{
    fsdp_status st = FSDP_STATUS_OK;
    int n_job = fsdp_cuda_world_n_ranks(w);
    memset(c, 0, sizeof *c);
    FSDP_TRY(fsdp_comm_group_check(g, w, rank, "--comm peer"));
    fsdp_comm_bind(c, &peer_comm_i, w, dev, g, rank, NULL);
    if (dev->backend != FSDP_BACKEND_CUDA) {
        c->iface = NULL;
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "rank %d: --comm peer needs --backend cuda (this rank's device is "
                              "%s)", rank, fsdp_backend_name(dev->backend));
    }
    struct peer_ctx *p = (struct peer_ctx *)calloc(1, sizeof *p);
    struct peer_rec me;
    if (!p) {
        c->iface = NULL;
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory creating the peer communicator");
    }
    c->ctx = p;
    p->all = (struct peer_rec *)calloc((size_t)n_job, sizeof *p->all);
    p->all2 = (struct peer_rec *)calloc((size_t)n_job, sizeof *p->all2);
    if (!p->all || !p->all2) {
        st = fsdp_error_set(FSDP_STATUS_OOM, "out of host memory creating the peer communicator");
        goto fail;
    }
    {
        cudaEvent_t *evs[4] = {&p->ev_ready, &p->ev_mid, &p->ev_done, &p->ev_staging};
        for (int i = 0; i < 4; i++) {
            cudaError_t rc =
                fsdp_cuda_error_take(cudaEventCreateWithFlags(evs[i], cudaEventDisableTiming));
            if (rc != cudaSuccess) {
                *evs[i] = NULL;
                st = fsdp_error_set(FSDP_STATUS_CUDA, "rank %d: creating peer events on GPU %d: %s",
                                    rank, dev->ordinal, cudaGetErrorString(rc));
                goto fail;
            }
        }
    }
    if (cudaDeviceGetAttribute(&p->n_sms, cudaDevAttrMultiProcessorCount, dev->ordinal) !=
        cudaSuccess) {
        cudaGetLastError();
        p->n_sms = 32;
    }
    FSDP_CHECK(fsdp_comm_rdv_attach(w, &p->rdv));
    memset(&me, 0, sizeof me);
    me.args.kind = -1;
    me.ordinal = dev->ordinal;
    me.backend = (int)dev->backend;
    FSDP_CHECK(fsdp_comm_rdv_exchange(p->rdv, w, rank, &me, sizeof me, p->all, true));
    peer_enable_access(c, p->all);
    return FSDP_STATUS_OK;
fail:
    peer_fini(c);
    c->iface = NULL;
    return st;
}
