/*
 * place.h - where a rank's optimizer state lives: one small table that the
 * engine calls, two implementations.
 *
 *   device (place_device.c)  fp32 master, optimizer state and the final
 *       gradient shard in device memory; the optimizer's device step runs
 *       on the compute stream after the global norm is known.
 *   host   (place_host.c)    the same arrays in pinned host memory
 *       (--offload optimizer); each unit's gradient is copied out as soon as
 *       it is final, the optimizer's host step runs on the CPU worker pool,
 *       and the compute-dtype shard is uploaded before the unit's next
 *       gather.
 *   infer  (place_infer.c)   forward only: the compute-dtype parameter shard
 *       and nothing else (no optimizer, no gradients).
 *
 * Both keep the arrays in the rank's shard row (master, state[k], grad,
 * param) in memory that the rank's device can copy to and from with
 * fsdp_device_memcpy / fsdp_device_memset, which is all checkpoints need.
 * Placements use the engine object, accumulation (accum.h), the optimizer
 * (optim/) and the trace; never a function of engine.c. Every slot is
 * called on the rank's thread.
 *
 * The table's type and the function that picks a placement are declared
 * with the engine object (engine_internal.h), the interface the engine
 * drives; this header is what the placements share among themselves, and
 * the engine's own files do not include it (so the engine and its
 * placements do not include each other).
 */
#ifndef FSDP_ENGINE_PLACE_H
#define FSDP_ENGINE_PLACE_H

#include "engine/engine_internal.h"

extern const fsdp_place_i fsdp_place_device;
extern const fsdp_place_i fsdp_place_host;
extern const fsdp_place_i fsdp_place_infer; /* inference: parameters only (place_infer.c) */

/* One of unit u's shard buffers, of `bytes`, accounted as "unit '<name>'
 * <label>": in device memory, or in pinned host memory when `host`. */
fsdp_status fsdp_place_alloc(fsdp_engine *e, int u, bool host, size_t bytes, fsdp_mem_kind kind,
                             const char *label, void **out);

/* Unit u's fp32 shards in its row, in this order: the master, each
 * optimizer state array, the gradient (fsdp_place_alloc). */
fsdp_status fsdp_place_alloc_fp32(fsdp_engine *e, int u, bool host);

/* The optimizer ranges of unit u's shard on this rank: one per parameter
 * that overlaps the shard, with its weight decay, pointing into master,
 * grad and state (each indexed like the shard) and p_out (compute dtype,
 * or NULL). ranges must have room for the unit's parameter count. Returns
 * how many were written. */
int fsdp_place_ranges(const fsdp_engine *e, int u, float *master, const float *grad,
                      float *const *state, void *p_out, fsdp_optim_range *ranges);

/* The sums of squares of the norm blocks of this rank's gradient shards
 * into out (norm_cover.h's per-rank block order: unit by unit, each
 * trainable parameter's span from its block_off), by ctx's sumsq_blocks.
 * Returns the count. */
size_t fsdp_place_sumsq(fsdp_engine *e, fsdp_op_ctx *ctx, float *out);

#endif /* FSDP_ENGINE_PLACE_H */
