/*
 * svg.c - the tiny SVG writer (svg.h). Plain fprintf into one stream (a
 * file written through the atomic writer, or the caller's stream); the
 * caller decides the layout. Numbers are written with two decimals, enough
 * for sub-pixel placement and short files.
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <string.h>

#include "report/svg.h"

void fsdp_svg_begin(fsdp_svg *s, FILE *f, double width, double height, const char *title)
{
    s->f = f;
    s->own = false;
    s->width = width;
    s->height = height;
    fprintf(s->f,
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
            "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"%.0f\" "
            "height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" font-family=\"DejaVu Sans, Helvetica, "
            "Arial, sans-serif\">\n",
            width, height, width, height);
    if (title) {
        fputs("<title>", s->f);
        fsdp_svg_escape(s->f, title);
        fputs("</title>\n", s->f);
    }
    fprintf(s->f, "<rect x=\"0\" y=\"0\" width=\"%.0f\" height=\"%.0f\" fill=\"white\"/>\n", width,
            height);
}

fsdp_status fsdp_svg_end(fsdp_svg *s)
{
    fputs("</svg>\n", s->f);
    if (fflush(s->f) != 0 || ferror(s->f))
        return fsdp_error_set(FSDP_STATUS_IO, "error writing an SVG document: %s",
                              strerror(errno));
    return FSDP_STATUS_OK;
}

fsdp_status fsdp_svg_open(fsdp_svg *s, const char *path, double width, double height,
                          const char *title)
{
    memset(s, 0, sizeof *s);
    FSDP_TRY(fsdp_atomic_open(&s->af, path, "SVG file"));
    fsdp_svg_begin(s, s->af.f, width, height, title);
    s->own = true;
    return FSDP_STATUS_OK;
}

fsdp_status fsdp_svg_close(fsdp_svg *s, bool keep)
{
    if (!s->own)
        return FSDP_STATUS_OK;
    s->own = false;
    s->f = NULL;
    if (!keep) {
        fsdp_atomic_abort(&s->af);
        return FSDP_STATUS_OK;
    }
    fputs("</svg>\n", s->af.f);
    return fsdp_atomic_commit(&s->af, !ferror(s->af.f));
}

void fsdp_svg_escape(FILE *f, const char *text)
{
    for (const char *c = text; *c; c++) {
        switch (*c) {
        case '&': fputs("&amp;", f); break;
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '"': fputs("&quot;", f); break;
        case '\'': fputs("&apos;", f); break;
        default:
            /* XML 1.0 forbids most control characters even escaped */
            if ((unsigned char)*c >= 0x20 || *c == '\t' || *c == '\n')
                fputc(*c, f);
            break;
        }
    }
}

void fsdp_svg_rect(fsdp_svg *s, double x, double y, double w, double h, const char *fill,
                   const char *stroke, const char *tooltip)
{
    fprintf(s->f, "<rect x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" height=\"%.2f\" fill=\"%s\"", x, y,
            w > 0 ? w : 0, h > 0 ? h : 0, fill);
    if (stroke)
        fprintf(s->f, " stroke=\"%s\" stroke-width=\"0.5\"", stroke);
    if (tooltip) {
        fputs("><title>", s->f);
        fsdp_svg_escape(s->f, tooltip);
        fputs("</title></rect>\n", s->f);
    } else {
        fputs("/>\n", s->f);
    }
}

void fsdp_svg_line(fsdp_svg *s, double x1, double y1, double x2, double y2, const char *stroke,
                   double width, const char *dash)
{
    fprintf(s->f,
            "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\" stroke=\"%s\" "
            "stroke-width=\"%.2f\"",
            x1, y1, x2, y2, stroke, width);
    if (dash)
        fprintf(s->f, " stroke-dasharray=\"%s\"", dash);
    fputs("/>\n", s->f);
}

