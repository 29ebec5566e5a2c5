/*
 * ckpt_tok.c - the tokenizer a checkpoint carries (ckpt_tok.h): read once
 * from where the run found it, written into each checkpoint, checked
 * against the manifest's lines before anyone reads it back.
 */
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <xxhash.h>

#include "ckpt/ckpt_dir.h"
#include "ckpt/ckpt_tok.h"
#include "ckpt/hfdir.h"
#include "core/fileio.h"

/* Append the file at `path` to m's carried files as `name`. */
static fsdp_status load_one(fsdp_ckpt_manifest *m, const char *path, const char *name)
{
    if (m->n_tok_files == FSDP_CKPT_TOK_FILES_MAX)
        return fsdp_error_set(FSDP_STATUS_INTERNAL, "more than %d tokenizer files",
                              FSDP_CKPT_TOK_FILES_MAX);
    fsdp_ckpt_tok_file *f = &m->tok_files[m->n_tok_files];
    size_t n = 0;
    memset(f, 0, sizeof *f);
    FSDP_TRY(fsdp_read_file(path, "tokenizer file", FSDP_CKPT_TOK_BYTES_MAX, &f->data, &n));
    snprintf(f->name, sizeof f->name, "%s", name);
    f->size_bytes = n;
    f->xxh64 = (uint64_t)XXH64(f->data, n, 0);
    m->n_tok_files++;
    return FSDP_STATUS_OK;
}

static void tok_clear(fsdp_ckpt_manifest *m)
{
    for (int i = 0; i < m->n_tok_files; i++)
        free(m->tok_files[i].data);
    memset(m->tok_files, 0, sizeof m->tok_files);
    m->n_tok_files = 0;
}

fsdp_status fsdp_ckpt_tok_load(fsdp_ckpt_manifest *m, const char *tokenizer,
                               const char *companions)
{
    char dir[FSDP_CKPT_PATH_MAX], p[FSDP_CKPT_PATH_MAX + 64];
    tok_clear(m);
    if (snprintf(dir, sizeof dir, "%s", companions ? companions : tokenizer) >= (int)sizeof dir)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "tokenizer path '%.64s...' is too long",
                              tokenizer);
    const char *from = companions ? dir : dirname(dir);
    fsdp_status st = load_one(m, tokenizer, FSDP_CKPT_TOK_JSON);
    for (int i = 0; st == FSDP_STATUS_OK && fsdp_hfdir_companions[i]; i++) {
        const char *name = fsdp_hfdir_companions[i];
        struct stat sb;
        if (!strcmp(name, FSDP_CKPT_TOK_JSON) ||
            snprintf(p, sizeof p, "%s/%s", from, name) >= (int)sizeof p || stat(p, &sb) != 0 ||
            !S_ISREG(sb.st_mode))
            continue;
        st = load_one(m, p, name);
    }
    if (st != FSDP_STATUS_OK) {
        tok_clear(m);
        fsdp_error_prefix("reading the tokenizer for the checkpoints");
    }
    return st;
}

fsdp_status fsdp_ckpt_tok_write(const char *dir, const fsdp_ckpt_manifest *m)
{
    char p[FSDP_CKPT_PATH_MAX + 64];
    for (int i = 0; i < m->n_tok_files; i++) {
        const fsdp_ckpt_tok_file *f = &m->tok_files[i];
        if (!f->data)
            return fsdp_error_set(FSDP_STATUS_INTERNAL, "tokenizer file '%s' has no bytes to "
                                  "write (a manifest read from disk)", f->name);
        if (snprintf(p, sizeof p, "%s/%s", dir, f->name) >= (int)sizeof p)
            return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "checkpoint path '%.64s...' is too "
                                  "long", dir);
        FSDP_TRY(fsdp_write_file_sync(p, f->data, (size_t)f->size_bytes, "tokenizer file"));
    }
    return FSDP_STATUS_OK;
}

