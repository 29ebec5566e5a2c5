/*
 * jinja_lex.h - internal to the Jinja subset's parser (jinja_lex.c,
 * jinja_parse_expr.c, jinja_parse.c): the tokens of a template, the
 * lexer that makes them, and the parser's state and token cursor.
 */
#ifndef FSDP_DATA_JINJA_LEX_H
#define FSDP_DATA_JINJA_LEX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "data/jinja_internal.h"

/* The parser's nesting bound (expressions and blocks), so that a hostile template cannot
 * overflow the stack. */
#define JP_MAX_DEPTH 128

typedef enum jtok_type {
    JT_EOF = 0, JT_TEXT, JT_VBEGIN, JT_VEND, JT_BBEGIN, JT_BEND, JT_NAME, JT_INT, JT_STR, JT_OP,
} jtok_type;

typedef struct jtok {
    jtok_type t;
    int line;
    const char *p;            /* JT_TEXT, JT_NAME, JT_STR (decoded, in the arena), JT_OP */
    size_t n;
    int64_t i;
} jtok;

typedef struct jparser {
    fsdp_jinja *tpl;          /* the template being built: its label, the names it mentions */
    jarena *a;                /* the tree's arena (tpl->arena) */
    jtok *toks;               /* malloc'd; the last one is JT_EOF */
    int n, cap, at;           /* tokens, capacity, the cursor */
    int depth;                /* nesting (jp_enter) */
    fsdp_status st;           /* the first error */
} jparser;

/* Set the parse's error (the first one wins) and return it: the message names the template
 * and `line`. */
fsdp_status jp_fail(jparser *p, fsdp_status st, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* OOM: out of host memory parsing. */
fsdp_status jp_oom(jparser *p);

/* Room for one more in v, an array of n elements of `elem` bytes in p's arena with room
 * for *cap: v itself while n < *cap, else a copy with twice the room (8 at first, *cap
 * updated); NULL with p's error (jp_oom) out of memory. */
void *jp_grow(jparser *p, void *v, int n, int *cap, size_t elem);

/* Defines `static T *name(jparser *p, K k, int line)`: a tree node of type T
 * (jx or js) from p's arena with its kind and line set; NULL with p's error
 * (jp_oom) out of memory. */
#define JP_NODE_CTOR(name, T, K)              \
    static T *name(jparser *p, K k, int line) \
    {                                         \
        T *x = jarena_alloc(p->a, sizeof *x); \
        if (!x)                               \
            return jp_oom(p), NULL;           \
        x->kind = k;                          \
        x->line = line;                       \
        return x;                             \
    }

/* The tokens of src[0..n) (newlines already normalized) into p->toks, text and tags with
 * Jinja's whitespace rules as transformers configures them, ending with JT_EOF; false with
 * p->st set on an error. */
bool jp_lex(jparser *p, const char *src, size_t n);

/* ---- the token cursor ------------------------------------------------------------------- */

/* The cursor never passes the final JT_EOF: jp_skip_* step over a token only when it
 * matches. */

static inline jtok *jp_cur(jparser *p)
{
    return &p->toks[p->at];
}
static inline bool jp_is_op(const jtok *t, const char *op)
{
    return t->t == JT_OP && t->n == strlen(op) && !memcmp(t->p, op, t->n);
}
static inline bool jp_is_name(const jtok *t, const char *name)
{
    return t->t == JT_NAME && t->n == strlen(name) && !memcmp(t->p, name, t->n);
}
static inline bool jp_skip_op(jparser *p, const char *op)
{
    if (!jp_is_op(jp_cur(p), op))
        return false;
    p->at++;
    return true;
}
static inline bool jp_skip_name(jparser *p, const char *name)
{
    if (!jp_is_name(jp_cur(p), name))
        return false;
    p->at++;
    return true;
}

/* How a message names t ("a string", "'}}'"); buf (n bytes) may hold it. */
const char *jp_describe(const jtok *t, char *buf, size_t n);
/* Skip the operator op, or fail (FORMAT "expected ..."). */
bool jp_expect_op(jparser *p, const char *op);
/* The name at the cursor, copied into the tree's arena, into *out, or fail. */
bool jp_expect_name(jparser *p, const char **out);
/* t's text copied into the tree's arena (NULL, with the error set, out of memory). */
const char *jp_name_dup(jparser *p, const jtok *t);
/* One nesting level deeper (the caller decrements p->depth when done), or fail past
 * JP_MAX_DEPTH. */
bool jp_enter(jparser *p);

#endif /* FSDP_DATA_JINJA_LEX_H */
