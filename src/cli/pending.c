/*
 * pending.c - subcommands that are not available yet. Each moves to its own
 * file when its issue lands.
 */
#include <stdio.h>

#include "cli/cli.h"

int fsdp_cli_not_yet(const char *name)
{
    fprintf(stderr, "fsdp %s: not yet available in this version\n", name);
    return 2;
}

int fsdp_cli_eval(int argc, char **argv) { (void)argc; (void)argv; return fsdp_cli_not_yet("eval"); }
int fsdp_cli_sample(int argc, char **argv) { (void)argc; (void)argv; return fsdp_cli_not_yet("sample"); }
int fsdp_cli_convert(int argc, char **argv) { (void)argc; (void)argv; return fsdp_cli_not_yet("convert"); }
