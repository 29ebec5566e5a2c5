/*
 * train.c - the training run: what happens before the ranks start, the
 * loop on every rank, progress and metrics on rank 0, and the result. The
 * run's checkpoints are in train_ckpt.c, the held-out accuracy of the
 * synthetic task in synth_eval.c; the object they share in train_internal.h.
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
#include <string.h>

#include "ckpt/ckpt_tok.h"
#include "comm/procs.h"
#include "core/clock.h"
#include "core/flight.h"
#include "core/log.h"
#include "device/cpu.h"
#include "engine/engine_ckpt.h"
#include "engine/trace.h"
#include "ops/ops.h"
#include "train/fit.h"
#include "train/schedule.h"
#include "train/synth_eval.h"
#include "train/train_internal.h"

/* The schedule's settings from the run's (the floor in double, as the
 * cosine has always taken it). */
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
                     bool skipped, float eval_loss)
{
    const fsdp_train_config *cfg = t->cfg;
    const fsdp_engine_config *ec = &cfg->eng;
    int N = ec->n_ranks;
    double tokens = (double)fsdp_trainer_step_tokens(t, step); /* real, not padding */
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
    int len = fsdp_trainer_step_len(t, step); /* --pack off: attention ran at its longest */
    double fpt = len < t->sh.cfg.seq ? t->model.family->flops_per_token(&t->model, len)
                                     : t->flops_per_token;
    double mfu = t->peak_flops > 0 ? fpt * tok_s / (t->peak_flops * n_gpus) : -1;
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
                    "step %5d/%d | loss %.6g | lr %.2e | norm %.4g | %s tok/s | %.1f ms | peak %s/dev",
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
    fsdp_metrics_record rec = {.step = step + 1, .loss = r->loss, .lr = r->lr,
                               .grad_norm = r->grad_norm, .tokens = tokens,
                               .tokens_per_s = tok_s, .step_ms = ms, .mfu = mfu,
                               .skipped = skipped, .n_ranks = N, .stats = t->sh.x_stats,
                               .inter = t->sh.sm.n_nodes > 1, .has_eval = !isnan(eval_loss),
                               .eval_loss = eval_loss,
                               .resumed_from = t->ck_path[0] && !t->n_logged ? t->start_step : 0};
    t->n_logged++;
    if (t->log.f && !t->log.failed) {
        fsdp_status st = fsdp_metrics_write(&t->log, &rec);
        if (st != FSDP_STATUS_OK)
            stop_error(t, st, fsdp_error_msg());
    }
    if (t->sink && !t->sink_failed) {
        fsdp_status st = t->sink->iface->write(t->sink->self, &rec);
        if (st != FSDP_STATUS_OK) {
            t->sink_failed = true;
            stop_error(t, st, fsdp_error_msg());
        }
    }
}

/* This rank's reasons to stop, brought to the barrier after each step (and
 * before the first): its engine's data error; on the first rank of each
 * process a stop request (a signal reaches one process: the OR tells every
 * other); on rank 0 also a failed metrics write and a data file that
 * changed. */
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
    if (rank == t->world->rank_offset && cfg->stop)
        bits |= fsdp_train_stop_word(atomic_load(cfg->stop));
    if (rank != 0)
        return bits;
    if (t->log.failed || t->sink_failed)
        bits |= STOP_ERROR;
    if (t->data && (st = fsdp_data_check(t->data)) != FSDP_STATUS_OK) {
        stop_error(t, st, fsdp_error_msg());
        fsdp_error_clear();
        bits |= STOP_ERROR;
    }
    return bits;
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

/* Where a rank's loop stands. Every rank holds the same values: each
 * decides from the same step result and the same stop bits. */
struct progress {
    int done;       /* steps reflected in the state */
    int saved;      /* of them, on disk */
    bool clean;     /* the state may be saved (no update of non-finite values) */
    unsigned why;   /* STOP_* bits: why the loop ended (0: it ran out of steps) */
    struct eval_track ev; /* the held-out loss's standing (train_eval.c) */
};

/* What step `step` means, once every rank knows r and p->why: it counts
 * (logged on rank 0, checkpointed when one is due), or it does not (a
 * data error), or it stops the run (not finite). Collective when it
 * checkpoints. */
