/*
 * jinja_value.c - the bottom of the Jinja subset (jinja_internal.h): a
 * render's first error, the arena, and the values: strings that remember
 * which bytes came from a message's content, lists, dicts, and how Python
 * prints them (str(), repr() inside containers, json.dumps as
 * transformers' tojson calls it).
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "data/jinja_internal.h"

/* ---- errors ----------------------------------------------------------------------------- */

fsdp_status jinja_error_setv(const char *label, int line, fsdp_status st, const char *fmt,
                             va_list ap)
{
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    if (line >= 0)
        return fsdp_error_set(st, "chat template %s, line %d: %s", label, line, msg);
    return fsdp_error_set(st, "chat template %s: %s", label, msg);
}

fsdp_status jinja_fail(jrender *r, int line, fsdp_status st, const char *fmt, ...)
{
    if (r->st != FSDP_STATUS_OK)
        return r->st;
    va_list ap;
    va_start(ap, fmt);
    r->st = jinja_error_setv(r->t->label, line > 0 ? line : -1, st, fmt, ap);
    va_end(ap);
    return r->st;
}

jv jinja_fail_type(jrender *r, const jx *x, const char *what, jv v)
{
    jinja_fail(r, x->line, FSDP_STATUS_FORMAT, "%s of a %s", what, jv_type_name(v));
    return (jv){.t = JV_UNDEF};
}

bool jinja_want_str(jrender *r, const jx *x, jv v, const char *what)
{
    if (v.t == JV_STR)
        return true;
    jinja_fail_type(r, x, what, v);
    return false;
}

/* ---- arena ------------------------------------------------------------------------------ */

struct jarena_chunk {
    jarena_chunk *next;
    size_t size, used;
    _Alignas(16) unsigned char data[];
};

#define JARENA_CHUNK ((size_t)64 << 10)

void *jarena_alloc(jarena *a, size_t n)
{
    n = (n + 15) & ~(size_t)15;
    if (n == 0)
        n = 16;
    if (a->over || (a->cap && (n > a->cap || a->used > a->cap - n))) {
        a->over = true;
        return NULL;
    }
    jarena_chunk *c = a->head;
    if (!c || c->size - c->used < n) {
        size_t size = n > JARENA_CHUNK ? n : JARENA_CHUNK;
        c = malloc(sizeof *c + size);
        if (!c) {
            a->over = true;
            return NULL;
        }
        c->size = size;
        c->used = 0;
        c->next = a->head;
        a->head = c;
    }
    void *p = c->data + c->used;
    c->used += n;
    a->used += n;
    memset(p, 0, n);
    return p;
}

char *jarena_strdup(jarena *a, const char *s, size_t n)
{
    char *p = jarena_alloc(a, n + 1);
    if (p && n)
        memcpy(p, s, n);
    return p;
}

void jarena_free(jarena *a)
{
    for (jarena_chunk *c = a->head, *next; c; c = next) {
        next = c->next;
        free(c);
    }
    a->head = NULL;
    a->used = 0;
    a->over = false;
}

/* ---- constructors ----------------------------------------------------------------------- */

static void *ralloc(jrender *r, size_t n)
{
    void *p = jarena_alloc(&r->a, n);
    if (!p && r->st == FSDP_STATUS_OK)
        jinja_fail(r, 0, FSDP_STATUS_FORMAT, "the rendering needs more than %zu MiB of memory",
                   r->a.cap >> 20);
    return p;
}

jv jv_bool(bool b)
{
    return (jv){.t = JV_BOOL, .b = b};
}

jv jv_int(int64_t i)
{
    return (jv){.t = JV_INT, .i = i};
}

jv jv_str_marked(jrender *r, const char *p, size_t n, const jmark *marks, int n_marks)
{
    jstr *s = ralloc(r, sizeof *s);
    char *b = ralloc(r, n + 1);
    jmark *m = n_marks ? ralloc(r, (size_t)n_marks * sizeof *m) : NULL;
    if (!s || !b || (n_marks && !m))
        return (jv){.t = JV_UNDEF};
    if (n)
        memcpy(b, p, n);
    if (n_marks)
        memcpy(m, marks, (size_t)n_marks * sizeof *m);
    *s = (jstr){.p = b, .n = n, .marks = m, .n_marks = n_marks};
    return (jv){.t = JV_STR, .s = s};
}

