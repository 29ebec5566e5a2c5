/*
 * shardmap.h - how each FSDP unit's flat parameters are split over ranks,
 * and each rank's live buffers for it. One map per world, shared by all
 * rank threads.
 *
 * A unit's parameters are laid out back to back in one flat buffer of
 * `numel` elements, padded with zeros to `padded_numel`, a multiple of
 * n_ranks * FSDP_NORM_BLOCK (FULL_SHARD, SHARD_GRAD_OP) so every shard is a
 * whole number of norm blocks. Rank r owns [r * shard_numel, (r+1) *
 * shard_numel). With NO_SHARD every rank holds the whole padded buffer
 * (padded to a multiple of FSDP_NORM_BLOCK, shard_numel = padded_numel).
 *
 * The static part (sizes, offsets) is written once by fsdp_shardmap_init
 * before the ranks start. Row r of each unit is written only by rank r;
 * other threads read it only after a barrier or collective.
 */
#ifndef FSDP_FSDP_SHARDMAP_H
#define FSDP_FSDP_SHARDMAP_H

#include "models/model.h"
#include "optim/optim.h"

typedef enum fsdp_shard_strategy {
    FSDP_SHARD_FULL = 0,   /* FULL_SHARD / ZeRO-3: params, grads, optimizer sharded */
    FSDP_SHARD_GRAD_OP,    /* SHARD_GRAD_OP / ZeRO-2: params stay gathered fwd -> bwd */
    FSDP_SHARD_NONE,       /* NO_SHARD / DDP: everything replicated, grads all-reduced */
    FSDP_SHARD_COUNT
} fsdp_shard_strategy;

const char *fsdp_shard_strategy_name(fsdp_shard_strategy s);
/* Parse "full" | "grad-op" | "none". */
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
    int n_units;
    fsdp_shard_strategy strategy;
    fsdp_shard_unit *units;
    size_t numel;          /* all units, unpadded */
    size_t padded_numel;   /* all units, padded */
} fsdp_shardmap;

fsdp_status fsdp_shardmap_init(fsdp_shardmap *sm, const fsdp_model *m, int n_ranks,
                               fsdp_shard_strategy strategy);
void fsdp_shardmap_free(fsdp_shardmap *sm);

/* First element (in the unit's flat buffer) of rank r's shard. */
static inline size_t fsdp_shardmap_offset(const fsdp_shardmap *sm, int unit, int rank)
{
    return sm->strategy == FSDP_SHARD_NONE ? 0 : (size_t)rank * sm->units[unit].shard_numel;
}

/* Find the unit and element offset of a parameter by name (NULL if none). */
const fsdp_param_spec *fsdp_shardmap_find(const fsdp_shardmap *sm, const char *name, int *unit);

#endif /* FSDP_FSDP_SHARDMAP_H */
