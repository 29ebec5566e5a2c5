/*
 * cost.c - the step-time estimate and the cuda overheads of `fsdp plan
 * --fit` (the model and its assumptions are written out in cost.h).
 * Everything here is arithmetic on figures the caller measured or chose;
 * nothing runs.
 */
#include "train/cost.h"

void fsdp_machine_default(fsdp_machine *m)
{
    m->tflops_fp32 = 67.0;
    m->tflops_bf16 = 989.0;
    m->mfu = 0.4;
    m->link_gbs = 360.0;
    m->link_latency_us = 20.0;
    m->pcie_gbs = 25.0;
    m->host_gbs = 100.0;
    m->node_gbs = 50.0;
}

double fsdp_machine_tflops(const fsdp_machine *m, fsdp_dtype dt)
{
    return dt == FSDP_DTYPE_BF16 ? m->tflops_bf16 : m->tflops_fp32;
}

double fsdp_cost_flops_per_token(size_t n_params, int n_layer, int attn_dim, int T)
{
    return 6.0 * (double)n_params + 12.0 * (double)n_layer * (double)attn_dim * (double)T;
}

static double max2(double a, double b) { return a > b ? a : b; }

void fsdp_cost_estimate(const fsdp_machine *m, const fsdp_cost_input *in, fsdp_cost *out)
{
    double flops_s = fsdp_machine_tflops(m, in->dtype) * 1e12 * m->mfu;
    double link = m->link_gbs * 1e9;
    out->compute_s = in->flops / flops_s;
    double node = m->node_gbs * 1e9; /* only asked for with bytes between nodes */
    double inter_g = in->inter_gather_bytes ? (double)in->inter_gather_bytes / node : 0.0;
    double inter_r = in->inter_reduce_bytes ? (double)in->inter_reduce_bytes / node : 0.0;
    out->inter_s = inter_g + inter_r;
    out->gather_s = (double)in->gather_bytes / link + inter_g +
                    (double)in->param_upload_bytes / (m->pcie_gbs * 1e9);
    out->reduce_s = (double)in->reduce_bytes / link + inter_r;
    out->latency_s = (double)in->n_calls * m->link_latency_us * 1e-6;
    double exposed = in->prefetch ? max2(out->compute_s, out->gather_s)
                                  : out->compute_s + out->gather_s;
    out->device_s = exposed + out->reduce_s + out->latency_s;
    out->pcie_s = in->offload ? (double)in->pcie_bytes / (m->pcie_gbs * 1e9) : 0.0;
    out->cpu_opt_s = in->offload ? (double)in->host_update_bytes / (m->host_gbs * 1e9) : 0.0;
    out->step_s = in->offload ? max2(out->device_s, out->pcie_s + out->cpu_opt_s) : out->device_s;
}

static size_t max_size(size_t a, size_t b) { return a > b ? a : b; }

void fsdp_cost_cuda_overhead(int n_ranks, fsdp_dtype dt, const fsdp_cost_shape *s, size_t n_live,
                             fsdp_cuda_overhead *out)
{
    size_t T = (size_t)s->seq, TT = T * T, NH = (size_t)s->n_head, C = (size_t)s->channels;
    /* the largest scratch request of one step (see fsdp_cost_shape) */
    size_t req = NH * TT * sizeof(float); /* attention forward scores */
    if (dt == FSDP_DTYPE_BF16) {
        size_t n_dout = (T * C + 127) / 128 * 128;
        req = max_size(req, (n_dout + NH * TT) * 2); /* attention backward staging */
        /* matmul backward: floor(chunk / OC) rows of OC, at most B T rows */
        size_t mm = (size_t)s->batch * T * (size_t)(s->max_out > 0 ? s->max_out : 0);
        if (mm > FSDP_COST_LOWP_CHUNK_NUMEL)
            mm = FSDP_COST_LOWP_CHUNK_NUMEL;
        req = max_size(req, mm * 2);
    }
    out->context_bytes = FSDP_COST_CUDA_CONTEXT_BYTES;
    out->cublas_bytes = FSDP_COST_CUBLAS_WS_BYTES;
    out->scratch_bytes = req + req / 4; /* the ops ask for 25% more than they need */
    out->comm_bytes = n_ranks > 1 ? FSDP_COST_NCCL_BYTES : 0;
    out->cache_bytes = n_live * FSDP_COST_CACHE_BYTES_PER_ALLOC;
    out->total_bytes = out->context_bytes + out->cublas_bytes + out->scratch_bytes +
                       out->comm_bytes + out->cache_bytes;
}
