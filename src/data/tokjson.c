/*
 * tokjson.c - reading a Hugging Face tokenizer.json into a tokenizer
 * (hftok.h says what is accepted).
 *
 * The file is parsed whole with core/json.c (a 9 MiB Llama 3 file is a few
 * hundred thousand nodes), then every section is checked as it is read:
 * an unexpected type, a missing field, an id out of range, a merge naming
 * a token the vocabulary lacks, a feature this reader does not implement -
 * each is an error naming the file and the field's path
 * ("model.merges[17]"), never a tokenizer that encodes differently from
 * the reference without saying so.
 *
 * Vocabulary strings are byte-level: each of the 256 bytes is spelled by
 * one character (GPT-2's bytes_to_unicode: printable Latin-1 bytes as
 * themselves, the rest as U+0100 + n). They are turned back into raw
 * bytes here, so the encoder and decoder work on bytes only. A string
 * with a character outside that alphabet cannot come out of byte-level
 * merges; it stays reachable by decoding (its UTF-8 bytes, as the
 * reference's ByteLevel decoder does).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <utf8proc.h>

#include "core/fileio.h"
#include "core/error.h"
#include "core/json.h"
#include "data/tokjson_pipe.h"
#include "data/tokjson_read.h"

#define HFTOK_MAX_FILE ((size_t)256 << 20)

/* Document-end tokens by name, for tokenizers whose post-processor adds
 * none (GPT-2, Qwen2: <|endoftext|>; Llama 3: <|end_of_text|>). */
static const char *const EOT_NAMES[] = {"<|endoftext|>", "<|end_of_text|>"};

static void byte_table(tokjson_reader *r)
{
    for (int c = 0; c < 324; c++)
        r->char_byte[c] = -1;
    int n = 0;
    for (int b = 0; b < 256; b++) {
        bool self = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
        r->char_byte[self ? b : 256 + n++] = b;
    }
}

/* Raw bytes of a byte-level string s[0..n), written at r->buf + at
 * (*out_n bytes): 1 if every character is in the alphabet; 0 if one is
 * not (or the UTF-8 is broken), and then s is copied unchanged; -1 when
 * out of memory. */
static int decode_key(tokjson_reader *r, const char *s, size_t n, size_t at, size_t *out_n)
{
    if (at + n + 1 > r->buf_cap) {
        uint8_t *b = realloc(r->buf, 2 * (at + n + 1));
        if (!b)
            return -1;
        r->buf = b;
        r->buf_cap = 2 * (at + n + 1);
    }
    uint8_t *dst = r->buf + at;
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t step = utf8proc_iterate((const utf8proc_uint8_t *)s + i,
                                                 (utf8proc_ssize_t)(n - i), &cp);
        if (step <= 0 || cp < 0 || cp >= 324 || r->char_byte[cp] < 0) {
            memcpy(dst, s, n);
            *out_n = n;
            return 0;
        }
        dst[k++] = (uint8_t)r->char_byte[cp];
        i += (size_t)step;
    }
    *out_n = k;
    return 1;
}

/* ---- model --------------------------------------------------------------------------- */

typedef struct vocab_entry {
    int id;
    const fsdp_json *key;   /* the member: key->key is the token string */
} vocab_entry;

static int cmp_entry(const void *a, const void *b)
{
    int x = ((const vocab_entry *)a)->id, y = ((const vocab_entry *)b)->id;
    return (x > y) - (x < y);
}

/* One side of a merge rule, decoded at r->buf + at (*k bytes): its id. */
static fsdp_status merge_side(tokjson_reader *r, const char *s, size_t n, size_t at,
                              const char *field, size_t *k, int *id)
{
    int ok = n ? decode_key(r, s, n, at, k) : 0;
    if (ok < 0)
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory reading merges");
    if (!ok || (*id = fsdp_bpe_find(r->t->bpe, r->buf + at, *k)) < 0)
        return tokjson_bad(r, FSDP_STATUS_FORMAT, field, "token '%.*s' is not in model.vocab",
                           (int)(n > 64 ? 64 : n), s);
    return FSDP_STATUS_OK;
}

