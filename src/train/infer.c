/*
 * infer.c - `fsdp eval` and `fsdp sample` on a sharded engine (infer.h).
 *
 * Both build the same engine as training (FULL_SHARD, forward only), with
 * the engine's init hook reading each rank's shard from the model file.
 * Every engine call is collective, so all ranks run the same number of
 * forwards in lockstep:
 * - eval deals micro-batch m to rank m % N, like the trainer; a rank with
 *   no batch left in the last round repeats one and drops the result.
 *   Rank threads write their losses into disjoint slots; the main thread
 *   sums them after the join, in the trainer's tree order.
 * - sample runs the same single sequence on every rank (the gathers need
 *   everyone); rank 0 picks each token from its logits and publishes it in
 *   the shared context before a world barrier, after which all ranks read
 *   it. Sampling uses the counter-based RNG keyed by (seed, token index),
 *   so the output does not depend on the number of ranks.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/modelfile.h"
#include "core/clock.h"
#include "core/log.h"
#include "core/rng.h"
#include "core/world.h"
#include "device/cpu.h"
#include "train/adapt.h"
#include "train/heldout.h"
#include "train/infer.h"
#include "train/train.h"

#define SAMPLE_RNG_STREAM 0x73616d706c65ull /* "sample" */

void fsdp_infer_config_default(fsdp_infer_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->backend = fsdp_backend_default();
    cfg->n_ranks = 1;
    cfg->compute_dtype = FSDP_DTYPE_F32;
    cfg->batch = 8;
    cfg->seq = 0; /* by the model: see infer.h */
}

struct infer {
    const fsdp_infer_config *cfg;
    fsdp_modelfile *mf;
    fsdp_model model;
    bool model_ready;
    fsdp_adapt adapt;          /* --adapter on the model (adapt.h) */
    fsdp_data *data;
    fsdp_world *w;
    fsdp_engine_shared sh;
    bool sh_ready;
    /* eval */
    int n_batches;
    float *losses;             /* [n_batches], slot m written by rank m % N */
    uint64_t *counts;          /* [n_batches]: unmasked targets of batch m */
    /* sample */
    const fsdp_sample_config *sc;
    int *ctx;                  /* prompt then generated tokens; appended by rank 0 */
    int *out;
    int n_out;                 /* tokens generated (every rank counts the same) */
};

static void infer_free(struct infer *r)
{
    if (r->sh_ready)
        fsdp_engine_shared_free(&r->sh);
    fsdp_world_free(r->w);
    if (r->data)
        fsdp_data_close(r->data);
    fsdp_modelfile_close(r->mf); /* bound to the model: closed first */
    fsdp_adapt_free(&r->adapt);
    if (r->model_ready)
        fsdp_model_free(&r->model);
}

/* Open the model file and build the model it holds, bound to the file. */
static fsdp_status infer_open(struct infer *r)
{
    const fsdp_infer_config *cfg = r->cfg;
    FSDP_TRY(fsdp_backend_check(cfg->backend, cfg->n_ranks, 1));
    if (cfg->backend == FSDP_BACKEND_META)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "the meta backend computes nothing; evaluate or sample on cpu or "
                              "cuda");
    FSDP_TRY(fsdp_modelfile_resolve(cfg->model_path, &r->model, &r->mf));
    r->model_ready = true;
    if (!r->mf) {
        char files[256];
        fsdp_modelfile_help(files, sizeof files);
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "--model '%s' names a model shape, not "
                              "trained weights; give a model file: %s", cfg->model_path, files);
    }
    FSDP_TRY(fsdp_adapt_apply(&r->adapt, &r->model, r->mf, NULL, NULL, cfg->adapter, 0));
    if (cfg->quantize && !r->adapt.active)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "--quantize %s stores the frozen base "
                              "under --adapter DIR in NF4; give the adapter (a QLoRA checkpoint "
                              "as --model records its own)",
                              fsdp_names_name(&fsdp_quant_names, cfg->quantize));
    return cfg->quantize ? fsdp_adapt_quantize(&r->adapt, &r->model, (fsdp_quant)cfg->quantize)
                         : FSDP_STATUS_OK;
}

