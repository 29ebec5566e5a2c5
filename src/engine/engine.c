/*
 * engine.c - the FSDP step on one rank: just-in-time all-gathers with
 * prefetch, reduce-scatter of unit gradients into the accumulation counter
 * (accum.h), global-norm clipping and the optimizer step, through the
 * placement table (declared in engine_internal.h) that says where the
 * optimizer state lives.
 *
 * Determinism (docs/determinism.md): rank r runs micro-batches r, r+N, ... so micro-step
 * j covers global micro-batches jN .. jN+N-1; the reduce-scatter sums them
 * in the balanced tree over ranks, and micro-steps are combined in a
 * balanced tree too (a binary counter of partial shards), so for power-of-
 * two N and A the gradient is the same balanced tree over the M = N*A global
 * micro-batches whatever N is. Losses and norm partial sums are exchanged
 * among all ranks (engine_comms.c) and added in the same tree over a fixed
 * global order. Ranks are the job's: a job of several processes numbers
 * them globally, only the device ordinal is local.
 *
 * Hybrid sharding: a unit is sharded over a node's ranks (gathers and
 * reduce-scatters on the node's communicator) and its gradient shard is
 * then all-reduced across the nodes; the sum per element is the node's
 * tree, then the tree over nodes, which is the tree over every rank when
 * the number of nodes is a power of two.
 *
 * Activation recompute (cfg.recompute, models/model.h): the model keeps
 * only part of each block's activations; in backward, right after block
 * u's gather (which serves both), unit_recompute rebuilds the rest and
 * unit_backward follows. No extra gather, no extra allocation.
 *
 * Masked targets (example data: -1 where the loss must not look): the step's
 * loss is the mean over every unmasked target of the global batch, and its
 * gradient that mean's. The model's head returns, per micro-batch, the sum
 * of its token losses over B*T (masked ones add 0) and scales each token's
 * gradient by dloss / (B*T); the data is a pure function of the micro-batch
 * index, so every rank counts the global batch's unmasked targets (count)
 * before the step and passes dloss = B*T / count to every micro-batch, and
 * the loss is the tree mean of the micro-batch losses times M*B*T / count.
 * Each token then weighs 1 / count whatever micro-batch and rank it lands
 * on (not the mean of per-micro-batch means), and with nothing masked
 * (count = M*B*T) dloss is 1/M and the factor exactly 1: the arithmetic is
 * the unmasked one, bit for bit.
 *
 * Streams: ops run on the compute stream, collectives on the comm stream,
 * placement copies on the copy stream; each cross-stream dependency is an
 * event. Frees are stream-ordered (device.h): a buffer goes back while work
 * queued on the streams may still use it, and the device reuses its memory
 * only after that work, so the step never waits on the host for a free.
 */
#include <math.h>
#include <string.h>
#include <time.h>

#include "core/bf16.h"
#include "core/flight.h"
#include "core/log.h"
#include "core/world.h"
#include "engine/engine.h"
#include "engine/engine_internal.h"
#include "ops/nf4.h"

/* ---- shared state ------------------------------------------------------- */

static const fsdp_name offload_names[] = {
    {"none", 0, "master weights, optimizer state and gradient shards on the device"},
    {"optimizer", 1,
     "master weights, optimizer state and gradient shards in pinned host memory, updated by "
     "the CPU optimizer"},
    {"params", 2,
     "the frozen parameters' shards (a LoRA base, dense or NF4) in pinned host memory, "
     "uploaded just ahead of each gather"},
    {"optimizer,params", 3,
     "both, and the trainable parameters' shards too: every parameter shard in pinned host "
     "memory, updated there by the CPU optimizer"},
};
const fsdp_name_table fsdp_offload_names = FSDP_NAME_TABLE(offload_names);

fsdp_status fsdp_engine_recompute_check(const fsdp_model *model, fsdp_recompute mode)
{
    const struct fsdp_model_i *mi = model->iface;
    if ((int)mode < 0 || mode >= FSDP_RECOMPUTE_COUNT)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "unknown recompute mode %d", (int)mode);
    if (mode != FSDP_RECOMPUTE_NONE && (!mi->state_init_recompute || !mi->unit_recompute))
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "--recompute %s: model '%s' does not implement activation "
                              "recompute; use --recompute none",
                              fsdp_names_name(&fsdp_recompute_names, (int)mode), model->name);
    return FSDP_STATUS_OK;
}

fsdp_status fsdp_engine_shared_init(fsdp_engine_shared *sh, const fsdp_engine_config *cfg,
                                    const fsdp_model *model, const fsdp_data *data, fsdp_world *w)
{
    memset(sh, 0, sizeof *sh);
    sh->cfg = *cfg;
    sh->model = model;
    sh->data = data;
    sh->world = w;
    if (cfg->batch < 1 || cfg->seq < 1 || cfg->grad_accum < 1)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "batch, seq and grad-accum must be >= 1 (got %d, %d, %d)",
                              cfg->batch, cfg->seq, cfg->grad_accum);
    if (cfg->seq > model->max_seq_len)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "--seq %d is longer than the model's context (%d)", cfg->seq,
                              model->max_seq_len);
    int nodes = cfg->n_nodes > 1 ? cfg->n_nodes : 1;
    if (w && (w->n_ranks != cfg->n_ranks || (w->n_processes > 1 && nodes != w->n_processes)))
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "the engine is configured for %d rank(s) on %d node(s), but its "
                              "world has %d rank(s) in %d process(es) (one node per process)",
                              cfg->n_ranks, nodes, w->n_ranks, w->n_processes);
    FSDP_TRY(fsdp_engine_recompute_check(model, cfg->recompute));
    if ((cfg->positions || (data && fsdp_data_packed(data))) && !model->iface->state_positions)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "packed example rows need a model whose attention takes token "
                              "positions (llama, gpt2); model '%s' has none: use --pack "
                              "off", model->name);
    if (cfg->offload_params && !fsdp_offload_trainable_params(cfg) &&
        model->train_numel == model->numel)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "--offload params alone keeps only frozen parameters' shards in "
                              "host memory (the device optimizer updates the trainable ones on "
                              "the device), and nothing of model '%s' is frozen: use --offload "
                              "optimizer,params to keep the trainable shards in pinned host "
                              "memory too, stepped by the CPU optimizer", model->name);
    sh->optim = fsdp_optim_or_default(cfg->optim);
    fsdp_optim_hparams_resolve(sh->optim, &cfg->optim_hp, &sh->optim_hp);
    if (!cfg->inference)
        FSDP_TRY(fsdp_optim_hparams_check(sh->optim, &sh->optim_hp));
    FSDP_TRY(fsdp_shardmap_init_nodes(&sh->sm, model, cfg->n_ranks, nodes, cfg->shard));
    for (int u = 0; u < sh->sm.n_units; u++)
        sh->n_local_blocks += sh->sm.units[u].shard_numel / FSDP_NORM_BLOCK;
    fsdp_status st = fsdp_norm_cover_init(&sh->norm, &sh->sm);
    sh->x_stats = calloc((size_t)cfg->n_ranks, sizeof *sh->x_stats);
    if (st == FSDP_STATUS_OK && !sh->x_stats)
        st = fsdp_error_set(FSDP_STATUS_OOM, "out of host memory for the ranks' figures");
    if (st != FSDP_STATUS_OK)
        fsdp_engine_shared_free(sh);
    return st;
}

void fsdp_engine_shared_free(fsdp_engine_shared *sh)
{
    free(sh->x_stats);
    fsdp_norm_cover_free(&sh->norm);
    fsdp_shardmap_free(&sh->sm);
    memset(sh, 0, sizeof *sh);
}

/* ---- helpers ------------------------------------------------------------ */

static size_t dt_size(fsdp_engine *e) { return fsdp_dtype_size(e->sh->cfg.compute_dtype); }

