/*
 * plot.c - `fsdp plot`: metrics JSON Lines -> SVG with six panels in two
 * columns (training loss, learning rate, gradient norm; held-out loss,
 * tokens/s, per-device peak memory), each over the steps of the file
 * (plot.h).
 *
 * The file is read by plot_read.c (fsdp_metrics_read: an array per series,
 * one entry per line); the panels are laid out from those arrays. Values
 * that are missing, null or non-finite on a line leave a gap in their series,
 * except the held-out loss, measured every few steps, whose points are
 * joined across the lines without one. Where a run resumed, the lines of
 * the steps it ran again (those an interrupted run logged after the
 * checkpoint it resumed from) are drawn thin and grey, and each series
 * runs on from the checkpoint's step through the resumed run's lines.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/paths.h"
#include "report/plot.h"
#include "report/svg.h"

/* ---- drawing ------------------------------------------------------------------ */

static const fsdp_name plot_scale_names[] = {
    {"linear", FSDP_PLOT_LINEAR, NULL},
    {"log", FSDP_PLOT_LOG, "log10 axis, for losses that fall by orders of magnitude"},
};
const fsdp_name_table fsdp_plot_scale_names = FSDP_NAME_TABLE(plot_scale_names);

/* Layout, in SVG units: two columns of three panels (PANEL_W x PANEL_H)
 * below a header; each column keeps PLOT_RIGHT to the right of its panels
 * for legends. */
#define COL_W 620.0
#define PLOT_W (2 * COL_W)
#define PLOT_LEFT 92.0
#define PLOT_RIGHT 140.0
#define PANEL_W (COL_W - PLOT_LEFT - PLOT_RIGHT)
#define PLOT_TOP 84.0
#define PANEL_H 170.0
#define PANEL_GAP 78.0
#define PLOT_H (PLOT_TOP + 3 * PANEL_H + 2 * PANEL_GAP + 64.0)

#define RESUME_COLOR "#C0392B"

/* Peak of device d at line i, NaN when the line lists fewer devices. */
static double peak_at(const fsdp_metrics *m, int i, int d)
{
    int k = m->peak_first[i] + d;
    return k < m->peak_first[i + 1] ? m->peak[k] : NAN;
}

/* Every line lists every device and all devices' peaks are equal (then one
 * line stands for all). */
static bool peaks_all_equal(const fsdp_metrics *m)
{
    if (m->n_devices < 2)
        return false;
    for (int i = 0; i < m->n_steps; i++) {
        if (m->peak_first[i + 1] - m->peak_first[i] != m->n_devices)
            return false;
        double a = peak_at(m, i, 0);
        for (int d = 1; d < m->n_devices; d++) {
            double b = peak_at(m, i, d);
            if (!(a == b || (isnan(a) && isnan(b))))
                return false;
        }
    }
    return true;
}

/* What the panels draw from: the file, which of its lines a later resume
 * superseded, and scratch for the points of a line. */
struct chart {
    fsdp_svg *s;
    const fsdp_metrics *m;
    bool *stale;           /* (n_steps,) a later line resumed at or before this step */
    int n_stale;
    double *xs, *ys;       /* (n_steps,) */
    double *v;             /* (n_steps,) */
};

/* Mark the lines whose steps a later resume ran again: drawn in grey, and
 * not counted as steps (TensorBoard drops them too). */
static void mark_stale(struct chart *c)
{
    const fsdp_metrics *m = c->m;
    double resume_from = INFINITY; /* the lowest step a later resume starts at */
    c->n_stale = 0;
    for (int i = m->n_steps - 1; i >= 0; i--) {
        c->stale[i] = m->step[i] >= resume_from;
        c->n_stale += c->stale[i];
        if (m->resumed[i])
            resume_from = fmin(resume_from, m->step[i]);
    }
}

