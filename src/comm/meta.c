/*
 * meta.c - the `meta` transport: collectives that move nothing. The
 * generic wrappers (comm.c) count each rank's logical bytes; this counts
 * the bytes that would cross between nodes, as the `mpi` transport's
 * layout (mpi_layout.h) says, for the nodes the group's node_ranks
 * describe, so a plan of P nodes in one process shows what a job of P
 * processes moves between them. The barrier still synchronises the local
 * ranks.
 */
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "comm/mpi_layout.h"
#include "core/world.h"

/* The inter-node figures of a meta communicator: the layout of its group
 * on nodes, counted on each node's first member (as the mpi transport's
 * leader counts what it moves). */
struct meta_ctx {
    bool counts;             /* a node's first member of a group on several nodes */
    int node;                /* this member's block (node index within the group) */
    fsdp_mpi_cover cover;
    fsdp_mpi_layout lay;
};

static void meta_count(fsdp_comm *c, fsdp_coll_kind kind, size_t numel, fsdp_dtype dt, int root)
{
    struct meta_ctx *m = c->ctx;
    if (!m || !m->counts)
        return;
    size_t sent, recv;
    fsdp_mpi_layout_of(&m->cover, m->node, (int)kind, numel, dt, root, &m->lay);
    fsdp_mpi_layout_inter_bytes(&m->lay, m->cover.n_procs, m->node, &sent, &recv);
    c->bytes_inter_sent[kind] += sent;
    c->bytes_inter_recv[kind] += recv;
}

static fsdp_status meta_all_gather(fsdp_comm *c, const void *send, void *recv, size_t numel,
                                   fsdp_dtype dt, fsdp_stream_t s)
{
    meta_count(c, FSDP_COLL_ALL_GATHER, numel, dt, 0);
    return FSDP_STATUS_OK;
}

static fsdp_status meta_reduce_scatter(fsdp_comm *c, const void *send, void *recv, size_t numel,
                                       fsdp_dtype dt, fsdp_reduce_op op, fsdp_stream_t s)
{
    meta_count(c, FSDP_COLL_REDUCE_SCATTER, numel, dt, 0);
    return FSDP_STATUS_OK;
}

static fsdp_status meta_all_reduce(fsdp_comm *c, const void *send, void *recv, size_t numel,
                                   fsdp_dtype dt, fsdp_reduce_op op, fsdp_stream_t s)
{
    meta_count(c, FSDP_COLL_ALL_REDUCE, numel, dt, 0);
    return FSDP_STATUS_OK;
}

static fsdp_status meta_broadcast(fsdp_comm *c, void *buf, size_t numel, fsdp_dtype dt, int root,
                                  fsdp_stream_t s)
{
    meta_count(c, FSDP_COLL_BROADCAST, numel, dt, root);
    return FSDP_STATUS_OK;
}

/* The barrier still synchronises the local ranks so that schedules that
 * rely on it behave as on real backends. */
static fsdp_status meta_barrier(fsdp_comm *c) { return fsdp_world_barrier(c->world); }

static void meta_fini(fsdp_comm *c)
{
    struct meta_ctx *m = c->ctx;
    if (!m)
        return;
    fsdp_mpi_layout_free(&m->lay);
    fsdp_mpi_cover_fini(&m->cover);
    free(m);
    c->ctx = NULL;
}

static const struct fsdp_comm_i meta_comm_i = {
    /* .name           = */ "meta",
    /* .all_gather     = */ meta_all_gather,
    /* .reduce_scatter = */ meta_reduce_scatter,
    /* .all_reduce     = */ meta_all_reduce,
    /* .broadcast      = */ meta_broadcast,
    /* .barrier        = */ meta_barrier,
    /* .fini           = */ meta_fini,
    /* .host_code      = */ false, /* counts only: at once, on the calling thread */
    /* .inert          = */ true,
};

fsdp_status fsdp_comm_meta_init_group(fsdp_comm *c, fsdp_world *w, fsdp_device *dev,
                                      const fsdp_comm_group *g, int rank)
{
    memset(c, 0, sizeof *c);
    FSDP_TRY(fsdp_comm_group_check(g, w, rank, "meta collectives"));
    fsdp_comm_bind(c, &meta_comm_i, w, dev, g, rank, NULL);
    int node_ranks = g->node_ranks > 0 ? g->node_ranks : w->n_local;
    int *nodes = calloc((size_t)g->count, sizeof *nodes), P = 1, L = g->count;
    if (!nodes)
        return fsdp_error_set(FSDP_STATUS_OOM, "rank %d: out of host memory", rank);
    fsdp_status st = fsdp_comm_group_layout(g, node_ranks, &P, &L, nodes);
    free(nodes);
    if (st != FSDP_STATUS_OK) { /* counted as one node: no inter-node bytes */
        fsdp_error_clear();
        P = 1;
    }
    if (P < 2)
        return FSDP_STATUS_OK;
    struct meta_ctx *m = calloc(1, sizeof *m);
    if (!m)
        return fsdp_error_set(FSDP_STATUS_OOM, "rank %d: out of host memory", rank);
    c->ctx = m;
    m->node = c->rank / L;
    m->counts = c->rank % L == 0;
    st = fsdp_mpi_cover_init(&m->cover, P, L);
    if (st == FSDP_STATUS_OK)
        st = fsdp_mpi_layout_alloc(&m->lay, P);
    if (st != FSDP_STATUS_OK) {
        meta_fini(c);
        c->iface = NULL;
    }
    return st;
}

fsdp_status fsdp_comm_meta_init(fsdp_comm *c, fsdp_world *w, fsdp_device *dev, int rank)
{
    fsdp_comm_group g = fsdp_comm_group_all(w ? w->n_ranks : 0);
    return fsdp_comm_meta_init_group(c, w, dev, &g, rank);
}
