/*
 * place_host.c - optimizer state in pinned host memory (--offload
 * optimizer): the fp32 master, the optimizer's state arrays and the step's
 * gradient shard live in host memory and are updated by the optimizer's
 * host step (vectorised) on the process's CPU worker pool; the device keeps
 * only the compute-dtype shard, gathered units and gradients in flight.
 *
 * Gradients never stay on the device (as ZeRO-Offload): every micro-step,
 * unit u's reduced shard is copied to pinned host memory as soon as its
 * reduce-scatter is done, and the accumulation counter's partial sums live
 * and are added there (engine.c's grad_reduce, accum.h), in the same order
 * as on the device, so the bits are the same. Pipeline per step, per unit
 * u, ordered by events so that the host never waits inside backward:
 *   backward(u) [compute] -> reduce-scatter [comm] -> shard device->host
 *   [copy] -> the counter's adds, host work queued on the copy stream ->
 *   (last micro-step) the fold and the host step's submission, queued the
 *   same way -> the host step (pool) -> before u is next gathered: the
 *   host waits for u's host step, then the compute-dtype shard host->
 *   device [copy], which the gather [comm] and compute wait for through an
 *   event.
 * With --offload optimizer,params (fsdp_offload_trainable_params) the
 * compute-dtype shard has no device copy at all: it is the host staging
 * buffer (bf16) or the master itself (fp32), which the host step writes;
 * params_ready only waits for the step, and each gather uploads the shard
 * on the comm stream into a buffer of its own (engine.c's stage), so the
 * upload is prefetched with the gather. The host step of unit u never
 * overwrites the shard while an upload still reads it: u's uploads of a
 * step come before u's last reduce-scatter on the comm stream, and the
 * step is submitted after that gradient's copy (or after the norm synced
 * the copy stream).
 * Clipping stays exact: with --clip 0 nothing depends on the global norm, so
 * each unit's update starts as soon as its gradient is on the host, while
 * backward continues on earlier units (unless non-finite steps are to be
 * skipped: then the norm decides). With clipping, every update needs
 * the norm of the whole gradient, so the updates start right after the norm
 * is known, and overlap the next step's forward instead (unit u's forward
 * waits only for u's own update).
 */
#include <stdlib.h>
#include <string.h>

#include "core/world.h"
#include "engine/place.h"
#include "optim/host_step.h"
#include "optim/pool.h"

typedef struct host_ctx {
    fsdp_pool *pool;              /* the process CPU pool (NULL on meta) */
    fsdp_optim_job **jobs;        /* [n_units] host step in flight, or NULL; written by a
                                   * submission queued on the copy stream (ev_gate) */
    fsdp_event_t *ev_copy;        /* [n_units] the unit's last upload (copy stream) */
    fsdp_event_t *ev_gate;        /* [n_units] its queued submission (copy stream) */
    bool *gated;                  /* [n_units] a submission is queued: wait for ev_gate */
    void **param_host;            /* [n_units] bf16 staging of the compute shard, or NULL;
                                   * with trainable params offload, the shard itself */
    int max_params;               /* the most parameters of a unit */
} host_ctx;

static host_ctx *ctx_of(fsdp_engine *e) { return e->place_ctx; }

static fsdp_status host_init(fsdp_engine *e)
{
    const fsdp_engine_shared *sh = e->sh;
    int U = sh->sm.n_units, max_params = 1;
    for (int u = 0; u < U; u++)
        if (sh->sm.units[u].spec->n_params > max_params)
            max_params = sh->sm.units[u].spec->n_params;
    host_ctx *h = calloc(1, sizeof *h);
    if (h) {
        e->place_ctx = h;
        h->jobs = calloc((size_t)U, sizeof *h->jobs);
        h->ev_copy = calloc((size_t)U, sizeof *h->ev_copy);
        h->ev_gate = calloc((size_t)U, sizeof *h->ev_gate);
        h->gated = calloc((size_t)U, sizeof *h->gated);
        h->param_host = calloc((size_t)U, sizeof *h->param_host);
        h->max_params = max_params;
    }
    if (!h || !h->jobs || !h->ev_copy || !h->ev_gate || !h->gated || !h->param_host)
        return fsdp_error_set(FSDP_STATUS_OOM, "rank %d: out of host memory for offload state",
                              e->rank);
    for (int u = 0; u < U; u++) {
        FSDP_TRY(fsdp_device_event_create(&e->dev, &h->ev_copy[u]));
        FSDP_TRY(fsdp_device_event_create(&e->dev, &h->ev_gate[u]));
    }
    if (!fsdp_device_computes(&e->dev))
        return FSDP_STATUS_OK;
    /* on cpu, the rank threads keep the cores busy; GPU ranks mostly wait */
    int busy = sh->cfg.backend == FSDP_BACKEND_CPU ? sh->world->n_local : 0;
    return fsdp_pool_acquire(busy, &h->pool);
}

