/*
 * test_faults.c - the fsdp command under hostile conditions, as a user, a
 * full disk or another process produce them: a fault injected
 * (FSDP_FAULT) into every collective, allocation and file write of a
 * training step on each rank; SIGINT and SIGTERM, once and twice; a data
 * file truncated under a run; a model file holding NaN; outputs that
 * cannot be written; arguments at the limits of their types; a corrupt
 * model file; resumes the README shows. Each case checks the exit code,
 * the message and, where a run had checkpoints, that the newest one still
 * loads. Runs the built binary (FSDP_BIN) in its own process.
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "case_util.h"
#include "ckpt/ckpt_dir.h"
#include "ckpt/modelfile.h"
#include "file_util.h"
#include "models/model.h"
#include "models/registry.h"
#include "testutil.h"
#include "train_util.h"

static char out[1 << 17];

/* How many hostile cases the suite ran (printed at the end of each test). */
static int n_cases;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- a child process whose output is read while it runs ---------------------- */

typedef struct child {
    pid_t pid;
    int fd;          /* its stdout and stderr together */
    char buf[1 << 17];
    size_t n;
} child;

static void child_start(child *c, const char *args)
{
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "exec %s %s 2>&1", FSDP_BIN, args);
    int p[2];
    ck_assert_int_eq(pipe(p), 0);
    c->n = 0;
    c->buf[0] = '\0';
    c->pid = fork();
    ck_assert_int_ge(c->pid, 0);
    if (c->pid == 0) {
        dup2(p[1], STDOUT_FILENO);
        close(p[0]);
        close(p[1]);
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    close(p[1]);
    c->fd = p[0];
}

/* Read what is there within `wait_s`; false at end of output. */
static bool child_read(child *c, double wait_s)
{
    struct pollfd pfd = {.fd = c->fd, .events = POLLIN};
    if (poll(&pfd, 1, (int)(wait_s * 1000)) <= 0)
        return true;
    char tmp[4096];
    ssize_t got = read(c->fd, tmp, sizeof tmp);
    if (got <= 0)
        return false;
    size_t keep = c->n + (size_t)got < sizeof c->buf - 1 ? (size_t)got : sizeof c->buf - 1 - c->n;
    memcpy(c->buf + c->n, tmp, keep);
    c->n += keep;
    c->buf[c->n] = '\0';
    return true;
}

/* Wait until the output holds `text` (asserts it does within timeout_s). */
static void child_wait_for(child *c, const char *text, double timeout_s)
{
    double t0 = now_s();
    while (!strstr(c->buf, text)) {
        ck_assert_msg(now_s() - t0 < timeout_s, "no '%s' after %.0f s:\n%.3000s", text,
                      timeout_s, c->buf);
        if (!child_read(c, 0.05))
            ck_abort_msg("the command ended without printing '%s':\n%.3000s", text, c->buf);
    }
}

/* Read to the end and reap: the exit code (asserts a normal exit). */
static int child_finish(child *c, double *seconds)
{
    double t0 = now_s();
    while (child_read(c, 1.0))
        ck_assert_msg(now_s() - t0 < 300, "the command did not end:\n%.3000s", c->buf);
    if (seconds)
        *seconds = now_s() - t0;
    close(c->fd);
    int st = 0;
    ck_assert_int_eq(waitpid(c->pid, &st, 0), c->pid);
    ck_assert_msg(WIFEXITED(st), "killed by signal %d:\n%.3000s", WIFSIGNALED(st) ? WTERMSIG(st) : 0,
                  c->buf);
    return WEXITSTATUS(st);
}

/* ---- helpers ------------------------------------------------------------------ */

/* The newest complete checkpoint under dir loads: every shard of it is read
 * and checksummed by a conversion. */
static void assert_ckpt_loads(const char *dir, const char *context)
{
    char bin[600];
    snprintf(bin, sizeof bin, "%s.check.bin", dir);
    int rc = fsdp_test_cli(out, sizeof out, "convert %s %s --quiet", dir, bin);
    ck_assert_msg(rc == 0, "%s: the newest checkpoint in %s does not load (exit %d):\n%.2000s",
                  context, dir, rc, out);
    unlink(bin);
}

/* ---- FSDP_FAULT: every operation of a training step --------------------------- */

