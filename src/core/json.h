/*
 * json.h - a small strict JSON reader (RFC 8259) for the files fsdp itself
 * writes and reads back: metrics lines (`fsdp plot`), traces and shard maps
 * (tests).
 *
 * fsdp_json_parse builds a tree of heap nodes; numbers are doubles, strings
 * are decoded to UTF-8 (\uXXXX escapes included, surrogate pairs joined)
 * and NUL-terminated. It rejects what JSON does not allow (trailing commas,
 * NaN/Infinity, leading zeros, control characters in strings, trailing
 * garbage) with a message naming the line and column. Nesting is limited
 * to FSDP_JSON_MAX_DEPTH so a hostile file cannot exhaust the stack.
 */
#ifndef FSDP_CORE_JSON_H
#define FSDP_CORE_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "core/error.h"

#ifdef __cplusplus
extern "C" {
#endif

#define FSDP_JSON_MAX_DEPTH 256

typedef enum fsdp_json_type {
    FSDP_JSON_NULL = 0,
    FSDP_JSON_BOOL,
    FSDP_JSON_NUMBER,
    FSDP_JSON_STRING,
    FSDP_JSON_ARRAY,
    FSDP_JSON_OBJECT,
} fsdp_json_type;

typedef struct fsdp_json fsdp_json;
struct fsdp_json {
    fsdp_json_type type;
    bool boolean;          /* BOOL */
    double number;         /* NUMBER */
    char *str;             /* STRING: decoded, NUL-terminated (may contain NULs: see len) */
    size_t len;            /* STRING: bytes in str */
    char *key;             /* member name when this node is inside an object, else NULL */
    fsdp_json *child;      /* ARRAY/OBJECT: first element / member */
    fsdp_json *next;       /* next sibling */
    size_t n;              /* ARRAY/OBJECT: number of children */
};

/* Parse text[0..len) as one JSON value (surrounding whitespace allowed).
 * On success *out owns the tree (free with fsdp_json_free). On failure
 * returns FORMAT (OOM if out of memory) with "line L, column C: what was
 * expected"; *out is NULL. */
fsdp_status fsdp_json_parse(const char *text, size_t len, fsdp_json **out);

/* Largest file fsdp_json_parse_file reads (the tree takes more: up to tens
 * of bytes per input byte for a file of tiny values). */
#define FSDP_JSON_MAX_FILE_BYTES ((unsigned long long)256 << 20) /* 256 MiB */

/* Read and parse a whole file. Only regular files are read (a FIFO is
 * refused, never waited on: core/fileio.h fsdp_open_regular). Errors: IO
 * naming the path (missing, unreadable, not a regular file), FORMAT for a
 * file over FSDP_JSON_MAX_FILE_BYTES (naming the limit) or bad JSON
 * ("JSON file 'PATH': line L, column C: ..."), OOM. */
fsdp_status fsdp_json_parse_file(const char *path, fsdp_json **out);

void fsdp_json_free(fsdp_json *v);

/* Member `key` of an object (the last one if repeated), or NULL (also when
 * obj is NULL or not an object). */
const fsdp_json *fsdp_json_get(const fsdp_json *obj, const char *key);

/* v's text when v is a string that holds no NUL character, else NULL: what
 * a reader compares as a name, type or role, where "qwen2\u0000x" would
 * otherwise read as "qwen2" (member names never hold one: the parser
 * refuses them). */
const char *fsdp_json_name(const fsdp_json *v);

/* Element i of an array, or NULL. O(i). */
const fsdp_json *fsdp_json_at(const fsdp_json *arr, size_t i);

/* Name of a type ("number"). */
const char *fsdp_json_type_name(fsdp_json_type t);

/* Write s as a JSON string literal (quotes, escapes for " \\ and control
 * characters; other bytes pass through, so UTF-8 stays UTF-8). */
void fsdp_json_write_str(FILE *f, const char *s);

#ifdef __cplusplus
}
#endif

#endif /* FSDP_CORE_JSON_H */
