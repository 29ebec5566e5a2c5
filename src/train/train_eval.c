/*
 * train_eval.c - the held-out loss during a training run (train_internal.h):
 * when it is measured, what rank 0 prints and records, the best checkpoint
 * (--keep-best) and early stopping (--early-stop). The measurement itself
 * is heldout.c's.
 *
 * Every rank takes the same decisions: the loss comes to each of them
 * from one exchange of the same values (heldout.h), so the best step and
 * the count of evaluations without improvement are the same everywhere
 * and no further agreement is needed before a checkpoint or a stop.
 */
#include <math.h>
#include <string.h>

#include "train/train_internal.h"

/* --resume with --keep-best from a checkpoint that records no standing (written
 * before it did: manifest.h): the best the earlier run recorded in DIR/BEST, so a worse
 * loss after the resume does not replace it. A checkpoint's own standing replaces this
 * (fsdp_trainer_ckpt_prepare). */
static fsdp_status eval_resume_best(struct trainer *t)
{
    uint64_t step;
    double loss;
    bool found;
    FSDP_TRY(fsdp_ckpt_best_read(t->cfg->ckpt_dir, &step, &loss, &found));
    if (found) {
        t->eval0.best = (float)loss;
        t->eval0.best_step = (int)step;
    }
    return FSDP_STATUS_OK;
}

fsdp_status fsdp_trainer_eval_open(struct trainer *t, const fsdp_engine_config *ec)
{
    const fsdp_train_config *cfg = t->cfg;
    t->eval0 = (struct eval_track){.best = INFINITY};
    if (!cfg->eval_data || !t->data)
        return FSDP_STATUS_OK;
    fsdp_data_opts dopt = {.spec = cfg->eval_data, .seed = ec->seed,
                           .tokenizer = t->tokenizer[0] ? t->tokenizer : NULL,
                           .chat_format = t->chat_format[0] ? t->chat_format : NULL};
    FSDP_TRY(fsdp_heldout_open(&t->heldout, &dopt, t->data, cfg->data, ec->batch, ec->seq,
                               cfg->eval_steps, t->model.vocab_size));
    t->eval_every = cfg->eval_every > 0 ? cfg->eval_every : cfg->steps / 10;
    if (t->eval_every < 1)
        t->eval_every = 1;
    if (cfg->keep_best && cfg->resume && cfg->ckpt_dir)
        FSDP_TRY(eval_resume_best(t));
    if (t->out) {
        fprintf(t->out, "eval: %d micro-batches of %d x %d from '%s'%s after every %d steps "
                "and the last", t->heldout.n_batches, ec->batch, ec->seq, cfg->eval_data,
                fsdp_data_packed(t->heldout.data) ? " (packed as the training rows)" : "",
                t->eval_every);
        if (cfg->keep_best)
            fprintf(t->out, "; the best checkpoint is kept (%s/" FSDP_CKPT_BEST_NAME ")",
                    cfg->ckpt_dir);
        if (cfg->early_stop)
            fprintf(t->out, "; early stop after %d without improvement", cfg->early_stop);
        fputc('\n', t->out);
    }
    return FSDP_STATUS_OK;
}

fsdp_status fsdp_trainer_eval_step(struct trainer *t, fsdp_engine *e, int rank, int done,
                                   struct eval_track *ev, float *loss, bool *best)
{
    const fsdp_train_config *cfg = t->cfg;
    *loss = NAN;
    *best = false;
    if (!t->heldout.data || (done % t->eval_every && done != cfg->steps))
        return FSDP_STATUS_OK;
    float l = NAN;
    fsdp_status st = fsdp_heldout_run(&t->heldout, e, cfg->eng.n_ranks, rank, &l);
    if (st != FSDP_STATUS_OK) {
        fsdp_error_prefix("evaluating --eval-data after step %d", done);
        return st;
    }
    *loss = l;
    if (l < ev->best) {
        *ev = (struct eval_track){.best = l, .best_step = done};
        *best = true;
    } else {
        ev->n_worse++;
    }
    if (rank == 0) {
        t->res->eval_loss = l;
        t->res->best_eval_loss = ev->best;
        t->res->best_eval_step = ev->best_step;
        /* the standing every later checkpoint records (manifest.h), so a resume goes on
         * counting towards --early-stop from here; rank 0 alone writes the manifest */
        t->ck_base.eval_recorded = true;
        t->ck_base.eval_best = ev->best;
        t->ck_base.eval_best_step = (uint64_t)ev->best_step;
        t->ck_base.eval_n_worse = ev->n_worse;
    }
    return FSDP_STATUS_OK;
}

void fsdp_trainer_eval_print(const struct trainer *t, int done, const struct eval_track *ev,
                             float loss)
{
    if (!t->out || isnan(loss))
        return;
    fprintf(t->out, "eval  %5d/%d | eval loss %.6g | ppl %.6g | ", done, t->cfg->steps,
            (double)loss, exp((double)loss));
    if (ev->best_step == done)
        fprintf(t->out, "best so far\n");
    else
        fprintf(t->out, "best %.6g after step %d (%d evaluation%s without improvement)\n",
                (double)ev->best, ev->best_step, ev->n_worse, ev->n_worse == 1 ? "" : "s");
}

fsdp_status fsdp_trainer_eval_mark_best(struct trainer *t, int rank, int done, float loss)
{
    if (rank != 0)
        return FSDP_STATUS_OK;
    FSDP_TRY(fsdp_ckpt_best_write(t->cfg->ckpt_dir, (uint64_t)done, (double)loss));
    if (t->out)
        fprintf(t->out, "checkpoint: step %d has the lowest eval loss so far: recorded in "
                "%s/" FSDP_CKPT_BEST_NAME "\n", done, t->cfg->ckpt_dir);
    return FSDP_STATUS_OK;
}

void fsdp_trainer_eval_early_stop(struct trainer *t, int rank, int done,
                                  const struct eval_track *ev)
{
    if (rank != 0)
        return;
    t->res->early_stopped = true;
    if (t->out)
        fprintf(t->out, "early stop after step %d of %d: the eval loss has not improved for %d "
                "evaluations (best %.6g after step %d)\n", done, t->cfg->steps, ev->n_worse,
                (double)ev->best, ev->best_step);
}
