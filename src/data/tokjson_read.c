/*
 * tokjson_read.c - the tokenizer.json reader's errors and small typed
 * getters (tokjson_read.h), shared by the file's reader (tokjson.c) and
 * its sections (tokjson_pipe.c).
 */
#include <stdarg.h>
#include <stdio.h>

#include "data/tokjson_read.h"

fsdp_status tokjson_bad(const tokjson_reader *r, fsdp_status st, const char *field,
                        const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fsdp_error_setv(st, fmt, ap);
    va_end(ap);
    fsdp_error_prefix("tokenizer '%s': %s", r->t->label, field);
    return st;
}

fsdp_status tokjson_unsupported(const tokjson_reader *r, const char *field, const char *what)
{
    return tokjson_bad(r, FSDP_STATUS_UNSUPPORTED, field,
                       "%s is not supported (fsdp reads byte-level BPE tokenizers: GPT-2, Llama 3, "
                       "Qwen2)", what);
}

fsdp_status tokjson_want(const tokjson_reader *r, const fsdp_json *v, fsdp_json_type type,
                         const char *field)
{
    if (!v)
        return tokjson_bad(r, FSDP_STATUS_FORMAT, field, "missing");
    if (v->type != type)
        return tokjson_bad(r, FSDP_STATUS_FORMAT, field, "expected %s, found %s",
                           fsdp_json_type_name(type), fsdp_json_type_name(v->type));
    return FSDP_STATUS_OK;
}

/* obj.key as a bool; absent or null gives def. */
fsdp_status tokjson_get_bool(const tokjson_reader *r, const fsdp_json *obj, const char *key,
                             const char *field, bool def, bool *out)
{
    const fsdp_json *v = fsdp_json_get(obj, key);
    *out = def;
    if (!v || v->type == FSDP_JSON_NULL)
        return FSDP_STATUS_OK;
    FSDP_TRY(tokjson_want(r, v, FSDP_JSON_BOOL, field));
    *out = v->boolean;
    return FSDP_STATUS_OK;
}

fsdp_status tokjson_as_id(const tokjson_reader *r, const fsdp_json *v, const char *field, int *id)
{
    FSDP_TRY(tokjson_want(r, v, FSDP_JSON_NUMBER, field));
    double d = v->number;
    if (!(d >= 0 && d < HFTOK_MAX_ID) || d != (double)(int)d)
        return tokjson_bad(r, FSDP_STATUS_FORMAT, field, "id %g is not an integer in 0..%d", d,
                           HFTOK_MAX_ID - 1);
    *id = (int)d;
    return FSDP_STATUS_OK;
}

/* The "type" string of a section object. */
fsdp_status tokjson_type_of(const tokjson_reader *r, const fsdp_json *obj, const char *field,
                            const char **type)
{
    char f[128];
    FSDP_TRY(tokjson_want(r, obj, FSDP_JSON_OBJECT, field));
    snprintf(f, sizeof f, "%s.type", field);
    const fsdp_json *v = fsdp_json_get(obj, "type");
    FSDP_TRY(tokjson_want(r, v, FSDP_JSON_STRING, f));
    if (!(*type = fsdp_json_name(v)))
        return tokjson_bad(r, FSDP_STATUS_FORMAT, f, "holds \\u0000 (a NUL character)");
    return FSDP_STATUS_OK;
}
