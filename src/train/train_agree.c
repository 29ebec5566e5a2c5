/*
 * train_agree.c - the settings of a training run that every process of its
 * job must give alike (train_internal.h), checked once the processes have met and
 * before anything they do together depends on them.
 *
 * A setting belongs here when a process that differs would compute other
 * values on its ranks (model, data, seed, schedule, optimizer, precision)
 * or issue other collectives than its peers (steps, evaluation, sharding,
 * prefetch, checkpoints, resume), which ends in silently wrong results or
 * in a wait for a collective that never comes. Settings that stay with one
 * process are not compared: --log, --quiet and --ckpt-keep are process 0's
 * (it writes the metrics and prunes checkpoints), --trace, --device-mem,
 * --threads-per-device and --cpu-streams each process's own
 * (results do not depend on them); --devices and --nodes are checked where
 * the processes meet (comm/procs.c, cli/run_opts.c). docs/errors.md lists
 * them.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/transport.h"
#include "train/job.h"
#include "train/schedule.h"
#include "train/train_internal.h"

#define MAX_SETTINGS 64

/* The settings being listed: flags and values, the numbers formatted into
 * num[] and the optimizers' flags into flag[] (strings of the configuration
 * are pointed to, not copied). */
struct settings {
    fsdp_job_setting s[MAX_SETTINGS];
    char num[MAX_SETTINGS][64];
    char flag[MAX_SETTINGS][40];
    int n;
};

static void add_str(struct settings *l, const char *flag, const char *shown, const char *key)
{
    FSDP_ASSERT(l->n < MAX_SETTINGS);
    l->s[l->n++] = (fsdp_job_setting){flag, shown, key};
}

static void add_num(struct settings *l, const char *flag, const char *fmt, double v)
{
    FSDP_ASSERT(l->n < MAX_SETTINGS);
    snprintf(l->num[l->n], sizeof l->num[l->n], fmt, v);
    add_str(l, flag, l->num[l->n], NULL);
}

/* A float as the shortest text that reads back as the same float (0.01,
 * not 0.00999999978): what the user typed, and still exact. */
static void add_float(struct settings *l, const char *flag, float v)
{
    FSDP_ASSERT(l->n < MAX_SETTINGS);
    char *buf = l->num[l->n];
    for (int digits = 6; digits <= 9; digits++) {
        snprintf(buf, sizeof l->num[0], "%.*g", digits, (double)v);
        if (strtof(buf, NULL) == v)
            break;
    }
    add_str(l, flag, buf, NULL);
}

/* --model: what is compared is the model the family builds (its canonical
 * config) and whether its weights come from a file, not how it was
 * spelled ("tiny" or its config). */
static void add_model(struct settings *l, const struct trainer *t, char *key, size_t n)
{
    snprintf(key, n, "%s:%s%s", t->model.family->name, t->model.config,
             t->mf ? " (weights from a file)" : "");
    add_str(l, "--model", t->cfg->model, key);
}

/* The optimizer and its hyper-parameters as the run resolved them. */
static void add_optimizer(struct settings *l, const fsdp_engine_config *ec)
{
    const fsdp_optim *o = ec->optim ? ec->optim : fsdp_optim_at(0);
    fsdp_optim_hparams hp;
    fsdp_optim_hparams_resolve(o, &ec->optim_hp, &hp);
    add_str(l, "--optimizer", o->name, NULL);
    for (int i = 0; i < o->n_hparams; i++) {
        char *flag = l->flag[l->n];
        snprintf(flag, sizeof l->flag[0], "--%s", o->hparams[i].name);
        add_float(l, flag, hp.v[i]);
    }
    add_float(l, "--wd", hp.weight_decay);
}

