/*
 * shardmap.h - how each FSDP unit's flat parameters are split over ranks,
 * and each rank's live buffers for it. One map per world, shared by all
 * rank threads.
 *
 * A unit's parameters are laid out back to back in one flat buffer of
 * `numel` elements, padded with zeros to `padded_numel`, a multiple of
 * shard_ranks * FSDP_NORM_BLOCK so every shard is a whole number of norm
 * blocks, and split over shard_ranks ranks: rank r owns [k * shard_numel,
 * (k+1) * shard_numel) with k = r % shard_ranks.
 *   FULL_SHARD, SHARD_GRAD_OP  shard_ranks = n_ranks: every rank its own shard
 *   HYBRID                     shard_ranks = ranks per node (n_ranks / n_nodes):
 *                              sharded within a node, the node's shards
 *                              replicated on every node (HSDP, ZeRO++ hpZ)
 *   NO_SHARD                   shard_ranks = 1: every rank the whole buffer
 *
 * The static part (sizes, offsets) is written once by fsdp_shardmap_init
 * before the ranks start. Row r of each unit is written only by rank r;
 * other threads read it only after a barrier or collective.
 */
#ifndef FSDP_ENGINE_SHARDMAP_H
#define FSDP_ENGINE_SHARDMAP_H

#include "core/names.h"
#include "models/model.h"
#include "optim/optim.h"

typedef enum fsdp_shard_strategy {
    FSDP_SHARD_FULL = 0,   /* FULL_SHARD / ZeRO-3: params, grads, optimizer sharded */
    FSDP_SHARD_GRAD_OP,    /* SHARD_GRAD_OP / ZeRO-2: params stay gathered fwd -> bwd */
    FSDP_SHARD_NONE,       /* NO_SHARD / DDP: everything replicated, grads all-reduced */
    FSDP_SHARD_HYBRID,     /* HYBRID_SHARD: FULL_SHARD within a node, replicated across nodes;
                            * grads reduce-scattered in the node, all-reduced across nodes */
    FSDP_SHARD_COUNT
} fsdp_shard_strategy;

/* The strategies by name, with one help line each (--shard; manifests). */
extern const fsdp_name_table fsdp_shard_names;

/* "full", "grad-op", "none", "hybrid"; "?" for a value out of range. */
const char *fsdp_shard_strategy_name(fsdp_shard_strategy s);
/* Parse a name of fsdp_shard_names: INVALID_ARG "unknown sharding strategy
 * 's' (expected full, grad-op, none or hybrid)" otherwise. */
fsdp_status fsdp_shard_strategy_parse(const char *s, fsdp_shard_strategy *out);

typedef enum fsdp_unit_state {
    FSDP_UNIT_SHARDED = 0, /* only the shard is resident */
    FSDP_UNIT_GATHERING,   /* all-gather issued, not yet waited for */
    FSDP_UNIT_GATHERED,    /* full parameters resident */
} fsdp_unit_state;

/* One rank's live state for one unit. */
typedef struct fsdp_shard_row {
    void *param;           /* compute-dtype shard (shard_numel); = master when fp32 */
    float *master;         /* fp32 master shard: device, or pinned host with offload */
    float *grad;           /* fp32 gradient shard (final for the step) */
    float *optim[FSDP_OPTIM_MAX_STATE]; /* the optimizer's state arrays, in its order
                                         * (shard_numel each; same memory as master) */
    void *gathered;        /* (padded_numel,) compute dtype, or NULL */
    float *grad_full;      /* (padded_numel,) fp32 unit gradient in backward, or NULL */
    fsdp_unit_state state;
} fsdp_shard_row;

typedef struct fsdp_shard_unit {
    const fsdp_unit_spec *spec;
    size_t numel;          /* unpadded */
    size_t padded_numel;
    size_t shard_numel;    /* per rank */
    size_t n_blocks;       /* norm blocks holding real elements: ceil(numel / BLOCK) */
    fsdp_shard_row *rows;  /* [n_ranks] */
} fsdp_shard_unit;

typedef struct fsdp_shardmap {
    int n_ranks;
    int n_nodes;           /* nodes of n_ranks / n_nodes ranks each (1: one node) */
    int shard_ranks;       /* ranks one unit is split over (see the top of this file) */
    int n_units;
    fsdp_shard_strategy strategy;
    fsdp_shard_unit *units;
    size_t numel;          /* all units, unpadded */
    size_t padded_numel;   /* all units, padded */
} fsdp_shardmap;

/* The map of model m over n_ranks ranks on one node. */
fsdp_status fsdp_shardmap_init(fsdp_shardmap *sm, const fsdp_model *m, int n_ranks,
                               fsdp_shard_strategy strategy);
/* The same on n_nodes nodes (n_ranks a multiple of it); only hybrid
 * sharding depends on them. */
fsdp_status fsdp_shardmap_init_nodes(fsdp_shardmap *sm, const fsdp_model *m, int n_ranks,
                                     int n_nodes, fsdp_shard_strategy strategy);
void fsdp_shardmap_free(fsdp_shardmap *sm);

/* First element (in the unit's flat buffer) of rank r's shard. */
static inline size_t fsdp_shardmap_offset(const fsdp_shardmap *sm, int unit, int rank)
{
    return (size_t)(rank % sm->shard_ranks) * sm->units[unit].shard_numel;
}

/* Find the unit and element offset of a parameter by name (NULL if none). */
const fsdp_param_spec *fsdp_shardmap_find(const fsdp_shardmap *sm, const char *name, int *unit);

#endif /* FSDP_ENGINE_SHARDMAP_H */
