/*
 * fit.c - the search of `fsdp plan --fit` and the check of `fsdp train`
 * (the contract and the pruning rule are in fit.h; the reports are in
 * src/report/fit_report.c).
 *
 * Each candidate is one meta run (train/plan.c) with the candidate's
 * micro-batch, accumulation, strategy, offload, prefetch and recompute;
 * nothing is extrapolated from another candidate's figures. Micro-batches
 * are independent chains: a worker thread takes one micro-batch and walks
 * its settings from the least memory to the most, skipping those that a
 * measured failure already rules out. Each worker writes only its own
 * micro-batch's candidates; the result is assembled after the join.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "core/clock.h"
#include "core/names.h"
#include "ckpt/modelfile.h"
#include "models/registry.h"
#include "optim/optim.h"
#include "train/fit.h"

/* Modes that keep less activation memory have lower memory ranks. The
 * FLOPs a mode adds come from the model (its recompute_flops_per_token),
 * at least forward_rerun / 3 of the step's: the floor stands for what FLOPs
 * do not count (rerunning norms and activations is memory-bound work) and is
 * the estimate for a model that does not say. */
const fsdp_recompute_mode fsdp_fit_recompute_modes[] = {
    {"none", FSDP_RECOMPUTE_NONE, 0.0, 2, "keep every activation backward needs"},
    {"elementwise", FSDP_RECOMPUTE_ELEMENTWISE, 0.05, 1,
     "keep the matmul and attention outputs, rerun norms and activations in backward"},
    {"block", FSDP_RECOMPUTE_BLOCK, 0.5, 0,
     "keep each block's input, rerun the block's forward in backward"},
};
const int fsdp_fit_n_recompute_modes =
    (int)(sizeof fsdp_fit_recompute_modes / sizeof fsdp_fit_recompute_modes[0]);

/* Tell the engine which recompute mode to run. */
static void apply_recompute(fsdp_engine_config *e, const fsdp_recompute_mode *m)
{
    e->recompute = (fsdp_recompute)m->value;
}

void fsdp_fit_request_default(fsdp_fit_request *req)
{
    memset(req, 0, sizeof *req);
    fsdp_train_config_default(&req->base);
    req->base.out = NULL;
    req->backend = FSDP_BACKEND_CUDA;
    fsdp_machine_default(&req->machine);
    req->steps = 2;
    req->host_mem = 0; /* not limited: this machine's need not be the target's */
}

const char *fsdp_fit_verdict_name(fsdp_fit_verdict v)
{
    static const char *const names[] = {"fits", "over_device", "over_host", "pruned", "invalid"};
    return (unsigned)v < sizeof names / sizeof names[0] ? names[v] : "?";
}

/* ---- the model's figures for the cost model ---------------------------------- */

unsigned fsdp_fit_recompute_refused(const fsdp_model *m, unsigned mask, char *why, size_t n)
{
    unsigned refused = 0;
    if (why && n)
        why[0] = '\0';
    for (int k = 0; k < fsdp_fit_n_recompute_modes; k++) {
        fsdp_recompute mode = (fsdp_recompute)fsdp_fit_recompute_modes[k].value;
        if (mask && !(mask & (1u << (unsigned)k)))
            continue;
        if (fsdp_engine_recompute_check(m, mode) == FSDP_STATUS_OK)
            continue;
        if (!refused && why && n)
            snprintf(why, n, "%s", fsdp_error_msg());
        fsdp_error_clear();
        refused |= 1u << (unsigned)k;
    }
    return refused;
}

/* FLOPs per token and the scratch shape, from the model's parameter count
 * and its config (the one place that reads a family's config); with
 * `refused`, the modes of `mask` the model does not implement
 * (fsdp_fit_recompute_refused, message in why[0..n)). */
static fsdp_status model_figures(const fsdp_train_config *base, size_t *numel,
                                 double *flops_per_token, double *recompute_flops,
                                 fsdp_cost_shape *shape, unsigned mask, unsigned *refused,
                                 char *why, size_t n)
{
    fsdp_model m;
    FSDP_TRY(fsdp_modelfile_resolve(base->model, &m, NULL));
    *numel = m.numel;
    if (refused)
        *refused = fsdp_fit_recompute_refused(&m, mask, why, n);
    *flops_per_token = m.family->flops_per_token(&m, base->eng.seq);
    for (int k = 0; k < fsdp_fit_n_recompute_modes; k++) {
        const fsdp_recompute_mode *rm = &fsdp_fit_recompute_modes[k];
        double floor = *flops_per_token * rm->forward_rerun / 3.0, said = 0.0;
        if (m.iface->recompute_flops_per_token)
            said = m.iface->recompute_flops_per_token(&m, base->eng.seq, (fsdp_recompute)rm->value);
        recompute_flops[k] = said > floor ? said : floor;
    }
    shape->batch = base->eng.batch;
    shape->seq = base->eng.seq;
    shape->n_head = m.n_head;
    shape->channels = m.n_embd;
    /* the widest matmul output: the largest first dimension of a matrix */
    int widest = m.padded_vocab_size;
    for (int u = 0; u < m.n_units; u++)
        for (int k = 0; k < m.units[u].n_params; k++)
            if (m.units[u].params[k].ndim == 2 && m.units[u].params[k].shape[0] > widest)
                widest = (int)m.units[u].params[k].shape[0];
    shape->max_out = widest;
    fsdp_model_free(&m);
    return FSDP_STATUS_OK;
}