static void draw_summary(const struct chart *c, const char *title)
{
    const fsdp_metrics *m = c->m;
    int n = m->n_steps;
    double tok_mean = 0;
    int tok_n = 0;
    for (int i = 1; i < n; i++) /* the first step includes warm-up */
        if (isfinite(m->tokens_per_s[i]))
            tok_mean += (m->tokens_per_s[i] - tok_mean) / ++tok_n; /* stays finite */
    char loss[32], tk[32], resumes[160] = "";
    if (isfinite(m->loss[n - 1]))
        snprintf(loss, sizeof loss, "%.4g", m->loss[n - 1]);
    else
        snprintf(loss, sizeof loss, "null (not finite)");
    for (int i = 0, k = 0; i < n; i++) {
        if (!m->resumed[i])
            continue;
        size_t at = strlen(resumes);
        if (k == 3) {
            snprintf(resumes + at, sizeof resumes - at, " ...");
            break;
        }
        snprintf(resumes + at, sizeof resumes - at, "%s%g", k++ ? ", " : "; resumed at step ",
                 m->step[i]);
    }
    if (c->n_stale) {
        size_t at = strlen(resumes);
        snprintf(resumes + at, sizeof resumes - at, " (%d earlier line(s) of steps run again, "
                 "in grey)", c->n_stale);
    }
    int steps = n - c->n_stale;
    fsdp_svg_text(c->s, PLOT_LEFT, 24, 15, "start", 0, "black", "%s", title);
    if (tok_n) {
        fsdp_svg_fmt_num(tk, sizeof tk, round(tok_mean));
        fsdp_svg_text(c->s, PLOT_LEFT, 42, 11, "start", 0, "#444",
                      "%d steps; final loss %s; mean %s tokens/s after the first step; %d "
                      "device(s)%s", steps, loss, tk, m->n_devices, resumes);
    } else {
        fsdp_svg_text(c->s, PLOT_LEFT, 42, 11, "start", 0, "#444",
                      "%d step(s); final loss %s; %d device(s)%s", steps, loss, m->n_devices,
                      resumes);
    }
}

/* The frame of the panel in column col (0 left), row row (0 top), over the
 * steps' range. */
static fsdp_svg_panel panel_frame(const fsdp_metrics *m, int col, int row)
{
    fsdp_svg_panel p = {.x = col * COL_W + PLOT_LEFT, .y = PLOT_TOP + row * (PANEL_H + PANEL_GAP),
                        .w = PANEL_W, .h = PANEL_H};
    p.x_lo = p.x_hi = m->step[0];
    for (int i = 0; i < m->n_steps; i++) {
        p.x_lo = fmin(p.x_lo, m->step[i]);
        p.x_hi = fmax(p.x_hi, m->step[i]);
    }
    p.x_step = fsdp_svg_nice_range(&p.x_lo, &p.x_hi, 6);
    return p;
}

/* A log axis's ticks: the values m x 10^k, m in {1, 2, 5} when the range
 * spans at most three decades, else m = 1 and every `every`-th decade.
 * Tick i of those covering [lo, hi] (log10 values) at or below lo. */
struct log_ticks {
    bool fine;  /* 1, 2, 5 per decade */
    int every;  /* decades between ticks (coarse) */
};

static double log_tick(const struct log_ticks *t, long i)
{
    static const double mant[3] = {1, 2, 5};
    if (!t->fine)
        return (double)(i * t->every);
    long k = i >= 0 ? i / 3 : -((-i + 2) / 3);
    return (double)k + log10(mant[i - 3 * k]);
}

/* The index of the largest tick at or below v (a log10 value). */
static long log_tick_below(const struct log_ticks *t, double v)
{
    long i = t->fine ? (long)floor(v) * 3 : (long)floor(v / t->every);
    while (log_tick(t, i + 1) <= v + 1e-12)
        i++;
    while (log_tick(t, i) > v + 1e-12)
        i--;
    return i;
}

/* Set the panel's y range to [lo, hi] (widened to nice ticks; an empty
 * range becomes [0, 1]) and draw its axes. log: lo and hi are log10 of the
 * values; the range widens to the ticks around them and the ticks are
 * labelled with the values themselves. */
