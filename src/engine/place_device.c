/*
 * place_device.c - optimizer state in device memory: the fp32 master, the
 * optimizer's state arrays and the step's gradient shard are device
 * allocations; the compute-dtype shard is the master itself in fp32, or a
 * device copy. The optimizer's device step runs on the compute stream once
 * the global norm (and so the clip scale) is known; the next step's gathers
 * on the comm stream wait for it through an event.
 *
 * The gradient shard doubles as accumulation buffer 0, so a step of one
 * micro-step reduces straight into it and never copies.
 */
#include <string.h>

#include "engine/place.h"

static fsdp_status dev_init(fsdp_engine *e)
{
    (void)e;
    return FSDP_STATUS_OK;
}

static void dev_fini(fsdp_engine *e) { (void)e; }

static fsdp_status dev_unit_alloc(fsdp_engine *e, int u)
{
    const fsdp_shard_unit *su = &e->sh->sm.units[u];
    fsdp_shard_row *row = fsdp_engine_row(e, u);
    FSDP_TRY(fsdp_place_alloc_fp32(e, u, false));
    fsdp_dtype dt = e->sh->cfg.compute_dtype;
    if (dt == FSDP_DTYPE_F32) {
        row->param = row->master;
    } else {
        char label[96];
        snprintf(label, sizeof label, "%s parameter shard", fsdp_dtype_name(dt));
        FSDP_TRY(fsdp_place_alloc(e, u, false, su->shard_numel * fsdp_dtype_size(dt),
                                  FSDP_MEM_PARAM, label, &row->param));
    }
    fsdp_accum_adopt(&e->acc, u, row->grad);
    return FSDP_STATUS_OK;
}

static fsdp_status dev_param_refresh(fsdp_engine *e, int u)
{
    fsdp_shard_row *row = fsdp_engine_row(e, u);
    if (row->param != row->master)
        FSDP_OP(&e->ops, cast, row->param, e->sh->cfg.compute_dtype, row->master, FSDP_DTYPE_F32,
                e->sh->sm.units[u].shard_numel);
    return fsdp_device_stream_sync(&e->dev, e->dev.compute);
}

/* Fold the micro-step sums on the comm stream, after the last reduce-
 * scatter (accum.h); copy there too unless the counter ended in the
 * gradient shard itself. Nothing waits here: the norm orders the compute
 * stream after the comm stream once, after the whole backward. */
static fsdp_status dev_unit_ready(fsdp_engine *e, int u)
{
    fsdp_shard_row *row = fsdp_engine_row(e, u);
    size_t n = e->sh->sm.units[u].shard_numel;
    float *sum = fsdp_accum_fold(&e->acc, u, n);
    if (sum != row->grad)
        FSDP_TRY(fsdp_device_memcpy(&e->dev, row->grad, sum, n * sizeof(float), e->dev.comm));
    return FSDP_STATUS_OK;
}

static fsdp_status dev_params_ready(fsdp_engine *e, int u)
{
    (void)e, (void)u; /* the step's stream order covers it */
    return FSDP_STATUS_OK;
}

static fsdp_status dev_grad_sumsq(fsdp_engine *e, float *out)
{
    /* the gradient shards are final on the comm stream (unit_ready) */
    FSDP_TRY(fsdp_engine_order(e, e->dev.comm, e->dev.compute, e->ev_tmp));
    size_t off = fsdp_place_sumsq(e, &e->ops, e->dev_blocks);
    FSDP_TRY(fsdp_device_memcpy(&e->dev, out, e->dev_blocks, off * sizeof(float),
                                e->dev.compute));
    return fsdp_device_stream_sync(&e->dev, e->dev.compute);
}

static fsdp_status dev_step(fsdp_engine *e, float lr, float scale)
{
    const fsdp_engine_shared *sh = e->sh;
    fsdp_optim_consts c;
    FSDP_TRY(sh->optim->consts(&sh->optim_hp, e->t, lr, scale, &c));
    for (int u = 0; u < sh->sm.n_units; u++) {
        fsdp_shard_row *row = fsdp_engine_row(e, u);
        int n_params = sh->sm.units[u].spec->n_params;
        fsdp_optim_range ranges[n_params > 0 ? n_params : 1];
        int n = fsdp_place_ranges(e, u, row->master, row->grad, row->optim,
                                  row->param != row->master ? row->param : NULL, ranges);
        for (int i = 0; i < n; i++)
            sh->optim->device_step(&e->ops, &sh->optim_hp, &c, &ranges[i]);
    }
    /* the next step's gathers read the updated shards */
    return fsdp_engine_order(e, e->dev.compute, e->dev.comm, e->ev_tmp2);
}

static fsdp_status dev_master_on_device(fsdp_engine *e, int u, float **out)
{
    *out = fsdp_engine_row(e, u)->master;
    return FSDP_STATUS_OK;
}

const fsdp_place_i fsdp_place_device = {
    /* .name             = */ "device",
    /* .init             = */ dev_init,
    /* .fini             = */ dev_fini,
    /* .unit_alloc       = */ dev_unit_alloc,
    /* .param_refresh    = */ dev_param_refresh,
    /* .unit_ready       = */ dev_unit_ready,
    /* .params_ready     = */ dev_params_ready,
    /* .grad_sumsq       = */ dev_grad_sumsq,
    /* .step             = */ dev_step,
    /* .master_on_device = */ dev_master_on_device,
    /* .host_grads       = */ false,
};
