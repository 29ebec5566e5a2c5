/*
 * json.c - a strict recursive-descent JSON reader (see json.h).
 *
 * Assumes inputs small enough to hold in memory (metrics, traces, shard
 * maps: megabytes). Every node is its own heap allocation; children are a
 * singly linked list kept in document order through a tail pointer.
 */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fileio.h"
#include "core/json.h"

struct parser {
    const char *s;
    size_t len, pos;
    fsdp_status st;   /* first failure */
};

static void where(const struct parser *p, size_t pos, int *line, int *col)
{
    *line = 1;
    *col = 1;
    for (size_t i = 0; i < pos && i < p->len; i++) {
        if (p->s[i] == '\n') {
            (*line)++;
            *col = 1;
        } else {
            (*col)++;
        }
    }
}

static void fail(struct parser *p, const char *what)
{
    if (p->st != FSDP_STATUS_OK)
        return;
    int line, col;
    where(p, p->pos, &line, &col);
    if (p->pos >= p->len)
        p->st = fsdp_error_set(FSDP_STATUS_FORMAT, "line %d, column %d: %s, found the end of the input",
                               line, col, what);
    else {
        unsigned char c = (unsigned char)p->s[p->pos];
        if (c >= 32 && c < 127)
            p->st = fsdp_error_set(FSDP_STATUS_FORMAT, "line %d, column %d: %s, found '%c'", line,
                                   col, what, c);
        else
            p->st = fsdp_error_set(FSDP_STATUS_FORMAT, "line %d, column %d: %s, found byte 0x%02x",
                                   line, col, what, c);
    }
}

static void oom(struct parser *p)
{
    if (p->st == FSDP_STATUS_OK)
        p->st = fsdp_error_set(FSDP_STATUS_OOM, "out of host memory parsing JSON");
}

static void skip_ws(struct parser *p)
{
    while (p->pos < p->len) {
        char c = p->s[p->pos];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r')
            break;
        p->pos++;
    }
}

static int peek(const struct parser *p) { return p->pos < p->len ? (unsigned char)p->s[p->pos] : -1; }

static bool literal(struct parser *p, const char *word)
{
    size_t n = strlen(word);
    if (p->len - p->pos < n || memcmp(p->s + p->pos, word, n) != 0)
        return false;
    p->pos += n;
    return true;
}

static int hex4(struct parser *p)
{
    if (p->len - p->pos < 4)
        return -1;
    int v = 0;
    for (int i = 0; i < 4; i++) {
        char c = p->s[p->pos + (size_t)i];
        v <<= 4;
        if (c >= '0' && c <= '9')
            v |= c - '0';
        else if (c >= 'a' && c <= 'f')
            v |= c - 'a' + 10;
        else if (c >= 'A' && c <= 'F')
            v |= c - 'A' + 10;
        else
            return -1;
    }
    p->pos += 4;
    return v;
}

