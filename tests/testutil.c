/*
 * testutil.c - the shared test helpers (testutil.h).
 */
#include <errno.h>
#include <ftw.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "testutil.h"

/* ---- the fsdp command ------------------------------------------------------- */

/* Run the shell command cmd, stdout and stderr into out; its exit code
 * (`what` names it in a failure). */
static int run_shell(char *out, size_t cap, const char *cmd, const char *what)
{
    FILE *p = popen(cmd, "r");
    ck_assert_msg(p != NULL, "cannot run '%s'", cmd);
    size_t got = fread(out, 1, cap - 1, p);
    out[got] = '\0';
    while (fgetc(p) != EOF) /* drain what did not fit, so the command is not killed by SIGPIPE */
        ;
    int st = pclose(p);
    ck_assert_msg(st != -1 && WIFEXITED(st), "'%s' did not exit normally (status 0x%x):\n%.2000s",
                  what, st, out);
    return WEXITSTATUS(st);
}

int fsdp_test_cli(char *out, size_t cap, const char *fmt, ...)
{
    char args[4096], cmd[4608], what[4200];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    ck_assert_msg(n >= 0 && (size_t)n < sizeof args, "command line too long: %s", fmt);
    snprintf(cmd, sizeof cmd, "%s %s 2>&1", FSDP_BIN, args);
    snprintf(what, sizeof what, "fsdp %s", args);
    return run_shell(out, cap, cmd, what);
}

int fsdp_test_sh(char *out, size_t cap, const char *fmt, ...)
{
    char script[4096], cmd[4608];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(script, sizeof script, fmt, ap);
    va_end(ap);
    ck_assert_msg(n >= 0 && (size_t)n < sizeof script, "command line too long: %s", fmt);
    snprintf(cmd, sizeof cmd, "(%s) 2>&1", script);
    return run_shell(out, cap, cmd, script);
}

void fsdp_test_cli_cases(const fsdp_test_cli_case *cases, size_t n)
{
    static char out[1 << 17];
    for (size_t i = 0; i < n; i++) {
        int rc = fsdp_test_cli(out, sizeof out, "%s", cases[i].args);
        ck_assert_msg(rc == cases[i].rc, "'fsdp %s' exited %d, want %d:\n%.2000s", cases[i].args,
                      rc, cases[i].rc, out);
        ck_assert_msg(!cases[i].expect || strstr(out, cases[i].expect),
                      "'fsdp %s' said:\n%.2000s\nwant '%s'", cases[i].args, out, cases[i].expect);
    }
}

/* ---- files -------------------------------------------------------------------- */

static char g_tmpdir[512];

static void tmpdir_setup(void)
{
    const char *base = getenv("TMPDIR");
    snprintf(g_tmpdir, sizeof g_tmpdir, "%s/fsdp_test_XXXXXX", base && *base ? base : "/tmp");
    ck_assert_msg(mkdtemp(g_tmpdir) != NULL, "cannot create a scratch directory under %s",
                  base && *base ? base : "/tmp");
}

static void tmpdir_teardown(void)
{
    if (g_tmpdir[0])
        fsdp_test_rm_rf(g_tmpdir);
    g_tmpdir[0] = '\0';
}

void fsdp_test_add_tmpdir(TCase *tc)
{
    tcase_add_unchecked_fixture(tc, tmpdir_setup, tmpdir_teardown);
}

char *fsdp_test_path(char *buf, size_t n, const char *name)
{
    static int k;
    ck_assert_msg(g_tmpdir[0], "fsdp_test_path needs fsdp_test_add_tmpdir on the test case");
    int w = snprintf(buf, n, "%s/%ld_%d_%s", g_tmpdir, (long)getpid(), k++, name);
    ck_assert_msg(w > 0 && (size_t)w < n, "path buffer of %zu bytes too small for '%s'", n, name);
    return buf;
}

char *fsdp_test_mkdir(char *buf, size_t n, const char *name)
{
    fsdp_test_path(buf, n, name);
    ck_assert_msg(mkdir(buf, 0700) == 0, "cannot create directory %s: %s", buf, strerror(errno));
    return buf;
}

char *fsdp_test_read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    ck_assert_msg(f != NULL, "cannot open %s", path);
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    ck_assert_ptr_nonnull(buf);
    size_t got;
    while ((got = fread(buf + n, 1, cap - n - 1, f)) > 0) {
        n += got;
        if (cap - n - 1 == 0) {
            cap *= 2;
            buf = realloc(buf, cap);
            ck_assert_ptr_nonnull(buf);
        }
    }
    ck_assert_msg(!ferror(f), "error reading %s", path);
    fclose(f);
    buf[n] = '\0';
    if (len)
        *len = n;
    return buf;
}

void fsdp_test_write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    ck_assert_msg(f != NULL, "cannot create %s", path);
    size_t n = strlen(text);
    ck_assert_msg(fwrite(text, 1, n, f) == n && fclose(f) == 0, "cannot write %s", path);
}

void pathf(char *out, size_t n, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(out, n, fmt, ap);
    va_end(ap);
    REQUIRE(k > 0 && (size_t)k < n, "path too long");
}

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st, (void)flag, (void)ftw;
    remove(path);
    return 0;
}

void fsdp_test_rm_rf(const char *path)
{
    nftw(path, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

/* ---- running ------------------------------------------------------------------ */

bool fsdp_test_forks(void)
{
    const char *f = getenv("CK_FORK");
    return !(f && !strcmp(f, "no"));
}

int fsdp_test_run_suite(Suite *s)
{
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}

int fsdp_test_main(const char *name, const fsdp_test_tcase *tcases, size_t n_tcases)
{
    Suite *s = suite_create(name);
    for (size_t i = 0; i < n_tcases; i++) {
        const fsdp_test_tcase *c = &tcases[i];
        TCase *tc = tcase_create(c->name);
        tcase_set_tags(tc, c->name); /* so CK_EXCLUDE_TAGS=NAME leaves a case out */
        if (c->timeout_s > 0)
            tcase_set_timeout(tc, c->timeout_s);
        else if (FSDP_TEST_TSAN || FSDP_TEST_ASAN)
            tcase_set_timeout(tc, FSDP_TEST_SANITIZED_TIMEOUT_S);
        if (c->tmpdir)
            fsdp_test_add_tmpdir(tc);
        if (c->checked_setup || c->checked_teardown)
            tcase_add_checked_fixture(tc, c->checked_setup, c->checked_teardown);
        for (size_t k = 0; k < c->n_tests; k++) {
            const TTest *t = c->tests[k];
            if (t->fn) {
                tcase_add_test(tc, t);
            } else { /* head is the first member: t is the fsdp_test_loop */
                const fsdp_test_loop *loop = (const fsdp_test_loop *)t;
                tcase_add_loop_test(tc, loop->test, 0, loop->n);
            }
        }
        suite_add_tcase(s, tc);
    }
    return fsdp_test_run_suite(s);
}
