/*
 * comm.c - generic collective wrappers (byte counting, NULL slots), the
 * meta communicator, and the reference tree sum.
 */
#include <string.h>

#include "comm/comm.h"
#include "core/log.h"
#include "core/world.h"

const char *fsdp_coll_kind_name(fsdp_coll_kind k)
{
    static const char *const names[FSDP_COLL_KIND_COUNT] = {
        "all_gather", "reduce_scatter", "all_reduce", "broadcast",
    };
    return (unsigned)k < FSDP_COLL_KIND_COUNT ? names[k] : "?";
}

float fsdp_tree_sum(const float *x, int n)
{
    if (n <= 0)
        return 0.0f;
    if (n == 1)
        return x[0];
    int mid = n / 2;
    float a = fsdp_tree_sum(x, mid);
    float b = fsdp_tree_sum(x + mid, n - mid);
    return a + b;
}

static void count(fsdp_comm *c, fsdp_coll_kind k, size_t sent, size_t recv)
{
    c->bytes_sent[k] += sent;
    c->bytes_recv[k] += recv;
    c->n_calls[k]++;
}

fsdp_status fsdp_comm_all_gather(fsdp_comm *c, const void *send, void *recv, size_t numel,
                                 fsdp_dtype dt, fsdp_stream_t s)
{
    size_t chunk = numel * fsdp_dtype_size(dt);
    count(c, FSDP_COLL_ALL_GATHER, chunk * (size_t)(c->n_ranks - 1),
          chunk * (size_t)(c->n_ranks - 1));
    if (!c->iface->all_gather)
        return FSDP_STATUS_OK;
    return c->iface->all_gather(c, send, recv, numel, dt, s ? s : c->dev->comm);
}

fsdp_status fsdp_comm_reduce_scatter(fsdp_comm *c, const void *send, void *recv, size_t numel,
                                     fsdp_dtype dt, fsdp_reduce_op op, fsdp_stream_t s)
{
    size_t chunk = numel * fsdp_dtype_size(dt);
    count(c, FSDP_COLL_REDUCE_SCATTER, chunk * (size_t)(c->n_ranks - 1),
          chunk * (size_t)(c->n_ranks - 1));
    if (!c->iface->reduce_scatter)
        return FSDP_STATUS_OK;
    return c->iface->reduce_scatter(c, send, recv, numel, dt, op, s ? s : c->dev->comm);
}

fsdp_status fsdp_comm_all_reduce(fsdp_comm *c, const void *send, void *recv, size_t numel,
                                 fsdp_dtype dt, fsdp_reduce_op op, fsdp_stream_t s)
{
    size_t bytes = numel * fsdp_dtype_size(dt);
    size_t moved = 2 * (bytes * (size_t)(c->n_ranks - 1) / (size_t)c->n_ranks);
    count(c, FSDP_COLL_ALL_REDUCE, moved, moved);
    if (!c->iface->all_reduce)
        return FSDP_STATUS_OK;
    return c->iface->all_reduce(c, send, recv, numel, dt, op, s ? s : c->dev->comm);
}

fsdp_status fsdp_comm_broadcast(fsdp_comm *c, void *buf, size_t numel, fsdp_dtype dt, int root,
                                fsdp_stream_t s)
{
    size_t bytes = numel * fsdp_dtype_size(dt);
    if (c->n_ranks > 1)
        count(c, FSDP_COLL_BROADCAST, c->rank == root ? bytes : 0, c->rank == root ? 0 : bytes);
    else
        c->n_calls[FSDP_COLL_BROADCAST]++;
    if (!c->iface->broadcast)
        return FSDP_STATUS_OK;
    return c->iface->broadcast(c, buf, numel, dt, root, s ? s : c->dev->comm);
}

fsdp_status fsdp_comm_barrier(fsdp_comm *c)
{
    if (!c->iface->barrier)
        return FSDP_STATUS_OK;
    return c->iface->barrier(c);
}

void fsdp_comm_fini(fsdp_comm *c)
{
    if (c->iface && c->iface->fini)
        c->iface->fini(c);
    c->iface = NULL;
}

void fsdp_comm_reset_stats(fsdp_comm *c)
{
    memset(c->bytes_sent, 0, sizeof c->bytes_sent);
    memset(c->bytes_recv, 0, sizeof c->bytes_recv);
    memset(c->n_calls, 0, sizeof c->n_calls);
    memset(c->bytes_inter_sent, 0, sizeof c->bytes_inter_sent);
    memset(c->bytes_inter_recv, 0, sizeof c->bytes_inter_recv);
}

size_t fsdp_comm_total_sent(const fsdp_comm *c)
{
    size_t t = 0;
    for (int k = 0; k < FSDP_COLL_KIND_COUNT; k++)
        t += c->bytes_sent[k];
    return t;
}

size_t fsdp_comm_total_recv(const fsdp_comm *c)
{
    size_t t = 0;
    for (int k = 0; k < FSDP_COLL_KIND_COUNT; k++)
        t += c->bytes_recv[k];
    return t;
}

/* Meta: count only. The barrier still synchronises so that schedules that
 * rely on it behave as on real backends. */
static fsdp_status meta_barrier(fsdp_comm *c) { return fsdp_world_barrier(c->world); }

static const struct fsdp_comm_i meta_comm_i = {
    /* .name           = */ "meta",
    /* .all_gather     = */ NULL, /* optional: count only */
    /* .reduce_scatter = */ NULL,
    /* .all_reduce     = */ NULL,
    /* .broadcast      = */ NULL,
    /* .barrier        = */ meta_barrier,
    /* .fini           = */ NULL,
};

fsdp_status fsdp_comm_meta_init(fsdp_comm *c, fsdp_world *w, fsdp_device *dev, int rank)
{
    memset(c, 0, sizeof *c);
    c->iface = &meta_comm_i;
    c->world = w;
    c->dev = dev;
    c->rank = rank;
    c->n_ranks = w->n_ranks;
    return FSDP_STATUS_OK;
}
