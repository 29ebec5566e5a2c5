/*
 * test_names.c - name tables (core/names.h): lookups both ways, the one
 * parse error and its list of allowed names, masks of accepted values, the
 * joined metavar/list forms and their truncation, and the dtype table
 * behind the public fsdp_dtype_name().
 */
#include <check.h>
#include <string.h>

#include "core/names.h"
#include "testutil.h"

enum { COLOUR_RED = 0, COLOUR_GREEN = 1, COLOUR_DEEP_BLUE = 5 };

static const fsdp_name colour_names[] = {
    {"red", COLOUR_RED, "the first"},
    {"green", COLOUR_GREEN, NULL},
    {"deep-blue", COLOUR_DEEP_BLUE, "values need not be dense"},
};
static const fsdp_name_table colours = FSDP_NAME_TABLE(colour_names);

START_TEST(test_lookups)
{
    ck_assert_int_eq(colours.n, 3);
    ck_assert_ptr_eq(fsdp_names_find(&colours, "green"), &colour_names[1]);
    ck_assert_ptr_null(fsdp_names_find(&colours, "Green")); /* case-sensitive */
    ck_assert_ptr_null(fsdp_names_find(&colours, "gree"));
    ck_assert_ptr_null(fsdp_names_find(&colours, ""));
    ck_assert_ptr_null(fsdp_names_find(&colours, NULL));
    ck_assert_ptr_eq(fsdp_names_of(&colours, COLOUR_DEEP_BLUE), &colour_names[2]);
    ck_assert_ptr_null(fsdp_names_of(&colours, 2));
    ck_assert_str_eq(fsdp_names_name(&colours, COLOUR_RED), "red");
    ck_assert_str_eq(fsdp_names_name(&colours, -1), "?");
}
END_TEST

START_TEST(test_parse)
{
    int v = -7;
    ck_assert_int_eq(fsdp_names_parse(&colours, 0, "deep-blue", &v), FSDP_STATUS_OK);
    ck_assert_int_eq(v, COLOUR_DEEP_BLUE);
    v = -7;
    ck_assert_int_eq(fsdp_names_parse(&colours, 0, "purple", &v), FSDP_STATUS_INVALID_ARG);
    ck_assert_int_eq(v, -7); /* untouched on failure */
    ck_assert_str_eq(fsdp_error_msg(), "unknown value 'purple' (expected red, green or deep-blue)");
    ck_assert_int_eq(fsdp_names_parse(&colours, 0, NULL, &v), FSDP_STATUS_INVALID_ARG);
    ck_assert_str_eq(fsdp_error_msg(), "unknown value '' (expected red, green or deep-blue)");
    /* a mask narrows what is accepted and what the message lists */
    unsigned warm = FSDP_NAME_BIT(COLOUR_RED) | FSDP_NAME_BIT(COLOUR_DEEP_BLUE);
    ck_assert_int_eq(fsdp_names_parse(&colours, warm, "red", &v), FSDP_STATUS_OK);
    ck_assert_int_eq(v, COLOUR_RED);
    ck_assert_int_eq(fsdp_names_parse(&colours, warm, "green", &v), FSDP_STATUS_INVALID_ARG);
    ck_assert_str_eq(fsdp_error_msg(), "'green' is not accepted here (expected red or deep-blue)");
    /* a very long value is cut in the message, not overflowed */
    char big[600];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    ck_assert_int_eq(fsdp_names_parse(&colours, 0, big, &v), FSDP_STATUS_INVALID_ARG);
    ck_assert_uint_lt(strlen(fsdp_error_msg()), 200);
}
END_TEST

START_TEST(test_join)
{
    char buf[64];
    ck_assert_str_eq(fsdp_names_join(&colours, 0, "|", "|", buf, sizeof buf), "red|green|deep-blue");
    ck_assert_str_eq(fsdp_names_join(&colours, 0, ", ", " or ", buf, sizeof buf),
                     "red, green or deep-blue");
    ck_assert_str_eq(fsdp_names_join(&colours, FSDP_NAME_BIT(COLOUR_GREEN), ", ", " or ", buf,
                                     sizeof buf), "green");
    ck_assert_str_eq(fsdp_names_join(&colours, FSDP_NAME_BIT(3), ", ", " or ", buf, sizeof buf),
                     "");
    /* truncated to the buffer, always terminated */
    char small[8];
    memset(small, '#', sizeof small);
    fsdp_names_join(&colours, 0, "|", "|", small, sizeof small);
    ck_assert_str_eq(small, "red|gre");
    fsdp_names_join(&colours, 0, "|", "|", small, 1);
    ck_assert_str_eq(small, "");
}
END_TEST

START_TEST(test_dtype_table)
{
    ck_assert_int_eq(fsdp_dtype_names.n, FSDP_DTYPE_COUNT);
    for (int dt = 0; dt < FSDP_DTYPE_COUNT; dt++) {
        int v = -1;
        ck_assert_int_eq(fsdp_names_parse(&fsdp_dtype_names, 0, fsdp_dtype_name((fsdp_dtype)dt),
                                          &v), FSDP_STATUS_OK);
        ck_assert_int_eq(v, dt);
        ck_assert_ptr_nonnull(fsdp_names_of(&fsdp_dtype_names, dt)->help);
    }
    ck_assert_str_eq(fsdp_dtype_name(FSDP_DTYPE_F32), "fp32");
    ck_assert_str_eq(fsdp_dtype_name(FSDP_DTYPE_BF16), "bf16");
    ck_assert_str_eq(fsdp_dtype_name(FSDP_DTYPE_COUNT), "unknown");
}
END_TEST

int main(void)
{
    const fsdp_test_tcase tcases[] = {
        {"names", FSDP_TESTS(test_lookups, test_parse, test_join, test_dtype_table)},
    };
    return fsdp_test_main("names", tcases, FSDP_TEST_LEN(tcases));
}
