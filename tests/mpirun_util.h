/*
 * mpirun_util.h - what the suites that start jobs with Open MPI's mpirun
 * (test_mpi_procs, test_mpi_train, test_mpi_jobs) share: why such a test
 * must skip, the mpirun command line for a job on this machine (loopback,
 * with the sanitizer allowances test_mpi_procs.c explains), and running a
 * command line with its output captured.
 *
 * Header-only: FSDP_MPIRUN, the mpirun the build found, is passed by the
 * Makefile to these suites alone.
 */
#ifndef FSDP_TESTS_MPIRUN_UTIL_H
#define FSDP_TESTS_MPIRUN_UTIL_H

#include <check.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>

#include "comm/procs.h"
#include "testutil.h"

#ifndef FSDP_MPIRUN
#define FSDP_MPIRUN "" /* the Makefile passes the mpirun it found */
#endif

static inline double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* How much longer than a plain build a sanitizer build may take to end a
 * job (a time limit in these suites is a liveness check: "ends within
 * seconds", not a speed goal); CI runs the tsan build beside make test on
 * 2 cores. */
#define MPIRUN_SLACK ((FSDP_TEST_TSAN || FSDP_TEST_ASAN) ? 3.0 : 1.0)

/* Why the mpirun tests cannot run here, or NULL. */
static inline const char *mpirun_skip_reason(void)
{
    if (!fsdp_procs_mpi_built)
        return "built without MPI (MPI=0 or no Open MPI found)";
    if (!*FSDP_MPIRUN)
        return "no mpirun found at build time";
    return NULL;
}

/* Inside a test: pass with a SKIP line naming it when mpirun cannot run. */
#define SKIP_UNLESS_MPIRUN()                                       \
    do {                                                           \
        const char *why_ = mpirun_skip_reason();                   \
        if (why_) {                                                \
            printf("SKIP: %s: %s\n", __func__, why_);              \
            return;                                                \
        }                                                          \
    } while (0)

/* What lets Open MPI run as root; it goes before the command line. */
#define MPIRUN_ENV "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1"

/* mpirun and its options for a job on this machine, up to -np (which the
 * caller adds): loopback, oversubscribed, unbound, and under a sanitizer
 * its allowance (no leak check in the workers; shared memory only under
 * TSan). */
static inline const char *mpirun_cmd(char *buf, size_t n)
{
    const char *san = FSDP_TEST_ASAN   ? "-x ASAN_OPTIONS=detect_leaks=0"
                      : FSDP_TEST_TSAN ? "-x TSAN_OPTIONS=halt_on_error=1 --mca btl self,vader"
                                       : "";
    snprintf(buf, n, "%s --oversubscribe --bind-to none %s", FSDP_MPIRUN, san);
    return buf;
}

/* Run cmd through the shell, its output (the first cap - 1 bytes; the rest
 * is read and dropped) in out. Returns the exit code (128 + signal when
 * killed); *secs (if not NULL) how long it ran. A sanitizer's report in
 * the output fails the test. */
static inline int run_captured(const char *cmd, char *out, size_t cap, double *secs)
{
    double t0 = now_s();
    FILE *f = popen(cmd, "r");
    ck_assert_ptr_nonnull(f);
    size_t len = fread(out, 1, cap - 1, f);
    out[len] = '\0';
    char drop[4096];
    while (fread(drop, 1, sizeof drop, f) > 0)
        ;
    int rc = pclose(f);
    if (secs)
        *secs = now_s() - t0;
    ck_assert_msg(!strstr(out, "Sanitizer"), "a sanitizer spoke:\n%s", out);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : 128 + WTERMSIG(rc);
}

/* Run a shell command line (printf-style) for at most limit_s seconds;
 * its output in out. Returns the exit code (124: timed out); *secs how
 * long it ran. A sanitizer's report in the output fails the test. */
static inline int shell(char *out, size_t cap, int limit_s, double *secs, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static inline int shell(char *out, size_t cap, int limit_s, double *secs, const char *fmt, ...)
{
    char line[8192], cmd[8400];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    ck_assert(n > 0 && (size_t)n < sizeof line);
    snprintf(cmd, sizeof cmd, "timeout -k 5 %d sh -c '%s' 2>&1", limit_s, line);
    return run_captured(cmd, out, cap, secs);
}

/* The mpirun in front of `fsdp`: loopback on one machine, and the
 * sanitizer allowances (test_mpi_procs.c says why). */
static inline const char *mpirun_prefix(char *buf, size_t n)
{
    char mpi[480];
    snprintf(buf, n, MPIRUN_ENV " %s", mpirun_cmd(mpi, sizeof mpi));
    return buf;
}

#endif /* FSDP_TESTS_MPIRUN_UTIL_H */