jv jv_str(jrender *r, const char *p, size_t n)
{
    return jv_str_marked(r, p, n, NULL, 0);
}

jv jv_list(jrender *r, size_t cap)
{
    jlist *l = ralloc(r, sizeof *l);
    if (!l)
        return (jv){.t = JV_UNDEF};
    l->cap = cap ? cap : 4;
    if (!(l->v = ralloc(r, l->cap * sizeof *l->v)))
        return (jv){.t = JV_UNDEF};
    return (jv){.t = JV_LIST, .l = l};
}

jv jv_dict(jrender *r, size_t cap, jv_type t)
{
    jdict *d = ralloc(r, sizeof *d);
    if (!d)
        return (jv){.t = JV_UNDEF};
    d->cap = cap ? cap : 4;
    d->k = ralloc(r, d->cap * sizeof *d->k);
    d->v = ralloc(r, d->cap * sizeof *d->v);
    if (!d->k || !d->v)
        return (jv){.t = JV_UNDEF};
    return (jv){.t = t, .d = d};
}

static bool grow(jrender *r, jv **v, size_t n, size_t *cap)
{
    if (n < *cap)
        return true;
    jv *nv = ralloc(r, 2 * *cap * sizeof *nv);
    if (!nv)
        return false;
    memcpy(nv, *v, n * sizeof *nv);
    *v = nv;
    *cap *= 2;
    return true;
}

bool jv_list_push(jrender *r, jv list, jv v)
{
    jlist *l = list.l;
    if (!grow(r, &l->v, l->n, &l->cap))
        return false;
    l->v[l->n++] = v;
    return true;
}

jv jv_dict_find(jv dict, jv key)
{
    for (size_t i = 0; i < dict.d->n; i++)
        if (jv_equal(dict.d->k[i], key))
            return dict.d->v[i];
    return (jv){.t = JV_UNDEF};
}

jv jv_dict_get(jv dict, const char *key, size_t n)
{
    for (size_t i = 0; i < dict.d->n; i++) {
        jv k = dict.d->k[i];
        if (k.t == JV_STR && k.s->n == n && !memcmp(k.s->p, key, n))
            return dict.d->v[i];
    }
    return (jv){.t = JV_UNDEF};
}

bool jv_dict_put(jrender *r, jv dict, jv key, jv v)
{
    jdict *d = dict.d;
    for (size_t i = 0; i < d->n; i++)
        if (jv_equal(d->k[i], key)) {
            d->v[i] = v;
            return true;
        }
    size_t cap = d->cap;
    if (!grow(r, &d->k, d->n, &cap))
        return false;
    if (!grow(r, &d->v, d->n, &d->cap))
        return false;
    d->k[d->n] = key;
    d->v[d->n++] = v;
    return true;
}

/* ---- questions -------------------------------------------------------------------------- */

bool jv_truthy(jv v)
{
    switch (v.t) {
    case JV_BOOL: return v.b;
    case JV_INT: return v.i != 0;
    case JV_STR: return v.s->n > 0;
    case JV_LIST: return v.l->n > 0;
    case JV_DICT: return v.d->n > 0;
    case JV_NS: case JV_FN: return true;
    default: return false;
    }
}

bool jv_equal(jv a, jv b)
{
    if ((a.t == JV_INT || a.t == JV_BOOL) && (b.t == JV_INT || b.t == JV_BOOL))
        return (a.t == JV_INT ? a.i : a.b) == (b.t == JV_INT ? b.i : b.b);
    if (a.t != b.t)
        return false;
    switch (a.t) {
    case JV_STR: return a.s->n == b.s->n && !memcmp(a.s->p, b.s->p, a.s->n);
    case JV_LIST:
        if (a.l->n != b.l->n)
            return false;
        for (size_t i = 0; i < a.l->n; i++)
            if (!jv_equal(a.l->v[i], b.l->v[i]))
                return false;
        return true;
    case JV_DICT:
        if (a.d->n != b.d->n)
            return false;
        for (size_t i = 0; i < a.d->n; i++) {
            jv w = jv_dict_find(b, a.d->k[i]);
            if (w.t == JV_UNDEF || !jv_equal(a.d->v[i], w))
                return false;
        }
        return true;
    case JV_NS: return a.d == b.d;
    case JV_FN: return a.fn == b.fn;
    default: return true; /* undefined, none */
    }
}

