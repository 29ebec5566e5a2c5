/*
 * train_data.c - what the trainer decides from its data once it is open,
 * before the engine is built: the default sequence length of a pre-trained
 * model on .jsonl data, whether example rows are packed (data.h), the steps
 * of --epochs, the refusal of example data with nothing to train on, and
 * the header lines that say how many examples, rows and epochs the steps
 * cover and what fraction of the row tokens is padding. Also the real
 * (not padding) tokens of a step, which tokens/s and MFU count.
 *
 * Runs on the main thread of every process of the job; each decides the
 * same from the same data and settings (packing is a pure function of the
 * examples, the seed and --seq), so nothing is exchanged.
 */
#include <limits.h>
#include <string.h>

#include "core/log.h"
#include "comm/procs.h"
#include "train/train_internal.h"

static const fsdp_name pack_names[] = {
    {"on", FSDP_TRAIN_PACK_ON,
     "several examples per row of --seq, attention and positions restarting at each one "
     "(the default where the model's attention takes positions: Llama, GPT-2)"},
    {"off", FSDP_TRAIN_PACK_OFF,
     "one example per row, padded; each step runs at its longest example"},
};
const fsdp_name_table fsdp_train_pack_names = FSDP_NAME_TABLE(pack_names);

int fsdp_train_seq_examples(const fsdp_data *d, int T)
{
    if (!fsdp_data_masked(d))
        return T;
    uint64_t longest = fsdp_data_longest(d), need = longest > 1 ? longest - 1 : 1;
    uint64_t r = (need + FSDP_TRAIN_SEQ_ROUND - 1) / FSDP_TRAIN_SEQ_ROUND * FSDP_TRAIN_SEQ_ROUND;
    return r < (uint64_t)T ? (int)r : T;
}

/* cfg->seq_auto on example data: fsdp_train_seq_examples of the default; the header line
 * says which. */
static void seq_default(struct trainer *t, fsdp_engine_config *ec)
{
    int r = fsdp_train_seq_examples(t->data, ec->seq);
    if (r < ec->seq) {
        uint64_t longest = fsdp_data_longest(t->data);
        ec->seq = r;
        t->run.eng.seq = ec->seq;
        if (t->out)
            fprintf(t->out, "seq: %d (default: the longest example, %llu tokens, rounded up to "
                    "a multiple of %d; the model's context is %d; --seq to choose)\n", ec->seq,
                    (unsigned long long)longest, FSDP_TRAIN_SEQ_ROUND, t->model.max_seq_len);
    } else if (t->out) {
        fprintf(t->out, "seq: %d (default: the smaller of the model's context, %d, and %d; "
                "--seq to choose)\n", ec->seq, t->model.max_seq_len, FSDP_TRAIN_SEQ_CAP);
    }
}

/* Example data: the loss is the mean over completion/assistant targets
 * (engine.c). An example cut at --seq before its first trained token
 * trains nothing, and a run where every example is such trains on a loss
 * of 0 while weight decay alone shrinks the weights: refused. Some of
 * them: a warning on stderr that --quiet does not hide (process 0). */
static fsdp_status check_targets(const struct trainer *t, const fsdp_engine_config *ec)
{
    uint64_t cut, none, n = fsdp_data_n_examples(t->data);
    fsdp_data_truncated(t->data, ec->seq, &cut, &none);
    if (none == n)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "none of the %llu examples in '%s' has a completion or assistant "
                              "token within --seq %d (%llu are cut at %d tokens): there is "
                              "nothing to train on; raise --seq (model '%s' takes up to %d) or "
                              "shorten the prompts", (unsigned long long)n, t->cfg->data,
                              ec->seq, (unsigned long long)cut, ec->seq + 1, t->cfg->model,
                              t->model.max_seq_len);
    if (none && (!t->cfg->procs || t->cfg->procs->process == 0))
        FSDP_WARN(FSDP_SUB_DATA, "%llu of the %llu examples in '%s' have no completion or "
                  "assistant token within --seq %d: their rows train nothing; raise --seq "
                  "(model '%s' takes up to %d) or shorten the prompts", (unsigned long long)none,
                  (unsigned long long)n, t->cfg->data, ec->seq, t->cfg->model,
                  t->model.max_seq_len);
    return FSDP_STATUS_OK;
}