static fsdp_status read_merges(tokjson_reader *r, const fsdp_json *merges)
{
    char field[64];
    FSDP_TRY(tokjson_want(r, merges, FSDP_JSON_ARRAY, "model.merges"));
    uint32_t rank = 0;
    size_t i = 0;
    for (const fsdp_json *m = merges->child; m; m = m->next, i++) {
        snprintf(field, sizeof field, "model.merges[%zu]", i);
        const char *a, *b;
        size_t na, nb;
        if (m->type == FSDP_JSON_STRING) {
            if (!strncmp(m->str, "#version", 8))
                continue; /* merges.txt's header line, skipped as tokenizers does */
            const char *sp = memchr(m->str, ' ', m->len);
            if (!sp || memchr(sp + 1, ' ', m->len - (size_t)(sp + 1 - m->str)))
                return tokjson_bad(r, FSDP_STATUS_FORMAT, field,
                                   "'%.64s' is not two tokens separated by one space", m->str);
            a = m->str;
            na = (size_t)(sp - m->str);
            b = sp + 1;
            nb = m->len - na - 1;
        } else if (m->type == FSDP_JSON_ARRAY && m->n == 2 && m->child->type == FSDP_JSON_STRING &&
                   m->child->next->type == FSDP_JSON_STRING) {
            a = m->child->str;
            na = m->child->len;
            b = m->child->next->str;
            nb = m->child->next->len;
        } else {
            return tokjson_bad(r, FSDP_STATUS_FORMAT, field,
                               "expected \"a b\" or [\"a\", \"b\"], found %s",
                               fsdp_json_type_name(m->type));
        }
        int left, right;
        size_t la, lb;
        FSDP_TRY(merge_side(r, a, na, 0, field, &la, &left));
        FSDP_TRY(merge_side(r, b, nb, la, field, &lb, &right));
        /* the merged token: the two sides' bytes back to back */
        int merged = fsdp_bpe_find(r->t->bpe, r->buf, la + lb);
        if (merged < 0)
            return tokjson_bad(r, FSDP_STATUS_FORMAT, field,
                               "'%.*s' + '%.*s' makes a token that is not in model.vocab",
                               (int)(na > 64 ? 64 : na), a, (int)(nb > 64 ? 64 : nb), b);
        FSDP_TRY(fsdp_bpe_add_merge(r->t->bpe, left, right, merged, rank++));
    }
    return FSDP_STATUS_OK;
}

