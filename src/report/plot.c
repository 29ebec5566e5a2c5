/*
 * plot.c - `fsdp plot`: metrics JSON Lines -> SVG with three panels (loss,
 * tokens/s, per-device peak memory), sharing the step axis (plot.h).
 *
 * Reading and drawing are apart: fsdp_metrics_read fills arrays, one entry
 * per line (metrics files are one line per step: small, and bounded by
 * plot.h's limits), then the panels are laid out from them. Values that
 * are missing, null or non-finite on a line leave a gap in their series.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/fileio.h"
#include "core/json.h"
#include "core/paths.h"
#include "report/plot.h"
#include "report/svg.h"

/* ---- reading ------------------------------------------------------------------ */

/* The arrays being filled and their capacities. */
struct metrics_fill {
    fsdp_metrics *m;
    const char *path;
    size_t cap_lines, cap_peak;
};

static fsdp_status out_of_memory(const struct metrics_fill *mf)
{
    return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory reading metrics file '%s'",
                          mf->path);
}

/* *p resized to cap doubles (contents kept); false, *p untouched, if the
 * memory is not there. */
static bool grow_doubles(double **p, size_t cap)
{
    double *q = realloc(*p, cap * sizeof *q);
    if (!q)
        return false;
    *p = q;
    return true;
}

/* Room for one more line in every per-line array (peak_first holds one
 * more entry than there are lines). A failed realloc leaves the arrays
 * already grown larger than cap_lines, which is harmless. */
static fsdp_status reserve_line(struct metrics_fill *mf)
{
    fsdp_metrics *m = mf->m;
    if ((size_t)m->n_steps + 2 <= mf->cap_lines)
        return FSDP_STATUS_OK;
    size_t cap = mf->cap_lines ? mf->cap_lines * 2 : 256;
    double **arrays[3] = {&m->step, &m->loss, &m->tokens_per_s};
    for (int k = 0; k < 3; k++)
        if (!grow_doubles(arrays[k], cap))
            return out_of_memory(mf);
    int *first = realloc(m->peak_first, cap * sizeof *first);
    if (!first)
        return out_of_memory(mf);
    m->peak_first = first;
    mf->cap_lines = cap;
    return FSDP_STATUS_OK;
}

static fsdp_status reserve_peaks(struct metrics_fill *mf, size_t more)
{
    fsdp_metrics *m = mf->m;
    size_t need = (size_t)m->peak_first[m->n_steps] + more;
    if (need <= mf->cap_peak)
        return FSDP_STATUS_OK;
    size_t cap = mf->cap_peak ? mf->cap_peak : 1024;
    while (cap < need)
        cap *= 2;
    if (!grow_doubles(&m->peak, cap))
        return out_of_memory(mf);
    mf->cap_peak = cap;
    return FSDP_STATUS_OK;
}

/* "a number", "an array": the type of v with its article ("nothing" for NULL). */
static const char *a_type(const fsdp_json *v)
{
    static const char *const names[] = {"a null",   "a boolean", "a number",
                                        "a string", "an array",  "an object"};
    if (v && v->type == FSDP_JSON_NUMBER && !isfinite(v->number))
        return "a non-finite number"; /* 1e999 */
    return v && (unsigned)v->type < sizeof names / sizeof names[0] ? names[v->type] : "nothing";
}

static fsdp_status field_error(const struct metrics_fill *mf, int line_no, const char *key,
                               const char *expected, const fsdp_json *v)
{
    return fsdp_error_set(FSDP_STATUS_FORMAT,
                          "metrics file '%s' line %d: \"%s\" must be %s, found %s; is it a "
                          "metrics file written by fsdp train --log?",
                          mf->path, line_no, key, expected, a_type(v));
}

/* obj[key] as a double: NaN when null, non-finite or (if optional) absent.
 * False when the member has another type, or is absent and required. */
