/*
 * train_ckpt.c - the training run's checkpoints (train_internal.h): claiming
 * --ckpt-dir, finding the checkpoint to resume from and telling the user
 * how it differs from this run, and saving.
 *
 * A job of several processes: process 0 holds the directory's lock and
 * writes the manifest; every process reads the checkpoint to resume from,
 * and they must find the same one (fsdp_job_agree after each step that can
 * fail on one process only).
 */
#include <string.h>

#include "ckpt/ckpt_base.h"
#include "ckpt/ckpt_tok.h"
#include "core/clock.h"
#include "core/paths.h"
#include "engine/engine_ckpt.h"
#include "train/job.h"
#include "train/train_internal.h"

/* The learning-rate schedule into the manifest base (its `schedule` line). */
static void schedule_record(struct trainer *t)
{
    fsdp_lr_plan p = fsdp_trainer_lr_plan(t->cfg);
    fsdp_ckpt_manifest *m = &t->ck_base;
    snprintf(m->schedule, sizeof m->schedule, "%s",
             fsdp_names_name(&fsdp_lr_schedule_names, (int)p.schedule));
    m->lr = p.lr;
    m->min_lr = p.min_lr;
    m->warmup = p.warmup;
    m->decay_frac = p.decay_frac;
}

/* "--schedule cosine --lr 0.003 --min-lr 0.0003 --warmup 10" (wsd: --decay-frac too) of the
 * schedule a manifest records, into buf. */
static const char *schedule_text(const fsdp_ckpt_manifest *m, char *buf, size_t n)
{
    int at = snprintf(buf, n, "--schedule %s --lr %g --min-lr %g --warmup %d", m->schedule,
                      m->lr, m->min_lr, m->warmup);
    if (!strcmp(m->schedule, "wsd") && at > 0 && (size_t)at < n)
        snprintf(buf + at, n - (size_t)at, " --decay-frac %g", m->decay_frac);
    return buf;
}

/* A resume whose schedule settings differ from those the checkpoint's run recorded (an
 * older manifest records none: nothing to compare): a note naming both, since the learning
 * rate from the resumed step on follows this run's. --steps has its own note. */
static void schedule_note(const struct trainer *t)
{
    const fsdp_ckpt_manifest *was = &t->ck_resume, *now = &t->ck_base;
    if (!was->schedule[0] || t->start_step >= t->cfg->steps)
        return;
    bool wsd = !strcmp(now->schedule, "wsd");
    if (!strcmp(was->schedule, now->schedule) && (float)was->lr == (float)now->lr &&
        was->min_lr == now->min_lr && was->warmup == now->warmup &&
        (!wsd || (float)was->decay_frac == (float)now->decay_frac))
        return;
    char a[160], b[160];
    fprintf(t->out, "note: the checkpoint's run had the learning-rate schedule %s; this run's "
                    "is %s: from step %d on the rate follows this run's (pass the checkpoint's "
                    "settings to continue its schedule)\n", schedule_text(was, a, sizeof a),
            schedule_text(now, b, sizeof b), t->start_step + 1);
}

/* Checkpoints, before any resume: the manifest base for saves (one run id
 * for the job: the manifest's and every rank's shard file's) and the
 * directory's lock, held by process 0 until the run ends. A fresh run
 * refuses a directory that already holds checkpoints, so two runs never
 * mix in one directory. */