void fsdp_svg_polyline(fsdp_svg *s, const double *x, const double *y, size_t n,
                       const char *stroke, double width)
{
    size_t i = 0;
    while (i < n) {
        while (i < n && !(isfinite(x[i]) && isfinite(y[i])))
            i++;
        if (i >= n)
            break;
        size_t j = i;
        while (j < n && isfinite(x[j]) && isfinite(y[j]))
            j++;
        if (j - i == 1) { /* a lone point: a dot */
            fprintf(s->f, "<circle cx=\"%.2f\" cy=\"%.2f\" r=\"%.2f\" fill=\"%s\"/>\n", x[i], y[i],
                    width * 1.2, stroke);
        } else {
            fprintf(s->f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"%.2f\" "
                          "stroke-linejoin=\"round\" points=\"", stroke, width);
            for (size_t k = i; k < j; k++)
                fprintf(s->f, "%s%.2f,%.2f", k > i ? " " : "", x[k], y[k]);
            fputs("\"/>\n", s->f);
        }
        i = j;
    }
}

void fsdp_svg_text(fsdp_svg *s, double x, double y, double size, const char *anchor,
                   double rotate, const char *fill, const char *fmt, ...)
{
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    fprintf(s->f, "<text x=\"%.2f\" y=\"%.2f\" font-size=\"%.1f\" text-anchor=\"%s\" fill=\"%s\"",
            x, y, size, anchor ? anchor : "start", fill ? fill : "black");
    if (rotate != 0)
        fprintf(s->f, " transform=\"rotate(%.1f %.2f %.2f)\"", rotate, x, y);
    fputc('>', s->f);
    fsdp_svg_escape(s->f, buf);
    fputs("</text>\n", s->f);
}

double fsdp_svg_nice_range(double *lo, double *hi, int target)
{
    if (!(isfinite(*lo) && isfinite(*hi))) {
        *lo = 0;
        *hi = 1;
    }
    if (*hi < *lo) {
        double t = *lo;
        *lo = *hi;
        *hi = t;
    }
    if (!isfinite(*hi - *lo)) {
        *lo = fmax(*lo, -1e300);
        *hi = fmin(*hi, 1e300);
    }
    if (*hi == *lo) {
        double pad = *lo != 0 ? fabs(*lo) * 0.1 : 1.0;
        *lo -= pad;
        *hi += pad;
    }
    double lo0 = *lo;
    if (target < 1)
        target = 1;
    double raw = (*hi - *lo) / target;
    double mag = pow(10.0, floor(log10(raw)));
    double f = raw / mag, nice;
    if (f <= 1.0)
        nice = 1.0;
    else if (f <= 2.0)
        nice = 2.0;
    else if (f <= 2.5)
        nice = 2.5;
    else if (f <= 5.0)
        nice = 5.0;
    else
        nice = 10.0;
    double step = nice * mag;
    /* a tolerance so values already on a tick stay there */
    *lo = floor(*lo / step + 1e-9) * step;
    *hi = ceil(*hi / step - 1e-9) * step;
    if (*hi <= *lo)
        *hi = *lo + step;
    if (!(step > 0 && isfinite(step) && isfinite(*lo) && isfinite(*hi) && *lo < *hi)) {
        /* a span too small for the arithmetic (subnormal numbers) */
        *lo = floor(lo0);
        *hi = *lo + 1;
        step = 0.25;
    }
    return step;
}

double fsdp_svg_px(const fsdp_svg_panel *p, double x)
{
    return p->x + (x - p->x_lo) / (p->x_hi - p->x_lo) * p->w;
}

double fsdp_svg_py(const fsdp_svg_panel *p, double y)
{
    return p->y + p->h - (y - p->y_lo) / (p->y_hi - p->y_lo) * p->h;
}