fsdp_status fsdp_ckpt_tok_verify(const char *ckpt, const fsdp_ckpt_manifest *m)
{
    char p[FSDP_CKPT_PATH_MAX + 64];
    for (int i = 0; i < m->n_tok_files; i++) {
        const fsdp_ckpt_tok_file *f = &m->tok_files[i];
        snprintf(p, sizeof p, "%s/%s", ckpt, f->name);
        char *data = NULL;
        size_t n = 0;
        if (fsdp_read_file(p, "tokenizer file", FSDP_CKPT_TOK_BYTES_MAX, &data, &n) !=
            FSDP_STATUS_OK)
            return fsdp_error_set(FSDP_STATUS_FORMAT, "checkpoint '%s' carries a tokenizer "
                                  "whose file '%s' (manifest line %d) cannot be read (%s); "
                                  "restore it, or pass --tokenizer", ckpt, f->name, f->line,
                                  fsdp_error_msg());
        uint64_t h = (uint64_t)XXH64(data, n, 0);
        free(data);
        if (n != f->size_bytes || h != f->xxh64)
            return fsdp_error_set(FSDP_STATUS_FORMAT, "checkpoint '%s': tokenizer file '%s' no "
                                  "longer matches its manifest line %d (%zu bytes, XXH64 "
                                  "%016llx; recorded %llu bytes, %016llx): it was edited or "
                                  "damaged after the checkpoint was written, and would read or "
                                  "render other tokens than the model learned; restore it, or "
                                  "pass --tokenizer", ckpt, f->name, f->line, n,
                                  (unsigned long long)h, (unsigned long long)f->size_bytes,
                                  (unsigned long long)f->xxh64);
    }
    return FSDP_STATUS_OK;
}

/* The one checkpoint `value` names: itself when it holds a manifest and is
 * complete, else its newest complete step_N; false when neither. */
static bool which_ckpt(const char *value, char *out, size_t n)
{
    char p[FSDP_CKPT_PATH_MAX + 16];
    struct stat sb;
    if (stat(value, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return false;
    snprintf(p, sizeof p, "%s/manifest", value);
    if (stat(p, &sb) == 0)
        return fsdp_ckpt_is_complete(value) && snprintf(out, n, "%s", value) < (int)n;
    bool found = false;
    uint64_t step = 0;
    return fsdp_ckpt_latest(value, &step, &found) == FSDP_STATUS_OK && found &&
           fsdp_ckpt_step_path(out, n, value, step, "") == FSDP_STATUS_OK;
}

/* The manifest of the checkpoint `value` names (which_ckpt) into *m, its directory into
 * ckpt; *is false (OK, m untouched) when value names none. */
static fsdp_status named_manifest(const char *value, char *ckpt, size_t n, fsdp_ckpt_manifest *m,
                                  bool *is)
{
    char manifest[FSDP_CKPT_PATH_MAX + 16];
    *is = value && which_ckpt(value, ckpt, n);
    if (!*is)
        return FSDP_STATUS_OK;
    snprintf(manifest, sizeof manifest, "%s/manifest", ckpt);
    return fsdp_ckpt_manifest_read(manifest, m);
}

fsdp_status fsdp_ckpt_tok_find(const char *value, char *buf, size_t n, bool *found)
{
    char ckpt[FSDP_CKPT_PATH_MAX];
    fsdp_ckpt_manifest m;
    bool is;
    *found = false;
    FSDP_TRY(named_manifest(value, ckpt, sizeof ckpt, &m, &is));
    if (!is)
        return FSDP_STATUS_OK;
    fsdp_status st = m.n_tok_files ? fsdp_ckpt_tok_verify(ckpt, &m) : FSDP_STATUS_OK;
    if (st == FSDP_STATUS_OK && m.n_tok_files) {
        if (snprintf(buf, n, "%s/%s", ckpt, FSDP_CKPT_TOK_JSON) >= (int)n)
            st = fsdp_error_set(FSDP_STATUS_INVALID_ARG, "checkpoint path '%.64s...' is too "
                                "long", ckpt);
        *found = st == FSDP_STATUS_OK;
    }
    fsdp_ckpt_manifest_free(&m);
    return st;
}

fsdp_status fsdp_ckpt_tok_for_model(const char *value, char *buf, size_t n, bool *found)
{
    *found = fsdp_modelfile_tokenizer_of(value, buf, n);
    return *found ? FSDP_STATUS_OK : fsdp_ckpt_tok_find(value, buf, n, found);
}

fsdp_status fsdp_ckpt_run_find(const char *value, fsdp_ckpt_run *out)
{
    char ckpt[FSDP_CKPT_PATH_MAX];
    fsdp_ckpt_manifest m;
    memset(out, 0, sizeof *out);
    FSDP_TRY(named_manifest(value, ckpt, sizeof ckpt, &m, &out->found));
    if (!out->found)
        return FSDP_STATUS_OK;
    snprintf(out->chat_format, sizeof out->chat_format, "%s", m.chat_format);
    snprintf(out->compute_dtype, sizeof out->compute_dtype, "%s", m.compute_dtype);
    out->batch = m.batch;
    out->seq = m.seq;
    fsdp_ckpt_manifest_free(&m);
    return FSDP_STATUS_OK;
}
