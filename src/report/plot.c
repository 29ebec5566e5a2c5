/*
 * plot.c - `fsdp plot`: metrics JSON Lines -> SVG with three panels (loss,
 * tokens/s, per-device peak memory), sharing the step axis.
 *
 * Reads the whole file into arrays first (metrics files are one line per
 * step: small), then lays out the panels. Values that are missing on a
 * line leave a gap in their series.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/json.h"
#include "report/plot.h"
#include "report/svg.h"

/* One device's peak at one metrics line (lines may list different numbers
 * of devices, so the values are kept as triples). */
struct peak_pt {
    int i, dev;
    double v;
};

static int peak_cmp(const void *a, const void *b)
{
    const struct peak_pt *x = a, *y = b;
    if (x->dev != y->dev)
        return x->dev - y->dev;
    return x->i - y->i;
}

static fsdp_status grow(void **p, int *cap, int n, size_t elem)
{
    if (n < *cap)
        return FSDP_STATUS_OK;
    int ncap = *cap ? *cap * 2 : 64;
    void *np = realloc(*p, (size_t)ncap * elem);
    if (!np)
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory reading metrics");
    *p = np;
    *cap = ncap;
    return FSDP_STATUS_OK;
}

static const fsdp_json *number_or_null(const fsdp_json *obj, const char *key, bool *bad)
{
    const fsdp_json *v = fsdp_json_get(obj, key);
    if (v && v->type != FSDP_JSON_NUMBER && v->type != FSDP_JSON_NULL)
        *bad = true;
    return v && v->type == FSDP_JSON_NUMBER ? v : NULL;
}

