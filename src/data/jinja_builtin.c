/*
 * jinja_builtin.c - the filters, tests, methods and global functions of
 * the Jinja subset (jinja.h lists them; jinja_builtin.h), each as Jinja
 * (or Python, for methods) defines it, for the types templates give them.
 * The string ones are jinja_str.c's; arguments are evaluated through
 * r->eval when a built-in reads them.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/error.h"
#include "data/jinja_builtin.h"
#include "data/jinja_str.h"

static const jv UNDEF = {.t = JV_UNDEF};

/* ---- name tables ------------------------------------------------------------------------ */

enum {
    F_TRIM = 0, F_TOJSON, F_LENGTH, F_UPPER, F_LOWER, F_CAPITALIZE, F_TITLE, F_STRING, F_LIST,
    F_ITEMS, F_JOIN, F_FIRST, F_LAST, F_DEFAULT, F_REPLACE, F_INT, F_ABS, F_REVERSE, F_UNIQUE,
    F_SELECT, F_REJECT, F_SELECTATTR, F_REJECTATTR, F_MAP, F_SAFE, F_INDENT,
};

static const struct { const char *name; int id; } FILTERS[] = {
    {"trim", F_TRIM}, {"tojson", F_TOJSON}, {"length", F_LENGTH}, {"count", F_LENGTH},
    {"upper", F_UPPER}, {"lower", F_LOWER}, {"capitalize", F_CAPITALIZE}, {"title", F_TITLE},
    {"string", F_STRING}, {"list", F_LIST}, {"items", F_ITEMS}, {"join", F_JOIN},
    {"first", F_FIRST}, {"last", F_LAST}, {"default", F_DEFAULT}, {"d", F_DEFAULT},
    {"replace", F_REPLACE}, {"int", F_INT}, {"abs", F_ABS}, {"reverse", F_REVERSE},
    {"unique", F_UNIQUE}, {"select", F_SELECT}, {"reject", F_REJECT},
    {"selectattr", F_SELECTATTR}, {"rejectattr", F_REJECTATTR}, {"map", F_MAP},
    {"safe", F_SAFE}, {"indent", F_INDENT},
};

enum {
    T_DEFINED = 0, T_UNDEFINED, T_NONE, T_BOOLEAN, T_TRUE, T_FALSE, T_INTEGER, T_NUMBER,
    T_STRING, T_MAPPING, T_ITERABLE, T_SEQUENCE, T_CALLABLE, T_ODD, T_EVEN, T_DIVISIBLEBY,
    T_EQ, T_NE, T_LT, T_GT, T_LE, T_GE, T_IN,
};

static const struct { const char *name; int id; } TESTS[] = {
    {"defined", T_DEFINED}, {"undefined", T_UNDEFINED}, {"none", T_NONE},
    {"boolean", T_BOOLEAN}, {"true", T_TRUE}, {"false", T_FALSE}, {"integer", T_INTEGER},
    {"number", T_NUMBER}, {"string", T_STRING}, {"mapping", T_MAPPING},
    {"iterable", T_ITERABLE}, {"sequence", T_SEQUENCE}, {"callable", T_CALLABLE},
    {"odd", T_ODD}, {"even", T_EVEN}, {"divisibleby", T_DIVISIBLEBY}, {"equalto", T_EQ},
    {"eq", T_EQ}, {"==", T_EQ}, {"sameas", T_EQ}, {"ne", T_NE}, {"!=", T_NE}, {"lt", T_LT},
    {"<", T_LT}, {"lessthan", T_LT}, {"gt", T_GT}, {">", T_GT}, {"greaterthan", T_GT},
    {"le", T_LE}, {"ge", T_GE}, {"in", T_IN},
};

static const char *const FNS[JFN_COUNT] = {
    [JFN_RANGE] = "range", [JFN_NAMESPACE] = "namespace", [JFN_DICT] = "dict",
    [JFN_RAISE] = "raise_exception", [JFN_STRFTIME] = "strftime_now",
};

