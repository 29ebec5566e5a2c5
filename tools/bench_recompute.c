/*
 * bench_recompute.c - what activation recompute (--recompute) costs and
 * saves: per mode, the peak device memory, the activations at the peak and
 * the step time of a real cpu-backend run, then the planner's figures for
 * a large shape on several devices.
 *
 * Why: recompute trades compute for activation memory; the user picks a
 * mode on these two numbers, and `fsdp plan --fit` ranks modes by them.
 * The cpu run is the trainer itself (fsdp_train_run, as `fsdp train` calls
 * it: FULL_SHARD, fp32, prefetch on, no evaluation, no output). Two step
 * times: wall, the median of the steps after the first (the first faults
 * in every buffer) from the metrics log; and CPU, the process's CPU time
 * for a run of S steps less that of a run of 1 step, over S - 1. On a
 * shared machine wall time stretches with the load average while CPU time
 * barely moves, so the CPU column is the one to compare modes by there
 * (the rank is one thread with one BLAS thread, so CPU time is its work).
 * The modes run in rounds, in opposite orders on alternate rounds, so a
 * load that drifts weighs on every mode alike. The runs also check the
 * contract: every mode's losses and gradient norms must equal none's, bit
 * for bit.
 * The plan rows run the schedule on the meta backend (train/plan.h), which
 * tests/test_plan.c holds byte-exact against cpu runs.
 *
 * Usage: bench_recompute [--model NAME] [--seq T] [--batch B] [--devices N]
 *                        [--steps S] [--rounds R] [--plan-model NAME] [--plan-devices N]
 *                        [--plan-batch B] [--plan-seq T] [--no-cpu]
 * Defaults: GPT-2 124M ("gpt2") at T 1024, batch 1 on 1 device, 2 rounds
 * of 4 steps;
 * plan gpt2-xl on 8 devices at batch 2 x 1024.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "core/error.h"
#include "core/json.h"
#include "engine/engine.h"
#include "models/family.h"
#include "models/registry.h"
#include "train/plan.h"
#include "train/train.h"
#include "bench_args.h"
#include "bench_run.h"

#define MAX_SAMPLES 1024

/* Step times of one mode over all rounds. */
typedef struct samples {
    double ms[MAX_SAMPLES];
    int n;
} samples;

/* Append the "step_ms" of the metrics lines after the first to *out. */
static void read_step_ms(const char *path, samples *out)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return;
    int line_no = 0;
    char line[8192];
    while (fgets(line, sizeof line, f) && out->n < MAX_SAMPLES) {
        fsdp_json *o;
        if (fsdp_json_parse(line, strlen(line), &o) != FSDP_STATUS_OK)
            continue;
        const fsdp_json *v = fsdp_json_get(o, "step_ms");
        if (v && v->type == FSDP_JSON_NUMBER && line_no++ > 0)
            out->ms[out->n++] = v->number;
        fsdp_json_free(o);
    }
    fclose(f);
}

static double median(samples *s) { return bench_median(s->ms, s->n); }

static void die(const char *what)
{
    fprintf(stderr, "bench_recompute: %s: %s\n", what, fsdp_error_msg());
    exit(1);
}

static const char *mode_name(int mode)
{
    return fsdp_names_name(&fsdp_recompute_names, mode);
}

static const char *gib(char *buf, size_t v)
{
    return fsdp_fmt_bytes(buf, 32, (double)v);
}

/* Recompute FLOPs over the model's training FLOPs, per token. */
static double flops_share(const char *model, int T, int mode)
{
    fsdp_model m;
    if (fsdp_model_from_spec(model, &m) != FSDP_STATUS_OK)
        die(model);
    double r = m.iface->recompute_flops_per_token
                   ? m.iface->recompute_flops_per_token(&m, T, (fsdp_recompute)mode)
                   : 0.0;
    double share = r / m.family->flops_per_token(&m, T);
    fsdp_model_free(&m);
    return share;
}

typedef struct cpu_row {
    size_t peak, act;
    samples wall_ms;         /* per step, every round */
    samples cpu_ms;          /* per step, one value per round */
    fsdp_train_result res;   /* of the last round */
} cpu_row;

/* CPU time (user + system) the process has used, every thread included
 * (rank threads that have exited too), in seconds. */
