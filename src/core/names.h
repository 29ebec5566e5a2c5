/*
 * names.h - name tables: the one place where the values of a choice
 * (backend, sharding strategy, precision, transport, optimizer, model
 * family...) are spelled.
 *
 * A table lists {name, value, one-line help}. Parsing a string, printing a
 * value, the "a|b|c" metavar of --help, the "a, b or c" of an error message
 * and the per-value help lines are all read from it, so a name is written
 * once and the CLI's parser and its --help cannot drift apart.
 *
 * Tables are static data; every function here is pure and thread-safe.
 */
#ifndef FSDP_CORE_NAMES_H
#define FSDP_CORE_NAMES_H

#include <stdbool.h>
#include <stddef.h>

#include "core/error.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fsdp_name {
    const char *name;  /* as the user types it: "grad-op" */
    int value;         /* the enum value it stands for */
    const char *help;  /* one line for --help; NULL: none */
} fsdp_name;

typedef struct fsdp_name_table {
    const fsdp_name *v;
    int n;
} fsdp_name_table;

/* A table over a static array of fsdp_name. */
#define FSDP_NAME_TABLE(arr) {(arr), (int)(sizeof(arr) / sizeof((arr)[0]))}

/* Set of the values of a table, as a bit mask (values must be 0..31). */
#define FSDP_NAME_BIT(value) (1u << (unsigned)(value))

/* The entry named s (exact, case-sensitive), or NULL. */
const fsdp_name *fsdp_names_find(const fsdp_name_table *t, const char *s);

/* The entry of value v, or NULL. */
const fsdp_name *fsdp_names_of(const fsdp_name_table *t, int v);

/* Name of value v; "?" when the table has no such value. Never NULL. */
const char *fsdp_names_name(const fsdp_name_table *t, int v);

/* *out = the value named s, among the entries whose value is in `allow`
 * (a mask of FSDP_NAME_BIT; 0 = every entry). Otherwise INVALID_ARG with
 * the message "unknown value 's' (expected a, b or c)", listing the allowed
 * names; callers prefix what was parsed ("--shard: ..."). s may be NULL
 * (reported as an empty value). */
fsdp_status fsdp_names_parse(const fsdp_name_table *t, unsigned allow, const char *s, int *out);

/* "a|b|c" (sep "|") or "a, b or c" (sep ", ", last " or ") into buf, over
 * the entries in `allow` (0 = all), truncated to fit; returns buf. */
char *fsdp_names_join(const fsdp_name_table *t, unsigned allow, const char *sep,
                      const char *last_sep, char *buf, size_t n);

/* The dtypes by their user-facing names: fp32, bf16 (--precision, --dtype). */
extern const fsdp_name_table fsdp_dtype_names;

#ifdef __cplusplus
}
#endif

#endif /* FSDP_CORE_NAMES_H */
