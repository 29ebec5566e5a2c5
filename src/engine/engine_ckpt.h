/*
 * engine_ckpt.h - saving and loading the engine's sharded training state
 * (fp32 master parameters, the optimizer's named state arrays and its step
 * count) as the checkpoints of src/ckpt/ckpt.h, with resharding on load.
 *
 * Saving is collective: every rank writes its own shard file in parallel,
 * from device or pinned host memory through one block-sized host staging
 * buffer, so no rank ever holds more than its own shard (device peak
 * memory is unchanged). Loading reshards: rank r of the new world reads
 * exactly the blocks of the old per-rank files that overlap its new shard
 * range of each unit, whatever the old world size and sharding were.
 */
#ifndef FSDP_ENGINE_ENGINE_CKPT_H
#define FSDP_ENGINE_ENGINE_CKPT_H

#include "ckpt/ckpt.h"
#include "engine/engine.h"

/* The run-level part of every manifest this run writes: a fresh run id,
 * world, sharding, batch, model (family, config, names, shapes, shard
 * sizes), seed and the data spec. Main thread, after
 * fsdp_engine_shared_init. UNSUPPORTED on the meta backend (it holds no
 * values to save). */
fsdp_status fsdp_engine_ckpt_describe(const fsdp_engine_shared *sh, const char *data_spec,
                                      int steps_total, fsdp_ckpt_manifest *out);

/* Can this engine resume from man (read from `path`)? The model must be
 * the checkpoint's (units, parameters, family and config; FORMAT naming the
 * manifest line otherwise); the optimizer must be the checkpoint's, seq,
 * seed and the global batch (batch x devices x grad-accum) too, since the
 * state and the data position depend on them (INVALID_ARG saying which flag
 * to change). World size, sharding, precision and offload may differ; so
 * may the global batch with allow_batch_change (the run then continues at
 * step x the new global batch in the data and is no longer bit-identical
 * to an uninterrupted one). */
fsdp_status fsdp_engine_ckpt_check(const fsdp_engine_shared *sh, const fsdp_ckpt_manifest *man,
                                   const char *path, bool allow_batch_change);

/* The newest complete checkpoint under dir, its manifest read and checked
 * (fsdp_engine_ckpt_check): *found = false and OK when there is none.
 * path receives the checkpoint's directory. Main thread. */
fsdp_status fsdp_engine_ckpt_find(const fsdp_engine_shared *sh, const char *dir,
                                  bool allow_batch_change, fsdp_ckpt_manifest *man, char *path,
                                  size_t path_size, bool *found);

/* Write checkpoint `step` of the current state under dir (base from
 * fsdp_engine_ckpt_describe), then keep the `keep` newest (0: all). All
 * ranks call it together, between steps; it contains world barriers. Rank
 * 0 prepares the .tmp directory, writes the manifest and commits. A state
 * holding NaN or infinity is never written (NONFINITE, naming the unit and
 * element; the .tmp directory is left for the next save to remove). Each
 * block, the manifest and the commit count as one FSDP_FAULT_WRITE
 * operation of the rank that writes it (core/world.h). */
fsdp_status fsdp_engine_ckpt_save(fsdp_engine *e, const char *dir, const fsdp_ckpt_manifest *base,
                                  uint64_t step, int keep);

/* Replace the rank's shards (master, optimizer state, the compute-dtype
 * copy) and the optimizer step count with checkpoint `ckpt` described by
 * man (already checked). Every rank calls it after fsdp_engine_init and before the
 * first step; on error the engine's state is partly overwritten and must
 * not be used. */
fsdp_status fsdp_engine_ckpt_load(fsdp_engine *e, const char *ckpt, const fsdp_ckpt_manifest *man);

#endif /* FSDP_ENGINE_ENGINE_CKPT_H */