int jinja_filter_id(const char *name)
{
    for (size_t i = 0; i < sizeof FILTERS / sizeof *FILTERS; i++)
        if (!strcmp(FILTERS[i].name, name))
            return FILTERS[i].id;
    return -1;
}

int jinja_test_id(const char *name)
{
    for (size_t i = 0; i < sizeof TESTS / sizeof *TESTS; i++)
        if (!strcmp(TESTS[i].name, name))
            return TESTS[i].id;
    return -1;
}

int jinja_fn_id(const char *name)
{
    for (int i = 0; i < JFN_COUNT; i++)
        if (!strcmp(FNS[i], name))
            return i;
    return -1;
}

/* ---- arguments -------------------------------------------------------------------------- */

/* Argument `pos` (positional index) or `kw` (keyword name, may be NULL); *given says which. */
static jv arg(jrender *r, const jx *x, int pos, const char *kw, bool *given)
{
    if (given)
        *given = false;
    if (pos >= 0 && pos < x->n_args) {
        if (given)
            *given = true;
        return r->eval(r, x->args[pos]);
    }
    for (int i = 0; kw && i < x->n_kw; i++)
        if (!strcmp(x->kw_names[i], kw)) {
            if (given)
                *given = true;
            return r->eval(r, x->kw[i]);
        }
    return UNDEF;
}

/* ---- tests ------------------------------------------------------------------------------ */

/* Test `id` on v with the arguments args[0..n) (`is` tests, select/reject); *ok false
 * (and the render's error set) when the test does not apply to v. */
static bool test_apply(jrender *r, int line, int id, jv v, const jv *args, int n, bool *ok)
{
    *ok = true;
    jv a = n > 0 ? args[0] : UNDEF;
    bool num = v.t == JV_INT || v.t == JV_BOOL;
    switch (id) {
    case T_DEFINED: return v.t != JV_UNDEF;
    case T_UNDEFINED: return v.t == JV_UNDEF;
    case T_NONE: return v.t == JV_NONE;
    case T_BOOLEAN: return v.t == JV_BOOL;
    case T_TRUE: return v.t == JV_BOOL && v.b;
    case T_FALSE: return v.t == JV_BOOL && !v.b;
    case T_INTEGER: return v.t == JV_INT;
    case T_NUMBER: return num;
    case T_STRING: return v.t == JV_STR;
    case T_MAPPING: return v.t == JV_DICT;
    case T_ITERABLE: return v.t == JV_STR || v.t == JV_LIST || v.t == JV_DICT || v.t == JV_UNDEF;
    case T_SEQUENCE: return v.t == JV_STR || v.t == JV_LIST || v.t == JV_DICT;
    case T_CALLABLE: return v.t == JV_FN;
    case T_EQ: return jv_equal(v, a);
    case T_NE: return !jv_equal(v, a);
    default: break;
    }
    if (id == T_IN) {
        if (a.t == JV_LIST) {
            for (size_t i = 0; i < a.l->n; i++)
                if (jv_equal(a.l->v[i], v))
                    return true;
            return false;
        }
        if (a.t == JV_DICT)
            return jv_dict_find(a, v).t != JV_UNDEF;
        if (a.t == JV_STR && v.t == JV_STR)
            return v.s->n <= a.s->n && memmem(a.s->p, a.s->n, v.s->p, v.s->n) != NULL;
        *ok = false;
        jinja_fail(r, line, FSDP_STATUS_FORMAT, "test 'in': cannot look in a %s",
                   jv_type_name(a));
        return false;
    }
    bool anum = a.t == JV_INT || a.t == JV_BOOL;
    int64_t x = v.t == JV_INT ? v.i : v.t == JV_BOOL ? v.b : 0;
    int64_t y = a.t == JV_INT ? a.i : a.t == JV_BOOL ? a.b : 0;
    bool need_arg = id != T_ODD && id != T_EVEN;
    if (!num || (need_arg && !anum)) {
        if (!num && (id >= T_LT && id <= T_GE) && v.t == JV_STR && a.t == JV_STR) {
            int c = strcmp(v.s->p, a.s->p);
            return id == T_LT ? c < 0 : id == T_GT ? c > 0 : id == T_LE ? c <= 0 : c >= 0;
        }
        *ok = false;
        jinja_fail(r, line, FSDP_STATUS_FORMAT, "a number test on a %s", jv_type_name(v));
        return false;
    }
    switch (id) {
    case T_ODD: return x % 2 != 0;
    case T_EVEN: return x % 2 == 0;
    case T_DIVISIBLEBY:
        if (y == 0) {
            *ok = false;
            jinja_fail(r, line, FSDP_STATUS_FORMAT, "divisibleby 0");
            return false;
        }
        return y == -1 || x % y == 0;
    case T_LT: return x < y;
    case T_GT: return x > y;
    case T_LE: return x <= y;
    case T_GE: return x >= y;
    }
    *ok = false;
    return false;
}