/* --seq 0 on data: example rows' fsdp_train_seq_examples below the smaller of the context
 * and FSDP_TRAIN_SEQ_CAP, as training's default; else 64 or the context if shorter. */
static int infer_seq_default(struct infer *r)
{
    int ctx = r->model.max_seq_len, T = ctx < 64 ? ctx : 64;
    if (!r->data || !fsdp_data_masked(r->data))
        return T;
    T = fsdp_train_seq_examples(r->data, ctx < FSDP_TRAIN_SEQ_CAP ? ctx : FSDP_TRAIN_SEQ_CAP);
    if (r->cfg->note)
        fprintf(r->cfg->note, "seq: %d (default: the longest example, %llu tokens, rounded up to "
                "a multiple of %d, at most the model's context, %d; --seq to choose)\n", T,
                (unsigned long long)fsdp_data_longest(r->data), FSDP_TRAIN_SEQ_ROUND, ctx);
    return T;
}

/* The engine's shared part for micro-batches of (B, T) (T = 0: infer_seq_default) over
 * the opened model; data may be NULL. */
static fsdp_status infer_setup(struct infer *r, const char *data, uint64_t seed, int B, int T)
{
    const fsdp_infer_config *cfg = r->cfg;
    const fsdp_model *m = &r->model;
    if (T > m->max_seq_len)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "--seq %d is longer than the model's context of %d (%s)", T,
                              m->max_seq_len, cfg->model_path);
    bool packed = false;
    if (data) {
        fsdp_data_opts dopt = {.spec = data, .seed = seed, .tokenizer = cfg->tokenizer,
                               .chat_format = cfg->chat_format};
        FSDP_TRY(fsdp_data_open_opts(&r->data, &dopt));
        if (cfg->note && fsdp_data_chat(r->data)[0])
            fprintf(cfg->note, "chat: %s\n", fsdp_data_chat(r->data));
        int dv = fsdp_data_vocab(r->data);
        if (dv > m->vocab_size)
            return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                                  "the data '%s' uses token ids up to %d but the model in '%s' "
                                  "has a vocabulary of %d", data, dv - 1, cfg->model_path,
                                  m->vocab_size);
        /* example rows are read once, as the held-out set is (heldout.c): the last batch's
         * rows past the file are padding, not the first examples again, so every example
         * counts once in the mean when --steps x --batch covers the file */
        fsdp_data_set_one_pass(r->data);
        if (T == 0)
            T = infer_seq_default(r);
        FSDP_TRY(fsdp_train_pack_rows(m, cfg->model_path, r->data, cfg->pack, T, &packed));
    } else if (T == 0) {
        T = infer_seq_default(r);
    }
    fsdp_engine_config ec = {
        .backend = cfg->backend,
        .comm = FSDP_COMM_AUTO,
        .n_ranks = cfg->n_ranks,
        .ranks_per_device = 1,
        .shard = FSDP_SHARD_FULL,
        .compute_dtype = cfg->compute_dtype,
        .prefetch = true,
        .inference = true,     /* parameters and activations only */
        .deterministic = true,
        .device_mem = cfg->device_mem,
        .batch = B,
        .seq = T,
        .positions = packed,   /* packed rows restart attention and positions per example */
        .grad_accum = 1,
        .seed = seed,
        .cpu_streams = cfg->cpu_streams,
    };
    fsdp_device_cpu_set_streams((fsdp_cpu_streams)ec.cpu_streams, 0); /* read as devices start */
    FSDP_TRY(fsdp_world_init(&r->w, cfg->n_ranks));
    FSDP_TRY(fsdp_engine_shared_init(&r->sh, &ec, &r->model, r->data, r->w));
    r->sh_ready = true;
    r->sh.init_fn = r->adapt.active ? fsdp_adapt_init_fn : fsdp_modelfile_init_fn;
    r->sh.init_nf4_fn = r->adapt.active ? fsdp_adapt_init_nf4_fn : NULL;
    r->sh.init_arg = r->adapt.active ? (void *)&r->adapt : (void *)r->mf;
    FSDP_INFO(FSDP_SUB_TRAIN, "loaded %s '%s' (%s, model %s) on %d rank(s)",
              fsdp_modelfile_format_name(fsdp_modelfile_format_get(r->mf)),
              fsdp_modelfile_path(r->mf), fsdp_modelfile_dtype_name(r->mf), r->model.name,
              cfg->n_ranks);
    return FSDP_STATUS_OK;
}

