/*
 * case_util.h - the row of the suites' tables that pair an input (a spec,
 * a path, environment settings, a JSON config) with a fragment of what
 * must be said about it (the error message, the printed result): one type
 * for all of them, as testutil.h's fsdp_test_cli_case is for command
 * lines.
 */
#ifndef FSDP_TESTS_CASE_UTIL_H
#define FSDP_TESTS_CASE_UTIL_H

typedef struct text_case {
    const char *in;   /* the input (NULL where the test supplies it) */
    const char *want; /* a fragment the message or output must hold */
} text_case;

#endif /* FSDP_TESTS_CASE_UTIL_H */