static bool sharded(const fsdp_engine *e) { return e->sh->cfg.shard != FSDP_SHARD_NONE; }

/* Wait for all work on every stream of the device (end of a phase). */
static fsdp_status sync_all(fsdp_engine *e)
{
    FSDP_TRY(fsdp_device_stream_sync(&e->dev, e->dev.compute));
    FSDP_TRY(fsdp_device_stream_sync(&e->dev, e->dev.comm));
    FSDP_TRY(fsdp_device_stream_sync(&e->dev, e->dev.copy));
    return FSDP_STATUS_OK;
}

/* ---- gather / release ---------------------------------------------------- */

/* A shard of unit u the gather reads, of the trainable segment or a frozen
 * one: where params offload keeps it in pinned host memory, `src` uploaded
 * into a device buffer of its own on the comm stream (free it with
 * stage_done once the gather has read it); else src. The upload is issued
 * after the placement's params_ready, so it reads the last update. */
static fsdp_status stage(fsdp_engine *e, int u, bool trainable, void *src, size_t bytes,
                         void **out)
{
    *out = src;
    if (trainable ? !fsdp_offload_trainable_params(&e->sh->cfg) : !e->sh->cfg.offload_params)
        return FSDP_STATUS_OK;
    char what[96];
    snprintf(what, sizeof what, "unit '%s' %s shard upload", e->sh->sm.units[u].spec->name,
             trainable ? "parameter" : "frozen");
    FSDP_TRY(fsdp_device_alloc(&e->dev, bytes, FSDP_MEM_GATHER, what, out));
    fsdp_trace_begin(&e->tr, FSDP_TRACE_COPY, "param h2d", e->sh->sm.units[u].spec->name, bytes);
    FSDP_TRY(fsdp_device_memcpy(&e->dev, *out, src, bytes, e->dev.comm));
    fsdp_trace_end(&e->tr, FSDP_TRACE_COPY);
    return FSDP_STATUS_OK;
}

static void stage_done(fsdp_engine *e, void *src, void *staged)
{
    if (staged != src)
        fsdp_device_free(&e->dev, staged); /* stream-ordered: after what read it */
}

/* The NF4 segment of unit u's gather, after the other segments' on the
 * comm stream: the ranks' packed shards (codes + absmax) all-gathered into
 * a buffer of their own, each dequantized into the gathered buffer at its
 * place in the NF4 group, then the packed buffer freed (stream-ordered).
 * The shard bytes travel as fp32 words: nothing is computed on them. */
static fsdp_status gather_nf4(fsdp_engine *e, int u)
{
    fsdp_shard_row *row = fsdp_engine_row(e, u);
    fsdp_shard_unit *su = &e->sh->sm.units[u];
    if (!su->nf4_numel)
        return FSDP_STATUS_OK;
    int k_ranks = sharded(e) ? e->sh->sm.shard_ranks : 1;
    size_t bytes = fsdp_shardmap_nf4_bytes(su);
    void *mine;
    FSDP_TRY(stage(e, u, false, row->nf4, bytes, &mine));
    char *packed = mine;
    if (sharded(e)) {
        char what[96];
        snprintf(what, sizeof what, "unit '%s' NF4 gather", su->spec->name);
        FSDP_TRY(fsdp_device_alloc(&e->dev, bytes * (size_t)k_ranks, FSDP_MEM_GATHER, what,
                                   (void **)&packed));
        fsdp_trace_begin(&e->tr, FSDP_TRACE_COMM, "all_gather_nf4", su->spec->name,
                         bytes * (size_t)k_ranks);
        fsdp_comm_label(e->shard_comm, "unit '%s' NF4 all-gather", su->spec->name);
        FSDP_TRY(fsdp_comm_all_gather(e->shard_comm, mine, packed, bytes / sizeof(float),
                                      FSDP_DTYPE_F32, e->dev.comm));
        fsdp_trace_end(&e->tr, FSDP_TRACE_COMM);
        stage_done(e, row->nf4, mine);
    }
    char *out = (char *)row->gathered + su->spec->nf4_begin * dt_size(e);
    for (int k = 0; k < k_ranks; k++) {
        const char *shard = packed + (size_t)k * bytes;
        FSDP_OP(&e->ops_gather, nf4_dequant, out + (size_t)k * su->nf4_shard * dt_size(e),
                (const uint8_t *)shard, (const float *)(shard + su->nf4_shard / 2),
                su->nf4_shard);
    }
    if (sharded(e))
        fsdp_device_free(&e->dev, packed); /* stream-ordered: after the dequantization */
    else
        stage_done(e, row->nf4, mine);
    return FSDP_STATUS_OK;
}

/* Issue the all-gather of unit u on the comm stream (no-op if resident):
 * the trainable segment, then the frozen one over its padding (shardmap.h).
 * Without sharding the buffer is the trainable shard itself, or, with a
 * frozen segment or the shard in host memory, the shards copied into one
 * device buffer of the model's layout. */
static fsdp_status gather_issue(fsdp_engine *e, int u)
{
    fsdp_shard_row *row = fsdp_engine_row(e, u);
    fsdp_shard_unit *su = &e->sh->sm.units[u];
    fsdp_dtype dt = e->sh->cfg.compute_dtype;
    if (row->state != FSDP_UNIT_SHARDED)
        return FSDP_STATUS_OK;
    FSDP_TRY(e->place->params_ready(e, u));
    if (!sharded(e) && !su->frozen_numel && !su->nf4_numel &&
        !fsdp_offload_trainable_params(&e->sh->cfg)) {
        row->gathered = row->param;
        row->state = FSDP_UNIT_GATHERED;
        return FSDP_STATUS_OK;
    }
    char what[96];
    size_t n = fsdp_shardmap_gathered_numel(su);
    snprintf(what, sizeof what, "unit '%s' gather", su->spec->name);
    FSDP_TRY(fsdp_device_alloc(&e->dev, n * dt_size(e), FSDP_MEM_GATHER, what, &row->gathered));
    fsdp_trace_begin(&e->tr, FSDP_TRACE_COMM, "all_gather", su->spec->name, n * dt_size(e));
    char *frozen_at = (char *)row->gathered + su->numel * dt_size(e);
    if (sharded(e)) {
        if (su->shard_numel) {
            void *mine;
            FSDP_TRY(stage(e, u, true, row->param, su->shard_numel * dt_size(e), &mine));
            fsdp_comm_label(e->shard_comm, "unit '%s' all-gather", su->spec->name);
            FSDP_TRY(fsdp_comm_all_gather(e->shard_comm, mine, row->gathered, su->shard_numel,
                                          dt, e->dev.comm));
            stage_done(e, row->param, mine);
        }
        if (su->frozen_shard) {
            void *mine;
            FSDP_TRY(stage(e, u, false, row->frozen, su->frozen_shard * dt_size(e), &mine));
            fsdp_comm_label(e->shard_comm, "unit '%s' frozen all-gather", su->spec->name);
            FSDP_TRY(fsdp_comm_all_gather(e->shard_comm, mine, frozen_at, su->frozen_shard, dt,
                                          e->dev.comm));
            stage_done(e, row->frozen, mine);
        }
    } else { /* copies: from pinned host memory too */
        if (su->shard_numel)
            FSDP_TRY(fsdp_device_memcpy(&e->dev, row->gathered, row->param,
                                        su->shard_numel * dt_size(e), e->dev.comm));
        if (su->frozen_shard)
            FSDP_TRY(fsdp_device_memcpy(&e->dev, frozen_at, row->frozen,
                                        su->frozen_shard * dt_size(e), e->dev.comm));
    }
    fsdp_trace_end(&e->tr, FSDP_TRACE_COMM);
    FSDP_TRY(gather_nf4(e, u));
    FSDP_TRY(fsdp_device_event_record(&e->dev, e->ev_gather[u], e->dev.comm));
    row->state = FSDP_UNIT_GATHERING;
    return FSDP_STATUS_OK;
}

