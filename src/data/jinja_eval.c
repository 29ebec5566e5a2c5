/*
 * jinja_eval.c - rendering a parsed template (jinja.h): scopes, statements,
 * expressions and operators, the output with its content marks. The top of
 * the Jinja subset: filters, tests, methods and functions are
 * jinja_builtin.c's, which evaluate their arguments through jrender.eval.
 *
 * Scopes follow Jinja's: a for loop opens one (what it sets stays inside
 * the loop, which is why templates carry state out of loops in a
 * namespace()), if blocks do not. Python's semantics where templates lean
 * on them: `a or b` yields an operand, negative indexes and slices count
 * from the end, strings index by code point, an undefined value renders as
 * nothing, is false, iterates as empty and is an error anywhere else.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "data/jinja_builtin.h"

struct jscope {
    jscope *up;
    const char **names;
    jv *vals;
    int n, cap;
};

static const jv UNDEF = {.t = JV_UNDEF};

static jv jinja_eval(jrender *r, const jx *x);

/* ---- scopes ----------------------------------------------------------------------------- */

static bool scope_push(jrender *r)
{
    jscope *s = jarena_alloc(&r->a, sizeof *s);
    if (!s)
        return jinja_fail(r, 0, FSDP_STATUS_FORMAT, "out of render memory"), false;
    s->up = r->scope;
    r->scope = s;
    return true;
}

static bool scope_set(jrender *r, const char *name, jv v)
{
    jscope *s = r->scope;
    for (int i = 0; i < s->n; i++)
        if (!strcmp(s->names[i], name)) {
            s->vals[i] = v;
            return true;
        }
    if (s->n == s->cap) {
        int cap = s->cap ? 2 * s->cap : 8;
        const char **nn = jarena_alloc(&r->a, (size_t)cap * sizeof *nn);
        jv *nv = jarena_alloc(&r->a, (size_t)cap * sizeof *nv);
        if (!nn || !nv)
            return jinja_fail(r, 0, FSDP_STATUS_FORMAT, "out of render memory"), false;
        if (s->n) {
            memcpy(nn, s->names, (size_t)s->n * sizeof *nn);
            memcpy(nv, s->vals, (size_t)s->n * sizeof *nv);
        }
        s->names = nn;
        s->vals = nv;
        s->cap = cap;
    }
    s->names[s->n] = name;
    s->vals[s->n++] = v;
    return true;
}

static jv lookup(jrender *r, const char *name)
{
    for (jscope *s = r->scope; s; s = s->up)
        for (int i = 0; i < s->n; i++)
            if (!strcmp(s->names[i], name))
                return s->vals[i];
    int fn = jinja_fn_id(name);
    return fn >= 0 ? (jv){.t = JV_FN, .fn = fn} : UNDEF;
}

/* ---- output ----------------------------------------------------------------------------- */

static bool jinja_emit(jrender *r, const jstr *s)
{
    size_t max = r->in->max_bytes ? r->in->max_bytes : FSDP_JINJA_MAX_BYTES;
    if (r->out_n + s->n + 1 > max)
        return jinja_fail(r, 0, FSDP_STATUS_FORMAT, "the rendering is longer than %zu MiB",
                          max >> 20), false;
    if (r->out_n + s->n + 1 > r->out_cap) {
        size_t cap = r->out_cap ? r->out_cap : 4096;
        while (cap < r->out_n + s->n + 1)
            cap *= 2;
        char *p = realloc(r->out, cap);
        if (!p)
            return jinja_fail(r, 0, FSDP_STATUS_OOM, "out of host memory rendering"), false;
        r->out = p;
        r->out_cap = cap;
    }
    size_t at = r->out_n;
    memcpy(r->out + at, s->p, s->n);
    r->out_n += s->n;
    for (int i = 0; i < s->n_marks; i++) {
        jmark m = {s->marks[i].b + at, s->marks[i].e + at, s->marks[i].msg};
        if (r->n_marks && r->marks[r->n_marks - 1].e == m.b &&
            r->marks[r->n_marks - 1].msg == m.msg) {
            r->marks[r->n_marks - 1].e = m.e;
            continue;
        }
        if (r->n_marks == r->cap_marks) {
            int cap = r->cap_marks ? 2 * r->cap_marks : 16;
            jmark *nm = realloc(r->marks, (size_t)cap * sizeof *nm);
            if (!nm)
                return jinja_fail(r, 0, FSDP_STATUS_OOM, "out of host memory rendering"), false;
            r->marks = nm;
            r->cap_marks = cap;
        }
        r->marks[r->n_marks++] = m;
    }
    return true;
}

