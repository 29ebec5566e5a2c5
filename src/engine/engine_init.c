/*
 * engine_init.c - setting up and tearing down the engine: the state the
 * ranks share (settings checked once, the shard map, the gradient-norm
 * cover), and one rank's engine: its device, communicators, op contexts,
 * placement, shards initialised from the model's RNG or a weight file,
 * the model state and the token staging, then the warm-up reservation.
 */
#include <string.h>

#include "core/bf16.h"
#include "core/world.h"
#include "engine/engine.h"
#include "engine/engine_internal.h"

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

/* Every unit's labels (engine_internal.h fsdp_unit_label). */
static fsdp_status init_labels(fsdp_engine_shared *sh)
{
    static const char *const text[FSDP_LABEL_COUNT] = {
        [FSDP_LABEL_GATHER] = "gather",
        [FSDP_LABEL_ALL_GATHER] = "all-gather",
        [FSDP_LABEL_FROZEN_GATHER] = "frozen all-gather",
        [FSDP_LABEL_REDUCTION] = "gradient reduction",
        [FSDP_LABEL_REDUCE_PACK] = "gradient reduce-scatter",
        [FSDP_LABEL_GRADIENT] = "gradient",
        [FSDP_LABEL_REDUCED] = "reduced gradient",
        [FSDP_LABEL_UPLOAD] = "parameter shard upload",
        [FSDP_LABEL_FROZEN_UPLOAD] = "frozen shard upload",
    };
    size_t per_unit = (size_t)FSDP_LABEL_COUNT * FSDP_LABEL_MAX;
    sh->unit_labels = malloc((size_t)sh->sm.n_units * per_unit + 1);
    if (!sh->unit_labels)
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory for the units' labels");
    for (int u = 0; u < sh->sm.n_units; u++)
        for (int l = 0; l < FSDP_LABEL_COUNT; l++)
            snprintf(sh->unit_labels + (size_t)u * per_unit + (size_t)l * FSDP_LABEL_MAX,
                     FSDP_LABEL_MAX, "unit '%s' %s", sh->sm.units[u].spec->name, text[l]);
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
    fsdp_status st = FSDP_STATUS_OK;
    if (cfg->direct_numel)
        st = fsdp_shardmap_regroup(&sh->sm, cfg->direct_numel);
    for (int u = 0; u < sh->sm.n_units; u++)
        sh->n_local_blocks += sh->sm.units[u].n_blocks;
    if (st == FSDP_STATUS_OK)
        st = fsdp_norm_cover_init(&sh->norm, &sh->sm);
    if (st == FSDP_STATUS_OK)
        st = init_labels(sh);
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
    free(sh->unit_labels);
    fsdp_norm_cover_free(&sh->norm);
    fsdp_shardmap_free(&sh->sm);
    memset(sh, 0, sizeof *sh);
}

/* ---- per-rank init ------------------------------------------------------- */

/* The rank's shard of segment seg of unit u, padding zero: each
 * parameter's rows (shardmap.h) from init_fn or the model's counter-based
 * RNG into `vals` (fp32, the shard's elements), or, for the NF4 segment,
 * from init_nf4_fn into `codes` (its codes, then its fp32 absmax:
 * fsdp_shardmap_nf4_bytes). Runs that follow each other both in the flat
 * buffer and in the shard are read as one (with one shard rank, the
 * segment), so a model file is read in as few pieces as the layout allows. */
