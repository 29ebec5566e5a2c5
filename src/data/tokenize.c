/*
 * tokenize.c - a text or .jsonl corpus into llm.c token shards, once, so
 * training maps tokens instead of tokenizing (shard.h: fsdp_tokenize_file).
 *
 * The input is mapped and tokenized in one pass on the calling thread; ids
 * stream through the shard writer, so memory stays at the tokenizer, one
 * row and the writer's buffer however large the corpus. Shards are
 * committed (renamed into place) as they fill; if anything fails, the ones
 * this call committed are removed again, so a failed run leaves no partial
 * data set behind.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "data/jsonl.h"
#include "data/shard.h"

typedef struct job {
    const fsdp_tokenize_opts *o;
    fsdp_tokenize_result *res;
    fsdp_row_ctx ctx;
    int doc_start;
    int vocab;
    fsdp_shard_writer *w;
    char **paths;             /* committed shards, removed on failure */
    int n_paths;
    fsdp_ids row_ids;
    fsdp_flags row_flags;
    size_t base_done;         /* bytes of IN before the text being encoded */
} job;

static bool ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

static fsdp_status next_shard(job *j)
{
    const fsdp_tokenize_opts *o = j->o;
    char path[4096];
    if (!o->shard_tokens) {
        snprintf(path, sizeof path, "%s", o->out);
    } else {
        size_t n = strlen(o->out) - (ends_with(o->out, ".bin") ? 4 : 0);
        if (snprintf(path, sizeof path, "%.*s_%06d.bin", (int)n, o->out, j->res->n_shards) >=
            (int)sizeof path)
            return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "output path '%.64s...' is too long",
                                  o->out);
    }
    char **p = realloc(j->paths, (size_t)(j->n_paths + 1) * sizeof *p);
    if (!p || !(p[j->n_paths] = strdup(path))) {
        if (p)
            j->paths = p;
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory naming shards");
    }
    j->paths = p;
    fsdp_status st = fsdp_shard_writer_open(&j->w, path, j->vocab);
    if (st != FSDP_STATUS_OK) {
        free(p[j->n_paths]);
        return st;
    }
    j->n_paths++; /* counted once it exists: on failure it is removed */
    j->res->n_shards++;
    return FSDP_STATUS_OK;
}

static fsdp_status close_shard(job *j)
{
    fsdp_status st = fsdp_shard_writer_close(j->w, true);
    j->w = NULL;
    return st;
}

/* Write ids, starting new shards as they fill (one file: the writer
 * refuses to pass what its header can count, and says to split). */
static fsdp_status emit(job *j, const int *ids, size_t n)
{
    uint64_t cap = j->o->shard_tokens ? j->o->shard_tokens : UINT64_MAX;
    while (n > 0) {
        if (!j->w)
            FSDP_TRY(next_shard(j));
        uint64_t room = cap - fsdp_shard_writer_count(j->w);
        if (room == 0) {
            FSDP_TRY(close_shard(j));
            continue;
        }
        size_t k = n < room ? n : (size_t)room;
        FSDP_TRY(fsdp_shard_writer_add(j->w, ids, k));
        ids += k;
        n -= k;
        j->res->tokens += k;
    }
    return FSDP_STATUS_OK;
}

static void report(job *j, size_t done)
{
    if (j->o->progress)
        j->o->progress(j->o->arg, done, j->res->bytes, j->res->tokens);
}

static fsdp_status text_sink(void *arg, const int *ids, size_t n, size_t done)
{
    job *j = arg;
    FSDP_TRY(emit(j, ids, n));
    report(j, j->base_done + done);
    return FSDP_STATUS_OK;
}

