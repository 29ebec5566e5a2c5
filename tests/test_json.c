/*
 * test_json.c - the strict JSON reader (core/json.h): values and escapes
 * decode right, everything RFC 8259 forbids is refused with a line and
 * column, hostile nesting is refused without a crash.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/json.h"
#include "testutil.h"

static fsdp_json *parse_ok(const char *text)
{
    fsdp_json *v = NULL;
    fsdp_status st = fsdp_json_parse(text, strlen(text), &v);
    ck_assert_msg(st == FSDP_STATUS_OK, "'%s': %s", text, fsdp_error_msg());
    ck_assert_ptr_nonnull(v);
    return v;
}

START_TEST(test_values)
{
    fsdp_json *v = parse_ok(" {\"a\": [1, -0.5e+2, 3E-1, 0, -0, 123456789012],\n"
                            "  \"b\": {\"t\": true, \"f\": false, \"n\": null},\n"
                            "  \"s\": \"x\\\"\\\\\\/\\b\\f\\n\\r\\t\", \"e\": [], \"o\": {}} ");
    ck_assert_int_eq(v->type, FSDP_JSON_OBJECT);
    ck_assert_uint_eq(v->n, 5);
    const fsdp_json *a = fsdp_json_get(v, "a");
    ck_assert(a && a->type == FSDP_JSON_ARRAY && a->n == 6);
    static const double want[] = {1, -50, 0.3, 0, 0, 123456789012.0};
    for (size_t i = 0; i < 6; i++) {
        const fsdp_json *x = fsdp_json_at(a, i);
        ck_assert(x && x->type == FSDP_JSON_NUMBER);
        ck_assert_msg(x->number == want[i], "element %zu: %g", i, x->number);
    }
    ck_assert_ptr_null(fsdp_json_at(a, 6));
    const fsdp_json *b = fsdp_json_get(v, "b");
    ck_assert(fsdp_json_get(b, "t")->type == FSDP_JSON_BOOL && fsdp_json_get(b, "t")->boolean);
    ck_assert(fsdp_json_get(b, "f")->type == FSDP_JSON_BOOL && !fsdp_json_get(b, "f")->boolean);
    ck_assert_int_eq(fsdp_json_get(b, "n")->type, FSDP_JSON_NULL);
    const fsdp_json *s = fsdp_json_get(v, "s");
    ck_assert_str_eq(s->str, "x\"\\/\b\f\n\r\t");
    ck_assert_uint_eq(s->len, 9);
    ck_assert_uint_eq(fsdp_json_get(v, "e")->n, 0);
    ck_assert_int_eq(fsdp_json_get(v, "o")->type, FSDP_JSON_OBJECT);
    ck_assert_ptr_null(fsdp_json_get(v, "missing"));
    ck_assert_ptr_null(fsdp_json_get(a, "a")); /* not an object */
    fsdp_json_free(v);

    /* scalars at the top level; the last of repeated keys wins */
    v = parse_ok("42");
    ck_assert(v->type == FSDP_JSON_NUMBER && v->number == 42);
    fsdp_json_free(v);
    v = parse_ok("{\"k\":1,\"k\":2}");
    ck_assert(fsdp_json_get(v, "k")->number == 2);
    fsdp_json_free(v);
}
END_TEST

START_TEST(test_unicode)
{
    /* \u escapes to UTF-8, surrogate pairs joined; raw UTF-8 passes through;
     * an escaped NUL keeps its length */
    fsdp_json *v = parse_ok("[\"\\u00e9\\u20ac\\ud83d\\ude00\", \"\xc3\xa9\", \"a\\u0000b\"]");
    ck_assert_str_eq(fsdp_json_at(v, 0)->str, "\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80");
    ck_assert_str_eq(fsdp_json_at(v, 1)->str, "\xc3\xa9");
    ck_assert_uint_eq(fsdp_json_at(v, 2)->len, 3);
    ck_assert(!memcmp(fsdp_json_at(v, 2)->str, "a\0b", 3));
    /* such a string is text, never a name (it would compare equal to "a") */
    ck_assert_ptr_null(fsdp_json_name(fsdp_json_at(v, 2)));
    ck_assert_str_eq(fsdp_json_name(fsdp_json_at(v, 1)), "\xc3\xa9");
    ck_assert_ptr_null(fsdp_json_name(NULL));
    fsdp_json_free(v);
}
END_TEST