/* ---- one candidate -------------------------------------------------------------- */

struct fit_ctx {
    const fsdp_fit_request *req;
    fsdp_fit_result *res;
    double flops_per_token;
    double recompute_flops[8];      /* per token, per fsdp_fit_recompute_modes entry */
    fsdp_cost_shape shape;
    int n_settings;                 /* candidates per micro-batch */
    atomic_int next;                /* next micro-batch chain to take */
    atomic_int runs;
    atomic_bool failed;
    pthread_mutex_t mu;             /* guards the first error below */
    fsdp_status st;
    char msg[FSDP_ERROR_MSG_MAX];
};

/* Shard strategy a needs no more memory than b: only FULL_SHARD before
 * SHARD_GRAD_OP and before HYBRID (which shards over fewer ranks) (fit.h). */
static bool shard_no_more(fsdp_shard_strategy a, fsdp_shard_strategy b)
{
    return a == b ||
           (a == FSDP_SHARD_FULL && (b == FSDP_SHARD_GRAD_OP || b == FSDP_SHARD_HYBRID));
}

/* a needs no more memory than b (fit.h's partial order). */
static bool needs_no_more(const fsdp_fit_candidate *a, const fsdp_fit_candidate *b)
{
    return a->batch == b->batch && a->grad_accum == b->grad_accum && a->accum == b->accum &&
           shard_no_more(a->shard, b->shard) &&
           (a->offload & b->offload) == b->offload && a->prefetch <= b->prefetch &&
           fsdp_fit_recompute_modes[a->recompute].memory_rank <=
               fsdp_fit_recompute_modes[b->recompute].memory_rank;
}

/* What a candidate's meta run moves, for the cost model: host memory
 * (pinned memory of every device, and the simulated devices on cpu), the
 * host update's and the PCIe link's bytes, the busiest rank's gathered and
 * reduced bytes and the busiest node's from the others. */
struct plan_traffic {
    size_t host, update, pcie, reduce, gather, igather, ireduce;
    size_t train_shard; /* the largest rank's trainable shard, with the trainable
                         * shards in host memory */
};

static void sum_traffic(const fsdp_plan *p, const fsdp_engine_config *e, fsdp_backend backend,
                        int grad_accum, struct plan_traffic *t)
{
    memset(t, 0, sizeof *t);
    size_t dt = fsdp_dtype_size(e->compute_dtype);
    bool train_up = fsdp_offload_trainable_params(e);
    /* per updated element: the optimizer's own traffic, and the compute-dtype copy */
    size_t per_elem = fsdp_optim_step_bytes(fsdp_optim_or_default(e->optim)) +
                      (e->compute_dtype == FSDP_DTYPE_BF16 ? 2 : 0);
    for (int r = 0; r < p->n_ranks; r++) {
        const fsdp_plan_rank *pr = &p->ranks[r];
        t->host += pr->host.peak_bytes;
        if (backend == FSDP_BACKEND_CPU)
            t->host += pr->mem.peak_bytes;
        /* offload: the CPU updates the pinned fp32 master's elements (beside which
         * the host keeps a compute-dtype staging copy unless that is fp32); each
         * micro-step's reduced gradient goes down, the parameters come back up:
         * once per step, or with the trainable shards on the host, before each
         * gather (param_upload_bytes, below). Not the gradient bytes: the tree's
         * partial sums would count as elements */
        size_t staging = e->compute_dtype == FSDP_DTYPE_F32 ? 0 : dt;
        size_t pinned = pr->host.peak_kind_bytes[FSDP_MEM_PARAM];
        if (e->offload_params) /* the frozen shards: uploaded, never updated */
            pinned -= pinned > p->frozen_shard_bytes ? p->frozen_shard_bytes : pinned;
        size_t elems = pinned / (sizeof(float) + staging);
        size_t link = elems * (sizeof(float) * (size_t)grad_accum + (train_up ? 0 : dt));
        t->update += elems * per_elem;
        if (link > t->pcie)
            t->pcie = link;
        if (train_up && elems * dt > t->train_shard)
            t->train_shard = elems * dt;
        size_t g = pr->recv_bytes[FSDP_COLL_ALL_GATHER];
        size_t rd = fsdp_plan_coll_total(pr->recv_bytes) - g;
        if (g > t->gather)
            t->gather = g;
        if (rd > t->reduce)
            t->reduce = rd;
    }
    for (int q = 0; q < p->n_nodes; q++) { /* the busiest node's bytes from the others */
        size_t sent[FSDP_COLL_KIND_COUNT], recv[FSDP_COLL_KIND_COUNT];
        fsdp_plan_node_bytes(p, q, sent, recv);
        size_t g = recv[FSDP_COLL_ALL_GATHER], rd = fsdp_plan_coll_total(recv) - g;
        if (g > t->igather)
            t->igather = g;
        if (rd > t->ireduce)
            t->ireduce = rd;
    }
}

