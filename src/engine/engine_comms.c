/*
 * engine_comms.c - the engine's communicators and what its ranks tell each
 * other each step.
 *
 * Communicators (comm/transport.h picks the transport for the job): one
 * over every rank of the job; with hybrid sharding on several nodes also
 * one over the ranks of this rank's node (gathers and reduce-scatters:
 * `shard_comm`) and one over the ranks with this rank's local index on
 * every node (the all-reduce of gradient shards across nodes:
 * `replica_comm`). A group that is the whole job is the job's
 * communicator itself.
 *
 * Exchanges: per-rank host records go through the job's communicator (an
 * all-gather staged in device memory), so they reach every process of a
 * job; their bytes are not counted in the step's traffic, which is the
 * training's (gathers, reductions), as the planner and the metrics report
 * it. Each step exchanges two records per rank: the gradient norm's
 * partial sums (norm_cover.h) and the rank's losses before the update
 * (a non-finite step applies none), and the rank's figures after it.
 */
#include <math.h>
#include <string.h>

#include "core/world.h"
#include "engine/engine_internal.h"

/* ---- communicators ------------------------------------------------------------ */

fsdp_status fsdp_engine_comms_init(fsdp_engine *e)
{
    const fsdp_engine_config *cfg = &e->sh->cfg;
    fsdp_world *w = e->sh->world;
    int N = cfg->n_ranks, nodes = e->sh->sm.n_nodes, L = N / nodes;
    fsdp_transport_req req = {.backend = cfg->backend, .kind = cfg->comm,
                              .ranks_per_device = cfg->ranks_per_device,
                              .n_processes = w->n_processes};
    fsdp_comm_group all = {0, 1, N, L};
    FSDP_TRY(fsdp_comm_init_group(&e->comm, &req, w, &e->dev, &all, e->rank));
    e->comm_ready = true;
    e->shard_comm = &e->comm;
    e->replica_comm = NULL;
    if (cfg->shard != FSDP_SHARD_HYBRID || nodes == 1)
        return FSDP_STATUS_OK;
    fsdp_comm_group node = {e->rank / L * L, 1, L, L}, cross = {e->rank % L, L, nodes, L};
    FSDP_TRY(fsdp_comm_init_group(&e->comm_node, &req, w, &e->dev, &node, e->rank));
    e->node_ready = true;
    e->shard_comm = &e->comm_node;
    if (L == 1) { /* one rank per node: its replicas are every rank */
        e->replica_comm = &e->comm;
        return FSDP_STATUS_OK;
    }
    FSDP_TRY(fsdp_comm_init_group(&e->comm_cross, &req, w, &e->dev, &cross, e->rank));
    e->cross_ready = true;
    e->replica_comm = &e->comm_cross;
    return FSDP_STATUS_OK;
}

void fsdp_engine_comms_fini(fsdp_engine *e)
{
    if (e->cross_ready)
        fsdp_comm_fini(&e->comm_cross);
    if (e->node_ready)
        fsdp_comm_fini(&e->comm_node);
    if (e->comm_ready)
        fsdp_comm_fini(&e->comm);
    e->cross_ready = e->node_ready = e->comm_ready = false;
}

/* The distinct communicators of e: n of them into cs. */
static int comms_of(const fsdp_engine *e, const fsdp_comm **cs)
{
    int n = 0;
    if (e->comm_ready)
        cs[n++] = &e->comm;
    if (e->node_ready)
        cs[n++] = &e->comm_node;
    if (e->cross_ready)
        cs[n++] = &e->comm_cross;
    return n;
}

void fsdp_engine_comms_reset(fsdp_engine *e)
{
    fsdp_comm_reset_stats(&e->comm);
    if (e->node_ready)
        fsdp_comm_reset_stats(&e->comm_node);
    if (e->cross_ready)
        fsdp_comm_reset_stats(&e->comm_cross);
}

void fsdp_engine_comm_counts(const fsdp_engine *e, size_t *sent, size_t *recv, size_t *calls,
                             size_t *inter_sent, size_t *inter_recv)
{
    const fsdp_comm *cs[3];
    int n = comms_of(e, cs);
    for (int k = 0; k < FSDP_COLL_KIND_COUNT; k++) {
        sent[k] = recv[k] = calls[k] = inter_sent[k] = inter_recv[k] = 0;
        for (int i = 0; i < n; i++) {
            sent[k] += cs[i]->bytes_sent[k];
            recv[k] += cs[i]->bytes_recv[k];
            calls[k] += cs[i]->n_calls[k];
            inter_sent[k] += cs[i]->bytes_inter_sent[k];
            inter_recv[k] += cs[i]->bytes_inter_recv[k];
        }
    }
}

/* ---- exchanges ------------------------------------------------------------------ */

