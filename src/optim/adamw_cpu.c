/*
 * adamw_cpu.c - AdamW on host shards spread over a CPU worker pool (contract
 * in adamw_cpu.h). The kernels themselves are in src/ops/cpu (adamw.c).
 */
#include <stdint.h>
#include <stdlib.h>

#include "core/error.h"
#include "optim/adamw_cpu.h"

/* Hyperparameters of one step. */
typedef struct adamw_hp {
    float lr, b1, b2, eps, wd, bc1, bc2, grad_scale;
} adamw_hp;

/* ---- pool jobs -------------------------------------------------------- */

struct fsdp_adamw_job {
    fsdp_pool_job pool_job; /* pool bookkeeping; first so the handle is one block */
    fsdp_pool *pool;
    fsdp_cpu_isa isa;
    adamw_hp hp;
    float *p;               /* (n,) */
    const float *grad;      /* (n,) */
    float *m, *v;           /* (n,) */
    size_t n;
    void *p_out;            /* (n,) of out_dt, or NULL */
    fsdp_dtype out_dt;
};

static void adamw_job_chunk(void *arg, size_t chunk)
{
    const fsdp_adamw_job *job = arg;
    const size_t begin = chunk * FSDP_ADAMW_CPU_CHUNK_NUMEL;
    const size_t end = job->n - begin < FSDP_ADAMW_CPU_CHUNK_NUMEL
                           ? job->n
                           : begin + FSDP_ADAMW_CPU_CHUNK_NUMEL;
    void *out = NULL;
    if (job->p_out)
        out = (char *)job->p_out + begin * fsdp_dtype_size(job->out_dt);
    const adamw_hp *hp = &job->hp;
    fsdp_adamw_cpu(job->isa, job->p + begin, job->grad + begin, job->m + begin, job->v + begin,
                   end - begin, hp->lr, hp->b1, hp->b2, hp->eps, hp->wd, hp->bc1, hp->bc2,
                   hp->grad_scale, out, job->out_dt);
}

static fsdp_status adamw_check_args(fsdp_cpu_isa isa, const float *p, const float *grad,
                                    const float *m, const float *v, size_t n, float bc1, float bc2,
                                    const void *p_out, fsdp_dtype out_dt)
{
    if (n > 0 && (!p || !grad || !m || !v))
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "cpu adamw: NULL array among p/grad/m/v for a shard of %zu elements",
                              n);
    if (p_out && out_dt != FSDP_DTYPE_F32 && out_dt != FSDP_DTYPE_BF16)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "cpu adamw: p_out dtype %d is not fp32 or bf16", (int)out_dt);
    if (!fsdp_cpu_isa_supported(isa))
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "cpu adamw: kernel '%s' cannot run on this CPU or build; use the "
                              "best supported ('%s')",
                              fsdp_cpu_isa_name(isa), fsdp_cpu_isa_name(fsdp_cpu_isa_best()));
    if (!(bc1 > 0.0f && bc1 <= 1.0f) || !(bc2 > 0.0f && bc2 <= 1.0f))
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "cpu adamw: bias corrections bc1=%g bc2=%g are not in (0, 1]; they "
                              "are 1 - beta^t for step t >= 1",
                              (double)bc1, (double)bc2);
    return FSDP_STATUS_OK;
}

fsdp_status fsdp_adamw_job_submit(fsdp_pool *pool, fsdp_cpu_isa isa, float *p, const float *grad,
                                  float *m, float *v, size_t n, float lr, float b1, float b2,
                                  float eps, float wd, float bc1, float bc2, float grad_scale,
                                  void *p_out, fsdp_dtype out_dt, fsdp_adamw_job **out)
{
    *out = NULL;
    if (!pool)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "cpu adamw: no pool given; get one with fsdp_pool_acquire()");
    if (isa == FSDP_CPU_ISA_COUNT)
        isa = fsdp_cpu_isa_best();
    FSDP_TRY(adamw_check_args(isa, p, grad, m, v, n, bc1, bc2, p_out, out_dt));
    fsdp_adamw_job *job = calloc(1, sizeof *job);
    if (!job)
        return fsdp_error_set(FSDP_STATUS_OOM, "cpu adamw: out of host memory for a job handle");
    job->pool = pool;
    job->isa = isa;
    job->hp = (adamw_hp){lr, b1, b2, eps, wd, bc1, bc2, grad_scale};
    job->p = p;
    job->grad = grad;
    job->m = m;
    job->v = v;
    job->n = n;
    job->p_out = p_out;
    job->out_dt = out_dt;
    const size_t n_chunks = (n + FSDP_ADAMW_CPU_CHUNK_NUMEL - 1) / FSDP_ADAMW_CPU_CHUNK_NUMEL;
    fsdp_pool_submit(pool, &job->pool_job, adamw_job_chunk, job, n_chunks);
    *out = job;
    return FSDP_STATUS_OK;
}

void fsdp_adamw_job_wait(fsdp_adamw_job *job)
{
    if (!job)
        return;
    fsdp_pool_wait(job->pool, &job->pool_job);
    free(job);
}

bool fsdp_adamw_job_done(fsdp_adamw_job *job)
{
    return fsdp_pool_test(job->pool, &job->pool_job);
}

fsdp_status fsdp_adamw_cpu_parallel(fsdp_pool *pool, float *p, const float *grad, float *m,
                                    float *v, size_t n, float lr, float b1, float b2, float eps,
                                    float wd, float bc1, float bc2, float grad_scale, void *p_out,
                                    fsdp_dtype out_dt)
{
    if (!pool) {
        FSDP_TRY(adamw_check_args(fsdp_cpu_isa_best(), p, grad, m, v, n, bc1, bc2, p_out,
                                  out_dt));
        fsdp_adamw_cpu(FSDP_CPU_ISA_COUNT, p, grad, m, v, n, lr, b1, b2, eps, wd, bc1, bc2,
                       grad_scale, p_out, out_dt);
        return FSDP_STATUS_OK;
    }
    fsdp_adamw_job *job;
    FSDP_TRY(fsdp_adamw_job_submit(pool, FSDP_CPU_ISA_COUNT, p, grad, m, v, n, lr, b1, b2, eps,
                                   wd, bc1, bc2, grad_scale, p_out, out_dt, &job));
    fsdp_adamw_job_wait(job);
    return FSDP_STATUS_OK;
}
