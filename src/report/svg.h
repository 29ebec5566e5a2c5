/*
 * svg.h - a tiny SVG writer for fsdp's own charts (`fsdp plot`, `fsdp plan
 * --svg`): rectangles, lines, polylines, escaped text, and axes with
 * "nice" ticks. The output is one self-contained file (no scripts, no
 * external fonts or styles), readable in any browser or rsvg-convert.
 *
 * Coordinates are SVG user units (pixels at 100%), y grows downwards. A
 * panel maps a data range onto a rectangle, y growing upwards.
 *
 * Write errors are sticky: drawing calls never fail, fsdp_svg_close
 * reports the first one.
 */
#ifndef FSDP_REPORT_SVG_H
#define FSDP_REPORT_SVG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "core/error.h"
#include "core/fileio.h"

typedef struct fsdp_svg {
    FILE *f;                /* where drawing calls write */
    fsdp_atomic_file af;    /* fsdp_svg_open's file; unused after fsdp_svg_begin */
    bool own;               /* f belongs to af (opened by fsdp_svg_open) */
    double width, height;
} fsdp_svg;

/* Create `path` through the atomic writer (core/fileio.h: nothing at the
 * path changes until fsdp_svg_close succeeds; a device node, FIFO or
 * directory there is refused) and write the header and a white background;
 * `title` is the document's <title> (may be NULL). */
fsdp_status fsdp_svg_open(fsdp_svg *s, const char *path, double width, double height,
                          const char *title);
/* Write the closing tag and finish the file: with keep, commit it (IO if
 * any write failed: the path then holds what it held before); without keep
 * (error paths of the caller) drop it and return OK. */
fsdp_status fsdp_svg_close(fsdp_svg *s, bool keep);

/* The same document written to a stream the caller owns (a memory stream,
 * a pipe, a test's /dev/null): begin writes the header, end the closing tag
 * and returns IO if the stream has an error; neither closes f. */
void fsdp_svg_begin(fsdp_svg *s, FILE *f, double width, double height, const char *title);
fsdp_status fsdp_svg_end(fsdp_svg *s);

/* Filled rectangle; tooltip (may be NULL) becomes a <title> child, shown on
 * hover in browsers. */
void fsdp_svg_rect(fsdp_svg *s, double x, double y, double w, double h, const char *fill,
                   const char *stroke, const char *tooltip);
/* dash: NULL for solid, else an SVG dash array ("4 3"). */
void fsdp_svg_line(fsdp_svg *s, double x1, double y1, double x2, double y2, const char *stroke,
                   double width, const char *dash);
/* Open polyline through n points (n >= 1; a non-finite coordinate splits
 * the line into separate pieces, a piece of one point is a dot). */
void fsdp_svg_polyline(fsdp_svg *s, const double *x, const double *y, size_t n,
                       const char *stroke, double width);
/* Text at (x, y) (baseline); anchor: "start", "middle" or "end"; rotate:
 * degrees around (x, y) (0 for none). The text is XML-escaped. */
void fsdp_svg_text(fsdp_svg *s, double x, double y, double size, const char *anchor,
                   double rotate, const char *fill, const char *fmt, ...)
    __attribute__((format(printf, 8, 9)));

/* Write text with &, <, >, " and ' escaped (for callers composing markup). */
void fsdp_svg_escape(FILE *f, const char *text);

/* Extend [*lo, *hi] to multiples of a "nice" step (1, 2, 2.5 or 5 times a
 * power of ten) giving about `target` intervals; returns the step. An
 * empty or inverted range is widened first, a non-finite one becomes
 * [0, 1], and one wider than the doubles can subtract is clipped to
 * [-1e300, 1e300], so every result is finite and *lo < *hi. */
double fsdp_svg_nice_range(double *lo, double *hi, int target);

typedef struct fsdp_svg_panel {
    double x, y, w, h;        /* plot area (inside the axes) */
    double x_lo, x_hi;        /* data range shown */
    double y_lo, y_hi;
    double x_step, y_step;    /* tick spacing (0: choose) */
} fsdp_svg_panel;

double fsdp_svg_px(const fsdp_svg_panel *p, double x);
double fsdp_svg_py(const fsdp_svg_panel *p, double y);

/* Tick label formatter: write the label of value v into buf. */
typedef void (*fsdp_svg_fmt)(char *buf, size_t n, double v);
void fsdp_svg_fmt_num(char *buf, size_t n, double v); /* %g; from 1e4 on k/M/G, 4 digits */

/* Draw the panel's frame, grid lines, ticks with labels on both axes, the
 * title above and the axis labels (y rotated). Call after the data range
 * is final (see fsdp_svg_nice_range). NULL formatters use fsdp_svg_fmt_num. */
void fsdp_svg_axes(fsdp_svg *s, const fsdp_svg_panel *p, const char *title, const char *xlabel,
                   const char *ylabel, fsdp_svg_fmt xfmt, fsdp_svg_fmt yfmt);

/* Binary unit for a byte axis whose largest value is max: sets *unit_bytes
 * (1, 2^10, 2^20, 2^30 or 2^40) and returns its name ("GiB"). */
const char *fsdp_svg_byte_unit(double max, double *unit_bytes);

/* A palette of distinguishable colours (cycled). */
const char *fsdp_svg_color(int i);

#endif /* FSDP_REPORT_SVG_H */
