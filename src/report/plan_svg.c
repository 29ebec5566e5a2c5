/*
 * plan_svg.c - `fsdp plan --svg`: stacked bars of each device's memory at
 * its peak, by kind, next to its pinned host memory, with the cap as a line.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/json.h"
#include "report/plan_report.h"
#include "report/svg.h"

static const char *const kind_colors[FSDP_MEM_KIND_COUNT] = {
    "#0072B2", /* param */
    "#E69F00", /* grad */
    "#009E73", /* optim */
    "#CC79A7", /* gather */
    "#56B4E9", /* act */
    "#D55E00", /* comm */
    "#999999", /* other */
};

static const char *const kind_labels[FSDP_MEM_KIND_COUNT] = {
    "parameter shards", "gradients", "optimizer state", "gathered units",
    "activations",      "comm buffers", "other",
};

/* Where the bars go: bar width, the group of a device's bars, the plot
 * panel, the byte unit of its axis, and whether host bars are drawn. */
typedef struct plan_layout {
    double bar, group, unit;
    fsdp_svg_panel pan;
    bool host;
} plan_layout;

/* Each device's stacked bar by kind (and its pinned host bar), its number
 * and, with few devices, its peak above the bar. */
static void draw_bars(fsdp_svg *s, const fsdp_plan *p, const plan_layout *l)
{
    int N = p->n_ranks;
    double bar = l->bar, group = l->group, unit = l->unit;
    bool host = l->host;
    const fsdp_svg_panel *pan = &l->pan;
    char b1[32];
    for (int r = 0; r < N; r++) {
        const fsdp_plan_rank *pr = &p->ranks[r];
        double x = pan->x + (pan->w - group * N) / 2 + group * r +
                   (group - bar * (host ? 2 : 1)) / 2;
        double acc = 0;
        for (int k = 0; k < FSDP_MEM_KIND_COUNT; k++) {
            double v = (double)pr->mem.peak_kind_bytes[k] / unit;
            if (v <= 0)
                continue;
            double y0 = fsdp_svg_py(pan, acc), y1 = fsdp_svg_py(pan, acc + v);
            char tip[128];
            snprintf(tip, sizeof tip, "device %d %s: %s", r, kind_labels[k],
                     fsdp_fmt_bytes(b1, 32, (double)pr->mem.peak_kind_bytes[k]));
            fsdp_svg_rect(s, x, y1, bar, y0 - y1, kind_colors[k], bar >= 6 ? "white" : NULL, tip);
            acc += v;
        }
        if (host) {
            double v = (double)pr->host.peak_bytes / unit;
            double y1 = fsdp_svg_py(pan, v);
            char tip[128];
            snprintf(tip, sizeof tip, "device %d pinned host memory: %s", r,
                     fsdp_fmt_bytes(b1, 32, (double)pr->host.peak_bytes));
            fsdp_svg_rect(s, x + bar, y1, bar, pan->y + pan->h - y1, "#c9c9c9", "#777", tip);
        }
        int every = N <= 32 ? 1 : N <= 128 ? 8 : 64;
        if (r % every == 0)
            fsdp_svg_text(s, x + bar * (host ? 1.0 : 0.5), pan->y + pan->h + 16, 11, "middle", 0,
                          "black", "%d", r);
        bool over = p->device_mem && pr->mem.peak_bytes > p->device_mem;
        if (N <= 16 && pr->mem.peak_bytes)
            fsdp_svg_text(s, x + bar / 2, fsdp_svg_py(pan, acc) - 4, 9.5, "middle", 0,
                          over ? "#C00000" : "#222", "%s",
                          fsdp_fmt_bytes(b1, 32, (double)pr->mem.peak_bytes));
    }
    fsdp_svg_text(s, pan->x + pan->w / 2, pan->y + pan->h + 38, 11, "middle", 0, "#333", "device%s",
                  host ? " (left: device memory, right: pinned host memory)" : "");
}