static fsdp_status init_shard(fsdp_engine *e, int u, fsdp_shard_seg seg, float *vals,
                              uint8_t *codes)
{
    const fsdp_engine_shared *sh = e->sh;
    const fsdp_shard_unit *su = &sh->sm.units[u];
    int slot = fsdp_shardmap_slot(&sh->sm, e->rank), end = su->seg_first[seg + 1];
    size_t n = fsdp_shard_seg_numel(su, seg);
    if (codes)
        memset(codes, 0, fsdp_shardmap_nf4_bytes(su));
    else
        memset(vals, 0, n * sizeof(float));
    for (int i = su->seg_first[seg]; i < end;) {
        size_t at, len = fsdp_shard_param_run(&su->params[i], slot, &at), off;
        size_t shard_at = su->params[i].shard_off, next_at;
        for (i++; len && i < end; i++) { /* the runs that continue this one */
            off = su->params[i].shard_off;
            size_t more = fsdp_shard_param_run(&su->params[i], slot, &next_at);
            if (!more || next_at != at + len || off != shard_at + len)
                break;
            len += more;
        }
        if (!len)
            continue;
        if (codes)
            FSDP_TRY(sh->init_nf4_fn(sh->init_arg, sh->model, u, at, at + len,
                                     codes + shard_at / 2,
                                     (float *)(codes + n / 2) + shard_at / 64));
        else if (sh->init_fn)
            FSDP_TRY(sh->init_fn(sh->init_arg, sh->model, u, at, at + len, vals + shard_at));
        else
            fsdp_model_init_range(sh->model, u, at, at + len, sh->cfg.seed, vals + shard_at);
    }
    return FSDP_STATUS_OK;
}

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
    FSDP_TRY(init_shard(e, u, FSDP_SEG_FROZEN, host_tmp, NULL));
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
    uint8_t *codes = (uint8_t *)host_tmp;
    FSDP_TRY(init_shard(e, u, FSDP_SEG_NF4, NULL, codes));
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
    FSDP_TRY(init_shard(e, u, FSDP_SEG_TRAIN, host_tmp, NULL));
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

/* Rank e->rank's device, communicators, op contexts and placement. */
static fsdp_status init_contexts(fsdp_engine *e)
{
    const fsdp_engine_shared *sh = e->sh;
    const fsdp_engine_config *cfg = &sh->cfg;
    int rpd = cfg->ranks_per_device > 0 ? cfg->ranks_per_device : 1;
    int local = e->rank - sh->world->rank_offset; /* the device ordinal is this process's */
    int ordinal = cfg->backend == FSDP_BACKEND_CUDA ? local / rpd : local;
    FSDP_TRY(fsdp_device_init(&e->dev, cfg->backend, sh->world, e->rank, ordinal,
                              cfg->device_mem));
    e->dev_ready = true;
    e->dev.oom_hint = cfg->oom_hint;
    e->tr = (fsdp_trace_rank){.trace = sh->trace, .rank = e->rank, .dev = &e->dev};
    FSDP_TRY(fsdp_engine_comms_init(e)); /* the transport is chosen in comm/transport.h */
    e->ops_ready = true; /* the three contexts' fini is safe after a failed init */
    FSDP_TRY(fsdp_ops_init(&e->ops, &e->dev, cfg->compute_dtype));
    FSDP_TRY(fsdp_ops_init_host(&e->ops_host, &e->dev, cfg->compute_dtype));
    FSDP_TRY(fsdp_ops_init_stream(&e->ops_gather, &e->dev, cfg->compute_dtype, e->dev.comm));
    e->place = fsdp_place_of(cfg);
    bool host_grads = e->place->host_grads;
    if (!cfg->inference && host_grads)
        FSDP_TRY(fsdp_ops_init_host_stream(&e->ops_acc, &e->dev, FSDP_DTYPE_F32, e->dev.copy));
    else if (!cfg->inference)
        FSDP_TRY(fsdp_ops_init_stream(&e->ops_acc, &e->dev, cfg->compute_dtype, e->dev.comm));
    return FSDP_STATUS_OK;
}

/* The accumulation counter, the events, and every unit's shards allocated
 * where the placement keeps them and initialised (unit_init, staged through
 * one host buffer of the largest shard). */
