/*
 * place.c - what the placements share: choosing one from the
 * configuration, allocating a unit's shards, and cutting a unit's shard
 * into the optimizer's ranges.
 */
#include <stdio.h>

#include "engine/place.h"

const fsdp_place_i *fsdp_place_of(const fsdp_engine_config *cfg)
{
    if (cfg->inference)
        return &fsdp_place_infer;
    return cfg->offload ? &fsdp_place_host : &fsdp_place_device;
}

fsdp_status fsdp_place_alloc(fsdp_engine *e, int u, bool host, size_t bytes, fsdp_mem_kind kind,
                             const char *label, void **out)
{
    if (bytes == 0) { /* a segment with nothing in it (a unit that trains nothing) */
        *out = NULL;
        return FSDP_STATUS_OK;
    }
    char what[128];
    snprintf(what, sizeof what, "unit '%s' %s", e->sh->sm.units[u].spec->name, label);
    return host ? fsdp_device_host_alloc(&e->dev, bytes, kind, what, out)
                : fsdp_device_alloc(&e->dev, bytes, kind, what, out);
}

fsdp_status fsdp_place_alloc_fp32(fsdp_engine *e, int u, bool host)
{
    const fsdp_optim *o = e->sh->optim;
    fsdp_shard_row *row = fsdp_engine_row(e, u);
    size_t f32 = e->sh->sm.units[u].shard_numel * sizeof(float);
    FSDP_TRY(fsdp_place_alloc(e, u, host, f32, FSDP_MEM_PARAM, "master parameter shard",
                              (void **)&row->master));
    for (int k = 0; k < o->n_state; k++) {
        char label[96];
        snprintf(label, sizeof label, "%s state %s", o->name, o->state_names[k]);
        FSDP_TRY(fsdp_place_alloc(e, u, host, f32, FSDP_MEM_OPTIM, label, (void **)&row->optim[k]));
    }
    return fsdp_place_alloc(e, u, host, f32, FSDP_MEM_GRAD, "gradient shard",
                            (void **)&row->grad);
}

int fsdp_place_ranges(const fsdp_engine *e, int u, float *master, const float *grad,
                      float *const *state, void *p_out, fsdp_optim_range *ranges)
{
    const fsdp_engine_shared *sh = e->sh;
    const fsdp_shard_unit *su = &sh->sm.units[u];
    int slot = fsdp_shardmap_slot(&sh->sm, e->rank);
    size_t dt = fsdp_dtype_size(sh->cfg.compute_dtype);
    int n = 0;
    for (int i = 0; i < su->seg_first[FSDP_SEG_TRAIN + 1]; i++) {
        const fsdp_shard_param *sp = &su->params[i];
        size_t at, len = fsdp_shard_param_run(sp, slot, &at), off = sp->shard_off;
        if (!len)
            continue;
        fsdp_optim_range *r = &ranges[n++];
        *r = (fsdp_optim_range){.p = master + off, .grad = grad + off, .n = len,
                                .wd = sp->spec->decay ? sh->optim_hp.weight_decay : 0.0f,
                                .out_dt = sh->cfg.compute_dtype};
        for (int k = 0; k < sh->optim->n_state; k++)
            r->state[k] = state[k] + off;
        if (p_out)
            r->p_out = (char *)p_out + off * dt;
    }
    return n;
}

size_t fsdp_place_sumsq(fsdp_engine *e, fsdp_op_ctx *ctx, float *out)
{
    const fsdp_shardmap *sm = &e->sh->sm;
    size_t off = 0;
    for (int u = 0; u < sm->n_units; u++) {
        const fsdp_shard_unit *su = &sm->units[u];
        const float *grad = fsdp_engine_row(e, u)->grad;
        for (int i = 0; i < su->seg_first[FSDP_SEG_TRAIN + 1]; i++) {
            const fsdp_shard_param *sp = &su->params[i];
            FSDP_OP(ctx, sumsq_blocks, out + off + sp->block_off, grad + sp->shard_off,
                    fsdp_shard_param_span(sp));
        }
        off += su->n_blocks;
    }
    return off;
}
