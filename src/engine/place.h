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
 */
#ifndef FSDP_ENGINE_PLACE_H
#define FSDP_ENGINE_PLACE_H

#include "engine/engine_internal.h"

typedef struct fsdp_place_i {
    const char *name;
    /* Per-rank state (e->place_ctx), before the units are allocated. */
    fsdp_status (*init)(fsdp_engine *e);
    /* Wait for work in flight and release what init made (the device
     * releases the buffers). Safe after a failed init. */
    void (*fini)(fsdp_engine *e);
    /* Allocate unit u's master, optimizer state, gradient shard and
     * compute-dtype shard (row->param, which may be row->master). */
    fsdp_status (*unit_alloc)(fsdp_engine *e, int u);
    /* Rewrite unit u's compute-dtype shard from its master (after init or
     * a checkpoint load wrote the master). Synchronous. */
    fsdp_status (*param_refresh)(fsdp_engine *e, int u);
    /* Last micro-step: unit u's gradient is reduced into the accumulation
     * counter (comm stream); make it the step's gradient shard (row->grad)
     * without a host wait. */
    fsdp_status (*unit_ready)(fsdp_engine *e, int u);
    /* Before unit u is gathered, or its master or state read or written:
     * its last update is complete on the host, and row->param holds it in
     * the order of the comm and compute streams (they wait for it). */
    fsdp_status (*params_ready)(fsdp_engine *e, int u);
    /* Per norm block, the sum of squares of every unit's gradient shard, in
     * unit order, into host memory out (n_local_blocks floats), after the
     * comm stream's folds. */
    fsdp_status (*grad_sumsq)(fsdp_engine *e, float *out);
    /* The optimizer step of every unit at learning rate lr, gradients
     * scaled by `scale`, with step count e->t (may run asynchronously: the
     * next gathers wait through params_ready or the streams). */
    fsdp_status (*step)(fsdp_engine *e, float lr, float scale);
    /* Unit u's fp32 master shard in device memory (for collectives): the
     * master itself, or a temporary copy (FSDP_MEM_OTHER) that the caller
     * frees with fsdp_device_free when it is not row->master. Complete on
     * the comm stream. */
    fsdp_status (*master_on_device)(fsdp_engine *e, int u, float **out);
} fsdp_place_i;

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

/* The placement a configuration asks for (--offload). */
const fsdp_place_i *fsdp_place_of(const fsdp_engine_config *cfg);

/* The optimizer ranges of unit u's shard on this rank: one per parameter
 * that overlaps the shard, with its weight decay, pointing into master,
 * grad and state (each indexed like the shard) and p_out (compute dtype,
 * or NULL). ranges must have room for the unit's parameter count. Returns
 * how many were written. */
int fsdp_place_ranges(const fsdp_engine *e, int u, float *master, const float *grad,
                      float *const *state, void *p_out, fsdp_optim_range *ranges);

#endif /* FSDP_ENGINE_PLACE_H */