static fsdp_status step_done(struct trainer *t, fsdp_engine *e, int rank, int step,
                             const fsdp_step_result *r, double ms, struct progress *p)
{
    const fsdp_train_config *cfg = t->cfg;
    if (p->why & STOP_DATA) {
        p->clean = !r->applied; /* the batch was zeros: the step does not count */
        return FSDP_STATUS_OK;
    }
    if (!r->finite && (r->applied || !cfg->eng.skip_nonfinite)) {
        p->clean = !r->applied;
        if (rank == 0)
            nonfinite_error(t, step, r);
        p->why |= STOP_ERROR;
        return FSDP_STATUS_OK;
    }
    bool skipped = !r->finite, best = false;
    p->done = step + 1;
    float eval_loss = NAN;
    if (!p->why)
        FSDP_TRY(fsdp_trainer_eval_step(t, e, rank, p->done, &p->ev, &eval_loss, &best));
    best = best && cfg->keep_best && cfg->ckpt_dir;
    if (rank == 0) {
        t->res->losses[step] = r->loss;
        t->res->grad_norms[step] = r->grad_norm;
        t->res->steps = p->done;
        t->res->n_skipped += skipped;
        log_step(t, step, r, ms, skipped, eval_loss);
        fsdp_trainer_eval_print(t, p->done, &p->ev, eval_loss);
    }
    if (cfg->ckpt_dir && (best || p->done == cfg->steps ||
                          (cfg->ckpt_every > 0 && p->done % cfg->ckpt_every == 0))) {
        FSDP_TRY(fsdp_trainer_ckpt_save(t, e, rank, p->done));
        p->saved = p->done;
    }
    if (best)
        FSDP_TRY(fsdp_trainer_eval_mark_best(t, rank, p->done, eval_loss));
    if (!isnan(eval_loss) && cfg->early_stop > 0 && p->ev.n_worse >= cfg->early_stop &&
        p->done < cfg->steps) {
        p->why |= STOP_EARLY;
        fsdp_trainer_eval_early_stop(t, rank, p->done, &p->ev);
    }
    return FSDP_STATUS_OK;
}

/* The training loop from t->start_step until the last step or until the
 * ranks agree to stop. */
static fsdp_status run_steps(struct trainer *t, fsdp_engine *e, int rank, struct progress *p)
{
    const fsdp_train_config *cfg = t->cfg;
    FSDP_TRY(fsdp_engine_or(e, stop_bits(t, e, rank), &p->why)); /* a stop during init */
    for (int step = t->start_step; step < cfg->steps && !p->why; step++) {
        float lr = fsdp_train_lr(cfg, step);
        double t0 = fsdp_now_s();
        fsdp_step_result r;
        fsdp_engine_set_len(e, fsdp_trainer_step_len(t, step)); /* --pack off: its longest */
        fsdp_status st = fsdp_engine_step(e, (uint64_t)step, lr, &r);
        if (st != FSDP_STATUS_OK) {
            fsdp_error_prefix("step %d", step + 1);
            return st;
        }
        double ms = (fsdp_now_s() - t0) * 1000.0;
        /* every rank decides from the same r and the same bits */
        FSDP_TRY(fsdp_engine_or(e, stop_bits(t, e, rank), &p->why));
        FSDP_TRY(step_done(t, e, rank, step, &r, ms, p));
        if (!p->why && cfg->stop_after > 0 && p->done >= cfg->stop_after)
            break; /* tests: as a crash would, without a final checkpoint */
    }
    return FSDP_STATUS_OK;
}

/* cfg->keep_params: every unit's parameters into the result (rank 0).
 * Collective. */
static fsdp_status keep_params(struct trainer *t, fsdp_engine *e, int rank)
{
    for (int u = 0; u < t->model.n_units; u++) {
        float *buf = malloc(t->model.units[u].numel * sizeof(float) + 1);
        if (!buf)
            return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory copying parameters");
        fsdp_status st = fsdp_engine_gather_unit(e, u, buf);
        if (rank == 0 && st == FSDP_STATUS_OK)
            t->res->params[u] = buf;
        else
            free(buf);
        FSDP_TRY(st);
    }
    return FSDP_STATUS_OK;
}