/* Make unit u's gathered parameters usable on the compute stream. */
static fsdp_status gather_wait(fsdp_engine *e, int u)
{
    FSDP_TRY(gather_issue(e, u));
    fsdp_shard_row *row = fsdp_engine_row(e, u);
    if (row->state == FSDP_UNIT_GATHERING) {
        FSDP_TRY(fsdp_device_stream_wait_event(&e->dev, e->dev.compute, e->ev_gather[u]));
        row->state = FSDP_UNIT_GATHERED;
    }
    return FSDP_STATUS_OK;
}

/* Free unit u's gathered buffer. The free is stream-ordered (device.h):
 * the memory is reused only after the work already queued on the device's
 * streams (this unit's gather and compute) is done, so the host does not
 * wait here and the next gather overlaps this unit's compute. */
static fsdp_status gather_release(fsdp_engine *e, int u)
{
    fsdp_shard_row *row = fsdp_engine_row(e, u);
    if (row->state == FSDP_UNIT_SHARDED)
        return FSDP_STATUS_OK;
    if (row->gathered != row->param)
        fsdp_device_free(&e->dev, row->gathered);
    row->gathered = NULL;
    row->state = FSDP_UNIT_SHARDED;
    return FSDP_STATUS_OK;
}

/* ---- gradient reduction and accumulation --------------------------------- */

/* Reduce unit u's full gradient over ranks into a free accumulation slot
 * and enter it in the counter of micro-step partial sums. A counter in
 * pinned host memory (host_grads) gets the reduced shard through a device
 * buffer of its own, copied to the slot on the copy stream and freed at
 * once (stream-ordered): the device holds it only while it is in flight. */
static fsdp_status grad_reduce(fsdp_engine *e, int u)
{
    fsdp_shard_row *row = fsdp_engine_row(e, u);
    fsdp_shard_unit *su = &e->sh->sm.units[u];
    float *slot_buf, *dst;
    int slot;
    size_t f32 = su->shard_numel * sizeof(float);
    if (!su->shard_numel) { /* the unit trains nothing: no gradient to reduce */
        row->grad_full = NULL;
        return FSDP_STATUS_OK;
    }
    FSDP_TRY(fsdp_accum_slot(&e->acc, u, su->shard_numel, su->spec->name, &slot_buf, &slot));
    dst = slot_buf;
    if (e->acc.host) {
        char what[96];
        snprintf(what, sizeof what, "unit '%s' reduced gradient", su->spec->name);
        FSDP_TRY(fsdp_device_alloc(&e->dev, f32, FSDP_MEM_GRAD, what, (void **)&dst));
    }
    FSDP_TRY(fsdp_engine_order(e, e->dev.compute, e->dev.comm, e->ev_tmp));
    fsdp_trace_begin(&e->tr, FSDP_TRACE_COMM, sharded(e) ? "reduce_scatter" : "all_reduce",
                     su->spec->name, su->padded_numel * sizeof(float));
    fsdp_comm *c = sharded(e) ? e->shard_comm : &e->comm;
    fsdp_comm_label(c, "unit '%s' gradient reduction", su->spec->name);
    if (sharded(e)) {
        FSDP_TRY(fsdp_comm_reduce_scatter(c, row->grad_full, dst, su->shard_numel,
                                          FSDP_DTYPE_F32, FSDP_REDUCE_SUM, e->dev.comm));
        if (e->replica_comm) { /* hybrid: the node's shard, over nodes */
            fsdp_comm_label(e->replica_comm, "unit '%s' gradient reduction", su->spec->name);
            FSDP_TRY(fsdp_comm_all_reduce(e->replica_comm, dst, dst, su->shard_numel,
                                          FSDP_DTYPE_F32, FSDP_REDUCE_SUM, e->dev.comm));
        }
    } else {
        FSDP_TRY(fsdp_comm_all_reduce(c, row->grad_full, dst, su->padded_numel, FSDP_DTYPE_F32,
                                      FSDP_REDUCE_SUM, e->dev.comm));
    }
    fsdp_trace_end(&e->tr, FSDP_TRACE_COMM);
    /* stream-ordered: reused once the collective queued above has read it */
    fsdp_device_free(&e->dev, row->grad_full);
    row->grad_full = NULL;
    if (e->acc.host) {
        FSDP_TRY(fsdp_engine_order(e, e->dev.comm, e->dev.copy, e->ev_tmp));
        fsdp_trace_begin(&e->tr, FSDP_TRACE_COPY, "grad d2h", su->spec->name, f32);
        FSDP_TRY(fsdp_device_memcpy(&e->dev, slot_buf, dst, f32, e->dev.copy));
        fsdp_trace_end(&e->tr, FSDP_TRACE_COPY);
        fsdp_device_free(&e->dev, dst); /* stream-ordered: after the copy has read it */
    }
    fsdp_accum_push(&e->acc, u, slot, su->shard_numel);
    return FSDP_STATUS_OK;
}

/* ---- per-rank init ------------------------------------------------------- */

/* A frozen shard: on the device, or in pinned host memory with params offload. */
static fsdp_status alloc_frozen(fsdp_engine *e, size_t bytes, const char *what, void **out)
{
    if (e->sh->cfg.offload_params)
        return fsdp_device_host_alloc(&e->dev, bytes, FSDP_MEM_PARAM, what, out);
    return fsdp_device_alloc(&e->dev, bytes, FSDP_MEM_PARAM, what, out);
}

/* The rank's shard of unit u's frozen segment: allocated on the device in
 * the compute dtype (frozen parameters keep no master) and initialised as
 * the trainable one is, rounded on the host. host_tmp holds a shard. */
static fsdp_status frozen_init(fsdp_engine *e, int u, float *host_tmp)
{
    const fsdp_engine_shared *sh = e->sh;
    const fsdp_shard_unit *su = &sh->sm.units[u];
    fsdp_shard_row *row = fsdp_engine_row(e, u);
    size_t n = su->frozen_shard;
    fsdp_dtype dt = sh->cfg.compute_dtype;
    if (!n)
        return FSDP_STATUS_OK;
    char what[96];
    snprintf(what, sizeof what, "unit '%s' frozen %s parameter shard", su->spec->name,
             fsdp_dtype_name(dt));
    FSDP_TRY(alloc_frozen(e, n * fsdp_dtype_size(dt), what, &row->frozen));
    if (!fsdp_device_computes(&e->dev))
        return FSDP_STATUS_OK;
    size_t begin = fsdp_shardmap_frozen_offset(&sh->sm, u, e->rank);
    if (sh->init_fn)
        FSDP_TRY(sh->init_fn(sh->init_arg, sh->model, u, begin, begin + n, host_tmp));
    else
        fsdp_model_init_range(sh->model, u, begin, begin + n, sh->cfg.seed, host_tmp);
    if (dt == FSDP_DTYPE_BF16) { /* in place: element i's bf16 lands before element i is read */
        fsdp_bf16 *b = (fsdp_bf16 *)host_tmp;
        for (size_t i = 0; i < n; i++)
            b[i] = fsdp_f32_to_bf16(host_tmp[i]);
    }
    FSDP_TRY(fsdp_device_memcpy(&e->dev, row->frozen, host_tmp, n * fsdp_dtype_size(dt),
                                e->dev.compute));
    return fsdp_device_stream_sync(&e->dev, e->dev.compute); /* host_tmp is reused */
}

/* The rank's NF4 shard of unit u: codes then fp32 absmax, allocated on the
 * device and filled by init_nf4_fn through host_tmp (which holds it). */
