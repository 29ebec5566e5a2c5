/*
 * plot.c - `fsdp plot METRICS.jsonl OUT.svg [--loss-scale linear|log]`: the
 * training loss, learning rate, gradient norm, held-out loss, tokens/s and
 * per-device peak memory over steps as one self-contained SVG, with a mark
 * where a run resumed (report/plot.h). Exit 1 for unreadable or malformed
 * metrics or an SVG that cannot be written, 2 for usage (including OUT
 * naming METRICS).
 */
#include <stdio.h>

#include "cli/args.h"
#include "cli/cli.h"
#include "report/plot.h"

int fsdp_cli_plot(int argc, char **argv)
{
    static const char *const synopsis = "METRICS.jsonl OUT.svg [--loss-scale linear|log]   "
                                        "(METRICS from fsdp train --log)";
    int scale = FSDP_PLOT_LINEAR;
    fsdp_opt_list l = {0};
    fsdp_opt_add_name(&l, "loss-scale", &scale, &fsdp_plot_scale_names,
                      "the axis of the training and held-out loss panels");
    const char *pos[2];
    int n_pos = 0;
    int rc = fsdp_args_parse("plot", synopsis, l.v, l.n, argc, argv, pos, 2, &n_pos);
    if (rc != FSDP_ARGS_OK)
        return rc;
    if (n_pos != 2)
        return fsdp_cli_usage("plot", "usage: fsdp plot %s", synopsis);
    fsdp_plot_opts opts = {.loss_scale = (fsdp_plot_scale)scale};
    fsdp_plot_info info;
    fsdp_status st = fsdp_plot_metrics_with(pos[0], pos[1], &opts, &info);
    if (st != FSDP_STATUS_OK) /* a bad metrics file is 1; the output path naming the input, 2 */
        return fsdp_cli_status("plot", st);
    if (info.skipped_last_line)
        fprintf(stderr, "fsdp plot: note: the last line of %s is incomplete (a run still "
                        "writing it, or one cut short) and was left out\n", pos[0]);
    printf("%s: %d step(s), %d device(s)", pos[0], info.n_steps, info.n_devices);
    if (info.n_resumes)
        printf(", %d resume(s) marked", info.n_resumes);
    printf(" -> %s\n", pos[1]);
    return fsdp_cli_flush("plot");
}
