/*
 * jsonl.c - reading .jsonl rows and mapping text files (jsonl.h).
 *
 * Each line is parsed on its own with core/json.c, so a bad line is found
 * with its number and nothing before it is lost; the file itself is mapped
 * read-only, so a multi-gigabyte corpus streams through the page cache.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"
#include "core/json.h"
#include "core/fileio.h"
#include "data/jsonl.h"

#define MAX_MESSAGES 4096

__attribute__((format(printf, 3, 4))) static fsdp_status row_err(const fsdp_row_ctx *c,
                                                                 uint64_t line,
                                                                 const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fsdp_error_setv(FSDP_STATUS_FORMAT, fmt, ap);
    va_end(ap);
    fsdp_error_prefix("'%s' line %llu", c->path, (unsigned long long)line);
    return FSDP_STATUS_FORMAT;
}

/* obj[key] as a string: NULL when absent; FORMAT when not a string. */
static fsdp_status get_str(const fsdp_row_ctx *c, uint64_t line, const fsdp_json *obj,
                           const char *key, const char *where, const fsdp_json **out)
{
    *out = fsdp_json_get(obj, key);
    if (*out && (*out)->type != FSDP_JSON_STRING)
        return row_err(c, line, "%s\"%s\" must be a string, found %s", where, key,
                       fsdp_json_type_name((*out)->type));
    if (*out && !strcmp(key, "role") && !fsdp_json_name(*out)) /* a name, compared as one */
        return row_err(c, line, "%s\"role\" holds \\u0000 (a NUL character)", where);
    return FSDP_STATUS_OK;
}

static fsdp_status encode_into(fsdp_row_ctx *c, const fsdp_json *s, uint8_t train, fsdp_ids *ids,
                               fsdp_flags *trained)
{
    int *enc = NULL;
    size_t k = 0;
    FSDP_TRY(fsdp_chat_count_special(c->tok, s->str, s->len, &c->n_special));
    FSDP_TRY(fsdp_hftok_encode(c->tok, s->str, s->len, FSDP_HFTOK_SPLIT_SPECIAL, &enc, &k));
    fsdp_status st = fsdp_ids_append(ids, enc, k);
    if (st == FSDP_STATUS_OK)
        st = fsdp_flags_fill(trained, train, k);
    free(enc);
    return st;
}

static fsdp_status put_id(int id, uint8_t train, fsdp_ids *ids, fsdp_flags *trained)
{
    FSDP_TRY(fsdp_ids_append(ids, &id, 1));
    return fsdp_flags_fill(trained, train, 1);
}

static fsdp_status render_prompt(fsdp_row_ctx *c, uint64_t line, const fsdp_json *row,
                                 fsdp_ids *ids, fsdp_flags *trained)
{
    const fsdp_json *p, *q;
    FSDP_TRY(get_str(c, line, row, "prompt", "", &p));
    FSDP_TRY(get_str(c, line, row, "completion", "", &q));
    if (!p || !q)
        return row_err(c, line, "a prompt/completion row needs both \"prompt\" and "
                                "\"completion\" (this one has only \"%s\")",
                       p ? "prompt" : "completion");
    if (q->len == 0)
        return row_err(c, line, "\"completion\" is empty: there is nothing to train on");
    int eot = fsdp_hftok_eot(c->tok);
    if (eot < 0)
        return row_err(c, line, "tokenizer '%s' has no end-of-text token to close the "
                                "completion with", c->tok_label);
    int bos = fsdp_hftok_bos(c->tok);
    if (bos >= 0)
        FSDP_TRY(put_id(bos, 0, ids, trained));
    FSDP_TRY(encode_into(c, p, 0, ids, trained));
    FSDP_TRY(encode_into(c, q, 1, ids, trained));
    return put_id(eot, 1, ids, trained);
}

static fsdp_status render_chat(fsdp_row_ctx *c, uint64_t line, const fsdp_json *msgs,
                               fsdp_ids *ids, fsdp_flags *trained)
{
    if (msgs->type != FSDP_JSON_ARRAY)
        return row_err(c, line, "\"messages\" must be an array of {\"role\", \"content\"}, found "
                                "%s", fsdp_json_type_name(msgs->type));
    if (msgs->n == 0)
        return row_err(c, line, "\"messages\" is empty");
    if (msgs->n > MAX_MESSAGES)
        return row_err(c, line, "%zu messages, more than %d", msgs->n, MAX_MESSAGES);
    if (!c->chat) {
        fsdp_chat_opts o = {.format = c->chat_format, .tokenizer = c->tok_label};
        FSDP_TRY(fsdp_chat_open(&c->chat, c->tok, &o));
    }
    if (!c->chat)
        return row_err(c, line, "a messages row needs a chat format, and tokenizer '%s' has "
                                "no chat template beside it and the special tokens of no "
                                "built-in format; pass --chat-format NAME", c->tok_label);
    const fsdp_chat_format *f = fsdp_chat_builtin(c->chat); /* NULL: the template decides */
    fsdp_chat_msg *m = malloc(msgs->n * sizeof *m);
    if (!m)
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory reading '%s'", c->path);
    fsdp_status st = FSDP_STATUS_OK;
    bool assistant = false;
    size_t i = 0;
    char where[48];
    for (const fsdp_json *x = msgs->child; x; x = x->next, i++) {
        snprintf(where, sizeof where, "messages[%zu]: ", i);
        const fsdp_json *role, *content;
        if (x->type != FSDP_JSON_OBJECT) {
            st = row_err(c, line, "%sexpected an object {\"role\", \"content\"}, found %s", where,
                         fsdp_json_type_name(x->type));
            goto out;
        }
        if ((st = get_str(c, line, x, "role", where, &role)) != FSDP_STATUS_OK ||
            (st = get_str(c, line, x, "content", where, &content)) != FSDP_STATUS_OK)
            goto out;
        if (!role || !content) {
            st = row_err(c, line, "%smissing \"%s\"", where, role ? "content" : "role");
            goto out;
        }
        if (f && fsdp_chat_role(f, role->str) < 0) {
            char roles[128] = "";
            for (int k = 0; k < FSDP_CHAT_MAX_ROLES && f->roles[k]; k++)
                snprintf(roles + strlen(roles), sizeof roles - strlen(roles), "%s%s",
                         k ? ", " : "", f->roles[k]);
            st = row_err(c, line, "%srole '%.40s' is not one of %s (chat format %s)", where,
                         role->str, roles, f->name);
            goto out;
        }
        if (!strcmp(role->str, "assistant")) {
            if (content->len == 0) {
                st = row_err(c, line, "%sthe assistant's content is empty", where);
                goto out;
            }
            assistant = true;
        }
        m[i] = (fsdp_chat_msg){.role = role->str, .content = content->str, .len = content->len};
    }
    if (!assistant) {
        st = row_err(c, line, "no \"assistant\" message: there is nothing to train on");
        goto out;
    }
    st = fsdp_chat_encode(c->chat, c->tok, m, (int)msgs->n, false, ids, trained, &c->n_special);
    if (st != FSDP_STATUS_OK && st != FSDP_STATUS_OOM) {
        fsdp_error_prefix("'%s' line %llu", c->path, (unsigned long long)line);
        st = st == FSDP_STATUS_UNSUPPORTED ? st : FSDP_STATUS_FORMAT;
    }
out:
    free(m);
    return st;
}

