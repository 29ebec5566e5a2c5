/*
 * host_step.c - optimizer host steps on the worker pool (contract in host_step.h).
 *
 * Chunk k of a job belongs to the range whose first chunk index is the
 * largest one <= k (binary search over the ranges' first chunks); it covers
 * elements [(k - first) * CHUNK, +CHUNK) of that range, clipped to its end.
 */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/error.h"
#include "ops/optim_kernels.h"
#include "optim/host_step.h"

struct fsdp_optim_job {
    fsdp_pool_job pool_job;     /* pool bookkeeping */
    fsdp_pool *pool;
    const fsdp_optim *o;
    fsdp_optim_hparams hp;
    fsdp_optim_consts c;
    fsdp_cpu_isa isa;
    int n_ranges;
    fsdp_optim_range *ranges;   /* [n_ranges] */
    size_t *chunk0;             /* [n_ranges] first chunk of each range */
    atomic_ullong t_first, t_last;
};

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void job_chunk(void *arg, size_t chunk)
{
    fsdp_optim_job *j = arg;
    unsigned long long zero = 0;
    atomic_compare_exchange_strong(&j->t_first, &zero, (unsigned long long)now_ns());
    int lo = 0, hi = j->n_ranges - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (j->chunk0[mid] <= chunk)
            lo = mid;
        else
            hi = mid - 1;
    }
    const fsdp_optim_range *r = &j->ranges[lo];
    size_t a = (chunk - j->chunk0[lo]) * FSDP_OPTIM_CHUNK_NUMEL;
    size_t n = r->n - a < FSDP_OPTIM_CHUNK_NUMEL ? r->n - a : FSDP_OPTIM_CHUNK_NUMEL;
    fsdp_optim_range part = *r;
    part.p = r->p + a;
    part.grad = r->grad + a;
    for (int k = 0; k < j->o->n_state; k++)
        part.state[k] = r->state[k] + a;
    if (r->p_out)
        part.p_out = (char *)r->p_out + a * fsdp_dtype_size(r->out_dt);
    part.n = n;
    j->o->host_step(j->isa, &j->hp, &j->c, &part);
    unsigned long long t1 = now_ns(), prev = atomic_load(&j->t_last);
    while (prev < t1 && !atomic_compare_exchange_weak(&j->t_last, &prev, t1))
        ;
}

static fsdp_status check_ranges(const fsdp_optim *o, const fsdp_optim_range *ranges,
                                 int n_ranges, fsdp_cpu_isa isa)
{
    if (!fsdp_cpu_isa_supported(isa))
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "cpu %s: kernel '%s' cannot run on this CPU or build; use the best "
                              "supported ('%s')",
                              o->name, fsdp_cpu_isa_name(isa),
                              fsdp_cpu_isa_name(fsdp_cpu_isa_best()));
    if (n_ranges < 0 || (n_ranges > 0 && !ranges))
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "cpu %s: %d ranges given", o->name,
                              n_ranges);
    for (int i = 0; i < n_ranges; i++) {
        const fsdp_optim_range *r = &ranges[i];
        bool null = !r->p || !r->grad;
        for (int k = 0; k < o->n_state; k++)
            null |= !r->state[k];
        if (r->n > 0 && null)
            return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                                  "cpu %s: range %d of %zu elements has a NULL parameter, "
                                  "gradient or state array", o->name, i, r->n);
        if (r->p_out && r->out_dt != FSDP_DTYPE_F32 && r->out_dt != FSDP_DTYPE_BF16)
            return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                                  "cpu %s: p_out dtype %d is not fp32 or bf16", o->name,
                                  (int)r->out_dt);
    }
    return FSDP_STATUS_OK;
}

fsdp_status fsdp_optim_job_submit(fsdp_pool *pool, const fsdp_optim *o,
                                  const fsdp_optim_hparams *hp, const fsdp_optim_consts *c,
                                  const fsdp_optim_range *ranges, int n_ranges, fsdp_cpu_isa isa,
                                  fsdp_optim_job **out)
{
    *out = NULL;
    if (!pool)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "cpu %s: no pool given; get one with fsdp_pool_acquire()", o->name);
    if (isa == FSDP_CPU_ISA_COUNT)
        isa = fsdp_cpu_isa_best();
    FSDP_TRY(check_ranges(o, ranges, n_ranges, isa));
    fsdp_optim_job *j = calloc(1, sizeof *j);
    if (j) {
        j->ranges = malloc((size_t)n_ranges * sizeof *j->ranges + 1);
        j->chunk0 = malloc((size_t)n_ranges * sizeof *j->chunk0 + 1);
    }
    if (!j || !j->ranges || !j->chunk0) {
        if (j) {
            free(j->ranges);
            free(j->chunk0);
        }
        free(j);
        return fsdp_error_set(FSDP_STATUS_OOM, "cpu %s: out of host memory for a job of %d "
                              "ranges", o->name, n_ranges);
    }
    j->pool = pool;
    j->o = o;
    j->hp = *hp;
    j->c = *c;
    j->isa = isa;
    size_t n_chunks = 0;
    for (int i = 0; i < n_ranges; i++) {
        if (ranges[i].n == 0)
            continue; /* no chunks: never looked up */
        j->ranges[j->n_ranges] = ranges[i];
        j->chunk0[j->n_ranges++] = n_chunks;
        n_chunks += (ranges[i].n + FSDP_OPTIM_CHUNK_NUMEL - 1) / FSDP_OPTIM_CHUNK_NUMEL;
    }
    fsdp_pool_submit(pool, &j->pool_job, job_chunk, j, n_chunks);
    *out = j;
    return FSDP_STATUS_OK;
}

void fsdp_optim_job_wait(fsdp_optim_job *job, uint64_t *t_first, uint64_t *t_last)
{
    if (!job)
        return;
    fsdp_pool_wait(job->pool, &job->pool_job);
    if (t_first)
        *t_first = (uint64_t)atomic_load(&job->t_first);
    if (t_last)
        *t_last = (uint64_t)atomic_load(&job->t_last);
    free(job->ranges);
    free(job->chunk0);
    free(job);
}

bool fsdp_optim_job_done(fsdp_optim_job *job) { return fsdp_pool_test(job->pool, &job->pool_job); }

fsdp_status fsdp_optim_host_step_parallel(fsdp_pool *pool, const fsdp_optim *o,
                                          const fsdp_optim_hparams *hp,
                                          const fsdp_optim_consts *c,
                                          const fsdp_optim_range *ranges, int n_ranges)
{
    if (!pool) {
        FSDP_TRY(check_ranges(o, ranges, n_ranges, fsdp_cpu_isa_best()));
        for (int i = 0; i < n_ranges; i++)
            o->host_step(FSDP_CPU_ISA_COUNT, hp, c, &ranges[i]);
        return FSDP_STATUS_OK;
    }
    fsdp_optim_job *job;
    FSDP_TRY(fsdp_optim_job_submit(pool, o, hp, c, ranges, n_ranges, FSDP_CPU_ISA_COUNT, &job));
    fsdp_optim_job_wait(job, NULL, NULL);
    return FSDP_STATUS_OK;
}