/* ---- operators -------------------------------------------------------------------------- */

static bool is_num(jv v)
{
    return v.t == JV_INT || v.t == JV_BOOL;
}
static int64_t num(jv v)
{
    return v.t == JV_INT ? v.i : v.b;
}

static jv undefined_use(jrender *r, int line, const char *what)
{
    jinja_fail(r, line, FSDP_STATUS_FORMAT, "an undefined value used in %s", what);
    return UNDEF;
}

static jv repeat(jrender *r, int line, jv v, int64_t k)
{
    if (k < 0)
        k = 0;
    if (v.t == JV_STR) {
        if (v.s->n && (uint64_t)k > (r->a.cap ? r->a.cap : SIZE_MAX) / v.s->n)
            return jinja_fail(r, line, FSDP_STATUS_FORMAT, "a string repeated past the memory "
                              "budget"), UNDEF;
        char *p = jarena_alloc(&r->a, v.s->n * (size_t)k + 1);
        if (!p)
            return jinja_fail(r, line, FSDP_STATUS_FORMAT, "out of render memory"), UNDEF;
        for (int64_t i = 0; i < k; i++)
            memcpy(p + (size_t)i * v.s->n, v.s->p, v.s->n);
        return jv_str(r, p, v.s->n * (size_t)k);
    }
    jv out = jv_list(r, v.l->n * (size_t)(k ? k : 1));
    for (int64_t i = 0; i < k && out.t == JV_LIST; i++)
        for (size_t j = 0; j < v.l->n; j++)
            if (!jv_list_push(r, out, v.l->v[j]))
                return UNDEF;
    return out;
}

static int cmp_values(jrender *r, int line, jv a, jv b, bool *ok)
{
    *ok = true;
    if (is_num(a) && is_num(b))
        return (num(a) > num(b)) - (num(a) < num(b));
    if (a.t == JV_STR && b.t == JV_STR) {
        size_t n = a.s->n < b.s->n ? a.s->n : b.s->n;
        int c = memcmp(a.s->p, b.s->p, n);
        return c ? (c > 0) - (c < 0) : (a.s->n > b.s->n) - (a.s->n < b.s->n);
    }
    *ok = false;
    jinja_fail(r, line, FSDP_STATUS_FORMAT, "cannot order a %s and a %s", jv_type_name(a),
               jv_type_name(b));
    return 0;
}

static jv contains(jrender *r, int line, jv item, jv in)
{
    switch (in.t) {
    case JV_STR:
        if (item.t != JV_STR)
            return jinja_fail(r, line, FSDP_STATUS_FORMAT, "'in <string>' needs a string on the "
                              "left, not a %s", jv_type_name(item)), UNDEF;
        if (item.s->n == 0)
            return jv_bool(true);
        for (size_t i = 0; i + item.s->n <= in.s->n; i++)
            if (!memcmp(in.s->p + i, item.s->p, item.s->n))
                return jv_bool(true);
        return jv_bool(false);
    case JV_LIST:
        for (size_t i = 0; i < in.l->n; i++)
            if (jv_equal(in.l->v[i], item))
                return jv_bool(true);
        return jv_bool(false);
    case JV_DICT:
    case JV_NS: return jv_bool(jv_dict_find(in, item).t != JV_UNDEF);
    case JV_UNDEF: return undefined_use(r, line, "'in'");
    default:
        return jinja_fail(r, line, FSDP_STATUS_FORMAT, "'in' a %s", jv_type_name(in)), UNDEF;
    }
}

