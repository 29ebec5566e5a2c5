/*
 * schedule.h - the learning-rate schedules of a training run (--schedule):
 * a registry of names, one-line helps and the function that gives the rate
 * at a step, read by the CLI's parser and --help and by the trainer.
 *
 * Every schedule starts with the same linear warmup (step s < warmup runs
 * at lr * (s + 1) / warmup) and differs only after it. The rate is a pure
 * function of the step and the settings below, so a run resumed from a
 * checkpoint continues the same schedule when given the same settings.
 */
#ifndef FSDP_TRAIN_SCHEDULE_H
#define FSDP_TRAIN_SCHEDULE_H

#include "core/names.h"

typedef enum fsdp_lr_schedule {
    FSDP_LR_COSINE = 0,   /* the default (and the demo's) */
    FSDP_LR_LINEAR,
    FSDP_LR_CONSTANT,
    FSDP_LR_WSD,
    FSDP_LR_SCHEDULE_COUNT
} fsdp_lr_schedule;

/* The names, each with its help (--schedule). */
extern const fsdp_name_table fsdp_lr_schedule_names;

/* What a schedule needs to know. */
typedef struct fsdp_lr_plan {
    fsdp_lr_schedule schedule;
    float lr;                 /* peak */
    double min_lr;            /* floor (cosine, linear, wsd end there; constant ignores it) */
    int warmup;               /* linear warmup steps (0: none) */
    int steps;                /* the run's optimizer steps */
    float decay_frac;         /* wsd: the last decay_frac of the steps decay (0, 1] */
} fsdp_lr_plan;

/* Learning rate at 0-based `step`: the warmup, then the schedule's shape.
 * After warmup, with W = warmup and S = steps:
 * - cosine: min + (lr - min) * (1 + cos(pi * p)) / 2, p = (step - W) / (S - W - 1)
 *   (1 when S - W <= 1): the first step after warmup at lr, the last at min;
 * - linear: min + (lr - min) * (1 - p), the same p;
 * - constant: lr;
 * - wsd: lr until the last D = max(1, round(decay_frac * S)) steps (never
 *   before W), then min + (lr - min) * (1 - q), q = (step - (S - D) + 1) / D:
 *   the last step at min.
 * p and q are capped at 1, so a step past S (a resume with fewer --steps)
 * runs at the floor. */
float fsdp_lr_at(const fsdp_lr_plan *p, int step);

/* "cosine to 2e-06", "wsd: decay over the last 10 steps to 2e-06",
 * "constant" into buf (the run header); returns buf. */
char *fsdp_lr_describe(const fsdp_lr_plan *p, char *buf, size_t n);

#endif /* FSDP_TRAIN_SCHEDULE_H */
