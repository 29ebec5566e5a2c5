/*
 * jinja_parse_expr.h - internal to the Jinja subset's parser: expressions
 * (jinja_parse_expr.c), for the statements of jinja_parse.c.
 */
#ifndef FSDP_DATA_JINJA_PARSE_EXPR_H
#define FSDP_DATA_JINJA_PARSE_EXPR_H

#include "data/jinja_lex.h"

/* The expression at the cursor (`cond` in jinja_parse_expr.c's grammar), or NULL with
 * p->st set. */
jx *jp_expr(jparser *p);
/* An expression without the `a if c else b` form (`or`): a for loop's iterable, where an
 * `if` filters the loop. */
jx *jp_or(jparser *p);

#endif /* FSDP_DATA_JINJA_PARSE_EXPR_H */
