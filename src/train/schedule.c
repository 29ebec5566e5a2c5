/*
 * schedule.c - the learning-rate schedules (schedule.h): one function per
 * schedule for the part after warmup, picked from a table by the name's
 * value, so adding a schedule is a name, a help line and a function here.
 *
 * The cosine schedule is computed exactly as the trainer always did (in
 * double, rounded to float once): the golden trajectory depends on it.
 */
#include <math.h>
#include <stdio.h>

#include "core/error.h"
#include "train/schedule.h"

static const fsdp_name lr_schedule_names[] = {
    {"cosine", FSDP_LR_COSINE, "warmup, then a cosine decay to --min-lr at the last step"},
    {"linear", FSDP_LR_LINEAR, "warmup, then a linear decay to --min-lr at the last step"},
    {"constant", FSDP_LR_CONSTANT, "warmup, then --lr to the end"},
    {"wsd", FSDP_LR_WSD,
     "warmup, stable at --lr, then a linear decay to --min-lr over the last --decay-frac of "
     "the steps"},
};
const fsdp_name_table fsdp_lr_schedule_names = FSDP_NAME_TABLE(lr_schedule_names);

/* Progress through the steps after warmup: 0 at the first, 1 at the last. */
static double after_warmup(const fsdp_lr_plan *p, int step)
{
    int span = p->steps - p->warmup;
    double progress = span > 1 ? (double)(step - p->warmup) / (double)(span - 1) : 1.0;
    return progress > 1.0 ? 1.0 : progress;
}

/* From lr at f = 1 down to the floor at f = 0. */
static float between(const fsdp_lr_plan *p, double f)
{
    return (float)(p->min_lr + f * ((double)p->lr - p->min_lr));
}

static float lr_cosine(const fsdp_lr_plan *p, int step)
{
    return between(p, 0.5 * (1.0 + cos(M_PI * after_warmup(p, step))));
}

static float lr_linear(const fsdp_lr_plan *p, int step)
{
    return between(p, 1.0 - after_warmup(p, step));
}

static float lr_constant(const fsdp_lr_plan *p, int step)
{
    (void)step;
    return p->lr;
}

/* wsd: the steps that decay (at least 1, never reaching into warmup). */
static int wsd_decay_steps(const fsdp_lr_plan *p)
{
    int d = (int)lround((double)p->decay_frac * (double)p->steps);
    if (d < 1)
        d = 1;
    if (d > p->steps - p->warmup)
        d = p->steps - p->warmup > 1 ? p->steps - p->warmup : 1;
    return d;
}

static float lr_wsd(const fsdp_lr_plan *p, int step)
{
    int d = wsd_decay_steps(p), first = p->steps - d;
    if (step < first)
        return p->lr;
    double q = (double)(step - first + 1) / (double)d;
    return between(p, 1.0 - (q > 1.0 ? 1.0 : q));
}

typedef float (*lr_fn)(const fsdp_lr_plan *p, int step);

static const lr_fn lr_fns[FSDP_LR_SCHEDULE_COUNT] = {
    [FSDP_LR_COSINE] = lr_cosine,
    [FSDP_LR_LINEAR] = lr_linear,
    [FSDP_LR_CONSTANT] = lr_constant,
    [FSDP_LR_WSD] = lr_wsd,
};

float fsdp_lr_at(const fsdp_lr_plan *p, int step)
{
    if (step < p->warmup)
        return p->lr * (float)(step + 1) / (float)p->warmup;
    FSDP_ASSERT((unsigned)p->schedule < FSDP_LR_SCHEDULE_COUNT && lr_fns[p->schedule]);
    return lr_fns[p->schedule](p, step);
}

char *fsdp_lr_describe(const fsdp_lr_plan *p, char *buf, size_t n)
{
    const char *name = fsdp_names_name(&fsdp_lr_schedule_names, (int)p->schedule);
    if (p->schedule == FSDP_LR_CONSTANT)
        snprintf(buf, n, "%s", name);
    else if (p->schedule == FSDP_LR_WSD)
        snprintf(buf, n, "%s: decay over the last %d steps to %.3g", name, wsd_decay_steps(p),
                 p->min_lr);
    else
        snprintf(buf, n, "%s to %.3g", name, p->min_lr);
    return buf;
}