#define MATRIX_ARGS                                                                         \
    "train --model tiny --devices 2 --batch 2 --seq 8 --eval 0 --ckpt-every 1 --ckpt-dir %s " \
    "--log %s --steps %d"

/* Operations of `kind` that rank `rank` makes in a run of `steps` steps:
 * read from the hook's warning when it never fires. */
static long count_ops(const char *kind, int rank, int steps)
{
    char dir[512], log[512], spec[64];
    fsdp_test_path(dir, sizeof dir, "count_ck");
    fsdp_test_path(log, sizeof log, "count.jsonl");
    snprintf(spec, sizeof spec, "%d:%s:1000000000", rank, kind);
    setenv("FSDP_FAULT", spec, 1);
    int rc = fsdp_test_cli(out, sizeof out, MATRIX_ARGS, dir, log, steps);
    unsetenv("FSDP_FAULT");
    ck_assert_msg(rc == 0, "counting run exited %d:\n%.2000s", rc, out);
    char want[96];
    snprintf(want, sizeof want, "rank %d made ", rank);
    const char *p = strstr(out, want);
    long n = -1;
    ck_assert_msg(p && sscanf(p + strlen(want), "%ld", &n) == 1, "no count in:\n%.2000s", out);
    fsdp_test_rm_rf(dir);
    return n;
}

/* For each kind and rank, fail each operation of step 2 in turn (the ops
 * between the end of a 1-step run and of a 2-step run: its forward and
 * backward, its metrics record, its checkpoint). Every run must exit 1
 * with the injected failure named once, and step 1's checkpoint (or step
 * 2's, if it was committed before the fault) must load. */
START_TEST(test_fault_matrix)
{
    static const text_case kinds[] = {
        {"alloc", "injected allocation failure"},
        {"collective", "injected failure in collective"},
        {"write", "injected write failure"},
    };
    int runs = 0;
    for (size_t k = 0; k < FSDP_TEST_LEN(kinds); k++) {
        for (int rank = 0; rank < 2; rank++) {
            long first = count_ops(kinds[k].in, rank, 1), last = count_ops(kinds[k].in, rank, 2);
            ck_assert_msg(last > first, "%s on rank %d: step 2 made no operation (%ld, %ld)",
                          kinds[k].in, rank, first, last);
            for (long op = first + 1; op <= last; op++) {
                char dir[512], log[512], spec[64], ctx[96];
                fsdp_test_path(dir, sizeof dir, "ck");
                fsdp_test_path(log, sizeof log, "m.jsonl");
                snprintf(spec, sizeof spec, "%d:%s:%ld", rank, kinds[k].in, op);
                snprintf(ctx, sizeof ctx, "FSDP_FAULT=%s", spec);
                setenv("FSDP_FAULT", spec, 1);
                int rc = fsdp_test_cli(out, sizeof out, MATRIX_ARGS, dir, log, 2);
                unsetenv("FSDP_FAULT");
                ck_assert_msg(rc == 1, "%s: exit %d:\n%.2000s", ctx, rc, out);
                ck_assert_msg(strstr(out, kinds[k].want), "%s:\n%.2000s", ctx, out);
                char dup[32], head[32];
                snprintf(dup, sizeof dup, "rank %d: rank %d:", rank, rank);
                snprintf(head, sizeof head, "error: rank %d: ", rank);
                ck_assert_msg(!strstr(out, dup) && strstr(out, head), "%s:\n%.2000s", ctx, out);
                ck_assert_msg(!strstr(out, "iB bytes"), "%s:\n%.2000s", ctx, out);
                assert_ckpt_loads(dir, ctx);
                fsdp_test_rm_rf(dir);
                unlink(log);
                runs++;
            }
        }
    }
    n_cases += runs;
    printf("fault matrix: %d injected runs\n", runs);
}
END_TEST

/* The hook's own errors: a malformed value and a rank outside the run. */
START_TEST(test_fault_spec_errors)
{
    static const text_case cases[] = {
        {"1:alloc", "is not RANK:OP:K"},
        {"x:alloc:1", "is not RANK:OP:K"},
        {"0:disk:1", "unknown value 'disk' (expected alloc, collective, write or stall)"},
        {"0:alloc:0", "K >= 1"},
        {"0:alloc:1x", "is not RANK:OP:K"},
        {"5:alloc:1", "names rank 5, but this run has 2 ranks"},
    };
    for (size_t i = 0; i < FSDP_TEST_LEN(cases); i++) {
        setenv("FSDP_FAULT", cases[i].in, 1);
        int rc = fsdp_test_cli(out, sizeof out,
                               "train --model tiny --devices 2 --steps 1 --eval 0");
        unsetenv("FSDP_FAULT");
        ck_assert_msg(rc == 2 && strstr(out, cases[i].want), "FSDP_FAULT=%s: exit %d:\n%s",
                      cases[i].in, rc, out);
        n_cases++;
    }
}
END_TEST

