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

