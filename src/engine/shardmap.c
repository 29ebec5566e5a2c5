/*
 * shardmap.c - the sharding strategies' names, and building the shard map
 * from a model's units.
 */
#include <stdlib.h>
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

static size_t gcd_sz(size_t a, size_t b)
{
    while (b) {
        size_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

static int by_offset(const void *a, const void *b)
{
    const fsdp_shard_param *x = a, *y = b;
    return (x->spec->offset > y->spec->offset) - (x->spec->offset < y->spec->offset);
}

/* Unit `spec`'s parameters in flat order, each split on dim 0 over k ranks
 * (shardmap.h), and its segments' shard sizes: a segment's shard is its
 * parameters' spans back to back, padded to whole norm blocks. */
static fsdp_status layout_unit(fsdp_shard_unit *su, const fsdp_unit_spec *spec, int k)
{
    su->spec = spec;
    su->n_params = spec->n_params;
    su->params = calloc((size_t)spec->n_params + 1, sizeof *su->params);
    if (!su->params)
        return FSDP_STATUS_OOM;
    for (int i = 0; i < spec->n_params; i++)
        su->params[i].spec = &spec->params[i];
    qsort(su->params, (size_t)spec->n_params, sizeof *su->params, by_offset);
    size_t seg_numel[FSDP_SEG_COUNT] = {0}, seg_shard[FSDP_SEG_COUNT] = {0};
    int seg = 0;
    for (int i = 0; i < spec->n_params; i++) {
        fsdp_shard_param *sp = &su->params[i];
        const fsdp_param_spec *p = sp->spec;
        fsdp_shard_seg s = p->offset < spec->train_numel ? FSDP_SEG_TRAIN
                           : p->offset < spec->nf4_begin ? FSDP_SEG_FROZEN
                                                         : FSDP_SEG_NF4;
        while (seg <= (int)s)
            su->seg_first[seg++] = i;
        sp->seg = s;
        sp->rows = p->ndim > 0 && p->shape[0] > 0 ? (size_t)p->shape[0] : 1;
        sp->row_numel = p->numel / sp->rows;
        sp->shard_rows = (sp->rows + (size_t)k - 1) / (size_t)k;
        if (k > 1) { /* a slot's span is whole norm blocks (NF4 blocks divide them) */
            size_t step = FSDP_NORM_BLOCK / gcd_sz(FSDP_NORM_BLOCK, sp->row_numel);
            sp->shard_rows = (sp->shard_rows + step - 1) / step * step;
            if (sp->shard_rows * sp->row_numel > p->numel) /* padding over its size: whole */
                sp->shard_rows = sp->rows;
        }
        sp->shard_off = seg_shard[s];
        seg_shard[s] += fsdp_shard_param_span(sp);
        if (s == FSDP_SEG_TRAIN) {
            sp->block_off = su->n_blocks;
            su->n_blocks += fsdp_shard_param_blocks(sp);
        }
        seg_numel[s] += p->numel;
    }
    while (seg <= FSDP_SEG_COUNT)
        su->seg_first[seg++] = spec->n_params;
    for (int s = 0; s < FSDP_SEG_COUNT && k == 1; s++) /* the shard is the padded segment */
        seg_shard[s] = (seg_shard[s] + FSDP_NORM_BLOCK - 1) / FSDP_NORM_BLOCK * FSDP_NORM_BLOCK;
    su->numel = seg_numel[FSDP_SEG_TRAIN];
    su->shard_numel = seg_shard[FSDP_SEG_TRAIN];
    su->padded_numel = su->shard_numel * (size_t)k;
    su->frozen_numel = seg_numel[FSDP_SEG_FROZEN];
    su->frozen_shard = seg_shard[FSDP_SEG_FROZEN];
    su->frozen_padded = su->frozen_shard * (size_t)k;
    su->nf4_numel = seg_numel[FSDP_SEG_NF4];
    su->nf4_shard = seg_shard[FSDP_SEG_NF4];
    su->nf4_padded = su->nf4_shard * (size_t)k;
    return FSDP_STATUS_OK;
}

/* Unit su's groups (fsdp_shard_group) over k shard ranks, and its extents. */
static fsdp_status group_unit(fsdp_shard_unit *su, int k, size_t direct_numel)
{
    free(su->groups);
    su->groups = calloc((size_t)su->n_params + 1, sizeof *su->groups);
    if (!su->groups)
        return FSDP_STATUS_OOM;
    int n = 0;
    su->extent = k > 1             ? su->spec->numel
                 : su->nf4_numel    ? su->spec->nf4_begin + su->nf4_padded
                 : su->frozen_numel ? su->numel + su->frozen_padded
                                    : su->padded_numel;
    su->train_extent = k > 1 ? su->numel : su->padded_numel;
    for (int s = 0; s <= FSDP_SEG_COUNT; s++) {
        su->group_first[s] = n;
        if (s >= FSDP_SEG_NF4 || k == 1) /* NF4 moves packed, dequantized per run */
            continue;
        bool open = false;
        for (int i = su->seg_first[s]; i < su->seg_first[s + 1]; i++) {
            const fsdp_shard_param *sp = &su->params[i];
            size_t span = fsdp_shard_param_span(sp);
            bool direct = span * (size_t)k >= direct_numel;
            if (direct || !open)
                su->groups[n++] = (fsdp_shard_group){.first = i, .end = i, .direct = direct,
                                                     .shard_off = sp->shard_off};
            su->groups[n - 1].end = i + 1;
            su->groups[n - 1].span += span;
            open = !direct;
            size_t end = sp->spec->offset + span * (size_t)k; /* the all-gather's reach */
            if (direct && end > su->extent)
                su->extent = end;
            if (direct && s == FSDP_SEG_TRAIN && end > su->train_extent)
                su->train_extent = end;
        }
    }
    return FSDP_STATUS_OK;
}

fsdp_status fsdp_shardmap_regroup(fsdp_shardmap *sm, size_t direct_numel)
{
    sm->direct_numel = direct_numel;
    for (int u = 0; u < sm->n_units; u++)
        if (group_unit(&sm->units[u], sm->shard_ranks, direct_numel) != FSDP_STATUS_OK)
            return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory for the shard map");
    return FSDP_STATUS_OK;
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
    for (int u = 0; u < m->n_units; u++) {
        fsdp_shard_unit *su = &sm->units[u];
        su->rows = calloc((size_t)n_ranks, sizeof *su->rows);
        if (!su->rows || layout_unit(su, &m->units[u], sm->shard_ranks) != FSDP_STATUS_OK) {
            fsdp_shardmap_free(sm);
            return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory for the shard map");
        }
        sm->numel += su->numel;
        sm->padded_numel += su->padded_numel;
        sm->frozen_numel += su->frozen_numel;
        sm->nf4_numel += su->nf4_numel;
    }
    fsdp_status st = fsdp_shardmap_regroup(sm, FSDP_SHARD_DIRECT_NUMEL);
    if (st != FSDP_STATUS_OK)
        fsdp_shardmap_free(sm);
    return st;
}

void fsdp_shardmap_free(fsdp_shardmap *sm)
{
    if (sm->units)
        for (int u = 0; u < sm->n_units; u++) {
            free(sm->units[u].rows);
            free(sm->units[u].params);
            free(sm->units[u].groups);
        }
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
