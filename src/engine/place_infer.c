/*
 * place_infer.c - the placement of an inference engine (engine config
 * `inference`: fsdp eval, fsdp sample): each rank keeps its parameter shard
 * in the compute dtype, on the device, and nothing else. There is no
 * optimizer state, no gradient shard and no master copy, so a model is
 * evaluated in its parameters' bytes (plus gathers and activations), not
 * in the 16 bytes per parameter training needs (issue 15 item 16).
 *
 * Initialisation still passes through row->master, because the engine
 * writes each unit's initial fp32 values there: in fp32 it is the shard
 * itself; in bf16 it is a transient fp32 buffer, cast into the bf16 shard
 * and freed by param_refresh, so only one unit's fp32 shard ever exists.
 * The training slots are never called (fsdp_engine_step refuses an
 * inference engine); they fail loudly if they are.
 */
#include "engine/place.h"

static fsdp_status inf_init(fsdp_engine *e)
{
    (void)e;
    return FSDP_STATUS_OK;
}

static void inf_fini(fsdp_engine *e) { (void)e; }

static fsdp_status inf_param_refresh(fsdp_engine *e, int u);

static fsdp_status inf_unit_alloc(fsdp_engine *e, int u)
{
    const fsdp_shard_unit *su = &e->sh->sm.units[u];
    fsdp_shard_row *row = fsdp_engine_row(e, u);
    fsdp_dtype dt = e->sh->cfg.compute_dtype;
    size_t f32 = su->shard_numel * sizeof(float);
    if (dt == FSDP_DTYPE_F32) {
        FSDP_TRY(fsdp_place_alloc(e, u, false, f32, FSDP_MEM_PARAM, "fp32 parameter shard",
                                  (void **)&row->master));
        row->param = row->master;
        return FSDP_STATUS_OK;
    }
    char label[64];
    snprintf(label, sizeof label, "%s parameter shard", fsdp_dtype_name(dt));
    FSDP_TRY(fsdp_place_alloc(e, u, false, su->shard_numel * fsdp_dtype_size(dt), FSDP_MEM_PARAM,
                              label, &row->param));
    FSDP_TRY(fsdp_place_alloc(e, u, false, f32, FSDP_MEM_PARAM, "fp32 parameters while loading",
                              (void **)&row->master));
    /* meta: the engine writes no values and refreshes nothing; drop the
     * transient here, as a computing run does after loading */
    return fsdp_device_computes(&e->dev) ? FSDP_STATUS_OK : inf_param_refresh(e, u);
}

/* After the engine wrote the fp32 values: the compute shard, and the
 * transient fp32 copy gone. */
static fsdp_status inf_param_refresh(fsdp_engine *e, int u)
{
    fsdp_shard_row *row = fsdp_engine_row(e, u);
    if (row->param != row->master && row->master) {
        FSDP_OP(&e->ops, cast, row->param, e->sh->cfg.compute_dtype, row->master,
                FSDP_DTYPE_F32, e->sh->sm.units[u].shard_numel);
        FSDP_TRY(fsdp_device_stream_sync(&e->dev, e->dev.compute));
        fsdp_device_free(&e->dev, row->master);
        row->master = NULL;
    }
    return fsdp_device_stream_sync(&e->dev, e->dev.compute);
}

static fsdp_status inf_params_ready(fsdp_engine *e, int u)
{
    (void)e, (void)u; /* parameters never change */
    return FSDP_STATUS_OK;
}

static fsdp_status no_training(fsdp_engine *e)
{
    return fsdp_error_set(FSDP_STATUS_INTERNAL, "rank %d: an inference engine holds no "
                          "gradients or optimizer state", e->rank);
}

static fsdp_status inf_unit_ready(fsdp_engine *e, int u)
{
    (void)u;
    return no_training(e);
}

static fsdp_status inf_grad_sumsq(fsdp_engine *e, float *out)
{
    (void)out;
    return no_training(e);
}

static fsdp_status inf_step(fsdp_engine *e, float lr, float scale)
{
    (void)lr, (void)scale;
    return no_training(e);
}

/* The fp32 shard: the parameters themselves in fp32; in bf16 there is none. */
static fsdp_status inf_master_on_device(fsdp_engine *e, int u, float **out)
{
    fsdp_shard_row *row = fsdp_engine_row(e, u);
    if (!row->master)
        return fsdp_error_set(FSDP_STATUS_UNSUPPORTED, "rank %d: a %s inference engine keeps no "
                              "fp32 parameters of unit '%s'", e->rank,
                              fsdp_dtype_name(e->sh->cfg.compute_dtype),
                              e->sh->sm.units[u].spec->name);
    *out = row->master;
    return FSDP_STATUS_OK;
}

const fsdp_place_i fsdp_place_infer = {
    /* .name             = */ "inference",
    /* .init             = */ inf_init,
    /* .fini             = */ inf_fini,
    /* .unit_alloc       = */ inf_unit_alloc,
    /* .param_refresh    = */ inf_param_refresh,
    /* .unit_ready       = */ inf_unit_ready,
    /* .params_ready     = */ inf_params_ready,
    /* .grad_sumsq       = */ inf_grad_sumsq,
    /* .step             = */ inf_step,
    /* .master_on_device = */ inf_master_on_device,
    /* .host_grads       = */ false,
};
