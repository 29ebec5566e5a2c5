/*
 * mpi_coll.c - the `mpi` transport: collectives among cpu ranks spread over
 * the processes of a job (comm/procs.h: MPI under mpirun).
 *
 * Inside a process the local ranks work as in comm/host.c: each publishes
 * its buffers in a slot, they meet, and they read each other's buffers.
 * Between processes one thread per process, the first local rank (the
 * "leader"), moves the data of every collective through procs->xfer
 * (MPI_Isend/Irecv), so MPI sees one caller at a time and one message per
 * pair of processes and collective (MPI_THREAD_SERIALIZED is enough; see
 * procs.h). Collective data crosses processes only through staging
 * buffers owned here, never the callers' buffers: a transfer given up on
 * a failure may still write into them, and the job ends anyway.
 *
 * A collective on process `me` of P, with L local ranks, N = P x L:
 *   M1  every local rank publishes its slot and arrives (abortable,
 *       comm/meet.h); the last to arrive checks that the slots agree and
 *       lays out the staging (mpi_layout.h); nothing is read before.
 *   A   each local rank stages its part of what leaves the process.
 *   M2  everything is staged.
 *   X   the leader exchanges a header with every other process (the same
 *       collective, sizes, dtype and op everywhere, else a clear error on
 *       every process), then the data; its status is every rank's.
 *   M3  the exchange is over.
 *   B   each local rank assembles its own output from the local ranks'
 *       buffers and the staged data of the other processes.
 *   (all_reduce: its slice goes round again, M4 X2 M5 C; reduce_scatter
 *   ends with a meeting, since B reads the other ranks' send buffers.)
 * Only M1 can be left on the abort flag: after it, every local rank gets
 * to every later meeting without waiting on anything but the leader, whose
 * transfer polls the flag itself. The stall watchdog (core/flight.h) has
 * the same two places: M1 (comm/meet.c reports the local ranks that did
 * not arrive) and the leader's transfer (procs_wait.c; the leader reports
 * the processes that have not answered).
 *
 * Sums: each process computes the partial sums of its nodes of the global
 * tree (comm/mpi_tree.h) for the chunks the other processes own, sends
 * them, and each rank finishes the tree for its own chunk, so results are
 * bit-identical to fsdp_tree_sum over the N ranks (and to `host` with N
 * ranks in one process) for every split of the ranks into processes.
 * all_reduce is a reduce_scatter over N slices followed by an all_gather
 * of the finished slices. AVG is tree_sum * (1.0f / N), like host.c.
 *
 * Bytes: the logical counts of comm.h (comm.c); the leader also counts
 * the payload its process sends and receives (bytes_inter_*, headers
 * excluded), which fsdp_comm_mpi_inter_bytes computes from the layout.
 *
 * Groups (comm.h): a communicator spans any group that holds the same
 * number of consecutive members in each of the processes it touches (the
 * whole job; the ranks with one local index on every node, one member per
 * process). Everything above then reads with the group's members for
 * "ranks", the processes it touches for "processes" and its first member
 * in this process as the leader. A group inside one process gets the host
 * transport (comm/host.c: the same sums). Each group's leader moves its
 * data on its own channel, so groups work side by side; the channel is a
 * function of the group, the same in every process whatever order the
 * communicators are created in.
 *
 * Fault hook: as host.c, each collective (barrier included) is one
 * FSDP_FAULT_COLLECTIVE operation of its rank, failing before it
 * publishes anything. Messages name global ranks.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "comm/meet.h"
#include "comm/mpi_coll.h"
#include "comm/mpi_layout.h"
#include "comm/mpi_tree.h"
#include "comm/procs.h"
#include "core/bf16.h"
#include "core/clock.h"
#include "core/flight.h"
#include "core/log.h"

#define MPI_HDR_MAGIC 0x66736470u         /* "fsdp" */

/* What the leaders exchange first in every collective. */
struct mpi_header {
    uint32_t magic;
    int32_t kind, dt, op, root, pad;
    uint64_t numel;
    int64_t seq;
};

