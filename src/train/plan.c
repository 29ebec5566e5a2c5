/*
 * plan.c - `fsdp plan`: the real step schedule on the meta backend, and
 * its report (text, JSON, SVG).
 *
 * The run is the trainer's loop without data: every rank thread builds its
 * engine (shards, activations) and runs a few steps; the meta device hands
 * out fake addresses and counts bytes by kind, the meta communicator counts
 * bytes by collective, ops do nothing. Nothing here is proportional to the
 * parameter count except the shard map itself (one row per unit and rank),
 * so 70B-parameter shapes plan in milliseconds.
 */
#include <math.h>
#include <string.h>
#include <time.h>

#include "ckpt/modelfile.h"
#include "core/world.h"
#include "fsdp/trace.h"
#include "models/gpt2.h"
#include "train/plan.h"
#include "train/svg.h"

struct planner {
    const fsdp_train_config *cfg;
    fsdp_engine_shared sh;
    fsdp_plan *plan;
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

fsdp_status fsdp_plan_model_config(const char *model, fsdp_gpt2_config *out)
{
    if (!model || !fsdp_modelfile_is_path(model))
        return fsdp_gpt2_config_parse(model, out);
    fsdp_modelfile *mf = NULL;
    FSDP_TRY(fsdp_modelfile_open(&mf, model));
    *out = *fsdp_modelfile_config(mf);
    fsdp_modelfile_close(mf);
    return FSDP_STATUS_OK;
}

/* One rank: the engine's init and `steps` steps, then this rank's figures. */
static fsdp_status plan_rank(fsdp_world *w, int rank, void *arg)
{
    (void)w;
    struct planner *pl = arg;
    fsdp_engine *e = NULL;
    fsdp_status st;
    FSDP_CHECK(fsdp_engine_init(&e, &pl->sh, rank));
    for (int s = 0; s < pl->plan->steps; s++) {
        fsdp_step_result r;
        FSDP_CHECK(fsdp_engine_step(e, (uint64_t)s, fsdp_train_lr(pl->cfg, s), &r));
    }
    fsdp_plan_rank *pr = &pl->plan->ranks[rank];
    const fsdp_device *d = fsdp_engine_device(e);
    const fsdp_comm *c = fsdp_engine_comm(e);
    pr->mem = d->mem;
    pr->host = d->host;
    memcpy(pr->sent_bytes, c->bytes_sent, sizeof pr->sent_bytes);
    memcpy(pr->recv_bytes, c->bytes_recv, sizeof pr->recv_bytes);
    memcpy(pr->n_calls, c->n_calls, sizeof pr->n_calls);
    st = FSDP_STATUS_OK;
fail:
    fsdp_engine_free(e);
    return st;
}

fsdp_status fsdp_plan_run(const fsdp_train_config *cfg, int steps, fsdp_plan *out)
{
    memset(out, 0, sizeof *out);
    if (steps < 1)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "plan: need at least 1 step (got %d)",
                              steps);
    if (cfg->eng.n_ranks < 1 || cfg->eng.n_ranks > 1024)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "--devices must be 1..1024, got %d",
                              cfg->eng.n_ranks);
    double t0 = now_s();
    struct planner pl = {.cfg = cfg, .plan = out};
    fsdp_train_config run = *cfg;
    fsdp_engine_config *ec = &run.eng;
    ec->backend = FSDP_BACKEND_META;
    ec->comm = FSDP_COMM_AUTO;
    ec->ranks_per_device = 1;
    ec->device_mem = 0;
    pl.cfg = &run;
    fsdp_model model;
    memset(&model, 0, sizeof model);
    fsdp_world *w = NULL;
    fsdp_gpt2_config gc;
    fsdp_status st;
    out->eng = *ec;
    out->device_mem = cfg->eng.device_mem;
    out->steps = steps;
    out->n_ranks = ec->n_ranks;
    snprintf(out->model, sizeof out->model, "%s", cfg->model ? cfg->model : "?");
    FSDP_CHECK(fsdp_plan_model_config(cfg->model, &gc));
    FSDP_CHECK(fsdp_gpt2_init(&model, &gc));
    out->numel = model.numel;
    out->n_units = model.n_units;
    out->ranks = calloc((size_t)ec->n_ranks, sizeof *out->ranks);
    if (!out->ranks) {
        st = fsdp_error_set(FSDP_STATUS_OOM, "out of host memory for the plan");
        goto fail;
    }
    FSDP_CHECK(fsdp_world_init(&w, ec->n_ranks));
    FSDP_CHECK(fsdp_engine_shared_init(&pl.sh, ec, &model, NULL, w));
    out->padded_numel = pl.sh.sm.padded_numel;
    if (cfg->trace_path)
        FSDP_CHECK(fsdp_trace_init(&pl.sh.trace, ec->n_ranks));
    FSDP_CHECK(fsdp_world_launch(w, plan_rank, &pl));
    if (pl.sh.trace)
        FSDP_CHECK(fsdp_trace_write(pl.sh.trace, cfg->trace_path));
    out->wall_s = now_s() - t0;
    st = FSDP_STATUS_OK;