static void panel_axes(fsdp_svg *s, fsdp_svg_panel *p, double lo, double hi, bool log,
                       const char *title, const char *ylabel)
{
    if (!isfinite(lo) || !isfinite(hi)) { /* no values: an empty panel with a note */
        lo = 0;
        hi = 1;
    }
    if (!log) {
        p->y_lo = lo;
        p->y_hi = hi;
        p->y_step = fsdp_svg_nice_range(&p->y_lo, &p->y_hi, 5);
        fsdp_svg_axes(s, p, title, "step", ylabel, NULL, NULL);
        return;
    }
    struct log_ticks t = {.fine = hi - lo <= 3, .every = (int)ceil((hi - lo) / 6)};
    if (t.every < 1)
        t.every = 1;
    long first = log_tick_below(&t, lo), last = log_tick_below(&t, hi);
    if (log_tick(&t, last) < hi - 1e-12 || last == first)
        last++;
    p->y_lo = log_tick(&t, first);
    p->y_hi = log_tick(&t, last);
    p->y_step = 0; /* the ticks are drawn here, at uneven spacing */
    fsdp_svg_axes(s, p, title, "step", ylabel, NULL, NULL);
    for (long i = first; i <= last && i - first <= 40; i++) {
        double v = log_tick(&t, i), py = fsdp_svg_py(p, v);
        char lab[32];
        fsdp_svg_line(s, p->x, py, p->x + p->w, py, "#e3e3e3", 1, NULL);
        fsdp_svg_line(s, p->x - 4, py, p->x, py, "black", 1, NULL);
        snprintf(lab, sizeof lab, "%.3g", pow(10.0, v));
        fsdp_svg_text(s, p->x - 7, py + 11 * 0.35, 11, "end", 0, "black", "%s", lab);
    }
}

static void panel_note(fsdp_svg *s, const fsdp_svg_panel *p, const char *what)
{
    fsdp_svg_text(s, p->x + p->w / 2, p->y + p->h / 2, 12, "middle", 0, "#888",
                  "no %s in this file", what);
}

/* A dashed line across the panel at each line where a run resumed; the
 * first panel labels them. */
static void draw_resumes(const struct chart *c, const fsdp_svg_panel *p, bool label)
{
    const fsdp_metrics *m = c->m;
    for (int i = 0; i < m->n_steps; i++) {
        if (!m->resumed[i])
            continue;
        double x = fsdp_svg_px(p, m->step[i]);
        fsdp_svg_line(c->s, x, p->y, x, p->y + p->h, RESUME_COLOR, 1.2, "5,3");
        if (label)
            fsdp_svg_text(c->s, x + 3, p->y + 11, 10, "start", 0, RESUME_COLOR, "resumed");
    }
}

/* One series: values v over the lines, the metrics key it comes from. */
struct series {
    const double *v;       /* (n_steps,) */
    const char *key;
    const char *title, *ylabel;
    int color;
    bool from_zero;        /* the axis includes 0 */
    bool log;              /* log10 axis; values <= 0 are left out */
    bool join;             /* join points across lines without a value (evaluations) */
};

/* v[i] as drawn on the series' axis: NaN when not shown. */
static double series_y(const struct series *sr, int i)
{
    double v = sr->v[i];
    if (!isfinite(v))
        return NAN;
    return sr->log ? (v > 0 ? log10(v) : NAN) : v;
}

/* The series' points in the panel into c->xs, c->ys (at most one per
 * line; NaN breaks the line at a gap): those of the lines no resume
 * superseded, which run on in steps across a resume, or (stale) those of
 * the superseded lines, each stretch of them apart. Returns the count. */
static size_t series_points(const struct chart *c, const fsdp_svg_panel *p,
                            const struct series *sr, bool stale)
{
    const fsdp_metrics *m = c->m;
    size_t n = 0;
    for (int i = 0; i < m->n_steps; i++) {
        if (c->stale[i] != stale) {
            if (stale && n > 0 && !isnan(c->ys[n - 1])) { /* a stretch of stale lines ends */
                c->xs[n] = c->ys[n] = NAN;
                n++;
            }
            continue;
        }
        double y = series_y(sr, i);
        if (sr->join && isnan(y))
            continue;
        c->xs[n] = fsdp_svg_px(p, m->step[i]);
        c->ys[n] = isfinite(y) ? fsdp_svg_py(p, y) : NAN;
        n++;
    }
    return n;
}

/* The series as lines: the stale lines' points thin and grey, the others
 * in `color` (NULL: grey too) at `width`. */
static void draw_series(const struct chart *c, const fsdp_svg_panel *p, const struct series *sr,
                        const char *color, double width)
{
    if (c->n_stale)
        fsdp_svg_polyline(c->s, c->xs, c->ys, series_points(c, p, sr, true), "#CCCCCC", 1.0);
    fsdp_svg_polyline(c->s, c->xs, c->ys, series_points(c, p, sr, false),
                      color ? color : "#BBBBBB", width);
}

/* The range [*lo, *hi] of the series' values on its axis (infinite when it
 * has none). */
static void series_range(const fsdp_metrics *m, const struct series *sr, double *lo, double *hi)
{
    for (int i = 0; i < m->n_steps; i++) {
        double y = series_y(sr, i);
        if (isfinite(y)) {
            *lo = fmin(*lo, y);
            *hi = fmax(*hi, y);
        }
    }
}