static fsdp_status init_units(fsdp_engine *e)
{
    const fsdp_engine_shared *sh = e->sh;
    const fsdp_engine_config *cfg = &sh->cfg;
    bool host_grads = e->place->host_grads;
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
    FSDP_TRY(fsdp_accum_init(&e->acc, &e->dev, &e->ops_acc, U, cfg->grad_accum, cfg->accum,
                             max_shard, host_grads));
    e->ev_gather = calloc((size_t)U, sizeof *e->ev_gather);
    e->host_losses = calloc((size_t)cfg->grad_accum, sizeof(float));
    e->loss_order = calloc((size_t)cfg->grad_accum * (size_t)cfg->n_ranks, sizeof(float));
    if (!e->ev_gather || !e->host_losses || !e->loss_order)
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory for rank %d's engine",
                              e->rank);
    for (int u = 0; u < U; u++)
        FSDP_TRY(fsdp_device_event_create(&e->dev, &e->ev_gather[u]));
    FSDP_TRY(fsdp_device_event_create(&e->dev, &e->ev_tmp));
    FSDP_TRY(fsdp_device_event_create(&e->dev, &e->ev_tmp2));
    FSDP_TRY(fsdp_device_event_create(&e->dev, &e->ev_tokens));
    float *host_tmp = NULL;
    if (fsdp_device_computes(&e->dev) && !(host_tmp = malloc(max_init * sizeof(float) + 1)))
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory staging parameter init");
    fsdp_status st = e->place->init(e);
    for (int u = 0; u < U && st == FSDP_STATUS_OK; u++)
        st = unit_init(e, u, host_tmp);
    free(host_tmp);
    return st;
}

/* The norm's partial sums, the model state and the token staging. */
static fsdp_status init_state(fsdp_engine *e)
{
    const fsdp_engine_shared *sh = e->sh;
    const fsdp_engine_config *cfg = &sh->cfg;
    /* only the device placement's norm uses it; it stays allocated in
     * both, as the planner's byte-exact figures (and the golden fixture)
     * have always counted it */
    if (!cfg->inference)
        FSDP_TRY(fsdp_device_alloc(&e->dev, sh->n_local_blocks * sizeof(float),
                                   FSDP_MEM_OTHER, "gradient-norm partial sums",
                                   (void **)&e->dev_blocks));
    if (cfg->inference || cfg->recompute == FSDP_RECOMPUTE_NONE)
        FSDP_TRY(sh->model->iface->state_init(sh->model, &e->ops, cfg->batch, cfg->seq,
                                              !cfg->inference, &e->state));
    else
        FSDP_TRY(sh->model->iface->state_init_recompute(sh->model, &e->ops, cfg->batch,
                                                        cfg->seq, cfg->recompute, &e->state));
    /* pinned, so that the copies to the device are asynchronous; packed data adds
     * the token positions (data.h), staged after the targets */
    size_t n_tokens = (size_t)cfg->batch * (size_t)cfg->seq;
    bool packed = cfg->positions || (sh->data && fsdp_data_packed(sh->data));
    FSDP_TRY(fsdp_device_host_alloc(&e->dev, (packed ? 3 : 2) * n_tokens * sizeof(int),
                                    FSDP_MEM_ACT, packed ? "token staging (inputs, targets "
                                    "and positions)" : "token staging (inputs and targets)",
                                    (void **)&e->tokens_host));
    if (packed) {
        FSDP_TRY(fsdp_device_alloc(&e->dev, n_tokens * sizeof(int), FSDP_MEM_ACT,
                                   "token positions", (void **)&e->pos_dev));
        sh->model->iface->state_positions(e->state, e->pos_dev);
    }
    return FSDP_STATUS_OK;
}

fsdp_status fsdp_engine_init(fsdp_engine **out, fsdp_engine_shared *sh, int rank)
{
    fsdp_status st;
    fsdp_engine *e = calloc(1, sizeof *e);
    if (!e)
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory for rank %d's engine", rank);
    e->sh = sh;
    e->rank = rank;
    FSDP_CHECK(init_contexts(e));
    FSDP_CHECK(init_units(e));
    FSDP_CHECK(init_state(e));
    FSDP_CHECK(fsdp_engine_warm_up(e));
    FSDP_CHECK(fsdp_device_stream_sync(&e->dev, e->dev.compute));
    /* every rank is done allocating before any rank's first collective */
    if (sh->world)
        FSDP_CHECK(fsdp_world_barrier(sh->world));
    *out = e;
    return FSDP_STATUS_OK;
fail:
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
        fsdp_engine_sync_all(e);
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