/* Check the BPE options this tokjson_reader does not implement are off. */
static fsdp_status check_model_options(tokjson_reader *r, const fsdp_json *model)
{
    const fsdp_json *v;
    if ((v = fsdp_json_get(model, "type")) && v->type != FSDP_JSON_NULL) {
        FSDP_TRY(tokjson_want(r, v, FSDP_JSON_STRING, "model.type"));
        if (!fsdp_json_name(v) || strcmp(v->str, "BPE"))
            return tokjson_unsupported(r, "model.type", fsdp_json_name(v) ? v->str
                                                                          : "a type with \\u0000");
    }
    if ((v = fsdp_json_get(model, "dropout")) && v->type != FSDP_JSON_NULL &&
        !(v->type == FSDP_JSON_NUMBER && v->number == 0))
        return tokjson_unsupported(r, "model.dropout", "BPE dropout (random merges, for training)");
    bool fallback;
    FSDP_TRY(tokjson_get_bool(r, model, "byte_fallback", "model.byte_fallback", false, &fallback));
    if (fallback)
        return tokjson_unsupported(r, "model.byte_fallback",
                                   "byte fallback (SentencePiece-style BPE: Llama 2, Mistral)");
    static const char *const affixes[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (int i = 0; i < 2; i++) {
        char f[64];
        snprintf(f, sizeof f, "model.%s", affixes[i]);
        v = fsdp_json_get(model, affixes[i]);
        if (v && v->type != FSDP_JSON_NULL) {
            FSDP_TRY(tokjson_want(r, v, FSDP_JSON_STRING, f));
            if (v->len)
                return tokjson_unsupported(r, f, "a subword affix");
        }
    }
    return FSDP_STATUS_OK;
}

static fsdp_status read_model(tokjson_reader *r, const fsdp_json *model, vocab_entry **entries,
                              size_t *n_entries)
{
    FSDP_TRY(tokjson_want(r, model, FSDP_JSON_OBJECT, "model"));
    FSDP_TRY(check_model_options(r, model));
    const fsdp_json *vocab = fsdp_json_get(model, "vocab");
    const fsdp_json *merges = fsdp_json_get(model, "merges");
    FSDP_TRY(tokjson_want(r, vocab, FSDP_JSON_OBJECT, "model.vocab"));
    FSDP_TRY(tokjson_want(r, merges, FSDP_JSON_ARRAY, "model.merges"));
    FSDP_TRY(fsdp_bpe_init(&r->t->bpe, vocab->n, merges->n));
    vocab_entry *e = calloc(vocab->n + 1, sizeof *e);
    if (!e)
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory for %zu tokens", vocab->n);
    *entries = e;
    char field[128];
    size_t n = 0;
    for (const fsdp_json *v = vocab->child; v; v = v->next) {
        snprintf(field, sizeof field, "model.vocab[\"%.64s\"]", v->key);
        FSDP_TRY(tokjson_as_id(r, v, field, &e[n].id));
        e[n++].key = v;
        size_t k;
        if (!*v->key)
            return tokjson_bad(r, FSDP_STATUS_FORMAT, field, "a token cannot be empty");
        int ok = decode_key(r, v->key, strlen(v->key), 0, &k);
        if (ok < 0)
            return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory reading model.vocab");
        if (ok && fsdp_bpe_add_token(r->t->bpe, r->buf, k, e[n - 1].id) != FSDP_STATUS_OK)
            return tokjson_bad(r, FSDP_STATUS_FORMAT, field, "%s", fsdp_error_msg());
    }
    qsort(e, n, sizeof *e, cmp_entry);
    for (size_t i = 1; i < n; i++)
        if (e[i].id == e[i - 1].id)
            return tokjson_bad(r, FSDP_STATUS_FORMAT, "model.vocab",
                               "id %d is given to both \"%.64s\" and \"%.64s\"", e[i].id,
                               e[i - 1].key->key, e[i].key->key);
    *n_entries = n;
    bool ignore;
    FSDP_TRY(tokjson_get_bool(r, model, "ignore_merges", "model.ignore_merges", false, &ignore));
    FSDP_TRY(read_merges(r, merges));
    fsdp_status st = fsdp_bpe_finish(r->t->bpe, ignore);
    return st == FSDP_STATUS_OK ? st : tokjson_bad(r, st, "model.vocab", "%s", fsdp_error_msg());
}

/* ---- added tokens ---------------------------------------------------------------------- */

static int cmp_added_id(const void *a, const void *b, void *ctx)
{
    const hftok_added *v = ctx;
    int x = v[*(const int *)a].id, y = v[*(const int *)b].id;
    if (x != y)
        return x < y ? -1 : 1;
    return *(const int *)a - *(const int *)b;
}

static int cmp_added_content(const void *a, const void *b, void *ctx)
{
    const hftok_added *v = ctx, *x = &v[*(const int *)a], *y = &v[*(const int *)b];
    int c = memcmp(x->content, y->content, x->len < y->len ? x->len : y->len);
    if (c)
        return c;
    if (x->len != y->len)
        return x->len < y->len ? -1 : 1;
    return *(const int *)a - *(const int *)b;
}

/* No two added tokens share an id or a content (sorted, so thousands of
 * added tokens stay cheap). */
static fsdp_status check_repeats(tokjson_reader *r)
{
    fsdp_hftok *t = r->t;
    int n = t->n_added;
    int *order = malloc(((size_t)n + 1) * sizeof *order);
    if (!order)
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory for added tokens");
    fsdp_status st = FSDP_STATUS_OK;
    for (int pass = 0; pass < 2 && st == FSDP_STATUS_OK; pass++) {
        for (int i = 0; i < n; i++)
            order[i] = i;
        qsort_r(order, (size_t)n, sizeof *order, pass ? cmp_added_content : cmp_added_id,
                t->added);
        for (int i = 1; i < n && st == FSDP_STATUS_OK; i++) {
            const hftok_added *a = &t->added[order[i - 1]], *b = &t->added[order[i]];
            if (pass ? a->len == b->len && !memcmp(a->content, b->content, a->len)
                     : a->id == b->id) {
                char field[64];
                snprintf(field, sizeof field, "added_tokens[%d]", order[i]);
                st = tokjson_bad(r, FSDP_STATUS_FORMAT, field, "repeats added token %d ('%.64s')",
                                 a->id, a->content);
            }
        }
    }
    free(order);
    return st;
}

static fsdp_status read_added(tokjson_reader *r, const fsdp_json *arr)
{
    fsdp_hftok *t = r->t;
    if (!arr || arr->type == FSDP_JSON_NULL)
        return FSDP_STATUS_OK;
    FSDP_TRY(tokjson_want(r, arr, FSDP_JSON_ARRAY, "added_tokens"));
    if (!(t->added = calloc(arr->n + 1, sizeof *t->added)))
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory for %zu added tokens", arr->n);
    char field[64], f[96];
    size_t i = 0;
    for (const fsdp_json *a = arr->child; a; a = a->next, i++) {
        snprintf(field, sizeof field, "added_tokens[%zu]", i);
        FSDP_TRY(tokjson_want(r, a, FSDP_JSON_OBJECT, field));
        hftok_added *x = &t->added[t->n_added];
        snprintf(f, sizeof f, "%s.id", field);
        FSDP_TRY(tokjson_as_id(r, fsdp_json_get(a, "id"), f, &x->id));
        snprintf(f, sizeof f, "%s.content", field);
        const fsdp_json *c = fsdp_json_get(a, "content");
        FSDP_TRY(tokjson_want(r, c, FSDP_JSON_STRING, f));
        if (c->len == 0)
            return tokjson_bad(r, FSDP_STATUS_FORMAT, f, "an added token cannot be empty");
        static const char *const flags[] = {"single_word", "lstrip", "rstrip"};
        for (int k = 0; k < 3; k++) {
            bool on;
            snprintf(f, sizeof f, "%s.%s", field, flags[k]);
            FSDP_TRY(tokjson_get_bool(r, a, flags[k], f, false, &on));
            if (on)
                return tokjson_unsupported(r, f, "an added token that absorbs whitespace or "
                                                 "matches whole words only");
        }
        snprintf(f, sizeof f, "%s.special", field);
        FSDP_TRY(tokjson_get_bool(r, a, "special", f, false, &x->special));
        if (!(x->content = malloc(c->len + 1)))
            return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory for added tokens");
        memcpy(x->content, c->str, c->len + 1);
        x->len = c->len;
        t->n_added++;
    }
    return check_repeats(r);
}

/* Make room for `more` bytes (and a NUL) after len in *s. */
static bool reserve(char **s, size_t *cap, size_t len, size_t more)
{
    if (len + more + 1 <= *cap)
        return true;
    size_t c = 2 * (len + more + 1);
    char *p = realloc(*s, c);
    if (!p)
        return false;
    *s = p;
    *cap = c;
    return true;
}

/* Append lit[0..len) to *s as a PCRE2 literal: ASCII punctuation escaped
 * with a backslash, control bytes as \x{..}, everything else as is. */
static bool append_literal(char **s, size_t *n, size_t *cap, const char *lit, size_t len)
{
    if (!reserve(s, cap, *n, 8 * len))
        return false;
    for (size_t i = 0; i < len; i++) {
        unsigned char ch = (unsigned char)lit[i];
        if (ch < 0x20 || ch == 0x7f)
            *n += (size_t)sprintf(*s + *n, "\\x{%x}", ch);
        else if (ch < 0x80 && !((ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'z') ||
                                (ch >= 'A' && ch <= 'Z')))
            *n += (size_t)sprintf(*s + *n, "\\%c", ch);
        else
            (*s)[(*n)++] = (char)ch;
    }
    (*s)[*n] = '\0';
    return true;
}

/* Longest first, then by id. */
static int cmp_longest(const void *a, const void *b, void *ctx)
{
    const hftok_added *added = ctx;
    const hftok_added *x = &added[*(const int *)a], *y = &added[*(const int *)b];
    if (x->len != y->len)
        return x->len > y->len ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

/* The alternation of added tokens (every one, or the non-special ones),
 * longest first so the leftmost match is also the longest there; each
 * alternative marks its index in added[]. */
static fsdp_status compile_added(tokjson_reader *r, bool special_too, pcre2_code **out)
{
    fsdp_hftok *t = r->t;
    *out = NULL;
    int *order = malloc(((size_t)t->n_added + 1) * sizeof *order);
    if (!order)
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory for added tokens");
    int n = 0;
    for (int i = 0; i < t->n_added; i++)
        if (special_too || !t->added[i].special)
            order[n++] = i;
    qsort_r(order, (size_t)n, sizeof *order, cmp_longest, t->added);
    char *pat = NULL;
    size_t len = 0, cap = 0;
    bool ok = true;
    for (int k = 0; k < n && ok; k++) {
        const hftok_added *a = &t->added[order[k]];
        ok = reserve(&pat, &cap, len, 32);
        if (ok) {
            len += (size_t)sprintf(pat + len, "%s(*MARK:%d)", k ? "|" : "", order[k]);
            ok = append_literal(&pat, &len, &cap, a->content, a->len);
        }
    }
    free(order);
    if (!ok) {
        free(pat);
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory for added tokens");
    }
    fsdp_status st = FSDP_STATUS_OK;
    if (n > 0)
        st = fsdp_hftok_compile(t, "added_tokens", pat, len, false, false, out);
    free(pat);
    return st;
}

/* ---- the decode table ------------------------------------------------------------------ */

static fsdp_status build_decode(tokjson_reader *r, const vocab_entry *e, size_t n)
{
    fsdp_hftok *t = r->t;
    int vocab = n ? e[n - 1].id + 1 : 0;
    for (int i = 0; i < t->n_added; i++)
        if (t->added[i].id + 1 > vocab)
            vocab = t->added[i].id + 1;
    size_t n_tokens = n + (size_t)t->n_added;
    if ((size_t)vocab > 2 * n_tokens + 131072) /* holes, but not a huge table from a tiny file */
        return fsdp_error_set(FSDP_STATUS_FORMAT,
                              "tokenizer '%s': ids run up to %d for only %zu tokens; the file "
                              "is corrupt", t->label, vocab - 1, n_tokens);
    t->vocab = vocab;
    /* each id's string, added tokens over the vocabulary */
    const char **str = calloc((size_t)vocab + 1, sizeof *str);
    size_t *len = calloc((size_t)vocab + 1, sizeof *len);
    fsdp_status st = FSDP_STATUS_OK;
    size_t total = 0;
    if (!str || !len)
        goto oom;
    for (size_t i = 0; i < n; i++) {
        str[e[i].id] = e[i].key->key;
        len[e[i].id] = strlen(e[i].key->key);
    }
    for (int i = 0; i < t->n_added; i++) {
        str[t->added[i].id] = t->added[i].content;
        len[t->added[i].id] = t->added[i].len;
    }
    for (int i = 0; i < vocab; i++)
        total += len[i];
    if (total > UINT32_MAX) {
        st = fsdp_error_set(FSDP_STATUS_FORMAT, "tokenizer '%s': the tokens hold %zu bytes, "
                            "more than 4 GiB", t->label, total);
        goto out;
    }
    t->dec_bytes = malloc(total + 1);
    t->dec_off = malloc(((size_t)vocab + 1) * sizeof *t->dec_off);
    if (!t->dec_bytes || !t->dec_off)
        goto oom;
    size_t at = 0;
    for (int i = 0; i < vocab; i++) {
        t->dec_off[i] = (uint32_t)at;
        if (!str[i])
            continue;
        size_t k;
        if (decode_key(r, str[i], len[i], 0, &k) < 0) /* raw UTF-8 when not byte-level */
            goto oom;
        memcpy(t->dec_bytes + at, r->buf, k);
        at += k;
    }
    t->dec_off[vocab] = (uint32_t)at;
    goto out;
oom:
    st = fsdp_error_set(FSDP_STATUS_OOM, "out of host memory for the decoding table");
out:
    free(str);
    free(len);
    return st;
}

/* ---- the whole file -------------------------------------------------------------------- */

static fsdp_status read_root(tokjson_reader *r, const fsdp_json *root)
{
    fsdp_hftok *t = r->t;
    vocab_entry *entries = NULL;
    size_t n_entries = 0;
    fsdp_status st;
    if (root->type != FSDP_JSON_OBJECT)
        return tokjson_bad(r, FSDP_STATUS_FORMAT, "the top level", "expected an object, found %s",
                           fsdp_json_type_name(root->type));
    FSDP_CHECK(read_model(r, fsdp_json_get(root, "model"), &entries, &n_entries));
    FSDP_CHECK(read_added(r, fsdp_json_get(root, "added_tokens")));
    FSDP_CHECK(tokjson_read_normalizer(r, fsdp_json_get(root, "normalizer"), "normalizer"));
    const fsdp_json *pre = fsdp_json_get(root, "pre_tokenizer");
    bool have_bytelevel = false;
    if (pre && pre->type != FSDP_JSON_NULL)
        FSDP_CHECK(tokjson_read_pretok(r, pre, "pre_tokenizer", true, &have_bytelevel));
    if (!have_bytelevel) {
        st = tokjson_unsupported(r, "pre_tokenizer",
                                 "a tokenizer without a ByteLevel pre-tokenizer");
        goto fail;
    }
    FSDP_CHECK(tokjson_read_post(r, fsdp_json_get(root, "post_processor"), "post_processor"));
    const char *dec;
    FSDP_CHECK(tokjson_type_of(r, fsdp_json_get(root, "decoder"), "decoder", &dec));
    if (strcmp(dec, "ByteLevel")) {
        st = tokjson_unsupported(r, "decoder.type", "a decoder other than ByteLevel");
        goto fail;
    }
    FSDP_CHECK(build_decode(r, entries, n_entries));
    /* the post-processor's tokens must be tokens (a file whose added_tokens
     * lost them used to fail at the first encode: "id 659 is outside the
     * vocabulary of 659") */
    for (int k = 0; k < 2; k++) {
        int id = k ? t->eos : t->bos;
        size_t len;
        if (id >= 0 && !fsdp_hftok_token_bytes(t, id, &len)) {
            st = tokjson_bad(r, FSDP_STATUS_FORMAT, "post_processor",
                             "the template puts id %d %s each text, but no token has that id "
                             "(model.vocab and added_tokens hold %d ids); is an added_tokens "
                             "entry missing?", id, k ? "after" : "before", t->vocab);
            goto fail;
        }
    }
    t->eot = t->eos;
    for (size_t i = 0; i < sizeof EOT_NAMES / sizeof *EOT_NAMES && t->eot < 0; i++) {
        int id = fsdp_hftok_added_id(t, EOT_NAMES[i]);
        for (int k = 0; k < t->n_added; k++)
            if (t->added[k].id == id && t->added[k].special)
                t->eot = id;
    }
    FSDP_CHECK(compile_added(r, true, &t->added_re[0]));
    FSDP_CHECK(compile_added(r, false, &t->added_re[1]));
    if (t->added_re[0] && !(t->added_md = pcre2_match_data_create_from_pattern(t->added_re[0],
                                                                                NULL))) {
        st = fsdp_error_set(FSDP_STATUS_OOM, "out of host memory for added tokens");
        goto fail;
    }
    st = FSDP_STATUS_OK;
fail:
    free(entries);
    return st;
}

fsdp_status fsdp_hftok_parse(fsdp_hftok **out, const char *label, const char *json, size_t n)
{
    *out = NULL;
    fsdp_hftok *t = calloc(1, sizeof *t);
    tokjson_reader r = {.t = t};
    if (!t || !(t->label = strdup(label))) {
        free(t);
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory reading '%s'", label);
    }
    t->bos = t->eos = t->eot = -1;
    byte_table(&r);
    fsdp_json *root = NULL;
    fsdp_status st = fsdp_json_parse(json, n, &root);
    if (st != FSDP_STATUS_OK)
        fsdp_error_prefix("tokenizer '%s' is not valid JSON", label);
    else
        st = read_root(&r, root);
    fsdp_json_free(root);
    free(r.buf);
    return FSDP_OUT_OR_FREE(st, out, t, fsdp_hftok_free);
}

fsdp_status fsdp_hftok_open(fsdp_hftok **out, const char *path)
{
    *out = NULL;
    char *buf = NULL;
    size_t n = 0;
    FSDP_TRY(fsdp_read_file(path, "tokenizer", HFTOK_MAX_FILE, &buf, &n));
    fsdp_status st = fsdp_hftok_parse(out, path, buf, n);
    free(buf);
    return st;
}
