/*
 * plot.h - `fsdp plot`: draw a metrics file (JSON Lines written by `fsdp
 * train --log`) as one self-contained SVG: loss, tokens/s and each
 * device's peak memory over steps.
 *
 * Each non-blank line must be a JSON object with a finite number "step"
 * and a "loss" that is a number or null; "tokens_per_s" (number or null)
 * and "peak_bytes" (array of numbers or nulls, one per device, at most
 * FSDP_PLOT_MAX_DEVICES) are drawn when present. null is how the trainer
 * writes a non-finite value; null and non-finite values leave a gap in
 * their series. Lines are taken in file order. A last line without its
 * '\n' that is not valid JSON (a run still writing, or one cut short) is
 * skipped and counted in fsdp_plot_info.
 *
 * The reader is bounded: one line at most FSDP_PLOT_MAX_LINE_BYTES, the
 * file at most FSDP_PLOT_MAX_FILE_BYTES, and only regular files are read
 * (a FIFO or /dev/zero is refused, never waited on). Memory stays within
 * a few times the file's size.
 */
#ifndef FSDP_REPORT_PLOT_H
#define FSDP_REPORT_PLOT_H

#include <stdbool.h>
#include <stdio.h>

#include "core/error.h"
#include "fsdp/fsdp.h"

#define FSDP_PLOT_MAX_LINE_BYTES ((size_t)1 << 20)     /* 1 MiB */
#define FSDP_PLOT_MAX_FILE_BYTES ((unsigned long long)1 << 30) /* 1 GiB */
#define FSDP_PLOT_MAX_DEVICES FSDP_MAX_RANKS

/* A metrics file in memory: one entry per metrics line. */
typedef struct fsdp_metrics {
    int n_steps;            /* metrics lines read */
    int n_devices;          /* longest peak_bytes array */
    bool skipped_last_line; /* an incomplete last line was skipped */
    double *step;           /* (n_steps,) finite */
    double *loss;           /* (n_steps,) NaN where null or non-finite */
    double *tokens_per_s;   /* (n_steps,) NaN where missing, null or non-finite */
    int *peak_first;        /* (n_steps + 1,) line i's peaks: peak[peak_first[i] .. [i + 1]) */
    double *peak;           /* (peak_first[n_steps],) bytes per device, NaN where null */
} fsdp_metrics;

/* Read a metrics file. Errors: IO (cannot open or read, or not a regular
 * file, naming the path), FORMAT (a line is not JSON or lacks step/loss,
 * naming the line; a line or the file over its limit, naming the limit;
 * no metrics lines), OOM. On error *m is empty (free is still safe). */
fsdp_status fsdp_metrics_read(const char *path, fsdp_metrics *m);
void fsdp_metrics_free(fsdp_metrics *m);

/* Draw m as an SVG document into f (not closed); title heads the chart.
 * IO if writing to f failed, OOM. */
fsdp_status fsdp_metrics_write_svg(const fsdp_metrics *m, const char *title, FILE *f);

typedef struct fsdp_plot_info {
    int n_steps;            /* metrics lines read */
    int n_devices;          /* longest peak_bytes array */
    bool skipped_last_line; /* an incomplete last line was skipped (see above) */
} fsdp_plot_info;

/* Read metrics_path, write svg_path through the atomic writer (whatever is
 * at svg_path stays as it was unless the whole SVG is written; a device
 * node, FIFO or directory there is refused, as is svg_path naming the
 * metrics file itself). Errors: those of fsdp_metrics_read, IO for the
 * SVG. */
fsdp_status fsdp_plot_metrics(const char *metrics_path, const char *svg_path, fsdp_plot_info *info);

#endif /* FSDP_REPORT_PLOT_H */