static jv binop(jrender *r, const jx *x, jv a, jv b)
{
    int line = x->line;
    bool ok;
    switch (x->op) {
    case JOP_EQ: return jv_bool(jv_equal(a, b));
    case JOP_NE: return jv_bool(!jv_equal(a, b));
    case JOP_LT: { int c = cmp_values(r, line, a, b, &ok); return ok ? jv_bool(c < 0) : UNDEF; }
    case JOP_LE: { int c = cmp_values(r, line, a, b, &ok); return ok ? jv_bool(c <= 0) : UNDEF; }
    case JOP_GT: { int c = cmp_values(r, line, a, b, &ok); return ok ? jv_bool(c > 0) : UNDEF; }
    case JOP_GE: { int c = cmp_values(r, line, a, b, &ok); return ok ? jv_bool(c >= 0) : UNDEF; }
    case JOP_IN: return contains(r, line, a, b);
    case JOP_NOTIN: {
        jv v = contains(r, line, a, b);
        return v.t == JV_BOOL ? jv_bool(!v.b) : v;
    }
    case JOP_CONCAT: {
        jv sa = jv_to_str(r, a), sb = jv_to_str(r, b);
        return sa.t == JV_STR && sb.t == JV_STR ? jv_concat(r, sa, sb) : UNDEF;
    }
    default: break;
    }
    if (a.t == JV_UNDEF || b.t == JV_UNDEF)
        return undefined_use(r, line, "arithmetic");
    if (is_num(a) && is_num(b)) {
        int64_t p = num(a), q = num(b), v;
        switch (x->op) {
        case JOP_ADD: if (__builtin_add_overflow(p, q, &v)) goto overflow; return jv_int(v);
        case JOP_SUB: if (__builtin_sub_overflow(p, q, &v)) goto overflow; return jv_int(v);
        case JOP_MUL: if (__builtin_mul_overflow(p, q, &v)) goto overflow; return jv_int(v);
        case JOP_FLOORDIV:
        case JOP_MOD: {
            if (q == 0)
                return jinja_fail(r, line, FSDP_STATUS_FORMAT, "division by zero"), UNDEF;
            if (p == INT64_MIN && q == -1)
                goto overflow;
            int64_t d = p / q, m = p % q;
            if (m != 0 && ((m < 0) != (q < 0))) { /* Python floors */
                d--;
                m += q;
            }
            return jv_int(x->op == JOP_MOD ? m : d);
        }
        }
    }
    if (x->op == JOP_ADD && a.t == JV_STR && b.t == JV_STR)
        return jv_concat(r, a, b);
    if (x->op == JOP_ADD && a.t == JV_LIST && b.t == JV_LIST) {
        jv out = jv_list(r, a.l->n + b.l->n);
        for (size_t i = 0; i < a.l->n && out.t == JV_LIST; i++)
            jv_list_push(r, out, a.l->v[i]);
        for (size_t i = 0; i < b.l->n && out.t == JV_LIST; i++)
            jv_list_push(r, out, b.l->v[i]);
        return out;
    }
    if (x->op == JOP_MUL && (a.t == JV_STR || a.t == JV_LIST) && is_num(b))
        return repeat(r, line, a, num(b));
    if (x->op == JOP_MUL && (b.t == JV_STR || b.t == JV_LIST) && is_num(a))
        return repeat(r, line, b, num(a));
    if (x->op == JOP_MOD && a.t == JV_STR)
        return jinja_fail(r, line, FSDP_STATUS_UNSUPPORTED, "'%%' string formatting is not "
                          "supported"), UNDEF;
    static const char *const names[] = {"+", "-", "*", "//", "%"};
    return jinja_fail(r, line, FSDP_STATUS_FORMAT, "cannot apply '%s' to a %s and a %s",
                      names[x->op], jv_type_name(a), jv_type_name(b)), UNDEF;
overflow:
    return jinja_fail(r, line, FSDP_STATUS_FORMAT, "integer overflow"), UNDEF;
}