/* Wait for unit u's host step (if any) and record it in the trace. A
 * submission still queued on the copy stream is waited for first: then
 * h->jobs[u] is what it wrote. */
static fsdp_status job_finish(fsdp_engine *e, int u)
{
    host_ctx *h = ctx_of(e);
    if (h->gated[u]) {
        h->gated[u] = false;
        FSDP_TRY(fsdp_device_event_sync(&e->dev, h->ev_gate[u]));
    }
    if (!h->jobs[u])
        return FSDP_STATUS_OK;
    uint64_t t0, t1;
    fsdp_optim_job_wait(h->jobs[u], &t0, &t1);
    h->jobs[u] = NULL;
    const fsdp_shard_unit *su = &e->sh->sm.units[u];
    /* bytes moved: the gradient read, master and every state array read and written */
    size_t bytes = su->shard_numel * sizeof(float) * (1 + 2 * (1 + (size_t)e->sh->optim->n_state));
    fsdp_trace_span(&e->tr, FSDP_TRACE_OPTIM, e->sh->optim->name, su->spec->name, bytes, t0, t1);
    return FSDP_STATUS_OK;
}

static void host_fini(fsdp_engine *e)
{
    host_ctx *h = ctx_of(e);
    if (!h)
        return;
    /* queued submissions first (the engine synced the streams), then the jobs */
    if (h->jobs && h->gated)
        for (int u = 0; u < e->sh->sm.n_units; u++)
            if (job_finish(e, u) != FSDP_STATUS_OK)
                fsdp_error_clear(); /* reported by the step that queued it */
    for (int u = 0; u < e->sh->sm.n_units; u++) {
        if (h->ev_copy)
            fsdp_device_event_destroy(&e->dev, h->ev_copy[u]);
        if (h->ev_gate)
            fsdp_device_event_destroy(&e->dev, h->ev_gate[u]);
    }
    if (h->pool)
        fsdp_pool_release(h->pool);
    free(h->jobs);
    free(h->ev_copy);
    free(h->ev_gate);
    free(h->gated);
    free(h->param_host); /* the buffers themselves go with the device */
    free(h);
    e->place_ctx = NULL;
}

/* Whether the compute-dtype shard lives in host memory (no device copy). */
static bool params_on_host(const fsdp_engine *e)
{
    return fsdp_offload_trainable_params(&e->sh->cfg);
}

static fsdp_status host_unit_alloc(fsdp_engine *e, int u)
{
    const fsdp_shard_unit *su = &e->sh->sm.units[u];
    fsdp_shard_row *row = fsdp_engine_row(e, u);
    fsdp_dtype dt = e->sh->cfg.compute_dtype;
    size_t bytes = su->shard_numel * fsdp_dtype_size(dt);
    char label[96];
    if (dt != FSDP_DTYPE_F32) {
        snprintf(label, sizeof label, "host %s parameter %s", fsdp_dtype_name(dt),
                 params_on_host(e) ? "shard" : "staging");
        FSDP_TRY(fsdp_place_alloc(e, u, true, bytes, FSDP_MEM_PARAM, label,
                                  &ctx_of(e)->param_host[u]));
    }
    FSDP_TRY(fsdp_place_alloc_fp32(e, u, true));
    /* the gradient shard is the counter's buffer 0: a step of one
     * micro-step copies the reduced shard straight into it */
    fsdp_accum_adopt(&e->acc, u, row->grad);
    if (params_on_host(e)) {
        row->param = dt == FSDP_DTYPE_F32 ? (void *)row->master : ctx_of(e)->param_host[u];
        return FSDP_STATUS_OK;
    }
    snprintf(label, sizeof label, "%s parameter shard", fsdp_dtype_name(dt));
    return fsdp_place_alloc(e, u, false, bytes, FSDP_MEM_PARAM, label, &row->param);
}

