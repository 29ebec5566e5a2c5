/*
 * adamw_cpu.h - the fast CPU AdamW used when optimizer state is offloaded to
 * host memory: vectorised (SSE4.1 / AVX2 / AVX-512F, picked at run time) and
 * spread over the process's CPU worker pool (optim/pool.h).
 *
 * Every path gives exactly the bits of the scalar reference fsdp_adamw_ref
 * (optim/adamw.h): the kernels do the reference's operations in its order,
 * one correctly rounded vector instruction per scalar operation (mul, add,
 * sub, div, sqrt; no FMA), and the last n % width elements go through the
 * reference itself. The bf16 p_out rounding is core/bf16.h's, vectorised.
 * This relies on the build's -ffp-contract=off and on the default MXCSR
 * (no flush-to-zero / denormals-are-zero), as the reference does.
 *
 * Arguments p, grad, m, v, n, lr, b1, b2, eps, wd, bc1, bc2, grad_scale,
 * p_out, out_dt mean what they mean for fsdp_adamw_ref, with its aliasing
 * rules: grad may not alias p, m or v; p_out may alias p only for fp32.
 * All pointers are host memory (pageable or pinned); no alignment needed.
 */
#ifndef FSDP_OPTIM_ADAMW_CPU_H
#define FSDP_OPTIM_ADAMW_CPU_H

#include <stdbool.h>
#include <stddef.h>

#include "fsdp/fsdp.h"
#include "optim/pool.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Elements per pool chunk: 64 KiB of each fp32 stream, so a chunk's p, grad,
 * m, v (256 KiB) fit in a core's L2 while it works on them. */
#define FSDP_ADAMW_CPU_CHUNK_NUMEL ((size_t)16384)

typedef enum fsdp_cpu_isa {
    FSDP_CPU_ISA_SCALAR = 0, /* fsdp_adamw_ref itself */
    FSDP_CPU_ISA_SSE41,      /* 4 lanes */
    FSDP_CPU_ISA_AVX2,       /* 8 lanes */
    FSDP_CPU_ISA_AVX512F,    /* 16 lanes */
    FSDP_CPU_ISA_COUNT
} fsdp_cpu_isa;

/* "scalar", "sse4.1", "avx2", "avx512f"; "?" for a bad value. */
const char *fsdp_cpu_isa_name(fsdp_cpu_isa isa);

/* Whether this build has a kernel for isa and the running CPU can run it. */
bool fsdp_cpu_isa_supported(fsdp_cpu_isa isa);

/* The widest supported ISA (what fsdp_adamw_cpu uses). */
fsdp_cpu_isa fsdp_cpu_isa_best(void);

/* One AdamW step on the calling thread with the best supported kernel. */
void fsdp_adamw_cpu(float *p, const float *grad, float *m, float *v, size_t n, float lr, float b1,
                    float b2, float eps, float wd, float bc1, float bc2, float grad_scale,
                    void *p_out, fsdp_dtype out_dt);

/* The same with a chosen kernel (tests, benchmarks). isa must be supported
 * (asserted). */
void fsdp_adamw_cpu_isa(fsdp_cpu_isa isa, float *p, const float *grad, float *m, float *v,
                        size_t n, float lr, float b1, float b2, float eps, float wd, float bc1,
                        float bc2, float grad_scale, void *p_out, fsdp_dtype out_dt);

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
 * the best kernel. pool NULL runs fsdp_adamw_cpu on the calling thread.
 * Errors as fsdp_adamw_job_submit. */
fsdp_status fsdp_adamw_cpu_parallel(fsdp_pool *pool, float *p, const float *grad, float *m,
                                    float *v, size_t n, float lr, float b1, float b2, float eps,
                                    float wd, float bc1, float bc2, float grad_scale, void *p_out,
                                    fsdp_dtype out_dt);

#ifdef __cplusplus
}
#endif

#endif /* FSDP_OPTIM_ADAMW_CPU_H */