fsdp_status fsdp_train_pack_rows(const fsdp_model *m, const char *model, fsdp_data *d, int pack,
                                 int T, bool *packed)
{
    bool can = m->iface->state_positions != NULL;
    *packed = false;
    if (pack == FSDP_TRAIN_PACK_ON && !can)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "--pack on: model '%s' (family %s) cannot keep packed examples "
                              "apart (its attention has no document mask and it reads "
                              "positions by column, so an example would attend to the ones "
                              "before it in its row); use --pack off, its default (one example "
                              "per row, padded), or a model of a family that packs (llama, gpt2)",
                              model, m->family->name);
    if (pack == FSDP_TRAIN_PACK_ON ||
        (pack == FSDP_TRAIN_PACK_AUTO && can && fsdp_data_masked(d))) {
        FSDP_TRY(fsdp_data_pack(d, T)); /* refuses a token stream */
        *packed = true;
    }
    return FSDP_STATUS_OK;
}

static fsdp_status pack(struct trainer *t, fsdp_engine_config *ec)
{
    bool packed;
    FSDP_TRY(fsdp_train_pack_rows(&t->model, t->cfg->model, t->data, t->cfg->pack, ec->seq,
                                  &packed));
    if (packed)
        ec->positions = t->run.eng.positions = true; /* the plan of this run counts them */
    return FSDP_STATUS_OK;
}

/* --pack off: each step's rows need only its longest example's positions (data.h's
 * fsdp_data_rows_len, taken over the step's global batch so it does not depend on the
 * device count). Over the steps of the first epoch (at most the run's): the shortest
 * and longest of those lengths, and the fraction of padding in rows cut to them. */
static void step_rows(const struct trainer *t, const fsdp_engine_config *ec, uint64_t n_rows,
                      int *lo, int *hi, double *pad)
{
    uint64_t M = (uint64_t)ec->n_ranks * (uint64_t)ec->grad_accum, G = M * (uint64_t)ec->batch;
    uint64_t steps = (n_rows + G - 1) / G;
    if (steps > (uint64_t)t->run.steps)
        steps = (uint64_t)t->run.steps;
    double slots = 0, real = 0;
    *lo = ec->seq;
    *hi = 0;
    for (uint64_t s = 0; s < steps; s++) {
        int len = fsdp_data_rows_len(t->data, s * M, (int)M, ec->batch, ec->seq);
        *lo = len < *lo ? len : *lo;
        *hi = len > *hi ? len : *hi;
        slots += (double)G * len;
        for (uint64_t k = 0; k < M; k++)
            real += (double)fsdp_data_batch_real(t->data, s * M + k, ec->batch, ec->seq);
    }
    *pad = slots > 0 ? 1.0 - real / slots : 0.0;
}

/* --epochs: the steps that cover them, rounded up. */
static fsdp_status epochs_steps(struct trainer *t, const fsdp_engine_config *ec,
                                const fsdp_data_layout *lay)
{
    uint64_t per_step = (uint64_t)ec->batch * (uint64_t)ec->grad_accum * (uint64_t)ec->n_ranks;
    if (!lay->n_rows)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "--epochs needs data of a known size; '%s' is %s: use --steps",
                              t->cfg->data, fsdp_data_n_tokens(t->data) ? "shorter than one "
                              "row of --seq" : "endless (the synthetic task)");
    uint64_t steps = ((uint64_t)t->cfg->epochs * lay->n_rows + per_step - 1) / per_step;
    if (steps > INT_MAX / 2)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "--epochs %d is %llu steps of %llu rows: too many; use fewer "
                              "epochs or a larger batch", t->cfg->epochs,
                              (unsigned long long)steps, (unsigned long long)per_step);
    t->run.steps = (int)steps;
    return FSDP_STATUS_OK;
}