jv jinja_test(jrender *r, const jx *x, jv v)
{
    jv args[4];
    int n = x->n_args < 4 ? x->n_args : 4;
    for (int i = 0; i < n; i++)
        args[i] = r->eval(r, x->args[i]);
    bool ok;
    bool res = test_apply(r, x->line, x->op, v, args, n, &ok);
    return ok && r->st == FSDP_STATUS_OK ? jv_bool(res != x->negate) : UNDEF;
}

/* ---- filters ---------------------------------------------------------------------------- */

/* select/reject/selectattr/rejectattr. */
static jv select_items(jrender *r, const jx *x, jv v, bool attr, bool keep)
{
    if (v.t == JV_UNDEF)
        return jv_list(r, 1);
    if (v.t != JV_LIST)
        return jinja_fail_type(r, x, "select/reject", v);
    int first = attr ? 1 : 0;
    jv name = attr ? arg(r, x, 0, NULL, NULL) : UNDEF;
    if (attr && !jinja_want_str(r, x, name, "selectattr: the attribute"))
        return UNDEF;
    jv tname = arg(r, x, first, NULL, NULL);
    int test = -1;
    if (tname.t == JV_STR && (test = jinja_test_id(tname.s->p)) < 0)
        return jinja_fail(r, x->line, FSDP_STATUS_UNSUPPORTED, "the test '%s' is not supported",
                          tname.s->p), UNDEF;
    jv targs[4];
    int nt = 0;
    for (int i = first + 1; i < x->n_args && nt < 4; i++)
        targs[nt++] = r->eval(r, x->args[i]);
    jv out = jv_list(r, v.l->n);
    for (size_t i = 0; i < v.l->n && out.t == JV_LIST && r->st == FSDP_STATUS_OK; i++) {
        jv item = v.l->v[i], subject = item;
        if (attr)
            subject = (item.t == JV_DICT || item.t == JV_NS)
                          ? jv_dict_get(item, name.s->p, name.s->n) : UNDEF;
        bool ok = true, pass = test < 0 ? jv_truthy(subject)
                                        : test_apply(r, x->line, test, subject, targs, nt,
                                                     &ok);
        if (!ok)
            return UNDEF;
        if (pass == keep)
            jv_list_push(r, out, item);
    }
    return out;
}

