/*
 * train.c - the training loop on every rank, progress and metrics on rank 0,
 * held-out accuracy by greedy decoding for the synthetic task.
 *
 * All ranks run the same loop in lockstep (every engine call is
 * collective). Rank 0 prints and writes the metrics; it reads every rank's
 * figures from the engine's x_stats, filled before the barrier that ends
 * each step.
 *
 * A job of several processes (cfg->procs: one per node, comm/procs.h)
 * runs the same loop in each, on its own ranks of one global world; only
 * process 0 (where rank 0 runs) prints, writes the metrics, the trace of
 * its ranks (the others write theirs beside it) and the checkpoint
 * manifest. Before the first step the processes agree on what they share:
 * the checkpoints' run id, that the checkpoint directory is one they all
 * see, and the checkpoint to resume from.
 *
 * Stopping early is a decision all ranks take together: after each step
 * they meet in an exchange that ORs what each of them saw, in every
 * process of the job (fsdp_engine_or: a stop request,
 * a failed metrics write, a data file that changed or could not be read),
 * so every rank leaves at the same step, and the final checkpoint, a
 * collective, is written by all of them. An error found this way is kept
 * (first one wins) and returned after that checkpoint.
 */
#include <math.h>
#include <pthread.h>
#include <string.h>
#include <time.h>

#include "ckpt/modelfile.h"
#include "comm/procs.h"
#include "core/log.h"
#include "core/world.h"
#include "device/cpu.h"
#include "engine/engine_ckpt.h"
#include "engine/trace.h"
#include "ops/cpu/blas.h"
#include "train/job.h"
#include "train/outputs.h"
#include "train/train.h"

void fsdp_train_config_default(fsdp_train_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    fsdp_engine_config *e = &cfg->eng;
    e->backend = fsdp_backend_default();
    e->comm = FSDP_COMM_AUTO;
    e->n_ranks = fsdp_backend_default_devices(e->backend);
    e->ranks_per_device = 1;
    e->shard = FSDP_SHARD_FULL;
    e->compute_dtype = FSDP_DTYPE_F32;
    e->prefetch = true;
    e->batch = 16;  /* x 4 devices: 64 synthetic problems per step */
    e->seq = 14;    /* one synthetic problem per row (data/synth.c) */
    e->grad_accum = 1;
    e->optim_hp.weight_decay = 0.1f; /* the optimizer's own: its defaults (optim/) */
    e->clip = 1.0f;
    e->seed = 1337;
    cfg->model = "small";
    cfg->data = "synthetic";
    cfg->steps = 600;
    cfg->lr = 3e-3f;
    cfg->warmup = 20;
    cfg->lr_min_frac = 0.1f;
    cfg->eval_problems = 512;
    cfg->n_samples = 5;
    cfg->out = stdout;
}

float fsdp_train_lr(const fsdp_train_config *cfg, int step)
{
    if (step < cfg->warmup)
        return cfg->lr * (float)(step + 1) / (float)cfg->warmup;
    int span = cfg->steps - cfg->warmup;
    double progress = span > 1 ? (double)(step - cfg->warmup) / (double)(span - 1) : 1.0;
    if (progress > 1.0)
        progress = 1.0;
    double lo = (double)cfg->lr * (double)cfg->lr_min_frac;
    return (float)(lo + 0.5 * (1.0 + cos(M_PI * progress)) * ((double)cfg->lr - lo));
}

/* Why the ranks stop early (the bits of the barrier after each step). */
enum {
    STOP_REQUEST = 1u << 0, /* cfg->stop: finish, checkpoint, return OK */
    STOP_ERROR = 1u << 1,   /* t->stop_st: the step counts; stop after it */
    STOP_DATA = 1u << 2,    /* a rank could not read this step's batch: it does not count */
};

