/*
 * comm.c - generic collective wrappers (byte counting, NULL slots),
 * groups and the registry of their shared state, and the check that every
 * rank issued the same collective.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "comm/comm.h"
#include "core/str.h"
#include "core/flight.h"
#include "core/log.h"
#include "core/world.h"

/* ---- groups ---------------------------------------------------------------------- */

int fsdp_comm_group_index(const fsdp_comm_group *g, int rank)
{
    int d = rank - g->first;
    if (d < 0 || g->stride < 1 || d % g->stride)
        return -1;
    return d / g->stride < g->count ? d / g->stride : -1;
}

fsdp_status fsdp_comm_group_check(const fsdp_comm_group *g, const fsdp_world *w, int rank,
                                  const char *who)
{
    if (!w || g->count < 1 || g->stride < 1 || g->first < 0 ||
        (long)g->first + (long)(g->count - 1) * g->stride >= w->n_ranks)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "%s: group {first %d, stride %d, count %d} is not a group of the "
                              "world's %d ranks", who, g->first, g->stride, g->count,
                              w ? w->n_ranks : 0);
    if (fsdp_comm_group_index(g, rank) < 0)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "%s: rank %d is not a member of group {first %d, stride %d, count "
                              "%d}", who, rank, g->first, g->stride, g->count);
    return FSDP_STATUS_OK;
}

fsdp_status fsdp_comm_group_layout(const fsdp_comm_group *g, int node_ranks, int *n_blocks,
                                   int *per_block, int *nodes)
{
    int P = 0, L = -1, run = 0;
    for (int i = 0; i < g->count; i++) {
        int node = fsdp_comm_group_rank(g, i) / node_ranks;
        if (P > 0 && node == nodes[P - 1]) {
            run++;
            continue;
        }
        if (P > 0 && L >= 0 && run != L)
            goto irregular;
        if (P > 0 && L < 0)
            L = run;
        for (int k = 0; k < P; k++)
            if (nodes[k] == node)
                goto irregular;
        nodes[P++] = node;
        run = 1;
    }
    if (L >= 0 && run != L)
        goto irregular;
    *n_blocks = P;
    *per_block = run;
    return FSDP_STATUS_OK;
irregular:
    return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                          "group {first %d, stride %d, count %d} does not hold the same number "
                          "of consecutive members on each node of %d ranks",
                          g->first, g->stride, g->count, node_ranks);
}

/* One entry of the registry of shared states (w->comm_shared). */
struct shared_entry {
    struct shared_entry *next;
    const void *tag;
    fsdp_comm_group g;
    void *state;
};

static bool same_group(const fsdp_comm_group *a, const fsdp_comm_group *b)
{
    return a->first == b->first && a->stride == b->stride && a->count == b->count;
}

void **fsdp_comm_shared_slot_locked(fsdp_world *w, const void *tag, const fsdp_comm_group *g)
{
    for (struct shared_entry *e = w->comm_shared; e; e = e->next)
        if (e->tag == tag && same_group(&e->g, g))
            return &e->state;
    struct shared_entry *e = calloc(1, sizeof *e);
    if (!e)
        return NULL;
    e->tag = tag;
    e->g = *g;
    e->next = w->comm_shared;
    w->comm_shared = e;
    return &e->state;
}

void fsdp_comm_shared_drop_locked(fsdp_world *w, const void *tag, const fsdp_comm_group *g)
{
    for (struct shared_entry **pe = (struct shared_entry **)&w->comm_shared; *pe;
         pe = &(*pe)->next) {
        struct shared_entry *e = *pe;
        if (e->tag == tag && same_group(&e->g, g)) {
            *pe = e->next;
            free(e);
            return;
        }
    }
}

const char *fsdp_coll_kind_name(int kind)
{
    static const char *const names[FSDP_COLL_KIND_COUNT + 1] = {
        "all_gather", "reduce_scatter", "all_reduce", "broadcast", "barrier",
    };
    return (unsigned)kind <= FSDP_COLL_BARRIER ? names[kind] : "?";
}

