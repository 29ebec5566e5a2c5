/*
 * jinja_lex.c - a template's text into tokens (jinja_lex.h): text, and
 * the names, literals and operators of its tags, with Jinja's whitespace
 * rules as transformers configures them (trim_blocks, lstrip_blocks, the
 * - and + signs); and the parser's token cursor and error. Every error
 * names the line.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "core/error.h"
#include "data/jinja_lex.h"

/* ---- errors ----------------------------------------------------------------------------- */

fsdp_status jp_fail(jparser *p, fsdp_status st, int line, const char *fmt, ...)
{
    if (p->st != FSDP_STATUS_OK)
        return p->st;
    va_list ap;
    va_start(ap, fmt);
    p->st = jinja_error_setv(p->tpl->label, line, st, fmt, ap);
    va_end(ap);
    return p->st;
}

fsdp_status jp_oom(jparser *p)
{
    return jp_fail(p, FSDP_STATUS_OOM, 0, "out of host memory parsing the template");
}

void *jp_grow(jparser *p, void *v, int n, int *cap, size_t elem)
{
    if (n < *cap)
        return v;
    int nc = *cap ? 2 * *cap : 8;
    void *nv = jarena_alloc(p->a, (size_t)nc * elem);
    if (!nv)
        return jp_oom(p), NULL;
    if (n)
        memcpy(nv, v, (size_t)n * elem);
    *cap = nc;
    return nv;
}

/* ---- lexer ------------------------------------------------------------------------------ */

static bool push(jparser *p, jtok t)
{
    if (p->n == p->cap) {
        int cap = p->cap ? 2 * p->cap : 256;
        jtok *v = realloc(p->toks, (size_t)cap * sizeof *v);
        if (!v)
            return jp_oom(p), false;
        p->toks = v;
        p->cap = cap;
    }
    p->toks[p->n++] = t;
    return true;
}

static bool is_space(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}
static bool is_alpha(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}
static bool is_digit(char c)
{
    return c >= '0' && c <= '9';
}
static int hexval(char c)
{
    return is_digit(c) ? c - '0' : (c >= 'a' && c <= 'f') ? c - 'a' + 10
                                   : (c >= 'A' && c <= 'F') ? c - 'A' + 10 : -1;
}

/* A string literal at s[*i] (the quote); Python's escapes. */
static bool lex_string(jparser *p, const char *s, size_t n, size_t *i, int *line)
{
    char q = s[*i];
    int start_line = *line;
    size_t j = *i + 1;
    char *o = jarena_alloc(p->a, n - *i + 1); /* decoded is never longer */
    if (!o)
        return jp_oom(p), false;
    size_t k = 0;
    for (;; j++) {
        if (j >= n)
            return jp_fail(p, FSDP_STATUS_FORMAT, start_line, "a string literal is not closed"),
                   false;
        char c = s[j];
        if (c == q)
            break;
        if (c == '\n')
            (*line)++;
        if (c != '\\' || j + 1 >= n) {
            o[k++] = c;
            continue;
        }
        char e = s[++j];
        int digits = e == 'x' ? 2 : e == 'u' ? 4 : e == 'U' ? 8 : 0;
        if (digits) {
            uint32_t cp = 0;
            for (int d = 1; d <= digits; d++) {
                int h = j + (size_t)d < n ? hexval(s[j + (size_t)d]) : -1;
                if (h < 0)
                    return jp_fail(p, FSDP_STATUS_FORMAT, *line, "a bad \\%c escape in a string",
                                   e), false;
                cp = cp * 16 + (uint32_t)h;
            }
            if (cp > 0x10ffff || (cp >= 0xd800 && cp < 0xe000))
                return jp_fail(p, FSDP_STATUS_FORMAT, *line, "a \\%c escape outside Unicode", e),
                       false;
            k += (size_t)utf8proc_encode_char((utf8proc_int32_t)cp, (utf8proc_uint8_t *)o + k);
            j += (size_t)digits;
            continue;
        }
        switch (e) {
        case 'n': o[k++] = '\n'; break;
        case 't': o[k++] = '\t'; break;
        case 'r': o[k++] = '\r'; break;
        case '0': o[k++] = '\0'; break;
        case 'a': o[k++] = '\a'; break;
        case 'b': o[k++] = '\b'; break;
        case 'f': o[k++] = '\f'; break;
        case 'v': o[k++] = '\v'; break;
        case '\\': case '\'': case '"': o[k++] = e; break;
        case '\n': (*line)++; break; /* a line continuation */
        default: o[k++] = '\\'; o[k++] = e; break; /* Python keeps unknown escapes */
        }
    }
    o[k] = '\0';
    *i = j + 1;
    return push(p, (jtok){.t = JT_STR, .line = start_line, .p = o, .n = k});
}