static bool number_or_null(const fsdp_json *obj, const char *key, bool required, double *out)
{
    const fsdp_json *v = fsdp_json_get(obj, key);
    *out = NAN;
    if (!v)
        return !required;
    if (v->type == FSDP_JSON_NUMBER && isfinite(v->number))
        *out = v->number;
    return v->type == FSDP_JSON_NUMBER || v->type == FSDP_JSON_NULL;
}

static bool has_bytes(const char *s, size_t n, const char *word)
{
    return memmem(s, n, word, strlen(word)) != NULL;
}

static fsdp_status not_json(const struct metrics_fill *mf, fsdp_status st, int line_no,
                            const char *line, size_t len)
{
    char inner[FSDP_ERROR_MSG_MAX];
    const char *m = fsdp_error_msg();
    bool one = !strncmp(m, "line 1, ", 8); /* the parser saw one line: say only the column */
    snprintf(inner, sizeof inner, "%s", one ? m + 8 : m);
    bool bare = has_bytes(line, len, "nan") || has_bytes(line, len, "inf") ||
                has_bytes(line, len, "NaN") || has_bytes(line, len, "Inf");
    return fsdp_error_set(st, "metrics file '%s' line %d%s%s%s", mf->path, line_no,
                          one ? ", " : ": ", inner,
                          bare ? " (a non-finite value written as a bare nan/inf, which JSON "
                                 "does not allow: did the run diverge?)"
                               : "");
}

/* Append one metrics line's object to the arrays. */
static fsdp_status add_line(struct metrics_fill *mf, int line_no, const fsdp_json *obj)
{
    fsdp_metrics *m = mf->m;
    if (obj->type != FSDP_JSON_OBJECT)
        return fsdp_error_set(FSDP_STATUS_FORMAT,
                              "metrics file '%s' line %d: expected a JSON object, found %s; "
                              "is it a metrics file written by fsdp train --log?",
                              mf->path, line_no, a_type(obj));
    double step, loss, tok;
    const fsdp_json *js = fsdp_json_get(obj, "step");
    if (!js || js->type != FSDP_JSON_NUMBER || !isfinite(js->number))
        return field_error(mf, line_no, "step", "a finite number", js);
    step = js->number;
    if (!number_or_null(obj, "loss", true, &loss))
        return field_error(mf, line_no, "loss", "a number or null", fsdp_json_get(obj, "loss"));
    if (!number_or_null(obj, "tokens_per_s", false, &tok))
        return field_error(mf, line_no, "tokens_per_s", "a number or null",
                           fsdp_json_get(obj, "tokens_per_s"));
    const fsdp_json *jp = fsdp_json_get(obj, "peak_bytes");
    if (jp && jp->type != FSDP_JSON_ARRAY)
        return field_error(mf, line_no, "peak_bytes", "an array", jp);
    if (jp && jp->n > FSDP_PLOT_MAX_DEVICES)
        return fsdp_error_set(FSDP_STATUS_FORMAT,
                              "metrics file '%s' line %d: \"peak_bytes\" lists %zu devices, more "
                              "than fsdp runs (%d)",
                              mf->path, line_no, jp->n, FSDP_PLOT_MAX_DEVICES);

    FSDP_TRY(reserve_line(mf));
    int i = m->n_steps;
    if (jp)
        FSDP_TRY(reserve_peaks(mf, jp->n));
    int k = m->peak_first[i];
    for (const fsdp_json *e = jp ? jp->child : NULL; e; e = e->next, k++) {
        if (e->type != FSDP_JSON_NUMBER && e->type != FSDP_JSON_NULL)
            return fsdp_error_set(FSDP_STATUS_FORMAT,
                                  "metrics file '%s' line %d: \"peak_bytes\" element %d is "
                                  "%s; expected a number or null",
                                  mf->path, line_no, k - m->peak_first[i], a_type(e));
        m->peak[k] = e->type == FSDP_JSON_NUMBER && isfinite(e->number) ? e->number : NAN;
    }
    if (k - m->peak_first[i] > m->n_devices)
        m->n_devices = k - m->peak_first[i];
    m->step[i] = step;
    m->loss[i] = loss;
    m->tokens_per_s[i] = tok;
    m->peak_first[i + 1] = k;
    m->n_steps = i + 1;
    return FSDP_STATUS_OK;
}

