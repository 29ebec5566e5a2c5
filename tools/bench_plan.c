/*
 * bench_plan.c - how long the planner takes for a 70B-class model on 8
 * devices: one meta run, and the whole `fsdp plan --fit` search (goal:
 * under 1 s).
 *
 * Why: the search runs one meta run per candidate setting it cannot rule
 * out, so its time is what a user waits for before `fsdp train`. The
 * default model is Llama 3.1 70B (the Llama family's named shape: 80
 * layers, 64 query and 8 key/value heads, 8192 hidden, 28672 intermediate,
 * a 128256-token vocabulary, untied head; 70.6B parameters); --model takes
 * any other spec. Scenarios: 8 x 80 GiB and 8 x 141 GiB devices with 2 TiB
 * of host memory, T = 1024 and 4096, several global batches (T 4096 with a
 * global batch of 32 on 141 GiB is issue 13's). Each figure is the median
 * of --repeat searches.
 *
 * Usage: bench_plan [--repeat R] [--jobs J] [--model SPEC] [--devices N]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/clock.h"
#include "train/fit.h"
#include "bench_args.h"

#define DEFAULT_MODEL "llama3.1-70b"

typedef struct scenario {
    int seq, global_batch;
    double device_gib;
} scenario;

static const scenario scenarios[] = {
    {1024, 8, 141}, {1024, 64, 141}, {1024, 64, 80}, {4096, 32, 141}, {4096, 64, 80},
    {1024, 512, 141},
};

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void die(fsdp_status st, const char *what)
{
    fprintf(stderr, "bench_plan: %s: %s: %s\n", what, fsdp_status_name(st), fsdp_error_msg());
    exit(1);
}

int main(int argc, char **argv)
{
    int repeat = 5, jobs = 0, devices = 8;
    const char *model = DEFAULT_MODEL;
    const bench_arg args[] = {
        BENCH_INT("--repeat", &repeat), BENCH_INT("--jobs", &jobs),
        BENCH_STR("--model", &model),   BENCH_INT("--devices", &devices),
    };
    if (!BENCH_ARGS_PARSE(argc, argv, args)) {
        fprintf(stderr, "usage: bench_plan [--repeat R] [--jobs J] [--model SPEC] "
                        "[--devices N]\n");
        return 2;
    }
    if (repeat < 1 || repeat > 100 || jobs < 0 || devices < 1)
        return fprintf(stderr, "bench_plan: need 1 <= --repeat <= 100, --jobs >= 0, "
                               "--devices >= 1\n"), 2;
    double *t = calloc((size_t)repeat, sizeof *t);
    if (!t)
        return 1;
    printf("model %s, %d devices, bf16, 2 TiB host memory\n", model, devices);

    /* one meta run: the unit of the search's cost */
    fsdp_fit_request req;
    fsdp_fit_request_default(&req);
    req.base.model = model;
    req.base.eng.n_ranks = devices;
    req.base.eng.compute_dtype = FSDP_DTYPE_BF16;
    req.base.eng.seq = 1024;
    req.base.eng.batch = 1;
    for (int r = 0; r < repeat; r++) {
        fsdp_plan p;
        double t0 = fsdp_now_s();
        fsdp_status st = fsdp_plan_run(&req.base, 2, &p);
        t[r] = fsdp_now_s() - t0;
        if (st != FSDP_STATUS_OK)
            die(st, "plan");
        fsdp_plan_free(&p);
    }
    qsort(t, (size_t)repeat, sizeof *t, cmp_double);
    printf("one meta run (batch 1 x seq 1024, 2 steps): %.1f ms (median of %d)\n\n",
           t[repeat / 2] * 1e3, repeat);

    printf("%6s %7s %9s | %10s %5s %6s %5s | %10s | %s\n", "seq", "global", "device", "candidates",
           "runs", "pruned", "fits", "search", "answer");
    double worst = 0;
    for (size_t k = 0; k < sizeof scenarios / sizeof scenarios[0]; k++) {
        const scenario *s = &scenarios[k];
        if (s->global_batch % devices)
            continue;
        req.base.eng.seq = s->seq;
        req.global_batch = s->global_batch;
        req.device_mem = (size_t)(s->device_gib * (double)(1 << 30));
        req.host_mem = (size_t)2 << 40;
        req.jobs = jobs;
        fsdp_fit_result r;
        memset(&r, 0, sizeof r);
        for (int i = 0; i < repeat; i++) {
            if (i)
                fsdp_fit_free(&r);
            fsdp_status st = fsdp_fit_search(&req, &r);
            if (st != FSDP_STATUS_OK)
                die(st, "fit");
            t[i] = r.wall_s;
        }
        qsort(t, (size_t)repeat, sizeof *t, cmp_double);
        double med = t[repeat / 2];
        if (med > worst)
            worst = med;
        int pruned = 0;
        for (int i = 0; i < r.n_cand; i++)
            pruned += r.cand[i].pruned_by >= 0;
        char answer[192] = "nothing fits";
        if (r.best >= 0) {
            const fsdp_fit_candidate *c = &r.cand[r.best];
            snprintf(answer, sizeof answer, "batch %d x accum %d, %s, offload %s, prefetch %s, "
                     "recompute %s: %.2f s/step (est.)", c->batch, c->grad_accum,
                     fsdp_shard_strategy_name(c->shard), c->offload ? "optimizer" : "none",
                     c->prefetch ? "on" : "off", fsdp_fit_recompute_modes[c->recompute].name,
                     c->cost.step_s);
        }
        printf("%6d %7d %5.0f GiB | %10d %5d %6d %5d | %7.1f ms | %s\n", s->seq, s->global_batch,
               s->device_gib, r.n_cand, r.n_runs, pruned, r.n_fits, med * 1e3, answer);
        fsdp_fit_free(&r);
    }
    printf("\nslowest search: %.1f ms (goal < 1000 ms: %s)\n", worst * 1e3,
           worst < 1.0 ? "met" : "MISSED");
    free(t);
    return 0;
}
