/*
 * adamw_cpu.h - the CPU AdamW used when optimizer state is offloaded to host
 * memory: the vectorised kernels of ops/cpu/optim_kernels.h (bit-identical
 * to fsdp_adamw_ref) spread over the process's CPU worker pool
 * (optim/pool.h). Arguments mean what they mean for fsdp_adamw_ref, with its
 * aliasing rules. All pointers are host memory; no alignment needed.
 */
#ifndef FSDP_OPTIM_ADAMW_CPU_H
#define FSDP_OPTIM_ADAMW_CPU_H

#include <stdbool.h>
#include <stddef.h>

#include "fsdp/fsdp.h"
#include "ops/cpu/optim_kernels.h"
#include "optim/pool.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Elements per pool chunk: 64 KiB of each fp32 stream, so a chunk's p, grad,
 * m, v (256 KiB) fit in a core's L2 while it works on them. */
#define FSDP_ADAMW_CPU_CHUNK_NUMEL ((size_t)16384)

/* An AdamW step running on a pool: the shard is cut into chunks of
 * FSDP_ADAMW_CPU_CHUNK_NUMEL elements that the pool's workers (and the
 * thread that waits) update in any order. Owned by the submitting thread. */
typedef struct fsdp_adamw_job fsdp_adamw_job;

/* Queue one AdamW step over the shard and return at once with a job handle
 * in *out. The caller must leave p, grad, m, v and p_out alone until
 * fsdp_adamw_job_wait() returns. isa: the kernel, or FSDP_CPU_ISA_COUNT for
 * the best supported. Returns INVALID_ARG (NULL array with n > 0, bad out_dt,
 * unsupported isa, bias correction not in (0, 1]) or OOM, with a message;
 * *out is NULL then and nothing was queued. */
fsdp_status fsdp_adamw_job_submit(fsdp_pool *pool, fsdp_cpu_isa isa, float *p, const float *grad,
                                  float *m, float *v, size_t n, float lr, float b1, float b2,
                                  float eps, float wd, float bc1, float bc2, float grad_scale,
                                  void *p_out, fsdp_dtype out_dt, fsdp_adamw_job **out);

/* Help with the job's remaining chunks, block until all are done, then free
 * the handle. On return the new p, m, v (and p_out) are visible to the
 * caller. Call exactly once per submitted job, from any one thread. */
void fsdp_adamw_job_wait(fsdp_adamw_job *job);

/* Whether the job has finished (non-blocking; still call _wait once). */
bool fsdp_adamw_job_done(fsdp_adamw_job *job);

/* Submit and wait: the whole step on the pool plus the calling thread, with
 * the best kernel. pool NULL runs the best kernel on the calling thread.
 * Errors as fsdp_adamw_job_submit. */
fsdp_status fsdp_adamw_cpu_parallel(fsdp_pool *pool, float *p, const float *grad, float *m,
                                    float *v, size_t n, float lr, float b1, float b2, float eps,
                                    float wd, float bc1, float bc2, float grad_scale, void *p_out,
                                    fsdp_dtype out_dt);

#ifdef __cplusplus
}
#endif

#endif /* FSDP_OPTIM_ADAMW_CPU_H */