fail:
    fsdp_trace_free(pl.sh.trace);
    pl.sh.trace = NULL;
    if (pl.sh.sm.units)
        fsdp_engine_shared_free(&pl.sh);
    if (model.units)
        fsdp_model_free(&model);
    fsdp_world_free(w);
    if (st != FSDP_STATUS_OK) {
        fsdp_error_prefix("plan of model '%s' on %d device(s)", out->model, ec->n_ranks);
        fsdp_plan_free(out);
    }
    return st;
}

void fsdp_plan_free(fsdp_plan *p)
{
    free(p->ranks);
    memset(p, 0, sizeof *p);
}

size_t fsdp_plan_max_peak(const fsdp_plan *p, int *rank)
{
    size_t best = 0;
    int who = 0;
    for (int r = 0; r < p->n_ranks; r++)
        if (p->ranks[r].mem.peak_bytes > best) {
            best = p->ranks[r].mem.peak_bytes;
            who = r;
        }
    if (rank)
        *rank = who;
    return best;
}

void fsdp_plan_formula(const fsdp_plan *p, size_t *dev_bytes, size_t *host_bytes, char *text,
                       size_t n)
{
    const fsdp_engine_config *e = &p->eng;
    double P = (double)p->numel, N = (double)p->n_ranks;
    int dt = (int)fsdp_dtype_size(e->compute_dtype);
    /* state per parameter: fp32 master 4, fp32 gradient 4, Adam m and v 8,
     * plus a compute-dtype copy when it differs from the master */
    int copy = e->compute_dtype != FSDP_DTYPE_F32 ? dt : 0;
    int state = 4 + copy + 4 + 8;
    double dev = 0, host = 0;
    if (!e->offload) {
        switch (e->shard) {
        case FSDP_SHARD_FULL:
            dev = state * P / N;
            snprintf(text, n, "%d P/N", state);
            break;
        case FSDP_SHARD_GRAD_OP:
            /* ZeRO-2: parameters replicated, gradients and optimizer sharded */
            dev = dt * P + (state - dt) * P / N;
            snprintf(text, n, "%d P + %d P/N", dt, state - dt);
            break;
        default:
            dev = state * P;
            snprintf(text, n, "%d P", state);
            break;
        }
    } else {
        /* master, gradient and Adam state in host memory; the device keeps
         * the compute-dtype parameters, sharded as the strategy shards them */
        host = 16.0 * P / (e->shard == FSDP_SHARD_NONE ? 1.0 : N);
        if (e->shard == FSDP_SHARD_FULL) {
            dev = dt * P / N;
            snprintf(text, n, "device %d P/N + host 16 P/N", dt);
        } else {
            dev = dt * P;
            snprintf(text, n, "device %d P + host 16 P%s", dt,
                     e->shard == FSDP_SHARD_NONE ? "" : "/N");
        }
    }
    *dev_bytes = (size_t)dev;
    *host_bytes = (size_t)host;
}

/* ---- text report ----------------------------------------------------------- */

static const char *fmtb(char *buf, size_t v)
{
    return fsdp_fmt_bytes(buf, 32, (double)v);
}

