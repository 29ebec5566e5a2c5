/*
 * hftok.c - encoding and decoding with a Hugging Face byte-level BPE
 * tokenizer (hftok.h); the file is read by tokjson.c.
 *
 * Encoding, in the reference library's order:
 *   1. added tokens are found in the raw text (one PCRE2 alternation of
 *      literals, longest first: leftmost, then longest); each becomes its
 *      id, the text between them goes on;
 *   2. NFC normalization (utf8proc), when the tokenizer asks for it;
 *   3. the pre-tokenizer steps, each splitting every piece of the step
 *      before (Split patterns, Digits, ByteLevel's GPT-2 pattern);
 *   4. BPE on each final piece's bytes (bpe.c).
 * The recursion over steps keeps nothing but one piece per level, and ids
 * are handed to the caller's sink in chunks, so a gigabyte text encodes in
 * bounded memory (beyond the text itself and, with NFC, its normalized
 * copy).
 *
 * Differences from the reference, by design: added tokens are matched
 * before normalization even when marked "normalized" (the same for NFC
 * and the ASCII special tokens of these families); PCRE2 10.42 (Debian 12)
 * knows Unicode 14, the reference's Oniguruma Unicode 16, so \p{L} and
 * \p{N} miss the ~9,400 characters assigned since (CJK extension I,
 * Kawi, ...), which then split differently but still encode losslessly.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <utf8proc.h>

#include "core/error.h"
#include "data/hftok_internal.h"

#define FLUSH_IDS 65536  /* ids handed to the sink at a time */

/* ---- patterns ------------------------------------------------------------------------ */

/* Copy pattern p[0..n) with \s -> \p{White_Space} and \S ->
 * \P{White_Space} outside \Q..\E; other escapes are copied as they are.
 * Returns a malloc'd string (length in *out_n) or NULL. */
static char *rewrite_spaces(const char *p, size_t n, size_t *out_n)
{
    char *o = malloc(8 * n + 1);
    if (!o)
        return NULL;
    size_t k = 0;
    bool quoted = false;
    for (size_t i = 0; i < n; i++) {
        if (p[i] != '\\' || i + 1 == n) {
            o[k++] = p[i];
            continue;
        }
        char c = p[++i];
        if (quoted) {
            quoted = c != 'E';
            o[k++] = '\\';
            o[k++] = c;
        } else if (c == 's' || c == 'S') {
            k += (size_t)sprintf(o + k, "\\%c{White_Space}", c == 's' ? 'p' : 'P');
        } else {
            quoted = c == 'Q';
            o[k++] = '\\';
            o[k++] = c;
        }
    }
    o[k] = '\0';
    *out_n = k;
    return o;
}

fsdp_status fsdp_hftok_compile(const fsdp_hftok *t, const char *field, const char *pattern,
                               size_t len, bool literal, bool split, pcre2_code **out)
{
    size_t n = len;
    char *pat = literal ? NULL : rewrite_spaces(pattern, len, &n);
    if (!literal && !pat)
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory compiling a pattern");
    uint32_t opts = PCRE2_UTF | PCRE2_MATCH_INVALID_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP) |
                    (split ? PCRE2_USE_OFFSET_LIMIT : 0);
    int err;
    PCRE2_SIZE at;
    *out = pcre2_compile((PCRE2_SPTR)(literal ? pattern : pat), n, opts, &err, &at, NULL);
    free(pat);
    if (!*out) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        return fsdp_error_set(FSDP_STATUS_FORMAT,
                              "tokenizer '%s': %s: the pattern does not compile (PCRE2, near "
                              "byte %zu): %s", t->label, field, (size_t)at, (const char *)msg);
    }
    /* without JIT the interpreter runs it */
    pcre2_jit_compile(*out, PCRE2_JIT_COMPLETE | (split ? PCRE2_JIT_PARTIAL_HARD : 0));
    return FSDP_STATUS_OK;
}

/* First match of re in s[0..n) at or after pos: *a, *b its span; false
 * when there is none. A JIT stack overflow (long runs of one class) is
 * retried on the interpreter, which uses the heap. */
