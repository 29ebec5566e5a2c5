/*
 * infer_opts.h - the options `fsdp eval` and `fsdp sample` share: the
 * model file and where it runs (backend, devices, precision, memory cap).
 */
#ifndef FSDP_CLI_INFER_OPTS_H
#define FSDP_CLI_INFER_OPTS_H

#include "cli/args.h"
#include "train/infer.h"

typedef struct fsdp_infer_opts {
    fsdp_infer_config cfg;
    const char *backend, *precision;
    int devices;
} fsdp_infer_opts;

/* Defaults, and the shared entries appended to l. */
void fsdp_infer_opts_table(fsdp_infer_opts *io, fsdp_opt_list *l);

/* Check --model and turn the strings into the config. Returns 0, or 2
 * after printing a usage error. */
int fsdp_infer_opts_finish(const char *cmd, fsdp_infer_opts *io);

#endif /* FSDP_CLI_INFER_OPTS_H */
