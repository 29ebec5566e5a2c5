/*
 * jinja_parse.c - a template's text into the syntax tree (jinja.h,
 * jinja_internal.h): the newlines as Jinja reads them, the tokens
 * (jinja_lex.c), then the statements, by recursive descent; expressions
 * are jinja_parse_expr.c's. Nesting is bounded (JP_MAX_DEPTH) and every
 * error names the line.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "data/jinja_parse_expr.h"

/* ---- statements ------------------------------------------------------------------------- */

static bool parse_body(jparser *p, jbody *body, const char *const *ends, const char **found);

JP_NODE_CTOR(stmt, js, js_kind)

static bool expect_end(jparser *p)
{
    if (jp_cur(p)->t == JT_BEND) {
        p->at++;
        return true;
    }
    char b[64];
    return jp_fail(p, FSDP_STATUS_FORMAT, jp_cur(p)->line, "expected '%%}', found %s",
                   jp_describe(jp_cur(p), b, sizeof b)), false;
}

/* The rest of an if or a for whose body ended at tag `found`: after
 * "else", the else body up to `end` ({"endif", NULL} or {"endfor", NULL});
 * then the end tag's '%}'. s, or NULL with p's error. */
static js *parse_tail(jparser *p, js *s, const char *found, const char *const *end)
{
    if (!strcmp(found, "else") && (!expect_end(p) || !parse_body(p, &s->orelse, end, &found)))
        return NULL;
    return expect_end(p) ? s : NULL;
}

static js *parse_if(jparser *p, int line)
{
    static const char *const ends[] = {"elif", "else", "endif", NULL};
    js *s = stmt(p, JS_IF, line);
    const char *found = NULL;
    if (!s || !(s->x = jp_expr(p)) || !expect_end(p) || !parse_body(p, &s->body, ends, &found))
        return NULL;
    if (!strcmp(found, "elif")) {
        js *e = parse_if(p, p->toks[p->at - 1].line);
        if (!e)
            return NULL;
        s->orelse.s = jarena_alloc(p->a, sizeof *s->orelse.s);
        if (!s->orelse.s)
            return jp_oom(p), NULL;
        s->orelse.s[0] = e;
        s->orelse.n = 1;
        return s;
    }
    static const char *const end[] = {"endif", NULL};
    return parse_tail(p, s, found, end);
}

static js *parse_for(jparser *p, int line)
{
    static const char *const ends[] = {"else", "endfor", NULL};
    js *s = stmt(p, JS_FOR, line);
    const char *found = NULL;
    if (!s)
        return NULL;
    bool paren = jp_skip_op(p, "(");
    if (!jp_expect_name(p, &s->t1) || (jp_skip_op(p, ",") && !jp_expect_name(p, &s->t2)))
        return NULL;
    if (jp_is_op(jp_cur(p), ","))
        return jp_fail(p, FSDP_STATUS_UNSUPPORTED, line, "a for loop with more than two targets"),
               NULL;
    if ((paren && !jp_expect_op(p, ")")) || !jp_skip_name(p, "in"))
        return paren ? NULL : (jp_fail(p, FSDP_STATUS_FORMAT, line, "expected 'in' in a for loop"),
                               NULL);
    if (!(s->x = jp_or(p)))
        return NULL;
    if (jp_skip_name(p, "if") && !(s->cond = jp_expr(p)))
        return NULL;
    if (jp_is_name(jp_cur(p), "recursive"))
        return jp_fail(p, FSDP_STATUS_UNSUPPORTED, line, "recursive for loops are not supported"),
               NULL;
    if (!expect_end(p) || !parse_body(p, &s->body, ends, &found))
        return NULL;
    static const char *const end[] = {"endfor", NULL};
    return parse_tail(p, s, found, end);
}

static js *parse_set(jparser *p, int line)
{
    js *s = stmt(p, JS_SET, line);
    if (!s || !jp_expect_name(p, &s->t1))
        return NULL;
    if (jp_skip_op(p, ".") && !jp_expect_name(p, &s->t2))
        return NULL;
    if (jp_is_op(jp_cur(p), ","))
        return jp_fail(p, FSDP_STATUS_UNSUPPORTED, line, "{%% set a, b = ... %%} is not supported"),
               NULL;
    if (jp_cur(p)->t == JT_BEND)
        return jp_fail(p, FSDP_STATUS_UNSUPPORTED, line,
                       "block assignments ({%% set x %%}...{%% endset %%}) are not supported"),
               NULL;
    if (!jp_expect_op(p, "=") || !(s->x = jp_expr(p)) || !expect_end(p))
        return NULL;
    return s;
}

