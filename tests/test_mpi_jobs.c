/*
 * test_mpi_jobs.c - a job of several `fsdp train` processes under Open
 * MPI's mpirun as an operator meets it when something is off: processes
 * given different settings, a signal to one process or to mpirun, a rank
 * that stalls.
 *
 * - Settings that must agree (train/train_agree.c): processes given
 *   different values are refused at start, within seconds, naming the flag
 *   and both values (different --steps used to wait for ever).
 * - Signals (cli/train.c, docs/errors.md): SIGTERM or SIGINT to any one
 *   process stops every process after the same step, with one checkpoint,
 *   every process exiting 128 + the signal (mpirun too) and no failure
 *   line; SIGTERM to mpirun reaches every process (Open MPI sends it after
 *   odls_base_sigkill_timeout) with the same outcome, mpirun's own exit
 *   code being Open MPI's.
 * - Stalls (core/flight.h): a rank that never arrives at a collective, or
 *   a process that stops, ends the job soon after --watchdog with one
 *   report naming who has not arrived, a flight record, no checkpoint.
 *
 * Jobs run on this machine (loopback, --oversubscribe); each test skips,
 * saying why, in a build without MPI or without mpirun.
 */
#include <check.h>
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ckpt/ckpt_dir.h"
#include "mpirun_util.h"
#include "testutil.h"

/* The fsdp binary by its absolute path: jobs run in their own directories. */
static char fsdp_bin[4096];

/* A fresh directory for one job. */
static char *job_dir(char *buf, size_t n, const char *name)
{
    fsdp_test_path(buf, n, name);
    ck_assert_int_eq(mkdir(buf, 0755), 0);
    return buf;
}

/* ---- settings ----------------------------------------------------------------------- */

/* Each case gives process 0 one value and process 1 another (mpirun's
 * ':' starts one of each). */
START_TEST(test_settings_must_agree)
{
    SKIP_UNLESS_MPIRUN();
    static const struct {
        const char *flag, *a, *b;
    } cases[] = {
        {"--steps", "3", "5"},            {"--eval", "0", "4"},
        {"--lr", "0.01", "0.02"},         {"--seed", "1", "2"},
        {"--batch", "2", "1"},            {"--clip", "1", "0"},
        {"--data", "synthetic", "d.txt"}, {"--model", "tiny", "small"},
        {"--grad-accum", "1", "2"},       {"--prefetch", "on", "off"},
        {"--ckpt-every", "1", "2"},       {"--precision", "fp32", "bf16"},
    };
    static char out[1 << 16];
    char dir[4096], pre[512], path[4200];
    job_dir(dir, sizeof dir, "agree");
    snprintf(path, sizeof path, "%s/d.txt", dir);
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    for (int i = 0; i < 200; i++)
        fputs("the quick brown fox jumps over the lazy dog\n", f);
    fclose(f);
    char host[FSDP_HOST_MAX];
    gethostname(host, sizeof host);
    for (size_t i = 0; i < FSDP_TEST_LEN(cases); i++) {
        const char *base = "--seq 16 --steps 3 --eval 0 --batch 2 --devices 1 --ckpt-dir ck";
        double secs;
        int rc = shell(out, sizeof out, 60, &secs, "cd %s && %s -np 1 %s train %s %s %s : -np 1 %s "
                       "train %s %s %s", dir, mpirun_prefix(pre, sizeof pre), fsdp_bin, base,
                       cases[i].flag, cases[i].a, fsdp_bin, base, cases[i].flag, cases[i].b);
        char want[512];
        snprintf(want, sizeof want, "%s: process 0 (host %.64s) has '%s', process 1 (host %.64s) "
                 "has '%s'", cases[i].flag, host, cases[i].a, host, cases[i].b);
        ck_assert_msg(rc != 0 && rc != 124 && strstr(out, want), "%s: exit %d after %.1f s, want "
                      "'%s':\n%.4000s", cases[i].flag, rc, secs, want, out);
        ck_assert_msg(secs < 30 * MPIRUN_SLACK, "%s: %.1f s to refuse", cases[i].flag, secs);
    }
}
END_TEST

/* ---- signals ------------------------------------------------------------------------ */

/* The parent of pid (from /proc), or -1. */
static pid_t parent_of(pid_t pid)
{
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *rp = strrchr(buf, ')'); /* the name may hold spaces */
    int ppid = -1;
    if (!rp || sscanf(rp + 1, " %*c %d", &ppid) != 1)
        return -1;
    return (pid_t)ppid;
}

