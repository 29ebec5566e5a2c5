/*
 * shardmap.h - how each FSDP unit's parameters are split over ranks, and
 * each rank's live buffers for it. One map per world, shared by all rank
 * threads.
 *
 * Per-parameter shards, as FSDP2 makes them: every parameter is split on
 * its first dimension over the shard_ranks ranks of its group, so rank
 * slot k (k = r % shard_ranks) holds rows [k * R, (k+1) * R) of it, R =
 * its shard_rows (the last slots fewer rows, or none: padding, zero in
 * every array). A rank's shard of a unit's segment is its row ranges of
 * the segment's parameters, back to back in the unit's flat order
 * (fsdp_shard_param.shard_off), so the ranks' shards side by side
 * ("rank-major": what an all-gather returns, what a reduce-scatter takes)
 * are a permutation of the model's flat buffer plus padding: gathers copy
 * them out into the model's layout, reductions copy the gradient in
 * (engine_gather.c, engine.c).
 *
 * With more than one shard rank, R is padded so that R x the row's
 * elements is a whole number of norm blocks (FSDP_NORM_BLOCK: the
 * gradient norm sums blocks of each parameter that never straddle two
 * owners, whatever the group size: docs/determinism.md) and of NF4 blocks;
 * a parameter whose slot would then be larger than the parameter itself
 * (biases, norm weights, the small matrices of tiny models) is held whole
 * by slot 0 (R = its rows), the other slots padding of its size.
 * With one (shard none, one rank) R is the parameter's rows: the shard is
 * the model's flat segment itself, padded at its end only.
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
    void *gathered;        /* (extent,) compute dtype, or NULL */
    float *grad_full;      /* (padded_numel,) fp32 unit gradient in backward, or NULL */
    fsdp_unit_state state;
} fsdp_shard_row;

/* The segments of a unit, in the order of its flat buffer. */
typedef enum fsdp_shard_seg {
    FSDP_SEG_TRAIN = 0, /* trainable: masters, gradients, optimizer state, reductions */
    FSDP_SEG_FROZEN,    /* frozen, dense: a compute-dtype shard only */
    FSDP_SEG_NF4,       /* frozen, NF4: codes and fp32 absmax */
    FSDP_SEG_COUNT
} fsdp_shard_seg;

/* One parameter's place in its segment's shards (see the top of this file). */
typedef struct fsdp_shard_param {
    const fsdp_param_spec *spec;
    fsdp_shard_seg seg;
    size_t rows;           /* dim 0 (1 for a scalar) */
    size_t row_numel;      /* elements of one row: numel / rows */
    size_t shard_rows;     /* rows per rank slot, padded (R) */
    size_t shard_off;      /* its first element in every rank's shard of the segment */
    size_t block_off;      /* trainable: its first norm block in a rank's block array of
                            * the unit (ceil(span / FSDP_NORM_BLOCK) blocks each) */
} fsdp_shard_param;

/* Parameters of a segment that move together in one collective: a direct
 * group is one parameter, all-gathered straight into its place in the
 * model's layout (the ranks' rows of one parameter side by side are the
 * parameter itself, then padding, which spills over what follows it and
 * is written again by what is gathered after it) and reduce-scattered from
 * it; a packed group is a run of smaller ones, all-gathered into a buffer
 * of their own and copied out (reduce: copied in). A parameter whose
 * ranks' spans add up to at least the map's direct_numel elements is
 * direct; with one shard rank nothing is grouped (the shard is the layout). */
typedef struct fsdp_shard_group {
    int first, end;        /* the unit's params [first, end), in flat order */
    bool direct;
    size_t shard_off;      /* the group's first element in a rank's shard of the segment */
    size_t span;           /* its elements in a rank's shard */
} fsdp_shard_group;

#define FSDP_SHARD_DIRECT_NUMEL ((size_t)1 << 20) /* the default direct_numel */

/* Elements of a rank's shard that hold parameter sp (real rows and padding). */
static inline size_t fsdp_shard_param_span(const fsdp_shard_param *sp)
{
    return sp->shard_rows * sp->row_numel;
}

/* Norm blocks of a rank's span of sp (the last one may be partial). */
static inline size_t fsdp_shard_param_blocks(const fsdp_shard_param *sp)
{
    return (fsdp_shard_param_span(sp) + FSDP_NORM_BLOCK - 1) / FSDP_NORM_BLOCK;
}

/* Rank slot k's real rows of sp: elements [*flat, *flat + return value) of
 * the unit's flat buffer, held at sp->shard_off of slot k's shard (the
 * rest of its span is padding); 0 when slot k holds padding only. */
