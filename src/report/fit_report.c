/*
 * fit_report.c - `fsdp plan --fit` as text and JSON (report/fit_report.h).
 *
 * The text answers, in order: what was searched and how long it took; the
 * settings that fit, fastest first (step times are estimates, memory is
 * exact); why the others were excluded; the chosen setting as a command
 * line; the machine figures and cuda overheads the answer rests on.
 */
#include <stdio.h>
#include <string.h>

#include "core/json.h"
#include "report/fit_report.h"

static const char *fmtb(char *buf, size_t v)
{
    return fsdp_fmt_bytes(buf, 32, (double)v);
}

static const char *fmt_time(char *buf, size_t n, double s)
{
    if (s >= 1.0)
        snprintf(buf, n, "%.2f s", s);
    else if (s >= 1e-3)
        snprintf(buf, n, "%.1f ms", s * 1e3);
    else
        snprintf(buf, n, "%.0f us", s * 1e6);
    return buf;
}

static const char *fmt_rate(char *buf, size_t n, double v)
{
    if (v >= 1e6)
        snprintf(buf, n, "%.2fM", v / 1e6);
    else if (v >= 1e3)
        snprintf(buf, n, "%.1fk", v / 1e3);
    else
        snprintf(buf, n, "%.0f", v);
    return buf;
}

static const char *label(char *buf, size_t n, const fsdp_fit_candidate *c)
{
    snprintf(buf, n, "batch %d x accum %d%s, shard %s, offload %s, prefetch %s, recompute %s",
             c->batch, c->grad_accum, c->accum == FSDP_ACCUM_FLAT ? " flat" : "",
             fsdp_shard_strategy_name(c->shard),
             fsdp_names_name(&fsdp_offload_names, c->offload), c->prefetch ? "on" : "off",
             fsdp_fit_recompute_modes[c->recompute].name);
    return buf;
}

static void print_header(FILE *f, const fsdp_fit_request *req, const fsdp_fit_result *r)
{
    const fsdp_engine_config *e = &req->base.eng;
    char b1[32], b2[32], t[32];
    int G = req->global_batch;
    fprintf(f, "fsdp plan --fit: model %s (%.2f%s parameters), %d %s device(s) of %s, host memory: "
               "%s\n",
            req->base.model, (double)r->numel / (r->numel >= 1000000000 ? 1e9 : 1e6),
            r->numel >= 1000000000 ? "B" : "M", e->n_ranks, fsdp_backend_name(req->backend),
            fmtb(b1, req->device_mem),
            req->host_mem ? fmtb(b2, req->host_mem)
                          : "not limited (give --host-mem for the target machine)");
    fprintf(f, "  seq %d, %s, global batch %d sequences = %lld tokens per optimizer step\n", e->seq,
            fsdp_dtype_name(e->compute_dtype), G, (long long)G * e->seq);
    int n_pruned = 0;
    for (int i = 0; i < r->n_cand; i++)
        n_pruned += r->cand[i].pruned_by >= 0;
    fprintf(f, "  searched %d settings (micro-batch x accumulation mode x shard x offload x "
               "prefetch x recompute): %d "
               "meta runs, %d pruned, in %s (%d micro-batch(es) at once)\n",
            r->n_cand, r->n_runs, n_pruned, fmt_time(t, sizeof t, r->wall_s), r->jobs);
    if (r->recompute_refused) {
        fprintf(f, "  left out: recompute");
        for (int k = 0, n = 0; k < fsdp_fit_n_recompute_modes; k++)
            if (r->recompute_refused & (1u << (unsigned)k))
                fprintf(f, "%s %s", n++ ? "," : "", fsdp_fit_recompute_modes[k].name);
        fprintf(f, " (%s)\n", r->refused_why);
    }
}

