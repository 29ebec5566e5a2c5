/*
 * tokenize.c - a text or .jsonl corpus into llm.c token shards, once, so
 * training maps tokens instead of tokenizing (shard.h: fsdp_tokenize_file).
 *
 * The input is mapped and tokenized in one pass on the calling thread; ids
 * stream through the shard writer, so memory stays at the tokenizer, one
 * row and the writer's buffer however large the corpus. Every shard stays
 * under its temporary name until the whole corpus is done; then they are
 * put in place together with one sync of the filesystem (core/fileio.h:
 * staged files), so a failed run (a bad row, a full disk) changes nothing
 * at any output path, and a thousand small shards cost one sync, not a
 * thousand. After that, shards of an earlier run with the same name and a
 * higher number are removed: a glob 'OUT_*.bin' reads this run's shards
 * and nothing else.
 */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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
    fsdp_staged stage;        /* finished shards, put in place at the end */
    fsdp_ids row_ids;
    fsdp_flags row_flags;
    size_t base_done;         /* bytes of IN before the text being encoded */
} job;

static bool ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

size_t fsdp_tokenize_stem_len(const char *out)
{
    return strlen(out) - (ends_with(out, ".bin") ? 4 : 0);
}

fsdp_status fsdp_tokenize_shard_path(const char *out, int k, char *buf, size_t n)
{
    if (snprintf(buf, n, "%.*s_%06d.bin", (int)fsdp_tokenize_stem_len(out), out, k) >= (int)n)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "output path '%.64s...' is too long",
                              out);
    return FSDP_STATUS_OK;
}

static fsdp_status next_shard(job *j)
{
    const fsdp_tokenize_opts *o = j->o;
    char path[4096];
    if (!o->shard_tokens)
        snprintf(path, sizeof path, "%s", o->out);
    else
        FSDP_TRY(fsdp_tokenize_shard_path(o->out, j->res->n_shards, path, sizeof path));
    FSDP_TRY(fsdp_shard_writer_open(&j->w, path, j->vocab));
    j->res->n_shards++;
    return FSDP_STATUS_OK;
}

static fsdp_status close_shard(job *j)
{
    fsdp_status st = fsdp_shard_writer_stage(j->w, &j->stage);
    j->w = NULL;
    return st;
}

/* The number k of a file named "<stem>_<k>.bin" (at least 6 digits, as
 * fsdp_tokenize_shard_path writes them) in the directory of OUT, or -1. */
static int64_t shard_number(const char *name, const char *stem, size_t stem_n)
{
    if (strncmp(name, stem, stem_n) || name[stem_n] != '_')
        return -1;
    const char *d = name + stem_n + 1;
    size_t k = 0;
    int64_t v = 0;
    for (; d[k] >= '0' && d[k] <= '9'; k++)
        v = v < INT32_MAX ? v * 10 + (d[k] - '0') : INT32_MAX;
    return k >= 6 && !strcmp(d + k, ".bin") ? v : -1;
}

/* Remove the shards of an earlier run that this one did not replace (k >=
 * n_shards): a glob "OUT_*.bin" would read them with the new ones. Only
 * regular files named as this writer names shards are touched. */
static fsdp_status remove_stale(const fsdp_tokenize_opts *o, fsdp_tokenize_result *res)
{
    char dir[4096], base[4096];
    snprintf(dir, sizeof dir, "%s", o->out);
    snprintf(base, sizeof base, "%.*s", (int)fsdp_tokenize_stem_len(o->out), o->out);
    const char *d = dirname(dir), *stem = basename(base);
    size_t stem_n = strlen(stem);
    DIR *dh = opendir(d);
    if (!dh)
        return fsdp_error_set(FSDP_STATUS_IO, "cannot list '%s' for shards of an earlier run: %s",
                              d, strerror(errno));
    fsdp_status st = FSDP_STATUS_OK;
    for (struct dirent *e; st == FSDP_STATUS_OK && (e = readdir(dh));) {
        int64_t k = shard_number(e->d_name, stem, stem_n);
        char path[8192];
        struct stat sb;
        if (k < res->n_shards ||
            snprintf(path, sizeof path, "%s/%s", d, e->d_name) >= (int)sizeof path ||
            lstat(path, &sb) != 0 || !S_ISREG(sb.st_mode))
            continue;
        if (unlink(path) != 0) {
            st = fsdp_error_set(FSDP_STATUS_IO, "cannot remove '%s', a shard of an earlier run "
                                "that '%s_*.bin' would also read: %s; remove it by hand",
                                path, stem, strerror(errno));
            break;
        }
        if (res->n_removed == 0 || k < res->removed_lo)
            res->removed_lo = (int)k;
        if (res->n_removed == 0 || k > res->removed_hi)
            res->removed_hi = (int)k;
        res->n_removed++;
    }
    closedir(dh);
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
    if (!o->out || !*o->out)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "the output path is empty: give OUT.bin");
    job j = {.o = o, .res = res, .ctx = {.tok_label = o->tokenizer, .path = o->in}};
    fsdp_text_file in = {0};
    fsdp_status st = run(&j, &in);
    if (st == FSDP_STATUS_OK)
        st = fsdp_staged_publish(&j.stage, "token shards");
    if (st == FSDP_STATUS_OK && o->shard_tokens)
        st = remove_stale(o, res);
    fsdp_shard_writer_close(j.w, false); /* after a failure: nothing was put in place */
    fsdp_staged_abort(&j.stage);
    fsdp_text_file_unmap(&in);
    fsdp_hftok_free(j.ctx.tok);
    fsdp_chat_free(j.ctx.chat);
    fsdp_ids_free(&j.row_ids);
    fsdp_flags_free(&j.row_flags);
    return st;
}
