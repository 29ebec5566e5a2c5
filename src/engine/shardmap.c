/*
 * shardmap.c - the sharding strategies' names, and building the shard map
 * from a model's units.
 */
#include <string.h>

#include "engine/shardmap.h"

static const fsdp_name shard_names[] = {
    {"full", FSDP_SHARD_FULL,
     "parameters, gradients and optimizer state sharded; units gathered just in time "
     "(FULL_SHARD, ZeRO-3)"},
    {"grad-op", FSDP_SHARD_GRAD_OP,
     "as full, but gathered parameters stay from forward to backward (SHARD_GRAD_OP, ZeRO-2)"},
    {"none", FSDP_SHARD_NONE, "everything replicated, gradients all-reduced (NO_SHARD, DDP)"},
    {"hybrid", FSDP_SHARD_HYBRID,
     "as full within each node, replicated across nodes: gradients reduce-scattered in the "
     "node, then all-reduced across nodes (HYBRID_SHARD, HSDP); the same as full on one node"},
};
const fsdp_name_table fsdp_shard_names = FSDP_NAME_TABLE(shard_names);

const char *fsdp_shard_strategy_name(fsdp_shard_strategy s)
{
    return fsdp_names_name(&fsdp_shard_names, (int)s);
}

fsdp_status fsdp_shard_strategy_parse(const char *s, fsdp_shard_strategy *out)
{
    const fsdp_name *n = fsdp_names_find(&fsdp_shard_names, s);
    if (n) {
        *out = (fsdp_shard_strategy)n->value;
        return FSDP_STATUS_OK;
    }
    char names[128];
    return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "unknown sharding strategy '%s' (expected %s)",
                          s ? s : "", fsdp_names_join(&fsdp_shard_names, 0, ", ", " or ", names,
                                                      sizeof names));
}

fsdp_status fsdp_shardmap_init(fsdp_shardmap *sm, const fsdp_model *m, int n_ranks,
                               fsdp_shard_strategy strategy)
{
    return fsdp_shardmap_init_nodes(sm, m, n_ranks, 1, strategy);
}

fsdp_status fsdp_shardmap_init_nodes(fsdp_shardmap *sm, const fsdp_model *m, int n_ranks,
                                     int n_nodes, fsdp_shard_strategy strategy)
{
    memset(sm, 0, sizeof *sm);
    if (n_ranks < 1)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "need at least one rank");
    if (n_nodes < 1 || n_ranks % n_nodes)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "%d rank(s) do not split over %d node(s): give every node the same "
                              "number of devices", n_ranks, n_nodes);
    if ((unsigned)strategy >= FSDP_SHARD_COUNT)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "unknown sharding strategy %d",
                              (int)strategy);
    sm->n_ranks = n_ranks;
    sm->n_nodes = n_nodes;
    sm->shard_ranks = strategy == FSDP_SHARD_NONE     ? 1
                      : strategy == FSDP_SHARD_HYBRID ? n_ranks / n_nodes
                                                      : n_ranks;
    sm->n_units = m->n_units;
    sm->strategy = strategy;
    sm->units = calloc((size_t)m->n_units, sizeof *sm->units);
    if (!sm->units)
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory for the shard map");
    size_t align = FSDP_NORM_BLOCK * (size_t)sm->shard_ranks;
    for (int u = 0; u < m->n_units; u++) {
        fsdp_shard_unit *su = &sm->units[u];
        su->spec = &m->units[u];
        su->numel = m->units[u].train_numel;
        su->padded_numel = (su->numel + align - 1) / align * align;
        su->shard_numel = su->padded_numel / (size_t)sm->shard_ranks;
        su->frozen_numel = m->units[u].nf4_begin - m->units[u].train_numel;
        su->frozen_padded = (su->frozen_numel + align - 1) / align * align;
        su->frozen_shard = su->frozen_padded / (size_t)sm->shard_ranks;
        su->nf4_numel = m->units[u].numel - m->units[u].nf4_begin; /* align: whole NF4 blocks */
        su->nf4_padded = (su->nf4_numel + align - 1) / align * align;
        su->nf4_shard = su->nf4_padded / (size_t)sm->shard_ranks;
        su->n_blocks = (su->numel + FSDP_NORM_BLOCK - 1) / FSDP_NORM_BLOCK;
        su->rows = calloc((size_t)n_ranks, sizeof *su->rows);
        if (!su->rows) {
            fsdp_shardmap_free(sm);
            return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory for the shard map");
        }
        sm->numel += su->numel;
        sm->padded_numel += su->padded_numel;
        sm->frozen_numel += su->frozen_numel;
        sm->nf4_numel += su->nf4_numel;
    }
    return FSDP_STATUS_OK;
}

void fsdp_shardmap_free(fsdp_shardmap *sm)
{
    if (sm->units)
        for (int u = 0; u < sm->n_units; u++)
            free(sm->units[u].rows);
    free(sm->units);
    memset(sm, 0, sizeof *sm);
}

const fsdp_param_spec *fsdp_shardmap_find(const fsdp_shardmap *sm, const char *name, int *unit)
{
    for (int u = 0; u < sm->n_units; u++)
        for (int i = 0; i < sm->units[u].spec->n_params; i++)
            if (!strcmp(sm->units[u].spec->params[i].name, name)) {
                if (unit)
                    *unit = u;
                return &sm->units[u].spec->params[i];
            }
    return NULL;
}
