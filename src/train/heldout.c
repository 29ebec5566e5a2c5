/*
 * heldout.c - the held-out loss during training (contract in heldout.h).
 *
 * Every rank runs the same number of forwards (a rank with no batch left
 * in the last round repeats one and drops its result, as `fsdp eval`
 * does), then the ranks exchange their (loss, targets) records once, so
 * each rank sums the same values in the same order and takes the same
 * decisions from the result (the best checkpoint, early stopping).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "train/heldout.h"

/* What kind of data a source is, as the user names it: a held-out set must
 * be the same kind as the training data. */
static const char *data_kind(const fsdp_data *d, const char *spec)
{
    size_t n = strlen(spec);
    if (fsdp_data_masked(d))
        return "example rows (.jsonl prompt/completion or messages)";
    if (!strcmp(spec, "synthetic"))
        return "the synthetic task";
    if (n >= 6 && !strcmp(spec + n - 6, ".jsonl"))
        return ".jsonl text rows";
    if (n >= 4 && !strcmp(spec + n - 4, ".txt"))
        return "text (.txt)";
    return "token shards";
}

int fsdp_heldout_batches(const fsdp_data *d, int B, int T)
{
    fsdp_data_layout lay;
    fsdp_data_layout_get(d, T, &lay);
    uint64_t n = fsdp_data_masked(d) ? (lay.n_rows + (uint64_t)B - 1) / (uint64_t)B
                                     : fsdp_data_n_tokens(d) / ((uint64_t)B * (uint64_t)T);
    if (n < 1)
        n = 1;
    return n > FSDP_HELDOUT_MAX_DEFAULT ? FSDP_HELDOUT_MAX_DEFAULT : (int)n;
}

static fsdp_status heldout_check(const fsdp_heldout *h, const fsdp_data *train,
                                 const char *train_spec, int T, int vocab_size)
{
    const char *want = data_kind(train, train_spec), *got = data_kind(h->data, h->spec);
    if (!strcmp(h->spec, "synthetic") || strcmp(want, got))
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "--eval-data '%s' is %s but --data '%s' is %s: the held-out set "
                              "must be data of the same kind, read the same way (the synthetic "
                              "task has its own --eval)", h->spec, got, train_spec, want);
    int dv = fsdp_data_vocab(h->data);
    if (dv > vocab_size)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "--eval-data '%s' uses token ids up to %d but the model has a "
                              "vocabulary of %d", h->spec, dv - 1, vocab_size);
    uint64_t cut, none, n = fsdp_data_n_examples(h->data);
    fsdp_data_truncated(h->data, T, &cut, &none);
    if (n && none == n)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "none of the %llu examples in --eval-data '%s' has a completion "
                              "or assistant token within --seq %d: there is nothing to "
                              "evaluate; raise --seq or shorten the prompts",
                              (unsigned long long)n, h->spec, T);
    return FSDP_STATUS_OK;
}

fsdp_status fsdp_heldout_open(fsdp_heldout *h, const fsdp_data_opts *opts, const fsdp_data *train,
                              const char *train_spec, int B, int T, int eval_steps,
                              int vocab_size)
{
    memset(h, 0, sizeof *h);
    h->spec = opts->spec;
    fsdp_status st = fsdp_data_open_opts(&h->data, opts);
    if (st != FSDP_STATUS_OK) {
        fsdp_error_prefix("--eval-data");
        h->data = NULL;
        return st;
    }
    st = heldout_check(h, train, train_spec, T, vocab_size);
    if (st == FSDP_STATUS_OK && fsdp_data_packed(train)) { /* as the training rows are */
        st = fsdp_data_pack(h->data, T);
        if (st != FSDP_STATUS_OK)
            fsdp_error_prefix("--eval-data '%s'", h->spec);
    }
    if (st != FSDP_STATUS_OK) {
        fsdp_heldout_close(h);
        return st;
    }
    fsdp_data_set_one_pass(h->data); /* each example counts once */
    h->n_batches = eval_steps > 0 ? eval_steps : fsdp_heldout_batches(h->data, B, T);
    h->rows = (uint64_t)B * (uint64_t)T;
    return FSDP_STATUS_OK;
}

/* One micro-batch's result, as the ranks exchange it. */
struct batch_loss {
    float loss;               /* the model's sum over B*T (fsdp_engine_forward_data) */
    uint32_t pad;
    uint64_t n_targets;
};

fsdp_status fsdp_heldout_run(const fsdp_heldout *h, fsdp_engine *e, int n_ranks, int rank,
                             float *loss)
{
    int S = h->n_batches, N = n_ranks, K = (S + N - 1) / N; /* rounds */
    struct batch_loss *mine = calloc((size_t)K, sizeof *mine);
    struct batch_loss *all = calloc((size_t)K * (size_t)N, sizeof *all);
    float *losses = malloc((size_t)S * sizeof *losses);
    fsdp_status st = FSDP_STATUS_OK;
    if (!mine || !all || !losses) {
        st = fsdp_error_set(FSDP_STATUS_OOM, "out of host memory for the held-out loss");
        goto done;
    }
    for (int k = 0; k < K && st == FSDP_STATUS_OK; k++) {
        int m = k * N + rank;
        st = fsdp_engine_forward_data(e, h->data, (uint64_t)(m < S ? m : m % S), &mine[k].loss,
                                      &mine[k].n_targets);
    }
    if (st != FSDP_STATUS_OK)
        goto done;
    if ((st = fsdp_engine_exchange(e, mine, (size_t)K * sizeof *mine, all)) != FSDP_STATUS_OK)
        goto done;
    uint64_t total = 0;
    for (int m = 0; m < S; m++) { /* batch m: rank m % N's record of round m / N */
        const struct batch_loss *b = &all[(size_t)(m % N) * (size_t)K + (size_t)(m / N)];
        losses[m] = b->loss;
        total += b->n_targets;
    }
    if (total == 0) {
        st = fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                            "--eval-data '%s': no row of its %d micro-batches holds a "
                            "completion or assistant token; raise --seq or --eval-steps",
                            h->spec, S);
        goto done;
    }
    *loss = fsdp_engine_mean_loss(losses, S, h->rows, total);
done:
    free(losses);
    free(all);
    free(mine);
    return st;
}

void fsdp_heldout_close(fsdp_heldout *h)
{
    if (h->data)
        fsdp_data_close(h->data);
    memset(h, 0, sizeof *h);
}