void fsdp_svg_fmt_num(char *buf, size_t n, double v)
{
    double a = fabs(v);
    if (a >= 1e9)
        snprintf(buf, n, "%.4gG", v / 1e9);
    else if (a >= 1e6)
        snprintf(buf, n, "%.4gM", v / 1e6);
    else if (a >= 1e4)
        snprintf(buf, n, "%.4gk", v / 1e3);
    else if (a < 1e-12)
        snprintf(buf, n, "0");
    else
        snprintf(buf, n, "%g", v);
}

void fsdp_svg_axes(fsdp_svg *s, const fsdp_svg_panel *p, const char *title, const char *xlabel,
                   const char *ylabel, fsdp_svg_fmt xfmt, fsdp_svg_fmt yfmt)
{
    if (!xfmt)
        xfmt = fsdp_svg_fmt_num;
    if (!yfmt)
        yfmt = fsdp_svg_fmt_num;
    char lab[64];
    const double fs = 11.0;
    /* grid and tick labels */
    if (p->y_step > 0) {
        double n = floor((p->y_hi - p->y_lo) / p->y_step + 1e-6); /* NaN: no ticks */
        for (int i = 0; i <= n && i <= 1000; i++) {
            double v = p->y_lo + i * p->y_step, py = fsdp_svg_py(p, v);
            fsdp_svg_line(s, p->x, py, p->x + p->w, py, "#e3e3e3", 1, NULL);
            fsdp_svg_line(s, p->x - 4, py, p->x, py, "black", 1, NULL);
            yfmt(lab, sizeof lab, fabs(v) < p->y_step * 1e-9 ? 0.0 : v);
            fsdp_svg_text(s, p->x - 7, py + fs * 0.35, fs, "end", 0, "black", "%s", lab);
        }
    }
    if (p->x_step > 0) {
        double n = floor((p->x_hi - p->x_lo) / p->x_step + 1e-6); /* NaN: no ticks */
        for (int i = 0; i <= n && i <= 1000; i++) {
            double v = p->x_lo + i * p->x_step, px = fsdp_svg_px(p, v);
            fsdp_svg_line(s, px, p->y, px, p->y + p->h, "#f0f0f0", 1, NULL);
            fsdp_svg_line(s, px, p->y + p->h, px, p->y + p->h + 4, "black", 1, NULL);
            xfmt(lab, sizeof lab, fabs(v) < p->x_step * 1e-9 ? 0.0 : v);
            fsdp_svg_text(s, px, p->y + p->h + 4 + fs * 1.1, fs, "middle", 0, "black", "%s", lab);
        }
    }
    /* frame */
    fprintf(s->f, "<rect x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" height=\"%.2f\" fill=\"none\" "
                  "stroke=\"black\" stroke-width=\"1\"/>\n", p->x, p->y, p->w, p->h);
    if (title)
        fsdp_svg_text(s, p->x + p->w / 2, p->y - 8, 13, "middle", 0, "black", "%s", title);
    if (xlabel)
        fsdp_svg_text(s, p->x + p->w / 2, p->y + p->h + 4 + fs * 2.6, fs, "middle", 0, "#333",
                      "%s", xlabel);
    if (ylabel) {
        double x = p->x - 52, y = p->y + p->h / 2;
        fsdp_svg_text(s, x, y, fs, "middle", -90, "#333", "%s", ylabel);
    }
}

const char *fsdp_svg_byte_unit(double max, double *unit_bytes)
{
    static const char *const names[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int k = 0;
    double u = 1;
    while (k < 4 && max >= u * 1024.0) {
        u *= 1024.0;
        k++;
    }
    *unit_bytes = u;
    return names[k];
}

const char *fsdp_svg_color(int i)
{
    /* Okabe-Ito, then a few more; readable for colour-blind viewers */
    static const char *const c[] = {"#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9",
                                    "#D55E00", "#F0E442", "#000000", "#999999", "#8C564B"};
    int n = (int)(sizeof c / sizeof c[0]);
    return c[((i % n) + n) % n];
}