bool fsdp_coll_args_match(const fsdp_coll_args *a, const fsdp_coll_args *b)
{
    return a->kind == b->kind && a->numel == b->numel && a->dt == b->dt &&
           (a->kind != FSDP_COLL_BROADCAST || a->root == b->root) &&
           (!fsdp_coll_kind_is_reduction(a->kind) || a->op == b->op);
}

void fsdp_coll_args_format(const fsdp_coll_args *a, char *buf, size_t n)
{
    snprintf(buf, n, "%s(%zu x %s, op %d, root %d)", fsdp_coll_kind_name(a->kind), a->numel,
             fsdp_dtype_name(a->dt), (int)a->op, a->root);
}

fsdp_status fsdp_coll_args_check(int rank, long k, const fsdp_coll_args *mine, int other,
                                 const fsdp_coll_args *theirs)
{
    if (fsdp_coll_args_match(mine, theirs))
        return FSDP_STATUS_OK;
    char a[96], b[96];
    fsdp_coll_args_format(mine, a, sizeof a);
    fsdp_coll_args_format(theirs, b, sizeof b);
    return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                          "rank %d: collective %ld mismatch: this rank issued %s but rank %d "
                          "issued %s; every rank must issue the same collectives in the same "
                          "order with the same sizes",
                          rank, k, a, other, b);
}

void fsdp_comm_bind(fsdp_comm *c, const struct fsdp_comm_i *iface, fsdp_world *w,
                    fsdp_device *dev, const fsdp_comm_group *g, int rank, void *ctx)
{
    c->iface = iface;
    c->world = w;
    c->dev = dev;
    c->group = *g;
    c->rank = fsdp_comm_group_index(g, rank);
    c->n_ranks = g->count;
    c->global_rank = rank;
    c->ctx = ctx;
}

fsdp_status fsdp_comm_begin_check(const fsdp_comm *c, int rank, long k, int kind,
                                  const void *send, const void *recv, size_t numel,
                                  fsdp_dtype dt, fsdp_reduce_op op, int root)
{
    const char *what = fsdp_coll_kind_name(kind);
    if (c->world && fsdp_world_fault_hit(c->world, FSDP_FAULT_COLLECTIVE, rank))
        return fsdp_error_set(FSDP_STATUS_INTERNAL,
                              "rank %d: injected failure in collective %ld (%s)", rank, k, what);
    if (c->world && fsdp_world_fault_hit(c->world, FSDP_FAULT_STALL, rank)) {
        fsdp_world_wait_aborted(c->world); /* never arrives: the others' watchdog ends it */
        return fsdp_error_set(FSDP_STATUS_ABORTED, "rank %d: collective %ld (%s) held back by "
                              "FSDP_FAULT until the job stopped", rank, k, what);
    }
    if (kind == FSDP_COLL_BARRIER)
        return FSDP_STATUS_OK;
    if ((unsigned)dt >= FSDP_DTYPE_COUNT)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "rank %d: %s: unknown dtype %d; use FSDP_DTYPE_F32 or "
                              "FSDP_DTYPE_BF16", rank, what, (int)dt);
    if ((unsigned)op > FSDP_REDUCE_AVG)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "rank %d: %s: unknown reduce op %d; use FSDP_REDUCE_SUM or "
                              "FSDP_REDUCE_AVG", rank, what, (int)op);
    if (root < 0 || root >= c->n_ranks)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "rank %d: broadcast root %d is not a rank of this world "
                              "(0..%d)", rank, root, c->n_ranks - 1);
    if (numel && (!recv || (kind != FSDP_COLL_BROADCAST && !send)))
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "rank %d: %s of %zu elements given a NULL buffer", rank, what,
                              numel);
    return FSDP_STATUS_OK;
}

static void count(fsdp_comm *c, fsdp_coll_kind k, size_t sent, size_t recv)
{
    c->bytes_sent[k] += sent;
    c->bytes_recv[k] += recv;
    c->n_calls[k]++;
}