static jv map_items(jrender *r, const jx *x, jv v)
{
    if (v.t == JV_UNDEF)
        return jv_list(r, 1);
    if (v.t != JV_LIST)
        return jinja_fail_type(r, x, "map", v);
    bool by_attr;
    jv attr = arg(r, x, -1, "attribute", &by_attr);
    jv fname = by_attr ? UNDEF : arg(r, x, 0, NULL, NULL);
    jx f = {.kind = JX_FILTER, .line = x->line};
    if (by_attr && !jinja_want_str(r, x, attr, "map: the attribute"))
        return UNDEF;
    if (!by_attr) {
        if (!jinja_want_str(r, x, fname, "map: the filter name"))
            return UNDEF;
        if ((f.op = jinja_filter_id(fname.s->p)) < 0)
            return jinja_fail(r, x->line, FSDP_STATUS_UNSUPPORTED, "the filter '%s' is not "
                              "supported", fname.s->p), UNDEF;
        f.name = fname.s->p;
        f.args = x->args + 1;
        f.n_args = x->n_args - 1;
    }
    jv dflt = arg(r, x, -1, "default", NULL);
    jv out = jv_list(r, v.l->n);
    for (size_t i = 0; i < v.l->n && out.t == JV_LIST && r->st == FSDP_STATUS_OK; i++) {
        jv item = v.l->v[i], m;
        if (by_attr) {
            m = (item.t == JV_DICT || item.t == JV_NS) ? jv_dict_get(item, attr.s->p, attr.s->n)
                                                       : UNDEF;
            if (m.t == JV_UNDEF)
                m = dflt;
        } else {
            m = jinja_filter(r, &f, item);
        }
        jv_list_push(r, out, m);
    }
    return out;
}

static jv to_list(jrender *r, const jx *x, jv v)
{
    jv out = jv_list(r, 4);
    if (v.t == JV_LIST) {
        for (size_t i = 0; i < v.l->n && out.t == JV_LIST; i++)
            jv_list_push(r, out, v.l->v[i]);
    } else if (v.t == JV_DICT) {
        for (size_t i = 0; i < v.d->n && out.t == JV_LIST; i++)
            jv_list_push(r, out, v.d->k[i]);
    } else if (v.t == JV_STR) {
        size_t n = jv_str_chars(v.s);
        for (size_t i = 0; i < n && out.t == JV_LIST; i++)
            jv_list_push(r, out, jv_substr(r, v, jv_str_offset(v.s, i),
                                           jv_str_offset(v.s, i + 1)));
    } else if (v.t != JV_UNDEF) {
        return jinja_fail_type(r, x, "list", v);
    }
    return out;
}

static jv items_of(jrender *r, const jx *x, jv v)
{
    if (v.t == JV_UNDEF)
        return jv_list(r, 1);
    if (v.t != JV_DICT && v.t != JV_NS)
        return jinja_fail_type(r, x, "items", v);
    jv out = jv_list(r, v.d->n);
    for (size_t i = 0; i < v.d->n && out.t == JV_LIST; i++) {
        jv pair = jv_list(r, 2);
        if (pair.t != JV_LIST)
            return UNDEF;
        jv_list_push(r, pair, v.d->k[i]);
        jv_list_push(r, pair, v.d->v[i]);
        jv_list_push(r, out, pair);
    }
    return out;
}

static jv join(jrender *r, const jx *x, jv v)
{
    jv sep = arg(r, x, 0, "d", NULL);
    if (sep.t == JV_UNDEF)
        sep = jv_str(r, "", 0);
    jv items = to_list(r, x, v), out = jv_str(r, "", 0);
    sep = jv_to_str(r, sep);
    for (size_t i = 0; items.t == JV_LIST && i < items.l->n && out.t == JV_STR; i++) {
        if (i)
            out = jv_concat(r, out, sep);
        jv s = jv_to_str(r, items.l->v[i]);
        if (s.t != JV_STR || out.t != JV_STR)
            return UNDEF;
        out = jv_concat(r, out, s);
    }
    return out;
}