/* ---- subscripts ------------------------------------------------------------------------- */

static jv index_of(jrender *r, int line, jv obj, jv idx)
{
    switch (obj.t) {
    case JV_LIST:
    case JV_STR: {
        if (!is_num(idx))
            return UNDEF;
        size_t n = obj.t == JV_LIST ? obj.l->n : jv_str_chars(obj.s);
        int64_t i = num(idx);
        if (i < 0)
            i += (int64_t)n;
        if (i < 0 || (uint64_t)i >= n)
            return UNDEF;
        if (obj.t == JV_LIST)
            return obj.l->v[i];
        size_t b = jv_str_offset(obj.s, (size_t)i), e = jv_str_offset(obj.s, (size_t)i + 1);
        return jv_substr(r, obj, b, e);
    }
    case JV_DICT:
    case JV_NS: return jv_dict_find(obj, idx);
    case JV_UNDEF: return undefined_use(r, line, "a subscript");
    default: return UNDEF;
    }
}

static bool slice_part(jrender *r, const jx *x, int64_t *v, bool *given)
{
    *given = false;
    if (!x)
        return true;
    jv p = jinja_eval(r, x);
    if (p.t == JV_NONE || p.t == JV_UNDEF)
        return r->st == FSDP_STATUS_OK;
    if (!is_num(p))
        return jinja_fail(r, x->line, FSDP_STATUS_FORMAT, "a slice bound must be an integer, "
                          "not a %s", jv_type_name(p)), false;
    *v = num(p);
    *given = true;
    return true;
}

static jv slice_of(jrender *r, const jx *x, jv obj)
{
    int64_t start = 0, stop = 0, step = 1;
    bool has_start, has_stop, has_step;
    if (!slice_part(r, x->b, &start, &has_start) || !slice_part(r, x->c, &stop, &has_stop) ||
        !slice_part(r, x->d, &step, &has_step))
        return UNDEF;
    if (obj.t == JV_UNDEF)
        return undefined_use(r, x->line, "a slice");
    if (obj.t != JV_LIST && obj.t != JV_STR)
        return jinja_fail(r, x->line, FSDP_STATUS_FORMAT, "cannot slice a %s",
                          jv_type_name(obj)), UNDEF;
    if (!has_step)
        step = 1;
    if (step == 0)
        return jinja_fail(r, x->line, FSDP_STATUS_FORMAT, "slice step cannot be zero"), UNDEF;
    int64_t n = (int64_t)(obj.t == JV_LIST ? obj.l->n : jv_str_chars(obj.s));
    int64_t lo = step > 0 ? 0 : -1, hi = step > 0 ? n : n - 1;
    if (!has_start)
        start = step > 0 ? 0 : n - 1;
    else if (start < 0 && (start += n) < lo)
        start = lo;
    else if (start > hi)
        start = hi;
    if (!has_stop)
        stop = step > 0 ? n : -1;
    else if (stop < 0 && (stop += n) < lo)
        stop = lo;
    else if (stop > hi)
        stop = hi;
    if (obj.t == JV_STR && step == 1) { /* keeps the content marks */
        if (stop < start)
            stop = start;
        return jv_substr(r, obj, jv_str_offset(obj.s, (size_t)start),
                         jv_str_offset(obj.s, (size_t)stop));
    }
    jv out = obj.t == JV_LIST ? jv_list(r, 0) : UNDEF;
    char *buf = NULL;
    size_t k = 0;
    if (obj.t == JV_STR && !(buf = jarena_alloc(&r->a, obj.s->n + 1)))
        return jinja_fail(r, x->line, FSDP_STATUS_FORMAT, "out of render memory"), UNDEF;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
        if (obj.t == JV_LIST) {
            if (out.t != JV_LIST || !jv_list_push(r, out, obj.l->v[i]))
                return UNDEF;
        } else {
            size_t b = jv_str_offset(obj.s, (size_t)i), e = jv_str_offset(obj.s, (size_t)i + 1);
            memcpy(buf + k, obj.s->p + b, e - b);
            k += e - b;
        }
        if (++r->steps > r->max_steps)
            return jinja_fail(r, x->line, FSDP_STATUS_FORMAT, "the template ran past %llu "
                              "steps", (unsigned long long)r->max_steps), UNDEF;
    }
    return obj.t == JV_LIST ? out : jv_str(r, buf, k);
}