static void print_fits(FILE *f, const fsdp_fit_request *req, const fsdp_fit_result *r, int top)
{
    char b1[32], b2[32], b3[32], t[32], k[32];
    if (!r->n_fits)
        return;
    bool cuda = req->backend == FSDP_BACKEND_CUDA;
    fprintf(f, "\nfits, fastest first (memory: exact; step time: an ESTIMATE from the cost model "
               "below):\n");
    fprintf(f, "  %3s %6s %7s  %-8s %-16s %-8s %-11s %11s %9s %10s %10s %9s %7s\n", "#", "batch",
            "accum", "shard", "offload", "prefetch", "recompute", "peak/dev", cuda ? "+cuda" : "",
            cuda ? "pinned" : "host", "step", "tokens/s", "vs #1");
    double best = r->cand[r->best].cost.step_s;
    for (int i = 0; i < r->n_fits && i < top; i++) {
        const fsdp_fit_candidate *c = &r->cand[r->ranked[i]];
        char vs[16] = "-";
        if (i)
            snprintf(vs, sizeof vs, "+%.0f%%", 100.0 * (c->cost.step_s / best - 1.0));
        char acc[16];
        snprintf(acc, sizeof acc, "%d%s", c->grad_accum,
                 c->accum == FSDP_ACCUM_FLAT ? " flat" : "");
        fprintf(f, "  %3d %6d %7s  %-8s %-16s %-8s %-11s %11s %9s %10s %10s %9s %7s\n", i + 1,
                c->batch, acc, fsdp_shard_strategy_name(c->shard),
                fsdp_names_name(&fsdp_offload_names, c->offload), c->prefetch ? "on" : "off",
                fsdp_fit_recompute_modes[c->recompute].name, fmtb(b1, c->peak_bytes),
                cuda ? fmtb(b2, c->cuda.total_bytes) : "", fmtb(b3, c->host_bytes),
                fmt_time(t, sizeof t, c->cost.step_s), fmt_rate(k, sizeof k, c->tokens_per_s), vs);
    }
    if (r->n_fits > top)
        fprintf(f, "  ... and %d more that fit, all slower (--json lists every one)\n",
                r->n_fits - top);
}

static void print_excluded(FILE *f, const fsdp_fit_request *req, const fsdp_fit_result *r, int top)
{
    char b1[32], b2[32], b3[32], lab[160];
    int n_listed = 0, n_more = 0, n_pruned = 0, last_invalid_batch = -1;
    bool header = false;
    for (int i = 0; i < r->n_cand; i++) {
        const fsdp_fit_candidate *c = &r->cand[i];
        if (c->verdict == FSDP_FIT_FITS)
            continue;
        if (c->verdict == FSDP_FIT_PRUNED) {
            n_pruned++;
            continue;
        }
        if (c->verdict == FSDP_FIT_INVALID && c->batch == last_invalid_batch)
            continue; /* one line per micro-batch the model refuses */
        if (!header) {
            fprintf(f, "\ndoes not fit:\n");
            header = true;
        }
        if (n_listed >= top) {
            n_more++;
            continue;
        }
        n_listed++;
        if (c->verdict == FSDP_FIT_INVALID) {
            last_invalid_batch = c->batch;
            fprintf(f, "  batch %d x accum %d, any setting: the model refuses it: %s\n", c->batch,
                    c->grad_accum, c->why);
        } else if (c->verdict == FSDP_FIT_OVER_DEVICE) {
            fprintf(f, "  %s: %s over the device cap (peak %s", label(lab, sizeof lab, c),
                    fmtb(b1, c->device_bytes - req->device_mem), fmtb(b2, c->peak_bytes));
            if (c->cuda.total_bytes)
                fprintf(f, " + cuda %s", fmtb(b3, c->cuda.total_bytes));
            fprintf(f, ")\n");
        } else {
            fprintf(f, "  %s: %s over the host memory (%s %s for %d devices)\n",
                    label(lab, sizeof lab, c), fmtb(b1, c->host_bytes - req->host_mem),
                    fmtb(b2, c->host_bytes),
                    req->backend == FSDP_BACKEND_CPU ? "simulated devices and pinned memory"
                                                     : "pinned",
                    req->base.eng.n_ranks);
        }
    }
    if (n_more)
        fprintf(f, "  ... and %d more measured over a cap (--json lists them)\n", n_more);
    if (n_pruned)
        fprintf(f, "  %d more not run: each needs at least the memory of one over the device "
                   "cap (same micro-batch, and grad-op for full, no offload, prefetch on or a "
                   "recompute mode that keeps more)\n",
                n_pruned);
}