/* ---- the stall watchdog -------------------------------------------------------- */

/* Rank 1 never arrives at a collective of step 2 (FSDP_FAULT's stall):
 * with --watchdog 1 the run ends within seconds, exit 1, with one report
 * naming step 2, the collective, who arrived and who did not; the flight
 * record lies beside --log; step 2 is not checkpointed and step 1's
 * checkpoint loads. */
START_TEST(test_stall_ends_the_run_with_one_report)
{
    long k = count_ops("collective", 1, 1) + 3; /* early in step 2 */
    char dir[512], log[512], spec[64], flight[512];
    fsdp_test_path(dir, sizeof dir, "stall_ck");
    fsdp_test_path(log, sizeof log, "stall.jsonl");
    snprintf(flight, sizeof flight, "%.*s.flight.json", (int)(strlen(log) - 6), log);
    snprintf(spec, sizeof spec, "1:stall:%ld", k);
    setenv("FSDP_FAULT", spec, 1);
    double t0 = now_s();
    int rc = fsdp_test_cli(out, sizeof out, MATRIX_ARGS " --watchdog 1", dir, log, 5);
    double dt = now_s() - t0;
    unsetenv("FSDP_FAULT");
    ck_assert_msg(rc == 1, "exit %d:\n%.3000s", rc, out);
    ck_assert_msg(dt < 15, "the stalled run took %.1f s to end", dt);
    const char *report = strstr(out, "error: rank 0: stalled: waited ");
    ck_assert_msg(report && !strstr(strstr(report, "stalled: waited") + 1, "stalled: waited"),
                  "not one report:\n%.3000s", out);
    static const char *const want[] = {"(the watchdog's limit, --watchdog 1) at step 2 in ",
                                       "arrived: rank 0; not arrived: rank 1",
                                       "rank 1's newest collective: ", "stall.flight.json"};
    for (size_t i = 0; i < FSDP_TEST_LEN(want); i++)
        ck_assert_msg(strstr(report, want[i]), "the report lacks '%s':\n%.3000s", want[i], out);
    char *rec = fsdp_test_read_file(flight, NULL);
    ck_assert_msg(strstr(rec, "\"fsdp_flight_record\":1") && strstr(rec, "\"rank\":1,\"step\":2"),
                  "%.2000s", rec);
    free(rec);
    char ck[600];
    snprintf(ck, sizeof ck, "%s/step_%08d", dir, 2);
    ck_assert_msg(!fsdp_ckpt_is_complete(ck), "step 2 was checkpointed:\n%.3000s", out);
    snprintf(ck, sizeof ck, "%s/step_%08d", dir, 1);
    ck_assert_msg(fsdp_ckpt_is_complete(ck), "no checkpoint of step 1:\n%.3000s", out);
    assert_ckpt_loads(dir, "stall");
    n_cases++;
}
END_TEST

/* ---- signals ------------------------------------------------------------------ */

/* A run with every output, long enough to be interrupted. */
static void start_long_run(child *c, const char *model, char *dir, char *log, char *trace)
{
    fsdp_test_path(dir, 512, "sig_ck");
    fsdp_test_path(log, 512, "sig.jsonl");
    fsdp_test_path(trace, 512, "sig_trace.json");
    char args[2048];
    snprintf(args, sizeof args,
             "train --model %s --devices 2 --steps 1000000 --eval 0 --ckpt-dir %s --log %s "
             "--trace %s", model, dir, log, trace);
    child_start(c, args);
}

/* The first SIGINT or SIGTERM: the step ends, its checkpoint is written and
 * loads, the metrics hold every step, the trace is complete JSON, and the
 * exit code is 128 + the signal. */