static bool blank(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r')
            return false;
    return true;
}

fsdp_status fsdp_metrics_read(const char *path, fsdp_metrics *m)
{
    memset(m, 0, sizeof *m);
    struct metrics_fill mf = {.m = m, .path = path};
    fsdp_line_reader lr;
    fsdp_status st = FSDP_STATUS_OK;
    FSDP_CHECK(fsdp_line_reader_open(&lr, path, "metrics file", FSDP_PLOT_MAX_LINE_BYTES,
                                     FSDP_PLOT_MAX_FILE_BYTES));
    FSDP_CHECK(reserve_line(&mf));
    m->peak_first[0] = 0;
    for (;;) {
        const char *line;
        size_t len;
        bool terminated;
        FSDP_CHECK(fsdp_line_reader_next(&lr, &line, &len, &terminated));
        if (!line)
            break;
        if (blank(line, len))
            continue;
        fsdp_json *obj = NULL;
        st = fsdp_json_parse(line, len, &obj);
        if (st == FSDP_STATUS_FORMAT && !terminated) {
            /* an incomplete last line: the run is still writing, or was cut */
            m->skipped_last_line = true;
            st = FSDP_STATUS_OK;
            break;
        }
        if (st != FSDP_STATUS_OK) {
            if (st == FSDP_STATUS_FORMAT)
                st = not_json(&mf, st, lr.line_no, line, len);
            goto fail;
        }
        st = add_line(&mf, lr.line_no, obj);
        fsdp_json_free(obj);
        if (st != FSDP_STATUS_OK)
            goto fail;
    }
    if (m->n_steps == 0) {
        st = fsdp_error_set(FSDP_STATUS_FORMAT,
                            "metrics file '%s' holds no %smetrics lines (write one with fsdp "
                            "train --log FILE.jsonl)",
                            path, m->skipped_last_line ? "complete " : "");
        goto fail;
    }
    fsdp_line_reader_close(&lr);
    return FSDP_STATUS_OK;
fail:
    fsdp_line_reader_close(&lr);
    fsdp_metrics_free(m);
    return st;
}

void fsdp_metrics_free(fsdp_metrics *m)
{
    free(m->step);
    free(m->loss);
    free(m->tokens_per_s);
    free(m->peak_first);
    free(m->peak);
    memset(m, 0, sizeof *m);
}

/* ---- drawing ------------------------------------------------------------------ */

/* Layout, in SVG units: three panels of height PANEL_H stacked below a
 * header, legends to the right. */
#define PLOT_W 920.0
#define PLOT_LEFT 92.0
#define PLOT_RIGHT 150.0
#define PLOT_TOP 84.0
#define PANEL_H 190.0
#define PANEL_GAP 78.0
#define PLOT_H (PLOT_TOP + 3 * PANEL_H + 2 * PANEL_GAP + 64.0)

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

static void draw_summary(fsdp_svg *s, const fsdp_metrics *m, const char *title)
{
    int n = m->n_steps;
    double tok_mean = 0;
    int tok_n = 0;
    for (int i = 1; i < n; i++) /* the first step includes warm-up */
        if (isfinite(m->tokens_per_s[i]))
            tok_mean += (m->tokens_per_s[i] - tok_mean) / ++tok_n; /* stays finite */
    char loss[32], tk[32];
    if (isfinite(m->loss[n - 1]))
        snprintf(loss, sizeof loss, "%.4g", m->loss[n - 1]);
    else
        snprintf(loss, sizeof loss, "null (not finite)");
    fsdp_svg_text(s, PLOT_LEFT, 24, 15, "start", 0, "black", "%s", title);
    if (tok_n) {
        fsdp_svg_fmt_num(tk, sizeof tk, round(tok_mean));
        fsdp_svg_text(s, PLOT_LEFT, 42, 11, "start", 0, "#444",
                      "%d steps; final loss %s; mean %s tokens/s after the first step; %d "
                      "device(s)", n, loss, tk, m->n_devices);
    } else {
        fsdp_svg_text(s, PLOT_LEFT, 42, 11, "start", 0, "#444",
                      "%d step(s); final loss %s; %d device(s)", n, loss, m->n_devices);
    }
}

