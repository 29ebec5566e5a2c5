/*
 * jinja_builtin.h - internal to the Jinja subset: its filters, tests,
 * methods and global functions (jinja_builtin.c), and their names, which
 * the parser checks a template's against and the evaluator calls.
 *
 * A built-in gets its call's syntax node and evaluates the arguments it
 * reads through r->eval (jinja_internal.h), so it sits below the
 * evaluator. Each returns JV_UNDEF with the render's error set when it
 * fails.
 */
#ifndef FSDP_DATA_JINJA_BUILTIN_H
#define FSDP_DATA_JINJA_BUILTIN_H

#include "data/jinja_internal.h"

/* Filters and tests by name: the id (jx.op of a JX_FILTER or JX_TEST), or -1. */
int jinja_filter_id(const char *name);
int jinja_test_id(const char *name);
/* Global function by name (jv.fn of a JV_FN), or -1. */
int jinja_fn_id(const char *name);

/* Filter x->op applied to v (x->a already evaluated to v). */
jv jinja_filter(jrender *r, const jx *x, jv v);
/* Test x->op on v (x->a already evaluated), negated for `is not`: a JV_BOOL. */
jv jinja_test(jrender *r, const jx *x, jv v);
/* Method call obj.name(args) (call: the JX_CALL; obj is not undefined). */
jv jinja_method(jrender *r, const jx *call, jv obj, const char *name);
/* Global function fn (jinja_fn_id) called with call's arguments. */
jv jinja_call_fn(jrender *r, const jx *call, int fn);

#endif /* FSDP_DATA_JINJA_BUILTIN_H */