static bool same_mem(const fsdp_plan_rank *a, const fsdp_plan_rank *b)
{
    return a->mem.peak_bytes == b->mem.peak_bytes &&
           !memcmp(a->mem.peak_kind_bytes, b->mem.peak_kind_bytes, sizeof a->mem.peak_kind_bytes) &&
           a->host.peak_bytes == b->host.peak_bytes;
}

static bool same_comm(const fsdp_plan_rank *a, const fsdp_plan_rank *b)
{
    return !memcmp(a->sent_bytes, b->sent_bytes, sizeof a->sent_bytes) &&
           !memcmp(a->recv_bytes, b->recv_bytes, sizeof a->recv_bytes) &&
           !memcmp(a->n_calls, b->n_calls, sizeof a->n_calls);
}

static void range_label(char *buf, size_t n, int lo, int hi)
{
    if (lo == hi)
        snprintf(buf, n, "%d", lo);
    else
        snprintf(buf, n, "%d..%d", lo, hi);
}

static size_t total(const size_t *v)
{
    size_t s = 0;
    for (int k = 0; k < FSDP_COLL_KIND_COUNT; k++)
        s += v[k];
    return s;
}

void fsdp_plan_print(FILE *f, const fsdp_plan *p)
{
    const fsdp_engine_config *e = &p->eng;
    char b1[32], b2[32], b3[32], b4[32], lab[32];
    int N = p->n_ranks;
    fprintf(f, "fsdp plan: model %s, %zu parameters (%.2f%s) in %d units, %d device(s), shard %s, "
               "%s, offload %s\n",
            p->model, p->numel, (double)p->numel / (p->numel >= 1000000000 ? 1e9 : 1e6),
            p->numel >= 1000000000 ? "B" : "M", p->n_units, N,
            fsdp_shard_strategy_name(e->shard), fsdp_dtype_name(e->compute_dtype),
            e->offload ? "optimizer" : "none");
    fprintf(f, "  per device and micro-step: batch %d x seq %d, grad-accum %d, prefetch %s; "
               "%d step(s) run on the meta backend in %.2f s\n",
            e->batch, e->seq, e->grad_accum, e->prefetch ? "on" : "off", p->steps, p->wall_s);

    /* memory table: kinds that are zero everywhere are left out */
    bool used[FSDP_MEM_KIND_COUNT] = {0};
    bool any_host = false;
    for (int r = 0; r < N; r++) {
        for (int k = 0; k < FSDP_MEM_KIND_COUNT; k++)
            used[k] |= p->ranks[r].mem.peak_kind_bytes[k] != 0;
        any_host |= p->ranks[r].host.peak_bytes != 0;
    }
    fprintf(f, "\ndevice memory at each device's peak, by kind:\n  %-10s %11s", "device", "peak");
    for (int k = 0; k < FSDP_MEM_KIND_COUNT; k++)
        if (used[k])
            fprintf(f, " %11s", fsdp_mem_kind_name((fsdp_mem_kind)k));
    if (any_host)
        fprintf(f, " | %11s", "host pinned");
    fputc('\n', f);
    for (int lo = 0; lo < N;) {
        int hi = lo;
        while (hi + 1 < N && same_mem(&p->ranks[lo], &p->ranks[hi + 1]))
            hi++;
        const fsdp_plan_rank *pr = &p->ranks[lo];
        range_label(lab, sizeof lab, lo, hi);
        fprintf(f, "  %-10s %11s", lab, fmtb(b1, pr->mem.peak_bytes));
        for (int k = 0; k < FSDP_MEM_KIND_COUNT; k++)
            if (used[k])
                fprintf(f, " %11s", fmtb(b1, pr->mem.peak_kind_bytes[k]));
        if (any_host)
            fprintf(f, " | %11s", fmtb(b1, pr->host.peak_bytes));
        fputc('\n', f);
        lo = hi + 1;
    }
    fprintf(f, "  (param: parameter shards; grad: gradient shards and the unit gradient being "
               "reduced; optim: Adam m, v;\n   gather: gathered units; act: activations; "
               "other: norm partial sums, staging)\n");

    /* traffic */
    fprintf(f, "\ncollectives per step and device (received / sent):\n  %-10s", "device");
    bool kind_used[FSDP_COLL_KIND_COUNT] = {0};
    for (int r = 0; r < N; r++)
        for (int k = 0; k < FSDP_COLL_KIND_COUNT; k++)
            kind_used[k] |= p->ranks[r].n_calls[k] != 0;
    for (int k = 0; k < FSDP_COLL_KIND_COUNT; k++)
        if (kind_used[k])
            fprintf(f, " %27s", fsdp_coll_kind_name((fsdp_coll_kind)k));
    fprintf(f, " %23s\n", "total");
    for (int lo = 0; lo < N;) {
        int hi = lo;
        while (hi + 1 < N && same_comm(&p->ranks[lo], &p->ranks[hi + 1]))
            hi++;
        const fsdp_plan_rank *pr = &p->ranks[lo];
        range_label(lab, sizeof lab, lo, hi);
        fprintf(f, "  %-10s", lab);
        for (int k = 0; k < FSDP_COLL_KIND_COUNT; k++) {
            if (!kind_used[k])
                continue;
            char cell[64];
            snprintf(cell, sizeof cell, "%zux %s / %s", pr->n_calls[k], fmtb(b1, pr->recv_bytes[k]),
                     fmtb(b2, pr->sent_bytes[k]));
            fprintf(f, " %27s", cell);
        }
        char cell[64];
        snprintf(cell, sizeof cell, "%s / %s", fmtb(b1, total(pr->recv_bytes)),
                 fmtb(b2, total(pr->sent_bytes)));
        fprintf(f, " %23s\n", cell);
        lo = hi + 1;
    }
    if (N == 1)
        fprintf(f, "  (one device: collectives move nothing)\n");

    /* the ZeRO formula and what it leaves out */
    int who;
    size_t peak = fsdp_plan_max_peak(p, &who);
    const fsdp_plan_rank *pr = &p->ranks[who];
    size_t f_dev, f_host;
    char formula[64];
    fsdp_plan_formula(p, &f_dev, &f_host, formula, sizeof formula);
    const size_t *pk = pr->mem.peak_kind_bytes;
    size_t states = pk[FSDP_MEM_PARAM] + pk[FSDP_MEM_GRAD] + pk[FSDP_MEM_OPTIM];
    fprintf(f, "\nZeRO model-state formula (%s, P = %zu, N = %d): %s on the device", formula,
            p->numel, N, fmtb(b1, f_dev));
    if (e->offload)
        fprintf(f, ", %s pinned host (measured %s)", fmtb(b2, f_host), fmtb(b3, pr->host.peak_bytes));
    fprintf(f, "\n  measured peak %s (device %d) = parameter/gradient/optimizer buffers %s\n"
               "    + gathered units %s + activations %s",
            fmtb(b1, peak), who, fmtb(b2, states), fmtb(b3, pk[FSDP_MEM_GATHER]),
            fmtb(b4, pk[FSDP_MEM_ACT]));
    if (pk[FSDP_MEM_COMM] || pk[FSDP_MEM_OTHER])
        fprintf(f, " + other %s", fmtb(b1, pk[FSDP_MEM_COMM] + pk[FSDP_MEM_OTHER]));
    fprintf(f, "\n  the formula leaves out %sactivations, shard padding (%zu elements), the fp32 "
               "gradient\n  of the unit being reduced and small buffers\n",
            e->shard == FSDP_SHARD_FULL ? "the gathered units (root + current + prefetched), " : "",
            p->padded_numel - p->numel);

    /* fit */
    fprintf(f, "\nThese are the engine's allocations, as a cpu run makes them, to the byte. A cuda "
               "run also holds\nthe CUDA context (outside any count), a cuBLAS workspace and op "
               "scratch: keep a margin.\n");
    fputc('\n', f);
    if (!p->device_mem) {
        fprintf(f, "peak device memory %s (device %d); give --device-mem (e.g. 24GiB) to check "
                   "a fit\n", fmtb(b1, peak), who);
    } else if (peak <= p->device_mem) {
        size_t margin = p->device_mem - peak;
        fprintf(f, "FITS under --device-mem %s on all %d device(s): largest peak %s (device %d), "
                   "margin %s (%.1f%%)\n",
                fmtb(b1, p->device_mem), N, fmtb(b2, peak), who, fmtb(b3, margin),
                100.0 * (double)margin / (double)p->device_mem);
    } else {
        int over = 0;
        for (int r = 0; r < N; r++)
            over += p->ranks[r].mem.peak_bytes > p->device_mem;
        fprintf(f, "DOES NOT FIT under --device-mem %s: largest peak %s (device %d) is %s over "
                   "(%d of %d device(s) over)\n  try %s%sa smaller --batch or --seq, or more "
                   "--devices\n",
                fmtb(b1, p->device_mem), fmtb(b2, peak), who, fmtb(b3, peak - p->device_mem), over,
                N, e->offload ? "" : "--offload optimizer, ",
                e->shard == FSDP_SHARD_FULL ? "" : "--shard full, ");
    }
}