/* The candidate that misses the device cap by the least (for "nothing fits"). */
static int closest(const fsdp_fit_request *req, const fsdp_fit_result *r)
{
    int best = -1;
    for (int i = 0; i < r->n_cand; i++) {
        const fsdp_fit_candidate *c = &r->cand[i];
        if (c->verdict != FSDP_FIT_OVER_DEVICE && c->verdict != FSDP_FIT_OVER_HOST)
            continue;
        if (best < 0 || c->device_bytes < r->cand[best].device_bytes)
            best = i;
    }
    (void)req;
    return best;
}

/* What the chosen setting's accumulation needs in each mode, and why the
 * chosen mode (the twin is the same setting in the other mode). */
static void print_accum(FILE *f, const fsdp_fit_result *r)
{
    if (r->best_twin < 0)
        return;
    const fsdp_fit_candidate *c = &r->cand[r->best], *t = &r->cand[r->best_twin];
    const fsdp_fit_candidate *tree = c->accum == FSDP_ACCUM_TREE ? c : t;
    const fsdp_fit_candidate *flat = c->accum == FSDP_ACCUM_TREE ? t : c;
    char b1[32], b2[32];
    fprintf(f, "  accumulation %d needs %s of gradients %s as a tree (exact for any "
               "split of the global batch), %s flat (the same bits run to run, not across "
               "splits); ",
            c->grad_accum, fmtb(b1, tree->grad_bytes),
            (c->offload & 1) ? "in pinned host memory per device" : "per device",
            fmtb(b2, flat->grad_bytes));
    if (c->accum == FSDP_ACCUM_TREE)
        fprintf(f, "the tree fits: --accum tree\n");
    else if (t->verdict == FSDP_FIT_FITS)
        fprintf(f, "both fit, flat is faster: --accum flat\n");
    else
        fprintf(f, "the tree does not fit (%s): --accum flat\n",
                t->verdict == FSDP_FIT_OVER_HOST ? "over the host memory" : "over the device cap");
}