START_TEST(test_signal_stops_with_checkpoint)
{
    static const int sigs[] = {SIGINT, SIGTERM};
    for (size_t i = 0; i < FSDP_TEST_LEN(sigs); i++) {
        child *c = malloc(sizeof *c);
        char dir[512], log[512], trace[512];
        start_long_run(c, "tiny", dir, log, trace);
        child_wait_for(c, "step     3/", 120);
        ck_assert_int_eq(kill(c->pid, sigs[i]), 0);
        int rc = child_finish(c, NULL);
        const char *name = sigs[i] == SIGINT ? "SIGINT" : "SIGTERM";
        ck_assert_msg(rc == 128 + sigs[i], "%s: exit %d:\n%.3000s", name, rc, c->buf);
        char want[64];
        snprintf(want, sizeof want, "stopped by %s after step ", name);
        const char *p = strstr(c->buf, want);
        int step = 0;
        ck_assert_msg(p && sscanf(p + strlen(want), "%d", &step) == 1 && step >= 3,
                      "%s:\n%.3000s", name, c->buf);
        char ck[600];
        snprintf(ck, sizeof ck, "%s/step_%08d", dir, step);
        ck_assert_msg(fsdp_ckpt_is_complete(ck), "%s: no checkpoint %s:\n%.3000s", name, ck,
                      c->buf);
        assert_ckpt_loads(dir, name);
        ck_assert_int_eq(count_lines(log), step);
        char *t = fsdp_test_read_file(trace, NULL);
        size_t len = strlen(t);
        ck_assert_msg(len > 4 && !strcmp(t + len - 4, "\n]}\n"), "%s: trace ends '%s'", name,
                      len > 8 ? t + len - 8 : t);
        free(t);
        free(c);
        n_cases++;
    }
}
END_TEST

/* A second signal exits at once: no final checkpoint, same exit code. The
 * steps are long (about a second) so that the second signal lands inside
 * the step the first one asked to finish. */
START_TEST(test_second_signal_exits_at_once)
{
    child *c = malloc(sizeof *c);
    char dir[512], log[512], trace[512];
    if (FSDP_TEST_TSAN) {
        /* _exit leaves the rank threads unjoined by design: ThreadSanitizer's
         * exit report would call those that already finished a leak (and exit
         * 66) when the signal lands after the last step, before the joins */
        char opts[1024];
        const char *was = getenv("TSAN_OPTIONS");
        snprintf(opts, sizeof opts, "%s report_thread_leaks=0", was ? was : "");
        setenv("TSAN_OPTIONS", opts, 1); /* this test's own process (check forks one) */
    }
    start_long_run(c, "custom:layers=2,heads=4,channels=384,vocab=256,context=64", dir, log, trace);
    child_wait_for(c, "step     1/", 300);
    ck_assert_int_eq(kill(c->pid, SIGINT), 0);
    child_wait_for(c, "signal again to exit at once", 60);
    ck_assert_int_eq(kill(c->pid, SIGINT), 0);
    double dt = 0;
    int rc = child_finish(c, &dt);
    ck_assert_msg(rc == 130, "exit %d:\n%.3000s", rc, c->buf);
    ck_assert_msg(!strstr(c->buf, "stopped by SIGINT"),
                  "the second signal did not exit at once:\n%.3000s", c->buf);
    /* ThreadSanitizer holds a handler back until its thread next enters an
     * intercepted call; there (seen 2026-12-04, every run on a 2-core VM) the
     * second signal takes effect after the step's checkpoint, so only the
     * plain build can tell that none was written */
    if (!FSDP_TEST_TSAN) {
        ck_assert_msg(!strstr(c->buf, "checkpoint: step"),
                      "the second signal did not exit at once:\n%.3000s", c->buf);
        uint64_t step;
        bool found = true;
        ck_assert_int_eq(fsdp_ckpt_latest(dir, &step, &found), FSDP_STATUS_OK);
        ck_assert(!found);
    }
    free(c);
    n_cases++;
}
END_TEST

/* ---- data and model files that turn hostile ----------------------------------------- */

/* A byte-level text file truncated while the run trains: exit 1 naming the
 * file, after a checkpoint that loads. */