/* Held-out accuracy on the synthetic task (synth_eval.h); the job's
 * totals on rank 0. Collective. */
static fsdp_status eval_synthetic(struct trainer *t, fsdp_engine *e, int rank)
{
    const fsdp_train_config *cfg = t->cfg;
    fsdp_synth_eval ev = {.n_problems = cfg->eval_problems, .n_samples = cfg->n_samples,
                          .out = t->out,
                          .stop = rank == t->world->rank_offset ? cfg->stop : NULL};
    fsdp_status st = fsdp_synth_eval_run(e, rank, &cfg->eng, &t->model, &ev);
    if (rank == 0) {
        t->eval_correct += ev.correct;
        t->eval_seen += ev.seen;
    }
    if (rank == t->world->rank_offset && ev.stop_word) {
        t->res->interrupted = true;
        t->res->stop_code = fsdp_train_stop_code(ev.stop_word);
    }
    return st;
}

/* After the loop: the final checkpoint when the loop stopped early, the
 * figures and parameters into the result, then the evaluation. */
static fsdp_status finish_rank(struct trainer *t, fsdp_engine *e, int rank,
                               const struct progress *p)
{
    const fsdp_train_config *cfg = t->cfg;
    if (p->why) {
        if (rank == t->world->rank_offset && (p->why & STOP_REQUEST)) {
            t->res->interrupted = true;
            t->res->stop_code = fsdp_train_stop_code(p->why);
        }
        /* the final checkpoint: the state after the last step that counts */
        if (cfg->ckpt_dir && p->clean && p->done > p->saved)
            FSDP_TRY(fsdp_trainer_ckpt_save(t, e, rank, p->done));
    }
    if (rank == 0)
        memcpy(t->res->stats, t->sh.x_stats, sizeof(fsdp_rank_stats) * (size_t)cfg->eng.n_ranks);
    FSDP_TRY(fsdp_world_barrier(t->world)); /* stats read before anyone moves on */
    if (cfg->keep_params)
        FSDP_TRY(keep_params(t, e, rank));
    bool nothing_ran = t->ck_path[0] && t->start_step >= cfg->steps;
    if (!p->why && !nothing_ran && cfg->eval_problems > 0 && t->data &&
        !strcmp(cfg->data, "synthetic") && cfg->eng.backend != FSDP_BACKEND_META)
        FSDP_TRY(eval_synthetic(t, e, rank));
    return FSDP_STATUS_OK;
}

static fsdp_status rank_main(fsdp_world *w, int rank, void *arg)
{
    struct trainer *t = arg;
    fsdp_engine *e = NULL;
    fsdp_status st;
    FSDP_CHECK(fsdp_engine_init(&e, &t->sh, rank));
    if (t->ck_path[0])
        FSDP_CHECK(fsdp_engine_ckpt_load(e, t->ck_path, &t->ck_resume));
    if (rank == 0 && t->out) {
        char b[32];
        const fsdp_device *d = fsdp_engine_device(e);
        fprintf(t->out, "rank 0 after init: %s on the device",
                fsdp_fmt_bytes(b, sizeof b, (double)d->mem.in_use_bytes));
        if (t->cfg->eng.offload)
            fprintf(t->out, ", %s pinned host",
                    fsdp_fmt_bytes(b, sizeof b, (double)d->host.in_use_bytes));
        fputc('\n', t->out);
    }
    struct progress p = {.done = t->start_step, .saved = t->start_step, .clean = true,
                         .ev = t->eval0};
    FSDP_CHECK(run_steps(t, e, rank, &p));
    FSDP_CHECK(finish_rank(t, e, rank, &p));
fail:
    fsdp_engine_free(e);
    return st;
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

/* The engine's configuration for this run: cfg->eng with the OOM hint; a
 * job of several processes has a node per process, each running
 * n_ranks / processes (*n_procs). */
static fsdp_status engine_config(struct trainer *t, fsdp_engine_config *ec, int *n_procs)
{
    const fsdp_train_config *cfg = t->cfg;
    *ec = cfg->eng;
    oom_hint(cfg, t->oom_hint, sizeof t->oom_hint);
    if (!ec->oom_hint && t->oom_hint[0])
        ec->oom_hint = t->oom_hint;
    int P = cfg->procs ? cfg->procs->n_processes : 1;
    *n_procs = P;
    if (P > 1 && ec->n_nodes <= 1)
        ec->n_nodes = P;
    if (ec->n_ranks % P)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "%d rank(s) do not split over the job's "
                              "%d processes", ec->n_ranks, P);
    FSDP_TRY(fsdp_backend_check(ec->backend, ec->n_ranks / P, ec->ranks_per_device));
    if (cfg->steps < 0)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "--steps must be >= 0");
    return FSDP_STATUS_OK;
}