static fsdp_status nf4_init(fsdp_engine *e, int u, float *host_tmp)
{
    const fsdp_engine_shared *sh = e->sh;
    const fsdp_shard_unit *su = &sh->sm.units[u];
    fsdp_shard_row *row = fsdp_engine_row(e, u);
    size_t n = su->nf4_shard, bytes = fsdp_shardmap_nf4_bytes(su);
    if (!n)
        return FSDP_STATUS_OK;
    char what[96];
    snprintf(what, sizeof what, "unit '%s' NF4 parameter shard", su->spec->name);
    FSDP_TRY(alloc_frozen(e, bytes, what, &row->nf4));
    if (!fsdp_device_computes(&e->dev))
        return FSDP_STATUS_OK;
    if (!sh->init_nf4_fn)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "unit '%s' has NF4 parameters but the run gave no NF4 source",
                              su->spec->name);
    size_t begin = fsdp_shardmap_nf4_offset(&sh->sm, u, e->rank);
    uint8_t *codes = (uint8_t *)host_tmp;
    FSDP_TRY(sh->init_nf4_fn(sh->init_arg, sh->model, u, begin, begin + n, codes,
                             (float *)(codes + n / 2)));
    FSDP_TRY(fsdp_device_memcpy(&e->dev, row->nf4, host_tmp, bytes, e->dev.compute));
    return fsdp_device_stream_sync(&e->dev, e->dev.compute); /* host_tmp is reused */
}

/* Allocate the rank's shards of unit u (where the placement keeps them)
 * and initialise them: parameters from init_fn or the model's counter-based
 * RNG (own shard only), zero optimizer state and gradient, the compute copy
 * from the master; then the frozen segment (frozen_init). host_tmp holds a
 * shard of fp32 (reused per unit). */
static fsdp_status unit_init(fsdp_engine *e, int u, float *host_tmp)
{
    const fsdp_engine_shared *sh = e->sh;
    fsdp_shard_row *row = fsdp_engine_row(e, u);
    size_t n = sh->sm.units[u].shard_numel, f32 = n * sizeof(float);
    FSDP_TRY(e->place->unit_alloc(e, u));
    row->state = FSDP_UNIT_SHARDED;
    if (!fsdp_device_computes(&e->dev) || !n) {
        FSDP_TRY(frozen_init(e, u, host_tmp));
        return nf4_init(e, u, host_tmp);
    }
    size_t begin = fsdp_shardmap_offset(&sh->sm, u, e->rank);
    if (sh->init_fn)
        FSDP_TRY(sh->init_fn(sh->init_arg, sh->model, u, begin, begin + n, host_tmp));
    else
        fsdp_model_init_range(sh->model, u, begin, begin + n, sh->cfg.seed, host_tmp);
    /* padding past the trainable parameters is zero (the init functions see frozen
     * offsets there) */
    if (begin + n > sh->sm.units[u].numel) {
        size_t real = begin < sh->sm.units[u].numel ? sh->sm.units[u].numel - begin : 0;
        memset(host_tmp + real, 0, (n - real) * sizeof(float));
    }
    FSDP_TRY(fsdp_device_memcpy(&e->dev, row->master, host_tmp, f32, e->dev.compute));
    for (int k = 0; k < sh->optim->n_state && !sh->cfg.inference; k++)
        FSDP_TRY(fsdp_device_memset(&e->dev, row->optim[k], 0, f32, e->dev.compute));
    if (!sh->cfg.inference)
        FSDP_TRY(fsdp_device_memset(&e->dev, row->grad, 0, f32, e->dev.compute));
    /* the compute copy; host_tmp is reused for the next unit: the refresh
     * waits for the copies */
    FSDP_TRY(e->place->param_refresh(e, u));
    FSDP_TRY(frozen_init(e, u, host_tmp));
    return nf4_init(e, u, host_tmp);
}

fsdp_status fsdp_engine_init(fsdp_engine **out, fsdp_engine_shared *sh, int rank)
{
    fsdp_status st;
    const fsdp_engine_config *cfg = &sh->cfg;
    float *host_tmp = NULL;
    fsdp_engine *e = calloc(1, sizeof *e);
    if (!e)
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory for rank %d's engine", rank);
    e->sh = sh;
    e->rank = rank;
    int rpd = cfg->ranks_per_device > 0 ? cfg->ranks_per_device : 1;
    int local = rank - sh->world->rank_offset; /* the device ordinal is this process's */
    int ordinal = cfg->backend == FSDP_BACKEND_CUDA ? local / rpd : local;
    FSDP_CHECK(fsdp_device_init(&e->dev, cfg->backend, sh->world, rank, ordinal, cfg->device_mem));
    e->dev_ready = true;
    e->dev.oom_hint = cfg->oom_hint;
    e->tr = (fsdp_trace_rank){.trace = sh->trace, .rank = rank, .dev = &e->dev};
    FSDP_CHECK(fsdp_engine_comms_init(e)); /* the transport is chosen in comm/transport.h */
    e->ops_ready = true; /* the three contexts' fini is safe after a failed init */
    FSDP_CHECK(fsdp_ops_init(&e->ops, &e->dev, cfg->compute_dtype));
    FSDP_CHECK(fsdp_ops_init_host(&e->ops_host, &e->dev, cfg->compute_dtype));
    FSDP_CHECK(fsdp_ops_init_stream(&e->ops_gather, &e->dev, cfg->compute_dtype, e->dev.comm));
    e->place = fsdp_place_of(cfg);
    bool host_grads = e->place->host_grads;
    if (!cfg->inference && host_grads)
        FSDP_CHECK(fsdp_ops_init_host_stream(&e->ops_acc, &e->dev, FSDP_DTYPE_F32, e->dev.copy));
    else if (!cfg->inference)
        FSDP_CHECK(fsdp_ops_init_stream(&e->ops_acc, &e->dev, cfg->compute_dtype, e->dev.comm));

    int U = sh->sm.n_units;
    size_t max_shard = 0;
    size_t max_init = 0; /* the largest shard of either segment: init's staging */
    for (int u = 0; u < U; u++) {
        if (sh->sm.units[u].shard_numel > max_shard)
            max_shard = sh->sm.units[u].shard_numel;
        if (sh->sm.units[u].frozen_shard > max_init)
            max_init = sh->sm.units[u].frozen_shard;
        if (sh->sm.units[u].nf4_shard > max_init) /* its bytes: under 4 per element */
            max_init = sh->sm.units[u].nf4_shard;
    }
    if (max_shard > max_init)
        max_init = max_shard;
    FSDP_CHECK(fsdp_accum_init(&e->acc, &e->dev, &e->ops_acc, U, cfg->grad_accum, cfg->accum,
                               max_shard, host_grads));
    e->ev_gather = calloc((size_t)U, sizeof *e->ev_gather);
    e->host_losses = calloc((size_t)cfg->grad_accum, sizeof(float));
    e->loss_order = calloc((size_t)cfg->grad_accum * (size_t)cfg->n_ranks, sizeof(float));
    if (!e->ev_gather || !e->host_losses || !e->loss_order) {
        st = fsdp_error_set(FSDP_STATUS_OOM, "out of host memory for rank %d's engine", rank);
        goto fail;
    }
    for (int u = 0; u < U; u++)
        FSDP_CHECK(fsdp_device_event_create(&e->dev, &e->ev_gather[u]));
    FSDP_CHECK(fsdp_device_event_create(&e->dev, &e->ev_tmp));
    FSDP_CHECK(fsdp_device_event_create(&e->dev, &e->ev_tmp2));
    FSDP_CHECK(fsdp_device_event_create(&e->dev, &e->ev_tokens));

    if (fsdp_device_computes(&e->dev)) {
        host_tmp = malloc(max_init * sizeof(float) + 1);
        if (!host_tmp) {
            st = fsdp_error_set(FSDP_STATUS_OOM, "out of host memory staging parameter init");
            goto fail;
        }
    }
    FSDP_CHECK(e->place->init(e));
    for (int u = 0; u < U; u++)
        FSDP_CHECK(unit_init(e, u, host_tmp));
    free(host_tmp);
    host_tmp = NULL;

    /* only the device placement's norm uses it; it stays allocated in
     * both, as the planner's byte-exact figures (and the golden fixture)
     * have always counted it */
    if (!cfg->inference)
        FSDP_CHECK(fsdp_device_alloc(&e->dev, sh->n_local_blocks * sizeof(float),
                                     FSDP_MEM_OTHER, "gradient-norm partial sums",
                                     (void **)&e->dev_blocks));
    if (cfg->inference || cfg->recompute == FSDP_RECOMPUTE_NONE)
        FSDP_CHECK(sh->model->iface->state_init(sh->model, &e->ops, cfg->batch, cfg->seq,
                                                !cfg->inference, &e->state));
    else
        FSDP_CHECK(sh->model->iface->state_init_recompute(sh->model, &e->ops, cfg->batch,
                                                          cfg->seq, cfg->recompute, &e->state));
    /* pinned, so that the copies to the device are asynchronous; packed data adds
     * the token positions (data.h), staged after the targets */
    size_t n_tokens = (size_t)cfg->batch * (size_t)cfg->seq;
    bool packed = cfg->positions || (sh->data && fsdp_data_packed(sh->data));
    FSDP_CHECK(fsdp_device_host_alloc(&e->dev, (packed ? 3 : 2) * n_tokens * sizeof(int),
                                      FSDP_MEM_ACT, packed ? "token staging (inputs, targets "
                                      "and positions)" : "token staging (inputs and targets)",
                                      (void **)&e->tokens_host));
    if (packed) {
        FSDP_CHECK(fsdp_device_alloc(&e->dev, n_tokens * sizeof(int), FSDP_MEM_ACT,
                                     "token positions", (void **)&e->pos_dev));
        sh->model->iface->state_positions(e->state, e->pos_dev);
    }
    FSDP_CHECK(fsdp_engine_warm_up(e));
    FSDP_CHECK(fsdp_device_stream_sync(&e->dev, e->dev.compute));
    /* every rank is done allocating before any rank's first collective */
    if (sh->world)
        FSDP_CHECK(fsdp_world_barrier(sh->world));
    *out = e;
    return FSDP_STATUS_OK;
fail:
    free(host_tmp);
    fsdp_engine_note(e, st);
    fsdp_engine_free(e);
    return st;
}