/* ---- SVG ------------------------------------------------------------------ */

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
    char formula[64];
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
    snprintf(title, sizeof title, "fsdp plan: %s on %d device(s), shard %s, %s, offload %s",
             p->model, N, fsdp_shard_strategy_name(p->eng.shard),
             fsdp_dtype_name(p->eng.compute_dtype), p->eng.offload ? "optimizer" : "none");
    fsdp_svg s;
    FSDP_TRY(fsdp_svg_open(&s, path, width, height, title));
    fsdp_svg_text(&s, left, 22, 14, "start", 0, "black", "%s", title);
    char verdict[96] = "";
    size_t peak = fsdp_plan_max_peak(p, NULL);
    if (p->device_mem)
        snprintf(verdict, sizeof verdict, "; %s under %s", peak <= p->device_mem ? "FITS" : "DOES NOT FIT",
                 fsdp_fmt_bytes(b1, 32, (double)p->device_mem));
    fsdp_svg_text(&s, left, 40, 11, "start", 0, "#444",
                  "memory of each device at its peak, by kind; batch %d x seq %d x accum %d%s",
                  p->eng.batch, p->eng.seq, p->eng.grad_accum, verdict);
    snprintf(ylabel, sizeof ylabel, "bytes (%s)", uname);
    fsdp_svg_axes(&s, &pan, NULL, NULL, ylabel, NULL, NULL);

    for (int r = 0; r < N; r++) {
        const fsdp_plan_rank *pr = &p->ranks[r];
        double x = pan.x + (pan.w - group * N) / 2 + group * r + (group - bar * (host ? 2 : 1)) / 2;
        double acc = 0;
        for (int k = 0; k < FSDP_MEM_KIND_COUNT; k++) {
            double v = (double)pr->mem.peak_kind_bytes[k] / unit;
            if (v <= 0)
                continue;
            double y0 = fsdp_svg_py(&pan, acc), y1 = fsdp_svg_py(&pan, acc + v);
            char tip[128];
            snprintf(tip, sizeof tip, "device %d %s: %s", r, kind_labels[k],
                     fsdp_fmt_bytes(b1, 32, (double)pr->mem.peak_kind_bytes[k]));
            fsdp_svg_rect(&s, x, y1, bar, y0 - y1, kind_colors[k], bar >= 6 ? "white" : NULL, tip);
            acc += v;
        }
        if (host) {
            double v = (double)pr->host.peak_bytes / unit;
            double y1 = fsdp_svg_py(&pan, v);
            char tip[128];
            snprintf(tip, sizeof tip, "device %d pinned host memory: %s", r,
                     fsdp_fmt_bytes(b1, 32, (double)pr->host.peak_bytes));
            fsdp_svg_rect(&s, x + bar, y1, bar, pan.y + pan.h - y1, "#c9c9c9", "#777", tip);
        }
        int every = N <= 32 ? 1 : N <= 128 ? 8 : 64;
        if (r % every == 0)
            fsdp_svg_text(&s, x + bar * (host ? 1.0 : 0.5), pan.y + pan.h + 16, 11, "middle", 0,
                          "black", "%d", r);
        bool over = p->device_mem && pr->mem.peak_bytes > p->device_mem;
        if (N <= 16 && pr->mem.peak_bytes)
            fsdp_svg_text(&s, x + bar / 2, fsdp_svg_py(&pan, acc) - 4, 9.5, "middle", 0,
                          over ? "#C00000" : "#222", "%s",
                          fsdp_fmt_bytes(b1, 32, (double)pr->mem.peak_bytes));
    }
    fsdp_svg_text(&s, pan.x + pan.w / 2, pan.y + pan.h + 38, 11, "middle", 0, "#333", "device%s",
                  host ? " (left: device memory, right: pinned host memory)" : "");

    /* reference lines (the cap, the ZeRO formula), labelled in the legend */
    if (p->device_mem) {
        double y = fsdp_svg_py(&pan, (double)p->device_mem / unit);
        fsdp_svg_line(&s, pan.x, y, pan.x + pan.w, y, "#C00000", 1.5, "6 4");
    }
    if (f_dev) {
        double y = fsdp_svg_py(&pan, (double)f_dev / unit);
        fsdp_svg_line(&s, pan.x, y, pan.x + pan.w, y, "#333333", 1.2, "2 3");
    }

    /* legend: kinds top-down in stacking order (top of the bar first) */
    double lx = pan.x + pan.w + 14, ly = pan.y + 4;
    for (int k = FSDP_MEM_KIND_COUNT - 1; k >= 0; k--) {
        fsdp_svg_rect(&s, lx, ly, 12, 12, kind_colors[k], NULL, NULL);
        fsdp_svg_text(&s, lx + 18, ly + 10, 11, "start", 0, "black", "%s", kind_labels[k]);
        ly += 18;
    }
    if (host) {
        fsdp_svg_rect(&s, lx, ly, 12, 12, "#c9c9c9", "#777", NULL);
        fsdp_svg_text(&s, lx + 18, ly + 10, 11, "start", 0, "black", "pinned host memory");
        ly += 18;
    }
    ly += 10;
    if (p->device_mem) {
        fsdp_svg_line(&s, lx, ly + 6, lx + 14, ly + 6, "#C00000", 1.5, "6 4");
        fsdp_svg_text(&s, lx + 18, ly + 10, 11, "start", 0, "#C00000", "cap %s",
                      fsdp_fmt_bytes(b1, 32, (double)p->device_mem));
        ly += 18;
    }
    if (f_dev) {
        fsdp_svg_line(&s, lx, ly + 6, lx + 14, ly + 6, "#333333", 1.2, "2 3");
        fsdp_svg_text(&s, lx + 18, ly + 10, 11, "start", 0, "#333333", "ZeRO %s", formula);
        fsdp_svg_text(&s, lx + 18, ly + 24, 11, "start", 0, "#333333", "= %s",
                      fsdp_fmt_bytes(b1, 32, (double)f_dev));
        ly += 32;
    }
    return fsdp_svg_close(&s, true);
}