static fsdp_status ckpt_claim(struct trainer *t)
{
    const fsdp_train_config *cfg = t->cfg;
    bool found = false;
    uint64_t step = 0;
    fsdp_status st = fsdp_engine_ckpt_describe(&t->sh, cfg->data, cfg->steps, &t->ck_base);
    snprintf(t->ck_base.tokenizer, sizeof t->ck_base.tokenizer, "%s", t->tokenizer);
    if (t->data) /* how its {"messages"} rows render: a resume renders them so too */
        snprintf(t->ck_base.chat_format, sizeof t->ck_base.chat_format, "%s",
                 fsdp_data_chat_format(t->data));
    if (st == FSDP_STATUS_OK && t->model.train_numel < t->model.numel) { /* the frozen part's */
        snprintf(t->ck_base.base, sizeof t->ck_base.base, "%s", cfg->model ? cfg->model : "");
        st = fsdp_ckpt_base_hash(cfg->model, t->model.config, cfg->eng.seed,
                                 &t->ck_base.base_hash);
    }
    schedule_record(t);
    if (st == FSDP_STATUS_OK && t->tokenizer[0]) /* every checkpoint carries it (ckpt_tok.h) */
        st = fsdp_ckpt_tok_load(&t->ck_base, t->tokenizer, NULL);
    FSDP_TRY(fsdp_job_agree(cfg->procs, t->world, st));
    FSDP_TRY(fsdp_job_from_process0(cfg->procs, t->world, &t->ck_base.run_id,
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
    FSDP_TRY(fsdp_job_agree(cfg->procs, t->world, st));
    return fsdp_job_dir_shared(cfg->procs, t->world, cfg->ckpt_dir, t->ck_base.run_id,
                               "--ckpt-dir");
}

/* Whether the tokenizer.json this run carries has other bytes than the one the checkpoint
 * carries (false when either carries none). */
static bool tokenizer_bytes_differ(const struct trainer *t)
{
    const fsdp_ckpt_manifest *m = &t->ck_resume, *now = &t->ck_base;
    return m->n_tok_files && now->n_tok_files && /* tokenizer.json first (manifest.h) */
           (m->tok_files[0].xxh64 != now->tok_files[0].xxh64 ||
            m->tok_files[0].size_bytes != now->tok_files[0].size_bytes);
}

/* Whether this run reads its data through another tokenizer than the checkpoint's run:
 * another file (two spellings of one file are the same; the checkpoint's own copy, taken
 * by a resume without --tokenizer, is the recorded one), or other bytes in the
 * tokenizer.json both carry (a file edited since). */
static bool tokenizer_differs(const struct trainer *t)
{
    const fsdp_ckpt_manifest *m = &t->ck_resume;
    if (!m->tokenizer_recorded)
        return false;
    bool other_file = !t->tok_from_ckpt && strcmp(m->tokenizer, t->tokenizer) &&
                      !fsdp_paths_same_file(m->tokenizer, t->tokenizer);
    return other_file || tokenizer_bytes_differ(t);
}

/* Whether this run renders {"messages"} rows otherwise than the checkpoint's run did (a
 * rendering either does not record is not compared). */
static bool chat_differs(const struct trainer *t)
{
    const char *was = t->ck_resume.chat_format, *now = t->ck_base.chat_format;
    return was[0] && now[0] && strcmp(was, now);
}

/* Whether this run reads other data than the checkpoint it resumes from
 * says it was trained on (a spec it does not record is not compared; two
 * spellings of one file are the same), or through another tokenizer. */
static bool data_differs(const struct trainer *t)
{
    const fsdp_ckpt_manifest *m = &t->ck_resume;
    const char *data = t->cfg->data ? t->cfg->data : "";
    bool other_data = m->data[0] && strcmp(m->data, data) && !fsdp_paths_same_file(m->data, data);
    return other_data || tokenizer_differs(t);
}

/* What the user should know about the checkpoint resumed from: where it
 * is, and what differs from this run (schedule, global batch, data). */
static void resume_notes(const struct trainer *t)
{
    const fsdp_train_config *cfg = t->cfg;
    const fsdp_ckpt_manifest *m = &t->ck_resume;
    const fsdp_engine_config *ec = &cfg->eng;
    fprintf(t->out, "resuming from %s: step %llu, written by %d device(s) with shard %s\n",
            t->ck_path, (unsigned long long)m->step, m->world_size, m->shard);
    if (m->steps_total != cfg->steps && m->step < (uint64_t)cfg->steps)
        fprintf(t->out, "note: the checkpoint's run had --steps %d; the learning-rate "
                        "schedule now spans %d steps\n", m->steps_total, cfg->steps);
    schedule_note(t);
    uint64_t was = (uint64_t)m->batch * (uint64_t)m->world_size * (uint64_t)m->grad_accum;
    uint64_t now = (uint64_t)ec->batch * (uint64_t)ec->n_ranks * (uint64_t)ec->grad_accum;
    if (was != now && m->step < (uint64_t)cfg->steps)
        fprintf(t->out, "note: --allow-batch-change: the global batch was %llu sequences "
                        "and is now %llu; the data continues at step x %llu sequences, "
                        "and this run is no longer bit-identical to one that kept the "
                        "batch\n", (unsigned long long)was, (unsigned long long)now,
                (unsigned long long)now);
    if (data_differs(t))
        fprintf(t->out, "note: --allow-data-change: the checkpoint was trained on --data '%s' "
                        "(--tokenizer '%s'); this run reads '%s' (--tokenizer '%s') from the "
                        "checkpoint's position\n", m->data, m->tokenizer_recorded ? m->tokenizer
                                                                                 : "unrecorded",
                cfg->data ? cfg->data : "", t->tokenizer);
    if (chat_differs(t))
        fprintf(t->out, "note: --allow-data-change: the checkpoint's run rendered {\"messages\"} "
                        "rows with --chat-format %s; this run renders them with %s\n",
                m->chat_format, t->ck_base.chat_format);
}

/* --resume: the newest complete checkpoint in --ckpt-dir, which every
 * process reads and must find the same; t->ck_path "" when there is none
 * (the run starts from step 0). */
static fsdp_status ckpt_find_resume(struct trainer *t)
{
    const fsdp_train_config *cfg = t->cfg;
    bool found = false;
    fsdp_status st = fsdp_engine_ckpt_find(&t->sh, cfg->ckpt_dir, cfg->allow_batch_change,
                                           &t->ck_resume, t->ck_path, sizeof t->ck_path, &found);
    FSDP_TRY(fsdp_job_agree(cfg->procs, t->world, st));
    uint64_t seen[2] = {found, found ? t->ck_resume.step : 0}, first[2] = {seen[0], seen[1]};
    FSDP_TRY(fsdp_job_from_process0(cfg->procs, t->world, first, sizeof first));
    if (memcmp(seen, first, sizeof seen))
        st = fsdp_error_set(FSDP_STATUS_IO,
                            "process %d finds %s in --ckpt-dir '%s' where process 0 finds %s%llu; "
                            "was a checkpoint written or removed while the job started?",
                            t->world->process, found ? "a checkpoint" : "no checkpoint",
                            cfg->ckpt_dir, first[0] ? "step " : "none",
                            (unsigned long long)first[1]);
    FSDP_TRY(fsdp_job_agree(cfg->procs, t->world, st));
    if (!found) {
        t->ck_path[0] = '\0';
        if (t->out)
            fprintf(t->out, "resume: no complete checkpoint in %s; starting from step 0\n",
                    cfg->ckpt_dir);
        return FSDP_STATUS_OK;
    }
    const fsdp_ckpt_manifest *m = &t->ck_resume;
    if (t->tok_from_ckpt && m->tokenizer_recorded) /* its copy: the later ones name the same */
        snprintf(t->ck_base.tokenizer, sizeof t->ck_base.tokenizer, "%s", m->tokenizer);
    if (chat_differs(t) && !cfg->allow_data_change)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "checkpoint '%s' was trained on {\"messages\"} rows rendered with "
                              "--chat-format %s; this run renders them with %s, other tokens "
                              "at the position it would resume at: pass --chat-format %s (or "
                              "none: the checkpoint's), or --allow-data-change to continue on "
                              "these", t->ck_path, m->chat_format, t->ck_base.chat_format,
                              m->chat_format);
    if (data_differs(t) && !cfg->allow_data_change)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "checkpoint '%s' was trained on --data '%s' (--tokenizer '%s'); "
                              "this run reads --data '%s' (--tokenizer '%s'%s), and the "
                              "position it would resume at belongs to the other data: pass the "
                              "same --data and --tokenizer (or no --tokenizer: the checkpoint's "
                              "copy), or --allow-data-change to continue on these", t->ck_path,
                              m->data, m->tokenizer_recorded ? m->tokenizer : "unrecorded",
                              cfg->data ? cfg->data : "", t->tokenizer,
                              tokenizer_bytes_differ(t) ? ", another tokenizer.json" : "");
    if (m->base[0] && m->base_hash != t->ck_base.base_hash)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "checkpoint '%s' trained adapters on the base '%s' (hash %016llx); "
                              "this run's --model '%s' is another base (hash %016llx): resume "
                              "with the checkpoint's base", t->ck_path, m->base,
                              (unsigned long long)m->base_hash, t->ck_base.base,
                              (unsigned long long)t->ck_base.base_hash);
    t->start_step = m->step < (uint64_t)cfg->steps ? (int)m->step : cfg->steps;
    if (m->eval_recorded) { /* the held-out standing goes on (--keep-best, --early-stop) */
        t->eval0 = (struct eval_track){.best = (float)m->eval_best,
                                       .best_step = (int)m->eval_best_step,
                                       .n_worse = m->eval_n_worse};
        t->ck_base.eval_recorded = true;
        t->ck_base.eval_best = m->eval_best;
        t->ck_base.eval_best_step = m->eval_best_step;
        t->ck_base.eval_n_worse = m->eval_n_worse;
    }
    if (t->out)
        resume_notes(t);
    return FSDP_STATUS_OK;
}

