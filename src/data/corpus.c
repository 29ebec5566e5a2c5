/*
 * corpus.c - opening the text people bring through a tokenizer.json: a
 * .txt file (one document) or a .jsonl file (jsonl.h) becomes either a
 * token stream or example rows (data.h says which and how they batch).
 *
 * Everything is tokenized once, at open, on the calling thread, and held
 * in memory (4 bytes per token, plus a flag per token for examples); for
 * corpora too large for that, `fsdp tokenize` writes token shards once and
 * training maps them instead.
 */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/log.h"
#include "data/data_internal.h"
#include "data/jsonl.h"

typedef struct corpus {
    fsdp_row_ctx ctx;
    int doc_start;            /* before each document of a stream, or -1 */
    bool have_kind;
    bool examples;            /* rows are examples (else documents) */
    uint64_t first_line;      /* the row that decided the kind */
    fsdp_ids row_ids;         /* the row being read */
    fsdp_flags row_flags;
    fsdp_ids ids;             /* stream tokens, or all examples' tokens */
    fsdp_flags trained;       /* examples: one flag per token */
    uint64_t *start;          /* examples: offsets [n + 1] */
    uint64_t n, cap;
} corpus;

static fsdp_status add_row(void *arg, const char *line, size_t len, uint64_t line_no,
                           size_t done)
{
    corpus *c = arg;
    fsdp_row_kind kind;
    c->row_ids.n = c->row_flags.n = 0;
    FSDP_TRY(fsdp_row_render(&c->ctx, line, len, line_no, &kind, &c->row_ids, &c->row_flags));
    bool ex = kind != FSDP_ROW_TEXT;
    if (!c->have_kind) {
        c->have_kind = true;
        c->examples = ex;
        c->first_line = line_no;
    } else if (ex != c->examples) {
        return fsdp_error_set(FSDP_STATUS_FORMAT,
                              "'%s' line %llu: %s row, but line %llu was %s row; one file "
                              "holds documents ({\"text\"}) or examples (prompt/completion, "
                              "messages), not both",
                              c->ctx.path, (unsigned long long)line_no,
                              ex ? "an example" : "a {\"text\"}", (unsigned long long)c->first_line,
                              ex ? "a {\"text\"}" : "an example");
    }
    if (!ex) { /* a document of the stream */
        if (c->doc_start >= 0)
            FSDP_TRY(fsdp_ids_append(&c->ids, &c->doc_start, 1));
        return fsdp_ids_append(&c->ids, c->row_ids.p, c->row_ids.n);
    }
    if (c->n + 2 > c->cap) {
        uint64_t cap = c->cap ? 2 * c->cap : 1024;
        uint64_t *p = realloc(c->start, cap * sizeof *p);
        if (!p)
            return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory holding %llu examples",
                                  (unsigned long long)c->n);
        c->start = p;
        c->cap = cap;
    }
    FSDP_TRY(fsdp_ids_append(&c->ids, c->row_ids.p, c->row_ids.n));
    FSDP_TRY(fsdp_flags_reserve(&c->trained, c->row_flags.n));
    memcpy(c->trained.p + c->trained.n, c->row_flags.p, c->row_flags.n);
    c->trained.n += c->row_flags.n;
    c->start[c->n] = c->ids.n - c->row_ids.n;
    c->start[++c->n] = c->ids.n;
    return FSDP_STATUS_OK;
}

static fsdp_status add_text(void *arg, const int *ids, size_t n, size_t done)
{
    return fsdp_ids_append(arg, ids, n);
}

/* Every token below vocab_size (> 0); the largest in *max. */
static fsdp_status check_ids(const corpus *c, const char *path, int vocab_size, int *max)
{
    int mx = 0;
    for (size_t i = 0; i < c->ids.n; i++) {
        if (vocab_size > 0 && c->ids.p[i] >= vocab_size)
            return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                                  "'%s' tokenized to id %d, not below the vocabulary size %d; "
                                  "use the model's own tokenizer", path, c->ids.p[i], vocab_size);
        if (c->ids.p[i] > mx)
            mx = c->ids.p[i];
    }
    *max = mx;
    return FSDP_STATUS_OK;
}