/* The counters of a communicator, kept across an exchange. */
struct counters {
    size_t v[5][FSDP_COLL_KIND_COUNT];
};

static void counters_save(const fsdp_comm *c, struct counters *k)
{
    memcpy(k->v[0], c->bytes_sent, sizeof k->v[0]);
    memcpy(k->v[1], c->bytes_recv, sizeof k->v[1]);
    memcpy(k->v[2], c->n_calls, sizeof k->v[2]);
    memcpy(k->v[3], c->bytes_inter_sent, sizeof k->v[3]);
    memcpy(k->v[4], c->bytes_inter_recv, sizeof k->v[4]);
}

static void counters_restore(fsdp_comm *c, const struct counters *k)
{
    memcpy(c->bytes_sent, k->v[0], sizeof k->v[0]);
    memcpy(c->bytes_recv, k->v[1], sizeof k->v[1]);
    memcpy(c->n_calls, k->v[2], sizeof k->v[2]);
    memcpy(c->bytes_inter_sent, k->v[3], sizeof k->v[3]);
    memcpy(c->bytes_inter_recv, k->v[4], sizeof k->v[4]);
}

void fsdp_engine_exchange_bytes(const fsdp_engine *e, size_t bytes, size_t *send, size_t *recv)
{
    size_t rec = (bytes + sizeof(float) - 1) / sizeof(float) * sizeof(float);
    *send = rec;
    *recv = rec * (size_t)e->comm.n_ranks;
}

size_t fsdp_engine_norm_record_bytes(const fsdp_engine *e)
{
    return (e->sh->norm.record_len + (size_t)e->sh->cfg.grad_accum) * sizeof(float);
}

size_t fsdp_engine_publish_record_bytes(void) { return sizeof(fsdp_rank_stats); }

fsdp_status fsdp_engine_exchange(fsdp_engine *e, const void *mine, size_t bytes, void *all)
{
    int N = e->comm.n_ranks;
    size_t numel = (bytes + sizeof(float) - 1) / sizeof(float), rec = numel * sizeof(float);
    bool computes = fsdp_device_computes(&e->dev);
    float *send = NULL, *recv = NULL;
    unsigned char *host = NULL;
    fsdp_status st = FSDP_STATUS_OK;
    if (computes && !(host = calloc((size_t)N + 1, rec)))
        return fsdp_error_set(FSDP_STATUS_OOM, "rank %d: out of host memory for an exchange of "
                              "%zu bytes per rank", e->rank, bytes);
    FSDP_CHECK(fsdp_device_alloc(&e->dev, rec, FSDP_MEM_OTHER, "exchange of per-rank records",
                                 (void **)&send));
    FSDP_CHECK(fsdp_device_alloc(&e->dev, rec * (size_t)N, FSDP_MEM_OTHER,
                                 "exchange of per-rank records", (void **)&recv));
    unsigned char *staged = host ? host + (size_t)N * rec : NULL;
    if (computes) {
        memcpy(staged, mine, bytes);
        FSDP_CHECK(fsdp_device_memcpy(&e->dev, send, staged, rec, e->dev.comm));
    }
    /* The exchange is not the step's traffic: its counts are taken back out
     * once it has run. A transport counts its bytes between processes where
     * the collective runs (the comm stream's thread with async cpu
     * streams), so the counters are read before it with the stream idle
     * and put back after it, the stream idle again. */
    FSDP_CHECK(fsdp_device_stream_sync(&e->dev, e->dev.comm));
    struct counters saved;
    counters_save(&e->comm, &saved);
    fsdp_comm_label(&e->comm, "exchange of %zu bytes per rank", bytes);
    st = fsdp_comm_all_gather(&e->comm, send, recv, numel, FSDP_DTYPE_F32, e->dev.comm);
    if (st == FSDP_STATUS_OK && computes)
        st = fsdp_device_memcpy(&e->dev, host, recv, rec * (size_t)N, e->dev.comm);
    if (st == FSDP_STATUS_OK)
        st = fsdp_device_stream_sync(&e->dev, e->dev.comm);
    counters_restore(&e->comm, &saved);
    if (st != FSDP_STATUS_OK)
        goto fail;
    if (computes)
        for (int r = 0; r < N; r++)
            memcpy((unsigned char *)all + (size_t)r * bytes, host + (size_t)r * rec, bytes);
    else
        memset(all, 0, (size_t)N * bytes);
fail:
    if (recv)
        fsdp_device_free(&e->dev, recv);
    if (send)
        fsdp_device_free(&e->dev, send);
    free(host);
    return st;
}

/* The global gradient norm (norm_cover.h) and every rank's micro-step
 * losses, in one exchange: this rank's sums of squares per block, its
 * cover values as owner e->rank and its losses; every rank's; the tree's
 * top, and the losses by the global micro-batch index m = j * N + r into
 * e->loss_order. */