static void print_chosen(FILE *f, const fsdp_fit_request *req, const fsdp_fit_result *r)
{
    char b1[32], b2[32], b3[32], b4[32], t1[32], t2[32], t3[32], t4[32], t5[32], k[32];
    char lab[160];
    if (r->best < 0) {
        fprintf(f, "\nNOTHING FITS: none of the %d settings fits %s per device", r->n_cand,
                fmtb(b1, req->device_mem));
        if (req->host_mem)
            fprintf(f, " and %s of host memory.\n", fmtb(b2, req->host_mem));
        else
            fprintf(f, " (host memory not limited).\n");
        int c = closest(req, r);
        if (c >= 0)
            fprintf(f, "  closest: %s needs %s per device and %s of host memory\n",
                    label(lab, sizeof lab, &r->cand[c]), fmtb(b1, r->cand[c].device_bytes),
                    fmtb(b2, r->cand[c].host_bytes));
        bool host = false;
        for (int i = 0; i < r->n_cand; i++)
            host |= r->cand[i].verdict == FSDP_FIT_OVER_HOST;
        fprintf(f, "  try more --devices, a smaller --global-batch or --seq%s%s, or devices with "
                   "more memory\n",
                req->base.eng.compute_dtype == FSDP_DTYPE_F32 ? ", --precision bf16" : "",
                host ? ", a larger --host-mem if the machine that trains has it" : "");
        return;
    }
    const fsdp_fit_candidate *c = &r->cand[r->best];
    const fsdp_cost *k0 = &c->cost;
    fprintf(f, "\nchosen: %s\n", label(lab, sizeof lab, c));
    fprintf(f, "  estimated %s per step, %s tokens/s: compute %s, all-gather %s%s, reduce %s, "
               "collective latency %s",
            fmt_time(t1, sizeof t1, k0->step_s), fmt_rate(k, sizeof k, c->tokens_per_s),
            fmt_time(t2, sizeof t2, k0->compute_s), fmt_time(t3, sizeof t3, k0->gather_s),
            c->prefetch ? " (overlapped by prefetch)" : "", fmt_time(t4, sizeof t4, k0->reduce_s),
            fmt_time(t5, sizeof t5, k0->latency_s));
    if (k0->inter_s > 0)
        fprintf(f, " (of the all-gather and reduce, %s between nodes at --node-gbs %g)",
                fmt_time(t2, sizeof t2, k0->inter_s), req->machine.node_gbs);
    if (c->offload & 1)
        fprintf(f, ", PCIe %s + CPU optimizer %s beside the device",
                fmt_time(t2, sizeof t2, k0->pcie_s), fmt_time(t3, sizeof t3, k0->cpu_opt_s));
    fprintf(f, "\n  device %d peaks at %s (exact)", c->peak_device, fmtb(b1, c->peak_bytes));
    if (c->cuda.total_bytes)
        fprintf(f, " + %s the cuda run holds beyond the engine (estimate)",
                fmtb(b2, c->cuda.total_bytes));
    fprintf(f, " of %s: %s spare; host %s of %s\n", fmtb(b3, req->device_mem),
            fmtb(b4, req->device_mem - c->device_bytes), fmtb(b1, c->host_bytes),
            req->host_mem ? fmtb(b2, req->host_mem) : "an unlimited host (--host-mem)");
    print_accum(f, r);
    char cmd[1024];
    fsdp_fit_command(req, c, cmd, sizeof cmd);
    fprintf(f, "\n  %s\n", cmd);
    fprintf(f, "  (add --data, --steps and the rest");
    if (req->backend == FSDP_BACKEND_CUDA)
        fprintf(f, "; its --device-mem caps the engine's allocations: the device less what the "
                   "cuda run holds beyond them");
    fprintf(f, ")\n");
}

static void print_model(FILE *f, const fsdp_fit_request *req, const fsdp_fit_result *r)
{
    const fsdp_machine *m = &req->machine;
    const fsdp_engine_config *e = &req->base.eng;
    char b1[32], b2[32], b3[32], b4[32], b5[32];
    fprintf(f, "\ncost model (src/train/cost.h; flags override each figure): %s peak %.0f "
               "TFLOP/s x %.2f achieved (--gpu-tflops, --mfu), %.3g GFLOP per token; "
               "collectives %.0f GB/s + %.0f us per call (--link-gbs, --link-latency-us); PCIe "
               "%.0f GB/s (--pcie-gbs); CPU optimizer at %.0f GB/s of host memory (--host-gbs)",
            fsdp_dtype_name(e->compute_dtype), fsdp_machine_tflops(m, e->compute_dtype), m->mfu,
            r->flops_per_token / 1e9, m->link_gbs, m->link_latency_us, m->pcie_gbs, m->host_gbs);
    if (e->n_nodes > 1)
        fprintf(f, "; %d nodes, bytes between them at %.0f GB/s per node (--node-gbs)",
                e->n_nodes, m->node_gbs);
    fputc('\n', f);
    if (req->backend != FSDP_BACKEND_CUDA) {
        fprintf(f, "(the cpu backend simulates the devices: the step times are those of the "
                   "machine figures above, not of this CPU)\n");
        return;
    }
    const fsdp_fit_candidate *c = &r->cand[r->best >= 0 ? r->best : 0];
    if (req->cuda_overhead) {
        fprintf(f, "cuda beyond the engine, per device: %s, as given (--cuda-overhead)\n",
                fmtb(b1, req->cuda_overhead));
        return;
    }
    fprintf(f, "cuda beyond the engine, per device%s: CUDA context %s (documented estimate), "
               "cuBLAS workspace %s, op scratch %s (from the code), NCCL buffers %s (documented "
               "estimate), allocator rounding %s (estimate); --cuda-overhead BYTES replaces them "
               "with what you measure\n",
            r->best >= 0 ? " (chosen setting)" : "", fmtb(b1, c->cuda.context_bytes),
            fmtb(b2, c->cuda.cublas_bytes), fmtb(b3, c->cuda.scratch_bytes),
            fmtb(b4, c->cuda.comm_bytes), fmtb(b5, c->cuda.cache_bytes));
}

