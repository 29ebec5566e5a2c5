/*
 * jinja_parse_expr.c - the expressions of a template's tags into the
 * syntax tree (jinja_parse_expr.h), by recursive descent with Jinja's
 * operator precedence:
 *
 *   cond:    or ['if' or ['else' cond]]
 *   or:      and {'or' and}          and:  not {'and' not}
 *   not:     'not' not | compare     compare: sum {(== != < <= > >= in 'not in') sum}
 *   sum:     concat {(+ -) concat}   concat:  product {'~' product}
 *   product: unary {(* // %) unary}  unary:   '-' unary | primary postfix {filter | test | call}
 *
 * Filters and tests are checked against the built-ins' names
 * (jinja_builtin.h) here, so an unsupported one fails at parse time.
 */
#include <stdio.h>
#include <string.h>

#include "core/error.h"
#include "data/jinja_builtin.h"
#include "data/jinja_parse_expr.h"

/* ---- nodes ------------------------------------------------------------------------------ */

JP_NODE_CTOR(node, jx, jx_kind)

/* Note a variable the template reads, once (fsdp_jinja_mentions). */
static bool mention(jparser *p, const char *name)
{
    fsdp_jinja *t = p->tpl;
    for (int i = 0; i < t->n_names; i++)
        if (!strcmp(t->names[i], name))
            return true;
    if ((t->n_names & (t->n_names - 1)) == 0) { /* a power of two (or 0): grow */
        const char **v = jarena_alloc(p->a, (size_t)(t->n_names ? 2 * t->n_names : 8) *
                                                sizeof *v);
        if (!v)
            return jp_oom(p), false;
        if (t->n_names)
            memcpy(v, t->names, (size_t)t->n_names * sizeof *v);
        t->names = v;
    }
    t->names[t->n_names++] = name;
    return true;
}

/* ---- expressions ------------------------------------------------------------------------ */

static jx *parse_unary(jparser *p, bool with_filter);

/* Arguments of a call, filter or test after '(': positional, then name=value. */
static bool parse_args(jparser *p, jx *x)
{
    jx *args[64], *kw[16];
    const char *kw_names[16];
    int n = 0, nk = 0;
    while (!jp_is_op(jp_cur(p), ")")) {
        if (n + nk > 0 && !jp_expect_op(p, ","))
            return false;
        if (jp_is_op(jp_cur(p), ")"))
            break;
        if (jp_is_op(jp_cur(p), "*") || jp_is_op(jp_cur(p), "**"))
            return jp_fail(p, FSDP_STATUS_UNSUPPORTED, jp_cur(p)->line,
                           "*args and **kwargs are not supported"), false;
        if (jp_cur(p)->t == JT_NAME && jp_is_op(&p->toks[p->at + 1], "=")) {
            if (nk == 16)
                return jp_fail(p, FSDP_STATUS_UNSUPPORTED, jp_cur(p)->line,
                               "more than 16 keyword arguments"), false;
            if (!(kw_names[nk] = jp_name_dup(p, jp_cur(p))))
                return false;
            p->at += 2;
            if (!(kw[nk++] = jp_expr(p)))
                return false;
            continue;
        }
        if (nk)
            return jp_fail(p, FSDP_STATUS_FORMAT, jp_cur(p)->line,
                           "a positional argument after a keyword argument"), false;
        if (n == 64)
            return jp_fail(p, FSDP_STATUS_UNSUPPORTED, jp_cur(p)->line, "more than 64 arguments"),
                   false;
        if (!(args[n++] = jp_expr(p)))
            return false;
    }
    p->at++; /* ')' */
    x->args = jarena_alloc(p->a, (size_t)(n + 1) * sizeof *x->args);
    x->kw = jarena_alloc(p->a, (size_t)(nk + 1) * sizeof *x->kw);
    x->kw_names = jarena_alloc(p->a, (size_t)(nk + 1) * sizeof *x->kw_names);
    if (!x->args || !x->kw || !x->kw_names)
        return jp_oom(p), false;
    memcpy(x->args, args, (size_t)n * sizeof *args);
    memcpy(x->kw, kw, (size_t)nk * sizeof *kw);
    memcpy(x->kw_names, kw_names, (size_t)nk * sizeof *kw_names);
    x->n_args = n;
    x->n_kw = nk;
    return true;
}

