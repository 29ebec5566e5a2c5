/*
 * plot.h - `fsdp plot`: draw a metrics file (JSON Lines written by `fsdp
 * train --log`) as one self-contained SVG of six panels over steps: the
 * training loss (linear or log scale), the learning rate, the gradient
 * norm, the held-out loss, tokens/s and each device's peak memory, with a
 * mark in each panel where a run resumed.
 *
 * Each non-blank line must be a JSON object with a finite number "step"
 * and a "loss" that is a number or null; "lr", "grad_norm", "eval_loss",
 * "tokens_per_s" (each a number or null) and "peak_bytes" (array of
 * numbers or nulls, one per device, at most FSDP_PLOT_MAX_DEVICES) are
 * drawn when present. null is how the trainer writes a non-finite value;
 * null and non-finite values leave a gap in their series. Lines are taken
 * in file order. A run resumed with --log appends to the file: its first
 * line says "resumed_from": S (a number), and a line whose step is not
 * above the line before it (a run resumed from a checkpoint older than the
 * last logged step, before that key existed) is taken as a resume too;
 * series break there and each panel marks the step. A last line without
 * its '\n' that is not valid JSON (a run still writing, or one cut short)
 * is skipped and counted in fsdp_plot_info.
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
#include "core/names.h"
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
    double *lr;             /* (n_steps,) the same */
    double *grad_norm;      /* (n_steps,) the same */
    double *eval_loss;      /* (n_steps,) the same (lines without an evaluation: missing) */
    bool *resumed;          /* (n_steps,) a run resumed at this line (see above) */
    int n_resumes;          /* lines with resumed set */
    int *peak_first;        /* (n_steps + 1,) line i's peaks: peak[peak_first[i] .. [i + 1]) */
    double *peak;           /* (peak_first[n_steps],) bytes per device, NaN where null */
} fsdp_metrics;

/* Read a metrics file. Errors: IO (cannot open or read, or not a regular
 * file, naming the path), FORMAT (a line is not JSON or lacks step/loss,
 * naming the line; a line or the file over its limit, naming the limit;
 * no metrics lines), OOM. On error *m is empty (free is still safe). */
fsdp_status fsdp_metrics_read(const char *path, fsdp_metrics *m);
void fsdp_metrics_free(fsdp_metrics *m);

/* How the losses' axes are scaled (--loss-scale). */
typedef enum fsdp_plot_scale {
    FSDP_PLOT_LINEAR = 0,
    FSDP_PLOT_LOG,   /* log10; values <= 0 leave a gap */
} fsdp_plot_scale;
extern const fsdp_name_table fsdp_plot_scale_names;

typedef struct fsdp_plot_opts {
    fsdp_plot_scale loss_scale; /* the training and held-out loss panels */
} fsdp_plot_opts;

/* Draw m as an SVG document into f (not closed); title heads the chart;
 * opts NULL: the defaults (zeros). IO if writing to f failed, OOM. */
fsdp_status fsdp_metrics_write_svg_with(const fsdp_metrics *m, const char *title,
                                        const fsdp_plot_opts *opts, FILE *f);
/* The same with the defaults. */
fsdp_status fsdp_metrics_write_svg(const fsdp_metrics *m, const char *title, FILE *f);

typedef struct fsdp_plot_info {
    int n_steps;            /* metrics lines read */
    int n_devices;          /* longest peak_bytes array */
    bool skipped_last_line; /* an incomplete last line was skipped (see above) */
    int n_resumes;          /* lines where a run resumed */
} fsdp_plot_info;

/* Read metrics_path, write svg_path through the atomic writer (whatever is
 * at svg_path stays as it was unless the whole SVG is written; a device
 * node, FIFO or directory there is refused, as is svg_path naming the
 * metrics file itself). Errors: those of fsdp_metrics_read, IO for the
 * SVG. */
fsdp_status fsdp_plot_metrics(const char *metrics_path, const char *svg_path, fsdp_plot_info *info);
/* The same, drawn with opts (NULL: the defaults). */
fsdp_status fsdp_plot_metrics_with(const char *metrics_path, const char *svg_path,
                                   const fsdp_plot_opts *opts, fsdp_plot_info *info);

#endif /* FSDP_REPORT_PLOT_H */