START_TEST(test_data_truncated_under_a_run)
{
    char data[512], dir[512];
    fsdp_test_path(data, sizeof data, "data.txt");
    fsdp_test_path(dir, sizeof dir, "trunc_ck");
    FILE *f = fopen(data, "w");
    ck_assert_ptr_nonnull(f);
    for (int i = 0; i < 1 << 20; i++)
        fputc("abcdefgh \n"[(i * 7 + i / 3) % 10], f);
    ck_assert_int_eq(fclose(f), 0);
    static const char *const how[] = {"emptied", "halved"};
    for (int k = 0; k < 2; k++) {
        child *c = malloc(sizeof *c);
        char args[1536];
        snprintf(args, sizeof args,
                 "train --model tiny --data %s --seq 32 --steps 1000000 --ckpt-dir %s%d", data,
                 dir, k);
        child_start(c, args);
        child_wait_for(c, "step     2/", 120);
        ck_assert_int_eq(truncate(data, k == 0 ? 0 : 1 << 19), 0);
        int rc = child_finish(c, NULL);
        ck_assert_msg(rc == 1 && strstr(c->buf, data) && strstr(c->buf, "while training"),
                      "%s: exit %d:\n%.3000s", how[k], rc, c->buf);
        char ck[600];
        snprintf(ck, sizeof ck, "%s%d", dir, k);
        assert_ckpt_loads(ck, how[k]);
        /* restore the file for the next case */
        if (k == 0)
            ck_assert_int_eq(truncate(data, 1 << 20), 0);
        free(c);
        n_cases++;
    }
}
END_TEST

/* Divergence from the first step: the run stops naming it (exit 1); with
 * --on-nonfinite skip it runs on, its metrics stay JSON (null, "skipped"),
 * and a checkpoint of the NaN parameters is refused. */
START_TEST(test_nonfinite_from_the_command)
{
    char model[512], log[512], dir[512];
    fsdp_test_path(model, sizeof model, "nan.bin");
    fsdp_test_path(log, sizeof log, "nan.jsonl");
    fsdp_test_path(dir, sizeof dir, "nan_ck");
    write_nan_tiny_model(model, 1, 3);
    int rc = fsdp_test_cli(out, sizeof out, "train --model %s --steps 3 --eval 0", model);
    ck_assert_msg(rc == 1 && strstr(out, "error: step 1: the loss is NaN") &&
                      strstr(out, "--on-nonfinite skip") && !strstr(out, "step     1/3"),
                  "exit %d:\n%.2000s", rc, out);
    rc = fsdp_test_cli(out, sizeof out,
                       "train --model %s --steps 3 --eval 0 --on-nonfinite skip --log %s --quiet",
                       model, log);
    ck_assert_msg(rc == 0 && strstr(out, "(3 skipped)"), "exit %d:\n%.2000s", rc, out);
    char *text = fsdp_test_read_file(log, NULL);
    ck_assert_msg(strstr(text, "\"loss\":null") && strstr(text, "\"grad_norm\":null") &&
                      strstr(text, "\"skipped\":true") && !strstr(text, "nan") &&
                      !strstr(text, "inf"),
                  "%s", text);
    free(text);
    rc = fsdp_test_cli(out, sizeof out,
                       "train --model %s --steps 2 --eval 0 --on-nonfinite skip --ckpt-dir %s",
                       model, dir);
    ck_assert_msg(rc == 1 && strstr(out, "refusing to write a checkpoint of a diverged state"),
                  "exit %d:\n%.2000s", rc, out);
    rc = fsdp_test_cli(out, sizeof out, "train --on-nonfinite sometimes");
    ck_assert_msg(rc == 2 && strstr(out, "expected stop or skip"), "%s", out);
    n_cases += 4;
}
END_TEST

/* One corrupt model file is a runtime error (exit 1) for every command; an
 * unknown model name stays a usage error (exit 2). */
START_TEST(test_corrupt_model_exits_1)
{
    char bad[512], st[512];
    fsdp_test_path(bad, sizeof bad, "bad.bin");
    fsdp_test_path(st, sizeof st, "bad.safetensors");
    fsdp_test_write_file(bad, "not a model, just some bytes that are far too short");
    fsdp_test_write_file(st, "\x10\x00\x00\x00\x00\x00\x00\x00{\"a\":");
    const char *files[] = {bad, st};
    static const char *const cmds[] = {
        "train --steps 1 --eval 0 --model %s", "plan --model %s", "shardmap --model %s",
        "eval --data synthetic --model %s", "sample --model %s", "convert %s %s.out.bin"};
    for (int f = 0; f < 2; f++)
        for (size_t i = 0; i < FSDP_TEST_LEN(cmds); i++) {
            char args[1600];
            snprintf(args, sizeof args, cmds[i], files[f], files[f]);
            int rc = fsdp_test_cli(out, sizeof out, "%s", args);
            ck_assert_msg(rc == 1 && strstr(out, files[f]), "'%s': exit %d:\n%.1500s", args, rc,
                          out);
            n_cases++;
        }
    for (size_t i = 0; i < 3; i++) {
        char args[600];
        snprintf(args, sizeof args, cmds[i], "gpt5");
        int rc = fsdp_test_cli(out, sizeof out, "%s", args);
        ck_assert_msg(rc == 2 && strstr(out, "unknown model 'gpt5'"), "'%s': exit %d:\n%s", args,
                      rc, out);
        n_cases++;
    }
}
END_TEST