/* --data for text and jsonl with the --tokenizer given, else the one the checkpoint a
 * --resume continues carries, the model directory's own tokenizer.json or the one a
 * checkpoint --model carries;
 * its token ids must fit the model. */
static fsdp_status data_open(struct trainer *t, fsdp_engine_config *ec)
{
    const fsdp_train_config *cfg = t->cfg;
    char own_tok[FSDP_CKPT_PATH_MAX];
    const char *tok = cfg->tokenizer;
    bool has_own = false; /* a Hugging Face directory's, or the one a checkpoint carries */
    FSDP_TRY(fsdp_trainer_ckpt_tokenizer(t, own_tok, sizeof own_tok, &has_own)); /* --resume */
    if (!tok && !has_own)
        FSDP_TRY(fsdp_ckpt_tok_for_model(cfg->model, own_tok, sizeof own_tok, &has_own));
    if (has_own)
        tok = own_tok;
    snprintf(t->tokenizer, sizeof t->tokenizer, "%s", tok ? tok : "");
    FSDP_TRY(fsdp_trainer_ckpt_chat_format(t)); /* --chat-format, or --resume's */
    fsdp_data_opts dopt = {.spec = cfg->data, .seed = ec->seed, .tokenizer = tok,
                           .chat_format = t->chat_format[0] ? t->chat_format : NULL};
    FSDP_TRY(fsdp_data_open_opts(&t->data, &dopt));
    FSDP_TRY(fsdp_trainer_data_rows(t, ec)); /* --seq, packing, --epochs (train_data.c) */
    if (t->out && fsdp_data_chat(t->data)[0])
        fprintf(t->out, "chat: %s\n", fsdp_data_chat(t->data));
    if (t->out && fsdp_data_special_text(t->data))
        fprintf(t->out, "data: %llu special-token strings in the text were kept as text\n",
                (unsigned long long)fsdp_data_special_text(t->data));
    int dv = fsdp_data_vocab(t->data);
    if (dv > t->model.vocab_size)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "the data uses token ids up to %d but model '%s' has a vocabulary "
                              "of %d; pick a model with a larger vocabulary",
                              dv - 1, cfg->model, t->model.vocab_size);
    return FSDP_STATUS_OK;
}

/* The result's arrays, and where the run starts. */
static fsdp_status result_alloc(struct trainer *t, const fsdp_engine_config *ec)
{
    fsdp_train_result *res = t->res;
    res->n_ranks = ec->n_ranks;
    res->n_units = t->model.n_units;
    res->losses = calloc((size_t)t->cfg->steps + 1, sizeof(float));
    res->grad_norms = calloc((size_t)t->cfg->steps + 1, sizeof(float));
    res->stats = calloc((size_t)ec->n_ranks, sizeof *res->stats);
    res->params = calloc((size_t)t->model.n_units, sizeof *res->params);
    if (!res->losses || !res->grad_norms || !res->stats || !res->params)
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory");
    res->first_step = res->steps = t->start_step;
    res->last_step = t->cfg->steps;
    return FSDP_STATUS_OK;
}

/* Rank 0's process: what the run is (model, devices, strategy, batch),
 * then the cpu devices' threads. */