const char *jv_type_name(jv v)
{
    static const char *const names[] = {"undefined", "none", "boolean", "integer", "string",
                                        "list", "dict", "namespace", "function"};
    return names[v.t];
}

size_t jv_str_chars(const jstr *s)
{
    size_t k = 0;
    for (size_t i = 0; i < s->n; i++)
        k += ((unsigned char)s->p[i] & 0xc0) != 0x80;
    return k;
}

size_t jv_str_offset(const jstr *s, size_t k)
{
    size_t i = 0;
    for (; i < s->n; i++)
        if (((unsigned char)s->p[i] & 0xc0) != 0x80 && k-- == 0)
            return i;
    return s->n;
}

/* ---- building strings ------------------------------------------------------------------- */

/* A growing byte buffer in the arena, with marks. */
typedef struct jbuf {
    jrender *r;
    char *p;
    size_t n, cap;
    jmark *m;
    int n_m, cap_m;
    bool fail;
} jbuf;

static void buf_put(jbuf *b, const char *s, size_t n)
{
    if (b->fail || !n)
        return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->n + n + 1)
            cap *= 2;
        char *p = ralloc(b->r, cap);
        if (!p) {
            b->fail = true;
            return;
        }
        if (b->n)
            memcpy(p, b->p, b->n);
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
}

static void buf_str(jbuf *b, const char *s)
{
    buf_put(b, s, strlen(s));
}

/* Append s with its marks, merging a mark that continues the previous one. */
static void buf_jstr(jbuf *b, const jstr *s)
{
    size_t at = b->n;
    buf_put(b, s->p, s->n);
    for (int i = 0; i < s->n_marks && !b->fail; i++) {
        jmark m = {s->marks[i].b + at, s->marks[i].e + at, s->marks[i].msg};
        if (b->n_m && b->m[b->n_m - 1].e == m.b && b->m[b->n_m - 1].msg == m.msg) {
            b->m[b->n_m - 1].e = m.e;
            continue;
        }
        if (b->n_m == b->cap_m) {
            int cap = b->cap_m ? 2 * b->cap_m : 4;
            jmark *nm = ralloc(b->r, (size_t)cap * sizeof *nm);
            if (!nm) {
                b->fail = true;
                return;
            }
            if (b->n_m)
                memcpy(nm, b->m, (size_t)b->n_m * sizeof *nm);
            b->m = nm;
            b->cap_m = cap;
        }
        b->m[b->n_m++] = m;
    }
}

static jv buf_done(jbuf *b)
{
    if (b->fail)
        return (jv){.t = JV_UNDEF};
    jstr *s = ralloc(b->r, sizeof *s);
    if (!s)
        return (jv){.t = JV_UNDEF};
    if (!b->p && !(b->p = ralloc(b->r, 1)))
        return (jv){.t = JV_UNDEF};
    b->p[b->n] = '\0';
    *s = (jstr){.p = b->p, .n = b->n, .marks = b->m, .n_marks = b->n_m};
    return (jv){.t = JV_STR, .s = s};
}

jv jv_concat(jrender *r, jv a, jv b)
{
    jbuf buf = {.r = r};
    buf_jstr(&buf, a.s);
    buf_jstr(&buf, b.s);
    return buf_done(&buf);
}

jv jv_substr(jrender *r, jv s, size_t b, size_t e)
{
    jbuf buf = {.r = r};
    buf_put(&buf, s.s->p + b, e - b);
    for (int i = 0; i < s.s->n_marks && !buf.fail; i++) {
        jmark m = s.s->marks[i];
        size_t mb = m.b > b ? m.b : b, me = m.e < e ? m.e : e;
        if (mb >= me)
            continue;
        jmark shifted = {mb - b, me - b, m.msg};
        if (buf.n_m == buf.cap_m) {
            int cap = buf.cap_m ? 2 * buf.cap_m : 4;
            jmark *nm = ralloc(r, (size_t)cap * sizeof *nm);
            if (!nm)
                return (jv){.t = JV_UNDEF};
            if (buf.n_m)
                memcpy(nm, buf.m, (size_t)buf.n_m * sizeof *nm);
            buf.m = nm;
            buf.cap_m = cap;
        }
        buf.m[buf.n_m++] = shifted;
    }
    return buf_done(&buf);
}