/* Measure candidate c with one meta run and judge it. */
static fsdp_status measure(struct fit_ctx *x, fsdp_fit_candidate *c)
{
    const fsdp_fit_request *req = x->req;
    fsdp_train_config cfg = req->base;
    fsdp_engine_config *e = &cfg.eng;
    e->batch = c->batch;
    e->grad_accum = c->grad_accum;
    e->shard = c->shard;
    e->offload = (c->offload & 1) != 0;
    e->offload_params = (c->offload & 2) != 0;
    e->prefetch = c->prefetch;
    e->accum = c->accum;
    apply_recompute(e, &fsdp_fit_recompute_modes[c->recompute]);
    cfg.trace_path = NULL;
    cfg.out = NULL;
    fsdp_plan p;
    fsdp_status st = fsdp_plan_run(&cfg, req->steps, &p);
    atomic_fetch_add(&x->runs, 1);
    if (st == FSDP_STATUS_INVALID_ARG) {
        /* the model refuses this micro-batch (too large a shape) */
        c->verdict = FSDP_FIT_INVALID;
        snprintf(c->why, sizeof c->why, "%s", fsdp_error_msg());
        fsdp_error_clear();
        return FSDP_STATUS_OK;
    }
    FSDP_TRY(st);
    int N = p.n_ranks;
    c->peak_bytes = fsdp_plan_max_peak(&p, &c->peak_device);
    const fsdp_plan_rank *pk = &p.ranks[c->peak_device];
    if (req->backend == FSDP_BACKEND_CUDA) {
        if (req->cuda_overhead) {
            c->cuda.total_bytes = req->cuda_overhead;
        } else {
            fsdp_cost_shape s = x->shape;
            s.batch = c->batch;
            fsdp_cost_cuda_overhead(N, e->compute_dtype, &s, pk->mem.n_live, &c->cuda);
        }
    }
    c->device_bytes = c->peak_bytes + c->cuda.total_bytes;
    c->grad_bytes = (c->offload & 1) ? pk->host.peak_kind_bytes[FSDP_MEM_GRAD]
                               : pk->mem.peak_kind_bytes[FSDP_MEM_GRAD];
    struct plan_traffic t;
    sum_traffic(&p, e, req->backend, c->grad_accum, &t);
    c->host_bytes = t.host;
    double tokens = (double)c->batch * (double)e->seq * (double)c->grad_accum;
    fsdp_cost_input in = {
        .flops = tokens * (x->flops_per_token + x->recompute_flops[c->recompute]),
        .dtype = e->compute_dtype,
        .prefetch = c->prefetch,
        .offload = (c->offload & 1) != 0,
        .gather_bytes = t.gather,
        .reduce_bytes = t.reduce,
        .inter_gather_bytes = t.igather,
        .inter_reduce_bytes = t.ireduce,
        .n_calls = fsdp_plan_coll_total(pk->n_calls),
        .pcie_bytes = (c->offload & 1) ? t.pcie : 0,
        .host_update_bytes = (c->offload & 1) ? t.update : 0,
        /* a host shard goes up before each gather: forward and backward when the
         * strategy frees units after forward, once per micro-step otherwise */
        .param_upload_bytes = e->offload_params
                                  ? (p.frozen_shard_bytes + t.train_shard) *
                                        (size_t)c->grad_accum *
                                        (e->shard == FSDP_SHARD_FULL ||
                                                 e->shard == FSDP_SHARD_HYBRID
                                             ? 2
                                             : 1)
                                  : 0,
    };
    fsdp_cost_estimate(&req->machine, &in, &c->cost);
    c->tokens_per_s = c->cost.step_s > 0 ? tokens * N / c->cost.step_s : 0;
    if (c->device_bytes > req->device_mem)
        c->verdict = FSDP_FIT_OVER_DEVICE;
    else if (req->host_mem && c->host_bytes > req->host_mem)
        c->verdict = FSDP_FIT_OVER_HOST;
    else
        c->verdict = FSDP_FIT_FITS;
    fsdp_plan_free(&p);
    return FSDP_STATUS_OK;
}