/* ---- expressions ------------------------------------------------------------------------ */

static jv call(jrender *r, const jx *x)
{
    const jx *f = x->a;
    if (f->kind == JX_ATTR) {
        jv obj = jinja_eval(r, f->a);
        if (r->st != FSDP_STATUS_OK)
            return UNDEF;
        if (obj.t == JV_NS) { /* a namespace's attribute may hold a function */
            jv v = jv_dict_get(obj, f->name, strlen(f->name));
            if (v.t == JV_FN)
                return jinja_call_fn(r, x, v.fn);
        }
        if (obj.t == JV_UNDEF)
            return undefined_use(r, x->line, "a method call");
        return jinja_method(r, x, obj, f->name);
    }
    jv fn = jinja_eval(r, f);
    if (r->st != FSDP_STATUS_OK)
        return UNDEF;
    if (fn.t == JV_FN)
        return jinja_call_fn(r, x, fn.fn);
    if (fn.t == JV_UNDEF && f->kind == JX_VAR)
        return jinja_fail(r, x->line, FSDP_STATUS_FORMAT, "'%s' is undefined (no such "
                          "function)", f->name), UNDEF;
    return jinja_fail(r, x->line, FSDP_STATUS_FORMAT, "a %s is not callable",
                      jv_type_name(fn)), UNDEF;
}

