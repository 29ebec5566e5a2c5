/*
 * place.c - what both placements share: choosing one from the
 * configuration, and cutting a unit's shard into the optimizer's ranges.
 */
#include "fsdp/place.h"

const fsdp_place_i *fsdp_place_of(const fsdp_engine_config *cfg)
{
    if (cfg->inference)
        return &fsdp_place_infer;
    return cfg->offload ? &fsdp_place_host : &fsdp_place_device;
}

int fsdp_place_ranges(const fsdp_engine *e, int u, float *master, const float *grad,
                      float *const *state, void *p_out, fsdp_optim_range *ranges)
{
    const fsdp_engine_shared *sh = e->sh;
    const fsdp_shard_unit *su = &sh->sm.units[u];
    size_t lo = fsdp_shardmap_offset(&sh->sm, u, e->rank), hi = lo + su->shard_numel;
    size_t dt = fsdp_dtype_size(sh->cfg.compute_dtype);
    int n = 0;
    for (int i = 0; i < su->spec->n_params; i++) {
        const fsdp_param_spec *p = &su->spec->params[i];
        size_t a = p->offset > lo ? p->offset : lo;
        size_t b = p->offset + p->numel < hi ? p->offset + p->numel : hi;
        if (a >= b)
            continue;
        size_t off = a - lo;
        fsdp_optim_range *r = &ranges[n++];
        *r = (fsdp_optim_range){.p = master + off, .grad = grad + off, .n = b - a,
                                .wd = p->decay ? sh->optim_hp.weight_decay : 0.0f,
                                .out_dt = sh->cfg.compute_dtype};
        for (int k = 0; k < sh->optim->n_state; k++)
            r->state[k] = state[k] + off;
        if (p_out)
            r->p_out = (char *)p_out + off * dt;
    }
    return n;
}