fsdp_status fsdp_trainer_agree(struct trainer *t)
{
    const fsdp_train_config *cfg = t->cfg;
    const fsdp_engine_config *ec = &cfg->eng;
    if (!cfg->procs || cfg->procs->n_processes == 1)
        return FSDP_STATUS_OK;
    struct settings l = {.n = 0};
    char model_key[FSDP_MODEL_NAME_MAX + 32];
    add_model(&l, t, model_key, sizeof model_key);
    add_str(&l, "--data", cfg->data ? cfg->data : "", NULL);
    add_str(&l, "--tokenizer", cfg->tokenizer ? cfg->tokenizer : "(none)", NULL);
    add_str(&l, "--chat-format", cfg->chat_format ? cfg->chat_format : "(the tokenizer's)",
            NULL);
    add_num(&l, "--seq", "%.0f", ec->seq);
    add_num(&l, "--batch", "%.0f", ec->batch);
    add_num(&l, "--grad-accum", "%.0f", ec->grad_accum);
    add_num(&l, "--steps", "%.0f", cfg->steps); /* --epochs' too: the data decided them */
    add_str(&l, "--pack", t->data && fsdp_data_packed(t->data) ? "on" : "off", NULL);
    add_num(&l, "--eval", "%.0f", cfg->eval_problems);
    snprintf(l.num[l.n], sizeof l.num[0], "%" PRIu64, ec->seed);
    add_str(&l, "--seed", l.num[l.n], NULL);
    add_float(&l, "--lr", cfg->lr);
    add_num(&l, "--warmup", "%.0f", cfg->warmup);
    add_str(&l, "--schedule", fsdp_names_name(&fsdp_lr_schedule_names, cfg->schedule), NULL);
    add_float(&l, "--min-lr", cfg->min_lr >= 0 ? cfg->min_lr : cfg->lr * cfg->lr_min_frac);
    add_float(&l, "--decay-frac", cfg->decay_frac);
    add_str(&l, "--eval-data", cfg->eval_data ? cfg->eval_data : "(none)", NULL);
    add_num(&l, "--eval-every", "%.0f", cfg->eval_every);
    add_num(&l, "--eval-steps", "%.0f", cfg->eval_steps);
    add_str(&l, "--keep-best", cfg->keep_best ? "on" : "off", NULL);
    add_num(&l, "--early-stop", "%.0f", cfg->early_stop);
    add_float(&l, "--clip", ec->clip);
    add_optimizer(&l, ec);
    add_str(&l, "--on-nonfinite", ec->skip_nonfinite ? "skip" : "stop", NULL);
    add_str(&l, "--backend", fsdp_backend_name(ec->backend), NULL);
    add_str(&l, "--comm", fsdp_names_name(&fsdp_comm_kind_names, (int)ec->comm), NULL);
    add_num(&l, "--ranks-per-device", "%.0f", ec->ranks_per_device);
    add_str(&l, "--shard", fsdp_shard_strategy_name(ec->shard), NULL);
    add_str(&l, "--precision", fsdp_dtype_name(ec->compute_dtype), NULL);
    add_str(&l, "--offload", fsdp_names_name(&fsdp_offload_names, fsdp_offload_value(ec)), NULL);
    add_str(&l, "--prefetch", ec->prefetch ? "on" : "off", NULL);
    add_str(&l, "--recompute", fsdp_names_name(&fsdp_recompute_names, (int)ec->recompute), NULL);
    add_str(&l, "--accum", fsdp_names_name(&fsdp_accum_names, (int)ec->accum), NULL);
    add_str(&l, "--deterministic", ec->deterministic ? "on" : "off", NULL);
    /* the directory itself is checked to be one they share (fsdp_job_dir_shared) */
    add_str(&l, "--ckpt-dir", cfg->ckpt_dir ? cfg->ckpt_dir : "(none)",
            cfg->ckpt_dir ? "set" : "none");
    add_num(&l, "--ckpt-every", "%.0f", cfg->ckpt_every);
    add_str(&l, "--resume", cfg->resume ? "on" : "off", NULL);
    add_str(&l, "--allow-batch-change", cfg->allow_batch_change ? "on" : "off", NULL);
    return fsdp_job_same_settings(cfg->procs, t->world, l.s, l.n);
}