/* The frame of panel k (0 top) over the steps' range. */
static fsdp_svg_panel panel_frame(const fsdp_metrics *m, int k)
{
    fsdp_svg_panel p = {.x = PLOT_LEFT, .y = PLOT_TOP + k * (PANEL_H + PANEL_GAP),
                        .w = PLOT_W - PLOT_LEFT - PLOT_RIGHT, .h = PANEL_H};
    p.x_lo = p.x_hi = m->step[0];
    for (int i = 0; i < m->n_steps; i++) {
        p.x_lo = fmin(p.x_lo, m->step[i]);
        p.x_hi = fmax(p.x_hi, m->step[i]);
    }
    p.x_step = fsdp_svg_nice_range(&p.x_lo, &p.x_hi, 8);
    return p;
}

/* Set the panel's y range to [lo, hi] (widened to nice ticks; an empty
 * range becomes [0, 1]) and draw its axes. */
static void panel_axes(fsdp_svg *s, fsdp_svg_panel *p, double lo, double hi, const char *title,
                       const char *ylabel)
{
    if (!isfinite(lo) || !isfinite(hi)) { /* no values: an empty panel with a note */
        lo = 0;
        hi = 1;
    }
    p->y_lo = lo;
    p->y_hi = hi;
    p->y_step = fsdp_svg_nice_range(&p->y_lo, &p->y_hi, 5);
    fsdp_svg_axes(s, p, title, "step", ylabel, NULL, NULL);
}

static void panel_note(fsdp_svg *s, const fsdp_svg_panel *p, const char *what)
{
    fsdp_svg_text(s, p->x + p->w / 2, p->y + p->h / 2, 12, "middle", 0, "#888",
                  "no %s in this file", what);
}

/* One value per step (loss, tokens/s) as one line; xs, ys: (n_steps,). */
static void draw_series_panel(fsdp_svg *s, fsdp_svg_panel p, const fsdp_metrics *m,
                              const double *v, const char *key, const char *title,
                              const char *ylabel, bool from_zero, int color, double *xs,
                              double *ys)
{
    double lo = INFINITY, hi = -INFINITY;
    for (int i = 0; i < m->n_steps; i++)
        if (isfinite(v[i])) {
            lo = fmin(lo, v[i]);
            hi = fmax(hi, v[i]);
        }
    if (from_zero && isfinite(lo))
        lo = fmin(lo, 0);
    panel_axes(s, &p, lo, hi, title, ylabel);
    for (int i = 0; i < m->n_steps; i++) {
        xs[i] = fsdp_svg_px(&p, m->step[i]);
        ys[i] = isfinite(v[i]) ? fsdp_svg_py(&p, v[i]) : NAN;
    }
    if (isfinite(lo))
        fsdp_svg_polyline(s, xs, ys, (size_t)m->n_steps, fsdp_svg_color(color), 1.8);
    else
        panel_note(s, &p, key);
}

/* Each device's peak memory per step, a line per device (one for all when
 * they are equal); xs, ys: (n_steps,). */