struct mpi_shared {
    fsdp_meet meet;              /* slots by local index (j = member - me * n_local) */
    int n_local, n_procs, me;    /* the group's: members per process, processes, this one */
    fsdp_comm_group g;
    int *procs_of;               /* (n_procs,) the job's index of each of its processes */
    int channel;
    fsdp_procs *procs;           /* NULL: a world of one process */
    fsdp_meet_slot *slots;       /* (n_local,) meet.slots */
    fsdp_status prep_st;         /* M1's checks and layout; read after M1 */
    fsdp_status x_st;            /* the leader's exchange; read after the next meeting */
    char msg[FSDP_ERROR_MSG_MAX];
    bool broken;                 /* a failed transfer may still use the staging */
    unsigned char *send_stage, *recv_stage;
    size_t send_cap, recv_cap;
    fsdp_mpi_layout lay;
    fsdp_procs_msg *msgs;        /* (2 n_procs,) the leader's messages */
    struct mpi_header mine;      /* the header sent (the leader's) */
    struct mpi_header *hdrs;     /* (n_procs,) headers received */
    fsdp_mpi_cover cover;
};

struct mpi_ctx {
    struct mpi_shared *sh;
    fsdp_meet_rank mr; /* this rank's slot, meetings and count of collectives */
    float **tmp;       /* (depth + 1,) scratch vectors of FSDP_MPI_BLOCK floats */
    float *tmp_mem;
    const void **leaf; /* (n_local,) */
    const unsigned char **remote; /* (n_procs,) */
};

/* memcpy that takes NULL for an empty copy. */
static void copy(void *dst, const void *src, size_t bytes)
{
    if (bytes)
        memcpy(dst, src, bytes);
}

/* ---- meetings of the local ranks --------------------------------------------- */

/* M1's work, by the last rank to arrive while the others wait: check that
 * the local ranks agree, then lay out the collective and grow the staging.
 * Every rank has finished the previous collective (it arrived here), so
 * nobody reads the staging now. */
static void prepare(fsdp_comm *c)
{
    struct mpi_shared *sh = ((struct mpi_ctx *)c->ctx)->sh;
    const fsdp_coll_args *a = &sh->slots[0].args;
    sh->prep_st = FSDP_STATUS_OK;
    for (int j = 1; j < sh->n_local; j++) {
        const fsdp_coll_args *o = &sh->slots[j].args;
        if (fsdp_coll_args_match(o, a))
            continue;
        int r0 = fsdp_comm_group_rank(&sh->g, sh->me * sh->n_local);
        char mine[96], theirs[96];
        fsdp_coll_args_format(a, mine, sizeof mine);
        fsdp_coll_args_format(o, theirs, sizeof theirs);
        sh->prep_st = FSDP_STATUS_INVALID_ARG;
        snprintf(sh->msg, sizeof sh->msg,
                 "collective mismatch: rank %d issued %s but rank %d issued %s; every rank must "
                 "issue the same collectives in the same order with the same sizes",
                 r0, mine, r0 + j * sh->g.stride, theirs);
        return;
    }
    if (a->kind == FSDP_COLL_BARRIER)
        return;
    fsdp_mpi_layout_of(&sh->cover, sh->me, a->kind, a->numel, a->dt, a->root, &sh->lay);
    /* never NULL, even for empty collectives */
    size_t need[2] = {sh->lay.send_bytes > 64 ? sh->lay.send_bytes : 64,
                      sh->lay.recv_bytes > 64 ? sh->lay.recv_bytes : 64};
    unsigned char **buf[2] = {&sh->send_stage, &sh->recv_stage};
    size_t *cap[2] = {&sh->send_cap, &sh->recv_cap};
    for (int i = 0; i < 2; i++) {
        if (need[i] <= *cap[i])
            continue;
        size_t n = need[i] + need[i] / 4;
        void *m = NULL;
        if (posix_memalign(&m, 64, n)) {
            sh->prep_st = FSDP_STATUS_OOM;
            snprintf(sh->msg, sizeof sh->msg,
                     "out of host memory for %zu bytes of staging for a %s of %zu x %s between "
                     "processes", n, fsdp_coll_kind_name(a->kind), a->numel,
                     fsdp_dtype_name(a->dt));
            return;
        }
        free(*buf[i]);
        *buf[i] = m;
        *cap[i] = n;
    }
}