fsdp_status fsdp_engine_norm(fsdp_engine *e, float *norm)
{
    fsdp_engine_shared *sh = e->sh;
    const fsdp_norm_cover *nc = &sh->norm;
    int N = sh->cfg.n_ranks, A = sh->cfg.grad_accum;
    size_t R = nc->record_len, rec = fsdp_engine_norm_record_bytes(e) / sizeof(float);
    if (!e->norm_scratch) {
        e->norm_scratch = malloc((sh->n_local_blocks + (size_t)(N + 1) * rec) * sizeof(float));
        if (!e->norm_scratch)
            return fsdp_error_set(FSDP_STATUS_OOM, "rank %d: out of host memory for the "
                                  "gradient norm's partial sums", e->rank);
    }
    float *blocks = e->norm_scratch, *mine = blocks + sh->n_local_blocks, *all = mine + rec;
    bool computes = fsdp_device_computes(&e->dev);
    /* meta: host pointers are fake and nothing is computed: the norm is 0 */
    if (computes)
        FSDP_TRY(e->place->grad_sumsq(e, blocks));
    fsdp_norm_cover_record(nc, e->rank < nc->n_owners ? e->rank : nc->n_owners,
                           computes ? blocks : NULL, mine);
    memcpy(mine + R, e->host_losses, (size_t)A * sizeof(float));
    FSDP_TRY(fsdp_engine_exchange(e, mine, rec * sizeof(float), all));
    *norm = computes ? sqrtf(fsdp_norm_cover_total(nc, all, rec)) : 0.0f;
    for (int r = 0; r < N; r++)
        for (int j = 0; j < A; j++)
            e->loss_order[j * N + r] = all[(size_t)r * rec + R + (size_t)j];
    return FSDP_STATUS_OK;
}

/* The end of a step: every rank's figures into sh->x_stats: each local
 * rank its own, this process's first rank those of the other processes'
 * (on meta, always one process, nothing moves through the exchange). */
fsdp_status fsdp_engine_publish(fsdp_engine *e)
{
    fsdp_engine_shared *sh = e->sh;
    int N = sh->cfg.n_ranks;
    size_t rec = fsdp_engine_publish_record_bytes();
    if (!e->x_records && !(e->x_records = malloc(rec * (size_t)N)))
        return fsdp_error_set(FSDP_STATUS_OOM, "rank %d: out of host memory for the step's "
                              "figures", e->rank);
    fsdp_rank_stats rs;
    memset(&rs, 0, sizeof rs);
    size_t sent[FSDP_COLL_KIND_COUNT], recv[FSDP_COLL_KIND_COUNT], calls[FSDP_COLL_KIND_COUNT];
    size_t isent[FSDP_COLL_KIND_COUNT], irecv[FSDP_COLL_KIND_COUNT];
    fsdp_engine_comm_counts(e, sent, recv, calls, isent, irecv);
    for (int k = 0; k < FSDP_COLL_KIND_COUNT; k++) {
        rs.comm_sent_bytes += sent[k];
        rs.comm_recv_bytes += recv[k];
        rs.inter_sent_bytes += isent[k];
        rs.inter_recv_bytes += irecv[k];
    }
    rs.peak_bytes = e->dev.mem.peak_bytes;
    rs.in_use_bytes = e->dev.mem.in_use_bytes;
    rs.host_peak_bytes = e->dev.host.peak_bytes;
    rs.mem = e->dev.mem;
    rs.host = e->dev.host;
    FSDP_TRY(fsdp_engine_exchange(e, &rs, rec, e->x_records));
    sh->x_stats[e->rank] = rs;
    if (e->rank == sh->world->rank_offset)
        for (int r = 0; r < N; r++)
            if (!fsdp_world_is_local(sh->world, r))
                memcpy(&sh->x_stats[r], (const unsigned char *)e->x_records + rec * (size_t)r,
                       rec);
    return FSDP_STATUS_OK;
}

fsdp_status fsdp_engine_or(fsdp_engine *e, unsigned mine, unsigned *all)
{
    fsdp_world *w = e->sh->world;
    if (w->n_processes == 1) /* the ranks share memory (and meta moves no data) */
        return fsdp_world_barrier_or(w, mine, all);
    int N = e->sh->cfg.n_ranks;
    uint32_t word = mine, *words = calloc((size_t)N, sizeof *words);
    if (!words)
        return fsdp_error_set(FSDP_STATUS_OOM, "rank %d: out of host memory", e->rank);
    fsdp_status st = fsdp_engine_exchange(e, &word, sizeof word, words);
    *all = 0;
    for (int r = 0; st == FSDP_STATUS_OK && r < N; r++)
        *all |= words[r];
    free(words);
    return st;
}
