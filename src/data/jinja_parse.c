/*
 * jinja_parse.c - a template's text into the syntax tree (jinja_internal.h):
 * a lexer that applies Jinja's whitespace rules as transformers configures
 * them (trim_blocks, lstrip_blocks, the - and + signs), then a recursive
 * descent parser with Jinja's operator precedence:
 *
 *   cond:    or ['if' or ['else' cond]]
 *   or:      and {'or' and}          and:  not {'and' not}
 *   not:     'not' not | compare     compare: sum {(== != < <= > >= in 'not in') sum}
 *   sum:     concat {(+ -) concat}   concat:  product {'~' product}
 *   product: unary {(* // %) unary}  unary:   '-' unary | primary postfix {filter | test | call}
 *
 * Nesting is bounded (JP_MAX_DEPTH) so a hostile template cannot overflow
 * the stack, and every error names the line.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "data/jinja_builtin.h"

#define JP_MAX_DEPTH 128

typedef enum ttype {
    T_EOF = 0, T_TEXT, T_VBEGIN, T_VEND, T_BBEGIN, T_BEND, T_NAME, T_INT, T_STR, T_OP,
} ttype;

typedef struct tok {
    ttype t;
    int line;
    const char *p;            /* T_TEXT, T_NAME, T_STR (decoded, in the arena), T_OP */
    size_t n;
    int64_t i;
} tok;

typedef struct parser {
    fsdp_jinja *tpl;
    jarena *a;
    tok *toks;
    int n, cap, at;
    int depth;
    fsdp_status st;
} parser;

__attribute__((format(printf, 4, 5))) static fsdp_status perr(parser *p, fsdp_status st, int line,
                                                              const char *fmt, ...)
{
    if (p->st != FSDP_STATUS_OK)
        return p->st;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    p->st = fsdp_error_set(st, "chat template %s, line %d: %s", p->tpl->label, line, msg);
    return p->st;
}

static fsdp_status oom(parser *p)
{
    return perr(p, FSDP_STATUS_OOM, 0, "out of host memory parsing the template");
}

/* ---- lexer ------------------------------------------------------------------------------ */