/* Start a collective: fault hook, argument checks, publish, M1 (comm/meet.h). */
static fsdp_status begin(fsdp_comm *c, int kind, const void *send, void *recv, size_t numel,
                         fsdp_dtype dt, fsdp_reduce_op op, int root)
{
    struct mpi_ctx *x = c->ctx;
    struct mpi_shared *sh = x->sh;
    const fsdp_coll_args args = {kind, dt, op, root, numel};
    FSDP_TRY(fsdp_meet_begin(&x->mr, c, &args, send, recv,
                             sh->broken ? "an earlier transfer between processes failed" : NULL,
                             prepare));
    if (sh->prep_st != FSDP_STATUS_OK)
        return fsdp_error_set(sh->prep_st, "rank %d: collective %ld: %s", c->global_rank,
                              x->mr.n_coll, sh->msg);
    return FSDP_STATUS_OK;
}

/* ---- the leader's exchange with the other processes ------------------------ */

static bool header_matches(const struct mpi_header *a, const struct mpi_header *b)
{
    return a->magic == b->magic && a->kind == b->kind && a->numel == b->numel &&
           a->dt == b->dt && a->seq == b->seq &&
           (a->kind != FSDP_COLL_BROADCAST || a->root == b->root) &&
           (!fsdp_coll_kind_is_reduction(a->kind) || a->op == b->op);
}

/* Post msgs[0..n) and wait; counts payload bytes on the leader's comm.
 * A failure that leaves operations posted marks the staging as in use. */
static fsdp_status leader_xfer(fsdp_comm *c, int n, int kind, const char *what)
{
    struct mpi_shared *sh = ((struct mpi_ctx *)c->ctx)->sh;
    if (!n)
        return FSDP_STATUS_OK;
    bool pending = false;
    fsdp_status st =
        sh->procs->iface->xfer(sh->procs, c->world, sh->channel, sh->msgs, n, what, &pending);
    if (st != FSDP_STATUS_OK) {
        if (pending)
            sh->broken = true;
        return st;
    }
    if (kind < FSDP_COLL_KIND_COUNT)
        for (int i = 0; i < n; i++)
            *(sh->msgs[i].send ? &c->bytes_inter_sent[kind] : &c->bytes_inter_recv[kind]) +=
                sh->msgs[i].bytes;
    return FSDP_STATUS_OK;
}

/* The leaders trade headers: the same collective, sizes, dtype, op, root
 * and count everywhere, or an error naming both sides. */
static fsdp_status leader_headers(fsdp_comm *c, const char *what)
{
    struct mpi_ctx *x = c->ctx;
    struct mpi_shared *sh = x->sh;
    const fsdp_coll_args *a = &sh->slots[0].args;
    const struct mpi_header *me = &sh->mine;
    int n = 0;
    /* kept in sh: it outlives a transfer given up on, like the staging */
    sh->mine = (struct mpi_header){MPI_HDR_MAGIC, a->kind, (int32_t)a->dt, (int32_t)a->op,
                                   a->root, 0, a->numel, x->mr.n_coll};
    for (int q = 0; q < sh->n_procs; q++) {
        if (q == sh->me)
            continue;
        int peer = sh->procs_of[q];
        sh->msgs[n++] = (fsdp_procs_msg){peer, true, &sh->mine, sizeof sh->mine};
        sh->msgs[n++] = (fsdp_procs_msg){peer, false, &sh->hdrs[q], sizeof sh->hdrs[q]};
    }
    FSDP_TRY(leader_xfer(c, n, FSDP_COLL_BARRIER, what));
    for (int q = 0; q < sh->n_procs; q++) {
        const struct mpi_header *o = &sh->hdrs[q];
        if (q == sh->me || header_matches(me, o))
            continue;
        bool sane = o->magic == MPI_HDR_MAGIC && (unsigned)o->kind <= FSDP_COLL_BARRIER &&
                    (unsigned)o->dt < FSDP_DTYPE_COUNT;
        char where[96];
        return fsdp_error_set(
            FSDP_STATUS_INVALID_ARG,
            "rank %d%s: collective %ld mismatch between processes: process %d issued "
            "%s(%llu x %s, op %d, root %d) as its collective %lld but process %d (host %s) "
            "issued %s(%llu x %s, op %d, root %d) as its collective %lld; every rank must "
            "issue the same collectives in the same order with the same sizes",
            c->global_rank, fsdp_world_where(c->world, c->global_rank, where, sizeof where),
            x->mr.n_coll, sh->procs_of[sh->me],
            fsdp_coll_kind_name(me->kind), (unsigned long long)me->numel,
            fsdp_dtype_name((fsdp_dtype)me->dt), me->op, me->root, (long long)me->seq,
            sh->procs_of[q], c->world->hosts[sh->procs_of[q]],
            sane ? fsdp_coll_kind_name(o->kind) : "garbage",
            (unsigned long long)o->numel, sane ? fsdp_dtype_name((fsdp_dtype)o->dt) : "?",
            o->op, o->root, (long long)o->seq);
    }
    return FSDP_STATUS_OK;
}