/* ---- JSON ----------------------------------------------------------------- */

static void json_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        if (*c == '"' || *c == '\\')
            fprintf(f, "\\%c", *c);
        else if (*c < 0x20)
            fprintf(f, "\\u%04x", *c);
        else
            fputc(*c, f);
    }
    fputc('"', f);
}

void fsdp_plan_write_json(FILE *f, const fsdp_plan *p)
{
    const fsdp_engine_config *e = &p->eng;
    size_t f_dev, f_host;
    char formula[64];
    fsdp_plan_formula(p, &f_dev, &f_host, formula, sizeof formula);
    int who;
    size_t peak = fsdp_plan_max_peak(p, &who);
    fprintf(f, "{\"model\":");
    json_str(f, p->model);
    fprintf(f, ",\"params\":%zu,\"padded_params\":%zu,\"units\":%d,\"devices\":%d,\"shard\":\"%s\","
               "\"precision\":\"%s\",\"offload\":\"%s\",\"batch\":%d,\"seq\":%d,\"grad_accum\":%d,"
               "\"prefetch\":%s,\"steps_run\":%d,",
            p->numel, p->padded_numel, p->n_units, p->n_ranks, fsdp_shard_strategy_name(e->shard),
            fsdp_dtype_name(e->compute_dtype), e->offload ? "optimizer" : "none", e->batch, e->seq,
            e->grad_accum, e->prefetch ? "true" : "false", p->steps);
    fprintf(f, "\"formula\":{\"text\":");
    json_str(f, formula);
    fprintf(f, ",\"device_bytes\":%zu,\"host_bytes\":%zu},", f_dev, f_host);
    fprintf(f, "\"max_peak_bytes\":%zu,\"max_peak_device\":%d,", peak, who);
    if (p->device_mem)
        fprintf(f, "\"device_mem\":%zu,\"fits\":%s,", p->device_mem,
                peak <= p->device_mem ? "true" : "false");
    else
        fprintf(f, "\"device_mem\":null,\"fits\":null,");
    fprintf(f, "\"per_device\":[");
    for (int r = 0; r < p->n_ranks; r++) {
        const fsdp_plan_rank *pr = &p->ranks[r];
        fprintf(f, "%s\n{\"device\":%d,\"peak_bytes\":%zu,\"peak_by_kind\":{", r ? "," : "", r,
                pr->mem.peak_bytes);
        for (int k = 0; k < FSDP_MEM_KIND_COUNT; k++)
            fprintf(f, "%s\"%s\":%zu", k ? "," : "", fsdp_mem_kind_name((fsdp_mem_kind)k),
                    pr->mem.peak_kind_bytes[k]);
        fprintf(f, "},\"host_peak_bytes\":%zu,\"host_peak_by_kind\":{", pr->host.peak_bytes);
        for (int k = 0; k < FSDP_MEM_KIND_COUNT; k++)
            fprintf(f, "%s\"%s\":%zu", k ? "," : "", fsdp_mem_kind_name((fsdp_mem_kind)k),
                    pr->host.peak_kind_bytes[k]);
        fprintf(f, "},\"collectives\":{");
        for (int k = 0; k < FSDP_COLL_KIND_COUNT; k++)
            fprintf(f, "%s\"%s\":{\"calls\":%zu,\"recv_bytes\":%zu,\"sent_bytes\":%zu}", k ? "," : "",
                    fsdp_coll_kind_name((fsdp_coll_kind)k), pr->n_calls[k], pr->recv_bytes[k],
                    pr->sent_bytes[k]);
        fprintf(f, "},\"recv_bytes\":%zu,\"sent_bytes\":%zu}", total(pr->recv_bytes),
                total(pr->sent_bytes));
    }
    fprintf(f, "\n]}\n");
}

