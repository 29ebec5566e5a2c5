/*
 * run_opts.h - the options `fsdp train` and `fsdp plan` share (model,
 * data, batch, devices, sharding, precision, offload...) with the same
 * defaults, as one option-list fragment and one validation step that fills
 * a fsdp_train_config.
 */
#ifndef FSDP_CLI_RUN_OPTS_H
#define FSDP_CLI_RUN_OPTS_H

#include "cli/args.h"
#include "train/train.h"

typedef struct fsdp_run_opts {
    fsdp_train_config cfg;
    /* name-table values, copied into cfg by fsdp_run_opts_finish */
    int backend, shard, precision, offload, prefetch, recompute, comm, accum;
    const char *optimizer; /* a name in the optimizer registry, or NULL: the default */
    float optim_flags[FSDP_OPTIM_MAX_FLAGS]; /* --NAME of fsdp_optim_flag_at(i); NAN: not given */
    int devices;           /* per node; -1: the backend's default */
    int nodes;             /* --nodes; 0: unset (the job's processes) */
    int n_processes;       /* the job's processes (set by the caller; <= 1: one) */
    float lora_alpha;      /* --lora-alpha; NAN: not given (2 x --lora) */
    const char *lora_targets; /* --lora-targets; NULL: PEFT's default for the family */
} fsdp_run_opts;

/* The --prefetch values (--shard's and --offload's are the engine's:
 * fsdp_shard_names in engine/shardmap.h, fsdp_offload_names in
 * engine/engine.h). */
extern const fsdp_name_table fsdp_prefetch_names;

/* Defaults, and the shared options appended to l. */
void fsdp_run_opts_table(fsdp_run_opts *ro, fsdp_opt_list *l);

/* The fragment of that list that says what a run trains of its --model: --lora,
 * --lora-alpha, --lora-targets, --rslora, --freeze and --quantize (also `fsdp shardmap`'s),
 * and its check: --lora's settings into cfg.lora (models/lora.h); 0, or 2 after a usage
 * error. */
void fsdp_run_opts_adapt_table(fsdp_run_opts *ro, fsdp_opt_list *l);
int fsdp_run_opts_adapt_finish(const char *cmd, fsdp_run_opts *ro);

/* Copy the choices into the config and check how they combine (backend
 * and device count, nodes and processes, transport, model and sequence
 * length, tokens per micro-batch). The job's ranks are --devices x nodes:
 * a job of several processes has one node per process (--nodes, if given,
 * must agree); one process may simulate --nodes nodes. Returns 0; 2 after
 * printing a usage error; 1 when the --model file cannot be read (a
 * runtime error, as for every command). */
int fsdp_run_opts_finish(const char *cmd, fsdp_run_opts *ro);

#endif /* FSDP_CLI_RUN_OPTS_H */
