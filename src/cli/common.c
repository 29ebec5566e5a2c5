/*
 * common.c - how every subcommand reports a usage error, a failed library
 * call and a failed write of its output, and checks that its outputs
 * spare its inputs (cli.h).
 */
#include <stdarg.h>
#include <stdio.h>

#include "cli/cli.h"
#include "device/cpu.h"

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

int fsdp_cli_check_paths(const char *cmd, const fsdp_path_arg *in, int n_in,
                         const fsdp_path_arg *out, int n_out)
{
    return fsdp_cli_status(cmd, fsdp_paths_check_disjoint(in, n_in, out, n_out));
}

void fsdp_cli_add_cpu_streams(fsdp_opt_list *l, int *mode)
{
    fsdp_opt_add_name(l, "cpu-streams", mode, &fsdp_cpu_streams_names,
                      "cpu: how each device's compute, comm and copy streams run (default "
                      "inline, or FSDP_CPU_STREAMS; FSDP_CPU_STREAM_JITTER=SEED delays async "
                      "work at random); both give the same bits");
}

int fsdp_cli_cpu_streams_finish(const char *cmd, int mode, fsdp_backend backend)
{
    if (mode != FSDP_CPU_STREAMS_DEFAULT && backend != FSDP_BACKEND_CPU)
        return fsdp_cli_usage(cmd, "--cpu-streams sets the cpu backend's streams; a %s device "
                              "has its own (leave it out with --backend %s)",
                              fsdp_backend_name(backend), fsdp_backend_name(backend));
    fsdp_cpu_streams m;
    uint64_t seed;
    fsdp_device_cpu_set_streams((fsdp_cpu_streams)mode, 0);
    if (fsdp_device_cpu_get_streams(&m, &seed) != FSDP_STATUS_OK)
        return fsdp_cli_usage(cmd, "%s", fsdp_error_msg());
    return 0;
}