/* Upload src (host, compute dtype) into unit u's device shard; waits. */
static fsdp_status upload(fsdp_engine *e, int u, const void *src, fsdp_stream_t s)
{
    const fsdp_shard_unit *su = &e->sh->sm.units[u];
    size_t bytes = su->shard_numel * fsdp_dtype_size(e->sh->cfg.compute_dtype);
    FSDP_TRY(fsdp_device_memcpy(&e->dev, fsdp_engine_row(e, u)->param, src, bytes, s));
    return fsdp_device_stream_sync(&e->dev, s);
}

static fsdp_status host_param_refresh(fsdp_engine *e, int u)
{
    fsdp_shard_row *row = fsdp_engine_row(e, u);
    fsdp_dtype dt = e->sh->cfg.compute_dtype;
    void *staging = ctx_of(e)->param_host[u];
    if (dt == FSDP_DTYPE_F32 && !params_on_host(e))
        return upload(e, u, row->master, e->dev.compute);
    /* cast on the host into the staging buffer, then upload. The master
     * was written by stream work (init, a checkpoint load) and the staging
     * buffer may still be read by an upload (the copy stream's, or with the
     * shard on the host a gather's on the comm stream): the streams first */
    FSDP_TRY(fsdp_device_stream_sync(&e->dev, e->dev.compute));
    FSDP_TRY(fsdp_device_stream_sync(&e->dev, e->dev.copy));
    if (params_on_host(e))
        FSDP_TRY(fsdp_device_stream_sync(&e->dev, e->dev.comm));
    if (dt == FSDP_DTYPE_F32) /* the shard is the master itself */
        return FSDP_STATUS_OK;
    FSDP_OP(&e->ops_host, cast, staging, dt, row->master, FSDP_DTYPE_F32,
            e->sh->sm.units[u].shard_numel);
    return params_on_host(e) ? FSDP_STATUS_OK : upload(e, u, staging, e->dev.compute);
}

/* Start unit u's host step of step count t (unless one is in flight). */
static fsdp_status submit(fsdp_engine *e, int u, uint64_t t, float lr, float scale)
{
    host_ctx *h = ctx_of(e);
    const fsdp_engine_shared *sh = e->sh;
    if (h->jobs[u] || !fsdp_device_computes(&e->dev) || !sh->sm.units[u].shard_numel)
        return FSDP_STATUS_OK;
    fsdp_optim_consts c;
    FSDP_TRY(sh->optim->consts(&sh->optim_hp, t, lr, scale, &c));
    fsdp_shard_row *row = fsdp_engine_row(e, u);
    fsdp_optim_range ranges[h->max_params];
    int n = fsdp_place_ranges(e, u, row->master, row->grad, row->optim, h->param_host[u],
                              ranges);
    return fsdp_optim_job_submit(h->pool, sh->optim, &sh->optim_hp, &c, ranges, n,
                                 FSDP_CPU_ISA_COUNT, &h->jobs[u]);
}

/* A submission queued on the copy stream: it runs once the unit's
 * gradient copy is done (on the stream's thread, or CUDA's callback
 * thread, or at once where streams run inline). */
struct gate_args {
    fsdp_engine *e;
    int u;
    uint64_t t;
    float lr;
};

static fsdp_status run_gate(void *p)
{
    const struct gate_args *a = p;
    return submit(a->e, a->u, a->t, a->lr, 1.0f);
}

/* The counter's fold (host work on the copy stream) and, unless it ended
 * in the gradient shard itself, a copy there; then the host step's
 * submission, queued after them. */
static fsdp_status host_unit_ready(fsdp_engine *e, int u)
{
    host_ctx *h = ctx_of(e);
    fsdp_shard_row *row = fsdp_engine_row(e, u);
    size_t n = e->sh->sm.units[u].shard_numel;
    float *sum = fsdp_accum_fold(&e->acc, u, n);
    if (sum != row->grad)
        FSDP_TRY(fsdp_device_memcpy(&e->dev, row->grad, sum, n * sizeof(float), e->dev.copy));
    if (!fsdp_engine_update_needs_norm(e)) {
        e->update_started = true;
        struct gate_args g = {e, u, e->t, e->lr};
        FSDP_TRY(fsdp_device_launch_host(&e->dev, e->dev.copy, run_gate, &g, sizeof g,
                                         "host optimizer step submission"));
        FSDP_TRY(fsdp_device_event_record(&e->dev, h->ev_gate[u], e->dev.copy));
        h->gated[u] = true;
    }
    return FSDP_STATUS_OK;
}