/* ---- arguments, outputs and resumes ----------------------------------------------- */

START_TEST(test_hostile_arguments)
{
    static const fsdp_test_cli_case cases[] = {
        {"train --eval 2147483647", 2, "--eval: 2147483647 is out of range (expected 0..16777216)"},
        {"train --batch 2147483647", 2, "--batch: 2147483647 is out of range"},
        {"train --grad-accum 2147483647", 2, "--grad-accum: 2147483647 is out of range"},
        {"train --steps 2147483647", 2, "--steps: 2147483647 is out of range"},
        {"plan --batch 2147483647", 2, "--batch: 2147483647 is out of range"},
        {"train --model custom:layers=1,heads=1,channels=8,vocab=256,context=65536 --batch 65536 "
         "--seq 65536", 2, "= 4294967296 tokens per micro-batch"},
        {"train --seed ' -1'", 2, "--seed: bad value ' -1'"},
        {"train --seed -1", 2, "--seed: bad value '-1'"},
        {"train --seed 18446744073709551616", 2, "--seed: bad value"},
        {"train --device-mem 0", 2, "is 0 bytes (expected at least 1 byte"},
        {"train --device-mem 0.5", 2, "not a whole number of bytes"},
        {"train --device-mem 1.5", 2, "not a whole number of bytes"},
        {"eval --model x.bin --data synthetic --device-mem 0.5", 2, "not a whole number"},
        {"train --lr 1e30", 2, "--lr: 1e+30 is out of range (expected > 0 and <= 10)"},
        {"train --lr 0", 2, "--lr: 0 is out of range"},
        {"train --lr nan", 2, "--lr: bad value 'nan'"},
        {"train --wd inf", 2, "--wd: bad value 'inf'"},
        {"train --wd -0.1", 2, "--wd: -0.1 is out of range"},
        {"train --lr 2 --wd 1", 2, "keep lr x wd <= 1"},
        {"train --clip -1", 2, "--clip: -1 is out of range"},
        {"train --clip inf", 2, "--clip: bad value 'inf'"},
        {"train --momentum nan", 2, "--momentum: bad value 'nan'"},
        {"train --optimizer sgd --momentum 1", 2, "momentum 1 must be in [0, 1)"},
        {"train --warmup -1", 2, "--warmup: -1 is out of range"},
        {"train --allow-batch-change", 2, "--allow-batch-change only applies with --resume"},
        {"plan --clip nan", 2, "--clip: bad value 'nan'"},
    };
    fsdp_test_cli_cases(cases, FSDP_TEST_LEN(cases));
    n_cases += (int)FSDP_TEST_LEN(cases);
    /* sizes and counts print in 64 bits */
    int rc = fsdp_test_cli(out, sizeof out,
                           "train --model tiny --batch 65536 --seq 16 --grad-accum 65536 "
                           "--devices 2 --steps 1 --eval 0 --device-mem 64KiB");
    /* refused by the plan before the run: the global batch prints in 64 bits */
    ck_assert_msg(rc == 1 && strstr(out, "does not fit") &&
                      strstr(out, "--global-batch 8589934592") && !strstr(out, "= -"),
                  "exit %d:\n%.2000s", rc, out);
    n_cases++;
}
END_TEST