/* [a, b, ...] or (a, b, ...) or {k: v, ...} after the opener. */
static jx *parse_seq(jparser *p, jx_kind kind, const char *close, int line, jx *first)
{
    jx *x = node(p, kind, line);
    if (!x)
        return NULL;
    jx **v = NULL;
    int n = 0, cap = 0;
    if (first) {
        if (!(v = jp_grow(p, v, n, &cap, sizeof *v)))
            return NULL;
        v[n++] = first;
    }
    while (!jp_skip_op(p, close)) {
        if (n && !jp_expect_op(p, ","))
            return NULL;
        if (jp_skip_op(p, close))
            break;
        for (int k = 0; k < (kind == JX_DICT ? 2 : 1); k++) {
            if (k == 1 && !jp_expect_op(p, ":"))
                return NULL;
            if (!(v = jp_grow(p, v, n, &cap, sizeof *v)))
                return NULL;
            if (!(v[n++] = jp_expr(p)))
                return NULL;
        }
    }
    x->args = v;
    x->n_args = n;
    return x;
}

static jx *parse_primary(jparser *p)
{
    jtok *t = jp_cur(p);
    int line = t->line;
    jx *x = NULL;
    char b[64];
    if (t->t == JT_NAME) {
        static const struct { const char *name; int v; } consts[] = {
            {"true", 1}, {"True", 1}, {"false", 0}, {"False", 0}, {"none", -1}, {"None", -1},
        };
        for (size_t k = 0; k < sizeof consts / sizeof *consts; k++)
            if (jp_is_name(t, consts[k].name)) {
                p->at++;
                if (!(x = node(p, JX_LIT, line)))
                    return NULL;
                x->lit = consts[k].v < 0 ? (jv){.t = JV_NONE} : jv_bool(consts[k].v);
                return x;
            }
        if (!(x = node(p, JX_VAR, line)) || !(x->name = jp_name_dup(p, t)) || !mention(p, x->name))
            return NULL;
        p->at++;
        return x;
    }
    if (t->t == JT_STR) { /* adjacent literals join, as in Python */
        size_t n = 0;
        int k = p->at;
        for (; p->toks[k].t == JT_STR; k++)
            n += p->toks[k].n;
        char *s = jarena_alloc(p->a, n + 1);
        jstr *js = jarena_alloc(p->a, sizeof *js);
        if (!s || !js || !(x = node(p, JX_LIT, line)))
            return jp_oom(p), NULL;
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
    if (t->t == JT_INT) {
        p->at++;
        if (!(x = node(p, JX_LIT, line)))
            return NULL;
        x->lit = jv_int(t->i);
        return x;
    }
    if (jp_skip_op(p, "(")) {
        if (jp_is_op(jp_cur(p), ")"))
            return jp_fail(p, FSDP_STATUS_UNSUPPORTED, line, "the empty tuple () is not supported"),
                   NULL;
        jx *e = jp_expr(p);
        if (!e)
            return NULL;
        if (jp_skip_op(p, ")"))
            return e;
        if (!jp_is_op(jp_cur(p), ","))
            return jp_expect_op(p, ")"), NULL;
        return parse_seq(p, JX_LIST, ")", line, e); /* a tuple: a list here */
    }
    if (jp_skip_op(p, "["))
        return parse_seq(p, JX_LIST, "]", line, NULL);
    if (jp_skip_op(p, "{"))
        return parse_seq(p, JX_DICT, "}", line, NULL);
    jp_fail(p, FSDP_STATUS_FORMAT, line, "expected an expression, found %s",
            jp_describe(t, b, sizeof b));
    return NULL;
}

/* x[...]: an index or a slice. */
static jx *parse_subscript(jparser *p, jx *obj, int line)
{
    jx *parts[3] = {NULL, NULL, NULL};
    int k = 0;
    bool slice = false;
    for (;;) {
        if (jp_is_op(jp_cur(p), ":")) {
            if (++k > 2)
                return jp_fail(p, FSDP_STATUS_FORMAT, line, "a slice has at most two ':'"), NULL;
            slice = true;
            p->at++;
            continue;
        }
        if (jp_is_op(jp_cur(p), "]")) {
            p->at++;
            break;
        }
        if (parts[k])
            return jp_expect_op(p, "]"), NULL;
        if (!(parts[k] = jp_expr(p)))
            return NULL;
    }
    if (!slice && !parts[0])
        return jp_fail(p, FSDP_STATUS_FORMAT, line, "an empty subscript []"), NULL;
    jx *x = node(p, slice ? JX_SLICE : JX_INDEX, line);
    if (!x)
        return NULL;
    x->a = obj;
    x->b = parts[0];
    x->c = parts[1];
    x->d = parts[2];
    return x;
}

static jx *parse_postfix(jparser *p, jx *x)
{
    for (;;) {
        int line = jp_cur(p)->line;
        if (jp_skip_op(p, ".")) {
            jx *y;
            if (jp_cur(p)->t == JT_INT) { /* x.0 is x[0] */
                jx *lit = node(p, JX_LIT, line);
                if (!lit || !(y = node(p, JX_INDEX, line)))
                    return NULL;
                lit->lit = jv_int(jp_cur(p)->i);
                p->at++;
                y->a = x;
                y->b = lit;
            } else {
                if (!(y = node(p, JX_ATTR, line)) || !jp_expect_name(p, &y->name))
                    return NULL;
                y->a = x;
            }
            x = y;
        } else if (jp_skip_op(p, "[")) {
            if (!(x = parse_subscript(p, x, line)))
                return NULL;
        } else if (jp_skip_op(p, "(")) {
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
static jx *parse_filter(jparser *p, jx *x)
{
    int line = jp_cur(p)->line;
    jx *f = node(p, JX_FILTER, line);
    if (!f || !jp_expect_name(p, &f->name))
        return NULL;
    while (jp_skip_op(p, ".")) { /* dotted filter names are not ours */
        const char *more;
        if (!jp_expect_name(p, &more))
            return NULL;
        return jp_fail(p, FSDP_STATUS_UNSUPPORTED, line, "the filter '%s.%s' is not supported",
                       f->name, more), NULL;
    }
    if ((f->op = jinja_filter_id(f->name)) < 0)
        return jp_fail(p, FSDP_STATUS_UNSUPPORTED, line, "the filter '%s' is not supported",
                       f->name), NULL;
    if (jp_skip_op(p, "(") && !parse_args(p, f))
        return NULL;
    f->a = x;
    return f;
}

/* is [not] name [(args) | one argument] */
static jx *parse_test(jparser *p, jx *x)
{
    int line = jp_cur(p)->line;
    jx *t = node(p, JX_TEST, line);
    if (!t)
        return NULL;
    t->negate = jp_skip_name(p, "not");
    if (jp_cur(p)->t == JT_OP && (jp_is_op(jp_cur(p), "==") || jp_is_op(jp_cur(p), "!=") ||
                                  jp_is_op(jp_cur(p), "<") || jp_is_op(jp_cur(p), ">"))) {
        if (!(t->name = jp_name_dup(p, jp_cur(p))))
            return NULL;
        p->at++;
    } else if (!jp_expect_name(p, &t->name)) {
        return NULL;
    }
    if ((t->op = jinja_test_id(t->name)) < 0)
        return jp_fail(p, FSDP_STATUS_UNSUPPORTED, line, "the test '%s' is not supported", t->name),
               NULL;
    jtok *c = jp_cur(p);
    if (jp_skip_op(p, "(")) {
        if (!parse_args(p, t))
            return NULL;
    } else if ((c->t == JT_NAME || c->t == JT_STR || c->t == JT_INT || jp_is_op(c, "[") ||
                jp_is_op(c, "{")) &&
               !jp_is_name(c, "else") && !jp_is_name(c, "or") && !jp_is_name(c, "and") &&
               !jp_is_name(c, "if") && !jp_is_name(c, "is") && !jp_is_name(c, "in") &&
               !jp_is_name(c, "not")) {
        jx *arg = parse_primary(p);
        if (!arg || !(arg = parse_postfix(p, arg)))
            return NULL;
        t->args = jarena_alloc(p->a, sizeof *t->args);
        if (!t->args)
            return jp_oom(p), NULL;
        t->args[0] = arg;
        t->n_args = 1;
    }
    t->a = x;
    return t;
}

static jx *parse_unary(jparser *p, bool with_filter)
{
    if (!jp_enter(p))
        return NULL;
    int line = jp_cur(p)->line;
    jx *x;
    if (jp_skip_op(p, "-")) {
        jx *a = parse_unary(p, false);
        if (!a || !(x = node(p, JX_NEG, line)))
            return NULL;
        x->a = a;
    } else if (jp_skip_op(p, "+")) {
        x = parse_unary(p, false);
    } else {
        x = parse_primary(p);
        if (x)
            x = parse_postfix(p, x);
    }
    while (x && with_filter) {
        if (jp_skip_op(p, "|"))
            x = parse_filter(p, x);
        else if (jp_skip_name(p, "is"))
            x = parse_test(p, x);
        else if (jp_is_op(jp_cur(p), "("))
            x = parse_postfix(p, x);
        else
            break;
    }
    p->depth--;
    return x;
}

static jx *binary(jparser *p, int line, jx_kind k, int op, jx *a, jx *b)
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

static jx *parse_product(jparser *p)
{
    jx *x = parse_unary(p, true);
    for (;;) {
        int line = jp_cur(p)->line;
        if (!x)
            return NULL;
        if (jp_skip_op(p, "*"))
            x = binary(p, line, JX_BIN, JOP_MUL, x, parse_unary(p, true));
        else if (jp_skip_op(p, "//"))
            x = binary(p, line, JX_BIN, JOP_FLOORDIV, x, parse_unary(p, true));
        else if (jp_skip_op(p, "%"))
            x = binary(p, line, JX_BIN, JOP_MOD, x, parse_unary(p, true));
        else if (jp_is_op(jp_cur(p), "/") || jp_is_op(jp_cur(p), "**"))
            return jp_fail(p, FSDP_STATUS_UNSUPPORTED, line, "the operator '%.*s' is not supported "
                           "(no floating point)", (int)jp_cur(p)->n, jp_cur(p)->p), NULL;
        else
            return x;
    }
}

/* One left-associative level: operands from `next`, joined by the keyword
 * (is_name) or operator `word` into nodes of kind k with op. */
static jx *left_assoc(jparser *p, jx *(*next)(jparser *), bool is_name, const char *word,
                      jx_kind k, int op)
{
    jx *x = next(p);
    while (x && (is_name ? jp_is_name(jp_cur(p), word) : jp_is_op(jp_cur(p), word))) {
        int line = jp_cur(p)->line;
        p->at++;
        x = binary(p, line, k, op, x, next(p));
    }
    return x;
}

static jx *parse_concat(jparser *p)
{
    return left_assoc(p, parse_product, false, "~", JX_BIN, JOP_CONCAT);
}

static jx *parse_sum(jparser *p)
{
    jx *x = parse_concat(p);
    for (;;) {
        int line = jp_cur(p)->line;
        if (!x)
            return NULL;
        if (jp_skip_op(p, "+"))
            x = binary(p, line, JX_BIN, JOP_ADD, x, parse_concat(p));
        else if (jp_skip_op(p, "-"))
            x = binary(p, line, JX_BIN, JOP_SUB, x, parse_concat(p));
        else
            return x;
    }
}

static jx *parse_compare(jparser *p)
{
    static const struct { const char *op; int code; } ops[] = {
        {"==", JOP_EQ}, {"!=", JOP_NE}, {"<=", JOP_LE}, {">=", JOP_GE}, {"<", JOP_LT},
        {">", JOP_GT},
    };
    jx *x = parse_sum(p), *prev = x;
    jx *chain = NULL; /* a < b < c is (a < b) and (b < c) */
    for (;;) {
        int line = jp_cur(p)->line, op = -1;
        if (!x)
            return NULL;
        for (size_t k = 0; k < sizeof ops / sizeof *ops && op < 0; k++)
            if (jp_skip_op(p, ops[k].op))
                op = ops[k].code;
        if (op < 0 && jp_skip_name(p, "in"))
            op = JOP_IN;
        if (op < 0 && jp_is_name(jp_cur(p), "not") && jp_is_name(&p->toks[p->at + 1], "in")) {
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

static jx *parse_not(jparser *p)
{
    int line = jp_cur(p)->line;
    if (!jp_skip_name(p, "not"))
        return parse_compare(p);
    if (!jp_enter(p))
        return NULL;
    jx *a = parse_not(p), *x = a ? node(p, JX_NOT, line) : NULL;
    p->depth--;
    if (x)
        x->a = a;
    return x;
}

static jx *parse_and(jparser *p)
{
    return left_assoc(p, parse_not, true, "and", JX_AND, 0);
}

jx *jp_or(jparser *p)
{
    return left_assoc(p, parse_and, true, "or", JX_OR, 0);
}

jx *jp_expr(jparser *p)
{
    if (!jp_enter(p))
        return NULL;
    jx *x = jp_or(p);
    while (x && jp_is_name(jp_cur(p), "if")) {
        int line = jp_cur(p)->line;
        p->at++;
        jx *c = node(p, JX_COND, line), *cond = jp_or(p), *other = NULL;
        if (!c || !cond)
            return NULL;
        if (jp_skip_name(p, "else") && !(other = jp_expr(p)))
            return NULL;
        c->a = cond;
        c->b = x;
        c->c = other;
        x = c;
    }
    p->depth--;
    return x;
}