/* One micro-batch's chain: settings in order of least memory first. */
static fsdp_status search_chain(struct fit_ctx *x, int chain)
{
    fsdp_fit_candidate *cand = x->res->cand + (size_t)chain * (size_t)x->n_settings;
    for (int i = 0; i < x->n_settings; i++) {
        if (atomic_load(&x->failed))
            return FSDP_STATUS_OK; /* another chain failed: its error is reported */
        fsdp_fit_candidate *c = &cand[i];
        for (int j = 0; j < i; j++) {
            const fsdp_fit_candidate *d = &cand[j];
            /* over by the engine's peak and the overheads every setting of this
             * micro-batch shares (the allocator's estimate follows the
             * allocation count, which is not ordered like the peak) */
            bool over = d->verdict == FSDP_FIT_OVER_DEVICE &&
                        d->peak_bytes + d->cuda.total_bytes - d->cuda.cache_bytes >
                            x->req->device_mem;
            bool rules_out = (over || d->verdict == FSDP_FIT_INVALID) && d->pruned_by < 0;
            if (rules_out && needs_no_more(d, c)) {
                c->verdict = d->verdict == FSDP_FIT_INVALID ? FSDP_FIT_INVALID : FSDP_FIT_PRUNED;
                c->pruned_by = chain * x->n_settings + j;
                if (d->verdict == FSDP_FIT_INVALID)
                    memcpy(c->why, d->why, sizeof c->why); /* NUL-terminated within */
                break;
            }
        }
        if (c->pruned_by < 0)
            FSDP_TRY(measure(x, c));
    }
    return FSDP_STATUS_OK;
}

static void *search_worker(void *arg)
{
    struct fit_ctx *x = arg;
    int n_chains = x->res->n_cand / x->n_settings;
    for (;;) {
        int chain = atomic_fetch_add(&x->next, 1);
        if (chain >= n_chains)
            break;
        fsdp_status st = search_chain(x, chain);
        if (st != FSDP_STATUS_OK) {
            pthread_mutex_lock(&x->mu);
            if (!atomic_load(&x->failed)) {
                x->st = st;
                snprintf(x->msg, sizeof x->msg, "%s", fsdp_error_msg());
                atomic_store(&x->failed, true);
            }
            pthread_mutex_unlock(&x->mu);
            break;
        }
    }
    return NULL;
}

/* ---- the search -------------------------------------------------------------- */

/* A rank that grows along the partial order, so a chain is walked from the
 * least memory up. */
static int setting_level(const fsdp_fit_candidate *c)
{
    return (c->shard == FSDP_SHARD_GRAD_OP || c->shard == FSDP_SHARD_HYBRID) +
           ((c->offload & 1) ? 0 : 1) - ((c->offload & 2) ? 1 : 0) + (c->prefetch ? 1 : 0) +
           fsdp_fit_recompute_modes[c->recompute].memory_rank;
}

static int cmp_level(const void *a, const void *b)
{
    const fsdp_fit_candidate *x = a, *y = b;
    int lx = setting_level(x), ly = setting_level(y);
    if (lx != ly)
        return lx < ly ? -1 : 1;
    /* ties: the enumeration order, kept in pruned_by until the sort is done */
    return (x->pruned_by > y->pruned_by) - (x->pruned_by < y->pruned_by);
}

static int cmp_rank_of(const fsdp_fit_result *r, int a, int b)
{
    const fsdp_fit_candidate *x = &r->cand[a], *y = &r->cand[b];
    if (x->cost.step_s != y->cost.step_s)
        return x->cost.step_s < y->cost.step_s ? -1 : 1;
    if (x->accum != y->accum) /* the tree first: exact for any split (fit.h) */
        return x->accum == FSDP_ACCUM_TREE ? -1 : 1;
    if (x->device_bytes != y->device_bytes)
        return x->device_bytes < y->device_bytes ? -1 : 1;
    return (a > b) - (a < b);
}

/* Insertion sort of the fitting candidates (a few hundred at most). */
static void rank_fits(fsdp_fit_result *r)
{
    for (int i = 1; i < r->n_fits; i++) {
        int v = r->ranked[i], j = i - 1;
        while (j >= 0 && cmp_rank_of(r, r->ranked[j], v) > 0) {
            r->ranked[j + 1] = r->ranked[j];
            j--;
        }
        r->ranked[j + 1] = v;
    }
}

