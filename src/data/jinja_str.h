/*
 * jinja_str.h - internal to the Jinja subset: Python's str methods on its
 * strings (jinja_str.c), below the built-ins (jinja_builtin.c) that offer
 * them to templates as filters and methods.
 *
 * Each takes a JV_STR `s` and returns a new value in the render's arena,
 * or JV_UNDEF with the render's error set (a wrong argument type, named
 * after `x`'s line, or the memory budget).
 */
#ifndef FSDP_DATA_JINJA_STR_H
#define FSDP_DATA_JINJA_STR_H

#include "data/jinja_internal.h"

/* str.strip (which 3), lstrip (1), rstrip (2): the characters of `chars`, or whitespace when
 * chars is NULL; the content marks of what remains are kept. */
jv jstr_strip(jrender *r, jv s, int which, const jstr *chars);

/* Each code point mapped: how 'u' upper, 'l' lower, 't' title (upper after a non-letter,
 * else lower), 'c' the first upper and the rest lower. The result is template text. */
jv jstr_recase(jrender *r, jv s, char how);

/* str.replace(old, new[, count]) (count < 0: all); old and new must be strings. */
jv jstr_replace(jrender *r, const jx *x, jv s, jv old, jv new, int64_t count);

/* str.split(sep, maxsplit) (maxsplit < 0: all): sep none or undefined splits at runs of
 * whitespace and drops the ends; the parts keep their content marks. */
jv jstr_split(jrender *r, const jx *x, jv s, jv sep, int64_t maxsplit);

/* str.startswith(what) or, with end, str.endswith(what): what a string or a list of them. */
jv jstr_affix(jrender *r, const jx *x, jv s, jv what, bool end);

#endif /* FSDP_DATA_JINJA_STR_H */