void fsdp_engine_free(fsdp_engine *e)
{
    if (!e)
        return;
    const fsdp_engine_shared *sh = e->sh;
    /* First, before any wait or free: a rank that failed, or whose world
     * was aborted, stops its collectives (nccl: ncclCommAbort) and tells
     * the world at once. A collective kernel still waiting for a peer
     * would otherwise keep the stream syncs and cudaFree below from ever
     * returning, and the peers would wait for this rank's teardown. */
    fsdp_world_rank_stop(sh->world, e->rank, e->status);
    if (e->dev_ready)
        sync_all(e);
    if (e->place)
        e->place->fini(e);
    if (e->state)
        sh->model->iface->state_free(sh->model, &e->ops, e->state);
    if (e->dev_ready) {
        for (int u = 0; u < sh->sm.n_units; u++) {
            if (e->ev_gather)
                fsdp_device_event_destroy(&e->dev, e->ev_gather[u]);
            memset(&sh->sm.units[u].rows[e->rank], 0, sizeof(fsdp_shard_row));
        }
        fsdp_device_event_destroy(&e->dev, e->ev_tmp);
        fsdp_device_event_destroy(&e->dev, e->ev_tmp2);
        fsdp_device_event_destroy(&e->dev, e->ev_tokens);
    }
    if (e->ops_ready) {
        fsdp_ops_fini(&e->ops);
        fsdp_ops_fini(&e->ops_acc);
        fsdp_ops_fini(&e->ops_host);
        fsdp_ops_fini(&e->ops_gather);
    }
    fsdp_engine_comms_fini(e);
    if (e->dev_ready)
        fsdp_device_fini(&e->dev); /* releases every shard and buffer */
    fsdp_accum_free(&e->acc);
    free(e->ev_gather);
    free(e->host_losses);
    free(e->loss_order);
    free(e->norm_scratch);
    free(e->x_records);
    free(e);
}

fsdp_status fsdp_engine_data_error(const fsdp_engine *e, const char **msg)
{
    if (msg)
        *msg = e->data_msg;
    return e->data_st;
}

fsdp_device *fsdp_engine_device(fsdp_engine *e) { return &e->dev; }
fsdp_comm *fsdp_engine_comm(fsdp_engine *e) { return &e->comm; }

/* ---- the step -------------------------------------------------------------- */

/* Micro-batch `index` into the model state at active length T (<= cfg->seq: each row's
 * first T positions, laid out (B, T) densely as model.h's state_len takes them). With
 * `poison`, a batch that cannot be read becomes zeros and the error is kept in e->data_st
 * (the training step then publishes NaN losses: fsdp_engine_step). */
static fsdp_status load_batch(fsdp_engine *e, const fsdp_data *data, uint64_t index,
                              bool poison, int T)
{
    const fsdp_engine_config *cfg = &e->sh->cfg;
    size_t n = (size_t)cfg->batch * (size_t)cfg->seq;
    const struct fsdp_model_i *mi = e->sh->model->iface;
    if (!fsdp_device_computes(&e->dev) || !data)
        return FSDP_STATUS_OK;
    int *in = e->tokens_host, *tg = e->tokens_host + n;
    /* the previous copies out of the staging buffer are done (they were
     * queued before the previous micro-step's work, so this rarely waits) */
    FSDP_TRY(fsdp_device_event_sync(&e->dev, e->ev_tokens));
    int *pos = e->pos_dev ? tg + n : NULL; /* packed data: positions (engine_init) */
    fsdp_status st = fsdp_data_batch_pos(data, index, cfg->batch, cfg->seq, in, tg, pos);
    if (st != FSDP_STATUS_OK) {
        if (!poison)
            return st;
        if (e->data_st == FSDP_STATUS_OK) {
            e->data_st = st;
            snprintf(e->data_msg, sizeof e->data_msg, "%s", fsdp_error_msg());
        }
        fsdp_error_clear(); /* kept above; not this rank's failure */
        memset(in, 0, (pos ? 3 : 2) * n * sizeof(int));
    }
    if (T < cfg->seq) { /* rows of T, in place: row b moves down from b * seq to b * T */
        for (int k = 0; k < (pos ? 3 : 2); k++)
            for (int b = 1; b < cfg->batch; b++)
                memmove(in + k * n + (size_t)b * T, in + k * n + (size_t)b * cfg->seq,
                        (size_t)T * sizeof(int));
        n = (size_t)cfg->batch * (size_t)T;
    }
    FSDP_TRY(fsdp_device_memcpy(&e->dev, mi->state_tokens(e->state), in, n * sizeof(int),
                                e->dev.compute));
    FSDP_TRY(fsdp_device_memcpy(&e->dev, mi->state_targets(e->state), tg, n * sizeof(int),
                                e->dev.compute));
    if (pos)
        FSDP_TRY(fsdp_device_memcpy(&e->dev, e->pos_dev, pos, n * sizeof(int), e->dev.compute));
    return fsdp_device_event_record(&e->dev, e->ev_tokens, e->dev.compute);
}

static fsdp_status alloc_grad_full(fsdp_engine *e, int u)
{
    fsdp_shard_row *row = fsdp_engine_row(e, u);
    fsdp_shard_unit *su = &e->sh->sm.units[u];
    if (!su->padded_numel) {
        /* The unit trains nothing: the model writes no gradient (fsdp_unit_grad is NULL for
         * every parameter), but a non-NULL buffer still tells head_forward_backward to run
         * its backward (models/model.h). */
        static float no_grads[1];
        row->grad_full = no_grads;
        return FSDP_STATUS_OK;
    }
    char what[96];
    snprintf(what, sizeof what, "unit '%s' gradient", su->spec->name);
    FSDP_TRY(fsdp_device_alloc(&e->dev, su->padded_numel * sizeof(float), FSDP_MEM_GRAD, what,
                               (void **)&row->grad_full));
    return fsdp_device_memset(&e->dev, row->grad_full, 0, su->padded_numel * sizeof(float),
                              e->dev.compute);
}

