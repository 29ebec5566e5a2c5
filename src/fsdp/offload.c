/*
 * offload.c - optimizer offload: fp32 master, Adam m and v and the final
 * gradient shard live in pinned host memory and are updated by the
 * vectorised CPU AdamW on the process's worker pool.
 *
 * Pipeline per step, per unit u (last micro-step):
 *   backward(u) -> reduce-scatter -> fold partial sums (device) -> copy the
 *   gradient shard device->host (copy stream) -> CPU AdamW of u (pool)
 *   -> before u is next gathered: copy the compute-dtype shard host->device.
 * Clipping stays exact: with --clip 0 nothing depends on the global norm, so
 * each unit's CPU update starts as soon as its gradient is on the host,
 * while backward continues on earlier units. With clipping, every update
 * needs the norm of the whole gradient, so the updates start right after
 * the norm is known, and overlap the next step's forward instead (unit u's
 * forward waits only for u's own update).
 */
#include <stdatomic.h>
#include <string.h>

#include "core/log.h"
#include "fsdp/engine_internal.h"
#include "optim/adamw_cpu.h"
#include "optim/pool.h"

struct update_range {
    size_t off, n;   /* in the shard */
    float wd;
    size_t chunk0;   /* first chunk index of this range */
};

struct fsdp_unit_update {
    fsdp_pool_job pj;
    fsdp_engine *e;
    int u;
    float lr, scale, bc1, bc2;
    int n_ranges;
    struct update_range r[64];
    size_t n_chunks;
    atomic_ullong t_start, t_end;
};

static void update_chunk(void *arg, size_t chunk)
{
    struct fsdp_unit_update *j = arg;
    fsdp_engine *e = j->e;
    const fsdp_engine_config *cfg = &e->sh->cfg;
    uint64_t t0 = fsdp_trace_now_ns();
    unsigned long long zero = 0;
    atomic_compare_exchange_strong(&j->t_start, &zero, (unsigned long long)t0);
    int k = 0;
    while (k + 1 < j->n_ranges && j->r[k + 1].chunk0 <= chunk)
        k++;
    const struct update_range *r = &j->r[k];
    size_t lo = r->off + (chunk - r->chunk0) * FSDP_ADAMW_CPU_CHUNK_NUMEL;
    size_t hi = lo + FSDP_ADAMW_CPU_CHUNK_NUMEL;
    if (hi > r->off + r->n)
        hi = r->off + r->n;
    fsdp_shard_row *row = &e->sh->sm.units[j->u].rows[e->rank];
    void *p_out = NULL;
    if (cfg->compute_dtype != FSDP_DTYPE_F32)
        p_out = (char *)e->param_host[j->u] + lo * fsdp_dtype_size(cfg->compute_dtype);
    fsdp_adamw_cpu(FSDP_CPU_ISA_COUNT, row->master + lo, row->grad + lo, row->adam_m + lo, row->adam_v + lo, hi - lo,
                   j->lr, cfg->beta1, cfg->beta2, cfg->eps, r->wd, j->bc1, j->bc2, j->scale, p_out,
                   cfg->compute_dtype);
    uint64_t t1 = fsdp_trace_now_ns();
    unsigned long long prev = atomic_load(&j->t_end);
    while (prev < t1 && !atomic_compare_exchange_weak(&j->t_end, &prev, (unsigned long long)t1))
        ;
}

static void add_range(fsdp_engine *e, int u, size_t off, size_t n, bool decay, void *arg)
{
    struct fsdp_unit_update *j = arg;
    FSDP_ASSERT(j->n_ranges < (int)(sizeof j->r / sizeof j->r[0]));
    j->r[j->n_ranges++] = (struct update_range){
        .off = off, .n = n, .wd = decay ? e->sh->cfg.weight_decay : 0.0f, .chunk0 = j->n_chunks};
    j->n_chunks += (n + FSDP_ADAMW_CPU_CHUNK_NUMEL - 1) / FSDP_ADAMW_CPU_CHUNK_NUMEL;
}

static fsdp_status submit(fsdp_engine *e, int u, float lr, float scale)
{
    if (e->jobs[u] || !fsdp_device_computes(&e->dev))
        return FSDP_STATUS_OK;
    struct fsdp_unit_update *j = calloc(1, sizeof *j);
    if (!j)
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory for a CPU optimizer job");
    j->e = e;
    j->u = u;
    j->lr = lr;
    j->scale = scale;
    fsdp_engine_adam_consts(e, &j->bc1, &j->bc2);
    fsdp_engine_for_each_range(e, u, add_range, j);
    e->jobs[u] = j;
    fsdp_pool_submit(e->pool, &j->pj, update_chunk, j, j->n_chunks);
    return FSDP_STATUS_OK;
}

