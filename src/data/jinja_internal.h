/*
 * jinja_internal.h - internal to the Jinja subset (jinja.h): the bottom
 * layer every part of it includes. The arena, the value type, the syntax
 * tree, the render state, and the functions of jinja_value.c (errors, the
 * arena, values).
 *
 * The parts, bottom to top; each calls only the ones below it:
 *   jinja_value.c       errors, the arena, values, printing and JSON
 *   jinja_str.c         Python's str methods (jinja_str.h)
 *   jinja_builtin.c     filters, tests, methods, global functions, their names
 *                       (jinja_builtin.h); arguments are evaluated through
 *                       jrender.eval, the evaluator's entry
 *   jinja_lex.c         the lexer and the token cursor (jinja_lex.h)
 *   jinja_parse_expr.c  expressions (jinja_parse_expr.h)
 *   jinja_parse.c       statements, fsdp_jinja_parse
 *   jinja_eval.c        scopes, expressions, statements, fsdp_jinja_render
 *
 * Everything a render makes lives in one arena, freed at once when the
 * render ends; values are small structs passed by copy, and strings, lists
 * and dicts are never changed after they are made, except a namespace's
 * attributes (`set ns.x = ...`) and the lists and dicts the evaluator is
 * still building.
 */
#ifndef FSDP_DATA_JINJA_INTERNAL_H
#define FSDP_DATA_JINJA_INTERNAL_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "data/jinja.h"

/* ---- arena ------------------------------------------------------------------------------ */

typedef struct jarena_chunk jarena_chunk;

typedef struct jarena {
    jarena_chunk *head;
    size_t used;              /* bytes handed out, all chunks */
    size_t cap;               /* the most it may hand out; 0: no cap */
    bool over;                /* an allocation failed or passed cap */
} jarena;

/* n bytes, 16-aligned, zeroed; NULL (and a->over set) past the cap or out of memory. */
void *jarena_alloc(jarena *a, size_t n);
char *jarena_strdup(jarena *a, const char *s, size_t n);
void jarena_free(jarena *a);

/* ---- values ----------------------------------------------------------------------------- */

typedef enum jv_type {
    JV_UNDEF = 0,
    JV_NONE,
    JV_BOOL,
    JV_INT,
    JV_STR,
    JV_LIST,
    JV_DICT,
    JV_NS,                    /* namespace(): a dict whose attributes can be set */
    JV_FN,                    /* a global function */
} jv_type;

/* Bytes [b, e) of a string came from message msg's content. */
typedef struct jmark {
    size_t b, e;
    int msg;
} jmark;

typedef struct jstr {
    const char *p;            /* n bytes, NUL after them */
    size_t n;
    const jmark *marks;       /* ascending, disjoint */
    int n_marks;
} jstr;

typedef struct jv jv;
typedef struct jlist {
    jv *v;
    size_t n, cap;
} jlist;
typedef struct jdict {
    jv *k, *v;                /* insertion order */
    size_t n, cap;
} jdict;

struct jv {
    jv_type t;
    union {
        bool b;
        int64_t i;
        const jstr *s;
        jlist *l;
        jdict *d;             /* JV_DICT, JV_NS */
        int fn;
    };
};

enum { JFN_RANGE = 0, JFN_NAMESPACE, JFN_DICT, JFN_RAISE, JFN_STRFTIME, JFN_COUNT };

/* ---- syntax tree ------------------------------------------------------------------------ */

typedef enum jx_kind {
    JX_LIT = 0,   /* lit */
    JX_VAR,       /* name */
    JX_ATTR,      /* a.name */
    JX_INDEX,     /* a[b] */
    JX_SLICE,     /* a[b:c:d], missing parts NULL */
    JX_CALL,      /* a(args, kw=...) */
    JX_FILTER,    /* a | name(args): a may be NULL inside select/map arguments */
    JX_TEST,      /* a is [not] name(args) */
    JX_NOT,
    JX_NEG,
    JX_BIN,       /* a op b */
    JX_AND,
    JX_OR,
    JX_COND,      /* b if a else c */
    JX_LIST,      /* [args] or (args,) */
    JX_DICT,      /* {args[2i]: args[2i+1]} */
} jx_kind;

typedef enum jop {
    JOP_ADD = 0, JOP_SUB, JOP_MUL, JOP_FLOORDIV, JOP_MOD, JOP_CONCAT,
    JOP_EQ, JOP_NE, JOP_LT, JOP_LE, JOP_GT, JOP_GE, JOP_IN, JOP_NOTIN,
} jop;

