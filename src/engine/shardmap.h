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
    void *frozen;          /* compute-dtype shard of the frozen segment (frozen_shard), or
                            * NULL when the unit has no frozen parameters */
    void *nf4;             /* the NF4 segment's shard: nf4_shard / 2 bytes of codes, then
                            * nf4_shard / 64 fp32 absmax (fsdp_shardmap_nf4_bytes), or NULL */
    void *gathered;        /* (fsdp_shardmap_gathered_numel,) compute dtype, or NULL */
    float *grad_full;      /* (padded_numel,) fp32 unit gradient in backward, or NULL */
    fsdp_unit_state state;
} fsdp_shard_row;

/* A unit is up to three segments, each padded and split over the shard
 * ranks on its own: the trainable parameters, [0, spec->train_numel) of the
 * flat buffer (numel, padded_numel and shard_numel below: they have masters,
 * gradients, optimizer state and reductions), the frozen dense ones,
 * [train_numel, spec->nf4_begin) (frozen_*: a compute-dtype shard only), and
 * the frozen NF4 ones, [nf4_begin, spec->numel) (nf4_*: codes and fp32
 * absmax, ops/nf4.h; dequantized into the gathered buffer right after their
 * all-gather). A model with nothing frozen has one segment, laid out as
 * always. Any may be empty (0 elements, no buffers, no collectives). */
typedef struct fsdp_shard_unit {
    const fsdp_unit_spec *spec;
    size_t numel;          /* trainable, unpadded (= spec->train_numel) */
    size_t padded_numel;
    size_t shard_numel;    /* per rank */
    size_t n_blocks;       /* norm blocks holding real elements: ceil(numel / BLOCK) */
    size_t frozen_numel;   /* frozen dense, unpadded (spec->nf4_begin - spec->train_numel) */
    size_t frozen_padded;
    size_t frozen_shard;   /* per rank */
    size_t nf4_numel;      /* NF4, unpadded (spec->numel - spec->nf4_begin) */
    size_t nf4_padded;     /* a multiple of shard_ranks * FSDP_NORM_BLOCK: whole NF4 blocks */
    size_t nf4_shard;      /* per rank, elements */
    fsdp_shard_row *rows;  /* [n_ranks] */
} fsdp_shard_unit;

/* Elements of a unit's gathered buffer, laid out as the model's flat
 * buffer: the trainable segment, the frozen one at spec->train_numel, the
 * NF4 one at spec->nf4_begin. Each segment's gather writes its padding over
 * the start of the next one, which that segment's gather (issued after it,
 * on the same stream) then writes, so the buffer ends with the last
 * segment's padding. */
static inline size_t fsdp_shardmap_gathered_numel(const fsdp_shard_unit *su)
{
    if (su->nf4_numel)
        return su->spec->nf4_begin + su->nf4_padded;
    if (su->frozen_numel)
        return su->numel + su->frozen_padded;
    return su->padded_numel;
}

/* Bytes of one rank's NF4 shard: its codes, then its blocks' fp32 absmax. */
static inline size_t fsdp_shardmap_nf4_bytes(const fsdp_shard_unit *su)
{
    return su->nf4_shard / 2 + su->nf4_shard / 64 * sizeof(float);
}

typedef struct fsdp_shardmap {
    int n_ranks;
    int n_nodes;           /* nodes of n_ranks / n_nodes ranks each (1: one node) */
    int shard_ranks;       /* ranks one unit is split over (see the top of this file) */
    int n_units;
    fsdp_shard_strategy strategy;
    fsdp_shard_unit *units;
    size_t numel;          /* all units' trainable segments, unpadded */
    size_t padded_numel;   /* all units' trainable segments, padded */
    size_t frozen_numel;   /* all units' frozen dense segments, unpadded */
    size_t nf4_numel;      /* all units' NF4 segments, unpadded */
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

/* First element (in the unit's flat buffer) of rank r's frozen shard. */
static inline size_t fsdp_shardmap_frozen_offset(const fsdp_shardmap *sm, int unit, int rank)
{
    const fsdp_shard_unit *su = &sm->units[unit];
    return su->numel + (size_t)(rank % sm->shard_ranks) * su->frozen_shard;
}

/* First element (in the unit's flat buffer) of rank r's NF4 shard. */
static inline size_t fsdp_shardmap_nf4_offset(const fsdp_shardmap *sm, int unit, int rank)
{
    const fsdp_shard_unit *su = &sm->units[unit];
    return su->spec->nf4_begin + (size_t)(rank % sm->shard_ranks) * su->nf4_shard;
}

/* Find the unit and element offset of a parameter by name (NULL if none). */
const fsdp_param_spec *fsdp_shardmap_find(const fsdp_shardmap *sm, const char *name, int *unit);

#endif /* FSDP_ENGINE_SHARDMAP_H */