const char *fsdp_comm_group_format(const fsdp_comm_group *g, char *buf, size_t n)
{
    int last = fsdp_comm_group_rank(g, g->count - 1);
    if (g->count == 1)
        snprintf(buf, n, "rank %d", g->first);
    else if (g->stride == 1)
        snprintf(buf, n, "ranks %d-%d", g->first, last);
    else if (g->count <= 4) {
        size_t at = (size_t)snprintf(buf, n, "ranks %d", g->first);
        for (int i = 1; i < g->count && at < n; i++)
            at += (size_t)snprintf(buf + at, n - at, ", %d", fsdp_comm_group_rank(g, i));
    } else
        snprintf(buf, n, "ranks %d, %d, ..., %d", g->first, g->first + g->stride, last);
    return buf;
}

/* One collective call, as the wrappers below issue it. */
typedef struct coll_call {
    fsdp_comm *c;
    int kind;             /* fsdp_coll_kind */
    const void *send;
    void *recv;           /* the buffer of a broadcast */
    size_t numel;
    fsdp_dtype dt;
    fsdp_reduce_op op;
    int root;
    fsdp_stream_t s;
    long seq;             /* its flight record entry (core/flight.h) */
} coll_call;

/* Record that c's rank issues a collective (the flight record). */
static long flight_issue(fsdp_comm *c, int kind, size_t numel, const char *dtype,
                         const char *label)
{
    const fsdp_flight_coll rec = {fsdp_coll_kind_name(kind), dtype, numel, c->group.first,
                                  c->group.stride, c->group.count, label};
    return fsdp_flight_issue(c->world->flight, c->global_rank, &rec);
}

/* On the thread that runs it: the collective, between its flight record
 * marks. */
static fsdp_status run_coll(void *p)
{
    const coll_call *a = p;
    fsdp_comm *c = a->c;
    fsdp_status st;
    bool record = !c->iface->inert;
    if (record)
        fsdp_flight_start(c->world->flight, c->global_rank, a->seq);
    c->flight_seq = a->seq;
    switch (a->kind) {
    case FSDP_COLL_ALL_GATHER:
        st = c->iface->all_gather(c, a->send, a->recv, a->numel, a->dt, a->s);
        break;
    case FSDP_COLL_REDUCE_SCATTER:
        st = c->iface->reduce_scatter(c, a->send, a->recv, a->numel, a->dt, a->op, a->s);
        break;
    case FSDP_COLL_ALL_REDUCE:
        st = c->iface->all_reduce(c, a->send, a->recv, a->numel, a->dt, a->op, a->s);
        break;
    default: st = c->iface->broadcast(c, a->recv, a->numel, a->dt, a->root, a->s);
    }
    if (record)
        fsdp_flight_end(c->world->flight, c->global_rank, a->seq, st == FSDP_STATUS_OK);
    return st;
}

void fsdp_comm_label(fsdp_comm *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->label, sizeof c->label, fmt, ap);
    va_end(ap);
}

void fsdp_comm_label_str(fsdp_comm *c, const char *label)
{
    fsdp_str_copy(c->label, sizeof c->label, label);
}

/* Issue a collective on its stream (NULL: the device's comm stream). A
 * transport whose collectives are host code runs them in the stream's
 * order through the device (fsdp_device_launch_host): at once where stream
 * work runs inline, on the stream's worker in the cpu backend's async mode,
 * where a failure then surfaces at the next sync, named by the label. */
static fsdp_status issue(coll_call a)
{
    if (a.c->iface->inert) { /* nothing to record or name: it cannot fail or wait */
        a.c->label[0] = '\0';
        return run_coll(&a);
    }
    char label[sizeof a.c->label];
    fsdp_str_copy(label, sizeof label, a.c->label[0] ? a.c->label : fsdp_coll_kind_name(a.kind));
    a.seq = flight_issue(a.c, a.kind, a.numel, fsdp_dtype_name(a.dt),
                         a.c->label[0] ? a.c->label : NULL);
    a.c->label[0] = '\0';
    if (a.c->dev && !a.s)
        a.s = a.c->dev->comm;
    fsdp_status st;
    if (a.c->dev && a.c->iface->host_code)
        st = fsdp_device_launch_host(a.c->dev, a.s, run_coll, &a, sizeof a, label);
    else
        st = run_coll(&a); /* device work queued by the transport, or no device */
    if (st != FSDP_STATUS_OK && strcmp(label, fsdp_coll_kind_name(a.kind)))
        fsdp_error_prefix("%s", label);
    return st;
}

