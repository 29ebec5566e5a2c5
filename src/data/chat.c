/*
 * chat.c - the chat-format table, the built-in renderer, and fsdp_chat, which
 * runs either a built-in format or the model's own template (chat_template.c)
 * (chat.h).
 *
 * llama3: Llama 3's instruct template without the optional default system
 * prompt (Llama 3.1's "Cutting Knowledge Date" block is not added):
 *   <|begin_of_text|><|start_header_id|>ROLE<|end_header_id|>\n\nCONTENT<|eot_id|>...
 * with contents trimmed as the template's `| trim` does.
 * chatml: Qwen2's template (ChatML) without Qwen2.5's default system message:
 *   <|im_start|>ROLE\nCONTENT<|im_end|>\n...
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "core/error.h"
#include "data/chat.h"
#include "data/chat_template.h"

static const fsdp_chat_format FORMATS[] = {
    {
        .name = "llama3",
        .help = "Llama 3: <|start_header_id|>role<|end_header_id|>\\n\\n...<|eot_id|>",
        .begin = "<|begin_of_text|>",
        .header = "<|start_header_id|>%s<|end_header_id|>\n\n",
        .close = "<|eot_id|>",
        .sep = "",
        .trim = true,
        .roles = {"system", "user", "assistant", "ipython"},
        .specials = {"<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                     "<|eot_id|>"},
    },
    {
        .name = "chatml",
        .help = "ChatML (Qwen2): <|im_start|>role\\n...<|im_end|>\\n",
        .begin = "",
        .header = "<|im_start|>%s\n",
        .close = "<|im_end|>",
        .sep = "\n",
        .trim = false,
        .roles = {"system", "user", "assistant", "tool"},
        .specials = {"<|im_start|>", "<|im_end|>"},
    },
};

#define N_FORMATS ((int)(sizeof FORMATS / sizeof *FORMATS))

const fsdp_chat_format *fsdp_chat_formats(int *n)
{
    *n = N_FORMATS;
    return FORMATS;
}

const char *fsdp_chat_format_names(char *buf, size_t n, const char *sep)
{
    size_t at = n ? (size_t)snprintf(buf, n, "%s", FSDP_CHAT_TEMPLATE) : 0;
    for (int i = 0; i < N_FORMATS && at < n; i++)
        at += (size_t)snprintf(buf + at, n - at, "%s%s", sep, FORMATS[i].name);
    return buf;
}

const fsdp_chat_format *fsdp_chat_format_find(const char *name)
{
    for (int i = 0; i < N_FORMATS; i++)
        if (!strcmp(FORMATS[i].name, name))
            return &FORMATS[i];
    return NULL;
}

static const char *missing_special(const fsdp_chat_format *f, const fsdp_hftok *t)
{
    for (int i = 0; i < FSDP_CHAT_MAX_ROLES && f->specials[i]; i++)
        if (fsdp_hftok_added_id(t, f->specials[i]) < 0)
            return f->specials[i];
    return NULL;
}

const fsdp_chat_format *fsdp_chat_format_for(const fsdp_hftok *t)
{
    for (int i = 0; i < N_FORMATS; i++)
        if (!missing_special(&FORMATS[i], t))
            return &FORMATS[i];
    return NULL;
}

fsdp_status fsdp_chat_format_check(const fsdp_chat_format *f, const fsdp_hftok *t,
                                   const char *tok_label)
{
    const char *miss = missing_special(f, t);
    if (!miss)
        return FSDP_STATUS_OK;
    const fsdp_chat_format *other = fsdp_chat_format_for(t);
    char hint[96] = "";
    if (other)
        snprintf(hint, sizeof hint, "; its special tokens fit --chat-format %s", other->name);
    return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                          "chat format '%s' needs the special token %s, which tokenizer '%s' "
                          "does not have%s", f->name, miss, tok_label, hint);
}

int fsdp_chat_role(const fsdp_chat_format *f, const char *role)
{
    for (int i = 0; i < FSDP_CHAT_MAX_ROLES && f->roles[i]; i++)
        if (!strcmp(f->roles[i], role))
            return i;
    return -1;
}

/* Encode s[0..n) and append it with one flag value for all its tokens. */
static fsdp_status put(fsdp_hftok *t, const char *s, size_t n, unsigned flags, uint8_t train,
                       fsdp_ids *ids, fsdp_flags *trained)
{
    if (n == 0)
        return FSDP_STATUS_OK;
    int *enc = NULL;
    size_t k = 0;
    FSDP_TRY(fsdp_hftok_encode(t, s, n, flags, &enc, &k));
    fsdp_status st = fsdp_ids_append(ids, enc, k);
    if (st == FSDP_STATUS_OK)
        st = fsdp_flags_fill(trained, train, k);
    free(enc);
    return st;
}