/* One {% ... %} after '{%': a statement, or an end name in `ends` (left for the caller,
 * which reads *found). */
static js *parse_block(jparser *p, const char *const *ends, const char **found)
{
    jtok *t = jp_cur(p);
    int line = t->line;
    char b[64];
    if (t->t != JT_NAME)
        return jp_fail(p, FSDP_STATUS_FORMAT, line, "expected a statement after '{%%', found %s",
                       jp_describe(t, b, sizeof b)), NULL;
    for (int k = 0; ends && ends[k]; k++)
        if (jp_is_name(t, ends[k])) {
            *found = ends[k];
            p->at++;
            return NULL;
        }
    p->at++;
    if (jp_is_name(t, "if"))
        return parse_if(p, line);
    if (jp_is_name(t, "for"))
        return parse_for(p, line);
    if (jp_is_name(t, "set"))
        return parse_set(p, line);
    if (jp_is_name(t, "break") || jp_is_name(t, "continue")) {
        js *s = stmt(p, jp_is_name(t, "break") ? JS_BREAK : JS_CONTINUE, line);
        return s && expect_end(p) ? s : NULL;
    }
    if (jp_is_name(t, "generation")) {
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
        if (jp_is_name(t, known[k]))
            return jp_fail(p, FSDP_STATUS_UNSUPPORTED, line, "{%% %s %%} is not supported",
                           known[k]), NULL;
    return jp_fail(p, FSDP_STATUS_FORMAT, line, "unexpected '%.*s' after '{%%'%s", (int)t->n, t->p,
                   ends ? "" : " (no block is open)"), NULL;
}

/* Statements until one of `ends` (NULL: the end of the template); *found is the end met. */
static bool parse_body(jparser *p, jbody *body, const char *const *ends, const char **found)
{
    if (!jp_enter(p))
        return false;
    int line = jp_cur(p)->line;
    js **v = NULL;
    int n = 0, cap = 0;
    *found = NULL;
    for (;;) {
        jtok *t = jp_cur(p);
        js *s = NULL;
        if (t->t == JT_EOF) {
            if (ends)
                return jp_fail(p, FSDP_STATUS_FORMAT, line, "this block is never closed (expected "
                               "{%% %s %%})", ends[0][0] == 'e' ? ends[0] : ends[1] ? ends[1] :
                               ends[0]), false;
            break;
        }
        if (t->t == JT_TEXT) {
            if ((s = stmt(p, JS_TEXT, t->line))) {
                s->text = t->p;
                s->n = t->n;
            }
            p->at++;
        } else if (t->t == JT_VBEGIN) {
            p->at++;
            if ((s = stmt(p, JS_OUT, t->line)) && (s->x = jp_expr(p)) &&
                jp_cur(p)->t != JT_VEND) {
                char b[64];
                jp_fail(p, FSDP_STATUS_FORMAT, jp_cur(p)->line, "expected '}}', found %s",
                        jp_describe(jp_cur(p), b, sizeof b));
            }
            p->at++;
        } else if (t->t == JT_BBEGIN) {
            p->at++;
            s = parse_block(p, ends, found);
            if (*found)
                break;
        } else {
            char b[64];
            jp_fail(p, FSDP_STATUS_FORMAT, t->line, "unexpected %s", jp_describe(t, b, sizeof b));
        }
        if (p->st != FSDP_STATUS_OK || !s)
            return jp_fail(p, FSDP_STATUS_INTERNAL, t->line, "unparsed statement"), false;
        if (!(v = jp_grow(p, v, n, &cap, sizeof *v)))
            return false;
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
    jparser p = {.tpl = t, .a = &t->arena};
    /* newlines as Jinja reads them: \r\n and \r are \n; one final newline is dropped */
    char *s = jarena_alloc(&t->arena, n + 1);
    size_t k = 0;
    if (!s) {
        jp_oom(&p);
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
    if (jp_lex(&p, s, k))
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
