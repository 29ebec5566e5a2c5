/*
 * jinja.h - internal to src/data: the subset of Jinja that Hugging Face chat
 * templates use (tokenizer_config.json's "chat_template"), parsed once and
 * rendered per conversation, in C.
 *
 * What a template may hold (docs/formats.md, "Chat templates", lists it for
 * users):
 * - text, {{ expression }}, {% statement %}, {# comment #}, the whitespace
 *   controls {%- -%} {{- -}} {#- -#} and {%+ +%}; rendered as transformers
 *   renders them: trim_blocks and lstrip_blocks on, one trailing newline of
 *   the template dropped, \r\n and \r read as \n;
 * - statements: if/elif/else, for (one or two targets, an `if` filter, an
 *   else branch, loop.index/index0/revindex/revindex0/first/last/length/
 *   previtem/nextitem), set (a name or namespace attribute), break,
 *   continue, generation (transformers' assistant marker: rendered as its
 *   body);
 * - expressions: strings, integers, true/false/none, lists, dicts, names,
 *   x.attr, x[i], x[a:b:c], calls, `a if c else b`, or/and/not,
 *   == != < <= > >= in, `not in`, + - * // % ~, unary -, filters (x | f(args))
 *   and tests (x is [not] t);
 * - filters: trim, tojson (indent, sort_keys), length/count, upper, lower,
 *   capitalize, title, string, list, items, join, first, last, default/d,
 *   replace, int, abs, reverse, unique, select/reject, selectattr/rejectattr,
 *   map (attribute= or a filter name), safe, indent;
 * - tests: defined, undefined, none, boolean, true, false, integer, number,
 *   string, mapping, iterable, sequence, callable, odd, even, divisibleby,
 *   equalto/eq/==, ne/!=, lt/gt/le/ge, in;
 * - methods: str.strip/lstrip/rstrip/split/startswith/endswith/upper/lower/
 *   replace/title/capitalize/format-free; dict.items/keys/values/get;
 * - globals: range, namespace, dict, raise_exception, strftime_now (on the
 *   input's date; the time of day is midnight).
 * Anything else (macros, call blocks, includes, floats, `/`) is an
 * UNSUPPORTED error naming the construct and the template's line; syntax
 * errors are FORMAT errors with the line. Never a crash: the parser's
 * nesting is bounded, and a render stops with an error past a step budget
 * or a memory budget (a template that loops forever, or builds a string
 * of gigabytes, fails instead).
 *
 * Message contents are tracked through the rendering: each string value
 * carries the byte ranges that came from a message's content, and those
 * ranges survive concatenation (+ ~), output, slicing, trim/strip and
 * `string`; any other transformation (replace, upper, tojson, ...) makes
 * its result template text. The output lists where contents landed
 * (fsdp_jinja_output.spans), which is how chat.c finds what the assistant
 * said and which text came from data.
 *
 * A parsed template is read-only: several threads may render it at once.
 */
#ifndef FSDP_DATA_JINJA_H
#define FSDP_DATA_JINJA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fsdp/fsdp.h"

typedef struct fsdp_jinja fsdp_jinja;

/* One message: role and content (UTF-8, len bytes; not NUL-terminated). */
typedef struct fsdp_jinja_msg {
    const char *role;
    const char *content;
    size_t len;
} fsdp_jinja_msg;

typedef struct fsdp_jinja_input {
    const fsdp_jinja_msg *msgs;   /* `messages`: a list of {"role", "content"} dicts */
    int n_msgs;
    const char *bos_token;        /* `bos_token`, `eos_token`: NULL leaves them undefined */
    const char *eos_token;
    bool add_generation_prompt;
    int year, month, day;         /* strftime_now's date (month 1-12) */
    uint64_t max_steps;           /* 0: FSDP_JINJA_MAX_STEPS */
    size_t max_bytes;             /* memory of one render; 0: FSDP_JINJA_MAX_BYTES */
} fsdp_jinja_input;

#define FSDP_JINJA_MAX_STEPS 20000000ull
#define FSDP_JINJA_MAX_BYTES ((size_t)256 << 20)

/* Where message msg's content (or a part of it) lies in the output:
 * text[begin, end). Spans are in output order and never overlap. */
typedef struct fsdp_jinja_span {
    size_t begin, end;
    int msg;
} fsdp_jinja_span;

typedef struct fsdp_jinja_output {
    char *text;                   /* malloc'd, NUL-terminated, len bytes before the NUL */
    size_t len;
    fsdp_jinja_span *spans;       /* malloc'd */
    int n_spans;
} fsdp_jinja_output;

/* Parse src[0..n). `label` names the template in messages ("qwen/tokenizer_config.json").
 * FORMAT for a syntax error, UNSUPPORTED for a construct outside the subset, both naming
 * the line. */
fsdp_status fsdp_jinja_parse(fsdp_jinja **out, const char *label, const char *src, size_t n);

void fsdp_jinja_free(fsdp_jinja *t);

/* Whether the template names the variable or function `name` anywhere (e.g.
 * "strftime_now": whether a render depends on the date). */
bool fsdp_jinja_mentions(const fsdp_jinja *t, const char *name);

/* Render t with `in`. INVALID_ARG when the template refuses the conversation
 * (raise_exception: its message), FORMAT for an error while rendering (a
 * type error, an undefined name used as a value, the step or memory budget),
 * naming the template's line. On success *out holds the text and spans
 * (free with fsdp_jinja_output_free); on failure *out is empty. */
fsdp_status fsdp_jinja_render(const fsdp_jinja *t, const fsdp_jinja_input *in,
                              fsdp_jinja_output *out);

void fsdp_jinja_output_free(fsdp_jinja_output *o);

#endif /* FSDP_DATA_JINJA_H */
