/*
 * train.c - the training loop on every rank, progress and metrics on rank 0,
 * held-out accuracy by greedy decoding for the synthetic task.
 *
 * All ranks run the same loop in lockstep (every engine call is
 * collective). Rank 0 prints and writes the metrics; it reads the other
 * ranks' figures from the engine's exchange slots, published before the
 * barrier that ends each step.
 */
#include <math.h>
#include <string.h>
#include <time.h>

#include "ckpt/modelfile.h"
#include "core/log.h"
#include "core/world.h"
#include "device/cpu.h"
#include "fsdp/engine_ckpt.h"
#include "fsdp/trace.h"
#include "models/gpt2.h"
#include "ops/cpu/blas.h"
#include "train/train.h"

void fsdp_train_config_default(fsdp_train_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    fsdp_engine_config *e = &cfg->eng;
    e->backend = fsdp_cuda_device_count() > 0 ? FSDP_BACKEND_CUDA : FSDP_BACKEND_CPU;
    e->comm = FSDP_COMM_AUTO;
    e->n_ranks = e->backend == FSDP_BACKEND_CUDA ? fsdp_cuda_device_count() : 4;
    e->ranks_per_device = 1;
    e->shard = FSDP_SHARD_FULL;
    e->compute_dtype = FSDP_DTYPE_F32;
    e->prefetch = true;
    e->batch = 16;  /* x 4 devices: 64 synthetic problems per step */
    e->seq = 14;    /* one synthetic problem per row (data/synth.c) */
    e->grad_accum = 1;
    e->beta1 = 0.9f;
    e->beta2 = 0.95f;
    e->eps = 1e-8f;
    e->weight_decay = 0.1f;
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

struct trainer {
    const fsdp_train_config *cfg;
    fsdp_engine_shared sh;
    fsdp_model model;
    fsdp_data *data;
    fsdp_train_result *res;
    FILE *log;
    double flops_per_token;   /* 6 P + attention, for MFU */
    double peak_flops;        /* per device; 0 = unknown (no MFU) */
    double tok_s_sum;
    int tok_s_n;
    int correct_total[1024];  /* per rank */
    int seen_total[1024];
    fsdp_ckpt_manifest ck_base;   /* run-level part of the manifests this run writes */
    fsdp_ckpt_manifest ck_resume; /* the checkpoint resumed from */
    char ck_path[FSDP_CKPT_PATH_MAX]; /* its directory; "" when starting fresh */
    int start_step;
    fsdp_modelfile *mf;       /* --model FILE: the initial weights, or NULL */
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void log_step(struct trainer *t, int step, const fsdp_step_result *r, double ms)
{
    const fsdp_train_config *cfg = t->cfg;
    const fsdp_engine_config *ec = &cfg->eng;
    int N = ec->n_ranks;
    double tokens = (double)ec->batch * ec->seq * ec->grad_accum * N;
    double tok_s = tokens / (ms / 1000.0);
    if (step > 0) {
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
    if (cfg->out) {
        char pb[32], hb[32], tk[32];
        if (tok_s >= 1e3)
            snprintf(tk, sizeof tk, "%.1fk", tok_s / 1e3);
        else
            snprintf(tk, sizeof tk, "%.0f", tok_s);
        if (ec->backend == FSDP_BACKEND_META) /* nothing is computed: no loss or norm */
            fprintf(cfg->out, "step %5d/%d | meta: no math | lr %.2e | peak %s/dev", step + 1,
                    cfg->steps, r->lr, fsdp_fmt_bytes(pb, sizeof pb, (double)peak));
        else
            fprintf(cfg->out,
                    "step %5d/%d | loss %.6f | lr %.2e | norm %.3f | %s tok/s | %.1f ms | peak %s/dev",
                    step + 1, cfg->steps, r->loss, r->lr, r->grad_norm, tk, ms,
                    fsdp_fmt_bytes(pb, sizeof pb, (double)peak));
        if (ec->offload)
            fprintf(cfg->out, " | host %s/dev", fsdp_fmt_bytes(hb, sizeof hb, (double)host));
        if (mfu >= 0)
            fprintf(cfg->out, " | mfu %.1f%%", 100 * mfu);
        fputc('\n', cfg->out);
        fflush(cfg->out);
    }
    if (t->log) {
        FILE *f = t->log;
        fprintf(f, "{\"step\":%d,\"loss\":%.9g,\"lr\":%.9g,\"grad_norm\":%.9g,\"tokens\":%.0f,"
                   "\"tokens_per_s\":%.6g,\"step_ms\":%.6g,\"mfu\":",
                step + 1, r->loss, r->lr, r->grad_norm, tokens, tok_s, ms);
        if (mfu >= 0)
            fprintf(f, "%.6g", mfu);
        else
            fprintf(f, "null");
        const char *keys[3] = {"peak_bytes", "comm_bytes", "host_bytes"};
        for (int k = 0; k < 3; k++) {
            fprintf(f, ",\"%s\":[", keys[k]);
            for (int d = 0; d < N; d++) {
                const fsdp_rank_stats *s = &t->sh.x_stats[d];
                size_t v = k == 0 ? s->peak_bytes : k == 1 ? s->comm_recv_bytes : s->host_peak_bytes;
                fprintf(f, "%s%zu", d ? "," : "", v);
            }
            fputc(']', f);
        }
        fprintf(f, "}\n");
        fflush(f);
    }
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
    int total = cfg->eval_problems;
    int n_batches = (total + N * B - 1) / (N * B);
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
    int printed = 0;
    for (int k = 0; k < n_batches; k++) {
        int max_ans = 1;
        memset(tok, 0, (size_t)B * T * sizeof(int));
        for (int b = 0; b < B; b++) {
            int idx = (k * N + rank) * B + b;
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
            int idx = (k * N + rank) * B + b;
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
            t->seen_total[rank]++;
            t->correct_total[rank] += ok;
            if (rank == 0 && cfg->out && printed < cfg->n_samples) {
                char prompt[72], ans[72];
                fsdp_synth_problem(ec->seed, (uint64_t)idx, prompt, ans);
                got[strcspn(got, "\n")] = '\0';
                ans[strcspn(ans, "\n")] = '\0';
                fprintf(cfg->out, "  sample: %s%-8s expected %-8s %s\n", prompt, got, ans,
                        ok ? "ok" : "WRONG");
                printed++;
            }
        }
    }
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

/* After step `step` (0-based): save a checkpoint every ckpt_every steps and
 * after the last one. Collective: every rank calls it. */
static fsdp_status ckpt_maybe_save(struct trainer *t, fsdp_engine *e, int rank, int step)
{
    const fsdp_train_config *cfg = t->cfg;
    int done = step + 1;
    if (!cfg->ckpt_dir || (done != cfg->steps && (cfg->ckpt_every <= 0 || done % cfg->ckpt_every)))
        return FSDP_STATUS_OK;
    double t0 = now_s();
    FSDP_TRY(fsdp_engine_ckpt_save(e, cfg->ckpt_dir, &t->ck_base, (uint64_t)done, cfg->ckpt_keep));
    if (rank == 0 && cfg->out)
        fprintf(cfg->out, "checkpoint: step %d written to %s/step_%08d (rank 0: %.0f ms)\n", done,
                cfg->ckpt_dir, done, (now_s() - t0) * 1000.0);
    return FSDP_STATUS_OK;
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
    if (rank == 0 && cfg->out) {
        char b[32];
        const fsdp_device *d = fsdp_engine_device(e);
        fprintf(cfg->out, "rank 0 after init: %s on the device", fsdp_fmt_bytes(b, sizeof b, (double)d->mem.in_use_bytes));
        if (cfg->eng.offload)
            fprintf(cfg->out, ", %s pinned host", fsdp_fmt_bytes(b, sizeof b, (double)d->host.in_use_bytes));
        fputc('\n', cfg->out);
    }
    for (int step = t->start_step; step < cfg->steps; step++) {
        float lr = fsdp_train_lr(cfg, step);
        double t0 = now_s();
        fsdp_step_result r;
        FSDP_CHECK(fsdp_engine_step(e, (uint64_t)step, lr, &r));
        double ms = (now_s() - t0) * 1000.0;
        if (rank == 0) {
            t->res->losses[step] = r.loss;
            t->res->grad_norms[step] = r.grad_norm;
            t->res->steps = step + 1;
            log_step(t, step, &r, ms);
        }
        FSDP_CHECK(ckpt_maybe_save(t, e, rank, step));
        if (cfg->stop_after > 0 && step + 1 >= cfg->stop_after)
            break;
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
    if (cfg->eval_problems > 0 && t->data && !strcmp(cfg->data, "synthetic") &&
        cfg->eng.backend != FSDP_BACKEND_META)
        FSDP_CHECK(eval_synthetic(t, e, rank));
    st = FSDP_STATUS_OK;
fail:
    fsdp_engine_free(e);
    return st;
}

/* Checkpoints: the manifest base for saves and, with resume, the newest
 * complete checkpoint to start from. A fresh run refuses a directory that
 * already holds checkpoints, so two runs never mix in one directory. */
static fsdp_status ckpt_prepare(struct trainer *t)
{
    const fsdp_train_config *cfg = t->cfg;
    bool found = false;
    uint64_t step = 0;
    FSDP_TRY(fsdp_engine_ckpt_describe(&t->sh, cfg->model, cfg->data, cfg->steps, &t->ck_base));
    if (!cfg->resume) {
        FSDP_TRY(fsdp_ckpt_latest(cfg->ckpt_dir, &step, &found));
        if (found)
            return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                                  "--ckpt-dir '%s' already holds checkpoints (newest: step %llu); "
                                  "pass --resume to continue from it, or choose another directory",
                                  cfg->ckpt_dir, (unsigned long long)step);
        return FSDP_STATUS_OK;
    }
    FSDP_TRY(fsdp_engine_ckpt_find(&t->sh, cfg->ckpt_dir, &t->ck_resume, t->ck_path,
                                   sizeof t->ck_path, &found));
    if (!found) {
        t->ck_path[0] = '\0';
        if (cfg->out)
            fprintf(cfg->out, "resume: no complete checkpoint in %s; starting from step 0\n",
                    cfg->ckpt_dir);
        return FSDP_STATUS_OK;
    }
    const fsdp_ckpt_manifest *m = &t->ck_resume;
    t->start_step = m->step < (uint64_t)cfg->steps ? (int)m->step : cfg->steps;
    if (cfg->out) {
        fprintf(cfg->out, "resuming from %s: step %llu, written by %d device(s) with shard %s\n",
                t->ck_path, (unsigned long long)m->step, m->world_size, m->shard);
        if (m->steps_total != cfg->steps)
            fprintf(cfg->out, "note: the checkpoint's run had --steps %d; the learning-rate "
                              "schedule now spans %d steps\n", m->steps_total, cfg->steps);
        if (m->step >= (uint64_t)cfg->steps)
            fprintf(cfg->out, "resume: the checkpoint is at or past --steps %d; no steps to run\n",
                    cfg->steps);
        if (cfg->data && strcmp(m->data, cfg->data))
            fprintf(cfg->out, "warning: the checkpoint was trained on data '%s', this run reads "
                              "'%s'\n", m->data, cfg->data);
    }
    return FSDP_STATUS_OK;
}

fsdp_status fsdp_train_run(const fsdp_train_config *cfg, fsdp_train_result *res)
{
    memset(res, 0, sizeof *res);
    res->accuracy = -1.0f;
    fsdp_status st;
    struct trainer *t = calloc(1, sizeof *t);
    fsdp_world *w = NULL;
    fsdp_gpt2_config gc;
    if (!t)
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory");
    t->cfg = cfg;
    t->res = res;
    const fsdp_engine_config *ec = &cfg->eng;
    if (ec->n_ranks < 1 || ec->n_ranks > 1024) {
        st = fsdp_error_set(FSDP_STATUS_INVALID_ARG, "--devices must be 1..1024, got %d",
                            ec->n_ranks);
        goto fail;
    }
    if (cfg->steps < 0) {
        st = fsdp_error_set(FSDP_STATUS_INVALID_ARG, "--steps must be >= 0");
        goto fail;
    }
    if (fsdp_modelfile_is_path(cfg->model)) {
        /* fine-tuning: shape and initial weights from the file; each rank
         * reads its own shards of it (engine init_fn) */
        FSDP_CHECK(fsdp_modelfile_open(&t->mf, cfg->model));
        gc = *fsdp_modelfile_config(t->mf);
    } else {
        FSDP_CHECK(fsdp_gpt2_config_parse(cfg->model, &gc));
    }
    if (cfg->data && ec->backend != FSDP_BACKEND_META) {
        FSDP_CHECK(fsdp_data_open(&t->data, cfg->data, 0, ec->seed));
        int dv = fsdp_data_vocab(t->data);
        if (dv > gc.vocab_size) {
            st = fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                                "the data uses token ids up to %d but model '%s' has a vocabulary "
                                "of %d; pick a model with a larger vocabulary",
                                dv - 1, cfg->model, gc.vocab_size);
            goto fail;
        }
    }
    FSDP_CHECK(fsdp_gpt2_init(&t->model, &gc));
    if (t->mf)
        FSDP_CHECK(fsdp_modelfile_bind(t->mf, &t->model));
    if (ec->backend == FSDP_BACKEND_CUDA)
        t->peak_flops = ec->compute_dtype == FSDP_DTYPE_BF16 ? 989e12 : 67e12; /* H100/H200 SXM */
    t->flops_per_token = 6.0 * (double)t->model.numel +
                         12.0 * gc.n_layer * (double)gc.n_embd * ec->seq;
    FSDP_CHECK(fsdp_world_init(&w, ec->n_ranks));
    FSDP_CHECK(fsdp_engine_shared_init(&t->sh, ec, &t->model, t->data, w));
    if (t->mf) {
        t->sh.init_fn = fsdp_modelfile_init_fn;
        t->sh.init_arg = t->mf;
    }
    if (cfg->ckpt_dir)
        FSDP_CHECK(ckpt_prepare(t));
    if (cfg->trace_path)
        FSDP_CHECK(fsdp_trace_init(&t->sh.trace, ec->n_ranks));
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
    if (cfg->log_path && !(t->log = fopen(cfg->log_path, t->ck_path[0] ? "a" : "w"))) {
        st = fsdp_error_set(FSDP_STATUS_IO, "cannot open metrics file '%s' for writing",
                            cfg->log_path);
        goto fail;
    }
    if (cfg->out) {
        char b[32];
        fprintf(cfg->out,
                "fsdp train: model %s (%.2fM params, %d units), %d x %s device(s), shard %s, %s, "
                "batch %d x seq %d x accum %d x %d ranks = %d tokens/step, %d steps\n",
                cfg->model, (double)t->model.numel / 1e6, t->model.n_units, ec->n_ranks,
                fsdp_backend_name(ec->backend), fsdp_shard_strategy_name(ec->shard),
                fsdp_dtype_name(ec->compute_dtype), ec->batch, ec->seq, ec->grad_accum,
                ec->n_ranks, ec->batch * ec->seq * ec->grad_accum * ec->n_ranks, cfg->steps);
        if (ec->device_mem)
            fprintf(cfg->out, "device memory cap %s\n",
                    fsdp_fmt_bytes(b, sizeof b, (double)ec->device_mem));
        if (ec->backend == FSDP_BACKEND_CPU)
            fsdp_cpu_print_header(cfg->out, ec->n_ranks, ec->threads_per_device);
    }
    fsdp_device_cpu_set_threads(ec->threads_per_device); /* read as the cpu devices start */
    st = fsdp_world_launch(w, rank_main, t);
    if (st == FSDP_STATUS_OK) {
        res->tokens_per_s = t->tok_s_n ? t->tok_s_sum / t->tok_s_n : 0;
        int seen = 0, correct = 0;
        for (int r = 0; r < ec->n_ranks && r < 1024; r++) {
            seen += t->seen_total[r];
            correct += t->correct_total[r];
        }
        if (seen)
            res->accuracy = (float)correct / (float)seen;
        if (cfg->out && seen)
            fprintf(cfg->out, "held-out accuracy: %.1f%% (%d/%d problems, greedy decoding)\n",
                    100.0 * res->accuracy, correct, seen);
        if (t->sh.trace) {
            st = fsdp_trace_write(t->sh.trace, cfg->trace_path);
            if (st == FSDP_STATUS_OK && cfg->out)
                fprintf(cfg->out, "trace written to %s\n", cfg->trace_path);
        }
    }
fail:
    if (t->log && fclose(t->log) != 0 && st == FSDP_STATUS_OK)
        st = fsdp_error_set(FSDP_STATUS_IO, "error writing metrics file '%s'", cfg->log_path);
    fsdp_trace_free(t->sh.trace);
    t->sh.trace = NULL;
    fsdp_ckpt_manifest_free(&t->ck_base);
    fsdp_ckpt_manifest_free(&t->ck_resume);
    fsdp_engine_shared_free(&t->sh);
    if (t->model.units)
        fsdp_model_free(&t->model);
    if (t->data)
        fsdp_data_close(t->data);
    fsdp_modelfile_close(t->mf);
    fsdp_world_free(w);
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