static bool allowed(unsigned mask, int value) { return !mask || (mask & (1u << (unsigned)value)); }

/* Whether the search runs accumulation mode m at A micro-steps. */
static bool chain_wanted(const fsdp_fit_request *req, int m, int A)
{
    if (!allowed(req->accum_mask, m))
        return false;
    /* flat at one micro-step is the tree's run: only when the tree is not tried */
    return m != FSDP_ACCUM_FLAT || A > 1 || !allowed(req->accum_mask, FSDP_ACCUM_TREE);
}

/* The request's settings that make no search: INVALID_ARG naming them. */
static fsdp_status check_request(const fsdp_fit_request *req)
{
    const fsdp_engine_config *e = &req->base.eng;
    int N = e->n_ranks, G = req->global_batch;
    if (N < 1 || N > FSDP_MAX_RANKS)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "fit: need 1..%d devices (got %d)",
                              FSDP_MAX_RANKS, N);
    if (G < 1 || G % N)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "fit: the global batch of %d sequences does not split over %d "
                              "devices; use a multiple of %d (e.g. --global-batch %d)",
                              G, N, N, G < N ? N : G / N * N);
    if (!req->device_mem)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "fit: need the memory of each device (--device-mem, e.g. 80GiB)");
    if (req->steps < 1 || req->jobs < 0)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "fit: need steps >= 1 and jobs >= 0");
    if (req->backend != FSDP_BACKEND_CPU && req->backend != FSDP_BACKEND_CUDA)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "fit: plan for a cpu or cuda run (the backend the run will use)");
    return FSDP_STATUS_OK;
}

/* The settings of one micro-batch that the request leaves open, into proto
 * (room for FSDP_SHARD_COUNT * 4 * 2 * 8), least memory first; *n_out of
 * them. INVALID_ARG when none is left. */
static fsdp_status enumerate_settings(const fsdp_fit_request *req, const fsdp_fit_result *out,
                                      fsdp_fit_candidate *proto, int *n_out)
{
    const fsdp_engine_config *e = &req->base.eng;
    /* params offload alone only moves frozen parameters: tried when some are;
     * with the optimizer's it moves the trainable shards too: always tried */
    bool frozen = req->base.lora.r > 0 || (req->base.freeze && req->base.freeze[0]);
    int n_set = 0;
    FSDP_ASSERT(fsdp_fit_n_recompute_modes <= 8);
    for (int rc = 0; rc < fsdp_fit_n_recompute_modes; rc++)
        for (int s = 0; s < FSDP_SHARD_COUNT; s++)
            for (int off = 3; off >= 0; off--)
                for (int pf = 0; pf <= 1; pf++) {
                    /* hybrid is full sharding on one node: only tried on several */
                    if ((s == FSDP_SHARD_HYBRID && e->n_nodes <= 1) || (off == 2 && !frozen))
                        continue;
                    /* a mode the model does not implement is left out, not tried:
                     * the other modes of the micro-batch stay in the search */
                    if (!allowed(req->recompute_mask, rc) ||
                        (out->recompute_refused & (1u << (unsigned)rc)) ||
                        !allowed(req->shard_mask, s) || !allowed(req->offload_mask, off) ||
                        !allowed(req->prefetch_mask, pf))
                        continue;
                    fsdp_fit_candidate *c = &proto[n_set];
                    memset(c, 0, sizeof *c);
                    c->shard = (fsdp_shard_strategy)s;
                    c->offload = off;
                    c->prefetch = pf;
                    c->recompute = rc;
                    c->pruned_by = n_set++; /* enumeration order, for cmp_level's ties */
                }
    if (!n_set && req->recompute_mask && !(req->recompute_mask & ~out->recompute_refused))
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "fit: %s", out->refused_why);
    if (!n_set)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "fit: the pinned --shard, --offload, --prefetch and --recompute "
                              "values leave nothing to try");
    qsort(proto, (size_t)n_set, sizeof proto[0], cmp_level);
    *n_out = n_set;
    return FSDP_STATUS_OK;
}

/* out->cand: each chain (micro-batch x accumulation mode the request
 * allows) times the n_set settings of proto; *n_chain of them. */
