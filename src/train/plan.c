/*
 * plan.c - `fsdp plan`: the real step schedule on the meta backend (the
 * reports are in src/report/plan_*.c).
 *
 * The run is the trainer's loop without data: every rank thread builds its
 * engine (shards, activations) and runs a few steps; the meta device hands
 * out fake addresses and counts bytes by kind, the meta communicator counts
 * bytes by collective, ops do nothing. Nothing here is proportional to the
 * parameter count except the shard map itself (one row per unit and rank),
 * so 70B-parameter shapes plan in milliseconds.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ckpt/modelfile.h"
#include "core/world.h"
#include "engine/accum.h"
#include "engine/trace.h"
#include "train/adapt.h"
#include "train/plan.h"

struct planner {
    const fsdp_train_config *cfg;
    fsdp_engine_shared sh;
    fsdp_plan *plan;
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* One rank: the engine's init and `steps` steps, then this rank's figures. */
static fsdp_status plan_rank(fsdp_world *w, int rank, void *arg)
{
    (void)w;
    struct planner *pl = arg;
    fsdp_engine *e = NULL;
    fsdp_status st;
    int *tokens = NULL;
    FSDP_CHECK(fsdp_engine_init(&e, &pl->sh, rank));
    const fsdp_engine_config *ec = &pl->sh.cfg;
    if (ec->inference) { /* forwards of a full micro-batch (eval) */
        tokens = calloc((size_t)ec->batch * (size_t)ec->seq, sizeof *tokens);
        if (!tokens) {
            st = fsdp_error_set(FSDP_STATUS_OOM, "out of host memory for the plan");
            goto fail;
        }
    }
    for (int s = 0; s < pl->plan->steps; s++) {
        fsdp_step_result r;
        if (ec->inference) {
            fsdp_engine_comms_reset(e);
            FSDP_CHECK(fsdp_engine_forward(e, tokens, ec->batch, ec->seq, NULL, NULL, NULL));
        } else {
            FSDP_CHECK(fsdp_engine_step(e, (uint64_t)s, fsdp_train_lr(pl->cfg, s), &r));
        }
    }
    /* training: the figures each step publishes, as a run's metrics report
     * them; forwards publish none: the device's own */
    fsdp_plan_rank *pr = &pl->plan->ranks[rank];
    const fsdp_device *d = fsdp_engine_device(e);
    pr->mem = ec->inference ? d->mem : pl->sh.x_stats[rank].mem;
    pr->host = ec->inference ? d->host : pl->sh.x_stats[rank].host;
    fsdp_engine_comm_counts(e, pr->sent_bytes, pr->recv_bytes, pr->n_calls,
                            pr->inter_sent_bytes, pr->inter_recv_bytes);
    st = FSDP_STATUS_OK;
fail:
    free(tokens);
    fsdp_engine_free(e);
    return st;
}

