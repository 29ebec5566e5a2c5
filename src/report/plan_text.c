/*
 * plan_text.c - the human-readable report of `fsdp plan`: per device the
 * peak with its breakdown, pinned host memory, collectives of a step, the
 * ZeRO formula and the fit verdict. Devices with equal figures share a row.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/json.h"
#include "report/plan_report.h"
#include "report/svg.h"

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

/* The last device of the row that starts at device lo: devices whose
 * figures same() finds equal share a row. */
static int row_end(const fsdp_plan *p, int lo,
                   bool (*same)(const fsdp_plan_rank *, const fsdp_plan_rank *))
{
    int hi = lo;
    while (hi + 1 < p->n_ranks && same(&p->ranks[lo], &p->ranks[hi + 1]))
        hi++;
    return hi;
}

/* The first cell of a row of devices (or nodes) lo..hi: "3", "0..7". */
static void row_label(FILE *f, int lo, int hi)
{
    char lab[32];
    if (lo == hi)
        snprintf(lab, sizeof lab, "%d", lo);
    else
        snprintf(lab, sizeof lab, "%d..%d", lo, hi);
    fprintf(f, "  %-10s", lab);
}

/* The header cells of the collectives in use, right-aligned in width. */
static void kind_header(FILE *f, const bool *kind_used, int width)
{
    for (int k = 0; k < FSDP_COLL_KIND_COUNT; k++)
        if (kind_used[k])
            fprintf(f, " %*s", width, fsdp_coll_kind_name((fsdp_coll_kind)k));
}

/* A cell "<pre><received> / <sent>", right-aligned in width. */
static void traffic_cell(FILE *f, int width, const char *pre, size_t recv, size_t sent)
{
    char cell[64], b1[32], b2[32];
    snprintf(cell, sizeof cell, "%s%s / %s", pre, fmtb(b1, recv), fmtb(b2, sent));
    fprintf(f, " %*s", width, cell);
}


/* The bytes each node sends to the others and receives from them per step,
 * by collective, and their time over the node's network (p->node_gbs). */
static void print_nodes(FILE *f, const fsdp_plan *p, const bool *kind_used)
{
    int P = p->n_nodes, L = p->n_ranks / P;
    size_t sent[FSDP_MAX_RANKS][FSDP_COLL_KIND_COUNT], recv[FSDP_MAX_RANKS][FSDP_COLL_KIND_COUNT];
    for (int q = 0; q < P && q < FSDP_MAX_RANKS; q++)
        fsdp_plan_node_bytes(p, q, sent[q], recv[q]);
    fprintf(f, "\nbetween nodes, per step and node (%d nodes of %d devices; received / sent, as "
               "the mpi transport moves them):\n  %-10s", P, L, "node");
    kind_header(f, kind_used, 23);
    fprintf(f, " %23s", "total");
    if (p->node_gbs > 0)
        fprintf(f, " %14s", "time");
    fputc('\n', f);
    for (int lo = 0; lo < P;) {
        int hi = lo;
        while (hi + 1 < P && !memcmp(sent[lo], sent[hi + 1], sizeof sent[lo]) &&
               !memcmp(recv[lo], recv[hi + 1], sizeof recv[lo]))
            hi++;
        row_label(f, lo, hi);
        for (int k = 0; k < FSDP_COLL_KIND_COUNT; k++)
            if (kind_used[k])
                traffic_cell(f, 23, "", recv[lo][k], sent[lo][k]);
        size_t r = fsdp_plan_coll_total(recv[lo]), s = fsdp_plan_coll_total(sent[lo]);
        traffic_cell(f, 23, "", r, s);
        if (p->node_gbs > 0)
            fprintf(f, " %11.1f ms", 1e3 * (double)(r > s ? r : s) / (p->node_gbs * 1e9));
        fputc('\n', f);
        lo = hi + 1;
    }
    if (p->node_gbs > 0)
        fprintf(f, "  (time: the larger direction over --node-gbs %g GB/s per node, not hidden "
                   "behind compute)\n", p->node_gbs);
    if (p->eng.shard == FSDP_SHARD_HYBRID)
        fprintf(f, "  hybrid: gathers and reduce-scatters stay in the node; only the all-reduce "
                   "of gradient shards\n  across nodes leaves it\n");
}

