/*
 * test_cli.c - the fsdp command as a user runs it: exit codes (0 ok, 1
 * runtime error, 2 usage error), messages, --help, the metrics file.
 * Runs the built binary (FSDP_BIN, set by the Makefile).
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef FSDP_BIN
#define FSDP_BIN "build/fsdp"
#endif

/* Run `fsdp ARGS` capturing stdout+stderr into out; returns the exit code. */
static int run(const char *args, char *out, size_t cap)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s %s 2>&1", FSDP_BIN, args);
    FILE *p = popen(cmd, "r");
    ck_assert_ptr_nonnull(p);
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = '\0';
    while (fgetc(p) != EOF) /* drain */
        ;
    int st = pclose(p);
    ck_assert(WIFEXITED(st));
    return WEXITSTATUS(st);
}

static char buf[1 << 16];

START_TEST(test_usage_errors)
{
    static const struct {
        const char *args, *expect;
    } cases[] = {
        {"", "usage"},
        {"frobnicate", "unknown command"},
        {"train --devices 0", "--devices"},
        {"train --shard sideways", "unknown value 'sideways'"},
        {"train --precision fp8", "unknown value 'fp8'"},
        {"train --offload everything", "unknown value"},
        {"train --batch many", "bad value 'many'"},
        {"train --device-mem 12 parsecs", "unexpected argument"},
        {"train --device-mem lots", "bad size"},
        {"train --no-such-flag", "unknown option '--no-such-flag'"},
        {"train --steps", "needs a value"},
        {"train --ranks-per-device 2", "--ranks-per-device needs --backend cuda"},
        {"train --comm nccl", "needs --backend cuda"},
        {"train --model gpt5", "gpt5"},
        {"train --model tiny --seq 4096", "context"},
        {"train --lr -1", "--lr > 0"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int rc = run(cases[i].args, buf, sizeof buf);
        ck_assert_msg(rc == 2, "'fsdp %s' exited %d, want 2:\n%.600s", cases[i].args, rc, buf);
        ck_assert_msg(strstr(buf, cases[i].expect), "'fsdp %s' said:\n%.600s\nwant '%s'",
                      cases[i].args, buf, cases[i].expect);
    }
}
END_TEST

START_TEST(test_help_lists_every_flag)
{
    ck_assert_int_eq(run("train --help", buf, sizeof buf), 0);
    static const char *const flags[] = {
        "--backend", "--devices", "--model", "--data", "--batch", "--seq", "--grad-accum",
        "--steps", "--lr", "--warmup", "--wd", "--clip", "--shard", "--precision", "--offload",
        "--prefetch", "--deterministic", "--device-mem", "--ckpt-dir", "--ckpt-every",
        "--resume", "--log", "--trace", "--seed",
    };
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++)
        ck_assert_msg(strstr(buf, flags[i]), "train --help does not document %s", flags[i]);
    ck_assert_int_eq(run("--help", buf, sizeof buf), 0);
    ck_assert_ptr_nonnull(strstr(buf, "train"));
}
END_TEST

START_TEST(test_oom_exit_1)
{
    int rc = run("train --model small --device-mem 2MiB --steps 1 --eval 0", buf, sizeof buf);
    ck_assert_msg(rc == 1, "exit %d:\n%.600s", rc, buf);
    ck_assert_ptr_nonnull(strstr(buf, "out of memory"));
    ck_assert_ptr_nonnull(strstr(buf, "cap 2.00 MiB"));
}
END_TEST

START_TEST(test_train_writes_metrics)
{
    char path[] = "/tmp/fsdp_cli_XXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    close(fd);
    char args[256];
    snprintf(args, sizeof args,
             "train --model tiny --devices 2 --batch 2 --seq 16 --steps 3 --eval 8 --log %s", path);
    int rc = run(args, buf, sizeof buf);
    ck_assert_msg(rc == 0, "exit %d:\n%.600s", rc, buf);
    ck_assert_ptr_nonnull(strstr(buf, "step     3/3"));
    ck_assert_ptr_nonnull(strstr(buf, "held-out accuracy"));
    FILE *f = fopen(path, "r");
    ck_assert_ptr_nonnull(f);
    char line[4096];
    int n = 0;
    static const char *const keys[] = {"\"step\":", "\"loss\":", "\"lr\":", "\"grad_norm\":",
                                       "\"tokens\":", "\"tokens_per_s\":", "\"step_ms\":",
                                       "\"mfu\":", "\"peak_bytes\":[", "\"comm_bytes\":["};
    while (fgets(line, sizeof line, f)) {
        n++;
        ck_assert(line[0] == '{' && strstr(line, "}\n"));
        for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++)
            ck_assert_msg(strstr(line, keys[k]), "metrics line %d lacks %s: %s", n, keys[k], line);
        int step = 0;
        ck_assert_int_eq(sscanf(strstr(line, "\"step\":"), "\"step\":%d", &step), 1);
        ck_assert_int_eq(step, n);
    }
    fclose(f);
    unlink(path);
    ck_assert_int_eq(n, 3);
}
END_TEST

START_TEST(test_bad_data_file)
{
    int rc = run("train --model tiny --data /nonexistent/shard_*.bin --steps 1", buf, sizeof buf);
    ck_assert_msg(rc == 1 || rc == 2, "exit %d", rc);
    ck_assert_ptr_nonnull(strstr(buf, "/nonexistent/shard_*.bin"));
}
END_TEST

int main(void)
{
    Suite *s = suite_create("cli");
    TCase *tc = tcase_create("cli");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_usage_errors);
    tcase_add_test(tc, test_help_lists_every_flag);
    tcase_add_test(tc, test_oom_exit_1);
    tcase_add_test(tc, test_train_writes_metrics);
    tcase_add_test(tc, test_bad_data_file);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