/* After a rank's last forward: its device memory figures, if asked for. */
static void publish_mem(struct infer *r, fsdp_engine *e, int rank)
{
    if (r->cfg->mem_out && e)
        r->cfg->mem_out[rank] = fsdp_engine_device(e)->mem;
}

/* ---- eval -------------------------------------------------------------------- */

static fsdp_status eval_rank(fsdp_world *w, int rank, void *arg)
{
    struct infer *r = arg;
    int N = r->cfg->n_ranks, S = r->n_batches;
    fsdp_engine *e = NULL;
    fsdp_status st;
    FSDP_CHECK(fsdp_engine_init(&e, &r->sh, rank));
    fsdp_progress pg = fsdp_progress_start();
    double elapsed;
    for (int k = 0; k * N < S; k++) {
        int m = k * N + rank;
        if (rank == 0 && r->cfg->note && fsdp_progress_due(&pg, FSDP_PROGRESS_S, &elapsed)) {
            fprintf(r->cfg->note, "eval: %d/%d batches, %.0f s\n", k * N, S, elapsed);
            fflush(r->cfg->note);
        }
        float loss = 0.0f;
        uint64_t count = 0;
        FSDP_CHECK(fsdp_engine_forward_batch(e, (uint64_t)(m < S ? m : m % S), &loss, &count));
        if (m < S) {
            r->losses[m] = loss;
            r->counts[m] = count;
        }
    }
    publish_mem(r, e, rank);
    st = FSDP_STATUS_OK;
fail:
    fsdp_engine_free(e);
    return st;
}

fsdp_status fsdp_infer_eval(const fsdp_infer_config *cfg, const char *data, uint64_t seed,
                            int n_batches, fsdp_infer_eval_result *out)
{
    memset(out, 0, sizeof *out);
    if (!cfg || !data || n_batches < 0 || cfg->batch < 1 || cfg->seq < 0)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "eval needs a model, data, --steps >= 1, --batch >= 1, --seq >= 1");
    struct infer r = {.cfg = cfg};
    fsdp_status st;
    FSDP_CHECK(infer_open(&r));
    FSDP_CHECK(infer_setup(&r, data, seed, cfg->batch, cfg->seq));
    int B = r.sh.cfg.batch, T = r.sh.cfg.seq, S = n_batches;
    bool examples = fsdp_data_masked(r.data);
    fsdp_data_layout lay;
    fsdp_data_layout_get(r.data, T, &lay);
    if (S == 0) /* the file once, as the held-out set's default (synthetic: endless) */
        S = examples || fsdp_data_n_tokens(r.data) ? fsdp_heldout_batches(r.data, B, T) : 10;
    uint64_t filled = examples ? (lay.n_rows + (uint64_t)B - 1) / (uint64_t)B : (uint64_t)S;
    r.n_batches = S;
    r.losses = calloc((size_t)S, sizeof *r.losses);
    r.counts = calloc((size_t)S, sizeof *r.counts);
    out->losses = malloc((size_t)S * sizeof *out->losses);
    if (!r.losses || !r.counts || !out->losses) {
        st = fsdp_error_set(FSDP_STATUS_OOM, "out of host memory for %d losses", S);
        goto fail;
    }
    FSDP_CHECK(fsdp_world_launch(r.w, eval_rank, &r));
    /* masked targets (example rows): means over the unmasked ones, as the trainer takes them */
    uint64_t rows = (uint64_t)B * (uint64_t)T, total = 0;
    for (int m = 0; m < S; m++)
        total += r.counts[m];
    if (total == 0) { /* a mean over nothing is not a loss of 0 */
        uint64_t cut, none;
        fsdp_data_truncated(r.data, T, &cut, &none);
        st = fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                            "nothing to evaluate: no row of the %d batches holds a completion or "
                            "assistant token within --seq %d (%llu of the %llu examples in '%s' "
                            "have none); raise --seq (the model takes up to %d)", S, T,
                            (unsigned long long)none,
                            (unsigned long long)fsdp_data_n_examples(r.data), data,
                            r.model.max_seq_len);
        goto fail;
    }
    out->mean = fsdp_engine_mean_loss(r.losses, S, rows, total);
    for (int m = 0; m < S; m++)
        out->losses[m] = r.counts[m] ? fsdp_engine_mean_loss(&r.losses[m], 1, rows, r.counts[m])
                                     : NAN;
    out->n_batches = S;
    out->n_data = filled < (uint64_t)S ? (int)filled : S;
    out->batch = B;
    out->seq = T;
    out->packed = fsdp_data_packed(r.data) > 0;