/* Round `round` (1 or 2) of the exchange, by the leader; round 1 starts
 * with the headers. Messages as the layout says, skipping empty ones (both
 * sides skip alike: their layouts agree). */
static fsdp_status leader_exchange(fsdp_comm *c, int round)
{
    struct mpi_ctx *x = c->ctx;
    struct mpi_shared *sh = x->sh;
    const fsdp_mpi_layout *l = &sh->lay;
    int n = 0;
    char what[96];
    snprintf(what, sizeof what, "%s (collective %ld)", fsdp_coll_kind_name(sh->slots[0].args.kind),
             x->mr.n_coll);
    if (round == 1)
        FSDP_TRY(leader_headers(c, what));
    for (int q = 0; q < sh->n_procs; q++) {
        if (q == sh->me)
            continue;
        size_t s_off = round == 1 ? l->s_off[q] : l->s2_off;
        size_t s_len = round == 1 ? l->s_len[q] : l->s2_len;
        size_t r_off = round == 1 ? l->r_off[q] : l->r2_off[q];
        size_t r_len = round == 1 ? l->r_len[q] : l->r2_len[q];
        int peer = sh->procs_of[q];
        if (s_len)
            sh->msgs[n++] = (fsdp_procs_msg){peer, true, sh->send_stage + s_off, s_len};
        if (r_len)
            sh->msgs[n++] = (fsdp_procs_msg){peer, false, sh->recv_stage + r_off, r_len};
    }
    return leader_xfer(c, n, sh->slots[0].args.kind, what);
}

/* The leader's transfer passed the stall watchdog's deadline for waits on
 * other processes (its message says which have answered): the report
 * (core/flight.h), every local rank having arrived. */
static fsdp_status stall_report(fsdp_comm *c, double waited_s)
{
    struct mpi_ctx *x = c->ctx;
    struct mpi_shared *sh = x->sh;
    const fsdp_coll_args *a = &sh->slots[0].args;
    char who[FSDP_ERROR_MSG_MAX], wait[256], group[96];
    snprintf(who, sizeof who, "every rank of this process arrived; %s", fsdp_error_msg());
    fsdp_comm_group_format(&sh->g, group, sizeof group);
    snprintf(wait, sizeof wait, "collective %ld (%s of %zu x %s over %s), between processes",
             x->mr.n_coll, fsdp_coll_kind_name(a->kind), a->numel, fsdp_dtype_name(a->dt),
             group);
    fsdp_stall st = {.rank = c->global_rank, .seq = c->flight_seq, .waited_s = waited_s,
                     .wait = wait, .who = who};
    return fsdp_world_stall(c->world, &st);
}

/* The middle of a collective: M2, the leader's round, M3. Every local
 * rank returns the leader's status (the others as ABORTED, quoting it). */
static fsdp_status cross(fsdp_comm *c, int round)
{
    struct mpi_ctx *x = c->ctx;
    struct mpi_shared *sh = x->sh;
    bool leader = c->rank == sh->me * sh->n_local;
    fsdp_meet_arrive(&x->mr, c);
    if (leader) {
        sh->x_st = FSDP_STATUS_OK;
        if (sh->procs && sh->n_procs > 1) {
            double t0 = fsdp_now_s();
            sh->x_st = leader_exchange(c, round);
            if (sh->x_st == FSDP_STATUS_STALLED)
                sh->x_st = stall_report(c, fsdp_now_s() - t0);
            if (sh->x_st != FSDP_STATUS_OK)
                snprintf(sh->msg, sizeof sh->msg, "%s", fsdp_error_msg());
        }
    }
    fsdp_meet_arrive(&x->mr, c);
    if (sh->x_st == FSDP_STATUS_OK)
        return FSDP_STATUS_OK;
    if (leader)
        return sh->x_st;
    return fsdp_error_set(FSDP_STATUS_ABORTED,
                          "rank %d: collective %ld (%s) failed between processes: %s",
                          c->global_rank,
                          x->mr.n_coll, fsdp_coll_kind_name(sh->slots[0].args.kind), sh->msg);
}