START_TEST(test_rejects)
{
    static const char *const bad[] = {
        "", " ", "{", "[", "{\"a\":1,}", "[1,]", "[,1]", "01", "1.", ".5", "-", "1e", "1e+",
        "+1", "NaN", "nan", "Infinity", "-Infinity", "tru", "nul", "\"abc", "\"a\x01\"",
        "\"\\q\"", "\"\\u12\"", "\"\\udc00\"", "\"\\ud83d\"", "\"\\ud83d\\u0041\"", "{\"a\" 1}",
        "{a:1}", "{'a':1}", "[1 2]", "{} x", "[1]]", "{\"a\":}", "0x10", "\"tab\there\"",
        "{\"text\\u0000\":1}", /* a member name would read as "text" (issue 29, 9) */
    };
    for (size_t i = 0; i < FSDP_TEST_LEN(bad); i++) {
        fsdp_json *v = (fsdp_json *)1;
        fsdp_status st = fsdp_json_parse(bad[i], strlen(bad[i]), &v);
        ck_assert_msg(st == FSDP_STATUS_FORMAT, "'%s' was accepted", bad[i]);
        ck_assert_ptr_null(v);
        ck_assert_msg(strstr(fsdp_error_msg(), "line 1, column"), "'%s': %s", bad[i],
                      fsdp_error_msg());
    }
}
END_TEST

START_TEST(test_error_position)
{
    const char *text = "[1,\n  2,\n  ]";
    fsdp_json *v;
    ck_assert_int_eq(fsdp_json_parse(text, strlen(text), &v), FSDP_STATUS_FORMAT);
    ck_assert_msg(strstr(fsdp_error_msg(), "line 3, column 3"), "%s", fsdp_error_msg());
    ck_assert_msg(strstr(fsdp_error_msg(), "found ']'"), "%s", fsdp_error_msg());
    /* the length bounds the input: a NUL inside is just a bad byte */
    ck_assert_int_eq(fsdp_json_parse("[1]\0", 4, &v), FSDP_STATUS_FORMAT);
    ck_assert_msg(strstr(fsdp_error_msg(), "0x00"), "%s", fsdp_error_msg());
    ck_assert_int_eq(fsdp_json_parse("[1]xyz", 3, &v), FSDP_STATUS_OK);
    fsdp_json_free(v);
}
END_TEST

START_TEST(test_depth)
{
    size_t n = 100000;
    char *deep = malloc(2 * n + 1);
    ck_assert_ptr_nonnull(deep);
    for (size_t i = 0; i < n; i++) {
        deep[i] = '[';
        deep[n + i] = ']';
    }
    deep[2 * n] = '\0';
    fsdp_json *v;
    ck_assert_int_eq(fsdp_json_parse(deep, 2 * n, &v), FSDP_STATUS_FORMAT);
    ck_assert(strstr(fsdp_error_msg(), "nesting"));
    /* just inside the limit is fine */
    size_t k = FSDP_JSON_MAX_DEPTH;
    memset(deep, '[', k);
    memset(deep + k, ']', k);
    ck_assert_int_eq(fsdp_json_parse(deep, 2 * k, &v), FSDP_STATUS_OK);
    fsdp_json_free(v);
    memset(deep, '[', k + 1);
    memset(deep + k + 1, ']', k + 1);
    ck_assert_int_eq(fsdp_json_parse(deep, 2 * k + 2, &v), FSDP_STATUS_FORMAT);
    ck_assert(strstr(fsdp_error_msg(), "nesting"));
    free(deep);
}
END_TEST

START_TEST(test_file)
{
    fsdp_json *v;
    ck_assert_int_eq(fsdp_json_parse_file("/nonexistent/x.json", &v), FSDP_STATUS_IO);
    ck_assert(strstr(fsdp_error_msg(), "/nonexistent/x.json"));
    char path[512];
    fsdp_test_path(path, sizeof path, "big.json");
    /* larger than the reader's first buffer */
    size_t cap = 400000, len = 0;
    char *text = malloc(cap);
    ck_assert_ptr_nonnull(text);
    len += (size_t)snprintf(text, cap, "[");
    for (int i = 0; i < 50000; i++)
        len += (size_t)snprintf(text + len, cap - len, "%s%d", i ? "," : "", i);
    snprintf(text + len, cap - len, "]\n");
    fsdp_test_write_file(path, text);
    free(text);
    ck_assert_int_eq(fsdp_json_parse_file(path, &v), FSDP_STATUS_OK);
    ck_assert_uint_eq(v->n, 50000);
    size_t i = 0;
    for (const fsdp_json *c = v->child; c; c = c->next, i++)
        ck_assert(c->number == (double)i);
    fsdp_json_free(v);
    fsdp_test_write_file(path, "{\"a\":\n[1,2,,3]}");
    ck_assert_int_eq(fsdp_json_parse_file(path, &v), FSDP_STATUS_FORMAT);
    ck_assert_msg(strstr(fsdp_error_msg(), path) && strstr(fsdp_error_msg(), "line 2, column 6"),
                  "%s", fsdp_error_msg());
}
END_TEST

int main(void)
{
    const fsdp_test_tcase tcases[] = {
        {"json", .tmpdir = true,
         FSDP_TESTS(test_values, test_unicode, test_rejects, test_error_position, test_depth,
                    test_file)},
    };
    return fsdp_test_main("json", tcases, FSDP_TEST_LEN(tcases));
}