static fsdp_status find(const fsdp_hftok *t, pcre2_code *re, pcre2_match_data *md,
                        const uint8_t *s, size_t n, size_t pos, size_t *a, size_t *b,
                        bool *found)
{
    int rc = pcre2_match(re, s, n, pos, 0, md, NULL);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT)
        rc = pcre2_match(re, s, n, pos, PCRE2_NO_JIT, md, NULL);
    *found = rc >= 0;
    if (rc == PCRE2_ERROR_NOMATCH || rc == PCRE2_ERROR_PARTIAL)
        return FSDP_STATUS_OK;
    if (rc < 0) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(rc, msg, sizeof msg);
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "tokenizer '%s': a split pattern failed on a %zu-byte piece of "
                              "text: %s", t->label, n, (const char *)msg);
    }
    const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
    *a = ov[0];
    *b = ov[1];
    return FSDP_STATUS_OK;
}

/* ---- split steps: matching in windows, within a time budget ------------------------- */

/* PCRE2's own limits hold for one match, and a pattern that backtracks
 * quadratically (a nested or recursive repeat: "(a(?R)?b)", "(?:a|b)+\d")
 * stays under them at every call while a 30 KB text takes a minute. So a
 * split step matches in windows: the subject ends SPLIT_WINDOW bytes (at a
 * character boundary) past the position, matched with PCRE2_PARTIAL_HARD,
 * so a match that would look past the window's end comes back partial and
 * is tried again from where it started in a window twice as large; a
 * result that is not partial never looked past the end and is what the
 * whole text gives. An offset limit keeps the start positions one call
 * tries to SPLIT_SCAN / window, and the depth limit (interpreter only) to a
 * few times the window, which non-recursive patterns never need. Each call
 * is thus bounded, and the time the text has taken to encode is checked
 * after every call that did not simply find a match in the first window
 * (and every SPLIT_CHECK calls) against SPLIT_BASE_S + SPLIT_PER_MIB_S per
 * MiB of it: past that the encode fails naming the pattern (legitimate
 * tokenizers encode a MiB in well under a tenth of a second). */
#define SPLIT_WINDOW 1024               /* first window, bytes */
#define SPLIT_SCAN ((size_t)1 << 22)    /* start positions x window bytes per call */
#define SPLIT_BASE_S 2.0
#define SPLIT_PER_MIB_S 2.0
#define SPLIT_CHECK 32                  /* calls between looks at the clock, at most */

/* Seconds on the coarse monotonic clock (cheap enough for every match). */
static double coarse_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The message for a split step's failed match (rc < 0). */
static fsdp_status split_error(const fsdp_hftok *t, const hftok_step *st, size_t n, int rc)
{
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(rc, msg, sizeof msg);
    return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                          "tokenizer '%s': split pattern '%.80s' (%s) failed on a %zu-byte "
                          "piece of text: %s; the pattern backtracks too much (a nested or "
                          "recursive repeat): fix it in the tokenizer file",
                          t->label, st->pattern, st->field, n, (const char *)msg);
}

/* The first match of step st's pattern in s[0..n) at or after pos, as find
 * gives it, in windows of *w bytes (grown as matches need; see above). */
static fsdp_status split_find(fsdp_hftok *t, const hftok_step *st, const uint8_t *s, size_t n,
                              size_t pos, size_t *w, size_t *a, size_t *b, bool *found)
{
    *found = false;
    for (;;) {
        size_t end = n - pos > *w ? pos + *w : n;
        while (end < n && end > pos + 1 && (s[end] & 0xc0) == 0x80)
            end--; /* a window ends between characters */
        size_t starts = SPLIT_SCAN / *w > 0 ? SPLIT_SCAN / *w : 1;
        pcre2_set_offset_limit(t->mctx, pos + starts);
        pcre2_set_depth_limit(t->mctx, *w < (1u << 29) ? (uint32_t)(4 * *w + 1024) : UINT32_MAX);
        uint32_t opts = end < n ? PCRE2_PARTIAL_HARD : 0;
        int rc = pcre2_match(st->re, s, end, pos, opts, st->md, t->mctx);
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT)
            rc = pcre2_match(st->re, s, end, pos, opts | PCRE2_NO_JIT, st->md, t->mctx);
        bool plain = rc >= 0 && *w == SPLIT_WINDOW; /* the common case: cheap */
        if ((!plain || ++t->match_calls % SPLIT_CHECK == 0) &&
            coarse_s() - t->match_t0 > t->match_budget_s)
            return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                                  "tokenizer '%s': split pattern '%.80s' (%s) was still matching "
                                  "after %.1f s on one text of %.2f MiB (the limit: %.0f s + %.0f "
                                  "s per MiB): it backtracks too much on this text (a nested or "
                                  "recursive repeat); fix it in the tokenizer file",
                                  t->label, st->pattern, st->field, t->match_budget_s,
                                  (t->match_budget_s - SPLIT_BASE_S) / SPLIT_PER_MIB_S,
                                  SPLIT_BASE_S, SPLIT_PER_MIB_S);
        const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(st->md);
        if (rc == PCRE2_ERROR_PARTIAL) { /* it needs more text: again from its start */
            pos = ov[0];
            *w *= 2;
        } else if (rc == PCRE2_ERROR_NOMATCH) { /* none starts at pos .. pos + starts */
            if (pos + starts >= end && end == n)
                return FSDP_STATUS_OK;
            pos = pos + starts < end ? pos + starts + 1 : end;
        } else if (rc < 0) {
            return split_error(t, st, n, rc);
        } else {
            *a = ov[0];
            *b = ov[1];
            *found = true;
            return FSDP_STATUS_OK;
        }
    }
}