/* ---- sums --------------------------------------------------------------------- */

/* The tree over global ranks [lo, hi) of a chunk, block by block, written
 * to out in out_dt (times scale if avg). */
static void sum_chunk(struct mpi_ctx *x, fsdp_mpi_tree_job *jb, int lo, int hi, void *out,
                      fsdp_dtype out_dt, bool avg, float scale)
{
    for (jb->off = 0; jb->off < jb->len; jb->off += FSDP_MPI_BLOCK) {
        jb->n = jb->len - jb->off < FSDP_MPI_BLOCK ? jb->len - jb->off : FSDP_MPI_BLOCK;
        const float *s = fsdp_mpi_tree_eval(jb, lo, hi, x->tmp[0], x->tmp + 1);
        if (out_dt == FSDP_DTYPE_F32) {
            float *o = (float *)out + jb->off;
            for (size_t i = 0; i < jb->n; i++)
                o[i] = avg ? s[i] * scale : s[i];
        } else {
            fsdp_bf16 *o = (fsdp_bf16 *)out + jb->off;
            for (size_t i = 0; i < jb->n; i++)
                o[i] = fsdp_f32_to_bf16(avg ? s[i] * scale : s[i]);
        }
    }
}

/* A tree job over chunk g of every local rank's send buffer. */
static void job_for(struct mpi_ctx *x, fsdp_mpi_tree_job *jb, const fsdp_coll_args *a, int kind,
                    int g)
{
    struct mpi_shared *sh = x->sh;
    int N = sh->n_procs * sh->n_local;
    size_t es = fsdp_dtype_size(a->dt);
    size_t start = kind == FSDP_COLL_REDUCE_SCATTER ? (size_t)g * a->numel
                                                    : fsdp_mpi_slice_start(a->numel, N, g);
    for (int j = 0; j < sh->n_local; j++)
        x->leaf[j] = (const char *)sh->slots[j].send + start * es;
    int L = sh->n_local;
    *jb = (fsdp_mpi_tree_job){.cv = &sh->cover, .me = sh->me, .dt = a->dt, .leaf = x->leaf,
                              .remote = x->remote,
                              .len = fsdp_mpi_chunk_len(kind, a->numel, N, L, g / L, g % L)};
}

/* Phase A of a reduction: local rank j stages, for chunk j of every other
 * process, the payloads of this process's nodes. */
static void stage_payloads(fsdp_comm *c, int kind)
{
    struct mpi_ctx *x = c->ctx;
    struct mpi_shared *sh = x->sh;
    const fsdp_coll_args *a = &sh->slots[0].args;
    const fsdp_mpi_cover *cv = &sh->cover;
    int L = sh->n_local, me = sh->me, j = c->rank - me * L;
    size_t es = fsdp_dtype_size(a->dt);
    for (int q = 0; q < sh->n_procs; q++) {
        if (q == me)
            continue;
        fsdp_mpi_tree_job jb;
        job_for(x, &jb, a, kind, q * L + j);
        unsigned char *base = sh->send_stage + sh->lay.s_off[q] +
                              fsdp_mpi_chunk_off(cv, kind, a->numel, a->dt, me, q, j);
        for (int k = 0; k < cv->n_nodes[me]; k++) {
            int lo = cv->node_lo[me * FSDP_MPI_COVER_MAX + k];
            int hi = cv->node_hi[me * FSDP_MPI_COVER_MAX + k];
            unsigned char *dst = base + fsdp_mpi_node_off(cv, me, k, a->dt, jb.len);
            if (hi - lo == 1)
                copy(dst, x->leaf[lo - me * L], jb.len * es);
            else
                sum_chunk(x, &jb, lo, hi, dst, FSDP_DTYPE_F32, false, 0.0f);
        }
    }
}

/* Phase B of a reduction: this rank's own chunk over the whole job, into
 * out (its recv, at the chunk's place). */