/* The run's settings: model, devices, strategy, optimizer, micro-batch. */
static void print_header(FILE *f, const fsdp_plan *p)
{
    const fsdp_engine_config *e = &p->eng;
    int N = p->n_ranks;
    const fsdp_optim *o = fsdp_optim_or_default(e->optim);
    char nodes[48] = "";
    if (p->n_nodes > 1)
        snprintf(nodes, sizeof nodes, " (%d nodes x %d)", p->n_nodes, N / p->n_nodes);
    fprintf(f, "fsdp plan: model %s, %zu parameters (%.2f%s) in %d units, %d device(s)%s, "
               "shard %s, %s, optimizer %s, offload %s\n",
            p->model, p->numel, (double)p->numel / (p->numel >= 1000000000 ? 1e9 : 1e6),
            p->numel >= 1000000000 ? "B" : "M", p->n_units, N, nodes,
            fsdp_shard_strategy_name(e->shard), fsdp_dtype_name(e->compute_dtype), o->name,
            fsdp_names_name(&fsdp_offload_names, fsdp_offload_value(e)));
    fprintf(f, "  per device and micro-step: batch %d x seq %d, grad-accum %d%s, prefetch %s, "
               "recompute %s; %d step(s) run on the meta backend in %.2f s\n",
            e->batch, e->seq, e->grad_accum, e->accum == FSDP_ACCUM_FLAT ? " (flat)" : "",
            e->prefetch ? "on" : "off",
            fsdp_names_name(&fsdp_recompute_names, (int)e->recompute), p->steps, p->wall_s);
}

/* Device memory at each device's peak, by kind (kinds zero everywhere left out). */
static void print_memory(FILE *f, const fsdp_plan *p)
{
    const fsdp_optim *o = fsdp_optim_or_default(p->eng.optim);
    char b1[32], state_names[96];
    int N = p->n_ranks;
    fsdp_optim_state_list(o, state_names, sizeof state_names, ", ");
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
    for (int lo = 0, hi; lo < N; lo = hi + 1) {
        hi = row_end(p, lo, same_mem);
        const fsdp_plan_rank *pr = &p->ranks[lo];
        row_label(f, lo, hi);
        fprintf(f, " %11s", fmtb(b1, pr->mem.peak_bytes));
        for (int k = 0; k < FSDP_MEM_KIND_COUNT; k++)
            if (used[k])
                fprintf(f, " %11s", fmtb(b1, pr->mem.peak_kind_bytes[k]));
        if (any_host)
            fprintf(f, " | %11s", fmtb(b1, pr->host.peak_bytes));
        fputc('\n', f);
    }
    fprintf(f, "  (param: parameter shards; grad: gradient shards and the unit gradient being "
               "reduced;\n   optim: optimizer state (%s); gather: gathered units; act: "
               "activations;\n   other: norm partial sums, staging)\n", state_names);
}

/* Collectives per step and device; across nodes, what leaves each node. */
static void print_traffic(FILE *f, const fsdp_plan *p)
{
    int N = p->n_ranks;
    fprintf(f, "\ncollectives per step and device (received / sent):\n  %-10s", "device");
    bool kind_used[FSDP_COLL_KIND_COUNT] = {0};
    for (int r = 0; r < N; r++)
        for (int k = 0; k < FSDP_COLL_KIND_COUNT; k++)
            kind_used[k] |= p->ranks[r].n_calls[k] != 0;
    kind_header(f, kind_used, 27);
    fprintf(f, " %23s\n", "total");
    for (int lo = 0, hi; lo < N; lo = hi + 1) {
        hi = row_end(p, lo, same_comm);
        const fsdp_plan_rank *pr = &p->ranks[lo];
        row_label(f, lo, hi);
        for (int k = 0; k < FSDP_COLL_KIND_COUNT; k++) {
            if (!kind_used[k])
                continue;
            char calls[32];
            snprintf(calls, sizeof calls, "%zux ", pr->n_calls[k]);
            traffic_cell(f, 27, calls, pr->recv_bytes[k], pr->sent_bytes[k]);
        }
        traffic_cell(f, 23, "", fsdp_plan_coll_total(pr->recv_bytes),
                     fsdp_plan_coll_total(pr->sent_bytes));
        fputc('\n', f);
    }
    if (N == 1)
        fprintf(f, "  (one device: collectives move nothing)\n");
    if (p->n_nodes > 1)
        print_nodes(f, p, kind_used);
}