static double process_cpu_s(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + 1e-6 * (double)ru.ru_utime.tv_usec +
           (double)ru.ru_stime.tv_sec + 1e-6 * (double)ru.ru_stime.tv_usec;
}

/* One training run of `mode` for `steps` steps into *res; appends its
 * step times (after the first) to *wall if not NULL. Returns the CPU
 * seconds it used. */
static double train_once(const char *model, int devices, int batch, int seq, int steps, int mode,
                         fsdp_train_result *res, samples *wall)
{
    fsdp_train_config cfg;
    bench_train_config(&cfg, model, steps);
    cfg.eng.n_ranks = devices;
    cfg.eng.batch = batch;
    cfg.eng.seq = seq;
    cfg.eng.deterministic = true;
    cfg.eng.recompute = (fsdp_recompute)mode;
    char log_path[] = "/tmp/fsdp_bench_recompute_XXXXXX";
    bench_log_tmp("bench_recompute", log_path);
    cfg.log_path = log_path;
    double cpu0 = process_cpu_s();
    fsdp_status st = fsdp_train_run(&cfg, res);
    double cpu = process_cpu_s() - cpu0;
    if (wall)
        read_step_ms(log_path, wall);
    unlink(log_path);
    if (st != FSDP_STATUS_OK)
        die(mode_name(mode));
    return cpu;
}

/* One round of `mode`: a run of `steps` steps (its figures and wall step
 * times into row; the previous round's result is freed) and one of a
 * single step; the difference of their CPU times over steps - 1 is the
 * CPU time of a step after the first, which a loaded machine does not
 * inflate the way it inflates wall time. */
static void cpu_round(const char *model, int devices, int batch, int seq, int steps, int mode,
                      cpu_row *row)
{
    if (row->res.losses)
        fsdp_train_result_free(&row->res);
    double cpu_long = train_once(model, devices, batch, seq, steps, mode, &row->res,
                                 &row->wall_ms);
    fsdp_train_result one;
    double cpu_short = train_once(model, devices, batch, seq, 1, mode, &one, NULL);
    fsdp_train_result_free(&one);
    if (row->cpu_ms.n < MAX_SAMPLES)
        row->cpu_ms.ms[row->cpu_ms.n++] = 1e3 * (cpu_long - cpu_short) / (steps - 1);
    row->peak = row->act = 0;
    for (int r = 0; r < row->res.n_ranks; r++) {
        const fsdp_rank_stats *s = &row->res.stats[r];
        if (s->peak_bytes > row->peak) {
            row->peak = s->peak_bytes;
            row->act = s->mem.peak_kind_bytes[FSDP_MEM_ACT];
        }
    }
}

static bool same_trajectory(const fsdp_train_result *a, const fsdp_train_result *b)
{
    return a->steps == b->steps &&
           !memcmp(a->losses, b->losses, (size_t)a->steps * sizeof *a->losses) &&
           !memcmp(a->grad_norms, b->grad_norms, (size_t)a->steps * sizeof *a->grad_norms);
}

static void usage(void)
{
    fprintf(stderr, "usage: bench_recompute [--model NAME] [--seq T] [--batch B] [--devices N] "
                    "[--steps S] [--rounds R]\n       [--plan-model NAME] [--plan-devices N] "
                    "[--plan-batch B] [--plan-seq T] [--no-cpu]\n");
}

