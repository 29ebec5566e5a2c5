/*
 * args.h - a table-driven parser for the subcommands' long options.
 *
 * Each option names a destination and a type; "--name value" and
 * "--name=value" both work; sizes take suffixes (24GiB, 512M); integers
 * may carry a range; a choice among names (--shard full|grad-op|none) reads
 * a name table (core/names.h), so its parsing, its error message, its
 * metavar, its default and its per-value help in --help all come from the
 * one table. The parser never exits: it returns what main should.
 *
 * Options are listed with the fsdp_opt_add* builders into an
 * fsdp_opt_list (or written as a static fsdp_opt array).
 */
#ifndef FSDP_CLI_ARGS_H
#define FSDP_CLI_ARGS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/names.h"

typedef enum fsdp_opt_type {
    FSDP_OPT_INT,    /* int; within [lo, hi] when hi > lo */
    FSDP_OPT_U64,    /* uint64_t, digits only (no sign, no space) */
    FSDP_OPT_FLOAT,  /* float, finite; within [flo, fhi] (or (flo, fhi]) when fhi > flo */
    FSDP_OPT_SIZE,   /* size_t bytes, with suffixes; at least 1 */
    FSDP_OPT_STR,    /* const char * (points into argv) */
    FSDP_OPT_FLAG,   /* bool, takes no value */
    FSDP_OPT_NAME,   /* int: the value of one name of `names` */
} fsdp_opt_type;

typedef struct fsdp_opt {
    const char *name;    /* without the leading "--" */
    fsdp_opt_type type;
    void *dst;
    const char *metavar; /* shown in --help, e.g. "N"; NAME options: from the table */
    const char *help;
    const fsdp_name_table *names; /* FSDP_OPT_NAME: the values */
    unsigned allow;      /* FSDP_OPT_NAME: FSDP_NAME_BIT mask of accepted values, 0 = all */
    long lo, hi;         /* FSDP_OPT_INT: the accepted range, when hi > lo */
    double flo, fhi;     /* FSDP_OPT_FLOAT: the accepted range, when fhi > flo */
    bool flo_open;       /* FSDP_OPT_FLOAT: flo itself is refused (> flo) */
    bool seen;           /* set by the parser */
} fsdp_opt;

enum { FSDP_ARGS_OK = -1 };

/* Parse argv[1..argc) (argv[0] = the subcommand). Positional arguments are
 * stored in pos[0..max_pos) and counted in *n_pos (NULL: none allowed).
 * Returns FSDP_ARGS_OK, or the exit code to return: 0 after --help, 2 after
 * a usage error (message already printed to stderr). */
int fsdp_args_parse(const char *cmd, const char *synopsis, fsdp_opt *opts, int n_opts, int argc,
                    char **argv, const char **pos, int max_pos, int *n_pos);

/* Print the option table to stdout (used by --help). A NAME option shows
 * its values as the metavar, its current value as the default, and one
 * line per value that has help. */
void fsdp_args_help(const char *cmd, const char *synopsis, const fsdp_opt *opts, int n_opts);

/* Index of the option named `name`, or -1. */
int fsdp_args_find(const fsdp_opt *opts, int n_opts, const char *name);

/* ---- building an option list ------------------------------------------------ */

#define FSDP_OPT_LIST_MAX 80

typedef struct fsdp_opt_list {
    fsdp_opt v[FSDP_OPT_LIST_MAX];
    int n;
} fsdp_opt_list;

/* Append an option and return it (asserts there is room: the capacity is a
 * property of the program, not of the input). */
fsdp_opt *fsdp_opt_add(fsdp_opt_list *l, const char *name, fsdp_opt_type type, void *dst,
                       const char *metavar, const char *help);
/* An int option accepted in [lo, hi]. */
fsdp_opt *fsdp_opt_add_int(fsdp_opt_list *l, const char *name, int *dst, long lo, long hi,
                           const char *metavar, const char *help);
/* A float option accepted in [lo, hi], or (lo, hi] when lo_open. */
fsdp_opt *fsdp_opt_add_float(fsdp_opt_list *l, const char *name, float *dst, double lo,
                             bool lo_open, double hi, const char *metavar, const char *help);
/* A choice among the names of t; *dst holds the value (and, before
 * parsing, the default that --help shows). */
fsdp_opt *fsdp_opt_add_name(fsdp_opt_list *l, const char *name, int *dst,
                            const fsdp_name_table *t, const char *help);
/* Drop the option named `name`, if listed. */
void fsdp_opt_remove(fsdp_opt_list *l, const char *name);
/* The option named `name`, or NULL. */
fsdp_opt *fsdp_opt_get(fsdp_opt_list *l, const char *name);

#endif /* FSDP_CLI_ARGS_H */