/* The ZeRO model-state formula against the measured peak (device `who`'s). */
static void print_formula(FILE *f, const fsdp_plan *p, size_t peak, int who)
{
    const fsdp_engine_config *e = &p->eng;
    char b1[32], b2[32], b3[32], b4[32];
    int N = p->n_ranks;
    const fsdp_plan_rank *pr = &p->ranks[who];
    size_t f_dev, f_host;
    char formula[128];
    fsdp_plan_formula(p, &f_dev, &f_host, formula, sizeof formula);
    const size_t *pk = pr->mem.peak_kind_bytes;
    size_t states = pk[FSDP_MEM_PARAM] + pk[FSDP_MEM_GRAD] + pk[FSDP_MEM_OPTIM];
    fprintf(f, "\nZeRO model-state formula (%s, P = %zu", formula, p->train_numel);
    if (p->frozen_numel)
        fprintf(f, ", F = %zu", p->frozen_numel);
    if (p->nf4_numel)
        fprintf(f, ", Q = %zu", p->nf4_numel);
    fprintf(f, ", N = %d): %s on the device", N, fmtb(b1, f_dev));
    if (e->offload || f_host) /* optimizer state, or (params offload) parameter shards */
        fprintf(f, ", %s pinned host (measured %s)", fmtb(b2, f_host),
                fmtb(b3, pr->host.peak_bytes));
    fprintf(f, "\n  measured peak %s (device %d) = parameter/gradient/optimizer buffers %s\n"
               "    + gathered units %s + activations %s",
            fmtb(b1, peak), who, fmtb(b2, states), fmtb(b3, pk[FSDP_MEM_GATHER]),
            fmtb(b4, pk[FSDP_MEM_ACT]));
    if (pk[FSDP_MEM_COMM] || pk[FSDP_MEM_OTHER])
        fprintf(f, " + other %s", fmtb(b1, pk[FSDP_MEM_COMM] + pk[FSDP_MEM_OTHER]));
    fprintf(f,
            "\n  the formula leaves out %sactivations, shard padding (%zu elements), the fp32 "
            "gradients\n  in flight (the root's, held through backward, and the block's being "
            "reduced%s) and small buffers\n",
            e->shard == FSDP_SHARD_FULL || e->shard == FSDP_SHARD_HYBRID
                ? "the gathered units (root + current + prefetched), "
                : "",
            p->padded_numel - p->numel,
            e->offload ? ", with its reduced shard until it is copied to the host" : "");
}

/* Whether the peak fits --device-mem, and what to try when it does not. */
static void print_fit(FILE *f, const fsdp_plan *p, size_t peak, int who)
{
    const fsdp_engine_config *e = &p->eng;
    char b1[32], b2[32], b3[32];
    int N = p->n_ranks;
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
                   "(%d of %d device(s) over)\n  try %s%s%sa smaller --batch or --seq, or more "
                   "--devices\n",
                fmtb(b1, p->device_mem), fmtb(b2, peak), who, fmtb(b3, peak - p->device_mem), over,
                N, e->offload ? "" : "--offload optimizer, ",
                e->shard == FSDP_SHARD_FULL ? "" : "--shard full, ",
                e->recompute == FSDP_RECOMPUTE_BLOCK ? "" : "--recompute block, ");
    }
}

void fsdp_plan_print(FILE *f, const fsdp_plan *p)
{
    print_header(f, p);
    print_memory(f, p);
    print_traffic(f, p);
    int who;
    size_t peak = fsdp_plan_max_peak(p, &who);
    print_formula(f, p, peak, who);
    print_fit(f, p, peak, who);
}