struct trainer {
    const fsdp_train_config *cfg;
    FILE *out;                /* t->out on process 0; NULL on the others */
    fsdp_world *world;
    fsdp_engine_shared sh;
    fsdp_model model;
    fsdp_data *data;
    fsdp_train_result *res;
    fsdp_metrics log;         /* --log (log.f NULL: none); rank 0 writes */
    char oom_hint[192];       /* what a device out-of-memory message suggests */
    pthread_mutex_t mu;       /* guards stop_st and stop_msg */
    fsdp_status stop_st;      /* the error that stops the run early (first wins), or OK */
    char stop_msg[FSDP_ERROR_MSG_MAX];
    int saved_step;           /* the newest step whose state is on disk (resumed from, or
                               * written by this run); rank 0 writes, every rank reads after
                               * the save's barriers */
    double flops_per_token;   /* 6 P + attention, for MFU */
    double peak_flops;        /* per device; 0 = unknown (no MFU) */
    double tok_s_sum;
    int tok_s_n;
    int eval_correct, eval_seen; /* the job's, written by rank 0 */
    fsdp_ckpt_manifest ck_base;   /* run-level part of the manifests this run writes */
    fsdp_ckpt_manifest ck_resume; /* the checkpoint resumed from */
    char ck_path[FSDP_CKPT_PATH_MAX]; /* its directory; "" when starting fresh */
    int start_step;
    fsdp_modelfile *mf;       /* --model FILE: the initial weights, or NULL */
    fsdp_ckpt_lock ck_lock;   /* --ckpt-dir held for the run: one run per directory */
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Keep the first error that stops the run early (any rank). */
static void stop_error(struct trainer *t, fsdp_status st, const char *msg)
{
    pthread_mutex_lock(&t->mu);
    if (t->stop_st == FSDP_STATUS_OK) {
        t->stop_st = st;
        snprintf(t->stop_msg, sizeof t->stop_msg, "%s", msg);
    }
    pthread_mutex_unlock(&t->mu);
}

/* Tokens per step, in 64 bits (each factor is bounded, their product is not
 * by an int). */
static uint64_t tokens_per_step(const fsdp_engine_config *ec)
{
    return (uint64_t)ec->batch * (uint64_t)ec->seq * (uint64_t)ec->grad_accum *
           (uint64_t)ec->n_ranks;
}

/* Rank 0 after a step that counts: the progress line and the metrics
 * record (a failed write stops the run at the next step boundary). */
static void log_step(struct trainer *t, int step, const fsdp_step_result *r, double ms,
                     bool skipped)
{
    const fsdp_train_config *cfg = t->cfg;
    const fsdp_engine_config *ec = &cfg->eng;
    int N = ec->n_ranks;
    double tokens = (double)tokens_per_step(ec);
    double tok_s = tokens / (ms / 1000.0);
    if (step > t->start_step) {
        t->tok_s_sum += tok_s;
        t->tok_s_n++;
    }
    size_t peak = 0, host = 0;
    for (int k = 0; k < N; k++) {
        if (t->sh.x_stats[k].peak_bytes > peak)
            peak = t->sh.x_stats[k].peak_bytes;
        if (t->sh.x_stats[k].host_peak_bytes > host)
            host = t->sh.x_stats[k].host_peak_bytes;
    }
    int rpd = ec->ranks_per_device > 0 ? ec->ranks_per_device : 1;
    int n_gpus = (N + rpd - 1) / rpd; /* virtual ranks share a GPU */
    double mfu = t->peak_flops > 0 ? t->flops_per_token * tok_s / (t->peak_flops * n_gpus) : -1;
    if (t->out) {
        char pb[32], hb[32], tk[32];
        if (tok_s >= 1e3)
            snprintf(tk, sizeof tk, "%.1fk", tok_s / 1e3);
        else
            snprintf(tk, sizeof tk, "%.0f", tok_s);
        if (ec->backend == FSDP_BACKEND_META) /* nothing is computed: no loss or norm */
            fprintf(t->out, "step %5d/%d | meta: no math | lr %.2e | peak %s/dev", step + 1,
                    cfg->steps, r->lr, fsdp_fmt_bytes(pb, sizeof pb, (double)peak));
        else
            fprintf(t->out,
                    "step %5d/%d | loss %.6f | lr %.2e | norm %.3f | %s tok/s | %.1f ms | peak %s/dev",
                    step + 1, cfg->steps, r->loss, r->lr, r->grad_norm, tk, ms,
                    fsdp_fmt_bytes(pb, sizeof pb, (double)peak));
        if (ec->offload)
            fprintf(t->out, " | host %s/dev", fsdp_fmt_bytes(hb, sizeof hb, (double)host));
        if (mfu >= 0)
            fprintf(t->out, " | mfu %.1f%%", 100 * mfu);
        if (skipped)
            fprintf(t->out, " | not finite: update skipped");
        fputc('\n', t->out);
        fflush(t->out);
    }
    if (t->log.f && !t->log.failed) {
        fsdp_metrics_record rec = {.step = step + 1, .loss = r->loss, .lr = r->lr,
                                   .grad_norm = r->grad_norm, .tokens = tokens,
                                   .tokens_per_s = tok_s, .step_ms = ms, .mfu = mfu,
                                   .skipped = skipped, .n_ranks = N, .stats = t->sh.x_stats,
                                   .inter = t->sh.sm.n_nodes > 1};
        fsdp_status st = fsdp_metrics_write(&t->log, &rec);
        if (st != FSDP_STATUS_OK)
            stop_error(t, st, fsdp_error_msg());
    }
}

/* This rank's reasons to stop, brought to the barrier after each step (and
 * before the first): its engine's data error; on rank 0 also a stop
 * request, a failed metrics write and a data file that changed. */
static unsigned stop_bits(struct trainer *t, fsdp_engine *e, int rank)
{
    const fsdp_train_config *cfg = t->cfg;
    unsigned bits = 0;
    const char *msg = NULL;
    fsdp_status st = fsdp_engine_data_error(e, &msg);
    if (st != FSDP_STATUS_OK) {
        stop_error(t, st, msg);
        bits |= STOP_DATA;
    }
    if (rank != 0)
        return bits;
    if (cfg->stop && atomic_load(cfg->stop))
        bits |= STOP_REQUEST;
    if (t->log.failed)
        bits |= STOP_ERROR;
    if (t->data && (st = fsdp_data_check(t->data)) != FSDP_STATUS_OK) {
        stop_error(t, st, fsdp_error_msg());
        fsdp_error_clear();
        bits |= STOP_ERROR;
    }
    return bits;
}

/* Greedy decoding of held-out synthetic problems: rank r takes rows
 * (k * N + r) * B + b of batch k; every rank runs the same number of
 * forwards. Returns this rank's correct/seen counts; rank 0 prints samples. */
static fsdp_status eval_synthetic(struct trainer *t, fsdp_engine *e, int rank)
{
    const fsdp_train_config *cfg = t->cfg;
    const fsdp_engine_config *ec = &cfg->eng;
    int N = ec->n_ranks, B = ec->batch, T = ec->seq, V = t->model.vocab_size;
    int Vp = t->model.padded_vocab_size;
    int64_t total = cfg->eval_problems, per_batch = (int64_t)N * B;
    int64_t n_batches = (total + per_batch - 1) / per_batch;
    int *tok = calloc((size_t)B * T, sizeof(int));
    int *len = calloc((size_t)B, sizeof(int)), *pos = calloc((size_t)B, sizeof(int));
    int *start = calloc((size_t)B, sizeof(int));
    float *logits = malloc((size_t)B * Vp * sizeof(float));
    char (*answers)[72] = calloc((size_t)B, sizeof *answers);
    fsdp_status st = FSDP_STATUS_OK;
    if (!tok || !len || !pos || !start || !logits || !answers) {
        st = fsdp_error_set(FSDP_STATUS_OOM, "out of host memory for evaluation");
        goto done;
    }
    int printed = 0, counts[2] = {0, 0}; /* this rank's correct, seen */
    for (int64_t k = 0; k < n_batches; k++) {
        unsigned stop = 0; /* a stop request ends the evaluation too */
        FSDP_CHECK(fsdp_engine_or(e, rank == 0 && cfg->stop && atomic_load(cfg->stop)
                                         ? STOP_REQUEST
                                         : 0u,
                                  &stop));
        if (stop) {
            if (rank == 0)
                t->res->interrupted = true;
            break;
        }
        int max_ans = 1;
        memset(tok, 0, (size_t)B * T * sizeof(int));
        for (int b = 0; b < B; b++) {
            int64_t idx = (k * N + rank) * B + b;
            char prompt[72];
            fsdp_synth_problem(ec->seed, (uint64_t)idx, prompt, answers[b]);
            /* a newline first, as a problem follows one in the training stream */
            int n = 0;
            tok[(size_t)b * T + n++] = '\n';
            for (const char *c = prompt; *c && n < T; c++)
                tok[(size_t)b * T + n++] = (unsigned char)*c;
            start[b] = len[b] = n;
            int al = (int)strlen(answers[b]);
            if (al > max_ans)
                max_ans = al;
        }
        for (int s = 0; s < max_ans; s++) {
            for (int b = 0; b < B; b++)
                pos[b] = len[b] - 1 < T - 1 ? len[b] - 1 : T - 1;
            FSDP_CHECK(fsdp_engine_forward(e, tok, B, pos, logits, NULL));
            for (int b = 0; b < B; b++) {
                if (len[b] >= T)
                    continue;
                const float *lg = logits + (size_t)b * Vp;
                int best = 0;
                for (int v = 1; v < V; v++)
                    if (lg[v] > lg[best])
                        best = v;
                tok[(size_t)b * T + len[b]++] = best;
            }
        }
        for (int b = 0; b < B; b++) {
            int64_t idx = (k * N + rank) * B + b;
            if (idx >= total)
                continue;
            int al = (int)strlen(answers[b]);
            bool ok = len[b] - start[b] >= al;
            char got[72];
            int g = 0;
            for (int i = start[b]; i < len[b] && g < 71; i++) {
                int c = tok[(size_t)b * T + i];
                got[g++] = c >= 32 && c < 127 ? (char)c : (c == '\n' ? '\n' : '?');
                if (i - start[b] < al && c != (unsigned char)answers[b][i - start[b]])
                    ok = false;
                if (c == '\n')
                    break;
            }
            got[g] = '\0';
            counts[0] += ok;
            counts[1]++;
            if (rank == 0 && t->out && printed < cfg->n_samples) {
                char prompt[72], ans[72];
                fsdp_synth_problem(ec->seed, (uint64_t)idx, prompt, ans);
                got[strcspn(got, "\n")] = '\0';
                ans[strcspn(ans, "\n")] = '\0';
                fprintf(t->out, "  sample: %s%-8s expected %-8s %s\n", prompt, got, ans,
                        ok ? "ok" : "WRONG");
                printed++;
            }
        }
    }
    /* the job's totals, in every process (every rank left the loop at the
     * same batch: the stop decision is the job's) */
    int *all = calloc((size_t)N * 2, sizeof *all);
    if (!all) {
        st = fsdp_error_set(FSDP_STATUS_OOM, "out of host memory for evaluation");
        goto done;
    }
    st = fsdp_engine_exchange(e, counts, sizeof counts, all);
    if (st == FSDP_STATUS_OK && rank == 0)
        for (int r = 0; r < N; r++) {
            t->eval_correct += all[2 * r];
            t->eval_seen += all[2 * r + 1];
        }
    free(all);
done:
fail:
    free(tok);
    free(len);
    free(pos);
    free(start);
    free(logits);
    free(answers);
    return st;
}

/* Write the checkpoint of the state after `done` steps. Collective: every
 * rank calls it, with the same `done`. */
static fsdp_status ckpt_save(struct trainer *t, fsdp_engine *e, int rank, int done)
{
    const fsdp_train_config *cfg = t->cfg;
    double t0 = now_s();
    FSDP_TRY(fsdp_engine_ckpt_save(e, cfg->ckpt_dir, &t->ck_base, (uint64_t)done, cfg->ckpt_keep));
    if (rank == 0) {
        t->res->ckpt_step = done;
        if (t->out)
            fprintf(t->out, "checkpoint: step %d written to %s/step_%08d (rank 0: %.0f ms)\n",
                    done, cfg->ckpt_dir, done, (now_s() - t0) * 1000.0);
    }
    return FSDP_STATUS_OK;
}

/* v as %g, but NaN as "NaN" whatever its sign bit. */
static const char *fmt_num(char *buf, size_t n, float v)
{
    if (isnan(v))
        snprintf(buf, n, "NaN");
    else
        snprintf(buf, n, "%g", (double)v);
    return buf;
}

/* Rank 0: the error of a step whose loss or norm is not finite. */
static void nonfinite_error(struct trainer *t, int step, const fsdp_step_result *r)
{
    char msg[FSDP_ERROR_MSG_MAX], l[32], g[32];
    snprintf(msg, sizeof msg,
             "step %d: the loss is %s and the gradient norm %s (lr %.3g): training diverged "
             "or the data holds a bad batch; %s. Lower --lr (or raise --warmup) and resume "
             "from the last checkpoint, or pass --on-nonfinite skip to drop such steps",
             step + 1, fmt_num(l, sizeof l, r->loss), fmt_num(g, sizeof g, r->grad_norm),
             (double)r->lr,
             r->applied ? "the update had started before the norm was known (--offload "
                          "optimizer with --clip 0), so the parameters are not finite and no "
                          "checkpoint is written"
                        : "its update was not applied");
    stop_error(t, FSDP_STATUS_NONFINITE, msg);
}

static fsdp_status rank_main(fsdp_world *w, int rank, void *arg)
{
    struct trainer *t = arg;
    const fsdp_train_config *cfg = t->cfg;
    fsdp_engine *e = NULL;
    fsdp_status st;
    FSDP_CHECK(fsdp_engine_init(&e, &t->sh, rank));
    if (t->ck_path[0])
        FSDP_CHECK(fsdp_engine_ckpt_load(e, t->ck_path, &t->ck_resume));
    if (rank == 0 && t->out) {
        char b[32];
        const fsdp_device *d = fsdp_engine_device(e);
        fprintf(t->out, "rank 0 after init: %s on the device", fsdp_fmt_bytes(b, sizeof b, (double)d->mem.in_use_bytes));
        if (cfg->eng.offload)
            fprintf(t->out, ", %s pinned host", fsdp_fmt_bytes(b, sizeof b, (double)d->host.in_use_bytes));
        fputc('\n', t->out);
    }
    /* `done` steps are reflected in the state; `saved` of them are on disk;
     * `clean`: the state may be saved (no update of non-finite values) */
    int done = t->start_step, saved = t->start_step;
    bool clean = true;
    unsigned why = 0;
    FSDP_CHECK(fsdp_engine_or(e, stop_bits(t, e, rank), &why)); /* a stop during init */
    for (int step = t->start_step; step < cfg->steps && !why; step++) {
        float lr = fsdp_train_lr(cfg, step);
        double t0 = now_s();
        fsdp_step_result r;
        st = fsdp_engine_step(e, (uint64_t)step, lr, &r);
        if (st != FSDP_STATUS_OK) {
            fsdp_error_prefix("step %d", step + 1);
            goto fail;
        }
        double ms = (now_s() - t0) * 1000.0;
        /* every rank decides from the same r and the same bits */
        FSDP_CHECK(fsdp_engine_or(e, stop_bits(t, e, rank), &why));
        bool skipped = false;
        if (why & STOP_DATA) {
            clean = !r.applied; /* the batch was zeros: the step does not count */
        } else if (!r.finite && (r.applied || !cfg->eng.skip_nonfinite)) {
            clean = !r.applied;
            if (rank == 0)
                nonfinite_error(t, step, &r);
            why |= STOP_ERROR;
        } else {
            skipped = !r.finite;
            done = step + 1;
            if (rank == 0) {
                t->res->losses[step] = r.loss;
                t->res->grad_norms[step] = r.grad_norm;
                t->res->steps = done;
                t->res->n_skipped += skipped;
                log_step(t, step, &r, ms, skipped);
            }
            if (cfg->ckpt_dir && (done == cfg->steps || (cfg->ckpt_every > 0 &&
                                                         done % cfg->ckpt_every == 0))) {
                FSDP_CHECK(ckpt_save(t, e, rank, done));
                saved = done;
            }
        }
        if (!why && cfg->stop_after > 0 && done >= cfg->stop_after)
            break; /* tests: as a crash would, without a final checkpoint */
    }
    if (why) {
        if (rank == 0 && (why & STOP_REQUEST))
            t->res->interrupted = true;
        /* the final checkpoint: the state after the last step that counts */
        if (cfg->ckpt_dir && clean && done > saved)
            FSDP_CHECK(ckpt_save(t, e, rank, done));
    }
    if (rank == 0)
        memcpy(t->res->stats, t->sh.x_stats, sizeof(fsdp_rank_stats) * (size_t)cfg->eng.n_ranks);
    FSDP_CHECK(fsdp_world_barrier(w)); /* stats read before anyone moves on */
    if (cfg->keep_params) {
        for (int u = 0; u < t->model.n_units; u++) {
            float *buf = malloc(t->model.units[u].numel * sizeof(float) + 1);
            if (!buf) {
                st = fsdp_error_set(FSDP_STATUS_OOM, "out of host memory copying parameters");
                goto fail;
            }
            st = fsdp_engine_gather_unit(e, u, buf);
            if (rank == 0 && st == FSDP_STATUS_OK)
                t->res->params[u] = buf;
            else
                free(buf);
            if (st != FSDP_STATUS_OK)
                goto fail;
        }
    }
    bool nothing_ran = t->ck_path[0] && t->start_step >= cfg->steps;
    if (!why && !nothing_ran && cfg->eval_problems > 0 && t->data &&
        !strcmp(cfg->data, "synthetic") && cfg->eng.backend != FSDP_BACKEND_META)
        FSDP_CHECK(eval_synthetic(t, e, rank));
    st = FSDP_STATUS_OK;
fail:
    fsdp_engine_free(e);
    return st;
}

/* Checkpoints: the manifest base for saves and, with resume, the newest
 * complete checkpoint to start from. A fresh run refuses a directory that
 * already holds checkpoints, so two runs never mix in one directory.
 * Process 0 holds the directory's lock; every process reads the
 * checkpoint to resume from, and they must find the same one. */
static fsdp_status ckpt_prepare(struct trainer *t)
{
    const fsdp_train_config *cfg = t->cfg;
    bool found = false;
    uint64_t step = 0;
    fsdp_status st = fsdp_engine_ckpt_describe(&t->sh, cfg->data, cfg->steps, &t->ck_base);
    FSDP_TRY(fsdp_job_agree(t->cfg->procs, t->world, st));
    /* one run id for the job: the manifest's and every rank's shard file's */
    FSDP_TRY(fsdp_job_from_process0(t->cfg->procs, t->world, &t->ck_base.run_id,
                                    sizeof t->ck_base.run_id));
    if (t->world->process == 0) {
        st = fsdp_ckpt_dir_lock(&t->ck_lock, cfg->ckpt_dir); /* until the run ends */
        if (st == FSDP_STATUS_OK && !cfg->resume)
            st = fsdp_ckpt_latest(cfg->ckpt_dir, &step, &found);
        if (st == FSDP_STATUS_OK && found)
            st = fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                                "--ckpt-dir '%s' already holds checkpoints (newest: step %llu); "
                                "pass --resume to continue from it, or choose another directory",
                                cfg->ckpt_dir, (unsigned long long)step);
    }
    FSDP_TRY(fsdp_job_agree(t->cfg->procs, t->world, st));
    FSDP_TRY(fsdp_job_dir_shared(t->cfg->procs, t->world, cfg->ckpt_dir, t->ck_base.run_id,
                                 "--ckpt-dir"));
    if (!cfg->resume)
        return FSDP_STATUS_OK;
    st = fsdp_engine_ckpt_find(&t->sh, cfg->ckpt_dir, cfg->allow_batch_change, &t->ck_resume,
                               t->ck_path, sizeof t->ck_path, &found);
    FSDP_TRY(fsdp_job_agree(t->cfg->procs, t->world, st));
    uint64_t seen[2] = {found, found ? t->ck_resume.step : 0}, first[2] = {seen[0], seen[1]};
    FSDP_TRY(fsdp_job_from_process0(t->cfg->procs, t->world, first, sizeof first));
    if (memcmp(seen, first, sizeof seen))
        st = fsdp_error_set(FSDP_STATUS_IO,
                            "process %d finds %s in --ckpt-dir '%s' where process 0 finds %s%llu; "
                            "was a checkpoint written or removed while the job started?",
                            t->world->process, found ? "a checkpoint" : "no checkpoint",
                            cfg->ckpt_dir, first[0] ? "step " : "none",
                            (unsigned long long)first[1]);
    FSDP_TRY(fsdp_job_agree(t->cfg->procs, t->world, st));
    if (!found) {
        t->ck_path[0] = '\0';
        if (t->out)
            fprintf(t->out, "resume: no complete checkpoint in %s; starting from step 0\n",
                    cfg->ckpt_dir);
        return FSDP_STATUS_OK;
    }
    const fsdp_ckpt_manifest *m = &t->ck_resume;
    const fsdp_engine_config *ec = &cfg->eng;
    t->start_step = m->step < (uint64_t)cfg->steps ? (int)m->step : cfg->steps;
    if (t->out) {
        fprintf(t->out, "resuming from %s: step %llu, written by %d device(s) with shard %s\n",
                t->ck_path, (unsigned long long)m->step, m->world_size, m->shard);
        if (m->steps_total != cfg->steps && m->step < (uint64_t)cfg->steps)
            fprintf(t->out, "note: the checkpoint's run had --steps %d; the learning-rate "
                            "schedule now spans %d steps\n", m->steps_total, cfg->steps);
        uint64_t was = (uint64_t)m->batch * (uint64_t)m->world_size * (uint64_t)m->grad_accum;
        uint64_t now = (uint64_t)ec->batch * (uint64_t)ec->n_ranks * (uint64_t)ec->grad_accum;
        if (was != now && m->step < (uint64_t)cfg->steps)
            fprintf(t->out, "note: --allow-batch-change: the global batch was %llu sequences "
                            "and is now %llu; the data continues at step x %llu sequences, "
                            "and this run is no longer bit-identical to one that kept the "
                            "batch\n", (unsigned long long)was, (unsigned long long)now,
                    (unsigned long long)now);
        if (cfg->data && strcmp(m->data, cfg->data))
            fprintf(t->out, "warning: the checkpoint was trained on data '%s', this run reads "
                            "'%s'\n", m->data, cfg->data);
    }
    return FSDP_STATUS_OK;
}