/* A legend entry k (0 top) to the right of the panel: a line of `color`, then text. */
static void legend(const struct chart *c, const fsdp_svg_panel *p, int k, const char *color,
                   const char *text, const char *note)
{
    double lx = p->x + p->w + 14, ly = p->y + 6 + 16 * k;
    fsdp_svg_line(c->s, lx, ly + 5, lx + 16, ly + 5, color, 2.4, NULL);
    fsdp_svg_text(c->s, lx + 22, ly + 9, 11, "start", 0, "black", "%s", text);
    if (note)
        fsdp_svg_text(c->s, lx + 22, ly + 23, 11, "start", 0, "#444", "%s", note);
}

/* One panel of the series sr (and ref, drawn grey underneath for
 * comparison, when not NULL); the resume label when `label`. */
static void draw_series_panel(const struct chart *c, fsdp_svg_panel p, const struct series *sr,
                              const struct series *ref, bool label)
{
    double lo = INFINITY, hi = -INFINITY;
    series_range(c->m, sr, &lo, &hi);
    bool any = isfinite(lo);
    if (any && ref)
        series_range(c->m, ref, &lo, &hi);
    if (sr->from_zero && any)
        lo = fmin(lo, 0);
    panel_axes(c->s, &p, lo, hi, sr->log, sr->title, sr->ylabel);
    if (!any) {
        panel_note(c->s, &p, sr->key);
    } else {
        if (ref)
            draw_series(c, &p, ref, NULL, 1.2);
        draw_series(c, &p, sr, fsdp_svg_color(sr->color), 1.8);
        if (ref) {
            legend(c, &p, 0, fsdp_svg_color(sr->color), sr->key, NULL);
            legend(c, &p, 1, "#BBBBBB", ref->key, NULL);
        }
    }
    draw_resumes(c, &p, label);
}

/* Each device's peak memory per step, a line per device (one for all when
 * they are equal). */
static void draw_peak_panel(const struct chart *c, fsdp_svg_panel p)
{
    const fsdp_metrics *m = c->m;
    int n = m->n_steps, n_dev = m->n_devices;
    double max = 0, unit;
    for (int k = 0; k < m->peak_first[n]; k++)
        if (isfinite(m->peak[k]))
            max = fmax(max, m->peak[k]);
    char ylabel[64];
    snprintf(ylabel, sizeof ylabel, "peak memory (%s)", fsdp_svg_byte_unit(max, &unit));
    /* from zero; [0, 1] when there is nothing above zero to show */
    panel_axes(c->s, &p, 0, max > 0 ? max / unit : 1, false, "peak device memory, per device",
               ylabel);
    if (n_dev == 0)
        panel_note(c->s, &p, "peak_bytes");
    bool all_equal = peaks_all_equal(m);
    for (int d = 0; d < (all_equal ? 1 : n_dev); d++) {
        for (int i = 0; i < n; i++)
            c->v[i] = peak_at(m, i, d) / unit;
        const struct series sr = {.v = c->v};
        /* device 0 widest, so every colour of overlapping lines shows */
        draw_series(c, &p, &sr, fsdp_svg_color(d + 2), d == 0 ? 2.4 : 1.4);
        char text[48];
        if (all_equal) {
            snprintf(text, sizeof text, "devices 0..%d", n_dev - 1);
            legend(c, &p, 0, fsdp_svg_color(2), text, "(all equal)");
        } else if (d < 12) {
            snprintf(text, sizeof text, "device %d", d);
            legend(c, &p, d, fsdp_svg_color(d + 2), text, NULL);
        } else if (d == 12) {
            fsdp_svg_text(c->s, p.x + p.w + 14, p.y + 6 + 16 * d + 9, 11, "start", 0, "#444",
                          "... %d devices", n_dev);
        }
    }
    draw_resumes(c, &p, false);
}

