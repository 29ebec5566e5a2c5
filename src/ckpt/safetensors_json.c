/*
 * safetensors_json.c - reading a large JSON object one member at a time
 * (safetensors.h: fsdp_st_json_members), for the files of the safetensors
 * format whose size a stranger controls: a file's header (up to 100 MiB)
 * and a sharded model's model.safetensors.index.json.
 *
 * Why not core/json alone: it builds a tree of heap nodes, tens of times
 * the size of the text for arrays of empty arrays, so a 99 MiB header cost
 * about 3 GB before it was rejected (issue 15 item 13). Here the object's
 * framing is scanned in place and each member's value (bounded in size by
 * the caller) is parsed alone by core/json and freed before the next one,
 * so memory follows the largest member, not the object. Syntax stays as
 * strict as core/json's: the framing (braces, quotes, colons, commas,
 * whitespace) is checked here, every key and value by fsdp_json_parse.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/safetensors.h"
#include "core/error.h"
#include "core/json.h"

static bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

static size_t skip_ws(const char *s, size_t n, size_t i)
{
    while (i < n && is_ws(s[i]))
        i++;
    return i;
}

/* FORMAT "<label> is not valid JSON: byte I: <what>, found ...". */
static fsdp_status framing_error(const char *label, const char *s, size_t n, size_t i,
                                 const char *what)
{
    if (i >= n)
        return fsdp_error_set(FSDP_STATUS_FORMAT, "%s is not valid JSON: byte %zu: %s, found "
                              "the end of the text", label, i, what);
    unsigned char c = (unsigned char)s[i];
    if (c >= 32 && c < 127)
        return fsdp_error_set(FSDP_STATUS_FORMAT, "%s is not valid JSON: byte %zu: %s, found "
                              "'%c'", label, i, what, c);
    return fsdp_error_set(FSDP_STATUS_FORMAT, "%s is not valid JSON: byte %zu: %s, found byte "
                          "0x%02x", label, i, what, c);
}

/* s[i] is '"': the index just past the closing quote, or 0 if unterminated
 * (escapes are only skipped here; core/json checks them). */
static size_t string_end(const char *s, size_t n, size_t i)
{
    for (i++; i < n; i++) {
        if (s[i] == '"')
            return i + 1;
        if (s[i] == '\\')
            i++;
    }
    return 0;
}

/* The end of the value starting at s[i] (not whitespace): strings and
 * containers are matched (nesting bounded as core/json bounds it),
 * anything else runs to the next delimiter. */
static fsdp_status value_end(const char *label, const char *s, size_t n, size_t i, size_t *end)
{
    if (i >= n)
        return framing_error(label, s, n, i, "expected a value");
    if (s[i] == '"') {
        size_t e = string_end(s, n, i);
        if (!e)
            return framing_error(label, s, n, n, "unterminated string");
        *end = e;
        return FSDP_STATUS_OK;
    }
    if (s[i] == '{' || s[i] == '[') {
        int depth = 0;
        for (size_t k = i; k < n; k++) {
            char c = s[k];
            if (c == '"') {
                size_t e = string_end(s, n, k);
                if (!e)
                    return framing_error(label, s, n, n, "unterminated string");
                k = e - 1;
            } else if (c == '{' || c == '[') {
                if (++depth > FSDP_JSON_MAX_DEPTH)
                    return fsdp_error_set(FSDP_STATUS_FORMAT, "%s is not valid JSON: byte %zu: "
                                          "values nest deeper than %d levels", label, k,
                                          FSDP_JSON_MAX_DEPTH);
            } else if (c == '}' || c == ']') {
                if (--depth == 0) {
                    *end = k + 1;
                    return FSDP_STATUS_OK;
                }
            }
        }
        return framing_error(label, s, n, n, "unterminated object or array");
    }
    size_t k = i;
    while (k < n && !is_ws(s[k]) && s[k] != ',' && s[k] != '}' && s[k] != ']')
        k++;
    if (k == i)
        return framing_error(label, s, n, i, "expected a value");
    *end = k;
    return FSDP_STATUS_OK;
}

fsdp_status fsdp_st_json_members(const char *label, const char *text, size_t n,
                                 fsdp_st_member_fn fn, void *arg)
{
    size_t i = skip_ws(text, n, 0);
    if (i >= n || text[i] != '{')
        return framing_error(label, text, n, i, "expected an object ('{')");
    i = skip_ws(text, n, i + 1);
    bool empty = i < n && text[i] == '}';
    while (!empty) {
        if (i >= n || text[i] != '"')
            return framing_error(label, text, n, i, "expected a member name");
        size_t key_end = string_end(text, n, i);
        if (!key_end)
            return framing_error(label, text, n, n, "unterminated member name");
        fsdp_json *key = NULL;
        /* the framing pass allocates nothing: names are decoded (and their
         * escapes checked) when a member is handed over */
        if (fn && fsdp_json_parse(text + i, key_end - i, &key) != FSDP_STATUS_OK) {
            fsdp_error_prefix("%s is not valid JSON: byte %zu (a member name)", label, i);
            return FSDP_STATUS_FORMAT;
        }
        i = skip_ws(text, n, key_end);
        fsdp_status st = FSDP_STATUS_OK;
        size_t v0 = 0, v1 = 0;
        if (i >= n || text[i] != ':')
            st = framing_error(label, text, n, i, "expected ':' after the member name");
        if (st == FSDP_STATUS_OK) {
            v0 = skip_ws(text, n, i + 1);
            st = value_end(label, text, n, v0, &v1);
        }
        if (st == FSDP_STATUS_OK && fn)
            st = fn(arg, key->str, key->len, text + v0, v1 - v0, v0);
        if (key)
            fsdp_json_free(key);
        if (st != FSDP_STATUS_OK)
            return st;
        i = skip_ws(text, n, v1);
        if (i < n && text[i] == '}')
            break;
        if (i >= n || text[i] != ',')
            return framing_error(label, text, n, i, "expected ',' or '}' after a member");
        i = skip_ws(text, n, i + 1);
    }
    i = skip_ws(text, n, i + 1);
    if (i != n)
        return framing_error(label, text, n, i, "expected the end of the text after the object");
    return FSDP_STATUS_OK;
}

fsdp_status fsdp_st_json_value(const char *label, const char *key, const char *value, size_t n,
                               size_t offset, size_t max, fsdp_json **out)
{
    *out = NULL;
    if (n > max)
        return fsdp_error_set(FSDP_STATUS_FORMAT, "%s: the value of \"%.80s\" (byte %zu) is %zu "
                              "bytes long, more than the %zu such an entry may have", label, key,
                              offset, n, max);
    fsdp_status st = fsdp_json_parse(value, n, out);
    if (st == FSDP_STATUS_FORMAT)
        fsdp_error_prefix("%s is not valid JSON: in the value of \"%.80s\" at byte %zu", label,
                          key, offset);
    return st;
}

const char *fsdp_st_json_raw_type(const char *value, size_t n)
{
    if (n == 0)
        return "nothing";
    switch (value[0]) {
    case '{': return "object";
    case '[': return "array";
    case '"': return "string";
    case 't':
    case 'f': return "boolean";
    case 'n': return "null";
    default: return "number";
    }
}