/* Unmasked targets (>= 0) in host targets tg[0..n). */
static uint64_t count_unmasked(const int *tg, size_t n)
{
    uint64_t c = 0;
    for (size_t i = 0; i < n; i++)
        c += tg[i] >= 0;
    return c;
}

/* Unmasked targets of global micro-batches [first, first + n_batches):
 * every target when the data has no masks (or there is no data: meta,
 * plans). Reads the batches through the staging buffer, before the step's
 * own loads. */
static fsdp_status count_targets(fsdp_engine *e, uint64_t first, int n_batches, uint64_t *count)
{
    const fsdp_engine_config *cfg = &e->sh->cfg;
    size_t n = (size_t)cfg->batch * (size_t)cfg->seq;
    *count = (uint64_t)n * (uint64_t)n_batches;
    if (!e->sh->data || !fsdp_data_masked(e->sh->data) || !fsdp_device_computes(&e->dev))
        return FSDP_STATUS_OK;
    *count = 0;
    FSDP_TRY(fsdp_device_event_sync(&e->dev, e->ev_tokens)); /* the last copy out is done */
    for (int k = 0; k < n_batches; k++) {
        fsdp_status st = fsdp_data_batch(e->sh->data, first + (uint64_t)k, cfg->batch, cfg->seq,
                                         e->tokens_host, e->tokens_host + n);
        if (st != FSDP_STATUS_OK) {
            /* as load_batch: recorded, and the step applies no update */
            if (e->data_st == FSDP_STATUS_OK) {
                e->data_st = st;
                snprintf(e->data_msg, sizeof e->data_msg, "%s", fsdp_error_msg());
            }
            fsdp_error_clear();
            continue;
        }
        *count += count_unmasked(e->tokens_host + n, n);
    }
    return FSDP_STATUS_OK;
}

float fsdp_engine_mean_loss(const float *losses, int n, uint64_t rows, uint64_t count)
{
    float loss = fsdp_tree_sum(losses, n) / (float)n;
    if (count != (uint64_t)n * rows) /* masked targets: the mean over the unmasked ones */
        loss = count ? loss * (float)((double)n * (double)rows / (double)count) : 0.0f;
    return loss;
}

/* Forward and backward of one micro-batch, reducing each unit's gradient;
 * dloss: the gradient weight of the model's micro-batch loss. */
static fsdp_status micro_step(fsdp_engine *e, int j, uint64_t index, int T, float dloss,
                              float *loss)
{
    const fsdp_engine_config *cfg = &e->sh->cfg;
    const fsdp_model *m = e->sh->model;
    const struct fsdp_model_i *mi = m->iface;
    int U = e->sh->sm.n_units;
    bool full = cfg->shard == FSDP_SHARD_FULL || cfg->shard == FSDP_SHARD_HYBRID; /* reshard
                                                                                    * after forward */

    FSDP_TRY(load_batch(e, e->sh->data, index, true, T));
    fsdp_shard_row *root = fsdp_engine_row(e, 0);

    fsdp_trace_begin(&e->tr, FSDP_TRACE_COMPUTE, "forward", "root", 0);
    FSDP_TRY(mi->root_forward(m, &e->ops, e->state, root->gathered));
    fsdp_trace_end(&e->tr, FSDP_TRACE_COMPUTE);
    if (U > 1)
        FSDP_TRY(gather_issue(e, 1));
    for (int u = 1; u < U; u++) {
        FSDP_TRY(gather_wait(e, u));
        if (cfg->prefetch && u + 1 < U)
            FSDP_TRY(gather_issue(e, u + 1));
        fsdp_trace_begin(&e->tr, FSDP_TRACE_COMPUTE, "forward", m->units[u].name, 0);
        FSDP_TRY(mi->unit_forward(m, &e->ops, e->state, u, fsdp_engine_row(e, u)->gathered));
        fsdp_trace_end(&e->tr, FSDP_TRACE_COMPUTE);
        if (full)
            FSDP_TRY(gather_release(e, u));
    }

    FSDP_TRY(alloc_grad_full(e, 0));
    fsdp_trace_begin(&e->tr, FSDP_TRACE_COMPUTE, "head", "root", 0);
    FSDP_TRY(mi->head_forward_backward(m, &e->ops, e->state, root->gathered, root->grad_full,
                                       dloss, loss));
    fsdp_trace_end(&e->tr, FSDP_TRACE_COMPUTE);

    bool last_micro = j == cfg->grad_accum - 1;
    if (U > 1)
        FSDP_TRY(gather_issue(e, U - 1));
    for (int u = U - 1; u >= 1; u--) {
        FSDP_TRY(gather_wait(e, u));
        if (cfg->prefetch && u - 1 >= 1)
            FSDP_TRY(gather_issue(e, u - 1));
        if (cfg->recompute != FSDP_RECOMPUTE_NONE) {
            /* the gather above serves the re-forward and the backward */
            fsdp_trace_begin(&e->tr, FSDP_TRACE_COMPUTE, "recompute", m->units[u].name, 0);
            FSDP_TRY(mi->unit_recompute(m, &e->ops, e->state, u,
                                        fsdp_engine_row(e, u)->gathered));
            fsdp_trace_end(&e->tr, FSDP_TRACE_COMPUTE);
        }
        FSDP_TRY(alloc_grad_full(e, u));
        fsdp_trace_begin(&e->tr, FSDP_TRACE_COMPUTE, "backward", m->units[u].name, 0);
        FSDP_TRY(mi->unit_backward(m, &e->ops, e->state, u, fsdp_engine_row(e, u)->gathered,
                                   fsdp_engine_row(e, u)->grad_full));
        fsdp_trace_end(&e->tr, FSDP_TRACE_COMPUTE);
        FSDP_TRY(gather_release(e, u));
        FSDP_TRY(grad_reduce(e, u));
        if (last_micro && e->sh->sm.units[u].shard_numel)
            FSDP_TRY(e->place->unit_ready(e, u));
    }
    fsdp_trace_begin(&e->tr, FSDP_TRACE_COMPUTE, "backward", "root", 0);
    FSDP_TRY(mi->root_backward(m, &e->ops, e->state, root->gathered, root->grad_full));
    fsdp_trace_end(&e->tr, FSDP_TRACE_COMPUTE);
    FSDP_TRY(grad_reduce(e, 0));
    if (last_micro && e->sh->sm.units[0].shard_numel)
        FSDP_TRY(e->place->unit_ready(e, 0));
    return FSDP_STATUS_OK;
}

/* The model state's active length: T, or the state's T for a family that has no
 * state_len (models/model.h); *T gets the one the ops run at. */
static void set_len(fsdp_engine *e, int *T)
{
    const struct fsdp_model_i *mi = e->sh->model->iface;
    if (*T < 1 || *T > e->sh->cfg.seq || !mi->state_len)
        *T = e->sh->cfg.seq;
    if (mi->state_len)
        mi->state_len(e->state, *T);
}

