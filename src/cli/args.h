/*
 * args.h - a table-driven parser for the subcommands' long options.
 *
 * Each option names a destination and a type; "--name value" and
 * "--name=value" both work; sizes take suffixes (24GiB, 512M). --help
 * prints the table. The parser never exits: it returns what main should.
 */
#ifndef FSDP_CLI_ARGS_H
#define FSDP_CLI_ARGS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum fsdp_opt_type {
    FSDP_OPT_INT,    /* int */
    FSDP_OPT_U64,    /* uint64_t */
    FSDP_OPT_FLOAT,  /* float */
    FSDP_OPT_SIZE,   /* size_t bytes, with suffixes */
    FSDP_OPT_STR,    /* const char * (points into argv) */
    FSDP_OPT_FLAG,   /* bool, takes no value */
} fsdp_opt_type;

typedef struct fsdp_opt {
    const char *name;    /* without the leading "--" */
    fsdp_opt_type type;
    void *dst;
    const char *metavar; /* shown in --help, e.g. "N" or "cpu|cuda|meta" */
    const char *help;
    bool seen;           /* set by the parser */
} fsdp_opt;

enum { FSDP_ARGS_OK = -1 };

/* Parse argv[1..argc) (argv[0] = the subcommand). Positional arguments are
 * stored in pos[0..max_pos) and counted in *n_pos (NULL: none allowed).
 * Returns FSDP_ARGS_OK, or the exit code to return: 0 after --help, 2 after
 * a usage error (message already printed to stderr). */
int fsdp_args_parse(const char *cmd, const char *synopsis, fsdp_opt *opts, int n_opts, int argc,
                    char **argv, const char **pos, int max_pos, int *n_pos);

/* Print the option table (used by --help). */
void fsdp_args_help(const char *cmd, const char *synopsis, const fsdp_opt *opts, int n_opts);

/* Index of the option named `name`, or -1. */
int fsdp_args_find(const fsdp_opt *opts, int n_opts, const char *name);

#endif /* FSDP_CLI_ARGS_H */