/* Strip leading and trailing whitespace as Python's str.strip() does (the
 * templates' `trim`): Unicode category Zs or bidirectional class WS, B or
 * S. Invalid UTF-8 bytes are not whitespace. */
static void trim(const char **s, size_t *n)
{
    const utf8proc_uint8_t *p = (const utf8proc_uint8_t *)*s;
    size_t first = *n, end = 0;
    for (size_t i = 0; i < *n;) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t k = utf8proc_iterate(p + i, (utf8proc_ssize_t)(*n - i), &cp);
        bool space = false;
        if (k > 0) {
            const utf8proc_property_t *pr = utf8proc_get_property(cp);
            space = pr->category == UTF8PROC_CATEGORY_ZS ||
                    pr->bidi_class == UTF8PROC_BIDI_CLASS_WS ||
                    pr->bidi_class == UTF8PROC_BIDI_CLASS_B ||
                    pr->bidi_class == UTF8PROC_BIDI_CLASS_S;
        } else {
            k = 1;
        }
        if (!space) {
            if (first == *n)
                first = i;
            end = i + (size_t)k;
        }
        i += (size_t)k;
    }
    if (first == *n) { /* all whitespace */
        *n = 0;
        return;
    }
    *s += first;
    *n = end - first;
}

fsdp_status fsdp_chat_render(fsdp_hftok *t, const fsdp_chat_format *f, const fsdp_chat_msg *msgs,
                             int n, fsdp_ids *ids, fsdp_flags *trained)
{
    FSDP_TRY(put(t, f->begin, strlen(f->begin), 0, 0, ids, trained));
    for (int i = 0; i < n; i++) {
        const fsdp_chat_msg *m = &msgs[i];
        if (fsdp_chat_role(f, m->role) < 0)
            return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                                  "message %d has role '%.40s', which chat format '%s' does not "
                                  "know", i, m->role, f->name);
        char header[160];
        int hn = snprintf(header, sizeof header, f->header, m->role);
        const char *c = m->content;
        size_t len = m->len;
        if (f->trim)
            trim(&c, &len);
        uint8_t train = !strcmp(m->role, "assistant");
        FSDP_TRY(put(t, header, (size_t)hn, 0, 0, ids, trained));
        FSDP_TRY(put(t, c, len, FSDP_HFTOK_SPLIT_SPECIAL, train, ids, trained));
        FSDP_TRY(put(t, f->close, strlen(f->close), 0, train, ids, trained));
        FSDP_TRY(put(t, f->sep, strlen(f->sep), 0, 0, ids, trained));
    }
    return FSDP_STATUS_OK;
}

/* ---- renderers -------------------------------------------------------------------------- */

struct fsdp_chat {
    const fsdp_chat_format *format;   /* a built-in, or NULL */
    fsdp_chat_tpl *tpl;               /* the template, or NULL */
    char desc[160];
};

fsdp_status fsdp_chat_check_name(const char *name)
{
    if (!strcmp(name, FSDP_CHAT_TEMPLATE) || fsdp_chat_format_find(name))
        return FSDP_STATUS_OK;
    char names[128];
    return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "unknown chat format '%s' (known: %s)",
                          name, fsdp_chat_format_names(names, sizeof names, ", "));
}