fsdp_status fsdp_plan_run(const fsdp_train_config *cfg, int steps, fsdp_plan *out)
{
    memset(out, 0, sizeof *out);
    if (steps < 1)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "plan: need at least 1 step (got %d)",
                              steps);
    FSDP_TRY(fsdp_backend_check(FSDP_BACKEND_META, cfg->eng.n_ranks, 1));
    double t0 = now_s();
    struct planner pl = {.cfg = cfg, .plan = out};
    fsdp_train_config run = *cfg;
    fsdp_engine_config *ec = &run.eng;
    ec->backend = FSDP_BACKEND_META;
    ec->comm = FSDP_COMM_AUTO;
    ec->ranks_per_device = 1;
    ec->device_mem = 0;
    pl.cfg = &run;
    fsdp_model model;
    memset(&model, 0, sizeof model);
    fsdp_world *w = NULL;
    fsdp_status st;
    out->eng = *ec;
    out->device_mem = cfg->eng.device_mem;
    out->steps = steps;
    out->n_ranks = ec->n_ranks;
    out->n_nodes = ec->n_nodes > 1 ? ec->n_nodes : 1;
    snprintf(out->model, sizeof out->model, "%s", cfg->model ? cfg->model : "?");
    /* a model file gives its shape, and whether it stores NF4 weights (a bnb-4bit
     * directory's are NF4 whatever --quantize says, as train keeps them): no weights read */
    FSDP_CHECK(fsdp_adapt_shape(cfg->model, &cfg->lora, cfg->freeze, (fsdp_quant)cfg->quantize,
                                &model));
    out->numel = model.numel;
    out->n_units = model.n_units;
    out->ranks = calloc((size_t)ec->n_ranks, sizeof *out->ranks);
    if (!out->ranks) {
        st = fsdp_error_set(FSDP_STATUS_OOM, "out of host memory for the plan");
        goto fail;
    }
    FSDP_CHECK(fsdp_world_init(&w, ec->n_ranks));
    FSDP_CHECK(fsdp_engine_shared_init(&pl.sh, ec, &model, NULL, w));
    out->train_numel = pl.sh.sm.numel;
    out->frozen_numel = pl.sh.sm.frozen_numel;
    out->nf4_numel = pl.sh.sm.nf4_numel;
    out->padded_numel = 0;
    for (int u = 0; u < pl.sh.sm.n_units; u++) {
        const fsdp_shard_unit *su = &pl.sh.sm.units[u];
        out->padded_numel += su->padded_numel + su->frozen_padded + su->nf4_padded;
        out->frozen_shard_bytes += su->frozen_shard * fsdp_dtype_size(ec->compute_dtype) +
                                   (su->nf4_numel ? fsdp_shardmap_nf4_bytes(su) : 0);
    }
    if (cfg->trace_path)
        FSDP_CHECK(fsdp_trace_init(&pl.sh.trace, ec->n_ranks));
    FSDP_CHECK(fsdp_world_launch(w, plan_rank, &pl));
    if (pl.sh.trace)
        FSDP_CHECK(fsdp_trace_write(pl.sh.trace, cfg->trace_path));
    out->wall_s = now_s() - t0;
    st = FSDP_STATUS_OK;
fail:
    fsdp_trace_free(pl.sh.trace);
    pl.sh.trace = NULL;
    if (pl.sh.sm.units)
        fsdp_engine_shared_free(&pl.sh);
    if (model.units)
        fsdp_model_free(&model);
    fsdp_world_free(w);
    if (st != FSDP_STATUS_OK) {
        fsdp_error_prefix("plan of model '%s' on %d device(s)%s", out->model, ec->n_ranks,
                          ec->n_nodes > 1 ? " over several nodes" : "");
        fsdp_plan_free(out);
    }
    return st;
}

void fsdp_plan_node_bytes(const fsdp_plan *p, int node, size_t *sent, size_t *recv)
{
    int L = p->n_ranks / p->n_nodes;
    for (int k = 0; k < FSDP_COLL_KIND_COUNT; k++) {
        sent[k] = recv[k] = 0;
        for (int r = node * L; r < (node + 1) * L; r++) {
            sent[k] += p->ranks[r].inter_sent_bytes[k];
            recv[k] += p->ranks[r].inter_recv_bytes[k];
        }
    }
}

void fsdp_plan_free(fsdp_plan *p)
{
    free(p->ranks);
    memset(p, 0, sizeof *p);
}

size_t fsdp_plan_max_peak(const fsdp_plan *p, int *rank)
{
    size_t best = 0;
    int who = 0;
    for (int r = 0; r < p->n_ranks; r++)
        if (p->ranks[r].mem.peak_bytes > best) {
            best = p->ranks[r].mem.peak_bytes;
            who = r;
        }
    if (rank)
        *rank = who;
    return best;
}