/* ---- printing --------------------------------------------------------------------------- */

static void repr(jbuf *b, jv v, int depth);

static void repr_str(jbuf *b, const jstr *s)
{
    bool sq = memchr(s->p, '\'', s->n) != NULL, dq = memchr(s->p, '"', s->n) != NULL;
    char q = sq && !dq ? '"' : '\'';
    buf_put(b, &q, 1);
    for (size_t i = 0; i < s->n; i++) {
        unsigned char c = (unsigned char)s->p[i];
        char e[8];
        if (c == '\\' || c == (unsigned char)q) {
            e[0] = '\\';
            e[1] = (char)c;
            buf_put(b, e, 2);
        } else if (c == '\n') {
            buf_str(b, "\\n");
        } else if (c == '\r') {
            buf_str(b, "\\r");
        } else if (c == '\t') {
            buf_str(b, "\\t");
        } else if (c < 0x20 || c == 0x7f) {
            snprintf(e, sizeof e, "\\x%02x", c);
            buf_str(b, e);
        } else {
            buf_put(b, (const char *)&c, 1);
        }
    }
    buf_put(b, &q, 1);
}

static void print(jbuf *b, jv v, int depth)
{
    char num[32];
    if (depth > 64) {
        buf_str(b, "...");
        return;
    }
    switch (v.t) {
    case JV_UNDEF: break;
    case JV_NONE: buf_str(b, "None"); break;
    case JV_BOOL: buf_str(b, v.b ? "True" : "False"); break;
    case JV_INT:
        snprintf(num, sizeof num, "%lld", (long long)v.i);
        buf_str(b, num);
        break;
    case JV_STR: buf_jstr(b, v.s); break;
    case JV_LIST:
        buf_str(b, "[");
        for (size_t i = 0; i < v.l->n; i++) {
            if (i)
                buf_str(b, ", ");
            repr(b, v.l->v[i], depth + 1);
        }
        buf_str(b, "]");
        break;
    case JV_DICT:
    case JV_NS:
        buf_str(b, v.t == JV_NS ? "<Namespace {" : "{");
        for (size_t i = 0; i < v.d->n; i++) {
            if (i)
                buf_str(b, ", ");
            repr(b, v.d->k[i], depth + 1);
            buf_str(b, ": ");
            repr(b, v.d->v[i], depth + 1);
        }
        buf_str(b, v.t == JV_NS ? "}>" : "}");
        break;
    case JV_FN: buf_str(b, "<function>"); break;
    }
}

static void repr(jbuf *b, jv v, int depth)
{
    if (v.t == JV_STR)
        repr_str(b, v.s);
    else
        print(b, v, depth);
}

jv jv_to_str(jrender *r, jv v)
{
    if (v.t == JV_STR)
        return v;
    jbuf b = {.r = r};
    print(&b, v, 0);
    return buf_done(&b);
}

/* ---- json ------------------------------------------------------------------------------- */

static void json_str(jbuf *b, const char *p, size_t n)
{
    buf_str(b, "\"");
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)p[i];
        char e[8];
        switch (c) {
        case '"': buf_str(b, "\\\""); break;
        case '\\': buf_str(b, "\\\\"); break;
        case '\n': buf_str(b, "\\n"); break;
        case '\r': buf_str(b, "\\r"); break;
        case '\t': buf_str(b, "\\t"); break;
        case '\b': buf_str(b, "\\b"); break;
        case '\f': buf_str(b, "\\f"); break;
        default:
            if (c < 0x20) {
                snprintf(e, sizeof e, "\\u%04x", c);
                buf_str(b, e);
            } else {
                buf_put(b, (const char *)&c, 1);
            }
        }
    }
    buf_str(b, "\"");
}