int main(int argc, char **argv)
{
    const char *model = "gpt2", *plan_model = "gpt2-xl";
    int seq = 1024, batch = 1, devices = 1, steps = 4, rounds = 2;
    int plan_devices = 8, plan_batch = 2, plan_seq = 1024;
    bool no_cpu = false;
    const bench_arg args[] = {
        BENCH_FLAG("--no-cpu", &no_cpu),          BENCH_STR("--model", &model),
        BENCH_INT("--seq", &seq),                 BENCH_INT("--batch", &batch),
        BENCH_INT("--devices", &devices),         BENCH_INT("--steps", &steps),
        BENCH_INT("--rounds", &rounds),           BENCH_STR("--plan-model", &plan_model),
        BENCH_INT("--plan-devices", &plan_devices), BENCH_INT("--plan-batch", &plan_batch),
        BENCH_INT("--plan-seq", &plan_seq),
    };
    if (!BENCH_ARGS_PARSE(argc, argv, args)) {
        usage();
        return 2;
    }
    if (steps < 2 || rounds < 1 || (steps - 1) * rounds > MAX_SAMPLES || seq < 1 || batch < 1 ||
        devices < 1 || plan_devices < 1 || plan_batch < 1 || plan_seq < 1) {
        fprintf(stderr, "bench_recompute: need --steps >= 2 (the first is not timed) and "
                        "positive sizes\n");
        return 2;
    }
    char b1[32], b2[32];
    int ok = 1;
    if (!no_cpu) {
        printf("cpu backend: model %s, %d device(s), batch %d x seq %d, fp32, shard full, "
               "%d round(s) of %d steps\n  (wall: median step time after the first; cpu: "
               "CPU time of a run of %d steps less a run of 1, per step; medians over rounds)\n",
               model, devices, batch, seq, rounds, steps, steps);
        static cpu_row rows[FSDP_RECOMPUTE_COUNT];
        for (int r = 0; r < rounds; r++)
            for (int k = 0; k < FSDP_RECOMPUTE_COUNT; k++) {
                int mode = r % 2 ? FSDP_RECOMPUTE_COUNT - 1 - k : k;
                cpu_round(model, devices, batch, seq, steps, mode, &rows[mode]);
                fprintf(stderr, "  round %d: %s done\n", r + 1, mode_name(mode));
            }
        printf("  %-12s %11s %11s %12s %8s %12s %8s %8s %s\n", "recompute", "peak", "act",
               "wall ms/step", "vs none", "cpu ms/step", "vs none", "+flops", "losses");
        double ref_wall = median(&rows[0].wall_ms), ref_cpu = median(&rows[0].cpu_ms);
        for (int mode = 0; mode < FSDP_RECOMPUTE_COUNT; mode++) {
            bool same = mode == 0 || same_trajectory(&rows[0].res, &rows[mode].res);
            ok &= same;
            double wall = median(&rows[mode].wall_ms), cpu = median(&rows[mode].cpu_ms);
            printf("  %-12s %11s %11s %12.0f %7.2fx %12.0f %7.2fx %7.1f%% %s\n",
                   mode_name(mode), gib(b1, rows[mode].peak), gib(b2, rows[mode].act), wall,
                   ref_wall > 0 ? wall / ref_wall : 0.0, cpu, ref_cpu > 0 ? cpu / ref_cpu : 0.0,
                   100.0 * flops_share(model, seq, mode),
                   mode == 0 ? "(reference)" : same ? "bit-identical" : "DIFFER");
        }
        double load[1];
        if (getloadavg(load, 1) == 1)
            printf("  (load average %.1f at the end: wall times stretch with it, CPU times "
                   "much less)\n", load[0]);
        for (int mode = 0; mode < FSDP_RECOMPUTE_COUNT; mode++)
            fsdp_train_result_free(&rows[mode].res);
    }
    printf("\nplan (meta backend): model %s, %d device(s), batch %d x seq %d, fp32, shard full\n",
           plan_model, plan_devices, plan_batch, plan_seq);
    printf("  %-12s %11s %11s %12s %10s\n", "recompute", "peak", "act", "+flops", "plan s");
    for (int mode = 0; mode < FSDP_RECOMPUTE_COUNT; mode++) {
        fsdp_train_config cfg;
        fsdp_train_config_default(&cfg);
        cfg.eng.n_ranks = plan_devices;
        cfg.eng.batch = plan_batch;
        cfg.eng.seq = plan_seq;
        cfg.eng.recompute = (fsdp_recompute)mode;
        cfg.model = plan_model;
        cfg.out = NULL;
        fsdp_plan plan;
        if (fsdp_plan_run(&cfg, 2, &plan) != FSDP_STATUS_OK)
            die(plan_model);
        int who;
        size_t peak = fsdp_plan_max_peak(&plan, &who);
        printf("  %-12s %11s %11s %11.1f%% %10.3f\n", mode_name(mode), gib(b1, peak),
               gib(b2, plan.ranks[who].mem.peak_kind_bytes[FSDP_MEM_ACT]),
               100.0 * flops_share(plan_model, plan_seq, mode), plan.wall_s);
        fsdp_plan_free(&plan);
    }
    printf("\n(+flops: the recompute's matmul and attention FLOPs over the training step's "
           "6 P + 12 L C T)\n");
    return ok ? 0 : 1;
}