static fsdp_status step_run(fsdp_engine *e, uint64_t step, float lr, fsdp_step_result *res)
{
    fsdp_engine_shared *sh = e->sh;
    const fsdp_engine_config *cfg = &sh->cfg;
    int N = cfg->n_ranks, A = cfg->grad_accum;
    if (cfg->inference)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "rank %d: an inference engine (forward "
                              "only) cannot take a training step", e->rank);
    fsdp_engine_comms_reset(e);

    /* parameters of the previous step's update must be on the device */
    e->lr = lr;
    e->t = step + 1; /* optimizer step count of this update (host updates may start in backward) */
    e->update_started = false;
    /* the step's length: the trainer's T' (fsdp_engine_set_len), the same on every rank */
    int T = e->step_len;
    set_len(e, &T);
    /* each token's weight is 1 / (unmasked targets of the global batch) */
    int M = N * A;
    uint64_t rows = (uint64_t)cfg->batch * (uint64_t)T, count;
    FSDP_TRY(count_targets(e, step * (uint64_t)M, M, &count));
    float dloss = count ? (float)((double)rows / (double)count) : 0.0f;
    FSDP_TRY(gather_wait(e, 0)); /* the root stays gathered for the whole step */
    for (int j = 0; j < A; j++) {
        uint64_t index = step * (uint64_t)(N * A) + (uint64_t)j * (uint64_t)N + (uint64_t)e->rank;
        e->host_losses[j] = 0.0f;
        FSDP_TRY(micro_step(e, j, index, T, dloss, &e->host_losses[j]));
    }
    FSDP_TRY(gather_release(e, 0));
    if (e->data_st != FSDP_STATUS_OK)
        for (int j = 0; j < A; j++) /* a batch this rank could not read: no rank updates */
            e->host_losses[j] = NAN;

    float norm = 0.0f;
    /* the norm and every rank's losses (in e->loss_order, by the global
     * micro-batch index m = j * N + r) */
    FSDP_TRY(fsdp_engine_norm(e, &norm));
    float loss = fsdp_engine_mean_loss(e->loss_order, M, rows, count);

    /* clip and update; every rank computed the same loss and norm, so all
     * take the same branch. A non-finite step would poison the parameters:
     * no update, unless one started in backward already. */
    res->finite = isfinite(loss) && isfinite(norm);
    res->applied = res->finite || e->update_started;
    float scale = 1.0f;
    if (cfg->clip > 0.0f && norm > cfg->clip)
        scale = cfg->clip / (norm + 1e-6f);
    if (res->applied)
        FSDP_TRY(e->place->step(e, lr, scale));
    else
        e->t = step; /* the state is the previous step's */

    /* every rank's figures; after the barrier x_stats holds them */
    FSDP_TRY(fsdp_engine_publish(e));
    FSDP_TRY(fsdp_world_barrier(sh->world));
    res->loss = loss;
    res->grad_norm = norm;
    res->lr = lr;
    return FSDP_STATUS_OK;
}

/* ---- forward only (evaluation, sampling) ----------------------------------- */

/* Forward of the tokens already in the model state: gathers unit by unit;
 * the root stays gathered for the caller to release. */
static fsdp_status forward_only(fsdp_engine *e, float *loss)
{
    const fsdp_model *m = e->sh->model;
    const struct fsdp_model_i *mi = m->iface;
    int T = e->sh->cfg.seq; /* forwards run at the engine's T (the staging is of T) */
    set_len(e, &T);
    FSDP_TRY(gather_wait(e, 0));
    FSDP_TRY(mi->root_forward(m, &e->ops, e->state, fsdp_engine_row(e, 0)->gathered));
    for (int u = 1; u < e->sh->sm.n_units; u++) {
        FSDP_TRY(gather_wait(e, u));
        FSDP_TRY(mi->unit_forward(m, &e->ops, e->state, u, fsdp_engine_row(e, u)->gathered));
        FSDP_TRY(gather_release(e, u));
    }
    return mi->head_forward_backward(m, &e->ops, e->state, fsdp_engine_row(e, 0)->gathered, NULL, 1.0f,
                                     loss);
}

static fsdp_status forward_batch_run(fsdp_engine *e, const fsdp_data *data, uint64_t index,
                                     float *loss, uint64_t *n_targets)
{
    if (!data)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "fsdp_engine_forward_batch: the engine has no data source");
    const fsdp_engine_config *cfg = &e->sh->cfg;
    size_t rows = (size_t)cfg->batch * (size_t)cfg->seq;
    FSDP_TRY(load_batch(e, data, index, false, cfg->seq));
    uint64_t count = rows;
    if (fsdp_data_masked(data) && fsdp_device_computes(&e->dev))
        count = count_unmasked(e->tokens_host + rows, rows); /* load_batch's targets */
    float l = 0.0f;
    FSDP_TRY(forward_only(e, &l));
    *loss = l;
    if (n_targets)
        *n_targets = count;
    return gather_release(e, 0);
}

static fsdp_status forward_run(fsdp_engine *e, const int *tokens, int n_rows, const int *pos,
                               float *logits_out, float *loss)
{
    fsdp_engine_shared *sh = e->sh;
    const fsdp_engine_config *cfg = &sh->cfg;
    const fsdp_model *m = sh->model;
    const struct fsdp_model_i *mi = m->iface;
    int T = cfg->seq, Vp = m->padded_vocab_size;
    size_t n = (size_t)cfg->batch * (size_t)T;
    if (n_rows > cfg->batch)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "forward of %d rows > batch %d", n_rows,
                              cfg->batch);
    if (fsdp_device_computes(&e->dev)) { /* meta's staging is not backed */
        int *in = e->tokens_host, *tg = e->tokens_host + n;
        FSDP_TRY(fsdp_device_event_sync(&e->dev, e->ev_tokens)); /* as in load_batch */
        memset(in, 0, n * sizeof(int));
        memcpy(in, tokens, (size_t)n_rows * (size_t)T * sizeof(int));
        for (size_t i = 0; i < n; i++)
            tg[i] = in[i]; /* targets are unused by the forward; keep them valid */
        FSDP_TRY(fsdp_device_memcpy(&e->dev, mi->state_tokens(e->state), in, n * sizeof(int),
                                    e->dev.compute));
        FSDP_TRY(fsdp_device_memcpy(&e->dev, mi->state_targets(e->state), tg, n * sizeof(int),
                                    e->dev.compute));
        if (e->pos_dev) { /* packed data's engine: these rows are one sequence each */
            for (size_t i = 0; i < n; i++)
                tg[n + i] = (int)(i % (size_t)T);
            FSDP_TRY(fsdp_device_memcpy(&e->dev, e->pos_dev, tg + n, n * sizeof(int),
                                        e->dev.compute));
        }
        FSDP_TRY(fsdp_device_event_record(&e->dev, e->ev_tokens, e->dev.compute));
    }
    float l = 0.0f;
    FSDP_TRY(forward_only(e, &l));
    if (loss)
        *loss = l;
    if (logits_out && fsdp_device_computes(&e->dev)) {
        const char *lg = mi->state_logits(e->state);
        for (int b = 0; b < n_rows; b++) {
            size_t rowi = (size_t)b * (size_t)T + (size_t)pos[b];
            if (cfg->compute_dtype == FSDP_DTYPE_F32) {
                FSDP_TRY(fsdp_device_memcpy(&e->dev, logits_out + (size_t)b * Vp,
                                            lg + rowi * Vp * sizeof(float), Vp * sizeof(float),
                                            e->dev.compute));
            } else {
                /* bf16 logits: widen on the device, then copy */
                if (!e->logits_stage)
                    FSDP_TRY(fsdp_device_alloc(&e->dev, (size_t)Vp * sizeof(float),
                                               FSDP_MEM_OTHER, "logits staging",
                                               (void **)&e->logits_stage));
                float *stage = e->logits_stage;
                FSDP_OP(&e->ops, cast, stage, FSDP_DTYPE_F32, lg + rowi * Vp * 2, FSDP_DTYPE_BF16,
                        (size_t)Vp);
                FSDP_TRY(fsdp_device_memcpy(&e->dev, logits_out + (size_t)b * Vp, stage,
                                            Vp * sizeof(float), e->dev.compute));
                FSDP_TRY(fsdp_device_stream_sync(&e->dev, e->dev.compute));
            }
        }
        FSDP_TRY(fsdp_device_stream_sync(&e->dev, e->dev.compute));
    }
    return gather_release(e, 0);
}