void fsdp_fit_print(FILE *f, const fsdp_fit_request *req, const fsdp_fit_result *r, int top)
{
    print_header(f, req, r);
    print_fits(f, req, r, top);
    print_excluded(f, req, r, top);
    print_chosen(f, req, r);
    print_model(f, req, r);
}

/* ---- JSON ------------------------------------------------------------------------ */

static void json_cost(FILE *f, const fsdp_cost *k)
{
    fprintf(f, "{\"step_s\":%.6g,\"device_s\":%.6g,\"compute_s\":%.6g,\"gather_s\":%.6g,"
               "\"reduce_s\":%.6g,\"inter_node_s\":%.6g,\"latency_s\":%.6g,\"pcie_s\":%.6g,"
               "\"cpu_opt_s\":%.6g}",
            k->step_s, k->device_s, k->compute_s, k->gather_s, k->reduce_s, k->inter_s,
            k->latency_s, k->pcie_s, k->cpu_opt_s);
}

static void json_cuda(FILE *f, const fsdp_cuda_overhead *o)
{
    fprintf(f, "{\"context_bytes\":%zu,\"cublas_bytes\":%zu,\"scratch_bytes\":%zu,"
               "\"comm_bytes\":%zu,\"cache_bytes\":%zu,\"total_bytes\":%zu}",
            o->context_bytes, o->cublas_bytes, o->scratch_bytes, o->comm_bytes, o->cache_bytes,
            o->total_bytes);
}

static void json_candidate(FILE *f, const fsdp_fit_request *req, const fsdp_fit_result *r, int i,
                           int rank)
{
    const fsdp_fit_candidate *c = &r->cand[i];
    fprintf(f, "{\"index\":%d,\"batch\":%d,\"grad_accum\":%d,\"shard\":\"%s\",\"offload\":\"%s\","
               "\"accum\":\"%s\",\"prefetch\":\"%s\",\"recompute\":",
            i, c->batch, c->grad_accum, fsdp_shard_strategy_name(c->shard),
            fsdp_names_name(&fsdp_offload_names, c->offload),
            fsdp_names_name(&fsdp_accum_names, (int)c->accum), c->prefetch ? "on" : "off");
    fsdp_json_write_str(f, fsdp_fit_recompute_modes[c->recompute].name);
    fprintf(f, ",\"verdict\":\"%s\"", fsdp_fit_verdict_name(c->verdict));
    if (rank > 0)
        fprintf(f, ",\"rank\":%d", rank);
    if (c->pruned_by >= 0)
        fprintf(f, ",\"pruned_by\":%d", c->pruned_by);
    if (c->verdict == FSDP_FIT_INVALID) {
        fprintf(f, ",\"why\":");
        fsdp_json_write_str(f, c->why);
    }
    if (c->pruned_by < 0 && c->verdict != FSDP_FIT_INVALID) {
        fprintf(f, ",\"peak_bytes\":%zu,\"peak_device\":%d,\"device_bytes\":%zu,\"host_bytes\":%zu,"
                   "\"grad_bytes\":%zu,\"cuda\":",
                c->peak_bytes, c->peak_device, c->device_bytes, c->host_bytes, c->grad_bytes);
        json_cuda(f, &c->cuda);
        fprintf(f, ",\"over_device_bytes\":%zu,\"over_host_bytes\":%zu,\"tokens_per_s\":%.6g,"
                   "\"cost\":",
                c->device_bytes > req->device_mem ? c->device_bytes - req->device_mem : 0,
                req->host_mem && c->host_bytes > req->host_mem ? c->host_bytes - req->host_mem
                                                               : 0,
                c->tokens_per_s);
        json_cost(f, &c->cost);
    }
    fputc('}', f);
}