static void print_header(const struct trainer *t, const fsdp_engine_config *ec)
{
    char b[32];
    fprintf(t->out,
            "fsdp train: model %s (%.2fM params, %d units), %d x %s device(s), shard %s, %s, "
            "optimizer %s, offload %s, recompute %s, batch %d x seq %d x accum %d%s x %d ranks = "
            "%llu tokens/step, %d steps\n",
            t->cfg->model, (double)t->model.numel / 1e6, t->model.n_units, ec->n_ranks,
            fsdp_backend_name(ec->backend), fsdp_shard_strategy_name(ec->shard),
            fsdp_dtype_name(ec->compute_dtype), t->sh.optim->name,
            fsdp_names_name(&fsdp_offload_names, fsdp_offload_value(ec)),
            fsdp_names_name(&fsdp_recompute_names, (int)ec->recompute), ec->batch, ec->seq,
            ec->grad_accum, ec->accum == FSDP_ACCUM_FLAT ? " (flat)" : "", ec->n_ranks,
            (unsigned long long)tokens_per_step(ec),
            t->cfg->steps);
    const fsdp_model *m = &t->model;
    if (m->lora.r)
        fprintf(t->out, "lora: rank %d, alpha %g%s, targets %s: %.3fM trainable of %.2fM params "
                        "(%.2f%%); the base is frozen\n", m->lora.r, m->lora.alpha,
                m->lora.rslora ? " (rslora)" : "", m->lora.targets, (double)m->train_numel / 1e6,
                (double)m->numel / 1e6, 100.0 * (double)m->train_numel / (double)m->numel);
    if (m->freeze[0])
        fprintf(t->out, "frozen: %s: %.3fM of %.2fM params train\n", m->freeze,
                (double)m->train_numel / 1e6, (double)m->numel / 1e6);
    if (t->sh.sm.nf4_numel) {
        char b2[32];
        size_t nf4 = t->sh.sm.nf4_numel;
        fprintf(t->out, "quantize: nf4: %.2fM frozen linear-weight params in 4 bits (%s with their "
                        "absmax, %s in bf16)%s\n", (double)nf4 / 1e6,
                fsdp_fmt_bytes(b, sizeof b, (double)nf4 * 9 / 16),
                fsdp_fmt_bytes(b2, sizeof b2, (double)nf4 * 2),
                ec->offload_params ? "; their shards in pinned host memory" : "");
    }
    fsdp_lr_plan lp = fsdp_trainer_lr_plan(t->cfg);
    char sched[96];
    fprintf(t->out, "lr %.3g%s%s%s, warmup %d steps, then %s\n", (double)lp.lr,
            t->cfg->lr_note ? " (" : "", t->cfg->lr_note ? t->cfg->lr_note : "",
            t->cfg->lr_note ? ")" : "", lp.warmup, fsdp_lr_describe(&lp, sched, sizeof sched));
    if (ec->device_mem)
        fprintf(t->out, "device memory cap %s\n",
                fsdp_fmt_bytes(b, sizeof b, (double)ec->device_mem));
    if (ec->backend == FSDP_BACKEND_CPU)
        fsdp_cpu_print_header(t->out, fsdp_device_cpu_devices_on_host(t->world),
                              ec->threads_per_device);
}

/* Everything before the ranks start: the model (a model file gives the
 * shape and the initial weights, each rank reading its own shards of it
 * through the engine's init_fn), the data, the world, the engine's shared
 * part, checkpoints, the result, the trace and the metrics. */
