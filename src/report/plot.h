/*
 * plot.h - `fsdp plot`: draw a metrics file (JSON Lines written by `fsdp
 * train --log`) as one self-contained SVG: loss, tokens/s and each
 * device's peak memory over steps.
 *
 * Each non-blank line must be a JSON object with numbers "step" and
 * "loss"; "tokens_per_s" (number) and "peak_bytes" (array of numbers, one
 * per device) are drawn when present. Lines are taken in file order.
 */
#ifndef FSDP_REPORT_PLOT_H
#define FSDP_REPORT_PLOT_H

#include "core/error.h"

typedef struct fsdp_plot_info {
    int n_steps;     /* metrics lines read */
    int n_devices;   /* longest peak_bytes array */
} fsdp_plot_info;

/* Read metrics_path, write svg_path. Errors: IO (cannot read or write,
 * naming the path), FORMAT (a line is not JSON or lacks step/loss, naming
 * the line; an empty file), OOM. On error no SVG is left behind. */
fsdp_status fsdp_plot_metrics(const char *metrics_path, const char *svg_path, fsdp_plot_info *info);

#endif /* FSDP_REPORT_PLOT_H */