static fsdp_status make_candidates(const fsdp_fit_request *req, fsdp_fit_result *out,
                                   const fsdp_fit_candidate *proto, int n_set, int *n_chain_out)
{
    int N = req->base.eng.n_ranks, G = req->global_batch;
    /* chains: micro-batch x accumulation mode; at one micro-step both
     * modes are the same run, so flat is left out there unless pinned */
    int K = G / N, n_chain = 0;
    for (int b = 1; b <= K; b++)
        for (int m = 0; m < FSDP_ACCUM_MODE_COUNT; m++)
            n_chain += K % b == 0 && chain_wanted(req, m, K / b);
    if (!n_chain)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "fit: the pinned --accum value leaves nothing to try");
    out->n_cand = n_chain * n_set;
    out->cand = calloc((size_t)out->n_cand, sizeof *out->cand);
    out->ranked = calloc((size_t)out->n_cand, sizeof *out->ranked);
    if (!out->cand || !out->ranked) {
        fsdp_fit_free(out);
        return fsdp_error_set(FSDP_STATUS_OOM, "fit: out of host memory for %d candidates",
                              out->n_cand);
    }
    for (int b = 1, chain = 0; b <= K; b++)
        for (int m = 0; m < FSDP_ACCUM_MODE_COUNT; m++) {
            if (K % b || !chain_wanted(req, m, K / b))
                continue;
            for (int i = 0; i < n_set; i++) {
                fsdp_fit_candidate *c = &out->cand[chain * n_set + i];
                *c = proto[i];
                c->batch = b;
                c->grad_accum = K / b;
                c->accum = (fsdp_accum_mode)m;
                c->pruned_by = -1;
            }
            chain++;
        }
    *n_chain_out = n_chain;
    return FSDP_STATUS_OK;
}

/* Measure the chains on req->jobs threads (0: the cores over the devices),
 * the calling thread one of them; the candidates that fit, ranked. */
static fsdp_status run_search(struct fit_ctx *x, int n_set, int n_chain)
{
    const fsdp_fit_request *req = x->req;
    fsdp_fit_result *out = x->res;
    int N = req->base.eng.n_ranks;
    x->n_settings = n_set;
    atomic_init(&x->next, 0);
    atomic_init(&x->runs, 0);
    atomic_init(&x->failed, false);
    pthread_mutex_init(&x->mu, NULL);
    int jobs = req->jobs;
    if (!jobs) {
        long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
        jobs = ncpu > N ? (int)(ncpu / N) : 1;
    }
    if (jobs > n_chain)
        jobs = n_chain;
    pthread_t tid[64];
    if (jobs > 64)
        jobs = 64;
    int started = 0;
    for (; started < jobs - 1; started++)
        if (pthread_create(&tid[started], NULL, search_worker, x) != 0)
            break;
    search_worker(x); /* the calling thread is a worker too */
    for (int i = 0; i < started; i++)
        pthread_join(tid[i], NULL);
    pthread_mutex_destroy(&x->mu);
    out->jobs = started + 1;
    out->n_runs = atomic_load(&x->runs);
    if (atomic_load(&x->failed)) {
        fsdp_fit_free(out);
        return fsdp_error_set(x->st, "%s", x->msg);
    }
    for (int i = 0; i < out->n_cand; i++)
        if (out->cand[i].verdict == FSDP_FIT_FITS)
            out->ranked[out->n_fits++] = i;
    rank_fits(out);
    return FSDP_STATUS_OK;
}

/* With accumulation, the best setting in the other accumulation mode,
 * measured if it was pruned, so the report can say what each mode needs. */
static fsdp_status measure_best_twin(struct fit_ctx *x)
{
    fsdp_fit_result *out = x->res;
    out->best_twin = -1;
    if (out->best < 0 || out->cand[out->best].grad_accum <= 1)
        return FSDP_STATUS_OK;
    const fsdp_fit_candidate *b = &out->cand[out->best];
    for (int i = 0; i < out->n_cand; i++) {
        fsdp_fit_candidate *c = &out->cand[i];
        if (c->accum == b->accum || c->batch != b->batch || c->shard != b->shard ||
            c->offload != b->offload || c->prefetch != b->prefetch ||
            c->recompute != b->recompute)
            continue;
        if (c->verdict == FSDP_FIT_PRUNED) {
            fsdp_status st = measure(x, c);
            out->n_runs++;
            if (st != FSDP_STATUS_OK) {
                fsdp_fit_free(out);
                return st;
            }
            c->pruned_by = -1;
        }
        if (c->verdict != FSDP_FIT_INVALID)
            out->best_twin = i;
        break;
    }
    return FSDP_STATUS_OK;
}