static jv jinja_eval(jrender *r, const jx *x)
{
    if (r->st != FSDP_STATUS_OK)
        return UNDEF;
    if (++r->steps > r->max_steps)
        return jinja_fail(r, x->line, FSDP_STATUS_FORMAT, "the template ran past %llu steps",
                          (unsigned long long)r->max_steps), UNDEF;
    jv a, b;
    switch (x->kind) {
    case JX_LIT: return x->lit;
    case JX_VAR: return lookup(r, x->name);
    case JX_ATTR:
        a = jinja_eval(r, x->a);
        if (a.t == JV_DICT || a.t == JV_NS)
            return jv_dict_get(a, x->name, strlen(x->name));
        if (a.t == JV_UNDEF && r->st == FSDP_STATUS_OK)
            return jinja_fail(r, x->line, FSDP_STATUS_FORMAT, "'.%s' of an undefined value",
                              x->name), UNDEF;
        return UNDEF;
    case JX_INDEX:
        a = jinja_eval(r, x->a);
        b = jinja_eval(r, x->b);
        return r->st == FSDP_STATUS_OK ? index_of(r, x->line, a, b) : UNDEF;
    case JX_SLICE:
        a = jinja_eval(r, x->a);
        return r->st == FSDP_STATUS_OK ? slice_of(r, x, a) : UNDEF;
    case JX_CALL: return call(r, x);
    case JX_FILTER:
        a = jinja_eval(r, x->a);
        return r->st == FSDP_STATUS_OK ? jinja_filter(r, x, a) : UNDEF;
    case JX_TEST:
        a = jinja_eval(r, x->a);
        return r->st == FSDP_STATUS_OK ? jinja_test(r, x, a) : UNDEF;
    case JX_NOT: return jv_bool(!jv_truthy(jinja_eval(r, x->a)));
    case JX_NEG:
        a = jinja_eval(r, x->a);
        if (!is_num(a))
            return r->st == FSDP_STATUS_OK ? (jinja_fail(r, x->line, FSDP_STATUS_FORMAT,
                                              "cannot negate a %s", jv_type_name(a)), UNDEF)
                                           : UNDEF;
        if (num(a) == INT64_MIN)
            return jinja_fail(r, x->line, FSDP_STATUS_FORMAT, "integer overflow"), UNDEF;
        return jv_int(-num(a));
    case JX_AND:
        a = jinja_eval(r, x->a);
        return jv_truthy(a) ? jinja_eval(r, x->b) : a;
    case JX_OR:
        a = jinja_eval(r, x->a);
        return jv_truthy(a) ? a : jinja_eval(r, x->b);
    case JX_COND:
        if (jv_truthy(jinja_eval(r, x->a)))
            return jinja_eval(r, x->b);
        return x->c ? jinja_eval(r, x->c) : UNDEF;
    case JX_BIN:
        a = jinja_eval(r, x->a);
        b = jinja_eval(r, x->b);
        return r->st == FSDP_STATUS_OK ? binop(r, x, a, b) : UNDEF;
    case JX_LIST: {
        jv l = jv_list(r, (size_t)x->n_args);
        for (int i = 0; i < x->n_args && l.t == JV_LIST; i++)
            if (!jv_list_push(r, l, jinja_eval(r, x->args[i])))
                return UNDEF;
        return l;
    }
    case JX_DICT: {
        jv d = jv_dict(r, (size_t)x->n_args / 2 + 1, JV_DICT);
        for (int i = 0; i + 1 < x->n_args && d.t == JV_DICT; i += 2) {
            jv k = jinja_eval(r, x->args[i]), v = jinja_eval(r, x->args[i + 1]);
            if (!jv_dict_put(r, d, k, v))
                return UNDEF;
        }
        return d;
    }
    }
    return UNDEF;
}

/* ---- statements ------------------------------------------------------------------------- */

static bool exec_body(jrender *r, const jbody *b);

static bool bind_targets(jrender *r, const js *s, jv item)
{
    if (!s->t2)
        return scope_set(r, s->t1, item);
    if (item.t != JV_LIST || item.l->n != 2)
        return jinja_fail(r, s->line, FSDP_STATUS_FORMAT, "cannot unpack a %s into %s, %s",
                          jv_type_name(item), s->t1, s->t2), false;
    return scope_set(r, s->t1, item.l->v[0]) && scope_set(r, s->t2, item.l->v[1]);
}

/* The items a for loop walks: a list's items, a dict's keys, a string's characters. */
static jv iter_items(jrender *r, const js *s, jv v)
{
    switch (v.t) {
    case JV_LIST: return v;
    case JV_UNDEF: return jv_list(r, 1);
    case JV_DICT:
    case JV_NS: {
        jv l = jv_list(r, v.d->n);
        for (size_t i = 0; i < v.d->n && l.t == JV_LIST; i++)
            jv_list_push(r, l, v.d->k[i]);
        return l;
    }
    case JV_STR: {
        size_t n = jv_str_chars(v.s);
        jv l = jv_list(r, n);
        for (size_t i = 0; i < n && l.t == JV_LIST; i++)
            jv_list_push(r, l, jv_substr(r, v, jv_str_offset(v.s, i), jv_str_offset(v.s, i + 1)));
        return l;
    }
    default:
        return jinja_fail(r, s->line, FSDP_STATUS_FORMAT, "cannot loop over a %s",
                          jv_type_name(v)), UNDEF;
    }
}