void fsdp_fit_write_json(FILE *f, const fsdp_fit_request *req, const fsdp_fit_result *r)
{
    const fsdp_engine_config *e = &req->base.eng;
    const fsdp_machine *m = &req->machine;
    fprintf(f, "{\"model\":");
    fsdp_json_write_str(f, req->base.model);
    fprintf(f, ",\"params\":%zu,\"devices\":%d,\"target\":\"%s\",\"seq\":%d,\"precision\":\"%s\","
               "\"global_batch\":%d,\"device_mem\":%zu,\"host_mem\":%zu,",
            r->numel, e->n_ranks, fsdp_backend_name(req->backend), e->seq,
            fsdp_dtype_name(e->compute_dtype), req->global_batch, req->device_mem, req->host_mem);
    fprintf(f, "\"estimate\":\"step times come from the cost model of src/train/cost.h and the "
               "machine figures below; memory is exact (meta runs)\",");
    fprintf(f, "\"machine\":{\"tflops_fp32\":%.6g,\"tflops_bf16\":%.6g,\"mfu\":%.6g,"
               "\"link_gbs\":%.6g,\"link_latency_us\":%.6g,\"pcie_gbs\":%.6g,\"host_gbs\":%.6g},"
               "\"flops_per_token\":%.6g,\"cuda_overhead\":",
            m->tflops_fp32, m->tflops_bf16, m->mfu, m->link_gbs, m->link_latency_us, m->pcie_gbs,
            m->host_gbs, r->flops_per_token);
    if (req->cuda_overhead)
        fprintf(f, "%zu", req->cuda_overhead);
    else
        fprintf(f, "null");
    int n_pruned = 0;
    for (int i = 0; i < r->n_cand; i++)
        n_pruned += r->cand[i].pruned_by >= 0;
    fprintf(f, ",\"search\":{\"candidates\":%d,\"runs\":%d,\"pruned\":%d,\"fits\":%d,"
               "\"wall_s\":%.6g,\"jobs\":%d,\"recompute_refused\":[",
            r->n_cand, r->n_runs, n_pruned, r->n_fits, r->wall_s, r->jobs);
    for (int k = 0, n = 0; k < fsdp_fit_n_recompute_modes; k++)
        if (r->recompute_refused & (1u << (unsigned)k))
            fprintf(f, "%s\"%s\"", n++ ? "," : "", fsdp_fit_recompute_modes[k].name);
    fprintf(f, "]},\"chosen\":");
    if (r->best >= 0) {
        char cmd[1024];
        fsdp_fit_command(req, &r->cand[r->best], cmd, sizeof cmd);
        fprintf(f, "{\"index\":%d,\"command\":", r->best);
        fsdp_json_write_str(f, cmd);
        fputc('}', f);
    } else {
        fprintf(f, "null");
    }
    fprintf(f, ",\"candidates\":[");
    for (int i = 0; i < r->n_cand; i++) {
        int rank = 0;
        for (int j = 0; j < r->n_fits; j++)
            if (r->ranked[j] == i)
                rank = j + 1;
        fprintf(f, "%s\n", i ? "," : "");
        json_candidate(f, req, r, i, rank);
    }
    fprintf(f, "\n]}\n");
}