/* Where process q writes the trace of its ranks: the path itself on
 * process 0, "NAME.q.EXT" ("NAME.q") on the others. */
static void trace_path_of(const char *path, int q, char *out, size_t n)
{
    const char *slash = strrchr(path, '/'), *dot = strrchr(path, '.');
    if (q == 0)
        snprintf(out, n, "%s", path);
    else if (dot && dot > (slash ? slash + 1 : path))
        snprintf(out, n, "%.*s.%d%s", (int)(dot - path), path, q, dot);
    else
        snprintf(out, n, "%s.%d", path, q);
}

/* Everything the run will write can be written, before any step runs. */
static fsdp_status outputs_check(const fsdp_train_config *cfg)
{
    if (cfg->ckpt_dir)
        FSDP_TRY(fsdp_output_dir_check(cfg->ckpt_dir, "--ckpt-dir"));
    if (cfg->trace_path)
        FSDP_TRY(fsdp_output_file_check(cfg->trace_path, "--trace"));
    if (cfg->log_path)
        FSDP_TRY(fsdp_output_file_check(cfg->log_path, "--log"));
    return FSDP_STATUS_OK;
}

/* What a device out-of-memory message suggests: the settings that lower
 * the peak and are not set already. */
static void oom_hint(const fsdp_train_config *cfg, char *buf, size_t n)
{
    const fsdp_engine_config *e = &cfg->eng;
    const char *items[6];
    int k = 0;
    if (!e->offload)
        items[k++] = "--offload optimizer";
    if (e->shard != FSDP_SHARD_FULL)
        items[k++] = "--shard full";
    if (e->compute_dtype == FSDP_DTYPE_F32)
        items[k++] = "--precision bf16";
    if (e->batch > 1)
        items[k++] = "a smaller --batch (with more --grad-accum to keep the global batch)";
    if (e->n_ranks < fsdp_backend_n_devices(e->backend))
        items[k++] = "more --devices";
    if (e->device_mem && e->backend != FSDP_BACKEND_CUDA)
        items[k++] = "a larger --device-mem";
    size_t at = 0;
    buf[0] = '\0';
    for (int i = 0; i < k && at < n; i++)
        at += (size_t)snprintf(buf + at, n - at, "%s%s", i == 0 ? "" : i == k - 1 ? " or " : ", ",
                               items[i]);
}

