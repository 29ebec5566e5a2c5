/*
 * tokjson_read.h - internal to the tokenizer.json reader: the reader state
 * and the typed getters (tokjson_read.c) that tokjson.c (model, vocabulary,
 * merges, added tokens, the file as a whole) and tokjson_pipe.c
 * (normalizer, pre-tokenizer, post-processor sections) share. Every error
 * names the file and the field's path.
 */
#ifndef FSDP_DATA_TOKJSON_READ_H
#define FSDP_DATA_TOKJSON_READ_H

#include "core/json.h"
#include "data/hftok_internal.h"

typedef struct tokjson_reader {
    fsdp_hftok *t;
    int char_byte[324];          /* byte-level character (code point) -> byte, or -1 */
    uint8_t *buf;                /* scratch for decoded strings */
    size_t buf_cap;
} tokjson_reader;

/* Error `st` about `field` of the file: "tokenizer 'FILE': FIELD: ...". */
fsdp_status tokjson_bad(const tokjson_reader *r, fsdp_status st, const char *field,
                        const char *fmt, ...) __attribute__((format(printf, 4, 5)));
/* UNSUPPORTED: `what` at `field` is not implemented. */
fsdp_status tokjson_unsupported(const tokjson_reader *r, const char *field, const char *what);
/* FORMAT unless v exists and has `type`. */
fsdp_status tokjson_want(const tokjson_reader *r, const fsdp_json *v, fsdp_json_type type,
                         const char *field);
/* obj.key as a bool; absent or null gives def. */
fsdp_status tokjson_get_bool(const tokjson_reader *r, const fsdp_json *obj, const char *key,
                             const char *field, bool def, bool *out);
/* v as a token id in 0..HFTOK_MAX_ID-1. */
fsdp_status tokjson_as_id(const tokjson_reader *r, const fsdp_json *v, const char *field, int *id);
/* The "type" string of the section object obj. */
fsdp_status tokjson_type_of(const tokjson_reader *r, const fsdp_json *obj, const char *field,
                            const char **type);

#endif /* FSDP_DATA_TOKJSON_READ_H */