void fsdp_plan_formula(const fsdp_plan *p, size_t *dev_bytes, size_t *host_bytes, char *text,
                       size_t n)
{
    const fsdp_engine_config *e = &p->eng;
    /* hybrid shards over a node's L ranks as full shards over all N */
    bool hybrid = e->shard == FSDP_SHARD_HYBRID && p->n_nodes > 1;
    double P = (double)p->train_numel, N = (double)p->n_ranks / (hybrid ? p->n_nodes : 1);
    const char *over = hybrid ? "L" : "N";
    int dt = (int)fsdp_dtype_size(e->compute_dtype);
    /* state per parameter: fp32 master 4, fp32 gradient 4 for each of the
     * accumulation's buffers (fsdp_accum_buffers: the tree's
     * fsdp_accum_depth(A), 1 for one micro-step, 4 for 8; flat's 1, its one
     * scratch shard per rank left out), the optimizer's state (AdamW m and
     * v: 8), plus a compute-dtype copy when it differs from the master */
    int copy = e->compute_dtype != FSDP_DTYPE_F32 ? dt : 0;
    int optim = (int)fsdp_optim_state_bytes(fsdp_optim_or_default(e->optim));
    int grads = 4 * fsdp_accum_buffers(e->accum, e->grad_accum);
    int state = 4 + copy + grads + optim;
    bool full = e->shard == FSDP_SHARD_FULL || e->shard == FSDP_SHARD_HYBRID;
    double dev = 0, host = 0;
    if (e->inference) { /* the compute-dtype parameters alone */
        dev = dt * P / (full ? N : 1.0);
        snprintf(text, n, "%d P%s%s", dt, full ? "/" : "", full ? over : "");
    } else if (!e->offload) {
        if (full) {
            dev = state * P / N;
            snprintf(text, n, "%d P/%s", state, over);
        } else if (e->shard == FSDP_SHARD_GRAD_OP) {
            /* ZeRO-2: parameters replicated, gradients and optimizer sharded */
            dev = dt * P + (state - dt) * P / N;
            snprintf(text, n, "%d P + %d P/N", dt, state - dt);
        } else {
            dev = state * P;
            snprintf(text, n, "%d P", state);
        }
    } else {
        /* master, gradient (with the accumulation's partial sums:
         * fsdp_accum_buffers shards in all) and optimizer state in host
         * memory; the device keeps the compute-dtype parameters, sharded as
         * the strategy shards them, and the gradients in flight */
        int host_state = 4 + grads + optim;
        bool params_host = fsdp_offload_trainable_params(e);
        if (params_host) /* and the compute-dtype copy (--offload optimizer,params) */
            host_state += copy;
        host = host_state * P / (e->shard == FSDP_SHARD_NONE ? 1.0 : N);
        if (params_host) {
            snprintf(text, n, "host %d P%s%s", host_state, e->shard == FSDP_SHARD_NONE ? "" : "/",
                     e->shard == FSDP_SHARD_NONE ? "" : over);
        } else if (full) {
            dev = dt * P / N;
            snprintf(text, n, "device %d P/%s + host %d P/%s", dt, over, host_state, over);
        } else {
            dev = dt * P;
            snprintf(text, n, "device %d P + host %d P%s", dt, host_state,
                     e->shard == FSDP_SHARD_NONE ? "" : "/N");
        }
    }
    /* frozen parameters: a compute-dtype shard (F), or NF4 codes and fp32
     * absmax (Q: 9/16 byte each), sharded as the strategy shards; in pinned
     * host memory with params offload */
    double F = (double)p->frozen_numel, Q = (double)p->nf4_numel;
    double over_n = e->shard == FSDP_SHARD_NONE ? 1.0 : N;
    const char *where = e->offload_params && !e->inference ? "host " : "";
    size_t len = strlen(text);
    if (F > 0 && len < n)
        len += (size_t)snprintf(text + len, n - len, " + %s%d F%s%s", where, dt,
                                over_n > 1 ? "/" : "", over_n > 1 ? over : "");
    if (Q > 0 && len < n)
        snprintf(text + len, n - len, " + %s0.5625 Q%s%s", where, over_n > 1 ? "/" : "",
                 over_n > 1 ? over : "");
    if (*where)
        host += (dt * F + 0.5625 * Q) / over_n;
    else
        dev += (dt * F + 0.5625 * Q) / over_n;
    *dev_bytes = (size_t)dev;
    *host_bytes = (size_t)host;
}