fsdp_status fsdp_comm_all_gather(fsdp_comm *c, const void *send, void *recv, size_t numel,
                                 fsdp_dtype dt, fsdp_stream_t s)
{
    size_t chunk = numel * fsdp_dtype_size(dt);
    count(c, FSDP_COLL_ALL_GATHER, chunk * (size_t)(c->n_ranks - 1),
          chunk * (size_t)(c->n_ranks - 1));
    if (!c->iface->all_gather)
        return FSDP_STATUS_OK;
    return issue((coll_call){c, FSDP_COLL_ALL_GATHER, send, recv, numel, dt, 0, 0, s, 0});
}

fsdp_status fsdp_comm_reduce_scatter(fsdp_comm *c, const void *send, void *recv, size_t numel,
                                     fsdp_dtype dt, fsdp_reduce_op op, fsdp_stream_t s)
{
    size_t chunk = numel * fsdp_dtype_size(dt);
    count(c, FSDP_COLL_REDUCE_SCATTER, chunk * (size_t)(c->n_ranks - 1),
          chunk * (size_t)(c->n_ranks - 1));
    if (!c->iface->reduce_scatter)
        return FSDP_STATUS_OK;
    return issue((coll_call){c, FSDP_COLL_REDUCE_SCATTER, send, recv, numel, dt, op, 0, s, 0});
}

fsdp_status fsdp_comm_all_reduce(fsdp_comm *c, const void *send, void *recv, size_t numel,
                                 fsdp_dtype dt, fsdp_reduce_op op, fsdp_stream_t s)
{
    size_t bytes = numel * fsdp_dtype_size(dt);
    size_t moved = 2 * (bytes * (size_t)(c->n_ranks - 1) / (size_t)c->n_ranks);
    count(c, FSDP_COLL_ALL_REDUCE, moved, moved);
    if (!c->iface->all_reduce)
        return FSDP_STATUS_OK;
    return issue((coll_call){c, FSDP_COLL_ALL_REDUCE, send, recv, numel, dt, op, 0, s, 0});
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
    return issue((coll_call){c, FSDP_COLL_BROADCAST, NULL, buf, numel, dt, 0, root, s, 0});
}

/* A host-code transport: wait until the device's streams have run what is
 * queued on them, collectives of c included. Stops at the first failure. */
static fsdp_status host_work_drain(fsdp_comm *c)
{
    if (!c->iface->host_code || !c->dev)
        return FSDP_STATUS_OK;
    for (int k = 0; k < 3; k++) {
        fsdp_stream_t s = k == 0 ? c->dev->compute : k == 1 ? c->dev->comm : c->dev->copy;
        FSDP_TRY(fsdp_device_stream_sync(c->dev, s));
    }
    return FSDP_STATUS_OK;
}

fsdp_status fsdp_comm_barrier(fsdp_comm *c)
{
    if (!c->iface->barrier)
        return FSDP_STATUS_OK;
    FSDP_TRY(host_work_drain(c)); /* a host barrier: the queued work first */
    long seq = flight_issue(c, FSDP_COLL_BARRIER, 0, NULL, c->label[0] ? c->label : NULL);
    c->label[0] = '\0';
    fsdp_flight_start(c->world->flight, c->global_rank, seq);
    c->flight_seq = seq;
    fsdp_status st = c->iface->barrier(c);
    fsdp_flight_end(c->world->flight, c->global_rank, seq, st == FSDP_STATUS_OK);
    return st;
}

void fsdp_comm_fini(fsdp_comm *c)
{
    if (c->iface && c->dev && c->iface->host_code) {
        /* collectives still queued on a stream read c: they run first (a
         * failed device skips them); the caller's message is kept */
        char msg[FSDP_ERROR_MSG_MAX];
        snprintf(msg, sizeof msg, "%s", fsdp_error_msg());
        if (host_work_drain(c) != FSDP_STATUS_OK)
            fsdp_error_copy(msg);
    }
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