static inline size_t fsdp_shard_param_run(const fsdp_shard_param *sp, int k, size_t *flat)
{
    size_t r0 = (size_t)k * sp->shard_rows, r1 = r0 + sp->shard_rows;
    *flat = sp->spec->offset + r0 * sp->row_numel;
    if (r0 >= sp->rows)
        return 0;
    return ((r1 < sp->rows ? r1 : sp->rows) - r0) * sp->row_numel;
}

/* A unit is up to three segments (fsdp_shard_seg), each split over the
 * shard ranks on its own: the trainable parameters, [0, spec->train_numel)
 * of the flat buffer (numel, padded_numel and shard_numel below: they have
 * masters, gradients, optimizer state and reductions), the frozen dense
 * ones, [train_numel, spec->nf4_begin) (frozen_*: a compute-dtype shard
 * only), and the frozen NF4 ones, [nf4_begin, spec->numel) (nf4_*: codes
 * and fp32 absmax, ops/nf4.h; dequantized into the gathered buffer right
 * after their all-gather). `padded` is shard_ranks x the shard: the
 * rank-major buffer's elements. A model with nothing frozen has one
 * segment. Any may be empty (0 elements, no buffers, no collectives). */
typedef struct fsdp_shard_unit {
    const fsdp_unit_spec *spec;
    size_t numel;          /* trainable, unpadded (= spec->train_numel) */
    size_t padded_numel;
    size_t shard_numel;    /* per rank */
    size_t n_blocks;       /* norm blocks of a rank's trainable shard: the block_off
                            * sequence's end (a rank's sums of squares, place.h) */
    size_t frozen_numel;   /* frozen dense, unpadded (spec->nf4_begin - spec->train_numel) */
    size_t frozen_padded;
    size_t frozen_shard;   /* per rank */
    size_t nf4_numel;      /* NF4, unpadded (spec->numel - spec->nf4_begin) */
    size_t nf4_padded;     /* a multiple of shard_ranks * FSDP_NORM_BLOCK: whole NF4 blocks */
    size_t nf4_shard;      /* per rank, elements */
    int n_params;
    fsdp_shard_param *params; /* [n_params], in flat order: the segments one after another */
    int seg_first[FSDP_SEG_COUNT + 1]; /* segment s is params [seg_first[s], seg_first[s+1]) */
    fsdp_shard_group *groups; /* trainable and frozen dense segments' groups, in flat order */
    int group_first[FSDP_SEG_COUNT + 1]; /* segment s is groups [group_first[s], ..[s+1]) */
    size_t extent;         /* elements of the gathered buffer, in the model's flat layout
                            * (the trainable segment, the frozen one at spec->train_numel,
                            * the NF4 one at spec->nf4_begin): over several shard ranks
                            * numel, and a direct group's padding past the end; over one,
                            * each segment's shard is copied whole, its end padding over the
                            * start of the next segment (whose copy, issued after it on the
                            * same stream, writes it), so it ends with the last segment's */
    size_t train_extent;   /* the full gradient's elements: the trainable parameters and a
                            * direct group's padding past them; over one shard rank the
                            * padded segment, reduced as it is */
    fsdp_shard_row *rows;  /* [n_ranks] */
} fsdp_shard_unit;

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
    size_t direct_numel;   /* the groups' threshold (fsdp_shard_group) */
} fsdp_shardmap;

/* Group every unit's parameters again with another threshold (tests; the
 * engine's config direct_numel); the layout does not change. OOM only. */
fsdp_status fsdp_shardmap_regroup(fsdp_shardmap *sm, size_t direct_numel);

/* The map of model m over n_ranks ranks on one node. */
fsdp_status fsdp_shardmap_init(fsdp_shardmap *sm, const fsdp_model *m, int n_ranks,
                               fsdp_shard_strategy strategy);
/* The same on n_nodes nodes (n_ranks a multiple of it); only hybrid
 * sharding depends on them. */
fsdp_status fsdp_shardmap_init_nodes(fsdp_shardmap *sm, const fsdp_model *m, int n_ranks,
                                     int n_nodes, fsdp_shard_strategy strategy);
void fsdp_shardmap_free(fsdp_shardmap *sm);

/* Rank r's slot in the shard group of every unit (0 .. shard_ranks - 1). */
static inline int fsdp_shardmap_slot(const fsdp_shardmap *sm, int rank)
{
    return rank % sm->shard_ranks;
}

/* Elements of a rank's shard of segment `seg` of unit su. */
static inline size_t fsdp_shard_seg_numel(const fsdp_shard_unit *su, fsdp_shard_seg seg)
{
    return seg == FSDP_SEG_TRAIN ? su->shard_numel
           : seg == FSDP_SEG_FROZEN ? su->frozen_shard
                                    : su->nf4_shard;
}

/* Find the unit and element offset of a parameter by name (NULL if none). */
const fsdp_param_spec *fsdp_shardmap_find(const fsdp_shardmap *sm, const char *name, int *unit);

#endif /* FSDP_ENGINE_SHARDMAP_H */