/* Whether pid's environment holds `var` ("NAME=value"). */
static bool env_has(pid_t pid, const char *var)
{
    char path[64], env[1 << 15];
    snprintf(path, sizeof path, "/proc/%d/environ", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return false;
    size_t n = fread(env, 1, sizeof env - 1, f);
    fclose(f);
    env[n] = '\0';
    for (size_t i = 0; i < n; i += strlen(env + i) + 1)
        if (!strcmp(env + i, var))
            return true;
    return false;
}

/* The `fsdp` process of MPI rank `rank` among root's descendants (only
 * this test's job: other jobs may run on the machine), or -1. */
static pid_t job_fsdp_pid(pid_t root, int rank)
{
    char want[64];
    snprintf(want, sizeof want, "OMPI_COMM_WORLD_RANK=%d", rank);
    DIR *d = opendir("/proc");
    ck_assert_ptr_nonnull(d);
    pid_t found = -1;
    for (struct dirent *de; found < 0 && (de = readdir(d));) {
        pid_t pid = (pid_t)atoi(de->d_name);
        if (pid <= 0)
            continue;
        char path[64], comm[64] = "";
        snprintf(path, sizeof path, "/proc/%d/comm", (int)pid);
        FILE *f = fopen(path, "r");
        if (!f)
            continue;
        if (!fgets(comm, sizeof comm, f))
            comm[0] = '\0';
        fclose(f);
        if (strcmp(comm, "fsdp\n") || !env_has(pid, want))
            continue;
        for (pid_t p = pid; p > 1 && found < 0; p = parent_of(p))
            if (p == root)
                found = pid;
    }
    closedir(d);
    return found;
}

/* A job started in the background: mpirun's pid, where its output goes. */
typedef struct bg_job {
    pid_t mpirun;
    char dir[4096], log[4200];
} bg_job;

/* Start `mpirun [mca] -np 2` of a long training run (with `extra`
 * options) in its own directory, each process wrapped so that its exit
 * code lands in exit.<rank> (the wrapper outlives the signals; fsdp
 * installs its own handlers). direct: no wrapper (mpirun's children are
 * the fsdp processes). */
static void bg_start(bg_job *j, const char *name, const char *mca, bool direct,
                     const char *extra)
{
    char pre[512], cmd[12288], run[8192];
    job_dir(j->dir, sizeof j->dir, name);
    snprintf(j->log, sizeof j->log, "%s/out.txt", j->dir);
    snprintf(run, sizeof run, "%s train --model tiny --seq 16 --batch 2 --devices 2 --eval 0 "
             "--steps 100000 --ckpt-dir ck --log m.jsonl --quiet %s", fsdp_bin, extra);
    if (direct)
        snprintf(cmd, sizeof cmd, "cd %s && exec env %s %s -np 2 %s > %s 2>&1", j->dir,
                 mpirun_prefix(pre, sizeof pre), mca, run, j->log);
    else
        snprintf(cmd, sizeof cmd, "cd %s && exec env %s %s -np 2 sh -c 'trap : INT TERM; %s; "
                 "rc=$?; echo $rc > exit.$OMPI_COMM_WORLD_RANK; exit $rc' > %s 2>&1", j->dir,
                 mpirun_prefix(pre, sizeof pre), mca, run, j->log);
    j->mpirun = fork();
    ck_assert_int_ge(j->mpirun, 0);
    if (j->mpirun == 0) {
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
}

/* The fsdp process of MPI rank `rank` in job j (asserts it is found;
 * kills the job otherwise). */
static pid_t bg_process(bg_job *j, int rank)
{
    pid_t pid = job_fsdp_pid(j->mpirun, rank);
    if (pid < 0)
        kill(j->mpirun, SIGKILL);
    ck_assert_msg(pid > 0, "process %d of the job not found", rank);
    return pid;
}

/* Lines in dir/name (0 when it does not exist). */
static int lines_in(const char *dir, const char *name)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    int n = 0;
    for (int ch; (ch = fgetc(f)) != EOF;)
        n += ch == '\n';
    fclose(f);
    return n;
}

/* Wait until the job has logged `steps` steps (asserts it does within a
 * minute; kills it otherwise). */
static void bg_wait_steps(bg_job *j, int steps)
{
    for (int i = 0; i < 600 && lines_in(j->dir, "m.jsonl") < steps; i++)
        usleep(100 * 1000);
    if (lines_in(j->dir, "m.jsonl") < steps)
        kill(j->mpirun, SIGKILL);
    ck_assert_msg(lines_in(j->dir, "m.jsonl") >= steps, "the job never logged %d steps", steps);
}

/* Reap mpirun (killing it after limit_s): its exit code (128 + signal when
 * killed); the job's output in a buffer the caller frees. */
static int bg_finish(bg_job *j, double limit_s, double *secs, char **out)
{
    double t0 = now_s();
    int ws = 0;
    pid_t got = 0;
    while ((got = waitpid(j->mpirun, &ws, WNOHANG)) == 0 && now_s() - t0 < limit_s)
        usleep(50 * 1000);
    if (got == 0) {
        kill(j->mpirun, SIGKILL);
        waitpid(j->mpirun, &ws, 0);
    }
    *secs = now_s() - t0;
    *out = fsdp_test_read_file(j->log, NULL);
    ck_assert_msg(got == j->mpirun, "the job did not end within %.0f s:\n%.4000s", limit_s, *out);
    ck_assert_msg(!strstr(*out, "Sanitizer"), "a sanitizer spoke:\n%.4000s", *out);
    return WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + WTERMSIG(ws);
}

/* Checkpoints in dir/ck. */
static int n_checkpoints(const char *dir)
{
    char ck[4200];
    snprintf(ck, sizeof ck, "%s/ck", dir);
    DIR *d = opendir(ck);
    if (!d)
        return 0;
    int n = 0;
    for (struct dirent *de; (de = readdir(d));)
        n += !strncmp(de->d_name, "step_", 5);
    closedir(d);
    return n;
}

/* What a stopped job must leave: one checkpoint, of the last step the
 * metrics hold, which process 0 names; no failure. */
static void assert_stopped_in_order(const bg_job *j, const char *out, const char *sig_name)
{
    int steps = lines_in(j->dir, "m.jsonl"), n_ckpt = n_checkpoints(j->dir);
    char ck[4200], want[128];
    snprintf(ck, sizeof ck, "%s/ck/step_%08d", j->dir, steps);
    ck_assert_msg(n_ckpt == 1 && fsdp_ckpt_is_complete(ck), "%d checkpoints, want one of step "
                  "%d (%s):\n%.4000s", n_ckpt, steps, ck, out);
    snprintf(want, sizeof want, "stopped by %s after step %d of 100000; checkpoint step %d",
             sig_name, steps, steps);
    ck_assert_msg(strstr(out, want), "want '%s':\n%.4000s", want, out);
    ck_assert_msg(!strstr(out, "failed (") && !strstr(out, "ending every process"),
                  "a failure was reported:\n%.4000s", out);
}

/* A signal to one process (SIGTERM to process 1, SIGINT to process 0):
 * every process stops after the same step and exits 128 + the signal, and
 * so does mpirun. */
START_TEST(test_signal_to_one_process_stops_the_job)
{
    SKIP_UNLESS_MPIRUN();
    static const struct {
        int sig, victim;
        const char *name;
    } cases[] = {{SIGTERM, 1, "SIGTERM"}, {SIGINT, 0, "SIGINT"}};
    for (size_t i = 0; i < FSDP_TEST_LEN(cases); i++) {
        bg_job j;
        char name[32];
        snprintf(name, sizeof name, "sig%zu", i);
        bg_start(&j, name, "", false, "");
        bg_wait_steps(&j, 3);
        ck_assert_int_eq(kill(bg_process(&j, cases[i].victim), cases[i].sig), 0);
        double secs;
        char *out;
        int rc = bg_finish(&j, 60, &secs, &out);
        ck_assert_msg(rc == 128 + cases[i].sig, "%s to process %d: mpirun exit %d:\n%s",
                      cases[i].name, cases[i].victim, rc, out);
        for (int q = 0; q < 2; q++) {
            char file[16], path[4200];
            snprintf(file, sizeof file, "exit.%d", q);
            snprintf(path, sizeof path, "%s/%s", j.dir, file);
            char *code = fsdp_test_read_file(path, NULL);
            ck_assert_msg(atoi(code) == 128 + cases[i].sig, "%s to process %d: process %d "
                          "exited %s", cases[i].name, cases[i].victim, q, code);
            free(code);
        }
        assert_stopped_in_order(&j, out, cases[i].name);
        printf("%s to process %d: both processes exited %d after step %d, %.1f s later\n",
               cases[i].name, cases[i].victim, 128 + cases[i].sig, lines_in(j.dir, "m.jsonl"),
               secs);
        free(out);
    }
}
END_TEST

/* SIGTERM to mpirun: Open MPI sends SIGCONT, then SIGTERM to every process
 * odls_base_sigkill_timeout seconds later (and SIGKILL as long again
 * after), and exits 1 itself whatever they do. With time to finish the
 * step, the processes stop after the same one, with one checkpoint and no
 * failure. */
START_TEST(test_signal_to_mpirun_stops_the_job)
{
    SKIP_UNLESS_MPIRUN();
    bg_job j;
    bg_start(&j, "sigmpirun", "--mca odls_base_sigkill_timeout 5", true, "");
    bg_wait_steps(&j, 3);
    ck_assert_int_eq(kill(j.mpirun, SIGTERM), 0);
    double secs;
    char *out;
    bg_finish(&j, 60, &secs, &out);
    assert_stopped_in_order(&j, out, "SIGTERM");
    printf("SIGTERM to mpirun: stopped after step %d, %.1f s later\n", lines_in(j.dir, "m.jsonl"),
           secs);
    free(out);
}
END_TEST

/* ---- stalls ------------------------------------------------------------------------- */

/* Rank 3 (process 1) never arrives at its 20th collective: the job ends
 * within seconds of the deadline with one report, from process 1, naming
 * the missing rank; process 1's flight record lies beside the log; no
 * checkpoint is written. */
START_TEST(test_stalled_rank_ends_the_job)
{
    SKIP_UNLESS_MPIRUN();
    static char out[1 << 16];
    char dir[4096], pre[512], host[FSDP_HOST_MAX], want[256];
    job_dir(dir, sizeof dir, "stall");
    gethostname(host, sizeof host);
    double secs;
    int rc = shell(out, sizeof out, 120, &secs, "cd %s && %s -np 2 -x FSDP_FAULT=3:stall:20 %s "
                   "train --model tiny --seq 16 --batch 2 --devices 2 --eval 0 --steps 50 "
                   "--ckpt-dir ck --log m.jsonl --quiet --watchdog 2", dir,
                   mpirun_prefix(pre, sizeof pre), fsdp_bin);
    snprintf(want, sizeof want, "rank 2 (process 1 of 2, host %.64s): stalled: waited ", host);
    const char *report = strstr(out, want);
    ck_assert_msg(rc != 0 && rc != 124 && report, "exit %d, want '%s':\n%.4000s", rc, want, out);
    ck_assert_msg(!strstr(strstr(report, "stalled: waited") + 1, "stalled: waited"),
                  "more than one report:\n%.4000s", out);
    ck_assert_msg(strstr(report, "arrived: rank 2; not arrived: rank 3") &&
                      strstr(report, "rank 3's newest collective: "), "%.4000s", out);
    ck_assert_msg(secs < (2 + 20) * MPIRUN_SLACK, "the job took %.1f s to end", secs);
    char path[4200];
    snprintf(path, sizeof path, "%s/m.flight.1.json", dir);
    ck_assert_msg(access(path, F_OK) == 0, "no %s:\n%.4000s", path, out);
    ck_assert_int_eq(n_checkpoints(dir), 0);
    printf("a stalled rank under mpirun: the job ended after %.1f s (watchdog 2 s)\n", secs);
}
END_TEST

/* A whole process stops (SIGSTOP): the other process's first rank, waiting
 * on it between processes, reports it by process, host and ranks after the
 * deadline (plus its margin for waits on other processes), and the job
 * ends. */
START_TEST(test_stopped_process_is_reported)
{
    SKIP_UNLESS_MPIRUN();
    bg_job j;
    bg_start(&j, "stopped", "", true, "--watchdog 1");
    bg_wait_steps(&j, 3);
    pid_t victim = bg_process(&j, 1);
    ck_assert_int_eq(kill(victim, SIGSTOP), 0);
    double secs;
    char *out;
    int rc = bg_finish(&j, 60, &secs, &out);
    if (kill(victim, 0) == 0) { /* ours: never leave it stopped */
        kill(victim, SIGCONT);
        kill(victim, SIGKILL);
    }
    char host[FSDP_HOST_MAX], want[256];
    gethostname(host, sizeof host);
    snprintf(want, sizeof want, "every rank of this process arrived; answered: process 0 (this "
             "one); not answered: process 1 (host %.64s, ranks 2-3)", host);
    ck_assert_msg(rc != 0 && strstr(out, "rank 0 (process 0 of 2") && strstr(out, want),
                  "exit %d, want '%s':\n%.4000s", rc, want, out);
    char path[4200];
    snprintf(path, sizeof path, "%s/m.flight.json", j.dir);
    ck_assert_msg(access(path, F_OK) == 0, "no %s:\n%.4000s", path, out);
    printf("a stopped process: reported and the job ended %.1f s later\n", secs);
    free(out);
}
END_TEST

int main(void)
{
    if (!realpath(FSDP_BIN, fsdp_bin)) {
        perror("test_mpi_jobs: " FSDP_BIN);
        return 1;
    }
    const fsdp_test_tcase tcases[] = {
        {"settings", FSDP_TEST_TSAN || FSDP_TEST_ASAN ? 600 : 180, .tmpdir = true,
         FSDP_TESTS(test_settings_must_agree)},
        {"signals", FSDP_TEST_TSAN || FSDP_TEST_ASAN ? 600 : 180, .tmpdir = true,
         FSDP_TESTS(test_signal_to_one_process_stops_the_job,
                    test_signal_to_mpirun_stops_the_job)},
        {"stalls", FSDP_TEST_TSAN || FSDP_TEST_ASAN ? 600 : 180, .tmpdir = true,
         FSDP_TESTS(test_stalled_rank_ends_the_job, test_stopped_process_is_reported)},
    };
    return fsdp_test_main("mpi_jobs", tcases, FSDP_TEST_LEN(tcases));
}
