/*
 * data.c - opening a data source and cutting micro-batches from it.
 *
 * Every source is a token sequence: the concatenated files (shards sorted by
 * path, or a text file's bytes) or the synthetic task's endless stream of
 * problems. Micro-batch m has B rows; row r holds the T+1 consecutive tokens
 * starting at position (m*B + r)*T:
 *
 *     inputs[r*T + j]  = token[(m*B + r)*T + j]        j = 0..T-1
 *     targets[r*T + j] = token[(m*B + r)*T + j + 1]
 *
 * so consecutive rows and micro-batches tile the sequence in order (the
 * last target of a row is the first input of the next), as llm.c's loader
 * does. File positions are taken modulo the token count (the data wraps
 * around; later epochs are shifted by N mod T, so they see other windows).
 * A batch depends only on (source, seed, m, B, T), never on which rank or
 * thread asks or in what order, so the global batch is the same for any
 * number of devices. The seed selects the synthetic problems; files are read
 * in order whatever the seed, so eval sees the same tokens every time.
 * Example sources (.jsonl prompt/completion or messages rows) are cut one
 * example per row, or packed several to a row, instead: examples.c.
 */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "data/data_internal.h"
#include "data/hftok.h"

static bool ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

fsdp_status fsdp_data_open(fsdp_data **out, const char *spec, int vocab_size, uint64_t seed)
{
    fsdp_data_opts o = {.spec = spec, .vocab_size = vocab_size, .seed = seed};
    return fsdp_data_open_opts(out, &o);
}

/* Token shards; with a tokenizer, their tokens must be in its vocabulary. */
static fsdp_status shards_open(fsdp_data *d, const fsdp_data_opts *o)
{
    int vocab = o->vocab_size;
    if (o->tokenizer) {
        fsdp_hftok *t = NULL;
        FSDP_TRY(fsdp_hftok_open(&t, o->tokenizer));
        int tv = fsdp_hftok_vocab(t);
        fsdp_hftok_free(t);
        if (vocab <= 0 || tv < vocab)
            vocab = tv;
    }
    return fsdp_data_files_open(d, o->spec, vocab);
}

fsdp_status fsdp_data_open_opts(fsdp_data **out, const fsdp_data_opts *o)
{
    const char *spec = o->spec;
    int vocab_size = o->vocab_size;
    if (!out || !spec || !*spec)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "no data given: pass --data synthetic, a .txt file or llm.c token "
                              "shards ('data/train_*.bin')");
    *out = NULL;
    if (vocab_size < 0)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "vocabulary size %d is negative",
                              vocab_size);
    fsdp_data *d = calloc(1, sizeof *d);
    if (!d)
        return fsdp_error_set(FSDP_STATUS_OOM, "out of memory opening data '%s'", spec);
    d->seed = o->seed;
    if (strcmp(spec, "synthetic") == 0 && o->tokenizer) {
        free(d);
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "the synthetic task is byte-level text; --tokenizer does not apply "
                              "to it");
    }
    if (strcmp(spec, "synthetic") == 0) {
        d->kind = FSDP_DATA_SYNTH;
        d->vocab = 256;
        int need = fsdp_synth_max_byte() + 1;
        if (vocab_size > 0 && vocab_size < need) {
            free(d);
            return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                                  "the synthetic task is byte-level text and needs a vocabulary "
                                  "of at least %d (256 recommended), not %d",
                                  need, vocab_size);
        }
        *out = d;
        return FSDP_STATUS_OK;
    }
    fsdp_status st;
    bool jsonl = ends_with(spec, ".jsonl");
    if (jsonl && !o->tokenizer)
        st = fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                            "'%s' is a .jsonl file: pass --tokenizer tokenizer.json to tokenize "
                            "its rows", spec);
    else if (jsonl || (o->tokenizer && ends_with(spec, ".txt")))
        st = fsdp_data_corpus_open(d, o);
    else if (ends_with(spec, ".txt")) {
        d->kind = FSDP_DATA_TEXT;
        st = fsdp_data_files_open(d, spec, vocab_size);
    } else {
        d->kind = FSDP_DATA_SHARDS;
        st = shards_open(d, o);
    }
    return FSDP_OUT_OR_FREE(st, out, d, fsdp_data_close);
}

