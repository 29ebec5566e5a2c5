/*
 * plan_json.c - `fsdp plan --json` and `fsdp shardmap --json|table`: exact
 * byte counts and shard ranges for tools.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/json.h"
#include "report/plan_report.h"
#include "report/svg.h"

void fsdp_plan_write_json(FILE *f, const fsdp_plan *p)
{
    const fsdp_engine_config *e = &p->eng;
    size_t f_dev, f_host;
    char formula[128];
    fsdp_plan_formula(p, &f_dev, &f_host, formula, sizeof formula);
    int who;
    size_t peak = fsdp_plan_max_peak(p, &who);
    fprintf(f, "{\"model\":");
    fsdp_json_write_str(f, p->model);
    fprintf(f, ",\"params\":%zu,\"padded_params\":%zu,\"units\":%d,\"devices\":%d,\"shard\":\"%s\","
               "\"precision\":\"%s\",\"offload\":\"%s\",\"batch\":%d,\"seq\":%d,\"grad_accum\":%d,"
               "\"accum\":\"%s\",\"prefetch\":%s,\"recompute\":\"%s\",\"steps_run\":%d,"
               "\"node_gbs\":%g,",
            p->numel, p->padded_numel, p->n_units, p->n_ranks, fsdp_shard_strategy_name(e->shard),
            fsdp_dtype_name(e->compute_dtype), fsdp_names_name(&fsdp_offload_names, fsdp_offload_value(e)),
            e->batch, e->seq, e->grad_accum, fsdp_names_name(&fsdp_accum_names, (int)e->accum),
            e->prefetch ? "true" : "false",
            fsdp_names_name(&fsdp_recompute_names, (int)e->recompute), p->steps, p->node_gbs);
    const fsdp_optim *o = fsdp_optim_or_default(e->optim);
    fprintf(f, "\"optimizer\":{\"name\":");
    fsdp_json_write_str(f, o->name);
    fprintf(f, ",\"state\":[");
    for (int k = 0; k < o->n_state; k++) {
        fprintf(f, "%s", k ? "," : "");
        fsdp_json_write_str(f, o->state_names[k]);
    }
    fprintf(f, "],\"state_bytes_per_param\":%zu},", fsdp_optim_state_bytes(o));
    fprintf(f, "\"formula\":{\"text\":");
    fsdp_json_write_str(f, formula);
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
        fprintf(f, "},\"recv_bytes\":%zu,\"sent_bytes\":%zu}", fsdp_plan_coll_total(pr->recv_bytes),
                fsdp_plan_coll_total(pr->sent_bytes));
    }
    /* what crosses between nodes: per node, by collective */
    fprintf(f, "\n],\"nodes\":%d,\"per_node\":[", p->n_nodes);
    for (int q = 0; q < p->n_nodes; q++) {
        size_t sent[FSDP_COLL_KIND_COUNT], recv[FSDP_COLL_KIND_COUNT];
        fsdp_plan_node_bytes(p, q, sent, recv);
        fprintf(f, "%s\n{\"node\":%d,\"inter_node\":{", q ? "," : "", q);
        for (int k = 0; k < FSDP_COLL_KIND_COUNT; k++)
            fprintf(f, "%s\"%s\":{\"recv_bytes\":%zu,\"sent_bytes\":%zu}", k ? "," : "",
                    fsdp_coll_kind_name((fsdp_coll_kind)k), recv[k], sent[k]);
        fprintf(f, "},\"inter_recv_bytes\":%zu,\"inter_sent_bytes\":%zu}",
                fsdp_plan_coll_total(recv), fsdp_plan_coll_total(sent));
    }
    fprintf(f, "\n]}\n");
}


/* ---- shard maps ------------------------------------------------------------- */

/* How many elements of rank r's shards of unit u (all segments) are real. */
static size_t rank_real(const fsdp_shardmap *sm, int u, int r)
{
    const fsdp_shard_unit *su = &sm->units[u];
    size_t real = 0, at;
    for (int i = 0; i < su->n_params; i++)
        real += fsdp_shard_param_run(&su->params[i], fsdp_shardmap_slot(sm, r), &at);
    return real;
}

/* Rank r's rows [*r0, *r1) of sp (empty when it holds padding only). */
static void param_rows(const fsdp_shardmap *sm, const fsdp_shard_param *sp, int r, size_t *r0,
                       size_t *r1)
{
    size_t at, n = fsdp_shard_param_run(sp, fsdp_shardmap_slot(sm, r), &at);
    *r0 = (at - sp->spec->offset) / sp->row_numel;
    *r1 = *r0 + n / sp->row_numel;
    if (!n)
        *r0 = *r1 = sp->rows;
}

static const char *const seg_names[FSDP_SEG_COUNT] = {"trainable", "frozen", "nf4"};