fsdp_status fsdp_fit_search(const fsdp_fit_request *req, fsdp_fit_result *out)
{
    memset(out, 0, sizeof *out);
    out->best = -1;
    out->best_twin = -1;
    double t0 = fsdp_now_s();
    FSDP_TRY(check_request(req));
    struct fit_ctx x = {.req = req, .res = out, .st = FSDP_STATUS_OK};
    FSDP_TRY(model_figures(&req->base, &out->numel, &x.flops_per_token, x.recompute_flops,
                           &x.shape, req->recompute_mask, &out->recompute_refused,
                           out->refused_why, sizeof out->refused_why));
    out->flops_per_token = x.flops_per_token;
    fsdp_fit_candidate proto[FSDP_SHARD_COUNT * 4 * 2 * 8];
    int n_set = 0, n_chain = 0;
    FSDP_TRY(enumerate_settings(req, out, proto, &n_set));
    FSDP_TRY(make_candidates(req, out, proto, n_set, &n_chain));
    FSDP_TRY(run_search(&x, n_set, n_chain));
    out->best = out->n_fits ? out->ranked[0] : -1;
    FSDP_TRY(measure_best_twin(&x));
    out->wall_s = fsdp_now_s() - t0;
    return FSDP_STATUS_OK;
}

void fsdp_fit_free(fsdp_fit_result *r)
{
    free(r->cand);
    free(r->ranked);
    memset(r, 0, sizeof *r);
    r->best = -1;
    r->best_twin = -1;
}

/* ---- command lines ------------------------------------------------------------ */

/* A size as --device-mem reads it, exactly: "80GiB", "1536MiB", or bytes. */
static void size_arg(char *buf, size_t n, size_t v)
{
    static const struct { size_t unit; const char *suffix; } units[] = {
        {(size_t)1 << 40, "TiB"}, {(size_t)1 << 30, "GiB"}, {(size_t)1 << 20, "MiB"},
        {(size_t)1 << 10, "KiB"}};
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
        if (v >= units[i].unit && v % units[i].unit == 0) {
            snprintf(buf, n, "%zu%s", v / units[i].unit, units[i].suffix);
            return;
        }
    snprintf(buf, n, "%zu", v);
}

/* s as one word of a POSIX shell: as it is when it is safe, else in single
 * quotes (a quote inside becomes '\''). */