static size_t put_utf8(char *out, uint32_t cp)
{
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Parse a string at p->pos (which is '"'); *out is heap, NUL-terminated.
 * Decoded output is never longer than the source. */
static char *parse_string(struct parser *p, size_t *out_len)
{
    size_t start = ++p->pos;
    size_t end = start;
    while (end < p->len && p->s[end] != '"')
        end += p->s[end] == '\\' ? 2 : 1;
    char *out = malloc((end > p->len ? p->len : end) - start + 1);
    if (!out) {
        oom(p);
        return NULL;
    }
    size_t n = 0;
    for (;;) {
        int c = peek(p);
        if (c < 0) {
            fail(p, "unterminated string: expected '\"'");
            goto bad;
        }
        if (c == '"') {
            p->pos++;
            break;
        }
        if (c < 0x20) {
            fail(p, "control character in a string (escape it)");
            goto bad;
        }
        if (c != '\\') {
            out[n++] = (char)c;
            p->pos++;
            continue;
        }
        p->pos++;
        int e = peek(p);
        p->pos++;
        switch (e) {
        case '"': out[n++] = '"'; break;
        case '\\': out[n++] = '\\'; break;
        case '/': out[n++] = '/'; break;
        case 'b': out[n++] = '\b'; break;
        case 'f': out[n++] = '\f'; break;
        case 'n': out[n++] = '\n'; break;
        case 'r': out[n++] = '\r'; break;
        case 't': out[n++] = '\t'; break;
        case 'u': {
            int hi = hex4(p);
            if (hi < 0) {
                fail(p, "expected 4 hex digits after \\u");
                goto bad;
            }
            uint32_t cp = (uint32_t)hi;
            if (hi >= 0xD800 && hi <= 0xDBFF) {
                int lo = -1;
                if (p->len - p->pos >= 2 && p->s[p->pos] == '\\' && p->s[p->pos + 1] == 'u') {
                    p->pos += 2;
                    lo = hex4(p);
                }
                if (lo < 0xDC00 || lo > 0xDFFF) {
                    fail(p, "expected a low surrogate \\uDC00..\\uDFFF after a high surrogate");
                    goto bad;
                }
                cp = 0x10000 + (((uint32_t)hi - 0xD800) << 10) + ((uint32_t)lo - 0xDC00);
            } else if (hi >= 0xDC00 && hi <= 0xDFFF) {
                fail(p, "lone low surrogate in a \\u escape");
                goto bad;
            }
            n += put_utf8(out + n, cp); /* 6 or 12 source bytes -> at most 4 */
            break;
        }
        default:
            p->pos--;
            fail(p, "expected an escape (\\\" \\\\ \\/ \\b \\f \\n \\r \\t \\uXXXX)");
            goto bad;
        }
    }
    out[n] = '\0';
    *out_len = n;
    return out;
bad:
    free(out);
    return NULL;
}

static bool is_digit(int c) { return c >= '0' && c <= '9'; }

/* One or more digits, else fail(p, what). */
static bool digits(struct parser *p, const char *what)
{
    if (!is_digit(peek(p))) {
        fail(p, what);
        return false;
    }
    while (is_digit(peek(p)))
        p->pos++;
    return true;
}

static bool parse_number(struct parser *p, double *out)
{
    size_t start = p->pos;
    if (peek(p) == '-')
        p->pos++;
    if (peek(p) == '0') {
        p->pos++;
        if (is_digit(peek(p))) {
            fail(p, "leading zeros are not allowed in a number");
            return false;
        }
    } else if (!digits(p, "expected a digit")) {
        return false;
    }
    if (peek(p) == '.') {
        p->pos++;
        if (!digits(p, "expected a digit after '.'"))
            return false;
    }
    if (peek(p) == 'e' || peek(p) == 'E') {
        p->pos++;
        if (peek(p) == '+' || peek(p) == '-')
            p->pos++;
        if (!digits(p, "expected a digit in the exponent"))
            return false;
    }
    char buf[64];
    size_t n = p->pos - start;
    char *tmp = n < sizeof buf ? buf : malloc(n + 1);
    if (!tmp) {
        oom(p);
        return false;
    }
    memcpy(tmp, p->s + start, n);
    tmp[n] = '\0';
    errno = 0;
    *out = strtod(tmp, NULL); /* grammar checked above; overflow gives +-HUGE_VAL */
    if (tmp != buf)
        free(tmp);
    return true;
}

static fsdp_json *new_node(struct parser *p, fsdp_json_type t)
{
    fsdp_json *v = calloc(1, sizeof *v);
    if (!v)
        oom(p);
    else
        v->type = t;
    return v;
}

static fsdp_json *parse_value(struct parser *p, int depth);

/* Array or object at p->pos ('[' or '{'). */
static fsdp_json *parse_container(struct parser *p, int depth, bool object)
{
    if (depth >= FSDP_JSON_MAX_DEPTH) {
        fail(p, "nesting deeper than 256 levels");
        return NULL;
    }
    fsdp_json *v = new_node(p, object ? FSDP_JSON_OBJECT : FSDP_JSON_ARRAY);
    if (!v)
        return NULL;
    char close = object ? '}' : ']';
    p->pos++;
    skip_ws(p);
    if (peek(p) == close) {
        p->pos++;
        return v;
    }
    fsdp_json **tail = &v->child;
    for (;;) {
        char *key = NULL;
        size_t klen;
        skip_ws(p);
        if (object) {
            if (peek(p) != '"') {
                fail(p, "expected a member name in double quotes");
                goto bad;
            }
            size_t at = p->pos;
            if (!(key = parse_string(p, &klen)))
                goto bad;
            if (strlen(key) != klen) { /* it would compare equal to the name before it */
                free(key);
                p->pos = at;
                fail(p, "a member name holds \\u0000 (a NUL character), which no name has");
                goto bad;
            }
            skip_ws(p);
            if (peek(p) != ':') {
                free(key);
                fail(p, "expected ':' after a member name");
                goto bad;
            }
            p->pos++;
        }
        fsdp_json *c = parse_value(p, depth + 1);
        if (!c) {
            free(key);
            goto bad;
        }
        c->key = key;
        *tail = c;
        tail = &c->next;
        v->n++;
        skip_ws(p);
        if (peek(p) == ',') {
            p->pos++;
            continue;
        }
        if (peek(p) == close) {
            p->pos++;
            return v;
        }
        fail(p, object ? "expected ',' or '}' in an object" : "expected ',' or ']' in an array");
        goto bad;
    }
bad:
    fsdp_json_free(v);
    return NULL;
}

static fsdp_json *parse_value(struct parser *p, int depth)
{
    skip_ws(p);
    int c = peek(p);
    fsdp_json *v = NULL;
    switch (c) {
    case '{': return parse_container(p, depth, true);
    case '[': return parse_container(p, depth, false);
    case '"': {
        size_t n;
        char *s = parse_string(p, &n);
        if (!s)
            return NULL;
        if (!(v = new_node(p, FSDP_JSON_STRING))) {
            free(s);
            return NULL;
        }
        v->str = s;
        v->len = n;
        return v;
    }
    case 't':
    case 'f':
    case 'n':
        if (literal(p, "true") || literal(p, "false")) {
            if ((v = new_node(p, FSDP_JSON_BOOL)))
                v->boolean = c == 't';
            return v;
        }
        if (literal(p, "null"))
            return new_node(p, FSDP_JSON_NULL);
        break;
    default:
        if (c == '-' || is_digit(c)) {
            double d;
            if (!parse_number(p, &d))
                return NULL;
            if ((v = new_node(p, FSDP_JSON_NUMBER)))
                v->number = d;
            return v;
        }
        break;
    }
    fail(p, "expected a value (object, array, string, number, true, false or null)");
    return NULL;
}

fsdp_status fsdp_json_parse(const char *text, size_t len, fsdp_json **out)
{
    *out = NULL;
    struct parser p = {.s = text, .len = len, .pos = 0, .st = FSDP_STATUS_OK};
    fsdp_json *v = parse_value(&p, 0);
    if (v) {
        skip_ws(&p);
        if (p.pos != p.len) {
            fail(&p, "expected the end of the input after the value");
            fsdp_json_free(v);
            v = NULL;
        }
    }
    if (!v) {
        if (p.st == FSDP_STATUS_OK) /* unreachable: every NULL path sets st */
            p.st = fsdp_error_set(FSDP_STATUS_INTERNAL, "JSON parser failed without a reason");
        return p.st;
    }
    *out = v;
    return FSDP_STATUS_OK;
}

fsdp_status fsdp_json_parse_file(const char *path, fsdp_json **out)
{
    *out = NULL;
    char *buf;
    size_t n;
    FSDP_TRY(fsdp_read_file(path, "JSON file", FSDP_JSON_MAX_FILE_BYTES, &buf, &n));
    fsdp_status st = fsdp_json_parse(buf, n, out);
    if (st != FSDP_STATUS_OK)
        fsdp_error_prefix("JSON file '%s'", path);
    free(buf);
    return st;
}

void fsdp_json_free(fsdp_json *v)
{
    while (v) {
        fsdp_json *next = v->next;
        fsdp_json_free(v->child);
        free(v->str);
        free(v->key);
        free(v);
        v = next;
    }
}

const char *fsdp_json_name(const fsdp_json *v)
{
    return v && v->type == FSDP_JSON_STRING && strlen(v->str) == v->len ? v->str : NULL;
}

const fsdp_json *fsdp_json_get(const fsdp_json *obj, const char *key)
{
    if (!obj || obj->type != FSDP_JSON_OBJECT)
        return NULL;
    const fsdp_json *found = NULL;
    for (const fsdp_json *c = obj->child; c; c = c->next)
        if (!strcmp(c->key, key))
            found = c;
    return found;
}

const fsdp_json *fsdp_json_at(const fsdp_json *arr, size_t i)
{
    if (!arr || arr->type != FSDP_JSON_ARRAY)
        return NULL;
    const fsdp_json *c = arr->child;
    while (c && i--)
        c = c->next;
    return c;
}

const char *fsdp_json_type_name(fsdp_json_type t)
{
    static const char *const names[] = {"null", "boolean", "number", "string", "array", "object"};
    return (unsigned)t < sizeof names / sizeof names[0] ? names[t] : "?";
}

void fsdp_json_write_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        if (*c == '"' || *c == '\\')
            fprintf(f, "\\%c", *c);
        else if (*c < 0x20)
            fprintf(f, "\\u%04x", *c);
        else
            fputc(*c, f);
    }
    fputc('"', f);
}
