/*
 * plot.c - `fsdp plot METRICS.jsonl OUT.svg`: loss, tokens/s and
 * per-device peak memory over steps as one self-contained SVG
 * (report/plot.h). Exit 1 for unreadable or malformed metrics or an SVG
 * that cannot be written, 2 for usage (including OUT naming METRICS).
 */
#include <stdio.h>

#include "cli/args.h"
#include "cli/cli.h"
#include "report/plot.h"

int fsdp_cli_plot(int argc, char **argv)
{
    static const char *const synopsis = "METRICS.jsonl OUT.svg   (METRICS from fsdp train --log)";
    const char *pos[2];
    int n_pos = 0;
    int rc = fsdp_args_parse("plot", synopsis, NULL, 0, argc, argv, pos, 2, &n_pos);
    if (rc != FSDP_ARGS_OK)
        return rc;
    if (n_pos != 2)
        return fsdp_cli_usage("plot", "usage: fsdp plot %s", synopsis);
    fsdp_plot_info info;
    fsdp_status st = fsdp_plot_metrics(pos[0], pos[1], &info);
    if (st != FSDP_STATUS_OK) /* a bad metrics file is 1; the output path naming the input, 2 */
        return fsdp_cli_status("plot", st);
    if (info.skipped_last_line)
        fprintf(stderr, "fsdp plot: note: the last line of %s is incomplete (a run still "
                        "writing it, or one cut short) and was left out\n", pos[0]);
    printf("%s: %d step(s), %d device(s) -> %s\n", pos[0], info.n_steps, info.n_devices, pos[1]);
    return fsdp_cli_flush("plot");
}