static void finish_sum(fsdp_comm *c, int kind, void *out)
{
    struct mpi_ctx *x = c->ctx;
    struct mpi_shared *sh = x->sh;
    const fsdp_coll_args *a = &sh->slots[0].args;
    int j = c->rank - sh->me * sh->n_local, N = c->n_ranks;
    fsdp_mpi_tree_job jb;
    job_for(x, &jb, a, kind, c->rank);
    for (int q = 0; q < sh->n_procs; q++)
        x->remote[q] = q == sh->me ? NULL
                                   : sh->recv_stage + sh->lay.r_off[q] +
                                         fsdp_mpi_chunk_off(&sh->cover, kind, a->numel, a->dt, q,
                                                            sh->me, j);
    sum_chunk(x, &jb, 0, N, out, a->dt, a->op == FSDP_REDUCE_AVG, 1.0f / (float)N);
}

/* ---- the collectives ----------------------------------------------------------- */

static fsdp_status mpi_all_gather(fsdp_comm *c, const void *send, void *recv, size_t numel,
                                  fsdp_dtype dt, fsdp_stream_t s)
{
    (void)s;
    struct mpi_shared *sh = ((struct mpi_ctx *)c->ctx)->sh;
    FSDP_TRY(begin(c, FSDP_COLL_ALL_GATHER, send, recv, numel, dt, FSDP_REDUCE_SUM, 0));
    int L = sh->n_local, j = c->rank - sh->me * L;
    size_t chunk = numel * fsdp_dtype_size(dt);
    copy(sh->send_stage + (size_t)j * chunk, send, chunk);
    FSDP_TRY(cross(c, 1));
    for (int q = 0; q < sh->n_procs; q++)
        copy((char *)recv + (size_t)q * L * chunk,
               q == sh->me ? sh->send_stage : sh->recv_stage + sh->lay.r_off[q],
               (size_t)L * chunk);
    return FSDP_STATUS_OK;
}

static fsdp_status mpi_reduce_scatter(fsdp_comm *c, const void *send, void *recv, size_t numel,
                                      fsdp_dtype dt, fsdp_reduce_op op, fsdp_stream_t s)
{
    (void)s;
    FSDP_TRY(begin(c, FSDP_COLL_REDUCE_SCATTER, send, recv, numel, dt, op, 0));
    stage_payloads(c, FSDP_COLL_REDUCE_SCATTER);
    FSDP_TRY(cross(c, 1));
    finish_sum(c, FSDP_COLL_REDUCE_SCATTER, recv);
    fsdp_meet_arrive(&((struct mpi_ctx *)c->ctx)->mr, c); /* the others read this send till here */
    return FSDP_STATUS_OK;
}

static fsdp_status mpi_all_reduce(fsdp_comm *c, const void *send, void *recv, size_t numel,
                                  fsdp_dtype dt, fsdp_reduce_op op, fsdp_stream_t s)
{
    (void)s;
    struct mpi_shared *sh = ((struct mpi_ctx *)c->ctx)->sh;
    FSDP_TRY(begin(c, FSDP_COLL_ALL_REDUCE, send, recv, numel, dt, op, 0));
    int N = c->n_ranks, L = sh->n_local, me = sh->me;
    size_t es = fsdp_dtype_size(dt);
    size_t mine = fsdp_mpi_slice_start(numel, N, c->rank);
    size_t first = fsdp_mpi_slice_start(numel, N, me * L);
    stage_payloads(c, FSDP_COLL_ALL_REDUCE);
    FSDP_TRY(cross(c, 1));
    /* in place: this rank writes only its slice, which nobody else reads */
    finish_sum(c, FSDP_COLL_ALL_REDUCE, (char *)recv + mine * es);
    copy(sh->send_stage + sh->lay.s2_off + (mine - first) * es, (char *)recv + mine * es,
         (fsdp_mpi_slice_start(numel, N, c->rank + 1) - mine) * es);
    FSDP_TRY(cross(c, 2));
    for (int q = 0; q < sh->n_procs; q++) {
        size_t at = fsdp_mpi_slice_start(numel, N, q * L);
        if (q == me)
            copy((char *)recv + at * es, sh->send_stage + sh->lay.s2_off, sh->lay.s2_len);
        else
            copy((char *)recv + at * es, sh->recv_stage + sh->lay.r2_off[q], sh->lay.r2_len[q]);
    }
    return FSDP_STATUS_OK;
}