fsdp_status fsdp_plot_metrics(const char *metrics_path, const char *svg_path, fsdp_plot_info *info)
{
    memset(info, 0, sizeof *info);
    FILE *f = fopen(metrics_path, "r");
    if (!f)
        return fsdp_error_set(FSDP_STATUS_IO, "cannot open metrics file '%s': %s", metrics_path,
                              strerror(errno));
    fsdp_status st = FSDP_STATUS_OK;
    double *step = NULL, *loss = NULL, *tok = NULL;
    int cap = 0, cap2 = 0, cap3 = 0, n = 0;
    struct peak_pt *pk = NULL;
    int n_pk = 0, cap_pk = 0, n_dev = 0;
    char *line = NULL;
    size_t line_cap = 0;
    ssize_t got;
    int lineno = 0;
    double *xs = NULL, *ys = NULL;
    fsdp_svg s = {0};
    bool svg_open = false;
    while ((got = getline(&line, &line_cap, f)) >= 0) {
        lineno++;
        size_t len = (size_t)got;
        size_t k = 0;
        while (k < len && (line[k] == ' ' || line[k] == '\t' || line[k] == '\n' || line[k] == '\r'))
            k++;
        if (k == len)
            continue; /* blank */
        fsdp_json *obj = NULL;
        st = fsdp_json_parse(line, len, &obj);
        if (st != FSDP_STATUS_OK) {
            char inner[FSDP_ERROR_MSG_MAX];
            const char *m = fsdp_error_msg();
            snprintf(inner, sizeof inner, "%s", strncmp(m, "line 1, ", 8) ? m : m + 8);
            st = fsdp_error_set(st, "metrics file '%s' line %d%s%s%s", metrics_path, lineno,
                                strncmp(m, "line 1, ", 8) ? ": " : ", ", inner,
                                strstr(line, "nan") || strstr(line, "inf")
                                    ? " (a non-finite value: did the run diverge?)"
                                    : "");
            goto done;
        }
        bool bad = false;
        const fsdp_json *js = number_or_null(obj, "step", &bad);
        const fsdp_json *jl = number_or_null(obj, "loss", &bad);
        const fsdp_json *jt = number_or_null(obj, "tokens_per_s", &bad);
        const fsdp_json *jp = fsdp_json_get(obj, "peak_bytes");
        if (obj->type != FSDP_JSON_OBJECT || !js || !jl || bad ||
            (jp && jp->type != FSDP_JSON_ARRAY)) {
            fsdp_json_free(obj);
            st = fsdp_error_set(FSDP_STATUS_FORMAT,
                                "metrics file '%s' line %d: expected an object with numbers "
                                "\"step\" and \"loss\" (and optionally \"tokens_per_s\" and an "
                                "array \"peak_bytes\"), as written by fsdp train --log",
                                metrics_path, lineno);
            goto done;
        }
        if ((st = grow((void **)&step, &cap, n, sizeof *step)) ||
            (st = grow((void **)&loss, &cap2, n, sizeof *loss)) ||
            (st = grow((void **)&tok, &cap3, n, sizeof *tok))) {
            fsdp_json_free(obj);
            goto done;
        }
        step[n] = js->number;
        loss[n] = jl->number;
        tok[n] = jt ? jt->number : NAN;
        if (jp) {
            int d = 0;
            for (const fsdp_json *e = jp->child; e && d < FSDP_MAX_RANKS; e = e->next, d++) {
                if (e->type != FSDP_JSON_NUMBER)
                    continue;
                if ((st = grow((void **)&pk, &cap_pk, n_pk, sizeof *pk))) {
                    fsdp_json_free(obj);
                    goto done;
                }
                pk[n_pk++] = (struct peak_pt){.i = n, .dev = d, .v = e->number};
            }
            if (d > n_dev)
                n_dev = d;
        }
        n++;
        fsdp_json_free(obj);
    }
    if (ferror(f)) {
        st = fsdp_error_set(FSDP_STATUS_IO, "error reading metrics file '%s'", metrics_path);
        goto done;
    }
    if (n == 0) {
        st = fsdp_error_set(FSDP_STATUS_FORMAT,
                            "metrics file '%s' holds no metrics lines (write one with fsdp train "
                            "--log FILE.jsonl)",
                            metrics_path);
        goto done;
    }
    info->n_steps = n;
    info->n_devices = n_dev;

    /* ---- layout ---- */
    const double W = 920, left = 92, right = 150, top = 84, ph = 190, gap = 78;
    const double H = top + 3 * ph + 2 * gap + 64;
    xs = malloc((size_t)n * sizeof *xs);
    ys = malloc((size_t)n * sizeof *ys);
    if (!xs || !ys) {
        st = fsdp_error_set(FSDP_STATUS_OOM, "out of host memory drawing metrics");
        goto done;
    }
    double x_lo = step[0], x_hi = step[0];
    for (int i = 0; i < n; i++) {
        x_lo = fmin(x_lo, step[i]);
        x_hi = fmax(x_hi, step[i]);
    }
    double x_step = fsdp_svg_nice_range(&x_lo, &x_hi, 8);
    const char *base = strrchr(metrics_path, '/');
    base = base ? base + 1 : metrics_path;
    char title[512];
    snprintf(title, sizeof title, "fsdp metrics: %s", base);
    FSDP_CHECK(fsdp_svg_open(&s, svg_path, W, H, title));
    svg_open = true;
    double tok_sum = 0;
    int tok_n = 0;
    for (int i = 1; i < n; i++) /* the first step includes warm-up */
        if (!isnan(tok[i])) {
            tok_sum += tok[i];
            tok_n++;
        }
    fsdp_svg_text(&s, left, 24, 15, "start", 0, "black", "%s", title);
    if (tok_n) {
        char tk[32];
        fsdp_svg_fmt_num(tk, sizeof tk, round(tok_sum / tok_n));
        fsdp_svg_text(&s, left, 42, 11, "start", 0, "#444",
                      "%d steps; final loss %.4g; mean %s tokens/s after the first step; %d "
                      "device(s)", n, loss[n - 1], tk, n_dev);
    }
    else
        fsdp_svg_text(&s, left, 42, 11, "start", 0, "#444", "%d step(s); final loss %.4g; %d "
                      "device(s)", n, loss[n - 1], n_dev);

    for (int panel = 0; panel < 3; panel++) {
        fsdp_svg_panel p = {.x = left, .y = top + panel * (ph + gap), .w = W - left - right,
                            .h = ph, .x_lo = x_lo, .x_hi = x_hi, .x_step = x_step};
        double y_lo = INFINITY, y_hi = -INFINITY, unit = 1;
        const char *ylabel = NULL, *ptitle = NULL;
        char ybuf[64];
        if (panel < 2) {
            const double *v = panel == 0 ? loss : tok;
            for (int i = 0; i < n; i++)
                if (isfinite(v[i])) {
                    y_lo = fmin(y_lo, v[i]);
                    y_hi = fmax(y_hi, v[i]);
                }
            ptitle = panel == 0 ? "training loss" : "throughput";
            ylabel = panel == 0 ? "loss" : "tokens/s";
            if (panel == 1 && isfinite(y_lo))
                y_lo = fmin(y_lo, 0); /* throughput from zero */
        } else {
            double max = 0;
            for (int k = 0; k < n_pk; k++)
                max = fmax(max, pk[k].v);
            const char *u = fsdp_svg_byte_unit(max, &unit);
            y_lo = 0;
            y_hi = max / unit;
            snprintf(ybuf, sizeof ybuf, "peak memory (%s)", u);
            ylabel = ybuf;
            ptitle = "peak device memory, per device";
        }
        if (!isfinite(y_lo)) { /* no values: an empty panel with a note */
            y_lo = 0;
            y_hi = 1;
        }
        p.y_lo = y_lo;
        p.y_hi = y_hi;
        p.y_step = fsdp_svg_nice_range(&p.y_lo, &p.y_hi, 5);
        fsdp_svg_axes(&s, &p, ptitle, "step", ylabel, NULL, NULL);
        if (panel < 2) {
            const double *v = panel == 0 ? loss : tok;
            bool any = false;
            for (int i = 0; i < n; i++) {
                xs[i] = fsdp_svg_px(&p, step[i]);
                ys[i] = isfinite(v[i]) ? fsdp_svg_py(&p, v[i]) : NAN;
                any |= isfinite(v[i]);
            }
            if (any)
                fsdp_svg_polyline(&s, xs, ys, (size_t)n, fsdp_svg_color(panel), 1.8);
            else
                fsdp_svg_text(&s, p.x + p.w / 2, p.y + p.h / 2, 12, "middle", 0, "#888",
                              "no %s in this file", panel == 0 ? "loss" : "tokens_per_s");
            continue;
        }
        if (n_dev == 0)
            fsdp_svg_text(&s, p.x + p.w / 2, p.y + p.h / 2, 12, "middle", 0, "#888",
                          "no peak_bytes in this file");
        qsort(pk, (size_t)n_pk, sizeof *pk, peak_cmp);
        /* devices with the same peaks at every step share one line */
        bool all_equal = n_dev > 1 && n_pk == n * n_dev; /* then pk[d * n + i] is (d, i) */
        for (int k = 0; k < n_pk && all_equal; k++)
            all_equal = pk[k].v == pk[k % n].v;
        int k = 0;
        for (int d = 0; d < (all_equal ? 1 : n_dev); d++) {
            for (int i = 0; i < n; i++) {
                xs[i] = fsdp_svg_px(&p, step[i]);
                ys[i] = NAN;
            }
            for (; k < n_pk && pk[k].dev == d; k++)
                ys[pk[k].i] = fsdp_svg_py(&p, pk[k].v / unit);
            /* device 0 widest, so every colour of overlapping lines shows */
            fsdp_svg_polyline(&s, xs, ys, (size_t)n, fsdp_svg_color(d + 2), d == 0 ? 2.4 : 1.4);
            double lx = p.x + p.w + 14, ly = p.y + 6 + 16 * d;
            if (all_equal) {
                fsdp_svg_line(&s, lx, ly + 5, lx + 16, ly + 5, fsdp_svg_color(2), 2.4, NULL);
                fsdp_svg_text(&s, lx + 22, ly + 9, 11, "start", 0, "black", "devices 0..%d",
                              n_dev - 1);
                fsdp_svg_text(&s, lx + 22, ly + 23, 11, "start", 0, "#444", "(all equal)");
            } else if (d < 12) {
                fsdp_svg_line(&s, lx, ly + 5, lx + 16, ly + 5, fsdp_svg_color(d + 2), 2.4, NULL);
                fsdp_svg_text(&s, lx + 22, ly + 9, 11, "start", 0, "black", "device %d", d);
            } else if (d == 12) {
                fsdp_svg_text(&s, lx, ly + 9, 11, "start", 0, "#444", "... %d devices", n_dev);
            }
        }
    }
    svg_open = false;
    st = fsdp_svg_close(&s, true);

done:
fail:
    if (svg_open)
        fsdp_svg_close(&s, false);
    fclose(f);
    free(line);
    free(step);
    free(loss);
    free(tok);
    free(pk);
    free(xs);
    free(ys);
    return st;
}