static const char *const OPS2[] = {"**", "//", "==", "!=", "<=", ">="};
static const char OPS1[] = "+-*/%~<>()[]{},.:|=";

/* The tokens of one tag, up to its end (`}}` or `%}`, with a sign) at depth 0.
 * *after_ws: how the text after the tag is trimmed (0 none, 1 one newline, 2 all). */
static bool lex_tag(jparser *p, const char *s, size_t n, size_t *i, int *line, bool var,
                    int *after_ws)
{
    int depth = 0;
    char close = var ? '}' : '%';
    while (*i < n) {
        char c = s[*i];
        if (is_space(c)) {
            *line += c == '\n';
            (*i)++;
            continue;
        }
        if (depth == 0) {
            size_t k = *i;
            char sign = 0;
            if ((c == '-' || (c == '+' && !var)) && k + 2 < n && s[k + 1] == close &&
                s[k + 2] == '}')
                sign = c, k++;
            if (s[k] == close && k + 1 < n && s[k + 1] == '}') {
                *i = k + 2;
                *after_ws = sign == '-' ? 2 : (!var && sign != '+') ? 1 : 0;
                return push(p, (jtok){.t = var ? JT_VEND : JT_BEND, .line = *line});
            }
        }
        if (c == '\'' || c == '"') {
            if (!lex_string(p, s, n, i, line))
                return false;
            continue;
        }
        if (is_alpha(c)) {
            size_t b = *i;
            while (*i < n && (is_alpha(s[*i]) || is_digit(s[*i])))
                (*i)++;
            if (!push(p, (jtok){.t = JT_NAME, .line = *line, .p = s + b, .n = *i - b}))
                return false;
            continue;
        }
        if (is_digit(c)) {
            int64_t v = 0;
            while (*i < n && (is_digit(s[*i]) || s[*i] == '_')) {
                if (s[*i] != '_') {
                    if (v > (INT64_MAX - 9) / 10)
                        return jp_fail(p, FSDP_STATUS_UNSUPPORTED, *line,
                                       "an integer literal too large"), false;
                    v = v * 10 + (s[*i] - '0');
                }
                (*i)++;
            }
            if (*i + 1 < n && (s[*i] == '.' && is_digit(s[*i + 1])))
                return jp_fail(p, FSDP_STATUS_UNSUPPORTED, *line,
                               "floating-point numbers are not supported"), false;
            if (*i < n && (s[*i] == 'e' || s[*i] == 'E'))
                return jp_fail(p, FSDP_STATUS_UNSUPPORTED, *line,
                               "floating-point numbers are not supported"), false;
            if (!push(p, (jtok){.t = JT_INT, .line = *line, .i = v}))
                return false;
            continue;
        }
        size_t len = 0;
        for (size_t k = 0; k < sizeof OPS2 / sizeof *OPS2 && !len; k++)
            if (*i + 1 < n && s[*i] == OPS2[k][0] && s[*i + 1] == OPS2[k][1])
                len = 2;
        if (!len && c && strchr(OPS1, c))
            len = 1;
        if (!len)
            return jp_fail(p, FSDP_STATUS_FORMAT, *line, "unexpected character '%c' in a tag",
                           (c >= 0x20 && c < 0x7f) ? c : '?'), false;
        if (c == '(' || c == '[' || c == '{')
            depth++;
        else if ((c == ')' || c == ']' || c == '}') && depth > 0)
            depth--;
        if (!push(p, (jtok){.t = JT_OP, .line = *line, .p = s + *i, .n = len}))
            return false;
        *i += len;
    }
    return jp_fail(p, FSDP_STATUS_FORMAT, *line, "a %s is not closed", var ? "{{" : "{%"), false;
}