static void newline(jbuf *b, int indent, int level)
{
    buf_str(b, "\n");
    for (int i = 0; i < indent * level && !b->fail; i++)
        buf_str(b, " ");
}

/* The key as json.dumps writes it, or false for a key it refuses. */
static bool json_key(jbuf *b, jv k)
{
    switch (k.t) {
    case JV_STR: json_str(b, k.s->p, k.s->n); return true;
    case JV_INT: {
        char num[32];
        snprintf(num, sizeof num, "\"%lld\"", (long long)k.i);
        buf_str(b, num);
        return true;
    }
    case JV_BOOL: buf_str(b, k.b ? "\"true\"" : "\"false\""); return true;
    case JV_NONE: buf_str(b, "\"null\""); return true;
    default: return false;
    }
}

static int key_cmp(const jv *a, const jv *b)
{
    if (a->t == JV_STR && b->t == JV_STR) {
        size_t n = a->s->n < b->s->n ? a->s->n : b->s->n;
        int c = memcmp(a->s->p, b->s->p, n);
        return c ? c : (a->s->n > b->s->n) - (a->s->n < b->s->n);
    }
    return (int)a->t - (int)b->t;
}

static bool json(jrender *r, int line, jbuf *b, jv v, int indent, bool sort, int level)
{
    char num[32];
    if (level > 64)
        return jinja_fail(r, line, FSDP_STATUS_FORMAT, "tojson: nesting deeper than 64"), false;
    switch (v.t) {
    case JV_NONE: buf_str(b, "null"); return true;
    case JV_BOOL: buf_str(b, v.b ? "true" : "false"); return true;
    case JV_INT:
        snprintf(num, sizeof num, "%lld", (long long)v.i);
        buf_str(b, num);
        return true;
    case JV_STR: json_str(b, v.s->p, v.s->n); return true;
    case JV_LIST:
        if (v.l->n == 0) {
            buf_str(b, "[]");
            return true;
        }
        buf_str(b, "[");
        for (size_t i = 0; i < v.l->n; i++) {
            if (i)
                buf_str(b, indent >= 0 ? "," : ", ");
            if (indent >= 0)
                newline(b, indent, level + 1);
            if (!json(r, line, b, v.l->v[i], indent, sort, level + 1))
                return false;
        }
        if (indent >= 0)
            newline(b, indent, level);
        buf_str(b, "]");
        return true;
    case JV_DICT: {
        if (v.d->n == 0) {
            buf_str(b, "{}");
            return true;
        }
        size_t n = v.d->n, *order = ralloc(r, n * sizeof *order);
        if (!order)
            return false;
        for (size_t i = 0; i < n; i++)
            order[i] = i;
        for (size_t i = 1; sort && i < n; i++) /* insertion sort: stable, dicts are small */
            for (size_t j = i; j > 0 && key_cmp(&v.d->k[order[j - 1]], &v.d->k[order[j]]) > 0;
                 j--) {
                size_t t = order[j];
                order[j] = order[j - 1];
                order[j - 1] = t;
            }
        buf_str(b, "{");
        for (size_t i = 0; i < n; i++) {
            if (i)
                buf_str(b, indent >= 0 ? "," : ", ");
            if (indent >= 0)
                newline(b, indent, level + 1);
            if (!json_key(b, v.d->k[order[i]]))
                return jinja_fail(r, line, FSDP_STATUS_FORMAT, "tojson: a dict key of type %s",
                                  jv_type_name(v.d->k[order[i]])), false;
            buf_str(b, ": ");
            if (!json(r, line, b, v.d->v[order[i]], indent, sort, level + 1))
                return false;
        }
        if (indent >= 0)
            newline(b, indent, level);
        buf_str(b, "}");
        return true;
    }
    default:
        return jinja_fail(r, line, FSDP_STATUS_FORMAT, "tojson: a %s is not JSON serializable",
                          jv_type_name(v)), false;
    }
}

jv jv_tojson(jrender *r, int line, jv v, int indent, bool sort_keys)
{
    jbuf b = {.r = r};
    if (!json(r, line, &b, v, indent, sort_keys, 0))
        return (jv){.t = JV_UNDEF};
    return buf_done(&b);
}