static void draw_peak_panel(fsdp_svg *s, fsdp_svg_panel p, const fsdp_metrics *m, double *xs,
                            double *ys)
{
    int n = m->n_steps, n_dev = m->n_devices;
    double max = 0, unit;
    for (int k = 0; k < m->peak_first[n]; k++)
        if (isfinite(m->peak[k]))
            max = fmax(max, m->peak[k]);
    char ylabel[64];
    snprintf(ylabel, sizeof ylabel, "peak memory (%s)", fsdp_svg_byte_unit(max, &unit));
    /* from zero; [0, 1] when there is nothing above zero to show */
    panel_axes(s, &p, 0, max > 0 ? max / unit : 1, "peak device memory, per device", ylabel);
    if (n_dev == 0)
        panel_note(s, &p, "peak_bytes");
    bool all_equal = peaks_all_equal(m);
    for (int d = 0; d < (all_equal ? 1 : n_dev); d++) {
        for (int i = 0; i < n; i++) {
            double v = peak_at(m, i, d);
            xs[i] = fsdp_svg_px(&p, m->step[i]);
            ys[i] = isfinite(v) ? fsdp_svg_py(&p, v / unit) : NAN;
        }
        /* device 0 widest, so every colour of overlapping lines shows */
        fsdp_svg_polyline(s, xs, ys, (size_t)n, fsdp_svg_color(d + 2), d == 0 ? 2.4 : 1.4);
        double lx = p.x + p.w + 14, ly = p.y + 6 + 16 * d;
        if (all_equal) {
            fsdp_svg_line(s, lx, ly + 5, lx + 16, ly + 5, fsdp_svg_color(2), 2.4, NULL);
            fsdp_svg_text(s, lx + 22, ly + 9, 11, "start", 0, "black", "devices 0..%d",
                          n_dev - 1);
            fsdp_svg_text(s, lx + 22, ly + 23, 11, "start", 0, "#444", "(all equal)");
        } else if (d < 12) {
            fsdp_svg_line(s, lx, ly + 5, lx + 16, ly + 5, fsdp_svg_color(d + 2), 2.4, NULL);
            fsdp_svg_text(s, lx + 22, ly + 9, 11, "start", 0, "black", "device %d", d);
        } else if (d == 12) {
            fsdp_svg_text(s, lx, ly + 9, 11, "start", 0, "#444", "... %d devices", n_dev);
        }
    }
}

/* The whole chart into s (begun, not ended). */
static fsdp_status draw(const fsdp_metrics *m, const char *title, fsdp_svg *s)
{
    double *xs = malloc((size_t)m->n_steps * sizeof *xs);
    double *ys = malloc((size_t)m->n_steps * sizeof *ys);
    if (!xs || !ys) {
        free(xs);
        free(ys);
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory drawing %d metrics lines",
                              m->n_steps);
    }
    draw_summary(s, m, title);
    draw_series_panel(s, panel_frame(m, 0), m, m->loss, "loss", "training loss", "loss", false,
                      0, xs, ys);
    draw_series_panel(s, panel_frame(m, 1), m, m->tokens_per_s, "tokens_per_s", "throughput",
                      "tokens/s", true, 1, xs, ys);
    draw_peak_panel(s, panel_frame(m, 2), m, xs, ys);
    free(xs);
    free(ys);
    return FSDP_STATUS_OK;
}

fsdp_status fsdp_metrics_write_svg(const fsdp_metrics *m, const char *title, FILE *f)
{
    fsdp_svg s;
    fsdp_svg_begin(&s, f, PLOT_W, PLOT_H, title);
    FSDP_TRY(draw(m, title, &s));
    return fsdp_svg_end(&s);
}

fsdp_status fsdp_plot_metrics(const char *metrics_path, const char *svg_path, fsdp_plot_info *info)
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
        st = draw(&m, title, &s);
    fsdp_status st2 = fsdp_svg_close(&s, st == FSDP_STATUS_OK);
    if (st == FSDP_STATUS_OK)
        st = st2;
    if (st == FSDP_STATUS_OK) {
        info->n_steps = m.n_steps;
        info->n_devices = m.n_devices;
        info->skipped_last_line = m.skipped_last_line;
    }
    fsdp_metrics_free(&m);
    return st;
}
