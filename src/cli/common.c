/*
 * common.c - how every subcommand reports a usage error, a failed library
 * call and a failed write of its output (cli.h).
 */
#include <stdarg.h>
#include <stdio.h>

#include "cli/cli.h"

int fsdp_cli_usage(const char *cmd, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "fsdp %s: ", cmd);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return 2;
}

int fsdp_cli_status(const char *cmd, fsdp_status st)
{
    if (st == FSDP_STATUS_OK)
        return 0;
    fprintf(stderr, "fsdp %s: error: %s\n", cmd, fsdp_error_msg());
    return st == FSDP_STATUS_INVALID_ARG ? 2 : 1;
}

int fsdp_cli_flush(const char *cmd)
{
    if (fflush(stdout) == 0 && !ferror(stdout))
        return 0;
    fprintf(stderr, "fsdp %s: error: could not write the output (disk full or pipe closed?)\n",
            cmd);
    return 1;
}
