/*
 * run_opts.h - the options `fsdp train` and `fsdp plan` share (model,
 * batch, devices, sharding, precision, offload...), as one option table
 * fragment and one validation step that fills a fsdp_train_config.
 */
#ifndef FSDP_CLI_RUN_OPTS_H
#define FSDP_CLI_RUN_OPTS_H

#include "cli/args.h"
#include "train/train.h"

typedef struct fsdp_run_opts {
    fsdp_train_config cfg;
    const char *backend, *shard, *precision, *offload, *prefetch, *comm, *optimizer;
    int devices;
} fsdp_run_opts;

#define FSDP_RUN_OPTS_MAX 48

/* Defaults, and the shared option entries appended to opts (returns count). */
int fsdp_run_opts_table(fsdp_run_opts *ro, fsdp_opt *opts);

/* Turn the strings into the config; checks combinations. Returns 0 or 2
 * (usage error, message printed). */
int fsdp_run_opts_finish(const char *cmd, fsdp_run_opts *ro);

#endif /* FSDP_CLI_RUN_OPTS_H */