fsdp_status fsdp_train_run(const fsdp_train_config *cfg, fsdp_train_result *res)
{
    memset(res, 0, sizeof *res);
    res->accuracy = -1.0f;
    res->ckpt_step = -1;
    fsdp_status st;
    struct trainer *t = calloc(1, sizeof *t);
    fsdp_world *w = NULL;
    bool launched = false;
    if (!t)
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory");
    pthread_mutex_init(&t->mu, NULL);
    t->cfg = cfg;
    t->res = res;
    t->out = !cfg->procs || cfg->procs->process == 0 ? cfg->out : NULL; /* rank 0's process */
    /* the engine's configuration, with the OOM hint; a job of several
     * processes has a node per process, each running n_ranks / processes */
    fsdp_engine_config ecfg = cfg->eng;
    const fsdp_engine_config *ec = &ecfg;
    oom_hint(cfg, t->oom_hint, sizeof t->oom_hint);
    if (!ecfg.oom_hint && t->oom_hint[0])
        ecfg.oom_hint = t->oom_hint;
    int n_procs = cfg->procs ? cfg->procs->n_processes : 1;
    if (n_procs > 1 && ecfg.n_nodes <= 1)
        ecfg.n_nodes = n_procs;
    if (ecfg.n_ranks % n_procs) {
        st = fsdp_error_set(FSDP_STATUS_INVALID_ARG, "%d rank(s) do not split over the job's %d "
                            "processes", ecfg.n_ranks, n_procs);
        goto fail;
    }
    FSDP_CHECK(fsdp_backend_check(ec->backend, ec->n_ranks / n_procs, ec->ranks_per_device));
    if (cfg->steps < 0) {
        st = fsdp_error_set(FSDP_STATUS_INVALID_ARG, "--steps must be >= 0");
        goto fail;
    }
    /* a model file (fine-tuning) gives the shape and the initial weights;
     * each rank reads its own shards of it (engine init_fn) */
    FSDP_CHECK(fsdp_modelfile_resolve(cfg->model, &t->model, &t->mf));
    if (cfg->data && ec->backend != FSDP_BACKEND_META) {
        /* text and jsonl data: the --tokenizer given, else the model
         * directory's own tokenizer.json */
        char own_tok[FSDP_CKPT_PATH_MAX];
        const char *tok = cfg->tokenizer;
        if (!tok && fsdp_modelfile_tokenizer_of(cfg->model, own_tok, sizeof own_tok))
            tok = own_tok;
        fsdp_data_opts dopt = {.spec = cfg->data, .seed = ec->seed, .tokenizer = tok,
                               .chat_format = cfg->chat_format};
        FSDP_CHECK(fsdp_data_open_opts(&t->data, &dopt));
        if (fsdp_data_masked(t->data) && t->out) {
            /* the loss is the mean over completion/assistant targets (engine.c) */
            uint64_t cut, none;
            fsdp_data_truncated(t->data, ec->seq, &cut, &none);
            fprintf(t->out, "data: %llu examples from '%s', one per row of --seq %d, loss on "
                    "completion/assistant tokens only",
                    (unsigned long long)fsdp_data_n_examples(t->data), cfg->data, ec->seq);
            if (cut || none)
                fprintf(t->out, "; %llu are cut at %d tokens, %llu of them left with no "
                        "target (raise --seq)", (unsigned long long)cut, ec->seq + 1,
                        (unsigned long long)none);
            fprintf(t->out, "\n");
        }
        int dv = fsdp_data_vocab(t->data);
        if (dv > t->model.vocab_size) {
            st = fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                                "the data uses token ids up to %d but model '%s' has a vocabulary "
                                "of %d; pick a model with a larger vocabulary",
                                dv - 1, cfg->model, t->model.vocab_size);
            goto fail;
        }
    }
    if (ec->backend == FSDP_BACKEND_CUDA)
        t->peak_flops = ec->compute_dtype == FSDP_DTYPE_BF16 ? 989e12 : 67e12; /* H100/H200 SXM */
    t->flops_per_token = t->model.family->flops_per_token(&t->model, ec->seq);
    FSDP_CHECK(outputs_check(cfg));
    FSDP_CHECK(fsdp_procs_world_init(&w, cfg->procs, ec->n_ranks / n_procs));
    t->world = w;
    FSDP_CHECK(fsdp_engine_shared_init(&t->sh, ec, &t->model, t->data, w));
    if (t->mf) {
        t->sh.init_fn = fsdp_modelfile_init_fn;
        t->sh.init_arg = t->mf;
    }
    if (cfg->ckpt_dir)
        FSDP_CHECK(ckpt_prepare(t));
    res->n_ranks = ec->n_ranks;
    res->n_units = t->model.n_units;
    res->losses = calloc((size_t)cfg->steps + 1, sizeof(float));
    res->grad_norms = calloc((size_t)cfg->steps + 1, sizeof(float));
    res->stats = calloc((size_t)ec->n_ranks, sizeof *res->stats);
    res->params = calloc((size_t)t->model.n_units, sizeof *res->params);
    if (!res->losses || !res->grad_norms || !res->stats || !res->params) {
        st = fsdp_error_set(FSDP_STATUS_OOM, "out of host memory");
        goto fail;
    }
    res->first_step = res->steps = t->start_step;
    if (t->ck_path[0] && t->start_step >= cfg->steps && t->out) /* loaded, then nothing runs */
        fprintf(t->out, "resume: checkpoint step %llu already reached --steps %d: nothing left "
                          "to do (raise --steps to train further)\n",
                (unsigned long long)t->ck_resume.step, cfg->steps);
    if (cfg->trace_path)
        FSDP_CHECK(fsdp_trace_init(&t->sh.trace, ec->n_ranks));
    if (cfg->log_path && w->process == 0) /* rank 0 writes the metrics */
        FSDP_CHECK(fsdp_metrics_open(&t->log, cfg->log_path, t->ck_path[0] != '\0', w));
    if (t->out) {
        char b[32];
        fprintf(t->out,
                "fsdp train: model %s (%.2fM params, %d units), %d x %s device(s), shard %s, %s, "
                "optimizer %s, recompute %s, batch %d x seq %d x accum %d x %d ranks = %llu "
                "tokens/step, %d steps\n",
                cfg->model, (double)t->model.numel / 1e6, t->model.n_units, ec->n_ranks,
                fsdp_backend_name(ec->backend), fsdp_shard_strategy_name(ec->shard),
                fsdp_dtype_name(ec->compute_dtype), t->sh.optim->name,
                fsdp_names_name(&fsdp_recompute_names, (int)ec->recompute), ec->batch, ec->seq,
                ec->grad_accum, ec->n_ranks, (unsigned long long)tokens_per_step(ec),
                cfg->steps);
        if (ec->device_mem)
            fprintf(t->out, "device memory cap %s\n",
                    fsdp_fmt_bytes(b, sizeof b, (double)ec->device_mem));
        if (ec->backend == FSDP_BACKEND_CPU)
            fsdp_cpu_print_header(t->out, fsdp_device_cpu_devices_on_host(w),
                                  ec->threads_per_device);
    }
    fsdp_device_cpu_set_threads(ec->threads_per_device); /* read as the cpu devices start */
    launched = true;
    st = fsdp_world_launch(w, rank_main, t);
    if (t->stop_st != FSDP_STATUS_OK) {
        /* stopped early by an error: it comes first, the checkpoint's fate after */
        if (st != FSDP_STATUS_OK)
            fsdp_error_set(t->stop_st, "%s; the final checkpoint could not be written: %s",
                           t->stop_msg, fsdp_error_msg());
        else if (cfg->ckpt_dir && res->ckpt_step >= 0)
            fsdp_error_set(t->stop_st, "%s (checkpoint step %d in '%s' holds the last complete "
                           "step: fix the cause, then resume with --resume)", t->stop_msg,
                           res->ckpt_step, cfg->ckpt_dir);
        else
            fsdp_error_set(t->stop_st, "%s", t->stop_msg);
        st = t->stop_st;
    }
    if (st == FSDP_STATUS_OK) {
        res->tokens_per_s = t->tok_s_n ? t->tok_s_sum / t->tok_s_n : 0;
        int seen = t->eval_seen, correct = t->eval_correct;
        if (seen && !res->interrupted)
            res->accuracy = (float)correct / (float)seen;
        if (t->out && seen && !res->interrupted)
            fprintf(t->out, "held-out accuracy: %.1f%% (%d/%d problems, greedy decoding)\n",
                    100.0 * res->accuracy, correct, seen);
    }