/* ---- shard maps ------------------------------------------------------------- */

/* Rank r's element range of unit u, and how many of them are real. */
static void rank_range(const fsdp_shardmap *sm, int u, int r, size_t *begin, size_t *end,
                       size_t *real)
{
    const fsdp_shard_unit *su = &sm->units[u];
    *begin = fsdp_shardmap_offset(sm, u, r);
    *end = *begin + su->shard_numel;
    *real = *begin >= su->numel ? 0 : (*end < su->numel ? *end : su->numel) - *begin;
}

void fsdp_plan_shardmap_table(FILE *f, const fsdp_shardmap *sm, const char *model, bool params)
{
    int N = sm->n_ranks;
    fprintf(f, "fsdp shardmap: model %s, %zu parameters in %d units, %d device(s), shard %s\n",
            model, sm->numel, sm->n_units, N, fsdp_shard_strategy_name(sm->strategy));
    if (sm->strategy == FSDP_SHARD_NONE)
        fprintf(f, "  NO_SHARD: every rank holds each whole unit, padded to a multiple of %d "
                   "elements\n", FSDP_NORM_BLOCK);
    else
        fprintf(f, "  each unit's flat buffer is padded to a multiple of %d x %d elements; rank r "
                   "owns [r * shard, (r+1) * shard)\n", N, FSDP_NORM_BLOCK);
    fprintf(f, "  %zu elements in all after padding (+%zu, %.2f%%)\n\n", sm->padded_numel,
            sm->padded_numel - sm->numel,
            sm->numel ? 100.0 * (double)(sm->padded_numel - sm->numel) / (double)sm->numel : 0.0);
    fprintf(f, "%-10s %6s %12s %12s %12s %5s  %-26s %12s\n", "unit", "params", "numel", "padded",
            "shard", "rank", "range", "real");
    for (int u = 0; u < sm->n_units; u++) {
        const fsdp_shard_unit *su = &sm->units[u];
        for (int r = 0; r < N; r++) {
            size_t b, e, real;
            rank_range(sm, u, r, &b, &e, &real);
            char range[64];
            snprintf(range, sizeof range, "[%zu, %zu)", b, e);
            if (r == 0)
                fprintf(f, "%-10s %6d %12zu %12zu %12zu", su->spec->name, su->spec->n_params,
                        su->numel, su->padded_numel, su->shard_numel);
            else
                fprintf(f, "%-10s %6s %12s %12s %12s", "", "", "", "", "");
            fprintf(f, " %5d  %-26s %12zu\n", r, range, real);
            if (!params)
                continue;
            /* the parameter slices inside [b, e) */
            int col = 0;
            for (int i = 0; i < su->spec->n_params; i++) {
                const fsdp_param_spec *p = &su->spec->params[i];
                size_t lo = p->offset > b ? p->offset : b;
                size_t hi = p->offset + p->numel < e ? p->offset + p->numel : e;
                if (lo >= hi)
                    continue;
                char slice[128];
                int len = snprintf(slice, sizeof slice, "%s[%zu:%zu)", p->name, lo - p->offset,
                                   hi - p->offset);
                if (col == 0)
                    col = fprintf(f, "%8s%s", "", "owns ");
                else if (col + len > 118)
                    col = fprintf(f, "\n%13s", "") - 1;
                else
                    col += fprintf(f, " ");
                col += fprintf(f, "%s", slice);
            }
            if (col)
                fputc('\n', f);
        }
    }
}