static fsdp_status run_prepare(struct trainer *t, fsdp_engine_config *ec)
{
    const fsdp_train_config *cfg = t->cfg;
    int n_procs;
    FSDP_TRY(engine_config(t, ec, &n_procs));
    FSDP_TRY(fsdp_modelfile_resolve(cfg->model, &t->model, &t->mf));
    FSDP_TRY(fsdp_adapt_apply(&t->adapt, &t->model, t->mf, &cfg->lora, cfg->freeze,
                              cfg->adapter, ec->seed));
    FSDP_TRY(fsdp_adapt_quantize(&t->adapt, &t->model, (fsdp_quant)cfg->quantize));
    if (cfg->data && ec->backend != FSDP_BACKEND_META) {
        FSDP_TRY(data_open(t, ec));
        FSDP_TRY(fsdp_trainer_eval_open(t, ec));
    }
    if (cfg->warmup_pct > 0) {
        int64_t w = (int64_t)t->run.steps * cfg->warmup_pct / 100;
        t->run.warmup = w >= 1 ? (int)w : 1;
    }
    if (cfg->fit_check) /* with the --seq and packing the data decided */
        FSDP_TRY(fsdp_fit_check_train(t->cfg, cfg->fit_device_total));
    if (ec->backend == FSDP_BACKEND_CUDA)
        t->peak_flops = ec->compute_dtype == FSDP_DTYPE_BF16 ? 989e12 : 67e12; /* H100/H200 SXM */
    t->flops_per_token = t->model.family->flops_per_token(&t->model, ec->seq);
    FSDP_TRY(outputs_check(cfg));
    FSDP_TRY(fsdp_procs_world_init(&t->world, cfg->procs, ec->n_ranks / n_procs));
    FSDP_TRY(fsdp_trainer_agree(t));
    fsdp_output_flight_path(cfg->log_path, t->world->process, t->flight_path,
                            sizeof t->flight_path);
    FSDP_TRY(fsdp_world_set_watchdog(t->world, cfg->watchdog_s >= 0 ? cfg->watchdog_s
                                                                     : t->world->watchdog_s,
                                     t->flight_path));
    FSDP_TRY(fsdp_engine_shared_init(&t->sh, ec, &t->model, t->data, t->world));
    if (t->adapt.active) {
        t->sh.init_fn = fsdp_adapt_init_fn;
        t->sh.init_nf4_fn = fsdp_adapt_init_nf4_fn;
        t->sh.init_arg = &t->adapt;
    } else if (t->mf) {
        t->sh.init_fn = fsdp_modelfile_init_fn;
        t->sh.init_arg = t->mf;
    }
    if (cfg->ckpt_dir)
        FSDP_TRY(fsdp_trainer_ckpt_prepare(t));
    FSDP_TRY(result_alloc(t, ec));
    if (t->ck_path[0] && t->start_step >= cfg->steps && t->out) /* loaded, then nothing runs */
        fprintf(t->out, "resume: checkpoint step %llu already reached --steps %d: nothing left "
                          "to do (raise --steps to train further)\n",
                (unsigned long long)t->ck_resume.step, cfg->steps);
    if (cfg->trace_path)
        FSDP_TRY(fsdp_trace_init(&t->sh.trace, ec->n_ranks));
    if (cfg->log_path && t->world->process == 0) /* rank 0 writes the metrics */
        FSDP_TRY(fsdp_metrics_open(&t->log, cfg->log_path, t->ck_path[0] != '\0', t->world));
    if (cfg->sink && t->world->process == 0) {
        t->sink = cfg->sink; /* closed by outputs_close, also when opening failed */
        FSDP_TRY(t->sink->iface->open(t->sink->self, t->start_step));
    }
    return FSDP_STATUS_OK;
}

/* After the ranks returned st: an error that stopped the run early comes
 * first, the final checkpoint's fate after; on success the throughput and
 * the held-out accuracy. */
static fsdp_status run_result(struct trainer *t, fsdp_status st)
{
    const fsdp_train_config *cfg = t->cfg;
    fsdp_train_result *res = t->res;
    if (t->stop_st != FSDP_STATUS_OK) {
        if (st != FSDP_STATUS_OK)
            fsdp_error_set(t->stop_st, "%s; the final checkpoint could not be written: %s",
                           t->stop_msg, fsdp_error_msg());
        else if (cfg->ckpt_dir && res->ckpt_step >= 0)
            fsdp_error_set(t->stop_st, "%s (checkpoint step %d in '%s' holds the last complete "
                           "step: fix the cause, then resume with --resume)", t->stop_msg,
                           res->ckpt_step, cfg->ckpt_dir);
        else
            fsdp_error_set(t->stop_st, "%s", t->stop_msg);
        return t->stop_st;
    }
    if (st != FSDP_STATUS_OK)
        return st;
    res->tokens_per_s = t->tok_s_n ? t->tok_s_sum / t->tok_s_n : 0;
    int seen = t->eval_seen, correct = t->eval_correct;
    if (seen && !res->interrupted)
        res->accuracy = (float)correct / (float)seen;
    if (t->out && seen && !res->interrupted)
        fprintf(t->out, "held-out accuracy: %.1f%% (%d/%d problems, greedy decoding)\n",
                100.0 * res->accuracy, correct, seen);
    if (t->sink && seen && !res->interrupted)
        return t->sink->iface->eval(t->sink->self, res->steps, "accuracy", res->accuracy);
    return FSDP_STATUS_OK;
}

