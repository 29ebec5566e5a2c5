/*
 * main.c - the fsdp command: dispatches to subcommands.
 *
 * Exit codes: 0 ok, 1 runtime error, 2 usage error.
 */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"

static const struct {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *help;
} commands[] = {
    {"train", fsdp_cli_train, "train a model (sharded across devices)"},
    {"plan", fsdp_cli_plan, "per-device memory and traffic of a run, without running it"},
    {"shardmap", fsdp_cli_shardmap, "print how a model's units are sharded over N devices"},
    {"eval", fsdp_cli_eval, "mean loss of a model on a data set"},
    {"sample", fsdp_cli_sample, "generate tokens from a model"},
    {"convert", fsdp_cli_convert, "convert between checkpoints, llm.c .bin and .safetensors"},
    {"plot", fsdp_cli_plot, "draw a metrics file as an SVG"},
    {"tokenize", fsdp_cli_tokenize, "tokenize a text or .jsonl corpus into llm.c token shards"},
};

static void usage(FILE *f)
{
    fprintf(f, "usage: fsdp <command> [options]   (fsdp <command> --help for its options)\n\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-9s %s\n", commands[i].name, commands[i].help);
    fprintf(f, "\nWith no command-line options, 'fsdp train' trains a small GPT on a built-in\n"
               "synthetic task on 4 simulated devices.\n");
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name))
            return commands[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "fsdp: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}