static fsdp_status corpus_open(fsdp_data *d, const fsdp_data_opts *o, corpus *c,
                               fsdp_text_file *file)
{
    const char *path = o->spec;
    c->ctx.chat_format = o->chat_format;
    if (o->chat_format) { /* a named format is checked now, the default at the first chat row */
        fsdp_chat_opts co = {.format = o->chat_format, .tokenizer = o->tokenizer};
        FSDP_TRY(fsdp_chat_open(&c->ctx.chat, c->ctx.tok, &co));
    }
    int bos = fsdp_hftok_bos(c->ctx.tok);
    c->doc_start = bos >= 0 ? bos : fsdp_hftok_eot(c->ctx.tok);
    FSDP_TRY(fsdp_text_file_map(file, path));
    bool jsonl = strlen(path) >= 6 && !strcmp(path + strlen(path) - 6, ".jsonl");
    if (jsonl) {
        FSDP_TRY(fsdp_text_file_lines(file, add_row, c));
        if (!c->have_kind)
            return fsdp_error_set(FSDP_STATUS_FORMAT, "'%s' has no rows", path);
    } else {
        if (file->len == 0)
            return fsdp_error_set(FSDP_STATUS_FORMAT, "'%s' is empty", path);
        if (c->doc_start >= 0)
            FSDP_TRY(fsdp_ids_append(&c->ids, &c->doc_start, 1));
        FSDP_TRY(fsdp_hftok_encode_stream(c->ctx.tok, file->data, file->len,
                                          FSDP_HFTOK_SPLIT_SPECIAL, add_text, &c->ids));
    }
    int max = 0;
    FSDP_TRY(check_ids(c, path, o->vocab_size, &max));
    d->n_special_text = c->ctx.n_special;
    if (c->ctx.chat && c->examples) {
        const fsdp_chat_format *f = fsdp_chat_builtin(c->ctx.chat);
        snprintf(d->chat, sizeof d->chat, "%s", fsdp_chat_describe(c->ctx.chat));
        snprintf(d->chat_format, sizeof d->chat_format, "%s", f ? f->name : FSDP_CHAT_TEMPLATE);
    }
    if (!c->examples) {
        d->kind = FSDP_DATA_TOKENS;
        FSDP_TRY(fsdp_data_files_adopt(d, path, c->ids.p, c->ids.n));
        memset(&c->ids, 0, sizeof c->ids); /* owned by d now */
        FSDP_INFO(FSDP_SUB_DATA, "data: '%s': %llu tokens (tokenizer %s)", path,
                  (unsigned long long)d->n_tokens, o->tokenizer);
        return FSDP_STATUS_OK;
    }
    fsdp_examples *ex = &d->ex;
    int eot = fsdp_hftok_eot(c->ctx.tok);
    ex->pad = eot >= 0 ? eot : 0;
    ex->n = c->n;
    ex->tokens = c->ids.p;
    ex->trained = c->trained.p;
    ex->start = c->start;
    memset(&c->ids, 0, sizeof c->ids);
    memset(&c->trained, 0, sizeof c->trained);
    c->start = NULL;
    d->kind = FSDP_DATA_EXAMPLES;
    d->n_tokens = ex->start[ex->n];
    d->vocab = (max > ex->pad ? max : ex->pad) + 1;
    FSDP_INFO(FSDP_SUB_DATA, "data: '%s': %llu examples, %llu tokens (tokenizer %s, %s)", path,
              (unsigned long long)ex->n, (unsigned long long)d->n_tokens, o->tokenizer,
              d->chat[0] ? d->chat : "no chat rows");
    return FSDP_STATUS_OK;
}

fsdp_status fsdp_data_corpus_open(fsdp_data *d, const fsdp_data_opts *o)
{
    corpus c = {.ctx = {.tok_label = o->tokenizer, .path = o->spec}};
    fsdp_text_file file = {0};
    fsdp_status st = fsdp_hftok_open(&c.ctx.tok, o->tokenizer);
    if (st == FSDP_STATUS_OK)
        st = corpus_open(d, o, &c, &file);
    fsdp_text_file_unmap(&file);
    fsdp_hftok_free(c.ctx.tok);
    fsdp_chat_free(c.ctx.chat);
    fsdp_ids_free(&c.ids);
    fsdp_flags_free(&c.trained);
    fsdp_ids_free(&c.row_ids);
    fsdp_flags_free(&c.row_flags);
    free(c.start);
    return st;
}

const char *fsdp_data_chat(const fsdp_data *d)
{
    return d->chat;
}

const char *fsdp_data_chat_format(const fsdp_data *d)
{
    return d->chat_format;
}

uint64_t fsdp_data_special_text(const fsdp_data *d)
{
    return d->n_special_text;
}
