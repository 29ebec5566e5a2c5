/*
 * The defaults of a training run (train.h): the demo's, which the command
 * line starts from, and the learning-rate plan a run's settings give.
 * Apart from the trainer, so that the planner's search (fit.c), which
 * builds runs too, does not call into the trainer that calls it, and so
 * that the trainer and its checkpoint half (train_ckpt.c) both read the
 * plan from below rather than from each other.
 */
#include <string.h>

#include "data/data.h"
#include "device/device.h"
#include "train/train_internal.h"

void fsdp_train_config_default(fsdp_train_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    fsdp_engine_config *e = &cfg->eng;
    e->backend = fsdp_backend_default();
    e->comm = FSDP_COMM_AUTO;
    e->n_ranks = fsdp_backend_default_devices(e->backend);
    e->ranks_per_device = 1;
    e->shard = FSDP_SHARD_FULL;
    e->compute_dtype = FSDP_DTYPE_F32;
    e->prefetch = true;
    e->batch = 16;  /* x 4 devices: 64 synthetic problems per step */
    e->seq = FSDP_SYNTH_ROW; /* one synthetic problem per row */
    e->grad_accum = 1;
    e->optim_hp.weight_decay = 0.1f; /* the optimizer's own: its defaults (optim/) */
    e->clip = 1.0f;
    e->seed = 1337;
    cfg->model = "small";
    cfg->data = "synthetic";
    cfg->steps = 600;
    cfg->lr = 3e-3f;
    cfg->warmup = 20;
    cfg->lr_min_frac = 0.1f;
    cfg->min_lr = -1.0f;
    cfg->decay_frac = 0.1f;
    cfg->eval_problems = 512;
    cfg->n_samples = 5;
    cfg->watchdog_s = -1; /* FSDP_WATCHDOG's (core/flight.h) */
    cfg->out = stdout;
}

fsdp_lr_plan fsdp_trainer_lr_plan(const fsdp_train_config *cfg)
{
    return (fsdp_lr_plan){.schedule = (fsdp_lr_schedule)cfg->schedule, .lr = cfg->lr,
                          .min_lr = cfg->min_lr >= 0 ? (double)cfg->min_lr
                                                     : (double)cfg->lr * (double)cfg->lr_min_frac,
                          .warmup = cfg->warmup, .steps = cfg->steps,
                          .decay_frac = cfg->decay_frac};
}

float fsdp_train_lr(const fsdp_train_config *cfg, int step)
{
    fsdp_lr_plan p = fsdp_trainer_lr_plan(cfg);
    return fsdp_lr_at(&p, step);
}
