/*
 * synth_eval.c - held-out accuracy on the synthetic task by greedy
 * decoding (contract in synth_eval.h).
 *
 * Each batch: every row gets a newline and a problem's prompt, then the
 * batch is decoded greedily for as many tokens as its longest answer
 * (one forward per token, logits read at each row's last position), and
 * each row is scored against its answer up to the first newline. The rows
 * are one problem's block long (FSDP_SYNTH_ROW, or the run's --seq when
 * shorter), whatever the run's --seq: a causal model's logits there do not
 * depend on the positions after them, and a forward of a long --seq would
 * cost its whole length for 14 tokens. Every batch and every rank runs at
 * that one length, so the decoded tokens do not depend on the job's size.
 * A long evaluation says how far it is every FSDP_PROGRESS_S seconds.
 */
#include <stdlib.h>
#include <string.h>

#include "core/clock.h"
#include "data/data.h"
#include "train/synth_eval.h"

#define TEXT_MAX 72 /* a problem's prompt or answer, NUL included */

/* One batch of rows being decoded. */
struct batch {
    int B, T, V, Vp;
    int *tok;                 /* (B, T) the rows' tokens */
    int *len;                 /* (B,) tokens in each row so far */
    int *start;               /* (B,) where each row's answer starts */
    int *pos;                 /* (B,) the position whose logits are read */
    float *logits;            /* (B, Vp) */
    char (*answers)[TEXT_MAX]; /* (B,) the expected answers */
};

static void batch_free(struct batch *b)
{
    free(b->tok);
    free(b->len);
    free(b->start);
    free(b->pos);
    free(b->logits);
    free(b->answers);
}

static fsdp_status batch_alloc(struct batch *b, int B, int T, const fsdp_model *m)
{
    *b = (struct batch){.B = B, .T = T, .V = m->vocab_size, .Vp = m->padded_vocab_size};
    b->tok = calloc((size_t)B * T, sizeof(int));
    b->len = calloc((size_t)B, sizeof(int));
    b->pos = calloc((size_t)B, sizeof(int));
    b->start = calloc((size_t)B, sizeof(int));
    b->logits = malloc((size_t)B * b->Vp * sizeof(float));
    b->answers = calloc((size_t)B, sizeof *b->answers);
    if (b->tok && b->len && b->pos && b->start && b->logits && b->answers)
        return FSDP_STATUS_OK;
    batch_free(b);
    return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory for evaluation");
}

/* Row b of batch k on this rank: problem (k * N + rank) * B + b. */
static int64_t problem_index(const struct batch *bt, int N, int rank, int64_t k, int b)
{
    return (k * N + rank) * bt->B + b;
}

/* Fill every row with a newline (a problem follows one in the training
 * stream) and its prompt. Returns the longest answer's length (>= 1). */
static int batch_prompts(struct batch *bt, uint64_t seed, int N, int rank, int64_t k)
{
    int T = bt->T, max_ans = 1;
    memset(bt->tok, 0, (size_t)bt->B * T * sizeof(int));
    for (int b = 0; b < bt->B; b++) {
        char prompt[TEXT_MAX];
        fsdp_synth_problem(seed, (uint64_t)problem_index(bt, N, rank, k, b), prompt,
                           bt->answers[b]);
        int n = 0;
        bt->tok[(size_t)b * T + n++] = '\n';
        for (const char *c = prompt; *c && n < T; c++)
            bt->tok[(size_t)b * T + n++] = (unsigned char)*c;
        bt->start[b] = bt->len[b] = n;
        int al = (int)strlen(bt->answers[b]);
        if (al > max_ans)
            max_ans = al;
    }
    return max_ans;
}

/* n_tokens greedy steps on every row that has room left. Collective. */
static fsdp_status batch_decode(fsdp_engine *e, struct batch *bt, int n_tokens)
{
    int T = bt->T;
    for (int s = 0; s < n_tokens; s++) {
        for (int b = 0; b < bt->B; b++)
            bt->pos[b] = bt->len[b] - 1 < T - 1 ? bt->len[b] - 1 : T - 1;
        FSDP_TRY(fsdp_engine_forward(e, bt->tok, bt->B, T, bt->pos, bt->logits, NULL));
        for (int b = 0; b < bt->B; b++) {
            if (bt->len[b] >= T)
                continue;
            const float *lg = bt->logits + (size_t)b * bt->Vp;
            int best = 0;
            for (int v = 1; v < bt->V; v++)
                if (lg[v] > lg[best])
                    best = v;
            bt->tok[(size_t)b * T + bt->len[b]++] = best;
        }
    }
    return FSDP_STATUS_OK;
}

/* Row b's decoded text (up to and including its first newline, printable
 * characters, '?' for others) into got; whether it starts with the
 * answer. */