/* Length of the UTF-8 character at s[0] (1 for an invalid byte). */
static size_t char_len(const uint8_t *s, size_t n)
{
    utf8proc_int32_t cp;
    utf8proc_ssize_t k = utf8proc_iterate(s, (utf8proc_ssize_t)n, &cp);
    return k > 0 ? (size_t)k : 1;
}

/* ---- encoding -------------------------------------------------------------------------- */

static fsdp_status flush(fsdp_hftok *t, size_t done)
{
    if (t->out.n == 0)
        return FSDP_STATUS_OK;
    fsdp_status st = t->sink(t->sink_arg, t->out.p, t->out.n, done);
    t->out.n = 0;
    return st;
}

/* How far through the input the encoder is, at position p of the segment
 * being pre-tokenized (scaled when the segment was normalized). */
static size_t progress(const fsdp_hftok *t, const uint8_t *p)
{
    const uint8_t *base = (const uint8_t *)t->seg_base;
    if (p < base || p > base + t->seg_len) /* inside a step's own buffer */
        return t->seg_start;
    size_t at = (size_t)(p - base);
    if (t->seg_len != t->seg_src_len && t->seg_len > 0)
        at = (size_t)((double)at * (double)t->seg_src_len / (double)t->seg_len);
    return t->seg_start + at;
}

/* Pre-tokenizer step k on piece p[0..n); past the last step, BPE. */
static fsdp_status pretok(fsdp_hftok *t, int k, const uint8_t *p, size_t n)
{
    if (n == 0)
        return FSDP_STATUS_OK;
    if (k == t->n_steps) {
        FSDP_TRY(fsdp_bpe_encode_word(t->bpe, p, n, &t->out));
        return FSDP_STATUS_OK;
    }
    hftok_step *s = &t->steps[k];
    if (s->prefix_space && p[0] != ' ') {
        if (n + 1 > s->buf_cap) {
            uint8_t *b = realloc(s->buf, 2 * (n + 1));
            if (!b)
                return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory encoding text");
            s->buf = b;
            s->buf_cap = 2 * (n + 1);
        }
        s->buf[0] = ' ';
        memcpy(s->buf + 1, p, n);
        p = s->buf;
        n++;
    }
    if (!s->re)
        return pretok(t, k + 1, p, n);
    size_t pos = 0, gap = 0, a, b, w = SPLIT_WINDOW;
    bool found;
    while (pos < n) {
        FSDP_TRY(split_find(t, s, p, n, pos, &w, &a, &b, &found));
        if (!found)
            break;
        if (b == a) { /* an empty match splits nothing: look again one character on */
            pos = a + char_len(p + a, n - a);
            continue;
        }
        FSDP_TRY(pretok(t, k + 1, p + gap, a - gap));
        if (s->behavior == HFTOK_ISOLATED)
            FSDP_TRY(pretok(t, k + 1, p + a, b - a));
        gap = pos = b;
        if (k == 0 && t->out.n >= FLUSH_IDS)
            FSDP_TRY(flush(t, progress(t, p + b)));
    }
    return pretok(t, k + 1, p + gap, n - gap);
}

/* NFC of s[0..n) into *out (malloc'd, *out_n bytes): each maximal valid
 * UTF-8 run is normalized, invalid bytes are kept as they are. */
