/*
 * host_step.h - an optimizer's host step on the CPU worker pool: what optimizer
 * offload runs for each unit's shard when its state lives in pinned host
 * memory.
 *
 * A job updates one or more ranges of a shard (runs of parameters with the
 * same weight decay) with the optimizer's host kernel. The ranges are cut
 * into chunks of at most FSDP_OPTIM_CHUNK_NUMEL elements that the pool's
 * workers, and the thread that waits, run in any order: the kernels are
 * element-wise, so the bits do not depend on the split or the order.
 */
#ifndef FSDP_OPTIM_HOST_STEP_H
#define FSDP_OPTIM_HOST_STEP_H

#include <stdbool.h>
#include <stdint.h>

#include "optim/optim.h"
#include "optim/pool.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Elements per chunk: 64 KiB of each fp32 stream, so a chunk's arrays
 * (AdamW: p, grad, m, v = 256 KiB) stay in a core's L2 while it works. */
#define FSDP_OPTIM_CHUNK_NUMEL ((size_t)16384)

typedef struct fsdp_optim_job fsdp_optim_job;

/* Queue o's host step over ranges[0..n_ranges) with the constants c and
 * return at once with a handle in *out. The range descriptors are copied;
 * the memory they point to (host memory) must be left alone until
 * fsdp_optim_job_wait() returns. isa: the kernel, or FSDP_CPU_ISA_COUNT
 * for the best supported. INVALID_ARG (no pool, a NULL array in a
 * non-empty range, p_out not fp32 or bf16, an isa this CPU cannot run) or
 * OOM, with a message; *out is NULL then and nothing was queued. */
fsdp_status fsdp_optim_job_submit(fsdp_pool *pool, const fsdp_optim *o,
                                  const fsdp_optim_hparams *hp, const fsdp_optim_consts *c,
                                  const fsdp_optim_range *ranges, int n_ranges, fsdp_cpu_isa isa,
                                  fsdp_optim_job **out);

/* Help with the job's remaining chunks, block until all are done, then free
 * the handle. On return the updated arrays are visible to the caller. If
 * t_first / t_last are not NULL they receive when the first chunk started
 * and the last one ended (CLOCK_MONOTONIC nanoseconds, the trace's clock;
 * 0 for a job without chunks). Call exactly once per job, from one thread. */
void fsdp_optim_job_wait(fsdp_optim_job *job, uint64_t *t_first, uint64_t *t_last);

/* Whether every chunk has run (non-blocking; still call _wait once). */
bool fsdp_optim_job_done(fsdp_optim_job *job);

/* Submit and wait: the step on the pool plus the calling thread with the
 * best kernel; pool NULL runs it on the calling thread. Errors as
 * fsdp_optim_job_submit. */
fsdp_status fsdp_optim_host_step_parallel(fsdp_pool *pool, const fsdp_optim *o,
                                          const fsdp_optim_hparams *hp,
                                          const fsdp_optim_consts *c,
                                          const fsdp_optim_range *ranges, int n_ranges);

#ifdef __cplusplus
}
#endif

#endif /* FSDP_OPTIM_HOST_STEP_H */
