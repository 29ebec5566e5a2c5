/*
 * engine.c - the FSDP step on one rank: just-in-time all-gathers with
 * prefetch (engine_gather.c), reduce-scatter of unit gradients into the accumulation counter
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
 *
 * Setting up and tearing down a rank's engine is engine_init.c's.
 */
#include <math.h>
#include <string.h>

#include "core/flight.h"
#include "core/world.h"
#include "engine/engine.h"
#include "engine/engine_internal.h"

/* ---- gradient reduction and accumulation --------------------------------- */

/* Group g of unit u's trainable parameters (shardmap.h) reduce-scattered
 * from the full gradient into this rank's shard `dst`, on the comm stream:
 * a direct one from its place (the padding of this rank's rows, which
 * summed what follows the parameter, zeroed after), a packed one copied
 * into a rank-major buffer of its own first (freed stream-ordered). */
static fsdp_status reduce_group(fsdp_engine *e, int u, const fsdp_shard_group *g, float *dst)
{
    fsdp_shard_row *row = fsdp_engine_row(e, u);
    fsdp_shard_unit *su = &e->sh->sm.units[u];
    const fsdp_shard_param *sp = &su->params[g->first];
    float *send = row->grad_full + sp->spec->offset;
    if (!g->direct) {
        FSDP_TRY(fsdp_device_alloc(&e->dev, g->span * sizeof(float) * (size_t)e->sh->sm.shard_ranks,
                                   FSDP_MEM_GRAD, fsdp_engine_label(e, u, FSDP_LABEL_REDUCE_PACK),
                                   (void **)&send));
        FSDP_TRY(fsdp_engine_permute(e, u, g->first, g->end, g->span, g->shard_off, row->grad_full,
                                     send, sizeof(float), false, e->dev.comm, false));
    }
    fsdp_comm_label_str(e->shard_comm, fsdp_engine_label(e, u, FSDP_LABEL_REDUCTION));
    FSDP_TRY(fsdp_comm_reduce_scatter(e->shard_comm, send, dst + g->shard_off, g->span,
                                      FSDP_DTYPE_F32, FSDP_REDUCE_SUM, e->dev.comm));
    if (!g->direct) {
        fsdp_device_free(&e->dev, send); /* stream-ordered: after the collective */
        return FSDP_STATUS_OK;
    }
    size_t at, n = fsdp_shard_param_run(sp, fsdp_shardmap_slot(&e->sh->sm, e->rank), &at);
    return fsdp_device_memset(&e->dev, dst + g->shard_off + n, 0, (g->span - n) * sizeof(float),
                              e->dev.comm);
}

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
        FSDP_TRY(fsdp_device_alloc(&e->dev, f32, FSDP_MEM_GRAD,
                                   fsdp_engine_label(e, u, FSDP_LABEL_REDUCED), (void **)&dst));
    }
    FSDP_TRY(fsdp_engine_order(e, e->dev.compute, e->dev.comm, e->ev_tmp));
    fsdp_trace_begin(&e->tr, FSDP_TRACE_COMM,
                     fsdp_engine_sharded(e) ? "reduce_scatter" : "all_reduce", su->spec->name,
                     su->padded_numel * sizeof(float));
    fsdp_comm *c = fsdp_engine_sharded(e) ? e->shard_comm : &e->comm;
    if (!fsdp_engine_permuted(e))
        fsdp_comm_label_str(c, fsdp_engine_label(e, u, FSDP_LABEL_REDUCTION));
    if (fsdp_engine_permuted(e)) {
        for (int g = su->group_first[FSDP_SEG_TRAIN]; g < su->group_first[FSDP_SEG_TRAIN + 1]; g++)
            FSDP_TRY(reduce_group(e, u, &su->groups[g], dst));
    } else if (fsdp_engine_sharded(e)) {
        FSDP_TRY(fsdp_comm_reduce_scatter(c, row->grad_full, dst, su->shard_numel,
                                          FSDP_DTYPE_F32, FSDP_REDUCE_SUM, e->dev.comm));
    } else {
        FSDP_TRY(fsdp_comm_all_reduce(c, row->grad_full, dst, su->padded_numel, FSDP_DTYPE_F32,
                                      FSDP_REDUCE_SUM, e->dev.comm));
    }
    if (e->replica_comm) { /* hybrid: the node's shard, over nodes */
        fsdp_comm_label_str(e->replica_comm, fsdp_engine_label(e, u, FSDP_LABEL_REDUCTION));
        FSDP_TRY(fsdp_comm_all_reduce(e->replica_comm, dst, dst, su->shard_numel,
                                      FSDP_DTYPE_F32, FSDP_REDUCE_SUM, e->dev.comm));
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
    size_t bytes = e->sh->sm.units[u].train_extent * sizeof(float);
    FSDP_TRY(fsdp_device_alloc(&e->dev, bytes, FSDP_MEM_GRAD,
                               fsdp_engine_label(e, u, FSDP_LABEL_GRADIENT),
                               (void **)&row->grad_full));
    return fsdp_device_memset(&e->dev, row->grad_full, 0, bytes, e->dev.compute);
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
    /* reshard after forward */
    bool full = cfg->shard == FSDP_SHARD_FULL || cfg->shard == FSDP_SHARD_HYBRID;

    FSDP_TRY(load_batch(e, e->sh->data, index, true, T));
    fsdp_shard_row *root = fsdp_engine_row(e, 0);

    fsdp_trace_begin(&e->tr, FSDP_TRACE_COMPUTE, "forward", "root", 0);
    FSDP_TRY(mi->root_forward(m, &e->ops, e->state, root->gathered));
    fsdp_trace_end(&e->tr, FSDP_TRACE_COMPUTE);
    if (U > 1)
        FSDP_TRY(fsdp_engine_gather_issue(e, 1));
    for (int u = 1; u < U; u++) {
        FSDP_TRY(fsdp_engine_gather_wait(e, u));
        if (cfg->prefetch && u + 1 < U)
            FSDP_TRY(fsdp_engine_gather_issue(e, u + 1));
        fsdp_trace_begin(&e->tr, FSDP_TRACE_COMPUTE, "forward", m->units[u].name, 0);
        FSDP_TRY(mi->unit_forward(m, &e->ops, e->state, u, fsdp_engine_row(e, u)->gathered));
        fsdp_trace_end(&e->tr, FSDP_TRACE_COMPUTE);
        if (full)
            FSDP_TRY(fsdp_engine_gather_release(e, u));
    }

    FSDP_TRY(alloc_grad_full(e, 0));
    fsdp_trace_begin(&e->tr, FSDP_TRACE_COMPUTE, "head", "root", 0);
    FSDP_TRY(mi->head_forward_backward(m, &e->ops, e->state, root->gathered, root->grad_full,
                                       dloss, loss));
    fsdp_trace_end(&e->tr, FSDP_TRACE_COMPUTE);

    bool last_micro = j == cfg->grad_accum - 1;
    if (U > 1)
        FSDP_TRY(fsdp_engine_gather_issue(e, U - 1));
    for (int u = U - 1; u >= 1; u--) {
        FSDP_TRY(fsdp_engine_gather_wait(e, u));
        if (cfg->prefetch && u - 1 >= 1)
            FSDP_TRY(fsdp_engine_gather_issue(e, u - 1));
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
        FSDP_TRY(fsdp_engine_gather_release(e, u));
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
    FSDP_TRY(fsdp_engine_gather_wait(e, 0)); /* the root stays gathered for the whole step */
    for (int j = 0; j < A; j++) {
        uint64_t index = step * (uint64_t)(N * A) + (uint64_t)j * (uint64_t)N + (uint64_t)e->rank;
        e->host_losses[j] = 0.0f;
        FSDP_TRY(micro_step(e, j, index, T, dloss, &e->host_losses[j]));
    }
    FSDP_TRY(fsdp_engine_gather_release(e, 0));
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

/* Forward of the tokens already in the model state, rows of T (set_len's:
 * what the state runs at): gathers unit by unit; the root stays gathered for
 * the caller to release. */
static fsdp_status forward_only(fsdp_engine *e, int T, float *loss)
{
    const fsdp_model *m = e->sh->model;
    const struct fsdp_model_i *mi = m->iface;
    set_len(e, &T);
    FSDP_TRY(fsdp_engine_gather_wait(e, 0));
    FSDP_TRY(mi->root_forward(m, &e->ops, e->state, fsdp_engine_row(e, 0)->gathered));
    for (int u = 1; u < e->sh->sm.n_units; u++) {
        FSDP_TRY(fsdp_engine_gather_wait(e, u));
        FSDP_TRY(mi->unit_forward(m, &e->ops, e->state, u, fsdp_engine_row(e, u)->gathered));
        FSDP_TRY(fsdp_engine_gather_release(e, u));
    }
    return mi->head_forward_backward(m, &e->ops, e->state, fsdp_engine_row(e, 0)->gathered, NULL,
                                     1.0f, loss);
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
    FSDP_TRY(forward_only(e, cfg->seq, &l));
    *loss = l;
    if (n_targets)
        *n_targets = count;
    return fsdp_engine_gather_release(e, 0);
}

static fsdp_status forward_run(fsdp_engine *e, const int *tokens, int n_rows, int T_rows,
                               const int *pos, float *logits_out, float *loss)
{
    fsdp_engine_shared *sh = e->sh;
    const fsdp_engine_config *cfg = &sh->cfg;
    const fsdp_model *m = sh->model;
    const struct fsdp_model_i *mi = m->iface;
    int Vp = m->padded_vocab_size;
    if (n_rows > cfg->batch)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "forward of %d rows > batch %d", n_rows,
                              cfg->batch);
    if (T_rows < 1 || T_rows > cfg->seq)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "forward of rows of %d tokens: the "
                              "engine's are 1 to %d", T_rows, cfg->seq);
    for (int b = 0; logits_out && b < n_rows; b++)
        if (pos[b] < 0 || pos[b] >= T_rows)
            return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "forward: row %d's logits at "
                                  "position %d of %d", b, pos[b], T_rows);
    int T = T_rows; /* the length the ops run at: T_rows, or cfg->seq (set_len) */
    set_len(e, &T);
    size_t n = (size_t)cfg->batch * (size_t)T;
    if (fsdp_device_computes(&e->dev)) { /* meta's staging is not backed */
        int *in = e->tokens_host, *tg = e->tokens_host + n;
        FSDP_TRY(fsdp_device_event_sync(&e->dev, e->ev_tokens)); /* as in load_batch */
        memset(in, 0, n * sizeof(int));
        for (int b = 0; b < n_rows; b++)
            memcpy(in + (size_t)b * T, tokens + (size_t)b * T_rows, (size_t)T_rows * sizeof(int));
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
    FSDP_TRY(forward_only(e, T, &l));
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
    return fsdp_engine_gather_release(e, 0);
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

fsdp_status fsdp_engine_forward(fsdp_engine *e, const int *tokens, int n_rows, int T,
                                const int *pos, float *logits_out, float *loss)
{
    return fsdp_engine_note(e, forward_run(e, tokens, n_rows, T, pos, logits_out, loss));
}