static jv str_lit(jrender *r, const char *s)
{
    return jv_str(r, s, strlen(s));
}

static bool exec_for(jrender *r, const js *s)
{
    jv items = iter_items(r, s, jinja_eval(r, s->x));
    if (r->st != FSDP_STATUS_OK)
        return false;
    if (!scope_push(r))
        return false;
    jscope *outer = r->scope->up;
    if (s->cond) { /* the `if` filter runs first: loop.length counts what passes */
        jv kept = jv_list(r, items.l->n);
        for (size_t i = 0; i < items.l->n && r->st == FSDP_STATUS_OK; i++) {
            if (bind_targets(r, s, items.l->v[i]) && jv_truthy(jinja_eval(r, s->cond)))
                jv_list_push(r, kept, items.l->v[i]);
        }
        items = kept;
    }
    static const char *const keys[] = {"index", "index0", "revindex", "revindex0", "first",
                                       "last", "length", "previtem", "nextitem", "depth",
                                       "depth0"};
    size_t n = r->st == FSDP_STATUS_OK ? items.l->n : 0;
    jv loop = jv_dict(r, 11, JV_DICT); /* one object, updated each iteration, as Jinja's */
    for (int k = 0; k < 11 && loop.t == JV_DICT; k++)
        jv_dict_put(r, loop, str_lit(r, keys[k]), UNDEF);
    for (size_t i = 0; i < n && r->st == FSDP_STATUS_OK; i++) {
        jv vals[11] = {jv_int((int64_t)i + 1), jv_int((int64_t)i), jv_int((int64_t)(n - i)),
                       jv_int((int64_t)(n - i - 1)), jv_bool(i == 0), jv_bool(i + 1 == n),
                       jv_int((int64_t)n), i ? items.l->v[i - 1] : UNDEF,
                       i + 1 < n ? items.l->v[i + 1] : UNDEF, jv_int(1), jv_int(0)};
        memcpy(loop.d->v, vals, sizeof vals);
        if (!scope_set(r, "loop", loop) || !bind_targets(r, s, items.l->v[i]))
            break;
        exec_body(r, &s->body);
        if (r->flow == JS_BREAK) {
            r->flow = 0;
            break;
        }
        r->flow = 0;
    }
    r->scope = outer;
    if (r->st == FSDP_STATUS_OK && n == 0 && s->orelse.n)
        exec_body(r, &s->orelse);
    return r->st == FSDP_STATUS_OK;
}

static bool exec_set(jrender *r, const js *s)
{
    jv v = jinja_eval(r, s->x);
    if (r->st != FSDP_STATUS_OK)
        return false;
    if (!s->t2)
        return scope_set(r, s->t1, v);
    jv ns = lookup(r, s->t1);
    if (ns.t != JV_NS)
        return jinja_fail(r, s->line, FSDP_STATUS_FORMAT, "cannot set '%s.%s': '%s' is a %s, "
                          "not a namespace()", s->t1, s->t2, s->t1, jv_type_name(ns)), false;
    return jv_dict_put(r, ns, str_lit(r, s->t2), v);
}

static bool exec_body(jrender *r, const jbody *b)
{
    for (int i = 0; i < b->n && r->st == FSDP_STATUS_OK && !r->flow; i++) {
        const js *s = b->s[i];
        if (++r->steps > r->max_steps)
            return jinja_fail(r, s->line, FSDP_STATUS_FORMAT, "the template ran past %llu steps",
                              (unsigned long long)r->max_steps), false;
        switch (s->kind) {
        case JS_TEXT: {
            jstr t = {.p = s->text, .n = s->n};
            jinja_emit(r, &t);
            break;
        }
        case JS_OUT: {
            jv v = jv_to_str(r, jinja_eval(r, s->x));
            if (v.t == JV_STR)
                jinja_emit(r, v.s);
            break;
        }
        case JS_IF:
            if (jv_truthy(jinja_eval(r, s->x)))
                exec_body(r, &s->body);
            else if (r->st == FSDP_STATUS_OK)
                exec_body(r, &s->orelse);
            break;
        case JS_FOR: exec_for(r, s); break;
        case JS_SET: exec_set(r, s); break;
        case JS_BREAK:
        case JS_CONTINUE: r->flow = s->kind; break;
        case JS_BLOCK: exec_body(r, &s->body); break;
        }
    }
    return r->st == FSDP_STATUS_OK;
}