fsdp_status fsdp_trainer_data_rows(struct trainer *t, fsdp_engine_config *ec)
{
    const fsdp_train_config *cfg = t->cfg;
    bool examples = fsdp_data_masked(t->data);
    if (cfg->seq_auto)
        seq_default(t, ec);
    FSDP_TRY(pack(t, ec));
    if (examples)
        FSDP_TRY(check_targets(t, ec));
    fsdp_data_layout lay;
    fsdp_data_layout_get(t->data, ec->seq, &lay);
    if (cfg->epochs > 0)
        FSDP_TRY(epochs_steps(t, ec, &lay));
    if (!t->out || (!examples && cfg->epochs <= 0))
        return FSDP_STATUS_OK;
    uint64_t per_step = (uint64_t)ec->batch * (uint64_t)ec->grad_accum * (uint64_t)ec->n_ranks;
    double epochs = lay.n_rows ? (double)t->run.steps * (double)per_step / (double)lay.n_rows : 0;
    if (examples) {
        uint64_t cut, none;
        fsdp_data_truncated(t->data, ec->seq, &cut, &none);
        double slots = (double)lay.n_rows * (double)ec->seq;
        fprintf(t->out, "data: %llu examples from '%s' ", (unsigned long long)
                fsdp_data_n_examples(t->data), cfg->data);
        if (fsdp_data_packed(t->data))
            fprintf(t->out, "packed into %llu rows of --seq %d (attention and positions "
                    "restart at each example)", (unsigned long long)lay.n_rows, ec->seq);
        else
            fprintf(t->out, "one per row of --seq %d%s", ec->seq,
                    t->model.iface->state_positions ? "" : " (this model family cannot pack)");
        fprintf(t->out, ", loss on completion/assistant tokens only; %.1f%% of row tokens are "
                "padding", slots > 0 ? 100.0 * (1.0 - (double)lay.n_real / slots) : 0.0);
        int lo, hi;
        double pad;
        if (!fsdp_data_packed(t->data) && t->run.steps > 0) {
            step_rows(t, ec, lay.n_rows, &lo, &hi, &pad);
            fprintf(t->out, " at --seq %d, %.1f%% at each step's longest example (%d to %d "
                    "tokens)", ec->seq, 100.0 * pad, lo, hi);
        }
        if (cut)
            fprintf(t->out, "; %llu are cut at %d tokens", (unsigned long long)cut, ec->seq + 1);
    } else {
        fprintf(t->out, "data: %llu rows of --seq %d from '%s'", (unsigned long long)lay.n_rows,
                ec->seq, cfg->data);
    }
    fprintf(t->out, "; %d steps x %llu rows = %.2f epochs\n", t->run.steps,
            (unsigned long long)per_step, epochs);
    return FSDP_STATUS_OK;
}

uint64_t fsdp_trainer_step_tokens(const struct trainer *t, int step)
{
    const fsdp_engine_config *ec = &t->sh.cfg;
    uint64_t M = (uint64_t)ec->n_ranks * (uint64_t)ec->grad_accum;
    if (!t->data)
        return M * (uint64_t)ec->batch * (uint64_t)ec->seq;
    uint64_t n = 0;
    for (uint64_t k = 0; k < M; k++)
        n += fsdp_data_batch_real(t->data, (uint64_t)step * M + k, ec->batch, ec->seq);
    return n;
}

int fsdp_trainer_step_len(const struct trainer *t, int step)
{
    const fsdp_engine_config *ec = &t->sh.cfg;
    if (!t->data || !fsdp_data_masked(t->data) || t->cfg->pad_full)
        return ec->seq;
    int M = ec->n_ranks * ec->grad_accum;
    return fsdp_data_rows_len(t->data, (uint64_t)step * (uint64_t)M, M, ec->batch, ec->seq);
}