void fsdp_plan_shardmap_table(FILE *f, const fsdp_shardmap *sm, const char *model, bool params)
{
    int N = sm->n_ranks;
    fprintf(f, "fsdp shardmap: model %s, %zu parameters in %d units, %d device(s), shard %s\n",
            model, sm->numel + sm->frozen_numel + sm->nf4_numel, sm->n_units, N,
            fsdp_shard_strategy_name(sm->strategy));
    fprintf(f, "  every parameter is split on its first dimension over %d rank(s)%s:\n"
               "  rank r holds rows [k * R, (k+1) * R) of it, k = r %% %d, R its rows per rank%s\n",
            sm->shard_ranks,
            sm->strategy == FSDP_SHARD_HYBRID ? " (a node's; replicated across nodes)"
            : sm->strategy == FSDP_SHARD_NONE ? " (no sharding: every rank all of it)"
                                              : "",
            sm->shard_ranks,
            sm->shard_ranks > 1 ? ",\n  padded to whole norm blocks (a parameter smaller than "
                                  "that: whole on the ranks with k = 0)"
                                : "");
    size_t real = sm->numel + sm->frozen_numel + sm->nf4_numel, padded = 0;
    for (int u = 0; u < sm->n_units; u++)
        padded += sm->units[u].padded_numel + sm->units[u].frozen_padded +
                  sm->units[u].nf4_padded;
    fprintf(f, "  %zu elements in all after padding (+%zu, %.2f%%)\n", padded, padded - real,
            real ? 100.0 * (double)(padded - real) / (double)real : 0.0);
    bool mixed = sm->frozen_numel + sm->nf4_numel > 0;
    if (mixed)
        fprintf(f, "  segments: trainable %zu, frozen %zu (the compute dtype), nf4 %zu (4-bit "
                   "codes and absmax)\n  elements; each unit's segments are sharded and gathered "
                   "in buffers of their own, the trainable one alone reduced\n",
                sm->numel, sm->frozen_numel, sm->nf4_numel);
    fputc('\n', f);
    fprintf(f, "%-10s %6s %12s %12s %12s %5s %12s\n", "unit", "params", "numel", "padded",
            "shard", "rank", "real");
    for (int u = 0; u < sm->n_units; u++) {
        const fsdp_shard_unit *su = &sm->units[u];
        size_t shard = su->shard_numel + su->frozen_shard + su->nf4_shard;
        for (int r = 0; r < N; r++) {
            if (r == 0)
                fprintf(f, "%-10s %6d %12zu %12zu %12zu", su->spec->name, su->spec->n_params,
                        su->spec->numel, shard * (size_t)sm->shard_ranks, shard);
            else
                fprintf(f, "%-10s %6s %12s %12s %12s", "", "", "", "", "");
            fprintf(f, " %5d %12zu\n", r, rank_real(sm, u, r));
            if (!params)
                continue;
            /* each parameter's rows on this rank, a line per segment when there are several */
            int col = 0, seg = -1;
            for (int i = 0; i < su->n_params; i++) {
                const fsdp_shard_param *sp = &su->params[i];
                size_t r0, r1;
                param_rows(sm, sp, r, &r0, &r1);
                char slice[128];
                int len = snprintf(slice, sizeof slice, "%s[%zu:%zu)", sp->spec->name, r0, r1);
                if (mixed && (int)sp->seg != seg && col) {
                    fputc('\n', f);
                    col = 0;
                }
                seg = (int)sp->seg;
                int w = mixed ? 10 : 5; /* "trainable " or "rows " */
                if (col == 0)
                    col = fprintf(f, "%8s%-*s", "", w, mixed ? seg_names[seg] : "rows");
                else if (col + len > 118)
                    col = fprintf(f, "\n%*s", 8 + w, "") - 1;
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
    fsdp_json_write_str(f, model);
    fprintf(f, ",\"devices\":%d,\"shard\":\"%s\",\"shard_ranks\":%d,\"norm_block\":%d,"
               "\"params\":%zu,\"padded_params\":%zu,\"units\":[",
            sm->n_ranks, fsdp_shard_strategy_name(sm->strategy), sm->shard_ranks,
            FSDP_NORM_BLOCK, sm->numel, sm->padded_numel);
    for (int u = 0; u < sm->n_units; u++) {
        const fsdp_shard_unit *su = &sm->units[u];
        fprintf(f, "%s\n{\"name\":", u ? "," : "");
        fsdp_json_write_str(f, su->spec->name);
        fprintf(f, ",\"numel\":%zu,\"padded_numel\":%zu,\"shard_numel\":%zu,"
                   "\"frozen_shard_numel\":%zu,\"nf4_shard_numel\":%zu,\"params\":[",
                su->numel, su->padded_numel, su->shard_numel, su->frozen_shard, su->nf4_shard);
        for (int i = 0; i < su->n_params; i++) {
            const fsdp_shard_param *sp = &su->params[i];
            const fsdp_param_spec *p = sp->spec;
            fprintf(f, "%s{\"name\":", i ? "," : "");
            fsdp_json_write_str(f, p->name);
            fprintf(f, ",\"shape\":[");
            for (int d = 0; d < p->ndim; d++)
                fprintf(f, "%s%lld", d ? "," : "", (long long)p->shape[d]);
            fprintf(f, "],\"offset\":%zu,\"numel\":%zu,\"segment\":\"%s\",\"shard_rows\":%zu,"
                       "\"shard_offset\":%zu,\"rows\":[",
                    p->offset, p->numel, seg_names[sp->seg], sp->shard_rows, sp->shard_off);
            for (int r = 0; r < sm->n_ranks; r++) {
                size_t r0, r1;
                param_rows(sm, sp, r, &r0, &r1);
                fprintf(f, "%s[%zu,%zu]", r ? "," : "", r0, r1);
            }
            fprintf(f, "]}");
        }
        fprintf(f, "],\"ranks\":[");
        for (int r = 0; r < sm->n_ranks; r++)
            fprintf(f, "%s{\"rank\":%d,\"real\":%zu}", r ? "," : "", r, rank_real(sm, u, r));
        fprintf(f, "]}");
    }
    fprintf(f, "\n]}\n");
}