START_TEST(test_outputs_fail_before_step_1)
{
    static const fsdp_test_cli_case cases[] = {
        {"train --model tiny --steps 2 --eval 0 --ckpt-dir /proc/nope", 1,
         "--ckpt-dir '/proc/nope': cannot create directory"},
        {"train --model tiny --steps 2 --eval 0 --trace /nonexistent-dir/t.json", 1,
         "--trace '/nonexistent-dir/t.json': cannot create files"},
        {"train --model tiny --steps 2 --eval 0 --log /tmp", 1, "--log '/tmp' is a directory"},
    };
    for (size_t i = 0; i < FSDP_TEST_LEN(cases); i++) {
        int rc = fsdp_test_cli(out, sizeof out, "%s", cases[i].args);
        ck_assert_msg(rc == cases[i].rc && strstr(out, cases[i].expect) &&
                          !strstr(out, "step     1/"),
                      "'%s': exit %d:\n%.2000s", cases[i].args, rc, out);
        n_cases++;
    }
    if (access("/dev/full", W_OK) == 0) {
        char dir[512];
        fsdp_test_path(dir, sizeof dir, "full_ck");
        int rc = fsdp_test_cli(out, sizeof out,
                               "train --model tiny --steps 20 --eval 0 --log /dev/full "
                               "--ckpt-dir %s", dir);
        ck_assert_msg(rc == 1 && strstr(out, "cannot write metrics file '/dev/full' at step 1") &&
                          strstr(out, "checkpoint step 2"),
                      "exit %d:\n%.2000s", rc, out);
        assert_ckpt_loads(dir, "--log /dev/full");
        n_cases++;
    }
}
END_TEST

/* README's session: train on 4 devices, resume on 2. The global batch
 * differs (16 x 4 vs 16 x 2): refused, naming both ways out; --batch 32
 * keeps it; --allow-batch-change accepts the change and says what it costs.
 * Resuming a finished run says there was nothing left to do. */
START_TEST(test_resume_cases)
{
    char dir[512];
    fsdp_test_path(dir, sizeof dir, "resume_ck");
    int rc = fsdp_test_cli(out, sizeof out,
                           "train --model tiny --devices 4 --steps 2 --eval 0 --ckpt-dir %s", dir);
    ck_assert_msg(rc == 0, "exit %d:\n%.2000s", rc, out);
    rc = fsdp_test_cli(out, sizeof out,
                       "train --model tiny --devices 2 --steps 4 --eval 0 --ckpt-dir %s --resume",
                       dir);
    ck_assert_msg(rc == 2 && strstr(out, "global batch of 64 sequences") &&
                      strstr(out, "--allow-batch-change"),
                  "exit %d:\n%.2000s", rc, out);
    rc = fsdp_test_cli(out, sizeof out,
                       "train --model tiny --devices 2 --batch 32 --steps 3 --eval 0 "
                       "--ckpt-dir %s --resume", dir);
    ck_assert_msg(rc == 0 && strstr(out, "step     3/3"), "exit %d:\n%.2000s", rc, out);
    rc = fsdp_test_cli(out, sizeof out,
                       "train --model tiny --devices 2 --steps 4 --eval 0 --ckpt-dir %s --resume "
                       "--allow-batch-change", dir);
    ck_assert_msg(rc == 0 && strstr(out, "no longer bit-identical") && strstr(out, "step     4/4"),
                  "exit %d:\n%.2000s", rc, out);
    rc = fsdp_test_cli(out, sizeof out,
                       "train --model tiny --devices 2 --steps 4 --eval 0 --ckpt-dir %s --resume "
                       "--quiet", dir);
    ck_assert_msg(rc == 0 && strstr(out, "nothing left to do: checkpoint step 4") &&
                      !strstr(out, "final loss"),
                  "exit %d:\n%.2000s", rc, out);
    rc = fsdp_test_cli(out, sizeof out,
                       "train --model tiny --devices 2 --steps 4 --ckpt-dir %s --resume", dir);
    ck_assert_msg(rc == 0 && strstr(out, "nothing left to do") && !strstr(out, "accuracy"),
                  "exit %d:\n%.2000s", rc, out);
    n_cases += 5;
}
END_TEST

/* plan describes the run train makes with the same options. */
START_TEST(test_plan_and_train_defaults_agree)
{
    int rc = fsdp_test_cli(out, sizeof out, "plan --model tiny");
    ck_assert_msg(rc == 0 && strstr(out, "batch 16 x seq 14"), "%s", out);
    rc = fsdp_test_cli(out, sizeof out, "train --model tiny --steps 1 --eval 0");
    ck_assert_msg(rc == 0 && strstr(out, "batch 16 x seq 14"), "%s", out);
    rc = fsdp_test_cli(out, sizeof out, "plan --model tiny --data 'some/shards_*.bin'");
    ck_assert_msg(rc == 0 && strstr(out, "batch 16 x seq 64"), "%s", out);
    n_cases += 2;
}
END_TEST