static fsdp_status row(void *arg, const char *line, size_t len, uint64_t line_no, size_t done)
{
    job *j = arg;
    fsdp_row_kind kind;
    j->row_ids.n = j->row_flags.n = 0;
    FSDP_TRY(fsdp_row_render(&j->ctx, line, len, line_no, &kind, &j->row_ids, &j->row_flags));
    /* documents get the separator a stream has (data.h); examples are written as training
     * renders them (corpus.c), nothing added */
    if (kind == FSDP_ROW_TEXT && j->doc_start >= 0 &&
        (j->row_ids.n == 0 || j->row_ids.p[0] != j->doc_start))
        FSDP_TRY(emit(j, &j->doc_start, 1));
    FSDP_TRY(emit(j, j->row_ids.p, j->row_ids.n));
    j->res->documents++;
    if (j->res->documents % 1024 == 0)
        report(j, done);
    return FSDP_STATUS_OK;
}

static fsdp_status run(job *j, fsdp_text_file *in)
{
    const fsdp_tokenize_opts *o = j->o;
    bool jsonl;
    if (o->format && !strcmp(o->format, "jsonl"))
        jsonl = true;
    else if (o->format && !strcmp(o->format, "text"))
        jsonl = false;
    else if (o->format)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "unknown input format '%s' (text|jsonl)",
                              o->format);
    else
        jsonl = ends_with(o->in, ".jsonl");
    FSDP_TRY(fsdp_hftok_open(&j->ctx.tok, o->tokenizer));
    j->ctx.chat_format = o->chat_format;
    if (o->chat_format) { /* as training opens it (corpus.c) */
        fsdp_chat_opts co = {.format = o->chat_format, .tokenizer = o->tokenizer};
        FSDP_TRY(fsdp_chat_open(&j->ctx.chat, j->ctx.tok, &co));
    }
    j->vocab = fsdp_hftok_vocab(j->ctx.tok);
    j->res->token_bytes = j->vocab <= 65536 ? 2 : 4;
    int bos = fsdp_hftok_bos(j->ctx.tok);
    j->doc_start = bos >= 0 ? bos : fsdp_hftok_eot(j->ctx.tok);
    FSDP_TRY(fsdp_text_file_map(in, o->in));
    j->res->bytes = in->len;
    if (in->len == 0)
        return fsdp_error_set(FSDP_STATUS_FORMAT, "'%s' is empty: nothing to tokenize", o->in);
    if (jsonl) {
        FSDP_TRY(fsdp_text_file_lines(in, row, j));
        if (j->res->documents == 0)
            return fsdp_error_set(FSDP_STATUS_FORMAT, "'%s' has no rows", o->in);
    } else {
        if (j->doc_start >= 0)
            FSDP_TRY(emit(j, &j->doc_start, 1));
        FSDP_TRY(fsdp_hftok_encode_stream(j->ctx.tok, in->data, in->len, FSDP_HFTOK_SPLIT_SPECIAL,
                                          text_sink, j));
        j->res->documents = 1;
    }
    if (j->w)
        FSDP_TRY(close_shard(j));
    j->res->special_text = j->ctx.n_special;
    if (j->ctx.chat)
        snprintf(j->res->chat, sizeof j->res->chat, "%s", fsdp_chat_describe(j->ctx.chat));
    report(j, in->len);
    return FSDP_STATUS_OK;
}

fsdp_status fsdp_tokenize_file(const fsdp_tokenize_opts *o, fsdp_tokenize_result *res)
{
    memset(res, 0, sizeof *res);
    job j = {.o = o, .res = res, .ctx = {.tok_label = o->tokenizer, .path = o->in}};
    fsdp_text_file in = {0};
    fsdp_status st = run(&j, &in);
    if (st != FSDP_STATUS_OK) {
        fsdp_shard_writer_close(j.w, false);
        for (int i = 0; i < j.n_paths; i++)
            remove(j.paths[i]); /* the open one is already gone */
    }
    for (int i = 0; i < j.n_paths; i++)
        free(j.paths[i]);
    free(j.paths);
    fsdp_text_file_unmap(&in);
    fsdp_hftok_free(j.ctx.tok);
    fsdp_chat_free(j.ctx.chat);
    fsdp_ids_free(&j.row_ids);
    fsdp_flags_free(&j.row_flags);
    return st;
}