fail:;
    /* what was recorded is written whether or not the run succeeded; the
     * run's own error stays the message */
    char *keep = st != FSDP_STATUS_OK ? strdup(fsdp_error_msg()) : NULL;
    if (launched && t->sh.trace) {
        char path[4096 + 16];
        trace_path_of(cfg->trace_path, w->process, path, sizeof path);
        fsdp_status ts = fsdp_trace_write(t->sh.trace, path);
        if (ts != FSDP_STATUS_OK && st == FSDP_STATUS_OK)
            st = ts;
        else if (ts == FSDP_STATUS_OK && t->out)
            fprintf(t->out, "trace written to %s%s\n", cfg->trace_path,
                    w->n_processes > 1 ? " (process 0's ranks; process q's beside it, with .q "
                                         "before the extension)" : "");
    }
    fsdp_status ls = fsdp_metrics_close(&t->log);
    if (ls != FSDP_STATUS_OK && st == FSDP_STATUS_OK)
        st = ls;
    if (keep) {
        fsdp_error_copy(keep);
        free(keep);
    }
    fsdp_trace_free(t->sh.trace);
    t->sh.trace = NULL;
    fsdp_ckpt_dir_unlock(&t->ck_lock);
    fsdp_ckpt_manifest_free(&t->ck_base);
    fsdp_ckpt_manifest_free(&t->ck_resume);
    fsdp_engine_shared_free(&t->sh);
    fsdp_modelfile_close(t->mf); /* bound to the model: closed first */
    if (t->model.units)
        fsdp_model_free(&t->model);
    if (t->data)
        fsdp_data_close(t->data);
    fsdp_world_free(w);
    pthread_mutex_destroy(&t->mu);
    free(t);
    return st;
}

void fsdp_train_result_free(fsdp_train_result *res)
{
    free(res->losses);
    free(res->grad_norms);
    free(res->stats);
    if (res->params)
        for (int u = 0; u < res->n_units; u++)
            free(res->params[u]);
    free(res->params);
    memset(res, 0, sizeof *res);
}