fail:
    if (st != FSDP_STATUS_OK) {
        free(out->losses);
        memset(out, 0, sizeof *out);
    }
    free(r.counts);
    free(r.losses);
    infer_free(&r);
    return st;
}

/* ---- sample ------------------------------------------------------------------ */

/* The next token from logits[0..V): argmax, or a draw from
 * softmax(logits / temperature) with uniform u. */
static int pick_token(const float *logits, int V, float temperature, float u)
{
    int best = 0;
    for (int v = 1; v < V; v++)
        if (logits[v] > logits[best])
            best = v;
    if (!(temperature > 0.0f))
        return best;
    double sum = 0.0, inv_t = 1.0 / (double)temperature, max = logits[best];
    for (int v = 0; v < V; v++)
        sum += exp(((double)logits[v] - max) * inv_t);
    double target = (double)u * sum, acc = 0.0;
    for (int v = 0; v < V; v++) {
        acc += exp(((double)logits[v] - max) * inv_t);
        if (acc >= target)
            return v;
    }
    return best; /* rounding left target just above the total */
}

static bool is_stop(const fsdp_sample_config *sc, int tok)
{
    for (int i = 0; i < sc->n_stop; i++)
        if (sc->stop[i] == tok)
            return true;
    return false;
}

/* A sampling forward's length: the tokens so far, rounded up to a multiple of this. */
#define SAMPLE_LEN_STEP 32

