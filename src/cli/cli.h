/*
 * cli.h - the subcommands of the fsdp command, and the few helpers they
 * share to report errors and exit codes the same way.
 *
 * Each subcommand takes argv with argv[0] = the subcommand name and returns
 * the process exit code: 0 ok, 1 runtime error, 2 usage error.
 */
#ifndef FSDP_CLI_CLI_H
#define FSDP_CLI_CLI_H

#include <stdbool.h>

#include "cli/args.h"
#include "core/paths.h"
#include "fsdp/fsdp.h"

int fsdp_cli_train(int argc, char **argv);
int fsdp_cli_plan(int argc, char **argv);
int fsdp_cli_shardmap(int argc, char **argv);
int fsdp_cli_eval(int argc, char **argv);
int fsdp_cli_sample(int argc, char **argv);
int fsdp_cli_convert(int argc, char **argv);
int fsdp_cli_plot(int argc, char **argv);
int fsdp_cli_tokenize(int argc, char **argv);

/* The processes of the job this `fsdp` process belongs to (comm/procs.h),
 * met by main before a subcommand that runs ranks (train) starts; NULL:
 * a job of one process. */
struct fsdp_procs *fsdp_cli_procs(void);

/* ---- shared helpers (cli/common.c) ------------------------------------------ */

/* Print "fsdp <cmd>: <message>" to stderr; returns 2, the usage-error exit
 * code: `return fsdp_cli_usage(cmd, "--steps must be >= 1");`. */
int fsdp_cli_usage(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The exit code for a library status: 0 for OK; otherwise prints "fsdp
 * <cmd>: error: <the calling thread's fsdp_error_msg()>" and returns 2 for
 * INVALID_ARG (the user's input was wrong), else 1. */
int fsdp_cli_status(const char *cmd, fsdp_status st);

/* --cpu-streams inline|async into *mode (an fsdp_cpu_streams; left 0, the
 * environment's, when absent), for every command that runs a model. */
void fsdp_cli_add_cpu_streams(fsdp_opt_list *l, int *mode);
/* After parsing: 0, or a usage error (2, printed) when FSDP_CPU_STREAMS or
 * FSDP_CPU_STREAM_JITTER holds a bad value, or when --cpu-streams is given
 * with another backend than cpu. */
int fsdp_cli_cpu_streams_finish(const char *cmd, int mode, fsdp_backend backend);

/* Flush stdout: 0, or 1 after saying the output could not be written (a
 * full disk, a closed pipe). Call last, after everything was printed. */
int fsdp_cli_flush(const char *cmd);

/* What every subcommand that writes files checks before it reads or
 * writes anything: no output names a file an input or another output
 * names (core/paths.h). 0, or 2 after printing "fsdp <cmd>: error: ..."
 * naming both flags. */
int fsdp_cli_check_paths(const char *cmd, const fsdp_path_arg *in, int n_in,
                         const fsdp_path_arg *out, int n_out);

#endif /* FSDP_CLI_CLI_H */