void fsdp_plan_shardmap_json(FILE *f, const fsdp_shardmap *sm, const char *model)
{
    fprintf(f, "{\"model\":");
    json_str(f, model);
    fprintf(f, ",\"devices\":%d,\"shard\":\"%s\",\"norm_block\":%d,\"params\":%zu,"
               "\"padded_params\":%zu,\"units\":[",
            sm->n_ranks, fsdp_shard_strategy_name(sm->strategy), FSDP_NORM_BLOCK, sm->numel,
            sm->padded_numel);
    for (int u = 0; u < sm->n_units; u++) {
        const fsdp_shard_unit *su = &sm->units[u];
        fprintf(f, "%s\n{\"name\":", u ? "," : "");
        json_str(f, su->spec->name);
        fprintf(f, ",\"numel\":%zu,\"padded_numel\":%zu,\"shard_numel\":%zu,\"params\":[",
                su->numel, su->padded_numel, su->shard_numel);
        for (int i = 0; i < su->spec->n_params; i++) {
            const fsdp_param_spec *p = &su->spec->params[i];
            fprintf(f, "%s{\"name\":", i ? "," : "");
            json_str(f, p->name);
            fprintf(f, ",\"shape\":[");
            for (int d = 0; d < p->ndim; d++)
                fprintf(f, "%s%lld", d ? "," : "", (long long)p->shape[d]);
            fprintf(f, "],\"offset\":%zu,\"numel\":%zu}", p->offset, p->numel);
        }
        fprintf(f, "],\"ranks\":[");
        for (int r = 0; r < sm->n_ranks; r++) {
            size_t b, e, real;
            rank_range(sm, u, r, &b, &e, &real);
            fprintf(f, "%s{\"rank\":%d,\"begin\":%zu,\"end\":%zu,\"real\":%zu}", r ? "," : "", r, b,
                    e, real);
        }
        fprintf(f, "]}");
    }
    fprintf(f, "\n]}\n");
}
