/*
 * parallel.c - how the cpu ops hand chunks of work to the rank's team of
 * threads (device/cpu.h): by chunk index, or by fixed-size index ranges.
 */
#include "ops/cpu/cpu_ops.h"

void fsdp_cpu_parallel(fsdp_op_ctx *ctx, size_t n_chunks, fsdp_device_cpu_task task, void *arg)
{
    if (ctx->dev) {
        fsdp_device_cpu_parallel(ctx->dev, n_chunks, task, arg);
        return;
    }
    for (size_t c = 0; c < n_chunks; c++)
        task(arg, c, 0);
}

typedef struct range_job {
    fsdp_cpu_range_fn fn;
    void *arg;
    size_t n, grain;
} range_job;

static void range_task(void *arg, size_t chunk, int worker)
{
    const range_job *j = arg;
    size_t begin = chunk * j->grain;
    size_t end = j->n - begin < j->grain ? j->n : begin + j->grain;
    j->fn(j->arg, begin, end, worker);
}

void fsdp_cpu_parallel_range(fsdp_op_ctx *ctx, size_t n, size_t grain, fsdp_cpu_range_fn fn,
                             void *arg)
{
    if (n == 0)
        return;
    if (grain == 0)
        grain = 1;
    if (n <= grain) {
        fn(arg, 0, n, 0);
        return;
    }
    range_job j = {.fn = fn, .arg = arg, .n = n, .grain = grain};
    fsdp_cpu_parallel(ctx, (n + grain - 1) / grain, range_task, &j);
}