/* The reference lines (the cap, the ZeRO formula) and the legend. */
static void draw_legend(fsdp_svg *s, const fsdp_plan *p, const plan_layout *l, size_t f_dev,
                        const char *formula)
{
    bool host = l->host;
    const fsdp_svg_panel *pan = &l->pan;
    double unit = l->unit;
    char b1[32];
    /* reference lines (the cap, the ZeRO formula), labelled in the legend */
    if (p->device_mem) {
        double y = fsdp_svg_py(pan, (double)p->device_mem / unit);
        fsdp_svg_line(s, pan->x, y, pan->x + pan->w, y, "#C00000", 1.5, "6 4");
    }
    if (f_dev) {
        double y = fsdp_svg_py(pan, (double)f_dev / unit);
        fsdp_svg_line(s, pan->x, y, pan->x + pan->w, y, "#333333", 1.2, "2 3");
    }

    /* legend: kinds top-down in stacking order (top of the bar first) */
    double lx = pan->x + pan->w + 14, ly = pan->y + 4;
    for (int k = FSDP_MEM_KIND_COUNT - 1; k >= 0; k--) {
        fsdp_svg_rect(s, lx, ly, 12, 12, kind_colors[k], NULL, NULL);
        fsdp_svg_text(s, lx + 18, ly + 10, 11, "start", 0, "black", "%s", kind_labels[k]);
        ly += 18;
    }
    if (host) {
        fsdp_svg_rect(s, lx, ly, 12, 12, "#c9c9c9", "#777", NULL);
        fsdp_svg_text(s, lx + 18, ly + 10, 11, "start", 0, "black", "pinned host memory");
        ly += 18;
    }
    ly += 10;
    if (p->device_mem) {
        fsdp_svg_line(s, lx, ly + 6, lx + 14, ly + 6, "#C00000", 1.5, "6 4");
        fsdp_svg_text(s, lx + 18, ly + 10, 11, "start", 0, "#C00000", "cap %s",
                      fsdp_fmt_bytes(b1, 32, (double)p->device_mem));
        ly += 18;
    }
    if (f_dev) {
        fsdp_svg_line(s, lx, ly + 6, lx + 14, ly + 6, "#333333", 1.2, "2 3");
        fsdp_svg_text(s, lx + 18, ly + 10, 11, "start", 0, "#333333", "ZeRO %s", formula);
        fsdp_svg_text(s, lx + 18, ly + 24, 11, "start", 0, "#333333", "= %s",
                      fsdp_fmt_bytes(b1, 32, (double)f_dev));
        ly += 32;
    }
}

fsdp_status fsdp_plan_write_svg(const fsdp_plan *p, const char *path)
{
    int N = p->n_ranks;
    /* host bars with offload only: without it, pinned host memory is a few
     * staging bytes (the model's host copy of the losses) */
    bool host = p->eng.offload;
    /* bar group per device: device bar (+ host bar) */
    double bar = N <= 8 ? 44 : N <= 32 ? 18 : N <= 128 ? 6 : 2;
    double group = bar * (host ? 2.0 : 1.0) + (N <= 32 ? bar * 0.8 : 1);
    double left = 90, right = 230, top = 58, bottom = 70;
    double plot_w = group * N;
    if (plot_w < 360)
        plot_w = 360;
    double width = left + plot_w + right, height = 480;
    fsdp_svg_panel pan = {.x = left, .y = top, .w = plot_w, .h = height - top - bottom};

    size_t f_dev, f_host;
    char formula[128];
    fsdp_plan_formula(p, &f_dev, &f_host, formula, sizeof formula);
    double maxv = (double)fsdp_plan_max_peak(p, NULL);
    for (int r = 0; r < N; r++)
        if ((double)p->ranks[r].host.peak_bytes > maxv)
            maxv = (double)p->ranks[r].host.peak_bytes;
    if ((double)p->device_mem > maxv)
        maxv = (double)p->device_mem;
    if ((double)f_dev > maxv)
        maxv = (double)f_dev;
    double unit;
    const char *uname = fsdp_svg_byte_unit(maxv, &unit);
    pan.y_lo = 0;
    pan.y_hi = maxv / unit * 1.04;
    pan.y_step = fsdp_svg_nice_range(&pan.y_lo, &pan.y_hi, 6);
    pan.x_lo = 0;
    pan.x_hi = N;

    char title[256], ylabel[64], b1[32];
    snprintf(title, sizeof title, "fsdp plan: %s on %d device(s), shard %s, %s, %s, offload %s",
             p->model, N, fsdp_shard_strategy_name(p->eng.shard),
             fsdp_dtype_name(p->eng.compute_dtype), fsdp_optim_or_default(p->eng.optim)->name,
             fsdp_names_name(&fsdp_offload_names, fsdp_offload_value(&p->eng)));
    fsdp_svg s;
    FSDP_TRY(fsdp_svg_open(&s, path, width, height, title));
    fsdp_svg_text(&s, left, 22, 14, "start", 0, "black", "%s", title);
    char verdict[96] = "";
    size_t peak = fsdp_plan_max_peak(p, NULL);
    if (p->device_mem)
        snprintf(verdict, sizeof verdict, "; %s under %s",
                 peak <= p->device_mem ? "FITS" : "DOES NOT FIT",
                 fsdp_fmt_bytes(b1, 32, (double)p->device_mem));
    fsdp_svg_text(&s, left, 40, 11, "start", 0, "#444",
                  "memory of each device at its peak, by kind; batch %d x seq %d x accum %d%s",
                  p->eng.batch, p->eng.seq, p->eng.grad_accum, verdict);
    snprintf(ylabel, sizeof ylabel, "bytes (%s)", uname);
    fsdp_svg_axes(&s, &pan, NULL, NULL, ylabel, NULL, NULL);

    plan_layout l = {.bar = bar, .group = group, .unit = unit, .pan = pan, .host = host};
    draw_bars(&s, p, &l);
    draw_legend(&s, p, &l, f_dev, formula);
    return fsdp_svg_close(&s, true);
}