static bool push(parser *p, tok t)
{
    if (p->n == p->cap) {
        int cap = p->cap ? 2 * p->cap : 256;
        tok *v = realloc(p->toks, (size_t)cap * sizeof *v);
        if (!v)
            return oom(p), false;
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

static size_t put_utf8(char *o, uint32_t cp)
{
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xc0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xe0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
        o[2] = (char)(0x80 | (cp & 0x3f));
        return 3;
    }
    o[0] = (char)(0xf0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
    o[3] = (char)(0x80 | (cp & 0x3f));
    return 4;
}

/* A string literal at s[*i] (the quote); Python's escapes. */
static bool lex_string(parser *p, const char *s, size_t n, size_t *i, int *line)
{
    char q = s[*i];
    int start_line = *line;
    size_t j = *i + 1;
    char *o = jarena_alloc(p->a, n - *i + 1); /* decoded is never longer */
    if (!o)
        return oom(p), false;
    size_t k = 0;
    for (;; j++) {
        if (j >= n)
            return perr(p, FSDP_STATUS_FORMAT, start_line, "a string literal is not closed"),
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
                    return perr(p, FSDP_STATUS_FORMAT, *line, "a bad \\%c escape in a string",
                                e), false;
                cp = cp * 16 + (uint32_t)h;
            }
            if (cp > 0x10ffff || (cp >= 0xd800 && cp < 0xe000))
                return perr(p, FSDP_STATUS_FORMAT, *line, "a \\%c escape outside Unicode", e),
                       false;
            k += put_utf8(o + k, cp);
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
    return push(p, (tok){.t = T_STR, .line = start_line, .p = o, .n = k});
}

static const char *const OPS2[] = {"**", "//", "==", "!=", "<=", ">="};
static const char OPS1[] = "+-*/%~<>()[]{},.:|=";

/* The tokens of one tag, up to its end (`}}` or `%}`, with a sign) at depth 0.
 * *after_ws: how the text after the tag is trimmed (0 none, 1 one newline, 2 all). */
static bool lex_tag(parser *p, const char *s, size_t n, size_t *i, int *line, bool var,
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
                return push(p, (tok){.t = var ? T_VEND : T_BEND, .line = *line});
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
            if (!push(p, (tok){.t = T_NAME, .line = *line, .p = s + b, .n = *i - b}))
                return false;
            continue;
        }
        if (is_digit(c)) {
            int64_t v = 0;
            while (*i < n && (is_digit(s[*i]) || s[*i] == '_')) {
                if (s[*i] != '_') {
                    if (v > (INT64_MAX - 9) / 10)
                        return perr(p, FSDP_STATUS_UNSUPPORTED, *line,
                                    "an integer literal too large"), false;
                    v = v * 10 + (s[*i] - '0');
                }
                (*i)++;
            }
            if (*i + 1 < n && (s[*i] == '.' && is_digit(s[*i + 1])))
                return perr(p, FSDP_STATUS_UNSUPPORTED, *line,
                            "floating-point numbers are not supported"), false;
            if (*i < n && (s[*i] == 'e' || s[*i] == 'E'))
                return perr(p, FSDP_STATUS_UNSUPPORTED, *line,
                            "floating-point numbers are not supported"), false;
            if (!push(p, (tok){.t = T_INT, .line = *line, .i = v}))
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
            return perr(p, FSDP_STATUS_FORMAT, *line, "unexpected character '%c' in a tag",
                        (c >= 0x20 && c < 0x7f) ? c : '?'), false;
        if (c == '(' || c == '[' || c == '{')
            depth++;
        else if ((c == ')' || c == ']' || c == '}') && depth > 0)
            depth--;
        if (!push(p, (tok){.t = T_OP, .line = *line, .p = s + *i, .n = len}))
            return false;
        *i += len;
    }
    return perr(p, FSDP_STATUS_FORMAT, *line, "a %s is not closed", var ? "{{" : "{%"), false;
}

/* Text and tags of the (newline-normalized) source. */
static bool lex(parser *p, const char *s, size_t n)
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
            if (tn && !push(p, (tok){.t = T_TEXT, .line = text_line, .p = tp, .n = tn}))
                return false;
            return push(p, (tok){.t = T_EOF, .line = line});
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
        if (tn && !push(p, (tok){.t = T_TEXT, .line = text_line, .p = tp, .n = tn}))
            return false;
        i = k;
        if (kind == '#') { /* a comment: dropped */
            const char *e = NULL;
            for (size_t q = i; q + 1 < n && !e; q++)
                if (s[q] == '#' && s[q + 1] == '}')
                    e = s + q;
            if (!e)
                return perr(p, FSDP_STATUS_FORMAT, line, "a {# comment is not closed"), false;
            for (const char *q = s + i; q < e; q++)
                line += *q == '\n';
            char esign = (e > s + i && (e[-1] == '-' || e[-1] == '+')) ? e[-1] : 0;
            i = (size_t)(e - s) + 2;
            after_ws = esign == '-' ? 2 : esign == '+' ? 0 : 1;
        } else {
            if (!push(p, (tok){.t = kind == '{' ? T_VBEGIN : T_BBEGIN, .line = line}))
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
    return push(p, (tok){.t = T_EOF, .line = line});
}

/* ---- parser helpers --------------------------------------------------------------------- */

static tok *cur(parser *p)
{
    return &p->toks[p->at];
}
static bool is_op(const tok *t, const char *op)
{
    return t->t == T_OP && t->n == strlen(op) && !memcmp(t->p, op, t->n);
}
static bool is_name(const tok *t, const char *name)
{
    return t->t == T_NAME && t->n == strlen(name) && !memcmp(t->p, name, t->n);
}
static bool skip_op(parser *p, const char *op)
{
    if (!is_op(cur(p), op))
        return false;
    p->at++;
    return true;
}
static bool skip_name(parser *p, const char *name)
{
    if (!is_name(cur(p), name))
        return false;
    p->at++;
    return true;
}

static const char *describe(const tok *t, char *buf, size_t n)
{
    switch (t->t) {
    case T_EOF: return "the end of the template";
    case T_TEXT: return "text";
    case T_VBEGIN: return "'{{'";
    case T_VEND: return "'}}'";
    case T_BBEGIN: return "'{%'";
    case T_BEND: return "'%}'";
    case T_INT: return "a number";
    case T_STR: return "a string";
    default: snprintf(buf, n, "'%.*s'", (int)(t->n < 40 ? t->n : 40), t->p); return buf;
    }
}

static bool expect_op(parser *p, const char *op)
{
    if (skip_op(p, op))
        return true;
    char b[64];
    return perr(p, FSDP_STATUS_FORMAT, cur(p)->line, "expected '%s', found %s", op,
                describe(cur(p), b, sizeof b)), false;
}

static const char *name_dup(parser *p, const tok *t)
{
    const char *s = jarena_strdup(p->a, t->p, t->n);
    if (!s)
        oom(p);
    return s;
}

static bool expect_name(parser *p, const char **out)
{
    if (cur(p)->t != T_NAME) {
        char b[64];
        return perr(p, FSDP_STATUS_FORMAT, cur(p)->line, "expected a name, found %s",
                    describe(cur(p), b, sizeof b)), false;
    }
    *out = name_dup(p, cur(p));
    p->at++;
    return *out != NULL;
}

static jx *node(parser *p, jx_kind k, int line)
{
    jx *x = jarena_alloc(p->a, sizeof *x);
    if (!x)
        return oom(p), NULL;
    x->kind = k;
    x->line = line;
    return x;
}

static bool mention(parser *p, const char *name)
{
    fsdp_jinja *t = p->tpl;
    for (int i = 0; i < t->n_names; i++)
        if (!strcmp(t->names[i], name))
            return true;
    if ((t->n_names & (t->n_names - 1)) == 0) { /* a power of two (or 0): grow */
        const char **v = jarena_alloc(p->a, (size_t)(t->n_names ? 2 * t->n_names : 8) *
                                                sizeof *v);
        if (!v)
            return oom(p), false;
        if (t->n_names)
            memcpy(v, t->names, (size_t)t->n_names * sizeof *v);
        t->names = v;
    }
    t->names[t->n_names++] = name;
    return true;
}

/* ---- expressions ------------------------------------------------------------------------ */

static jx *parse_expr(parser *p);
static jx *parse_or(parser *p);
static jx *parse_unary(parser *p, bool with_filter);

static bool enter(parser *p)
{
    if (++p->depth > JP_MAX_DEPTH) {
        perr(p, FSDP_STATUS_UNSUPPORTED, cur(p)->line, "nesting deeper than %d", JP_MAX_DEPTH);
        return false;
    }
    return true;
}

/* Arguments of a call, filter or test after '(': positional, then name=value. */
static bool parse_args(parser *p, jx *x)
{
    jx *args[64], *kw[16];
    const char *kw_names[16];
    int n = 0, nk = 0;
    while (!is_op(cur(p), ")")) {
        if (n + nk > 0 && !expect_op(p, ","))
            return false;
        if (is_op(cur(p), ")"))
            break;
        if (is_op(cur(p), "*") || is_op(cur(p), "**"))
            return perr(p, FSDP_STATUS_UNSUPPORTED, cur(p)->line,
                        "*args and **kwargs are not supported"), false;
        if (cur(p)->t == T_NAME && is_op(&p->toks[p->at + 1], "=")) {
            if (nk == 16)
                return perr(p, FSDP_STATUS_UNSUPPORTED, cur(p)->line,
                            "more than 16 keyword arguments"), false;
            if (!(kw_names[nk] = name_dup(p, cur(p))))
                return false;
            p->at += 2;
            if (!(kw[nk++] = parse_expr(p)))
                return false;
            continue;
        }
        if (nk)
            return perr(p, FSDP_STATUS_FORMAT, cur(p)->line,
                        "a positional argument after a keyword argument"), false;
        if (n == 64)
            return perr(p, FSDP_STATUS_UNSUPPORTED, cur(p)->line, "more than 64 arguments"),
                   false;
        if (!(args[n++] = parse_expr(p)))
            return false;
    }
    p->at++; /* ')' */
    x->args = jarena_alloc(p->a, (size_t)(n + 1) * sizeof *x->args);
    x->kw = jarena_alloc(p->a, (size_t)(nk + 1) * sizeof *x->kw);
    x->kw_names = jarena_alloc(p->a, (size_t)(nk + 1) * sizeof *x->kw_names);
    if (!x->args || !x->kw || !x->kw_names)
        return oom(p), false;
    memcpy(x->args, args, (size_t)n * sizeof *args);
    memcpy(x->kw, kw, (size_t)nk * sizeof *kw);
    memcpy(x->kw_names, kw_names, (size_t)nk * sizeof *kw_names);
    x->n_args = n;
    x->n_kw = nk;
    return true;
}

/* [a, b, ...] or (a, b, ...) or {k: v, ...} after the opener. */
static jx *parse_seq(parser *p, jx_kind kind, const char *close, int line, jx *first)
{
    jx *x = node(p, kind, line);
    if (!x)
        return NULL;
    jx **v = NULL;
    int n = 0, cap = 0;
    if (first) {
        v = jarena_alloc(p->a, 8 * sizeof *v);
        if (!v)
            return oom(p), NULL;
        cap = 8;
        v[n++] = first;
    }
    while (!skip_op(p, close)) {
        if (n && !expect_op(p, ","))
            return NULL;
        if (skip_op(p, close))
            break;
        for (int k = 0; k < (kind == JX_DICT ? 2 : 1); k++) {
            if (k == 1 && !expect_op(p, ":"))
                return NULL;
            if (n == cap) {
                int nc = cap ? 2 * cap : 8;
                jx **nv = jarena_alloc(p->a, (size_t)nc * sizeof *nv);
                if (!nv)
                    return oom(p), NULL;
                if (n)
                    memcpy(nv, v, (size_t)n * sizeof *v);
                v = nv;
                cap = nc;
            }
            if (!(v[n++] = parse_expr(p)))
                return NULL;
        }
    }
    x->args = v;
    x->n_args = n;
    return x;
}

static jx *parse_primary(parser *p)
{
    tok *t = cur(p);
    int line = t->line;
    jx *x = NULL;
    char b[64];
    if (t->t == T_NAME) {
        static const struct { const char *name; int v; } consts[] = {
            {"true", 1}, {"True", 1}, {"false", 0}, {"False", 0}, {"none", -1}, {"None", -1},
        };
        for (size_t k = 0; k < sizeof consts / sizeof *consts; k++)
            if (is_name(t, consts[k].name)) {
                p->at++;
                if (!(x = node(p, JX_LIT, line)))
                    return NULL;
                x->lit = consts[k].v < 0 ? (jv){.t = JV_NONE} : jv_bool(consts[k].v);
                return x;
            }
        if (!(x = node(p, JX_VAR, line)) || !(x->name = name_dup(p, t)) || !mention(p, x->name))
            return NULL;
        p->at++;
        return x;
    }
    if (t->t == T_STR) { /* adjacent literals join, as in Python */
        size_t n = 0;
        int k = p->at;
        for (; p->toks[k].t == T_STR; k++)
            n += p->toks[k].n;
        char *s = jarena_alloc(p->a, n + 1);
        jstr *js = jarena_alloc(p->a, sizeof *js);
        if (!s || !js || !(x = node(p, JX_LIT, line)))
            return oom(p), NULL;
        n = 0;
        for (; p->at < k; p->at++) {
            memcpy(s + n, p->toks[p->at].p, p->toks[p->at].n);
            n += p->toks[p->at].n;
        }
        js->p = s;
        js->n = n;
        x->lit = (jv){.t = JV_STR, .s = js};
        return x;
    }
    if (t->t == T_INT) {
        p->at++;
        if (!(x = node(p, JX_LIT, line)))
            return NULL;
        x->lit = jv_int(t->i);
        return x;
    }
    if (skip_op(p, "(")) {
        if (is_op(cur(p), ")"))
            return perr(p, FSDP_STATUS_UNSUPPORTED, line, "the empty tuple () is not supported"),
                   NULL;
        jx *e = parse_expr(p);
        if (!e)
            return NULL;
        if (skip_op(p, ")"))
            return e;
        if (!is_op(cur(p), ","))
            return expect_op(p, ")"), NULL;
        return parse_seq(p, JX_LIST, ")", line, e); /* a tuple: a list here */
    }
    if (skip_op(p, "["))
        return parse_seq(p, JX_LIST, "]", line, NULL);
    if (skip_op(p, "{"))
        return parse_seq(p, JX_DICT, "}", line, NULL);
    perr(p, FSDP_STATUS_FORMAT, line, "expected an expression, found %s",
         describe(t, b, sizeof b));
    return NULL;
}

/* x[...]: an index or a slice. */
static jx *parse_subscript(parser *p, jx *obj, int line)
{
    jx *parts[3] = {NULL, NULL, NULL};
    int k = 0;
    bool slice = false;
    for (;;) {
        if (is_op(cur(p), ":")) {
            if (++k > 2)
                return perr(p, FSDP_STATUS_FORMAT, line, "a slice has at most two ':'"), NULL;
            slice = true;
            p->at++;
            continue;
        }
        if (is_op(cur(p), "]")) {
            p->at++;
            break;
        }
        if (parts[k])
            return expect_op(p, "]"), NULL;
        if (!(parts[k] = parse_expr(p)))
            return NULL;
    }
    if (!slice && !parts[0])
        return perr(p, FSDP_STATUS_FORMAT, line, "an empty subscript []"), NULL;
    jx *x = node(p, slice ? JX_SLICE : JX_INDEX, line);
    if (!x)
        return NULL;
    x->a = obj;
    x->b = parts[0];
    x->c = parts[1];
    x->d = parts[2];
    return x;
}

static jx *parse_postfix(parser *p, jx *x)
{
    for (;;) {
        int line = cur(p)->line;
        if (skip_op(p, ".")) {
            jx *y;
            if (cur(p)->t == T_INT) { /* x.0 is x[0] */
                jx *lit = node(p, JX_LIT, line);
                if (!lit || !(y = node(p, JX_INDEX, line)))
                    return NULL;
                lit->lit = jv_int(cur(p)->i);
                p->at++;
                y->a = x;
                y->b = lit;
            } else {
                if (!(y = node(p, JX_ATTR, line)) || !expect_name(p, &y->name))
                    return NULL;
                y->a = x;
            }
            x = y;
        } else if (skip_op(p, "[")) {
            if (!(x = parse_subscript(p, x, line)))
                return NULL;
        } else if (skip_op(p, "(")) {
            jx *y = node(p, JX_CALL, line);
            if (!y || !parse_args(p, y))
                return NULL;
            y->a = x;
            x = y;
        } else {
            return x;
        }
    }
}

/* | name[(args)] */
static jx *parse_filter(parser *p, jx *x)
{
    int line = cur(p)->line;
    jx *f = node(p, JX_FILTER, line);
    if (!f || !expect_name(p, &f->name))
        return NULL;
    while (skip_op(p, ".")) { /* dotted filter names are not ours */
        const char *more;
        if (!expect_name(p, &more))
            return NULL;
        return perr(p, FSDP_STATUS_UNSUPPORTED, line, "the filter '%s.%s' is not supported",
                    f->name, more), NULL;
    }
    if ((f->op = jinja_filter_id(f->name)) < 0)
        return perr(p, FSDP_STATUS_UNSUPPORTED, line, "the filter '%s' is not supported",
                    f->name), NULL;
    if (skip_op(p, "(") && !parse_args(p, f))
        return NULL;
    f->a = x;
    return f;
}

/* is [not] name [(args) | one argument] */
static jx *parse_test(parser *p, jx *x)
{
    int line = cur(p)->line;
    jx *t = node(p, JX_TEST, line);
    if (!t)
        return NULL;
    t->negate = skip_name(p, "not");
    if (cur(p)->t == T_OP && (is_op(cur(p), "==") || is_op(cur(p), "!=") ||
                              is_op(cur(p), "<") || is_op(cur(p), ">"))) {
        if (!(t->name = name_dup(p, cur(p))))
            return NULL;
        p->at++;
    } else if (!expect_name(p, &t->name)) {
        return NULL;
    }
    if ((t->op = jinja_test_id(t->name)) < 0)
        return perr(p, FSDP_STATUS_UNSUPPORTED, line, "the test '%s' is not supported", t->name),
               NULL;
    tok *c = cur(p);
    if (skip_op(p, "(")) {
        if (!parse_args(p, t))
            return NULL;
    } else if ((c->t == T_NAME || c->t == T_STR || c->t == T_INT || is_op(c, "[") ||
                is_op(c, "{")) &&
               !is_name(c, "else") && !is_name(c, "or") && !is_name(c, "and") &&
               !is_name(c, "if") && !is_name(c, "is") && !is_name(c, "in") &&
               !is_name(c, "not")) {
        jx *arg = parse_primary(p);
        if (!arg || !(arg = parse_postfix(p, arg)))
            return NULL;
        t->args = jarena_alloc(p->a, sizeof *t->args);
        if (!t->args)
            return oom(p), NULL;
        t->args[0] = arg;
        t->n_args = 1;
    }
    t->a = x;
    return t;
}

static jx *parse_unary(parser *p, bool with_filter)
{
    if (!enter(p))
        return NULL;
    int line = cur(p)->line;
    jx *x;
    if (skip_op(p, "-")) {
        jx *a = parse_unary(p, false);
        if (!a || !(x = node(p, JX_NEG, line)))
            return NULL;
        x->a = a;
    } else if (skip_op(p, "+")) {
        x = parse_unary(p, false);
    } else {
        x = parse_primary(p);
        if (x)
            x = parse_postfix(p, x);
    }
    while (x && with_filter) {
        if (skip_op(p, "|"))
            x = parse_filter(p, x);
        else if (skip_name(p, "is"))
            x = parse_test(p, x);
        else if (is_op(cur(p), "("))
            x = parse_postfix(p, x);
        else
            break;
    }
    p->depth--;
    return x;
}

static jx *binary(parser *p, int line, jx_kind k, int op, jx *a, jx *b)
{
    if (!a || !b)
        return NULL;
    jx *x = node(p, k, line);
    if (!x)
        return NULL;
    x->op = op;
    x->a = a;
    x->b = b;
    return x;
}

static jx *parse_product(parser *p)
{
    jx *x = parse_unary(p, true);
    for (;;) {
        int line = cur(p)->line;
        if (!x)
            return NULL;
        if (skip_op(p, "*"))
            x = binary(p, line, JX_BIN, JOP_MUL, x, parse_unary(p, true));
        else if (skip_op(p, "//"))
            x = binary(p, line, JX_BIN, JOP_FLOORDIV, x, parse_unary(p, true));
        else if (skip_op(p, "%"))
            x = binary(p, line, JX_BIN, JOP_MOD, x, parse_unary(p, true));
        else if (is_op(cur(p), "/") || is_op(cur(p), "**"))
            return perr(p, FSDP_STATUS_UNSUPPORTED, line, "the operator '%.*s' is not supported "
                        "(no floating point)", (int)cur(p)->n, cur(p)->p), NULL;
        else
            return x;
    }
}

static jx *parse_concat(parser *p)
{
    jx *x = parse_product(p);
    while (x && is_op(cur(p), "~")) {
        int line = cur(p)->line;
        p->at++;
        x = binary(p, line, JX_BIN, JOP_CONCAT, x, parse_product(p));
    }
    return x;
}

static jx *parse_sum(parser *p)
{
    jx *x = parse_concat(p);
    for (;;) {
        int line = cur(p)->line;
        if (!x)
            return NULL;
        if (skip_op(p, "+"))
            x = binary(p, line, JX_BIN, JOP_ADD, x, parse_concat(p));
        else if (skip_op(p, "-"))
            x = binary(p, line, JX_BIN, JOP_SUB, x, parse_concat(p));
        else
            return x;
    }
}

static jx *parse_compare(parser *p)
{
    static const struct { const char *op; int code; } ops[] = {
        {"==", JOP_EQ}, {"!=", JOP_NE}, {"<=", JOP_LE}, {">=", JOP_GE}, {"<", JOP_LT},
        {">", JOP_GT},
    };
    jx *x = parse_sum(p), *prev = x;
    jx *chain = NULL; /* a < b < c is (a < b) and (b < c) */
    for (;;) {
        int line = cur(p)->line, op = -1;
        if (!x)
            return NULL;
        for (size_t k = 0; k < sizeof ops / sizeof *ops && op < 0; k++)
            if (skip_op(p, ops[k].op))
                op = ops[k].code;
        if (op < 0 && skip_name(p, "in"))
            op = JOP_IN;
        if (op < 0 && is_name(cur(p), "not") && is_name(&p->toks[p->at + 1], "in")) {
            p->at += 2;
            op = JOP_NOTIN;
        }
        if (op < 0)
            return chain ? chain : x;
        jx *rhs = parse_sum(p);
        jx *cmp = binary(p, line, JX_BIN, op, prev, rhs);
        if (!cmp)
            return NULL;
        chain = chain ? binary(p, line, JX_AND, 0, chain, cmp) : cmp;
        prev = rhs;
        x = chain;
    }
}

static jx *parse_not(parser *p)
{
    int line = cur(p)->line;
    if (!skip_name(p, "not"))
        return parse_compare(p);
    if (!enter(p))
        return NULL;
    jx *a = parse_not(p), *x = a ? node(p, JX_NOT, line) : NULL;
    p->depth--;
    if (x)
        x->a = a;
    return x;
}

static jx *parse_and(parser *p)
{
    jx *x = parse_not(p);
    while (x && is_name(cur(p), "and")) {
        int line = cur(p)->line;
        p->at++;
        x = binary(p, line, JX_AND, 0, x, parse_not(p));
    }
    return x;
}

static jx *parse_or(parser *p)
{
    jx *x = parse_and(p);
    while (x && is_name(cur(p), "or")) {
        int line = cur(p)->line;
        p->at++;
        x = binary(p, line, JX_OR, 0, x, parse_and(p));
    }
    return x;
}

static jx *parse_expr(parser *p)
{
    if (!enter(p))
        return NULL;
    jx *x = parse_or(p);
    while (x && is_name(cur(p), "if")) {
        int line = cur(p)->line;
        p->at++;
        jx *c = node(p, JX_COND, line), *cond = parse_or(p), *other = NULL;
        if (!c || !cond)
            return NULL;
        if (skip_name(p, "else") && !(other = parse_expr(p)))
            return NULL;
        c->a = cond;
        c->b = x;
        c->c = other;
        x = c;
    }
    p->depth--;
    return x;
}

/* ---- statements ------------------------------------------------------------------------- */

static bool parse_body(parser *p, jbody *body, const char *const *ends, const char **found);

static js *stmt(parser *p, js_kind k, int line)
{
    js *s = jarena_alloc(p->a, sizeof *s);
    if (!s)
        return oom(p), NULL;
    s->kind = k;
    s->line = line;
    return s;
}

static bool expect_end(parser *p)
{
    if (cur(p)->t == T_BEND) {
        p->at++;
        return true;
    }
    char b[64];
    return perr(p, FSDP_STATUS_FORMAT, cur(p)->line, "expected '%%}', found %s",
                describe(cur(p), b, sizeof b)), false;
}

static js *parse_if(parser *p, int line)
{
    static const char *const ends[] = {"elif", "else", "endif", NULL};
    js *s = stmt(p, JS_IF, line);
    const char *found = NULL;
    if (!s || !(s->x = parse_expr(p)) || !expect_end(p) || !parse_body(p, &s->body, ends, &found))
        return NULL;
    if (!strcmp(found, "elif")) {
        js *e = parse_if(p, p->toks[p->at - 1].line);
        if (!e)
            return NULL;
        s->orelse.s = jarena_alloc(p->a, sizeof *s->orelse.s);
        if (!s->orelse.s)
            return oom(p), NULL;
        s->orelse.s[0] = e;
        s->orelse.n = 1;
        return s;
    }
    if (!strcmp(found, "else")) {
        static const char *const end[] = {"endif", NULL};
        if (!expect_end(p) || !parse_body(p, &s->orelse, end, &found))
            return NULL;
    }
    return expect_end(p) ? s : NULL;
}

static js *parse_for(parser *p, int line)
{
    static const char *const ends[] = {"else", "endfor", NULL};
    js *s = stmt(p, JS_FOR, line);
    const char *found = NULL;
    if (!s)
        return NULL;
    bool paren = skip_op(p, "(");
    if (!expect_name(p, &s->t1) || (skip_op(p, ",") && !expect_name(p, &s->t2)))
        return NULL;
    if (is_op(cur(p), ","))
        return perr(p, FSDP_STATUS_UNSUPPORTED, line, "a for loop with more than two targets"),
               NULL;
    if ((paren && !expect_op(p, ")")) || !skip_name(p, "in"))
        return paren ? NULL : (perr(p, FSDP_STATUS_FORMAT, line, "expected 'in' in a for loop"),
                               NULL);
    if (!(s->x = parse_or(p)))
        return NULL;
    if (skip_name(p, "if") && !(s->cond = parse_expr(p)))
        return NULL;
    if (is_name(cur(p), "recursive"))
        return perr(p, FSDP_STATUS_UNSUPPORTED, line, "recursive for loops are not supported"),
               NULL;
    if (!expect_end(p) || !parse_body(p, &s->body, ends, &found))
        return NULL;
    if (!strcmp(found, "else")) {
        static const char *const end[] = {"endfor", NULL};
        if (!expect_end(p) || !parse_body(p, &s->orelse, end, &found))
            return NULL;
    }
    return expect_end(p) ? s : NULL;
}

static js *parse_set(parser *p, int line)
{
    js *s = stmt(p, JS_SET, line);
    if (!s || !expect_name(p, &s->t1))
        return NULL;
    if (skip_op(p, ".") && !expect_name(p, &s->t2))
        return NULL;
    if (is_op(cur(p), ","))
        return perr(p, FSDP_STATUS_UNSUPPORTED, line, "{%% set a, b = ... %%} is not supported"),
               NULL;
    if (cur(p)->t == T_BEND)
        return perr(p, FSDP_STATUS_UNSUPPORTED, line,
                    "block assignments ({%% set x %%}...{%% endset %%}) are not supported"), NULL;
    if (!expect_op(p, "=") || !(s->x = parse_expr(p)) || !expect_end(p))
        return NULL;
    return s;
}

/* One {% ... %} after '{%': a statement, or an end name in `ends` (left for the caller,
 * which reads *found). */
static js *parse_block(parser *p, const char *const *ends, const char **found)
{
    tok *t = cur(p);
    int line = t->line;
    char b[64];
    if (t->t != T_NAME)
        return perr(p, FSDP_STATUS_FORMAT, line, "expected a statement after '{%%', found %s",
                    describe(t, b, sizeof b)), NULL;
    for (int k = 0; ends && ends[k]; k++)
        if (is_name(t, ends[k])) {
            *found = ends[k];
            p->at++;
            return NULL;
        }
    p->at++;
    if (is_name(t, "if"))
        return parse_if(p, line);
    if (is_name(t, "for"))
        return parse_for(p, line);
    if (is_name(t, "set"))
        return parse_set(p, line);
    if (is_name(t, "break") || is_name(t, "continue")) {
        js *s = stmt(p, is_name(t, "break") ? JS_BREAK : JS_CONTINUE, line);
        return s && expect_end(p) ? s : NULL;
    }
    if (is_name(t, "generation")) {
        static const char *const end[] = {"endgeneration", NULL};
        js *s = stmt(p, JS_BLOCK, line);
        const char *f;
        if (!s || !expect_end(p) || !parse_body(p, &s->body, end, &f) || !expect_end(p))
            return NULL;
        return s;
    }
    static const char *const known[] = {"macro", "call", "include", "import", "from", "extends",
                                        "block", "filter", "with", "raw", "autoescape", "do",
                                        NULL};
    for (int k = 0; known[k]; k++)
        if (is_name(t, known[k]))
            return perr(p, FSDP_STATUS_UNSUPPORTED, line, "{%% %s %%} is not supported",
                        known[k]), NULL;
    return perr(p, FSDP_STATUS_FORMAT, line, "unexpected '%.*s' after '{%%'%s", (int)t->n, t->p,
                ends ? "" : " (no block is open)"), NULL;
}

/* Statements until one of `ends` (NULL: the end of the template); *found is the end met. */
static bool parse_body(parser *p, jbody *body, const char *const *ends, const char **found)
{
    if (!enter(p))
        return false;
    int line = cur(p)->line;
    js **v = NULL;
    int n = 0, cap = 0;
    *found = NULL;
    for (;;) {
        tok *t = cur(p);
        js *s = NULL;
        if (t->t == T_EOF) {
            if (ends)
                return perr(p, FSDP_STATUS_FORMAT, line, "this block is never closed (expected "
                            "{%% %s %%})", ends[0][0] == 'e' ? ends[0] : ends[1] ? ends[1] :
                            ends[0]), false;
            break;
        }
        if (t->t == T_TEXT) {
            if ((s = stmt(p, JS_TEXT, t->line))) {
                s->text = t->p;
                s->n = t->n;
            }
            p->at++;
        } else if (t->t == T_VBEGIN) {
            p->at++;
            if ((s = stmt(p, JS_OUT, t->line)) && (s->x = parse_expr(p)) &&
                cur(p)->t != T_VEND) {
                char b[64];
                perr(p, FSDP_STATUS_FORMAT, cur(p)->line, "expected '}}', found %s",
                     describe(cur(p), b, sizeof b));
            }
            p->at++;
        } else if (t->t == T_BBEGIN) {
            p->at++;
            s = parse_block(p, ends, found);
            if (*found)
                break;
        } else {
            char b[64];
            perr(p, FSDP_STATUS_FORMAT, t->line, "unexpected %s", describe(t, b, sizeof b));
        }
        if (p->st != FSDP_STATUS_OK || !s)
            return perr(p, FSDP_STATUS_INTERNAL, t->line, "unparsed statement"), false;
        if (n == cap) {
            int nc = cap ? 2 * cap : 8;
            js **nv = jarena_alloc(p->a, (size_t)nc * sizeof *nv);
            if (!nv)
                return oom(p), false;
            if (n)
                memcpy(nv, v, (size_t)n * sizeof *v);
            v = nv;
            cap = nc;
        }
        v[n++] = s;
    }
    body->s = v;
    body->n = n;
    p->depth--;
    return true;
}

/* ---- entry points ------------------------------------------------------------------------ */

fsdp_status fsdp_jinja_parse(fsdp_jinja **out, const char *label, const char *src, size_t n)
{
    *out = NULL;
    fsdp_jinja *t = calloc(1, sizeof *t);
    if (!t)
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory parsing chat template %s",
                              label);
    snprintf(t->label, sizeof t->label, "%s", label);
    parser p = {.tpl = t, .a = &t->arena};
    /* newlines as Jinja reads them: \r\n and \r are \n; one final newline is dropped */
    char *s = jarena_alloc(&t->arena, n + 1);
    size_t k = 0;
    if (!s) {
        oom(&p);
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        if (src[i] == '\r') {
            s[k++] = '\n';
            if (i + 1 < n && src[i + 1] == '\n')
                i++;
        } else {
            s[k++] = src[i];
        }
    }
    if (k && s[k - 1] == '\n')
        k--;
    s[k] = '\0';
    const char *found;
    if (lex(&p, s, k))
        parse_body(&p, &t->root, NULL, &found);
out:
    free(p.toks);
    if (p.st != FSDP_STATUS_OK) {
        fsdp_jinja_free(t);
        return p.st;
    }
    *out = t;
    return FSDP_STATUS_OK;
}

void fsdp_jinja_free(fsdp_jinja *t)
{
    if (!t)
        return;
    jarena_free(&t->arena);
    free(t);
}

bool fsdp_jinja_mentions(const fsdp_jinja *t, const char *name)
{
    for (int i = 0; i < t->n_names; i++)
        if (!strcmp(t->names[i], name))
            return true;
    return false;
}