static void shell_word(char *buf, size_t n, const char *s)
{
    bool safe = *s != '\0';
    for (const char *p = s; *p; p++)
        if (!strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_./:=,+-@%", *p))
            safe = false;
    if (safe) {
        snprintf(buf, n, "%s", s);
        return;
    }
    size_t k = 0;
    if (n < 3) {
        if (n)
            buf[0] = '\0';
        return;
    }
    buf[k++] = '\'';
    for (const char *p = s; *p && k + 6 < n; p++) {
        if (*p == '\'') {
            memcpy(buf + k, "'\\''", 4);
            k += 4;
        } else {
            buf[k++] = *p;
        }
    }
    buf[k++] = '\'';
    buf[k] = '\0';
}

void fsdp_fit_command(const fsdp_fit_request *req, const fsdp_fit_candidate *c, char *buf,
                      size_t n)
{
    const fsdp_engine_config *e = &req->base.eng;
    char model[512], mem[32], rc[64] = "";
    shell_word(model, sizeof model, req->base.model ? req->base.model : "small");
    /* cuda: the engine's share of the device, after what the run holds beyond it */
    size_t cap = req->device_mem;
    if (req->backend == FSDP_BACKEND_CUDA)
        cap = (cap - c->cuda.total_bytes) / ((size_t)1 << 20) * ((size_t)1 << 20);
    size_arg(mem, sizeof mem, cap);
    const fsdp_recompute_mode *m = &fsdp_fit_recompute_modes[c->recompute];
    if (m->value != 0)
        snprintf(rc, sizeof rc, " --recompute %s", m->name);
    if (c->accum != FSDP_ACCUM_TREE)
        snprintf(rc + strlen(rc), sizeof rc - strlen(rc), " --accum %s",
                 fsdp_names_name(&fsdp_accum_names, (int)c->accum));
    /* several nodes: one process per node, --devices each */
    int nodes = e->n_nodes > 1 ? e->n_nodes : 1;
    char launch[32] = "";
    if (nodes > 1)
        snprintf(launch, sizeof launch, "mpirun -np %d ", nodes);
    snprintf(buf, n,
             "%sfsdp train --backend %s --model %s --devices %d --seq %d --batch %d "
             "--grad-accum %d "
             "--shard %s --offload %s --prefetch %s --precision %s%s --device-mem %s",
             launch, fsdp_backend_name(req->backend), model, e->n_ranks / nodes, e->seq, c->batch,
             c->grad_accum, fsdp_shard_strategy_name(c->shard),
             fsdp_names_name(&fsdp_offload_names, c->offload), c->prefetch ? "on" : "off",
             fsdp_dtype_name(e->compute_dtype), rc, mem);
}

/* ---- fsdp train's check ---------------------------------------------------------- */

fsdp_status fsdp_fit_check_train(const fsdp_train_config *cfg, size_t device_total)
{
    const fsdp_engine_config *e = &cfg->eng;
    size_t cap = e->device_mem;
    if (e->backend == FSDP_BACKEND_META || (!cap && !device_total))
        return FSDP_STATUS_OK;
    fsdp_train_config run = *cfg;
    run.trace_path = NULL;
    run.out = NULL;
    fsdp_plan p;
    FSDP_TRY(fsdp_plan_run(&run, 2, &p));
    int who;
    size_t peak = fsdp_plan_max_peak(&p, &who);
    fsdp_cuda_overhead oh;
    memset(&oh, 0, sizeof oh);
    if (device_total && e->backend == FSDP_BACKEND_CUDA) {
        size_t numel;
        double fpt, rfpt[8];
        fsdp_cost_shape s;
        fsdp_status st = model_figures(cfg, &numel, &fpt, rfpt, &s, 0, NULL, NULL, 0);
        if (st != FSDP_STATUS_OK) {
            fsdp_plan_free(&p);
            return st;
        }
        fsdp_cost_cuda_overhead(e->n_ranks, e->compute_dtype, &s, p.ranks[who].mem.n_live, &oh);
    }
    fsdp_plan_free(&p);
    /* ranks sharing a GPU (--ranks-per-device) each hold their allocations
     * and own buffers there, beside one CUDA context */
    size_t rpd = e->backend == FSDP_BACKEND_CUDA && e->ranks_per_device > 1
                     ? (size_t)e->ranks_per_device : 1;
    size_t gpu_bytes = rpd * (peak + oh.total_bytes - oh.context_bytes) + oh.context_bytes;
    char b1[32], b2[32], b3[32], b4[32], what[200], limit[32], ranks[48] = "";
    bool over_cap = cap && peak > cap;
    bool over_total = !over_cap && device_total && gpu_bytes > device_total;
    if (!over_cap && !over_total)
        return FSDP_STATUS_OK;
    size_t limit_bytes = over_cap ? cap : device_total, need = over_cap ? peak : gpu_bytes;
    if (over_cap) {
        snprintf(what, sizeof what, "%s (the engine's allocations, exact)",
                 fsdp_fmt_bytes(b1, sizeof b1, (double)peak));
        snprintf(limit, sizeof limit, "--device-mem");
    } else {
        if (rpd > 1)
            snprintf(ranks, sizeof ranks, "%zu ranks sharing it x ", rpd);
        snprintf(what, sizeof what, "%s%s (the engine's allocations, exact) + %s the CUDA context, "
                 "cuBLAS, op scratch and NCCL hold (estimate)",
                 ranks, fsdp_fmt_bytes(b1, sizeof b1, (double)peak),
                 fsdp_fmt_bytes(b2, sizeof b2, (double)(gpu_bytes - rpd * peak)));
        snprintf(limit, sizeof limit, "the GPU's memory");
    }
    char model[512], mem[32], optim_arg[48] = "", nodes_arg[32] = "";
    shell_word(model, sizeof model, cfg->model ? cfg->model : "small");
    if (e->optim)
        snprintf(optim_arg, sizeof optim_arg, "%s ", e->optim->name);
    size_arg(mem, sizeof mem, limit_bytes);
    if (e->n_nodes > 1)
        snprintf(nodes_arg, sizeof nodes_arg, " --nodes %d", e->n_nodes);
    return fsdp_error_set(
        FSDP_STATUS_OOM,
        "the plan says this run does not fit: device %d would need %s, %s over the cap %s (%s); "
        "it would run out of memory during the first step. Find the fastest setting that fits "
        "with: fsdp plan --fit --target %s --model %s --devices %d%s --seq %d --precision %s "
        "%s%s--global-batch %llu --device-mem %s",
        who, what, fsdp_fmt_bytes(b3, sizeof b3, (double)(need - limit_bytes)),
        fsdp_fmt_bytes(b4, sizeof b4, (double)limit_bytes), limit, fsdp_backend_name(e->backend),
        model, e->n_ranks / (e->n_nodes > 1 ? e->n_nodes : 1), nodes_arg, e->seq,
        fsdp_dtype_name(e->compute_dtype),
        e->optim && e->optim != fsdp_optim_at(0) ? "--optimizer " : "",
        e->optim && e->optim != fsdp_optim_at(0) ? optim_arg : "",
        (unsigned long long)e->n_ranks * (unsigned long long)e->batch *
            (unsigned long long)e->grad_accum,
        mem);
}