/* Text and tags of the (newline-normalized) source. */
bool jp_lex(jparser *p, const char *s, size_t n)
{
    size_t i = 0;
    int line = 1;
    bool line_starting = true;   /* the previous tag's end took a newline (lstrip_blocks) */
    int after_ws = 0;
    while (i <= n) {
        /* text up to the next opener */
        size_t b = i;
        while (i < n && !(s[i] == '{' && i + 1 < n &&
                          (s[i + 1] == '{' || s[i + 1] == '%' || s[i + 1] == '#')))
            i++;
        const char *tp = s + b;
        size_t tn = i - b;
        int text_line = line;
        for (size_t k = b; k < i; k++)
            line += s[k] == '\n';
        if (after_ws == 2) { /* -%} : all whitespace after the tag */
            while (tn && is_space(*tp))
                text_line += *tp == '\n', tp++, tn--;
        }
        after_ws = 0;
        if (i >= n) {
            if (tn && !push(p, (jtok){.t = JT_TEXT, .line = text_line, .p = tp, .n = tn}))
                return false;
            return push(p, (jtok){.t = JT_EOF, .line = line});
        }
        char kind = s[i + 1];
        size_t k = i + 2;
        char sign = (k < n && (s[k] == '-' || s[k] == '+')) ? s[k] : 0;
        if (sign)
            k++;
        if (sign == '-') {
            while (tn && is_space(tp[tn - 1]))
                tn--;
        } else if (kind != '{' && sign != '+') { /* lstrip_blocks */
            size_t l = tn;
            while (l && tp[l - 1] != '\n')
                l--;
            bool ws = l < tn;
            for (size_t q = l; q < tn && ws; q++)
                ws = tp[q] == ' ' || tp[q] == '\t' || tp[q] == '\v' || tp[q] == '\f' ||
                     tp[q] == '\r';
            if (ws && (l > 0 || line_starting))
                tn = l;
        }
        if (tn && !push(p, (jtok){.t = JT_TEXT, .line = text_line, .p = tp, .n = tn}))
            return false;
        i = k;
        if (kind == '#') { /* a comment: dropped */
            const char *e = NULL;
            for (size_t q = i; q + 1 < n && !e; q++)
                if (s[q] == '#' && s[q + 1] == '}')
                    e = s + q;
            if (!e)
                return jp_fail(p, FSDP_STATUS_FORMAT, line, "a {# comment is not closed"), false;
            for (const char *q = s + i; q < e; q++)
                line += *q == '\n';
            char esign = (e > s + i && (e[-1] == '-' || e[-1] == '+')) ? e[-1] : 0;
            i = (size_t)(e - s) + 2;
            after_ws = esign == '-' ? 2 : esign == '+' ? 0 : 1;
        } else {
            if (!push(p, (jtok){.t = kind == '{' ? JT_VBEGIN : JT_BBEGIN, .line = line}))
                return false;
            if (!lex_tag(p, s, n, &i, &line, kind == '{', &after_ws))
                return false;
        }
        line_starting = false;
        if (after_ws == 1) { /* trim_blocks: one newline after a block or comment */
            if (i < n && s[i] == '\n') {
                i++;
                line++;
                line_starting = true;
            }
            after_ws = 0;
        } else if (after_ws == 2) {
            size_t q = i;
            while (q < n && is_space(s[q]))
                q++;
            line_starting = q > i && s[q - 1] == '\n';
        }
    }
    return push(p, (jtok){.t = JT_EOF, .line = line});
}

/* ---- the token cursor ------------------------------------------------------------------- */

const char *jp_describe(const jtok *t, char *buf, size_t n)
{
    switch (t->t) {
    case JT_EOF: return "the end of the template";
    case JT_TEXT: return "text";
    case JT_VBEGIN: return "'{{'";
    case JT_VEND: return "'}}'";
    case JT_BBEGIN: return "'{%'";
    case JT_BEND: return "'%}'";
    case JT_INT: return "a number";
    case JT_STR: return "a string";
    default: snprintf(buf, n, "'%.*s'", (int)(t->n < 40 ? t->n : 40), t->p); return buf;
    }
}

bool jp_expect_op(jparser *p, const char *op)
{
    if (jp_skip_op(p, op))
        return true;
    char b[64];
    return jp_fail(p, FSDP_STATUS_FORMAT, jp_cur(p)->line, "expected '%s', found %s", op,
                   jp_describe(jp_cur(p), b, sizeof b)), false;
}

const char *jp_name_dup(jparser *p, const jtok *t)
{
    const char *s = jarena_strdup(p->a, t->p, t->n);
    if (!s)
        jp_oom(p);
    return s;
}

bool jp_expect_name(jparser *p, const char **out)
{
    if (jp_cur(p)->t != JT_NAME) {
        char b[64];
        return jp_fail(p, FSDP_STATUS_FORMAT, jp_cur(p)->line, "expected a name, found %s",
                       jp_describe(jp_cur(p), b, sizeof b)), false;
    }
    *out = jp_name_dup(p, jp_cur(p));
    p->at++;
    return *out != NULL;
}

bool jp_enter(jparser *p)
{
    if (++p->depth > JP_MAX_DEPTH) {
        jp_fail(p, FSDP_STATUS_UNSUPPORTED, jp_cur(p)->line, "nesting deeper than %d",
                JP_MAX_DEPTH);
        return false;
    }
    return true;
}