static jv indent(jrender *r, const jx *x, jv v)
{
    jv w = arg(r, x, 0, "width", NULL), first = arg(r, x, 1, "first", NULL);
    jv blank = arg(r, x, 2, "blank", NULL);
    int64_t n = w.t == JV_INT ? w.i : 4;
    if (n < 0 || n > 1024)
        return jinja_fail(r, x->line, FSDP_STATUS_FORMAT, "indent: width %lld",
                          (long long)n), UNDEF;
    char *sp = jarena_alloc(&r->a, (size_t)n + 1);
    if (!sp)
        return jinja_fail(r, x->line, FSDP_STATUS_FORMAT, "out of render memory"), UNDEF;
    memset(sp, ' ', (size_t)n);
    jv pad = jv_str(r, sp, (size_t)n);
    jv lines = jstr_split(r, x, v, jv_str(r, "\n", 1), -1), out = jv_str(r, "", 0);
    for (size_t i = 0; lines.t == JV_LIST && i < lines.l->n && out.t == JV_STR; i++) {
        jv line = lines.l->v[i];
        if (i)
            out = jv_concat(r, out, jv_str(r, "\n", 1));
        bool empty = line.s->n == 0;
        if ((i > 0 || jv_truthy(first)) && (!empty || jv_truthy(blank)))
            out = jv_concat(r, out, pad);
        out = jv_concat(r, out, line);
    }
    return out;
}

/* trim(chars=None): whitespace, or the given characters, off both ends. */
static jv filter_trim(jrender *r, const jx *x, jv v)
{
    bool given;
    jv s = jv_to_str(r, v), chars = arg(r, x, 0, "chars", &given);
    if (given && chars.t != JV_NONE && !jinja_want_str(r, x, chars, "trim: the characters"))
        return UNDEF;
    return s.t == JV_STR ? jstr_strip(r, s, 3, given && chars.t == JV_STR ? chars.s : NULL)
                         : UNDEF;
}

/* tojson(indent=None, sort_keys=False); ensure_ascii and separators refused. */
static jv filter_tojson(jrender *r, const jx *x, jv v)
{
    jv ind = arg(r, x, 0, "indent", NULL), sort = arg(r, x, -1, "sort_keys", NULL);
    jv ascii = arg(r, x, -1, "ensure_ascii", NULL), sep = arg(r, x, -1, "separators", NULL);
    if (jv_truthy(ascii) || (sep.t != JV_UNDEF && sep.t != JV_NONE))
        return jinja_fail(r, x->line, FSDP_STATUS_UNSUPPORTED, "tojson: ensure_ascii and "
                          "separators are not supported"), UNDEF;
    if (ind.t != JV_UNDEF && ind.t != JV_NONE && (ind.t != JV_INT || ind.i < 0 ||
                                                  ind.i > 64))
        return jinja_fail(r, x->line, FSDP_STATUS_UNSUPPORTED, "tojson: indent must be a "
                          "small integer"), UNDEF;
    return jv_tojson(r, x->line, v, ind.t == JV_INT ? (int)ind.i : -1, jv_truthy(sort));
}

/* int(default=0): an int, a bool, or a decimal string with trailing whitespace. */
static jv filter_int(jrender *r, const jx *x, jv v)
{
    jv d = arg(r, x, 0, "default", NULL);
    if (v.t == JV_INT || v.t == JV_BOOL)
        return jv_int(v.t == JV_INT ? v.i : v.b);
    if (v.t == JV_STR) {
        char *end;
        long long k = strtoll(v.s->p, &end, 10);
        while (*end == ' ' || *end == '\t' || *end == '\n')
            end++;
        if (end != v.s->p && !*end)
            return jv_int(k);
    }
    return d.t == JV_INT ? d : jv_int(0);
}

/* reverse: a list (or a string's characters) in reverse order. */
static jv filter_reverse(jrender *r, const jx *x, jv v)
{
    jv l = to_list(r, x, v), out = jv_list(r, l.t == JV_LIST ? l.l->n : 1);
    for (size_t i = l.t == JV_LIST ? l.l->n : 0; i > 0 && out.t == JV_LIST; i--)
        jv_list_push(r, out, l.l->v[i - 1]);
    if (v.t != JV_STR || out.t != JV_LIST)
        return out;
    jv s = jv_str(r, "", 0);
    for (size_t i = 0; i < out.l->n && s.t == JV_STR; i++)
        s = jv_concat(r, s, out.l->v[i]);
    return s;
}