fsdp_status fsdp_trainer_ckpt_tokenizer(struct trainer *t, char *buf, size_t n, bool *found)
{
    const fsdp_train_config *cfg = t->cfg;
    *found = false;
    if (cfg->tokenizer || !cfg->resume || !cfg->ckpt_dir)
        return FSDP_STATUS_OK;
    FSDP_TRY(fsdp_ckpt_tok_find(cfg->ckpt_dir, buf, n, found));
    t->tok_from_ckpt = *found;
    if (*found && t->out)
        fprintf(t->out, "tokenizer: %s (the copy the checkpoint to resume carries; --tokenizer "
                "to choose)\n", buf);
    return FSDP_STATUS_OK;
}

fsdp_status fsdp_trainer_ckpt_chat_format(struct trainer *t)
{
    const fsdp_train_config *cfg = t->cfg;
    if (cfg->chat_format || !cfg->resume || !cfg->ckpt_dir) {
        snprintf(t->chat_format, sizeof t->chat_format, "%s",
                 cfg->chat_format ? cfg->chat_format : "");
        return FSDP_STATUS_OK;
    }
    fsdp_ckpt_run run;
    FSDP_TRY(fsdp_ckpt_run_find(cfg->ckpt_dir, &run));
    snprintf(t->chat_format, sizeof t->chat_format, "%s", run.chat_format);
    if (t->chat_format[0] && t->out)
        fprintf(t->out, "chat format: %s (the checkpoint's run's; --chat-format to choose)\n",
                t->chat_format);
    return FSDP_STATUS_OK;
}

fsdp_status fsdp_trainer_ckpt_prepare(struct trainer *t)
{
    FSDP_TRY(ckpt_claim(t));
    return t->cfg->resume ? ckpt_find_resume(t) : FSDP_STATUS_OK;
}

fsdp_status fsdp_trainer_ckpt_save(struct trainer *t, fsdp_engine *e, int rank, int done)
{
    const fsdp_train_config *cfg = t->cfg;
    double t0 = fsdp_now_s();
    FSDP_TRY(fsdp_engine_ckpt_save(e, cfg->ckpt_dir, &t->ck_base, (uint64_t)done,
                                   cfg->ckpt_keep));
    if (rank == 0) {
        t->res->ckpt_step = done;
        if (t->out)
            fprintf(t->out, "checkpoint: step %d written to %s/step_%08d (rank 0: %.0f ms)\n",
                    done, cfg->ckpt_dir, done, (fsdp_now_s() - t0) * 1000.0);
    }
    return FSDP_STATUS_OK;
}