fsdp_status fsdp_row_render(fsdp_row_ctx *c, const char *line, size_t len, uint64_t line_no,
                            fsdp_row_kind *kind, fsdp_ids *ids, fsdp_flags *trained)
{
    fsdp_json *row = NULL;
    if (fsdp_json_parse(line, len, &row) != FSDP_STATUS_OK) {
        const char *msg = fsdp_error_msg();
        if (!strncmp(msg, "line 1, ", 8))
            msg += 8;
        char copy[512];
        snprintf(copy, sizeof copy, "%s", msg);
        return row_err(c, line_no, "not valid JSON (%s)", copy);
    }
    fsdp_status st;
    if (row->type != FSDP_JSON_OBJECT) {
        st = row_err(c, line_no, "expected a JSON object, found %s",
                     fsdp_json_type_name(row->type));
        goto out;
    }
    const fsdp_json *text = fsdp_json_get(row, "text"), *msgs = fsdp_json_get(row, "messages");
    bool prompt = fsdp_json_get(row, "prompt") || fsdp_json_get(row, "completion");
    if ((text != NULL) + (msgs != NULL) + prompt > 1) {
        st = row_err(c, line_no, "has keys of two kinds of row (\"text\", \"messages\", "
                                 "\"prompt\"/\"completion\"); keep one");
        goto out;
    }
    if (text) {
        *kind = FSDP_ROW_TEXT;
        if ((st = get_str(c, line_no, row, "text", "", &text)) != FSDP_STATUS_OK)
            goto out;
        if (text->len == 0) {
            st = row_err(c, line_no, "\"text\" is empty");
            goto out;
        }
        st = encode_into(c, text, 1, ids, trained);
    } else if (msgs) {
        *kind = FSDP_ROW_CHAT;
        st = render_chat(c, line_no, msgs, ids, trained);
    } else if (prompt) {
        *kind = FSDP_ROW_PROMPT;
        st = render_prompt(c, line_no, row, ids, trained);
    } else {
        st = row_err(c, line_no, "expected {\"text\"}, {\"prompt\", \"completion\"} or "
                                 "{\"messages\"}");
    }
out:
    fsdp_json_free(row);
    return st;
}

/* ---- files ------------------------------------------------------------------------------ */

fsdp_status fsdp_text_file_map(fsdp_text_file *f, const char *path)
{
    memset(f, 0, sizeof *f);
    int fd = -1;
    uint64_t size = 0;
    FSDP_TRY(fsdp_open_regular(path, "data file", &fd, &size));
    f->len = (size_t)size;
    if (f->len > 0) {
        void *p = mmap(NULL, f->len, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            int e = errno;
            close(fd);
            size_t len = f->len;
            f->len = 0;
            return fsdp_error_set(FSDP_STATUS_IO, "cannot map data file '%s' (%zu bytes): %s",
                                  path, len, strerror(e));
        }
        f->data = p;
    }
    close(fd);
    return FSDP_STATUS_OK;
}

void fsdp_text_file_unmap(fsdp_text_file *f)
{
    if (f->data)
        munmap((void *)f->data, f->len);
    memset(f, 0, sizeof *f);
}

fsdp_status fsdp_text_file_lines(const fsdp_text_file *f, fsdp_line_fn fn, void *arg)
{
    uint64_t line_no = 0;
    for (size_t at = 0; at < f->len;) {
        const char *s = f->data + at;
        const char *nl = memchr(s, '\n', f->len - at);
        size_t n = nl ? (size_t)(nl - s) : f->len - at;
        at += n + (nl != NULL);
        line_no++;
        if (n && s[n - 1] == '\r')
            n--;
        bool blank = true;
        for (size_t i = 0; i < n && blank; i++)
            blank = s[i] == ' ' || s[i] == '\t';
        if (!blank)
            FSDP_TRY(fn(arg, s, n, line_no, at));
    }
    return FSDP_STATUS_OK;
}