/* Unit u's NF4 segment gathered, dequantized to fp32 into host_out (its
 * nf4_numel elements). Collective over the shard ranks. */
static fsdp_status gather_nf4_export(fsdp_engine *e, int u, float *host_out)
{
    fsdp_shard_unit *su = &e->sh->sm.units[u];
    int k_ranks = sharded(e) ? e->sh->sm.shard_ranks : 1;
    size_t bytes = fsdp_shardmap_nf4_bytes(su), all = bytes * (size_t)k_ranks;
    void *full = NULL;
    char *host = malloc(all + su->nf4_padded * sizeof(float));
    if (!host)
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory exporting unit '%s'",
                              su->spec->name);
    fsdp_status st = fsdp_device_alloc(&e->dev, all, FSDP_MEM_OTHER, "unit export (NF4)", &full);
    void *row_nf4 = fsdp_engine_row(e, u)->nf4, *mine = row_nf4;
    if (st == FSDP_STATUS_OK)
        st = stage(e, u, false, row_nf4, bytes, &mine);
    if (st == FSDP_STATUS_OK && sharded(e))
        st = fsdp_comm_all_gather(e->shard_comm, mine, full, bytes / sizeof(float),
                                  FSDP_DTYPE_F32, e->dev.comm);
    else if (st == FSDP_STATUS_OK)
        st = fsdp_device_memcpy(&e->dev, full, mine, bytes, e->dev.comm);
    if (st == FSDP_STATUS_OK)
        st = fsdp_device_memcpy(&e->dev, host, full, all, e->dev.comm);
    if (st == FSDP_STATUS_OK)
        st = fsdp_device_stream_sync(&e->dev, e->dev.comm);
    float *x = (float *)(host + all);
    for (int k = 0; st == FSDP_STATUS_OK && k < k_ranks; k++) {
        const uint8_t *shard = (const uint8_t *)host + (size_t)k * bytes;
        fsdp_nf4_dequant_ref(shard, (const float *)(shard + su->nf4_shard / 2), su->nf4_shard,
                             x + (size_t)k * su->nf4_shard);
    }
    if (st == FSDP_STATUS_OK)
        memcpy(host_out, x, su->nf4_numel * sizeof(float));
    stage_done(e, row_nf4, mine);
    fsdp_device_free(&e->dev, full);
    free(host);
    return st;
}

/* Unit u's frozen segments gathered, widened (or dequantized) to fp32 into
 * host_out (the unit's elements from train_numel on). Collective over the
 * shard ranks. */
static fsdp_status gather_frozen(fsdp_engine *e, int u, float *host_out)
{
    fsdp_shard_unit *su = &e->sh->sm.units[u];
    fsdp_dtype dt = e->sh->cfg.compute_dtype;
    size_t bytes = su->frozen_padded * fsdp_dtype_size(dt);
    if (su->nf4_numel)
        FSDP_TRY(gather_nf4_export(e, u, host_out + su->frozen_numel));
    if (!su->frozen_numel)
        return FSDP_STATUS_OK;
    void *full = NULL, *host = malloc(bytes + 1);
    if (!host)
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory exporting unit '%s'",
                              su->spec->name);
    void *row_frozen = fsdp_engine_row(e, u)->frozen, *mine = row_frozen;
    fsdp_status st = fsdp_device_alloc(&e->dev, bytes, FSDP_MEM_OTHER, "unit export (frozen)",
                                       &full);
    if (st == FSDP_STATUS_OK)
        st = stage(e, u, false, row_frozen, su->frozen_shard * fsdp_dtype_size(dt), &mine);
    if (st == FSDP_STATUS_OK && sharded(e))
        st = fsdp_comm_all_gather(e->shard_comm, mine, full, su->frozen_shard, dt, e->dev.comm);
    else if (st == FSDP_STATUS_OK)
        st = fsdp_device_memcpy(&e->dev, full, mine, bytes, e->dev.comm);
    if (st == FSDP_STATUS_OK)
        st = fsdp_device_memcpy(&e->dev, host, full, bytes, e->dev.comm);
    if (st == FSDP_STATUS_OK)
        st = fsdp_device_stream_sync(&e->dev, e->dev.comm);
    for (size_t i = 0; st == FSDP_STATUS_OK && i < su->frozen_numel; i++)
        host_out[i] = dt == FSDP_DTYPE_BF16 ? fsdp_bf16_to_f32(((const fsdp_bf16 *)host)[i])
                                            : ((const float *)host)[i];
    stage_done(e, row_frozen, mine);
    fsdp_device_free(&e->dev, full);
    free(host);
    return st;
}

static fsdp_status gather_unit_run(fsdp_engine *e, int u, float *host_out)
{
    fsdp_shard_unit *su = &e->sh->sm.units[u];
    fsdp_shard_row *row = fsdp_engine_row(e, u);
    float *full = NULL, *shard = NULL;
    FSDP_TRY(e->place->params_ready(e, u));
    if (!su->padded_numel)
        return gather_frozen(e, u, host_out + su->numel);
    FSDP_TRY(fsdp_device_alloc(&e->dev, su->padded_numel * sizeof(float), FSDP_MEM_OTHER,
                               "unit export", (void **)&full));
    fsdp_status st = e->place->master_on_device(e, u, &shard);
    if (st == FSDP_STATUS_OK) {
        if (sharded(e))
            st = fsdp_comm_all_gather(e->shard_comm, shard, full, su->shard_numel,
                                      FSDP_DTYPE_F32, e->dev.comm);
        else
            st = fsdp_device_memcpy(&e->dev, full, shard, su->padded_numel * sizeof(float),
                                    e->dev.comm);
    }
    if (st == FSDP_STATUS_OK)
        st = fsdp_device_memcpy(&e->dev, host_out, full, su->numel * sizeof(float), e->dev.comm);
    if (st == FSDP_STATUS_OK)
        st = fsdp_device_stream_sync(&e->dev, e->dev.comm);
    if (shard != row->master)
        fsdp_device_free(&e->dev, shard);
    fsdp_device_free(&e->dev, full);
    if (st == FSDP_STATUS_OK)
        st = gather_frozen(e, u, host_out + su->numel);
    return st;
}

/* ---- the public calls remember their failure ------------------------------- */

fsdp_status fsdp_engine_step(fsdp_engine *e, uint64_t step, float lr, fsdp_step_result *res)
{
    fsdp_flight_step(e->sh->world->flight, e->rank, (long)step + 1); /* the stall report's step */
    return fsdp_engine_note(e, step_run(e, step, lr, res));
}

void fsdp_engine_set_len(fsdp_engine *e, int T) { e->step_len = T; }

fsdp_status fsdp_engine_forward_batch(fsdp_engine *e, uint64_t index, float *loss,
                                      uint64_t *n_targets)
{
    return fsdp_engine_note(e, forward_batch_run(e, e->sh->data, index, loss, n_targets));
}

fsdp_status fsdp_engine_forward_data(fsdp_engine *e, const fsdp_data *data, uint64_t index,
                                     float *loss, uint64_t *n_targets)
{
    return fsdp_engine_note(e, forward_batch_run(e, data, index, loss, n_targets));
}

fsdp_status fsdp_engine_forward(fsdp_engine *e, const int *tokens, int n_rows, const int *pos,
                                float *logits_out, float *loss)
{
    return fsdp_engine_note(e, forward_run(e, tokens, n_rows, pos, logits_out, loss));
}

fsdp_status fsdp_engine_gather_unit(fsdp_engine *e, int u, float *host_out)
{
    return fsdp_engine_note(e, gather_unit_run(e, u, host_out));
}