/* The remaining messages: an OOM hint names only what is not set yet, a
 * CRLF manifest says so, sample refuses a context or prompt the model
 * does not have before printing anything. */
START_TEST(test_messages)
{
    int rc = fsdp_test_cli(out, sizeof out,
                           "train --model small --device-mem 2MiB --steps 1 --eval 0 --offload "
                           "optimizer --precision bf16");
    /* the plan refuses it before anything is allocated and hands the search
     * the settings that are fixed (the run-time OOM hint is test_train_errors') */
    ck_assert_msg(rc == 1 && strstr(out, "does not fit") && strstr(out, "--precision bf16") &&
                      strstr(out, "fsdp plan --fit"),
                  "exit %d:\n%.2000s", rc, out);
    char dir[512], man[600];
    fsdp_test_path(dir, sizeof dir, "crlf_ck");
    rc = fsdp_test_cli(out, sizeof out, "train --model tiny --steps 1 --eval 0 --ckpt-dir %s",
                       dir);
    ck_assert_int_eq(rc, 0);
    snprintf(man, sizeof man, "%s/step_00000001/manifest", dir);
    char *text = fsdp_test_read_file(man, NULL);
    size_t n = strlen(text), k = 0;
    char *crlf = malloc(2 * n + 1);
    for (size_t i = 0; i < n; i++) {
        if (text[i] == '\n')
            crlf[k++] = '\r';
        crlf[k++] = text[i];
    }
    crlf[k] = '\0';
    fsdp_test_write_file(man, crlf);
    free(text);
    free(crlf);
    rc = fsdp_test_cli(out, sizeof out, "convert %s %s.bin", dir, dir);
    ck_assert_msg(rc == 1 && strstr(out, "CRLF line endings") && !strstr(out, "truncated"),
                  "exit %d:\n%.2000s", rc, out);
    /* sample: a context past the model's, a prompt outside its vocabulary
     * (refused before anything is echoed) */
    char m300[512], ck300[512];
    fsdp_test_path(ck300, sizeof ck300, "v300_ck");
    fsdp_test_path(m300, sizeof m300, "v300.bin");
    rc = fsdp_test_cli(out, sizeof out,
                       "train --model custom:layers=1,heads=1,channels=8,vocab=300,context=16 "
                       "--steps 1 --eval 0 --ckpt-dir %s --quiet", ck300);
    ck_assert_msg(rc == 0, "%s", out);
    rc = fsdp_test_cli(out, sizeof out, "convert %s %s --quiet", ck300, m300);
    ck_assert_msg(rc == 0, "%s", out);
    rc = fsdp_test_cli(out, sizeof out, "sample --model %s --seq 17 --prompt 1,2", m300);
    ck_assert_msg(rc == 2 && strstr(out, "--seq 17 is longer than the model's context of 16"),
                  "exit %d:\n%s", rc, out);
    rc = fsdp_test_cli(out, sizeof out, "sample --model %s --prompt '12,5000' --tokens 2", m300);
    ck_assert_msg(rc == 2 && strstr(out, "prompt token 5000 (at position 1) is outside") &&
                      !strstr(out, "12 5000"),
                  "exit %d:\n%s", rc, out);
    n_cases += 6;
}
END_TEST

static void report_count(void)
{
    /* each test runs in its own process: the count is per test */
    if (n_cases)
        printf("hostile cases run by this test: %d\n", n_cases);
}

int main(void)
{
    const fsdp_test_tcase tcases[] = {
        {"faults", 1200, .tmpdir = true, .checked_teardown = report_count,
         FSDP_TESTS(test_fault_matrix, test_fault_spec_errors, test_signal_stops_with_checkpoint,
                    test_second_signal_exits_at_once, test_data_truncated_under_a_run,
                    test_nonfinite_from_the_command, test_corrupt_model_exits_1,
                    test_hostile_arguments, test_outputs_fail_before_step_1, test_resume_cases,
                    test_plan_and_train_defaults_agree, test_messages,
                    test_stall_ends_the_run_with_one_report)},
    };
    return fsdp_test_main("faults", tcases, FSDP_TEST_LEN(tcases));
}
