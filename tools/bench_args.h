/*
 * bench_args.h - the benchmarks' command lines: a tool names its options
 * in a table (name, kind, where the value goes) and bench_args_parse reads
 * argv against it, so an option is spelled once and no tool repeats a
 * chain of comparisons. Header-only, like bench_run.h.
 */
#ifndef FSDP_TOOLS_BENCH_ARGS_H
#define FSDP_TOOLS_BENCH_ARGS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

typedef enum {
    BENCH_ARG_INT,  /* int *: atoi of the next argument */
    BENCH_ARG_STR,  /* const char **: the next argument itself */
    BENCH_ARG_FLAG, /* bool *: set, no value */
} bench_arg_kind;

typedef struct bench_arg {
    const char *name; /* "--steps" */
    bench_arg_kind kind;
    void *to;
} bench_arg;

#define BENCH_INT(name, p) {name, BENCH_ARG_INT, (int *)(p)}
#define BENCH_STR(name, p) {name, BENCH_ARG_STR, (const char **)(p)}
#define BENCH_FLAG(name, p) {name, BENCH_ARG_FLAG, (bool *)(p)}

/* Read argv[1 .. argc) against args[0 .. n). False at the first argument
 * that is not an option of the table or lacks its value: the caller
 * prints its usage. Values are not checked here (the tool checks ranges). */
static inline bool bench_args_parse(int argc, char **argv, const bench_arg *args, size_t n)
{
    for (int i = 1; i < argc; i++) {
        const bench_arg *o = NULL;
        for (size_t k = 0; k < n && !o; k++)
            if (!strcmp(argv[i], args[k].name))
                o = &args[k];
        if (!o)
            return false;
        if (o->kind == BENCH_ARG_FLAG) {
            *(bool *)o->to = true;
            continue;
        }
        if (i + 1 >= argc)
            return false;
        const char *v = argv[++i];
        if (o->kind == BENCH_ARG_INT)
            *(int *)o->to = atoi(v);
        else
            *(const char **)o->to = v;
    }
    return true;
}

#define BENCH_ARGS_PARSE(argc, argv, table) \
    bench_args_parse(argc, argv, table, sizeof(table) / sizeof((table)[0]))

#endif /* FSDP_TOOLS_BENCH_ARGS_H */