/* What was recorded is written whether or not the run succeeded (the
 * trace only once the ranks ran); the run's own error st stays the
 * message. Returns st, or the first write error after a success. */
static fsdp_status outputs_close(struct trainer *t, fsdp_status st, bool launched)
{
    const fsdp_train_config *cfg = t->cfg;
    char *keep = st != FSDP_STATUS_OK ? strdup(fsdp_error_msg()) : NULL;
    if (launched && t->sh.trace) {
        char path[4096 + 16];
        fsdp_output_process_path(cfg->trace_path, t->world->process, path, sizeof path);
        fsdp_status ts = fsdp_trace_write(t->sh.trace, path);
        if (ts != FSDP_STATUS_OK && st == FSDP_STATUS_OK)
            st = ts;
        else if (ts == FSDP_STATUS_OK && t->out)
            fprintf(t->out, "trace written to %s%s\n", cfg->trace_path,
                    t->world->n_processes > 1 ? " (process 0's ranks; process q's beside it, "
                                                "with .q before the extension)" : "");
    }
    fsdp_status ls = fsdp_metrics_close(&t->log);
    if (ls != FSDP_STATUS_OK && st == FSDP_STATUS_OK)
        st = ls;
    if (t->sink) {
        ls = t->sink->iface->close(t->sink->self);
        t->sink = NULL;
        if (ls != FSDP_STATUS_OK && st == FSDP_STATUS_OK)
            st = ls;
    }
    if (keep) {
        fsdp_error_copy(keep);
        free(keep);
    }
    return st;
}

static void trainer_free(struct trainer *t)
{
    fsdp_trace_free(t->sh.trace);
    t->sh.trace = NULL;
    fsdp_ckpt_dir_unlock(&t->ck_lock);
    fsdp_ckpt_manifest_free(&t->ck_base);
    fsdp_ckpt_manifest_free(&t->ck_resume);
    fsdp_engine_shared_free(&t->sh);
    fsdp_modelfile_close(t->mf); /* bound to the model: closed first */
    fsdp_adapt_free(&t->adapt);
    if (t->model.units)
        fsdp_model_free(&t->model);
    if (t->data)
        fsdp_data_close(t->data);
    fsdp_heldout_close(&t->heldout);
    fsdp_world_free(t->world);
    pthread_mutex_destroy(&t->mu);
    free(t);
}

fsdp_status fsdp_train_run(const fsdp_train_config *cfg, fsdp_train_result *res)
{
    memset(res, 0, sizeof *res);
    res->accuracy = -1.0f;
    res->ckpt_step = -1;
    res->eval_loss = res->best_eval_loss = NAN;
    struct trainer *t = calloc(1, sizeof *t);
    if (!t)
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory");
    pthread_mutex_init(&t->mu, NULL);
    t->run = *cfg; /* the data may set its seq and steps (train_data.c) */
    t->cfg = &t->run;
    t->res = res;
    t->out = !cfg->procs || cfg->procs->process == 0 ? cfg->out : NULL; /* rank 0's process */
    fsdp_engine_config ec;
    bool launched = false;
    fsdp_status st = run_prepare(t, &ec);
    if (st == FSDP_STATUS_OK) {
        /* read as the cpu devices start (and by the header) */
        fsdp_device_cpu_set_threads(ec.threads_per_device);
        fsdp_device_cpu_set_streams((fsdp_cpu_streams)ec.cpu_streams, ec.cpu_stream_jitter);
        if (t->out)
            print_header(t, &ec);
        launched = true;
        st = run_result(t, fsdp_world_launch(t->world, rank_main, t));
    }
    st = outputs_close(t, st, launched);
    trainer_free(t);
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