/* unique: each distinct item once, in the order of its first appearance. */
static jv filter_unique(jrender *r, const jx *x, jv v)
{
    jv l = to_list(r, x, v), out = jv_list(r, 4);
    for (size_t i = 0; l.t == JV_LIST && i < l.l->n && out.t == JV_LIST; i++) {
        bool seen = false;
        for (size_t j = 0; j < out.l->n && !seen; j++)
            seen = jv_equal(out.l->v[j], l.l->v[i]);
        if (!seen)
            jv_list_push(r, out, l.l->v[i]);
    }
    return out;
}

jv jinja_filter(jrender *r, const jx *x, jv v)
{
    switch (x->op) {
    case F_TRIM: return filter_trim(r, x, v);
    case F_TOJSON: return filter_tojson(r, x, v);
    case F_LENGTH:
        switch (v.t) {
        case JV_STR: return jv_int((int64_t)jv_str_chars(v.s));
        case JV_LIST: return jv_int((int64_t)v.l->n);
        case JV_DICT: case JV_NS: return jv_int((int64_t)v.d->n);
        case JV_UNDEF: return jv_int(0);
        default: return jinja_fail_type(r, x, "length", v);
        }
    case F_UPPER: case F_LOWER: case F_CAPITALIZE: case F_TITLE: {
        jv s = jv_to_str(r, v);
        if (s.t != JV_STR)
            return UNDEF;
        if (x->op == F_CAPITALIZE) /* Python: the first upper, the rest lower */
            s = jstr_recase(r, s, 'l');
        char how = x->op == F_UPPER ? 'u' : x->op == F_LOWER ? 'l' : x->op == F_TITLE ? 't' : 'c';
        return s.t == JV_STR ? jstr_recase(r, s, how) : UNDEF;
    }
    case F_STRING: case F_SAFE: return jv_to_str(r, v);
    case F_LIST: return to_list(r, x, v);
    case F_ITEMS: return items_of(r, x, v);
    case F_JOIN: return join(r, x, v);
    case F_FIRST: case F_LAST: {
        jv l = v.t == JV_STR ? to_list(r, x, v) : v;
        if (l.t == JV_UNDEF)
            return UNDEF;
        if (l.t != JV_LIST)
            return jinja_fail_type(r, x, x->op == F_FIRST ? "first" : "last", v);
        return l.l->n ? l.l->v[x->op == F_FIRST ? 0 : l.l->n - 1] : UNDEF;
    }
    case F_DEFAULT: {
        jv d = arg(r, x, 0, "default_value", NULL), b = arg(r, x, 1, "boolean", NULL);
        if (d.t == JV_UNDEF)
            d = jv_str(r, "", 0);
        return v.t == JV_UNDEF || (jv_truthy(b) && !jv_truthy(v)) ? d : v;
    }
    case F_REPLACE: {
        jv s = jv_to_str(r, v), o = arg(r, x, 0, "old", NULL), n = arg(r, x, 1, "new", NULL);
        jv c = arg(r, x, 2, "count", NULL);
        return s.t == JV_STR ? jstr_replace(r, x, s, o, n, c.t == JV_INT ? c.i : -1) : UNDEF;
    }
    case F_INT: return filter_int(r, x, v);
    case F_ABS:
        if (v.t != JV_INT || v.i == INT64_MIN)
            return jinja_fail_type(r, x, "abs", v);
        return jv_int(v.i < 0 ? -v.i : v.i);
    case F_REVERSE: return filter_reverse(r, x, v);
    case F_UNIQUE: return filter_unique(r, x, v);
    case F_SELECT: return select_items(r, x, v, false, true);
    case F_REJECT: return select_items(r, x, v, false, false);
    case F_SELECTATTR: return select_items(r, x, v, true, true);
    case F_REJECTATTR: return select_items(r, x, v, true, false);
    case F_MAP: return map_items(r, x, v);
    case F_INDENT: {
        jv s = jv_to_str(r, v);
        return s.t == JV_STR ? indent(r, x, s) : UNDEF;
    }
    }
    return jinja_fail(r, x->line, FSDP_STATUS_INTERNAL, "filter %d", x->op), UNDEF;
}

