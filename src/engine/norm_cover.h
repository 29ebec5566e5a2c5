/*
 * norm_cover.h - the global gradient norm from a few partial sums per
 * rank, bit-identical to one fixed-order sum over every norm block.
 *
 * The order of docs/determinism.md: the sums of squares of the norm blocks
 * (FSDP_NORM_BLOCK elements each) of every trainable parameter, unit by
 * unit, parameter by parameter (flat order) and block by block (real
 * blocks only), added in comm.h's balanced tree over that sequence of M
 * blocks. A rank's row range of a parameter is a run of whole blocks
 * (shardmap.h), consecutive in the sequence (an "interval"), so instead
 * of every block a rank sends, for each of its intervals, the values of
 * the maximal subtrees of the global tree that lie inside it (the
 * interval's "cover": at most two per level). Every rank then evaluates
 * the top of the tree from the covers of all owners: the same additions
 * on the same operands as the tree over the M blocks, so the norm is the
 * same bit for bit whatever the number of ranks, nodes or processes, and
 * a rank sends O(parameters x log M) floats.
 *
 * Owners: a parameter's blocks are split over the ranks that shard it (the
 * shard map's shard_ranks: every rank for full and grad-op, a node's ranks
 * for hybrid, one rank for none); owner k is the global rank k, i.e. node
 * 0's ranks under hybrid (the other nodes hold the same gradient shards,
 * bit for bit, after the all-reduce across nodes).
 */
#ifndef FSDP_ENGINE_NORM_COVER_H
#define FSDP_ENGINE_NORM_COVER_H

#include <stddef.h>

#include "engine/shardmap.h"

typedef struct fsdp_norm_cover {
    size_t n_blocks;        /* M: the sequence's blocks */
    int n_owners;           /* shard_ranks */
    int n_iv;
    size_t *iv_lo, *iv_hi;  /* (n_iv,) intervals in sequence order, [lo, hi) */
    int *iv_owner;          /* (n_iv,) */
    size_t *iv_local;       /* (n_iv,) index of the interval's first block in its owner's
                               per-rank block array (place.h grad_sumsq's order) */
    size_t record_len;      /* floats of a record: the largest cover of any owner */
} fsdp_norm_cover;

/* The intervals of every owner in sm. Main thread; read-only afterwards.
 * OOM only. */
fsdp_status fsdp_norm_cover_init(fsdp_norm_cover *nc, const fsdp_shardmap *sm);
void fsdp_norm_cover_free(fsdp_norm_cover *nc);

/* Owner `owner`'s record: the values of its intervals' covers in sequence
 * order, from its per-block sums of squares `blocks` (place.h grad_sumsq's
 * layout); the rest of rec (record_len floats) is zero. A rank that owns
 * nothing (owner >= n_owners) writes zeros. */
void fsdp_norm_cover_record(const fsdp_norm_cover *nc, int owner, const float *blocks,
                            float *rec);

/* The sum over the M blocks in the global tree, from every owner's record
 * (records: owner k's record at k * stride floats, stride >= record_len). */
float fsdp_norm_cover_total(const fsdp_norm_cover *nc, const float *records, size_t stride);

#endif /* FSDP_ENGINE_NORM_COVER_H */