void fsdp_data_close(fsdp_data *d)
{
    if (!d)
        return;
    fsdp_data_files_close(d);
    fsdp_data_examples_free(&d->ex);
    free(d);
}

int fsdp_data_vocab(const fsdp_data *d) { return d->vocab; }

uint64_t fsdp_data_n_tokens(const fsdp_data *d) { return d->n_tokens; }

bool fsdp_data_masked(const fsdp_data *d) { return d->kind == FSDP_DATA_EXAMPLES; }

uint64_t fsdp_data_n_examples(const fsdp_data *d) { return d->ex.n; }

int fsdp_data_packed(const fsdp_data *d) { return d->ex.pack_T; }

void fsdp_data_layout_get(const fsdp_data *d, int T, fsdp_data_layout *out)
{
    if (d->kind == FSDP_DATA_EXAMPLES) {
        fsdp_data_examples_layout(d, T, &out->n_rows, &out->n_real);
        return;
    }
    out->n_rows = T > 0 ? d->n_tokens / (uint64_t)T : 0;
    out->n_real = out->n_rows * (uint64_t)(T > 0 ? T : 0);
}

uint64_t fsdp_data_batch_real(const fsdp_data *d, uint64_t index, int B, int T)
{
    if (d->kind == FSDP_DATA_EXAMPLES)
        return fsdp_data_examples_real(d, index, B, T);
    return (uint64_t)B * (uint64_t)T;
}

int fsdp_data_rows_len(const fsdp_data *d, uint64_t first, int n, int B, int T)
{
    if (d->kind == FSDP_DATA_EXAMPLES)
        return fsdp_data_examples_len(d, first, n, B, T);
    return T;
}

/* (a*b + c) mod n without overflow. */
static uint64_t mul_add_mod(uint64_t a, uint64_t b, uint64_t c, uint64_t n)
{
    return (uint64_t)(((unsigned __int128)(a % n) * (b % n) + c % n) % n);
}

/* n tokens of the source from position pos (files: taken modulo the count). */
static fsdp_status read_tokens(const fsdp_data *d, uint64_t pos, size_t n, int *dst)
{
    if (d->kind != FSDP_DATA_SYNTH)
        return fsdp_data_files_read(d, pos % d->n_tokens, n, dst);
    fsdp_synth_stream_read(d->seed, pos, n, dst);
    return FSDP_STATUS_OK;
}

fsdp_status fsdp_data_check(const fsdp_data *d) { return fsdp_data_files_check(d); }

fsdp_status fsdp_data_batch(const fsdp_data *d, uint64_t index, int B, int T, int *inputs,
                            int *targets)
{
    return fsdp_data_batch_pos(d, index, B, T, inputs, targets, NULL);
}

fsdp_status fsdp_data_batch_pos(const fsdp_data *d, uint64_t index, int B, int T, int *inputs,
                                int *targets, int *pos)
{
    if (!d || !inputs || !targets)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "fsdp_data_batch: NULL data or buffer");
    if (B <= 0 || T <= 0)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "batch shape B=%d T=%d: both must be positive", B, T);
    if (d->ex.pack_T && d->ex.pack_T != T)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "the examples were packed into rows of "
                              "%d tokens, not %d", d->ex.pack_T, T);
    if (d->kind == FSDP_DATA_EXAMPLES) {
        fsdp_data_examples_batch(d, index, B, T, inputs, targets, pos);
        return FSDP_STATUS_OK;
    }
    for (size_t i = 0; pos && i < (size_t)B * (size_t)T; i++)
        pos[i] = (int)(i % (size_t)T);
    uint64_t BT = (uint64_t)B * (uint64_t)T;
    for (int r = 0; r < B; r++) {
        uint64_t start;
        if (d->kind == FSDP_DATA_SYNTH) /* unbounded stream: wraps modulo 2^64 */
            start = index * BT + (uint64_t)r * (uint64_t)T;
        else
            start = mul_add_mod(index, BT, (uint64_t)r * (uint64_t)T, d->n_tokens);
        int *in = inputs + (size_t)r * T, *tg = targets + (size_t)r * T;
        FSDP_TRY(read_tokens(d, start, (size_t)T, in));
        memcpy(tg, in + 1, (size_t)(T - 1) * sizeof *tg);
        FSDP_TRY(read_tokens(d, start + (uint64_t)T, 1, tg + T - 1));
    }
    return FSDP_STATUS_OK;
}