/* ---- methods ---------------------------------------------------------------------------- */

static bool is(const char *a, const char *b)
{
    return !strcmp(a, b);
}

jv jinja_method(jrender *r, const jx *call, jv obj, const char *name)
{
    if (obj.t == JV_STR) {
        bool given;
        if (is(name, "strip") || is(name, "lstrip") || is(name, "rstrip")) {
            jv chars = arg(r, call, 0, NULL, &given);
            if (given && chars.t != JV_NONE &&
                !jinja_want_str(r, call, chars, "strip: the characters"))
                return UNDEF;
            return jstr_strip(r, obj, name[0] == 's' ? 3 : name[0] == 'l' ? 1 : 2,
                              given && chars.t == JV_STR ? chars.s : NULL);
        }
        if (is(name, "split")) {
            jv m = arg(r, call, 1, "maxsplit", NULL);
            return jstr_split(r, call, obj, arg(r, call, 0, "sep", NULL), m.t == JV_INT ? m.i : -1);
        }
        if (is(name, "startswith") || is(name, "endswith"))
            return jstr_affix(r, call, obj, arg(r, call, 0, NULL, NULL), name[0] == 'e');
        if (is(name, "upper") || is(name, "lower") || is(name, "title"))
            return jstr_recase(r, obj, name[0] == 'u' ? 'u' : name[0] == 'l' ? 'l' : 't');
        if (is(name, "capitalize")) {
            jv s = jstr_recase(r, obj, 'l');
            return s.t == JV_STR ? jstr_recase(r, s, 'c') : UNDEF;
        }
        if (is(name, "replace")) {
            jv c = arg(r, call, 2, NULL, NULL);
            return jstr_replace(r, call, obj, arg(r, call, 0, NULL, NULL),
                                arg(r, call, 1, NULL, NULL), c.t == JV_INT ? c.i : -1);
        }
    } else if (obj.t == JV_DICT || obj.t == JV_NS) {
        if (is(name, "items"))
            return items_of(r, call, obj);
        if (is(name, "keys") || is(name, "values")) {
            jv out = jv_list(r, obj.d->n);
            for (size_t i = 0; i < obj.d->n && out.t == JV_LIST; i++)
                jv_list_push(r, out, name[0] == 'k' ? obj.d->k[i] : obj.d->v[i]);
            return out;
        }
        if (is(name, "get")) {
            jv v = jv_dict_find(obj, arg(r, call, 0, NULL, NULL));
            return v.t != JV_UNDEF ? v : arg(r, call, 1, NULL, NULL).t == JV_UNDEF
                                             ? (jv){.t = JV_NONE} : arg(r, call, 1, NULL, NULL);
        }
    }
    return jinja_fail(r, call->line, FSDP_STATUS_UNSUPPORTED, "the method %s.%s() is not "
                      "supported", jv_type_name(obj), name), UNDEF;
}

/* ---- functions -------------------------------------------------------------------------- */