typedef struct jx jx;
struct jx {
    jx_kind kind;
    int line;
    int op;                   /* jop; JX_FILTER/JX_TEST: the filter or test id */
    bool negate;              /* JX_TEST: `is not` */
    const char *name;         /* JX_VAR, JX_ATTR, JX_FILTER/JX_TEST (for messages) */
    jx *a, *b, *c, *d;
    jx **args;                /* JX_CALL, JX_FILTER, JX_TEST, JX_LIST, JX_DICT */
    int n_args;
    const char **kw_names;    /* keyword arguments, after args */
    jx **kw;
    int n_kw;
    jv lit;
};

typedef enum js_kind {
    JS_TEXT = 0,  /* text, n */
    JS_OUT,       /* {{ x }} */
    JS_IF,        /* if x: body, else: orelse (elif is an if in orelse) */
    JS_FOR,       /* for t1[, t2] in x [if cond]: body, else: orelse */
    JS_SET,       /* set t1 = x, or set t1.t2 = x */
    JS_BREAK,
    JS_CONTINUE,
    JS_BLOCK,     /* generation: body */
} js_kind;

typedef struct js js;
typedef struct jbody {
    js **s;
    int n;
} jbody;

struct js {
    js_kind kind;
    int line;
    const char *text;
    size_t n;
    jx *x, *cond;
    const char *t1, *t2;
    jbody body, orelse;
};

struct fsdp_jinja {
    jarena arena;             /* the tree */
    jbody root;
    char label[160];
    const char **names;       /* every name the template mentions (fsdp_jinja_mentions) */
    int n_names;
};

/* ---- rendering state -------------------------------------------------------------------- */

typedef struct jscope jscope;
typedef struct jrender jrender;

struct jrender {
    const fsdp_jinja *t;
    const fsdp_jinja_input *in;
    jarena a;
    uint64_t steps, max_steps;
    jscope *scope;            /* innermost */
    char *out;                /* the output */
    size_t out_n, out_cap;
    jmark *marks;
    int n_marks, cap_marks;
    int flow;                 /* 0, or JS_BREAK / JS_CONTINUE pending */
    fsdp_status st;           /* the first error */
    /* The evaluator (jinja_eval.c): how the built-ins, below it, evaluate their arguments,
     * which are evaluated when (and each time) a built-in asks for them, as Jinja does. */
    jv (*eval)(jrender *r, const jx *x);
};

/* ---- jinja_value.c ---------------------------------------------------------------------- */

/* Set the thread's error (core/error.h) to "chat template LABEL, line LINE: MESSAGE" (line
 * < 0: without the line) and return st: the parser's and the render's messages. */
fsdp_status jinja_error_setv(const char *label, int line, fsdp_status st, const char *fmt,
                             va_list ap);

/* Set the render's error (the first one wins) and return it: FORMAT unless st says
 * otherwise; the message names the template and `line` (0: no line). */
fsdp_status jinja_fail(jrender *r, int line, fsdp_status st, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* FORMAT "<what> of a <v's type>" at x's line; returns JV_UNDEF. */
jv jinja_fail_type(jrender *r, const jx *x, const char *what, jv v);
/* Whether v is a string; if not, jinja_fail_type. */
bool jinja_want_str(jrender *r, const jx *x, jv v, const char *what);

/* Values. Constructors return JV_UNDEF and set r->st when the arena is spent. */
jv jv_bool(bool b);
jv jv_int(int64_t i);
jv jv_str(jrender *r, const char *p, size_t n);
jv jv_str_marked(jrender *r, const char *p, size_t n, const jmark *marks, int n_marks);
jv jv_list(jrender *r, size_t cap);
jv jv_dict(jrender *r, size_t cap, jv_type t);
bool jv_list_push(jrender *r, jv list, jv v);
bool jv_dict_put(jrender *r, jv dict, jv key, jv v); /* replaces an equal key's value */
/* dict[key]: JV_UNDEF when absent. */
jv jv_dict_get(jv dict, const char *key, size_t n);
jv jv_dict_find(jv dict, jv key);
bool jv_truthy(jv v);
bool jv_equal(jv a, jv b);
const char *jv_type_name(jv v);
/* Python's str(): strings unchanged (marks kept), others as Python prints them. */
jv jv_to_str(jrender *r, jv v);
/* a + b for strings, with both sides' marks. */
jv jv_concat(jrender *r, jv a, jv b);
/* Characters [from, to) of s (code points; Python slice bounds already applied). */
jv jv_substr(jrender *r, jv s, size_t b_bytes, size_t e_bytes);
/* Code points of a string. */
size_t jv_str_chars(const jstr *s);
/* Byte offset of code point k of s (k <= chars). */
size_t jv_str_offset(const jstr *s, size_t k);
/* json.dumps(v, ensure_ascii=False, indent, sort_keys) as transformers' tojson does
 * (indent < 0: none). */
jv jv_tojson(jrender *r, int line, jv v, int indent, bool sort_keys);

#endif /* FSDP_DATA_JINJA_INTERNAL_H */
