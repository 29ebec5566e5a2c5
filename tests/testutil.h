/*
 * testutil.h - helpers the Check suites share: running the fsdp command
 * and checking its exit code and output, table-driven command cases,
 * scratch directories that are removed even when a test fails, whole-file
 * reads and writes, the suite runner and the table a suite is declared
 * by, and which sanitizer the build uses.
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

/* Fail the running test with a printf-style message unless cond holds. A
 * passing REQUIRE costs nothing (Check reports every passing ck_assert). */
#define REQUIRE(cond, ...)             \
    do {                               \
        if (!(cond))                   \
            ck_abort_msg(__VA_ARGS__); \
    } while (0)

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

/* A case that names no timeout gets this many seconds under a sanitizer:
 * such a build runs 5-15x slower than Check's 4 s default assumes, and CI
 * runs `make test` and `make tsan` side by side on two cores. */
#define FSDP_TEST_SANITIZED_TIMEOUT_S 30

/* ---- the fsdp command ------------------------------------------------------- */

/* Run `FSDP_BIN <args>` through the shell (args formatted printf-style),
 * stdout and stderr together into out[0..cap) (NUL-terminated; the rest
 * is read and dropped). Asserts that it exited normally (no signal) and
 * returns its exit code. */
int fsdp_test_cli(char *out, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* The same for a shell script (printf-style), for what needs the shell
 * around the command (limits, traps): `FSDP_BIN` is the binary to call. */
int fsdp_test_sh(char *out, size_t cap, const char *fmt, ...)
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

/* A fresh empty directory at fsdp_test_path(buf, n, name), for a test
 * that needs a directory of its own (to count its entries, to hand it to
 * the code as a run or checkpoint directory). Removed with the scratch
 * directory. Returns buf. */
char *fsdp_test_mkdir(char *buf, size_t n, const char *name);

/* The whole file, NUL-terminated; *len (if not NULL) its size. Asserts it
 * can be read. The caller frees. */
char *fsdp_test_read_file(const char *path, size_t *len);

/* Write text to path (replacing it); asserts success. */
void fsdp_test_write_file(const char *path, const char *text);

/* snprintf into out[0..n) that fails the test instead of truncating. */
void pathf(char *out, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Remove path and, if it is a directory, everything below it (a missing
 * path is fine). */
void fsdp_test_rm_rf(const char *path);

/* ---- running ------------------------------------------------------------------ */

/* True when Check runs each test in its own process (the default;
 * CK_FORK=no turns it off): settings read once per process need it. */
bool fsdp_test_forks(void);

/* Run the suite and free it; returns the process exit code (0: all passed). */
int fsdp_test_run_suite(Suite *s);

/* A suite is declared as a table of its test cases, in the order they
 * run, that main hands to fsdp_test_main:
 *
 *     const fsdp_test_tcase tcases[] = {
 *         {"format", 60, FSDP_TESTS(test_read, test_write)},
 *         {"files", 120, .tmpdir = true,
 *          FSDP_TESTS(test_roundtrip, FSDP_TEST_LOOP(test_hostile, n_hostile))},
 *     };
 *     return fsdp_test_main("ckpt", tcases, FSDP_TEST_LEN(tcases));
 *
 * START_TEST names are not constant expressions, so the table and its
 * lists live in automatic storage, inside main. */

/* One Check TCase. Name and tests are required, the rest may be left out. */
typedef struct fsdp_test_tcase {
    const char *name;
    int timeout_s;             /* per test; 0 or left out: Check's default (4 s), or
                                * FSDP_TEST_SANITIZED_TIMEOUT_S under a sanitizer */
    bool tmpdir;               /* fsdp_test_add_tmpdir: one scratch directory for the case */
    SFun checked_setup;        /* optional checked fixture: runs in each test's own */
    SFun checked_teardown;     /* process, before / after the test */
    const TTest *const *tests; /* (n_tests,) in the order they run; fill both with FSDP_TESTS */
    size_t n_tests;
} fsdp_test_tcase;

/* .tests and .n_tests of a fsdp_test_tcase from a list of START_TEST names
 * and FSDP_TEST_LOOPs. */
#define FSDP_TESTS(...)                            \
    .tests = (const TTest *const[]){__VA_ARGS__}, \
    .n_tests = FSDP_TEST_LEN(((const TTest *const[]){__VA_ARGS__}))

/* A loop test in a FSDP_TESTS list: Check runs test once for each _i in
 * [0, n) (tcase_add_loop_test(tc, test, 0, n)); n may be computed at run
 * time. The list holds TTest pointers, so that a plain test is just its
 * name; a loop is one too: the head of a fsdp_test_loop, marked by its
 * NULL fn. fsdp_test_main unwraps it; Check never sees it. */
typedef struct fsdp_test_loop {
    TTest head; /* fn NULL: not a test */
    const TTest *test;
    int n;
} fsdp_test_loop;

#define FSDP_TEST_LOOP(test, n) \
    (&(const fsdp_test_loop){{#test, NULL, __FILE__, __LINE__}, (test), (n)}.head)

/* Build the suite `name` from the test cases, in order, run it with
 * fsdp_test_run_suite and return its exit code. */
int fsdp_test_main(const char *name, const fsdp_test_tcase *tcases, size_t n_tcases);

#endif /* FSDP_TESTS_TESTUTIL_H */