/* The host waits for u's host step (the CPU's work), then (unless the
 * shard lives on the host) uploads the updated shard on the copy stream; the gathers (comm) and,
 * unsharded, the compute stream wait for it through an event, not the host. The host source stays
 * untouched until then: u's next host step is submitted after u's next gradient copy, later on the
 * same copy stream (or, with clipping, after the norm has synced it). */
static fsdp_status host_params_ready(fsdp_engine *e, int u)
{
    host_ctx *h = ctx_of(e);
    bool updated = h->gated[u] || h->jobs[u];
    FSDP_TRY(job_finish(e, u));
    if (!updated || params_on_host(e)) /* on the host: the gather uploads it */
        return FSDP_STATUS_OK;
    fsdp_shard_row *row = fsdp_engine_row(e, u);
    const fsdp_shard_unit *su = &e->sh->sm.units[u];
    fsdp_dtype dt = e->sh->cfg.compute_dtype;
    const void *src = dt == FSDP_DTYPE_F32 ? (const void *)row->master : h->param_host[u];
    size_t bytes = su->shard_numel * fsdp_dtype_size(dt);
    fsdp_trace_begin(&e->tr, FSDP_TRACE_COPY, "param h2d", su->spec->name, bytes);
    FSDP_TRY(fsdp_device_memcpy(&e->dev, row->param, src, bytes, e->dev.copy));
    fsdp_trace_end(&e->tr, FSDP_TRACE_COPY);
    FSDP_TRY(fsdp_device_event_record(&e->dev, h->ev_copy[u], e->dev.copy));
    FSDP_TRY(fsdp_device_stream_wait_event(&e->dev, e->dev.comm, h->ev_copy[u]));
    return fsdp_device_stream_wait_event(&e->dev, e->dev.compute, h->ev_copy[u]);
}

/* The gradient shards are in host memory: sum them here, once every copy
 * (and every queued submission) is done. */
static fsdp_status host_grad_sumsq(fsdp_engine *e, float *out)
{
    FSDP_TRY(fsdp_device_stream_sync(&e->dev, e->dev.copy));
    fsdp_place_sumsq(e, &e->ops_host, out);
    return FSDP_STATUS_OK;
}

/* Start the host steps not started yet (all of them when clipping). The
 * norm synced the copy stream, so the queued submissions have run. */
static fsdp_status host_step(fsdp_engine *e, float lr, float scale)
{
    for (int u = 0; u < e->sh->sm.n_units; u++)
        FSDP_TRY(submit(e, u, e->t, lr, scale));
    return FSDP_STATUS_OK;
}

/* Stage the host master on the device (comm stream). */
static fsdp_status host_master_on_device(fsdp_engine *e, int u, float **out)
{
    size_t bytes = e->sh->sm.units[u].shard_numel * sizeof(float);
    FSDP_TRY(fsdp_device_alloc(&e->dev, bytes, FSDP_MEM_OTHER, "unit export shard",
                               (void **)out));
    fsdp_status st = fsdp_device_memcpy(&e->dev, *out, fsdp_engine_row(e, u)->master, bytes,
                                        e->dev.comm);
    if (st != FSDP_STATUS_OK) {
        fsdp_device_free(&e->dev, *out);
        *out = NULL;
    }
    return st;
}

const fsdp_place_i fsdp_place_host = {
    /* .name             = */ "host",
    /* .init             = */ host_init,
    /* .fini             = */ host_fini,
    /* .unit_alloc       = */ host_unit_alloc,
    /* .param_refresh    = */ host_param_refresh,
    /* .unit_ready       = */ host_unit_ready,
    /* .params_ready     = */ host_params_ready,
    /* .grad_sumsq       = */ host_grad_sumsq,
    /* .step             = */ host_step,
    /* .master_on_device = */ host_master_on_device,
    /* .host_grads       = */ true,
};