/* ---- entry ------------------------------------------------------------------------------ */

static bool bind_inputs(jrender *r)
{
    const fsdp_jinja_input *in = r->in;
    jv msgs = jv_list(r, (size_t)in->n_msgs + 1);
    jv k_role = str_lit(r, "role"), k_content = str_lit(r, "content");
    for (int i = 0; i < in->n_msgs && r->st == FSDP_STATUS_OK; i++) {
        const fsdp_jinja_msg *m = &in->msgs[i];
        jmark mark = {0, m->len, i};
        jv d = jv_dict(r, 2, JV_DICT);
        if (d.t != JV_DICT)
            break;
        jv_dict_put(r, d, k_role, str_lit(r, m->role));
        jv_dict_put(r, d, k_content, jv_str_marked(r, m->content, m->len, &mark, m->len > 0));
        jv_list_push(r, msgs, d);
    }
    if (r->st != FSDP_STATUS_OK)
        return false;
    scope_set(r, "messages", msgs);
    scope_set(r, "add_generation_prompt", jv_bool(in->add_generation_prompt));
    scope_set(r, "tools", (jv){.t = JV_NONE});     /* as transformers passes them */
    scope_set(r, "documents", (jv){.t = JV_NONE});
    if (in->bos_token)
        scope_set(r, "bos_token", str_lit(r, in->bos_token));
    if (in->eos_token)
        scope_set(r, "eos_token", str_lit(r, in->eos_token));
    return r->st == FSDP_STATUS_OK;
}

void fsdp_jinja_output_free(fsdp_jinja_output *o)
{
    free(o->text);
    free(o->spans);
    memset(o, 0, sizeof *o);
}

fsdp_status fsdp_jinja_render(const fsdp_jinja *t, const fsdp_jinja_input *in,
                              fsdp_jinja_output *out)
{
    memset(out, 0, sizeof *out);
    jrender r = {.t = t, .in = in, .eval = jinja_eval,
                 .max_steps = in->max_steps ? in->max_steps : FSDP_JINJA_MAX_STEPS};
    r.a.cap = in->max_bytes ? in->max_bytes : FSDP_JINJA_MAX_BYTES;
    if (scope_push(&r) && bind_inputs(&r))
        exec_body(&r, &t->root);
    jarena_free(&r.a);
    if (r.st == FSDP_STATUS_OK && !r.out && !(r.out = malloc(1)))
        jinja_fail(&r, 0, FSDP_STATUS_OOM, "out of host memory rendering");
    fsdp_jinja_span *spans = NULL;
    if (r.st == FSDP_STATUS_OK && r.n_marks &&
        !(spans = malloc((size_t)r.n_marks * sizeof *spans)))
        jinja_fail(&r, 0, FSDP_STATUS_OOM, "out of host memory rendering");
    if (r.st != FSDP_STATUS_OK) {
        free(r.out);
        free(r.marks);
        free(spans);
        return r.st;
    }
    for (int i = 0; i < r.n_marks; i++)
        spans[i] = (fsdp_jinja_span){r.marks[i].b, r.marks[i].e, r.marks[i].msg};
    free(r.marks);
    r.out[r.out_n] = '\0';
    *out = (fsdp_jinja_output){.text = r.out, .len = r.out_n, .spans = spans,
                               .n_spans = r.n_marks};
    return FSDP_STATUS_OK;
}