fsdp_status fsdp_chat_open(fsdp_chat **out, const fsdp_hftok *t, const fsdp_chat_opts *o)
{
    *out = NULL;
    const char *name = o->format;
    if (name)
        FSDP_TRY(fsdp_chat_check_name(name));
    fsdp_chat *c = calloc(1, sizeof *c);
    if (!c)
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory");
    fsdp_status st = FSDP_STATUS_OK;
    bool want_tpl = !name || !strcmp(name, FSDP_CHAT_TEMPLATE);
    if (want_tpl && o->tokenizer)
        st = fsdp_chat_tpl_load(&c->tpl, o->tokenizer, o->year, o->month, o->day);
    if (st == FSDP_STATUS_OK && name && want_tpl && !c->tpl)
        st = fsdp_error_set(FSDP_STATUS_INVALID_ARG, "--chat-format %s: there is no "
                            "chat_template.jinja, nor a \"chat_template\" in "
                            "tokenizer_config.json, beside tokenizer '%s'", FSDP_CHAT_TEMPLATE,
                            o->tokenizer ? o->tokenizer : "(none)");
    if (st == FSDP_STATUS_OK && !c->tpl) {
        c->format = name ? fsdp_chat_format_find(name) : fsdp_chat_format_for(t);
        if (c->format && name)
            st = fsdp_chat_format_check(c->format, t, o->tokenizer ? o->tokenizer : "?");
        snprintf(c->desc, sizeof c->desc, "built-in chat format %s%s",
                 c->format ? c->format->name : "?",
                 name ? "" : " (no chat_template beside the tokenizer)");
    }
    if (st != FSDP_STATUS_OK || (!c->tpl && !c->format)) {
        fsdp_chat_free(c);
        return st;
    }
    *out = c;
    return FSDP_STATUS_OK;
}

void fsdp_chat_free(fsdp_chat *c)
{
    if (!c)
        return;
    fsdp_chat_tpl_free(c->tpl);
    free(c);
}

const char *fsdp_chat_describe(const fsdp_chat *c)
{
    return c->tpl ? fsdp_chat_tpl_describe(c->tpl) : c->desc;
}

const fsdp_chat_format *fsdp_chat_builtin(const fsdp_chat *c)
{
    return c->format;
}

fsdp_status fsdp_chat_encode(const fsdp_chat *c, fsdp_hftok *t, const fsdp_chat_msg *msgs,
                             int n, bool add_generation_prompt, fsdp_ids *ids,
                             fsdp_flags *trained, uint64_t *n_special)
{
    if (c->tpl)
        return fsdp_chat_tpl_encode(c->tpl, t, msgs, n, add_generation_prompt, ids, trained,
                                    n_special);
    const fsdp_chat_format *f = c->format;
    FSDP_TRY(fsdp_chat_render(t, f, msgs, n, ids, trained));
    for (int i = 0; i < n && n_special; i++)
        FSDP_TRY(fsdp_chat_count_special(t, msgs[i].content, msgs[i].len, n_special));
    if (!add_generation_prompt)
        return FSDP_STATUS_OK;
    char header[160];
    int hn = snprintf(header, sizeof header, f->header, "assistant");
    return put(t, header, (size_t)hn, 0, 0, ids, trained);
}

int fsdp_chat_end_of_turn(const fsdp_chat *c, fsdp_hftok *t)
{
    if (c->tpl)
        return fsdp_chat_tpl_end_of_turn(c->tpl, t);
    int *enc = NULL;
    size_t k = 0;
    int id = -1;
    if (fsdp_hftok_encode(t, c->format->close, strlen(c->format->close), 0, &enc, &k) ==
            FSDP_STATUS_OK && k >= 1)
        id = enc[0];
    free(enc);
    return id;
}