static fsdp_status mpi_broadcast(fsdp_comm *c, void *buf, size_t numel, fsdp_dtype dt, int root,
                                 fsdp_stream_t s)
{
    (void)s;
    struct mpi_shared *sh = ((struct mpi_ctx *)c->ctx)->sh;
    FSDP_TRY(begin(c, FSDP_COLL_BROADCAST, NULL, buf, numel, dt, FSDP_REDUCE_SUM, root));
    size_t bytes = numel * fsdp_dtype_size(dt);
    int from = root / sh->n_local;
    if (c->rank == root)
        copy(sh->send_stage, buf, bytes);
    FSDP_TRY(cross(c, 1));
    if (c->rank != root)
        copy(buf, from == sh->me ? sh->send_stage : sh->recv_stage + sh->lay.r_off[from],
               bytes);
    return FSDP_STATUS_OK;
}

static fsdp_status mpi_barrier(fsdp_comm *c)
{
    FSDP_TRY(begin(c, FSDP_COLL_BARRIER, NULL, NULL, 0, FSDP_DTYPE_F32, FSDP_REDUCE_SUM, 0));
    return cross(c, 1);
}

/* ---- lifetime ------------------------------------------------------------------- */

static void shared_free(struct mpi_shared *sh)
{
    if (!sh)
        return;
    if (sh->broken) /* a transfer given up on may still use the buffers: the job is */
        return;     /* ending (procs.h), so they are left to the process's end */
    free(sh->send_stage);
    free(sh->recv_stage);
    fsdp_meet_fini(&sh->meet);
    free(sh->msgs);
    free(sh->hdrs);
    free(sh->procs_of);
    fsdp_mpi_layout_free(&sh->lay);
    fsdp_mpi_cover_fini(&sh->cover);
    free(sh);
}

/* This transport's tables of members, in the world's registry (comm.h). */
static const fsdp_meet_kind mpi_meet_kind;

static void mpi_fini(fsdp_comm *c)
{
    struct mpi_ctx *x = c->ctx;
    if (!x)
        return;
    fsdp_meet_detach(&x->mr, c->world, &mpi_meet_kind, &c->group);
    free(x->tmp);
    free(x->tmp_mem);
    free(x->leaf);
    free(x->remote);
    free(x);
    c->ctx = NULL;
}

static const struct fsdp_comm_i mpi_comm_i = {
    /* .name           = */ "mpi",
    /* .all_gather     = */ mpi_all_gather,
    /* .reduce_scatter = */ mpi_reduce_scatter,
    /* .all_reduce     = */ mpi_all_reduce,
    /* .broadcast      = */ mpi_broadcast,
    /* .barrier        = */ mpi_barrier,
    /* .fini           = */ mpi_fini,
    /* .host_code      = */ true, /* collectives on the host: in stream order */
    /* .inert          = */ false,
};

/* The channel of group g's transfers: a function of the group alone, the
 * same in every process (comm.h's groups of one job differ in first or
 * stride; first < FSDP_MAX_RANKS, stride <= FSDP_MAX_RANKS: well inside
 * MPI's tag range). */
static int group_channel(const fsdp_comm_group *g)
{
    return 1 + g->first + FSDP_MAX_RANKS * g->stride;
}

static void shared_destroy(fsdp_meet *m) { shared_free((struct mpi_shared *)m); }

/* What the first member of a group knows about it: P processes (procs_of)
 * of L members each, this process being block me. */
struct shared_shape {
    int P, L, me;
    const int *procs_of;
};

/* The group's shared state, created by its first member (w->mu held). */
static fsdp_status shared_create(fsdp_world *w, const fsdp_comm_group *g, void *arg,
                                 fsdp_meet **out)
{
    const struct shared_shape *sp = arg;
    int P = sp->P, L = sp->L;
    struct mpi_shared *sh = calloc(1, sizeof *sh);
    if (!sh)
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory for collectives "
                              "between processes");
    sh->n_local = L;
    sh->n_procs = P;
    sh->me = sp->me;
    sh->g = *g;
    sh->procs = w->procs;
    bool slots = fsdp_meet_init(&sh->meet, L);
    sh->slots = sh->meet.slots;
    sh->msgs = calloc(2 * (size_t)P, sizeof *sh->msgs);
    sh->hdrs = calloc((size_t)P, sizeof *sh->hdrs);
    sh->procs_of = calloc((size_t)P, sizeof *sh->procs_of);
    fsdp_status st = !slots || !sh->msgs || !sh->hdrs || !sh->procs_of
                         ? fsdp_error_set(FSDP_STATUS_OOM, "out of host memory for "
                                          "collectives between %d processes", P)
                         : fsdp_mpi_layout_alloc(&sh->lay, P);
    if (st == FSDP_STATUS_OK)
        st = fsdp_mpi_cover_init(&sh->cover, P, L);
    if (st != FSDP_STATUS_OK) {
        shared_free(sh);
        return st;
    }
    memcpy(sh->procs_of, sp->procs_of, (size_t)P * sizeof *sp->procs_of);
    sh->channel = group_channel(g);
    *out = &sh->meet;
    return FSDP_STATUS_OK;
}