static fsdp_status nfc(const uint8_t *s, size_t n, uint8_t **out, size_t *out_n)
{
    size_t cap = n + n / 2 + 16, k = 0;
    uint8_t *o = malloc(cap);
    if (!o)
        goto oom;
    for (size_t i = 0; i < n;) {
        size_t j = i;
        utf8proc_int32_t cp;
        for (utf8proc_ssize_t step; j < n; j += (size_t)step)
            if ((step = utf8proc_iterate(s + j, (utf8proc_ssize_t)(n - j), &cp)) <= 0)
                break;
        utf8proc_uint8_t *norm = NULL;
        utf8proc_ssize_t m = 0;
        if (j > i) {
            m = utf8proc_map(s + i, (utf8proc_ssize_t)(j - i), &norm,
                             UTF8PROC_STABLE | UTF8PROC_COMPOSE);
            if (m < 0) {
                free(o);
                return fsdp_error_set(m == UTF8PROC_ERROR_NOMEM ? FSDP_STATUS_OOM
                                                                 : FSDP_STATUS_INTERNAL,
                                      "NFC normalization of %zu bytes failed: %s", j - i,
                                      utf8proc_errmsg(m));
            }
        }
        size_t need = k + (size_t)m + 1;
        if (need > cap) {
            cap = 2 * need;
            uint8_t *g = realloc(o, cap);
            if (!g) {
                free(norm);
                goto oom;
            }
            o = g;
        }
        if (m > 0)
            memcpy(o + k, norm, (size_t)m);
        k += (size_t)m;
        free(norm);
        if (j < n)
            o[k++] = s[j++]; /* one invalid byte */
        i = j;
    }
    *out = o;
    *out_n = k;
    return FSDP_STATUS_OK;
oom:
    free(o);
    return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory normalizing %zu bytes", n);
}

static bool is_ascii(const uint8_t *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (s[i] & 0x80)
            return false;
    return true;
}

/* Normalize and pre-tokenize text[start .. start+len): text between added
 * tokens. */
static fsdp_status encode_segment(fsdp_hftok *t, const char *text, size_t start, size_t len)
{
    const uint8_t *p = (const uint8_t *)text + start;
    uint8_t *norm = NULL;
    size_t n = len;
    if (t->nfc && !is_ascii(p, len)) /* ASCII is its own NFC */
        FSDP_TRY(nfc(p, len, &norm, &n));
    t->seg_base = norm ? (const char *)norm : (const char *)p;
    t->seg_len = n;
    t->seg_src_len = len;
    t->seg_start = start;
    fsdp_status st = pretok(t, 0, (const uint8_t *)t->seg_base, n);
    free(norm);
    return st;
}

fsdp_status fsdp_hftok_encode_stream(fsdp_hftok *t, const char *text, size_t len,
                                     unsigned flags, fsdp_hftok_sink sink, void *arg)
{
    t->sink = sink;
    t->sink_arg = arg;
    t->out.n = 0;
    if (!t->mctx && !(t->mctx = pcre2_match_context_create(NULL)))
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory for a match context");
    t->match_t0 = coarse_s();
    t->match_calls = 0;
    t->match_budget_s = SPLIT_BASE_S + SPLIT_PER_MIB_S * (double)len / (double)(1 << 20);
    FSDP_TRY(fsdp_ids_reserve(&t->out, FLUSH_IDS));
    pcre2_code *re = t->added_re[(flags & FSDP_HFTOK_SPLIT_SPECIAL) ? 1 : 0];
    const uint8_t *s = (const uint8_t *)text;
    size_t pos = 0, a, b;
    bool found;
    while (re && pos < len) {
        FSDP_TRY(find(t, re, t->added_md, s, len, pos, &a, &b, &found));
        if (!found)
            break;
        FSDP_TRY(encode_segment(t, text, pos, a - pos));
        int which = atoi((const char *)pcre2_get_mark(t->added_md));
        FSDP_TRY(fsdp_ids_reserve(&t->out, 1));
        t->out.p[t->out.n++] = t->added[which].id;
        pos = b;
        if (t->out.n >= FLUSH_IDS)
            FSDP_TRY(flush(t, pos));
    }
    FSDP_TRY(encode_segment(t, text, pos, len - pos));
    return flush(t, len);
}

static fsdp_status append_ids(void *arg, const int *ids, size_t n, size_t done)
{
    return fsdp_ids_append(arg, ids, n);
}