static bool row_score(const struct batch *bt, int b, char got[TEXT_MAX])
{
    const char *ans = bt->answers[b];
    int al = (int)strlen(ans), start = bt->start[b];
    bool ok = bt->len[b] - start >= al;
    int g = 0;
    for (int i = start; i < bt->len[b] && g < TEXT_MAX - 1; i++) {
        int c = bt->tok[(size_t)b * bt->T + i];
        got[g++] = c >= 32 && c < 127 ? (char)c : (c == '\n' ? '\n' : '?');
        if (i - start < al && c != (unsigned char)ans[i - start])
            ok = false;
        if (c == '\n')
            break;
    }
    got[g] = '\0';
    return ok;
}

/* Score this rank's rows of batch k into counts (correct, seen); rank 0
 * prints samples while *printed < ev->n_samples, each saying that answers
 * are written reversed (866+619=5841 is right: 1485 reversed). */
static void batch_score(const struct batch *bt, const fsdp_engine_config *ec, int rank, int64_t k,
                        fsdp_synth_eval *ev, int *printed, int counts[2])
{
    for (int b = 0; b < bt->B; b++) {
        int64_t idx = problem_index(bt, ec->n_ranks, rank, k, b);
        if (idx >= ev->n_problems)
            continue;
        char got[TEXT_MAX];
        bool ok = row_score(bt, b, got);
        counts[0] += ok;
        counts[1]++;
        if (rank == 0 && ev->out && *printed < ev->n_samples) {
            char prompt[TEXT_MAX], ans[TEXT_MAX];
            fsdp_synth_problem(ec->seed, (uint64_t)idx, prompt, ans);
            got[strcspn(got, "\n")] = '\0';
            ans[strcspn(ans, "\n")] = '\0';
            char plain[TEXT_MAX];
            size_t al = strlen(ans);
            for (size_t i = 0; i < al; i++)
                plain[i] = ans[al - 1 - i];
            plain[al] = '\0';
            fprintf(ev->out, "  sample: %s%-8s expected %s (%s reversed) %s\n", prompt, got,
                    ans, plain, ok ? "ok" : "WRONG");
            (*printed)++;
        }
    }
}

/* The job's totals of every rank's counts, on rank 0. Collective. */
static fsdp_status job_totals(fsdp_engine *e, int rank, int N, const int counts[2],
                              fsdp_synth_eval *ev)
{
    int *all = calloc((size_t)N * 2, sizeof *all);
    if (!all)
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory for evaluation");
    fsdp_status st = fsdp_engine_exchange(e, counts, 2 * sizeof(int), all);
    if (st == FSDP_STATUS_OK && rank == 0)
        for (int r = 0; r < N; r++) {
            ev->correct += all[2 * r];
            ev->seen += all[2 * r + 1];
        }
    free(all);
    return st;
}

fsdp_status fsdp_synth_eval_run(fsdp_engine *e, int rank, const fsdp_engine_config *ec,
                                const fsdp_model *m, fsdp_synth_eval *ev)
{
    int N = ec->n_ranks;
    int64_t per_batch = (int64_t)N * ec->batch;
    int64_t n_batches = (ev->n_problems + per_batch - 1) / per_batch;
    struct batch bt;
    FSDP_TRY(batch_alloc(&bt, ec->batch, ec->seq < FSDP_SYNTH_ROW ? ec->seq : FSDP_SYNTH_ROW, m));
    fsdp_status st = FSDP_STATUS_OK;
    int printed = 0, counts[2] = {0, 0}; /* this rank's correct, seen */
    fsdp_progress pg = fsdp_progress_start();
    double elapsed;
    for (int64_t k = 0; k < n_batches; k++) {
        if (rank == 0 && ev->out && fsdp_progress_due(&pg, FSDP_PROGRESS_S, &elapsed)) {
            fprintf(ev->out, "  eval: %lld/%lld batches of %d held-out problems, %.0f s\n",
                    (long long)k, (long long)n_batches, ev->n_problems, elapsed);
            fflush(ev->out);
        }
        unsigned stop = 0; /* a stop request ends the evaluation too */
        FSDP_CHECK(fsdp_engine_or(e, ev->stop ? fsdp_train_stop_word(atomic_load(ev->stop)) : 0,
                                  &stop));
        if (stop) {
            ev->stop_word = stop;
            break;
        }
        int max_ans = batch_prompts(&bt, ec->seed, N, rank, k);
        FSDP_CHECK(batch_decode(e, &bt, max_ans));
        batch_score(&bt, ec, rank, k, ev, &printed, counts);
    }
    /* the job's totals, in every process (every rank left the loop at the
     * same batch: the stop decision is the job's) */
    st = job_totals(e, rank, N, counts, ev);
fail:
    batch_free(&bt);
    return st;
}