static jv fn_range(jrender *r, const jx *call)
{
    int64_t v[3] = {0, 0, 1};
    if (call->n_args < 1 || call->n_args > 3)
        return jinja_fail(r, call->line, FSDP_STATUS_FORMAT, "range() takes 1 to 3 integers"),
               UNDEF;
    for (int i = 0; i < call->n_args; i++) {
        jv a = r->eval(r, call->args[i]);
        if (a.t != JV_INT && a.t != JV_BOOL)
            return jinja_fail_type(r, call, "range", a);
        v[call->n_args == 1 ? 1 : i] = a.t == JV_INT ? a.i : a.b;
    }
    if (v[2] == 0)
        return jinja_fail(r, call->line, FSDP_STATUS_FORMAT, "range() step is zero"), UNDEF;
    jv out = jv_list(r, 4);
    for (int64_t i = v[0]; (v[2] > 0 ? i < v[1] : i > v[1]) && out.t == JV_LIST; i += v[2]) {
        if (++r->steps > r->max_steps)
            return jinja_fail(r, call->line, FSDP_STATUS_FORMAT, "the template ran past %llu "
                              "steps", (unsigned long long)r->max_steps), UNDEF;
        if (!jv_list_push(r, out, jv_int(i)))
            return UNDEF;
        if ((v[2] > 0 && i > INT64_MAX - v[2]) || (v[2] < 0 && i < INT64_MIN - v[2]))
            break;
    }
    return out;
}

static jv fn_strftime(jrender *r, const jx *call)
{
    jv f = arg(r, call, 0, NULL, NULL);
    if (!jinja_want_str(r, call, f, "strftime_now: the format"))
        return UNDEF;
    const fsdp_jinja_input *in = r->in;
    struct tm tm = {.tm_year = in->year - 1900, .tm_mon = in->month - 1, .tm_mday = in->day};
    time_t t = timegm(&tm); /* fills the weekday and day of the year */
    gmtime_r(&t, &tm);
    char buf[512];
    size_t n = f.s->n ? strftime(buf, sizeof buf, f.s->p, &tm) : 0;
    if (f.s->n && n == 0)
        return jinja_fail(r, call->line, FSDP_STATUS_FORMAT, "strftime_now: the format gives "
                          "nothing or more than %zu bytes", sizeof buf), UNDEF;
    return jv_str(r, buf, n);
}

jv jinja_call_fn(jrender *r, const jx *call, int fn)
{
    switch (fn) {
    case JFN_RANGE: return fn_range(r, call);
    case JFN_NAMESPACE:
    case JFN_DICT: {
        jv d = jv_dict(r, (size_t)call->n_kw + 1, fn == JFN_NAMESPACE ? JV_NS : JV_DICT);
        if (call->n_args > 1)
            return jinja_fail(r, call->line, FSDP_STATUS_FORMAT, "%s() takes keyword arguments "
                              "and at most one dict", FNS[fn]), UNDEF;
        if (call->n_args == 1) {
            jv src = r->eval(r, call->args[0]);
            if (src.t != JV_DICT && src.t != JV_NS)
                return jinja_fail_type(r, call, FNS[fn], src);
            for (size_t i = 0; i < src.d->n && d.t != JV_UNDEF; i++)
                jv_dict_put(r, d, src.d->k[i], src.d->v[i]);
        }
        for (int i = 0; i < call->n_kw && d.t != JV_UNDEF; i++)
            jv_dict_put(r, d, jv_str(r, call->kw_names[i], strlen(call->kw_names[i])),
                        r->eval(r, call->kw[i]));
        return r->st == FSDP_STATUS_OK ? d : UNDEF;
    }
    case JFN_RAISE: {
        jv m = jv_to_str(r, arg(r, call, 0, NULL, NULL));
        if (r->st != FSDP_STATUS_OK)
            return UNDEF;
        return jinja_fail(r, call->line, FSDP_STATUS_INVALID_ARG, "the template refused the "
                          "conversation: %.300s", m.t == JV_STR ? m.s->p : "?"), UNDEF;
    }
    case JFN_STRFTIME: return fn_strftime(r, call);
    }
    return jinja_fail(r, call->line, FSDP_STATUS_INTERNAL, "function %d", fn), UNDEF;
}