fsdp_status fsdp_offload_init(fsdp_engine *e)
{
    const fsdp_engine_config *cfg = &e->sh->cfg;
    int U = e->sh->sm.n_units;
    e->param_host = calloc((size_t)U, sizeof *e->param_host);
    if (!e->param_host)
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory for offload staging");
    if (cfg->compute_dtype != FSDP_DTYPE_F32)
        for (int u = 0; u < U; u++) {
            fsdp_shard_unit *su = &e->sh->sm.units[u];
            char what[96];
            snprintf(what, sizeof what, "unit '%s' host %s parameter staging", su->spec->name,
                     fsdp_dtype_name(cfg->compute_dtype));
            FSDP_TRY(fsdp_device_host_alloc(&e->dev,
                                            su->shard_numel * fsdp_dtype_size(cfg->compute_dtype),
                                            FSDP_MEM_PARAM, what, &e->param_host[u]));
        }
    if (!fsdp_device_computes(&e->dev))
        return FSDP_STATUS_OK;
    /* on cpu, the rank threads keep the cores busy; GPU ranks mostly wait */
    int busy = cfg->backend == FSDP_BACKEND_CPU ? cfg->n_ranks : 0;
    return fsdp_pool_acquire(busy, &e->pool);
}

/* Wait for unit u's CPU update (if any) and record it in the trace. */
static void job_finish(fsdp_engine *e, int u)
{
    struct fsdp_unit_update *j = e->jobs[u];
    if (!j)
        return;
    fsdp_pool_wait(e->pool, &j->pj);
    fsdp_shard_unit *su = &e->sh->sm.units[u];
    fsdp_trace_span(e, FSDP_TRACE_OPTIM, "adamw", su->spec->name, su->shard_numel * 28,
                    (uint64_t)atomic_load(&j->t_start), (uint64_t)atomic_load(&j->t_end));
    free(j);
    e->jobs[u] = NULL;
}

void fsdp_offload_fini(fsdp_engine *e)
{
    if (e->jobs)
        for (int u = 0; u < e->sh->sm.n_units; u++)
            job_finish(e, u);
    if (e->pool)
        fsdp_pool_release(e->pool);
    e->pool = NULL;
    free(e->param_host); /* the buffers themselves go with the device */
    e->param_host = NULL;
}

fsdp_status fsdp_offload_unit_ready(fsdp_engine *e, int u)
{
    if (!e->sh->cfg.offload)
        return FSDP_STATUS_OK;
    fsdp_shard_unit *su = &e->sh->sm.units[u];
    fsdp_shard_row *row = &su->rows[e->rank];
    float *result = NULL;
    FSDP_TRY(fsdp_engine_grad_fold(e, u, &result));
    FSDP_TRY(fsdp_device_event_record(&e->dev, e->ev_tmp, e->dev.compute));
    FSDP_TRY(fsdp_device_stream_wait_event(&e->dev, e->dev.copy, e->ev_tmp));
    fsdp_trace_begin(e, FSDP_TRACE_COPY, "grad d2h", su->spec->name,
                     su->shard_numel * sizeof(float));
    FSDP_TRY(fsdp_device_memcpy(&e->dev, row->grad, result, su->shard_numel * sizeof(float),
                                e->dev.copy));
    FSDP_TRY(fsdp_device_event_record(&e->dev, e->ev_update[u], e->dev.copy));
    /* the device partial sums can go once the copy has read them */
    FSDP_TRY(fsdp_device_event_sync(&e->dev, e->ev_update[u]));
    fsdp_trace_end(e, FSDP_TRACE_COPY);
    struct fsdp_acc *acc = &e->acc[u];
    for (int k = 0; k < e->n_acc; k++) {
        fsdp_device_free(&e->dev, acc->buf[k]);
        acc->buf[k] = NULL;
    }
    if (e->sh->cfg.clip <= 0.0f)
        FSDP_TRY(submit(e, u, e->lr, 1.0f));
    return FSDP_STATUS_OK;
}

fsdp_status fsdp_offload_wait_grads(fsdp_engine *e)
{
    return fsdp_device_stream_sync(&e->dev, e->dev.copy);
}

fsdp_status fsdp_offload_step(fsdp_engine *e, float lr, float scale)
{
    for (int u = 0; u < e->sh->sm.n_units; u++)
        FSDP_TRY(submit(e, u, lr, scale));
    return FSDP_STATUS_OK;
}

fsdp_status fsdp_offload_params_ready(fsdp_engine *e, int u)
{
    if (!e->sh->cfg.offload || !e->jobs[u])
        return FSDP_STATUS_OK;
    const fsdp_engine_config *cfg = &e->sh->cfg;
    job_finish(e, u);
    fsdp_shard_unit *su = &e->sh->sm.units[u];
    fsdp_shard_row *row = &su->rows[e->rank];
    const void *src = cfg->compute_dtype == FSDP_DTYPE_F32 ? (const void *)row->master
                                                            : e->param_host[u];
    size_t bytes = su->shard_numel * fsdp_dtype_size(cfg->compute_dtype);
    fsdp_trace_begin(e, FSDP_TRACE_COPY, "param h2d", su->spec->name, bytes);
    FSDP_TRY(fsdp_device_memcpy(&e->dev, row->param, src, bytes, e->dev.copy));
    /* gathers (comm stream) read the shard; the host source is reused by the
     * next update, so the copy must be complete */
    FSDP_TRY(fsdp_device_event_record(&e->dev, e->ev_update[u], e->dev.copy));
    FSDP_TRY(fsdp_device_event_sync(&e->dev, e->ev_update[u]));
    fsdp_trace_end(e, FSDP_TRACE_COPY);
    return FSDP_STATUS_OK;
}