/* The whole chart into s (begun, not ended). */
static fsdp_status draw(const fsdp_metrics *m, const char *title, const fsdp_plot_opts *opts,
                        fsdp_svg *s)
{
    size_t n = (size_t)m->n_steps;
    struct chart c = {.s = s, .m = m, .stale = malloc(n * sizeof *c.stale),
                      .xs = malloc(n * sizeof *c.xs), .ys = malloc(n * sizeof *c.ys),
                      .v = malloc(n * sizeof *c.v)};
    fsdp_status st = FSDP_STATUS_OK;
    if (!c.stale || !c.xs || !c.ys || !c.v) {
        st = fsdp_error_set(FSDP_STATUS_OOM, "out of host memory drawing %d metrics lines",
                            m->n_steps);
        goto done;
    }
    mark_stale(&c);
    bool log = opts && opts->loss_scale == FSDP_PLOT_LOG;
    const char *loss_label = log ? "loss (log scale)" : "loss";
    const struct series loss = {.v = m->loss, .key = "loss", .title = "training loss",
                                .ylabel = loss_label, .color = 0, .log = log};
    const struct series lr = {.v = m->lr, .key = "lr", .title = "learning rate", .ylabel = "lr",
                              .color = 3, .from_zero = true};
    const struct series norm = {.v = m->grad_norm, .key = "grad_norm",
                                .title = "gradient norm (before clipping)", .ylabel = "norm",
                                .color = 5, .from_zero = true};
    const struct series eval = {.v = m->eval_loss, .key = "eval_loss", .title = "held-out loss",
                                .ylabel = loss_label, .color = 4, .log = log, .join = true};
    const struct series train_ref = {.v = m->loss, .key = "loss (training)", .log = log};
    const struct series tok = {.v = m->tokens_per_s, .key = "tokens_per_s", .title = "throughput",
                               .ylabel = "tokens/s", .color = 1, .from_zero = true};
    draw_summary(&c, title);
    draw_series_panel(&c, panel_frame(m, 0, 0), &loss, NULL, true);
    draw_series_panel(&c, panel_frame(m, 0, 1), &lr, NULL, false);
    draw_series_panel(&c, panel_frame(m, 0, 2), &norm, NULL, false);
    draw_series_panel(&c, panel_frame(m, 1, 0), &eval, &train_ref, false);
    draw_series_panel(&c, panel_frame(m, 1, 1), &tok, NULL, false);
    draw_peak_panel(&c, panel_frame(m, 1, 2));
done:
    free(c.stale);
    free(c.xs);
    free(c.ys);
    free(c.v);
    return st;
}

fsdp_status fsdp_metrics_write_svg_with(const fsdp_metrics *m, const char *title,
                                        const fsdp_plot_opts *opts, FILE *f)
{
    fsdp_svg s;
    fsdp_svg_begin(&s, f, PLOT_W, PLOT_H, title);
    FSDP_TRY(draw(m, title, opts, &s));
    return fsdp_svg_end(&s);
}

fsdp_status fsdp_metrics_write_svg(const fsdp_metrics *m, const char *title, FILE *f)
{
    return fsdp_metrics_write_svg_with(m, title, NULL, f);
}

fsdp_status fsdp_plot_metrics_with(const char *metrics_path, const char *svg_path,
                                   const fsdp_plot_opts *opts, fsdp_plot_info *info)
{
    memset(info, 0, sizeof *info);
    const fsdp_path_arg in = {"METRICS.jsonl", metrics_path, FSDP_PATH_FILE};
    const fsdp_path_arg out = {"OUT.svg", svg_path, FSDP_PATH_FILE};
    FSDP_TRY(fsdp_paths_check_disjoint(&in, 1, &out, 1));
    const char *base = strrchr(metrics_path, '/');
    char title[512];
    snprintf(title, sizeof title, "fsdp metrics: %s", base ? base + 1 : metrics_path);
    /* the SVG first: a path that cannot be written fails before the reading */
    fsdp_svg s;
    FSDP_TRY(fsdp_svg_open(&s, svg_path, PLOT_W, PLOT_H, title));
    fsdp_metrics m;
    fsdp_status st = fsdp_metrics_read(metrics_path, &m);
    if (st == FSDP_STATUS_OK)
        st = draw(&m, title, opts, &s);
    fsdp_status st2 = fsdp_svg_close(&s, st == FSDP_STATUS_OK);
    if (st == FSDP_STATUS_OK)
        st = st2;
    if (st == FSDP_STATUS_OK) {
        info->n_steps = m.n_steps;
        info->n_devices = m.n_devices;
        info->skipped_last_line = m.skipped_last_line;
        info->n_resumes = m.n_resumes;
    }
    fsdp_metrics_free(&m);
    return st;
}

fsdp_status fsdp_plot_metrics(const char *metrics_path, const char *svg_path, fsdp_plot_info *info)
{
    return fsdp_plot_metrics_with(metrics_path, svg_path, NULL, info);
}