fsdp_status fsdp_hftok_encode(fsdp_hftok *t, const char *text, size_t len, unsigned flags,
                              int **ids, size_t *n_ids)
{
    fsdp_ids v = {0};
    fsdp_status st = fsdp_hftok_encode_stream(t, text, len, flags, append_ids, &v);
    if (st != FSDP_STATUS_OK) {
        fsdp_ids_free(&v);
        *ids = NULL;
        *n_ids = 0;
        return st;
    }
    *ids = v.p;
    *n_ids = v.n;
    return FSDP_STATUS_OK;
}

fsdp_status fsdp_hftok_next_special(fsdp_hftok *t, const char *text, size_t len, size_t from,
                                    size_t *begin, size_t *end, int *id)
{
    const uint8_t *s = (const uint8_t *)text;
    size_t a, b;
    bool found;
    *id = -1;
    while (t->added_re[0] && from < len) {
        FSDP_TRY(find(t, t->added_re[0], t->added_md, s, len, from, &a, &b, &found));
        if (!found)
            break;
        int which = atoi((const char *)pcre2_get_mark(t->added_md));
        if (t->added[which].special) {
            *begin = a;
            *end = b;
            *id = t->added[which].id;
            break;
        }
        from = b;
    }
    return FSDP_STATUS_OK;
}

/* ---- decoding and lookups ------------------------------------------------------------------ */

const uint8_t *fsdp_hftok_token_bytes(const fsdp_hftok *t, int id, size_t *len)
{
    if (id < 0 || id >= t->vocab || t->dec_off[id + 1] == t->dec_off[id])
        return NULL;
    *len = t->dec_off[id + 1] - t->dec_off[id];
    return t->dec_bytes + t->dec_off[id];
}

fsdp_status fsdp_hftok_decode(const fsdp_hftok *t, const int *ids, size_t n, char **text,
                              size_t *len)
{
    *text = NULL;
    *len = 0;
    size_t total = 0, k;
    for (size_t i = 0; i < n; i++) {
        if (!fsdp_hftok_token_bytes(t, ids[i], &k))
            return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                                  "token id %d (position %zu) has no token in tokenizer '%s' "
                                  "(vocabulary of %d)", ids[i], i, t->label, t->vocab);
        total += k;
    }
    char *out = malloc(total + 1);
    if (!out)
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory decoding %zu tokens", n);
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        const uint8_t *b = fsdp_hftok_token_bytes(t, ids[i], &k);
        memcpy(out + at, b, k);
        at += k;
    }
    out[at] = '\0';
    *text = out;
    *len = at;
    return FSDP_STATUS_OK;
}

int fsdp_hftok_vocab(const fsdp_hftok *t) { return t->vocab; }
int fsdp_hftok_bos(const fsdp_hftok *t) { return t->bos; }
int fsdp_hftok_eot(const fsdp_hftok *t) { return t->eot; }

int fsdp_hftok_added_id(const fsdp_hftok *t, const char *content)
{
    size_t n = strlen(content);
    for (int i = 0; i < t->n_added; i++)
        if (t->added[i].len == n && !memcmp(t->added[i].content, content, n))
            return t->added[i].id;
    return -1;
}

int fsdp_hftok_token_id(const fsdp_hftok *t, const char *content)
{
    int id = fsdp_hftok_added_id(t, content);
    return id >= 0 ? id : fsdp_bpe_find(t->bpe, (const uint8_t *)content, strlen(content));
}

void fsdp_hftok_free(fsdp_hftok *t)
{
    if (!t)
        return;
    for (int i = 0; i < HFTOK_MAX_STEPS; i++) {
        pcre2_code_free(t->steps[i].re);
        pcre2_match_data_free(t->steps[i].md);
        free(t->steps[i].buf);
        free(t->steps[i].pattern);
        free(t->steps[i].field);
    }
    pcre2_match_context_free(t->mctx);
    for (int i = 0; i < 2; i++)
        pcre2_code_free(t->added_re[i]);
    pcre2_match_data_free(t->added_md);
    for (int i = 0; i < t->n_added; i++)
        free(t->added[i].content);
    free(t->added);
    fsdp_bpe_free(t->bpe);
    free(t->dec_bytes);
    free(t->dec_off);
    fsdp_ids_free(&t->out);
    free(t->label);
    free(t);
}
