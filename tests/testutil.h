/*
 * testutil.h - helpers the Check suites share: running the fsdp command
 * and checking its exit code and output, table-driven command cases,
 * scratch directories that are removed even when a test fails, whole-file
 * reads and writes, the suite runner, and which sanitizer the build uses.
 *
 * Linked into every suite (TEST_COMMON in the Makefile). The assertions
 * here are Check's, so call these from a test's own process (the forked
 * test), never from rank threads.
 */
#ifndef FSDP_TESTS_TESTUTIL_H
#define FSDP_TESTS_TESTUTIL_H

#include <check.h>
#include <stdbool.h>
#include <stddef.h>

#ifndef FSDP_BIN
#define FSDP_BIN "build/fsdp" /* the Makefile passes the build's own */
#endif

/* Elements of a static array. */
#define FSDP_TEST_LEN(a) (sizeof(a) / sizeof((a)[0]))

/* Sanitizer builds: 1 when built with ThreadSanitizer / AddressSanitizer
 * (tests shrink their sizes, not their checks). */
#if defined(__SANITIZE_THREAD__)
#define FSDP_TEST_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define FSDP_TEST_TSAN 1
#endif
#endif
#ifndef FSDP_TEST_TSAN
#define FSDP_TEST_TSAN 0
#endif
#if defined(__SANITIZE_ADDRESS__)
#define FSDP_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define FSDP_TEST_ASAN 1
#endif
#endif
#ifndef FSDP_TEST_ASAN
#define FSDP_TEST_ASAN 0
#endif

/* ---- the fsdp command ------------------------------------------------------- */

/* Run `FSDP_BIN <args>` through the shell (args formatted printf-style),
 * stdout and stderr together into out[0..cap) (NUL-terminated; the rest
 * is read and dropped). Asserts that it exited normally (no signal) and
 * returns its exit code. */
int fsdp_test_cli(char *out, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* One command case: `fsdp <args>` must exit with rc and print `expect`
 * (a substring; NULL: anything). */
typedef struct fsdp_test_cli_case {
    const char *args;
    int rc;
    const char *expect;
} fsdp_test_cli_case;

/* Run every case; a failure names the case and shows what was printed. */
void fsdp_test_cli_cases(const fsdp_test_cli_case *cases, size_t n);

/* ---- files -------------------------------------------------------------------- */

/* Add to tc an unchecked fixture that gives its tests a fresh scratch
 * directory and removes it with everything in it after the last test,
 * whether tests passed, failed or crashed. */
void fsdp_test_add_tmpdir(TCase *tc);

/* A path in the scratch directory: "<dir>/<pid>_<k>_<name>", unique within
 * the run (each forked test has its own pid). Not created. Asserts that
 * the fixture is in place. Returns buf. */
char *fsdp_test_path(char *buf, size_t n, const char *name);

/* The whole file, NUL-terminated; *len (if not NULL) its size. Asserts it
 * can be read. The caller frees. */
char *fsdp_test_read_file(const char *path, size_t *len);

/* Write text to path (replacing it); asserts success. */
void fsdp_test_write_file(const char *path, const char *text);

/* Remove path and, if it is a directory, everything below it (a missing
 * path is fine). */
void fsdp_test_rm_rf(const char *path);

/* ---- running ------------------------------------------------------------------ */

/* True when Check runs each test in its own process (the default;
 * CK_FORK=no turns it off): settings read once per process need it. */
bool fsdp_test_forks(void);

/* Run the suite and free it; returns the process exit code (0: all passed). */
int fsdp_test_run_suite(Suite *s);

#endif /* FSDP_TESTS_TESTUTIL_H */