static const fsdp_meet_kind mpi_meet_kind = {
    /* .name    = */ "mpi",
    /* .what    = */ "collectives between processes",
    /* .create  = */ shared_create,
    /* .destroy = */ shared_destroy,
};

fsdp_status fsdp_comm_mpi_init_group(fsdp_comm *c, fsdp_world *w, fsdp_device *dev,
                                     const fsdp_comm_group *g, int rank)
{
    memset(c, 0, sizeof *c);
    FSDP_TRY(fsdp_comm_group_check(g, w, rank, "mpi collectives"));
    if (!fsdp_world_is_local(w, rank))
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "mpi collectives: rank %d does not run in this process", rank);
    int *procs_of = calloc((size_t)g->count, sizeof *procs_of), P = 0, L = 0;
    if (!procs_of)
        return fsdp_error_set(FSDP_STATUS_OOM, "rank %d: out of host memory", rank);
    fsdp_status st = fsdp_comm_group_layout(g, w->n_local, &P, &L, procs_of);
    if (st != FSDP_STATUS_OK || P == 1) {
        free(procs_of);
        if (st != FSDP_STATUS_OK) {
            fsdp_error_prefix("rank %d: mpi collectives", rank);
            return st;
        }
        /* inside one process: the host transport is this one's local half */
        return fsdp_comm_host_init_group(c, w, dev, g, rank);
    }
    fsdp_procs *p = w->procs;
    if (!p || !p->iface->xfer) {
        free(procs_of);
        return fsdp_error_set(FSDP_STATUS_UNSUPPORTED,
                              "rank %d: the cpu backend's collectives across %d processes need "
                              "MPI, but this job's processes met through %s, which carries no "
                              "collective data: launch them with mpirun (a build with MPI)",
                              rank, w->n_processes,
                              p ? fsdp_names_name(&fsdp_procs_kind_names, (int)p->kind) : "?");
    }
    int index = fsdp_comm_group_index(g, rank), me = index / L;
    struct mpi_ctx *x = calloc(1, sizeof *x);
    if (!x) {
        free(procs_of);
        return fsdp_error_set(FSDP_STATUS_OOM, "rank %d: out of host memory", rank);
    }
    struct shared_shape shape = {P, L, me, procs_of};
    st = fsdp_meet_attach(&x->mr, w, &mpi_meet_kind, g, rank, index - me * L, &shape);
    free(procs_of);
    if (st != FSDP_STATUS_OK) {
        free(x);
        return st;
    }
    x->sh = (struct mpi_shared *)x->mr.m;
    int depth = x->sh->cover.depth + 1;
    x->tmp = calloc((size_t)depth, sizeof *x->tmp);
    x->tmp_mem = aligned_alloc(64, (size_t)depth * FSDP_MPI_BLOCK * sizeof(float));
    x->leaf = calloc((size_t)L, sizeof *x->leaf);
    x->remote = calloc((size_t)P, sizeof *x->remote);
    fsdp_comm_bind(c, &mpi_comm_i, w, dev, g, rank, x);
    if (!x->tmp || !x->tmp_mem || !x->leaf || !x->remote) {
        mpi_fini(c);
        c->iface = NULL;
        return fsdp_error_set(FSDP_STATUS_OOM, "rank %d: out of host memory for collective "
                              "scratch", rank);
    }
    for (int i = 0; i < depth; i++)
        x->tmp[i] = x->tmp_mem + (size_t)i * FSDP_MPI_BLOCK;
    return FSDP_STATUS_OK;
}

fsdp_status fsdp_comm_mpi_init(fsdp_comm *c, fsdp_world *w, fsdp_device *dev, int rank)
{
    fsdp_comm_group g = fsdp_comm_group_all(w ? w->n_ranks : 0);
    return fsdp_comm_mpi_init_group(c, w, dev, &g, rank);
}