static fsdp_status sample_rank(fsdp_world *w, int rank, void *arg)
{
    struct infer *r = arg;
    const fsdp_sample_config *sc = r->sc;
    int T = r->sh.cfg.seq, V = r->model.vocab_size, Vp = r->model.padded_vocab_size;
    fsdp_engine *e = NULL;
    int *row = calloc((size_t)T, sizeof *row);
    float *logits = malloc((size_t)Vp * sizeof *logits);
    fsdp_status st;
    if (!row || !logits) {
        st = fsdp_error_set(FSDP_STATUS_OOM, "out of host memory for sampling");
        goto fail;
    }
    FSDP_CHECK(fsdp_engine_init(&e, &r->sh, rank));
    for (int k = 0; k < sc->n_tokens; k++) {
        int len = sc->n_prompt + k, start = len > T ? len - T : 0, n = len - start;
        memset(row, 0, (size_t)T * sizeof *row);
        memcpy(row, r->ctx + start, (size_t)n * sizeof *row);
        /* the forward runs at the text's length, rounded up to SAMPLE_LEN_STEP so that few
         * shapes come up, not the whole context (the logits at pos do not depend on what
         * follows it) */
        int pos = n - 1, Tf = (n + SAMPLE_LEN_STEP - 1) / SAMPLE_LEN_STEP * SAMPLE_LEN_STEP;
        FSDP_CHECK(fsdp_engine_forward(e, row, 1, Tf < T ? Tf : T, &pos, logits, NULL));
        for (int v = 0; rank == 0 && v < V; v++) /* argmax and softmax would pick anything */
            if (!isfinite(logits[v])) {
                st = fsdp_error_set(FSDP_STATUS_NONFINITE,
                                    "generating token %d: logit %d is %s; the model in '%s' "
                                    "holds NaN or infinite weights (or overflows): nothing can "
                                    "be sampled from it", k + 1, v,
                                    isnan(logits[v]) ? "NaN" : "infinite", r->cfg->model_path);
                goto fail;
            }
        if (rank == 0) {
            float u = fsdp_rng_uniform(sc->seed, SAMPLE_RNG_STREAM, (uint64_t)k);
            int tok = pick_token(logits, V, sc->temperature, u);
            r->ctx[len] = tok;
            r->out[k] = tok;
            r->n_out = k + 1;
            if (sc->logits)
                memcpy(sc->logits + (size_t)k * (size_t)V, logits, (size_t)V * sizeof *logits);
            if (sc->on_token)
                sc->on_token(sc->arg, tok);
        }
        FSDP_CHECK(fsdp_world_barrier(w)); /* the new token is visible to every rank */
        if (is_stop(sc, r->ctx[len]))
            break;                         /* every rank reads the same token */
    }
    publish_mem(r, e, rank);
    st = FSDP_STATUS_OK;
fail:
    fsdp_engine_free(e);
    free(row);
    free(logits);
    return st;
}

fsdp_status fsdp_infer_sample(const fsdp_infer_config *cfg, const fsdp_sample_config *sc,
                              int *out, int *n_out)
{
    if (n_out)
        *n_out = 0;
    if (!cfg || !sc || !out || !sc->prompt || sc->n_prompt < 1 || sc->n_tokens < 0 ||
        !(sc->temperature >= 0.0f))
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "sampling needs a prompt of at least one token, --tokens >= 0 and "
                              "--temperature >= 0");
    struct infer r = {.cfg = cfg, .sc = sc, .out = out};
    fsdp_status st;
    FSDP_CHECK(infer_open(&r));
    const int V = r.model.vocab_size, maxT = r.model.max_seq_len;
    for (int i = 0; i < sc->n_prompt; i++)
        if (sc->prompt[i] < 0 || sc->prompt[i] >= V) {
            st = fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                                "prompt token %d (at position %d) is outside the model's "
                                "vocabulary of %d", sc->prompt[i], i, V);
            goto fail;
        }
    if (cfg->seq > maxT) {
        st = fsdp_error_set(FSDP_STATUS_INVALID_ARG, "--seq %d is longer than the model's "
                            "context of %d (%s)", cfg->seq, maxT, cfg->model_path);
        goto fail;
    }
    /* the context: the model's, or --seq, never more than the text needs */
    int T = cfg->seq > 0 ? cfg->seq : maxT;
    int64_t need = (int64_t)sc->n_prompt + sc->n_tokens - 1;
    if (need < T)
        T = need > 0 ? (int)need : 1;
    if (sc->n_tokens == 0)
        goto fail; /* st is OK: nothing to generate */
    r.ctx = malloc(((size_t)sc->n_prompt + (size_t)sc->n_tokens) * sizeof *r.ctx);
    if (!r.ctx) {
        st = fsdp_error_set(FSDP_STATUS_OOM, "out of host memory for %d tokens",
                            sc->n_prompt + sc->n_tokens);
        goto fail;
    }
    memcpy(r.ctx, sc->prompt, (size_t)sc->n_prompt * sizeof *r.ctx);
    FSDP_CHECK(infer_setup(&r, NULL, sc->seed, 1, T));
    FSDP_CHECK(fsdp_world_launch(r.w, sample_rank, &r));
    if (n_out)
        *n_out = r.n_out;
fail:
    free(r.ctx);
    infer_free(&r);
    return st;
}
