/*
 * bench_run.h - what the benchmarks that time fsdp_train_run share: a
 * quiet training configuration, a temporary metrics log, and the median
 * of the step times. Header-only: each tool is one .c file linked against
 * build/libfsdp.a.
 */
#ifndef FSDP_TOOLS_BENCH_RUN_H
#define FSDP_TOOLS_BENCH_RUN_H

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "train/train.h"

/* A training run on the cpu backend that does only its steps: no warmup,
 * evaluation, samples or output directory. */
static inline void bench_train_config(fsdp_train_config *cfg, const char *model, int steps)
{
    fsdp_train_config_default(cfg);
    cfg->eng.backend = FSDP_BACKEND_CPU;
    cfg->model = model;
    cfg->steps = steps;
    cfg->warmup = 0;
    cfg->eval_problems = 0;
    cfg->n_samples = 0;
    cfg->out = NULL;
}

/* A new empty file for the run's metrics log: path is a template
 * ("/tmp/fsdp_bench_x_XXXXXX") that names it; the caller unlinks it.
 * Exits, naming `tool`, when it cannot be made. */
static inline void bench_log_tmp(const char *tool, char *path)
{
    int fd = mkstemp(path);
    if (fd < 0) {
        fprintf(stderr, "%s: mkstemp in /tmp: ", tool);
        perror(NULL);
        exit(1);
    }
    close(fd);
}

static inline int bench_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The median of v[0 .. n) (sorted in place), 0 when n is 0. */
static inline double bench_median(double *v, int n)
{
    if (n == 0)
        return 0;
    qsort(v, (size_t)n, sizeof *v, bench_cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

#endif /* FSDP_TOOLS_BENCH_RUN_H */
