/*
 * test_cli.c - the fsdp command as a user runs it: exit codes (0 ok, 1
 * runtime error, 2 usage error), messages, --help read from the same name
 * tables as the parser, transports that do not fit the backend, the
 * metrics file; and first contact: a quiet build (one line per stage) and
 * `make run` in parallel, the progress line's digits, the demo's samples.
 * Runs the built binary (FSDP_BIN, set by the Makefile).
 */
#include <check.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "comm/transport.h"
#include "testutil.h"
#include "train/train.h"

static char buf[1 << 16];

START_TEST(test_usage_errors)
{
    static const fsdp_test_cli_case cases[] = {
        {"", 2, "usage"},
        {"frobnicate", 2, "unknown command"},
        {"train --devices 0", 2, "--devices: 0 is out of range (expected 1..1024)"},
        {"train --devices 1025", 2, "--devices: 1025 is out of range"},
        {"train --shard sideways", 2,
         "--shard: unknown value 'sideways' (expected full, grad-op, none or hybrid)"},
        {"train --precision fp8", 2, "--precision: unknown value 'fp8' (expected fp32 or bf16)"},
        {"train --offload everything", 2,
         "unknown value 'everything' (expected none, optimizer, params or optimizer,params)"},
        {"train --prefetch maybe", 2, "unknown value 'maybe' (expected on or off)"},
        {"train --backend tpu", 2, "--backend: unknown value 'tpu' (expected cpu, cuda or meta)"},
        {"train --comm carrier-pigeon", 2, "expected auto, host, mpi, meta, nccl or peer"},
        {"train --batch many", 2, "bad value 'many'"},
        {"train --batch 0", 2, "--batch: 0 is out of range (expected 1..65536)"},
        {"train --seq 0", 2, "--seq: 0 is out of range"},
        {"train --grad-accum -1", 2, "--grad-accum: -1 is out of range"},
        {"train --steps 0", 2, "--steps: 0 is out of range"},
        {"train --ckpt-every -1", 2, "--ckpt-every: -1 is out of range (expected >= 0)"},
        {"train --device-mem 12 parsecs", 2, "unexpected argument"},
        {"train --device-mem lots", 2, "bad size"},
        {"train --no-such-flag", 2, "unknown option '--no-such-flag'"},
        {"train --steps", 2, "needs a value"},
        {"train --comm", 2, "--comm needs a value (auto|host|mpi|meta|nccl|peer)"},
        {"train --model gpt5", 2, "gpt5"},
        {"train --model tiny --seq 4096", 2, "context"},
        {"train --lr -1", 2, "--lr: -1 is out of range (expected > 0 and <= 10)"},
        {"train --lr inf", 2, "--lr: bad value 'inf' (expected X, a finite number)"},
        {"train --wd nan", 2, "--wd: bad value 'nan'"},
        {"train --resume", 2, "need --ckpt-dir"},
        {"eval --model x.bin --backend meta", 2, "'meta' is not accepted here (expected cpu or cuda)"},
        {"plan --devices 0", 2, "--devices: 0 is out of range"},
    };
    fsdp_test_cli_cases(cases, FSDP_TEST_LEN(cases));
}
END_TEST

/* Issue 15, item 1: `--comm meta` on the cpu backend used to train nothing
 * and exit 0. Every transport that does not fit the backend is now a usage
 * error naming the ones that do. */
START_TEST(test_transport_must_fit_backend)
{
    static const fsdp_test_cli_case cases[] = {
        {"train --comm meta --steps 1", 2,
         "--comm meta does not run on --backend cpu: use --comm host or auto"},
        {"train --backend cpu --comm nccl", 2,
         "--comm nccl does not run on --backend cpu: use --comm host or auto"},
        {"train --comm peer", 2, "--comm peer does not run on --backend cpu"},
        {"train --backend meta --comm host", 2,
         "--comm host does not run on --backend meta: use --comm meta or auto"},
        {"train --ranks-per-device 2", 2,
         "no transport on --backend cpu lets ranks share a device (--ranks-per-device 2); "
         "peer on --backend cuda does"},
        {"train --comm host --ranks-per-device 3", 2,
         "--comm host cannot put 3 ranks on one device: no transport on --backend cpu"},
        {"train --comm meta --backend meta --model tiny --steps 1 --eval 0", 0, "meta: no math"},
        {"train --comm host --model tiny --devices 2 --batch 2 --seq 8 --steps 1 --eval 0", 0,
         "step     1/1"},
    };
    fsdp_test_cli_cases(cases, FSDP_TEST_LEN(cases));
    /* the library refuses the same request, before any step is run */
    fsdp_train_config c;
    fsdp_train_config_default(&c);
    c.eng.backend = FSDP_BACKEND_CPU;
    c.eng.comm = FSDP_COMM_META;
    c.eng.n_ranks = 2;
    c.model = "tiny";
    c.steps = 1;
    c.eval_problems = 0;
    c.out = NULL;
    fsdp_train_result res;
    fsdp_status st = fsdp_train_run(&c, &res);
    ck_assert_int_eq(st, FSDP_STATUS_INVALID_ARG);
    ck_assert_msg(strstr(fsdp_error_msg(), "--comm meta does not run on --backend cpu"), "%s",
                  fsdp_error_msg());
    ck_assert_int_eq(res.steps, 0);
    fsdp_train_result_free(&res);
}
END_TEST

START_TEST(test_help_lists_every_flag)
{
    ck_assert_int_eq(fsdp_test_cli(buf, sizeof buf, "train --help"), 0);
    static const char *const flags[] = {
        "--backend", "--devices", "--model", "--data", "--batch", "--seq", "--grad-accum",
        "--steps", "--lr", "--warmup", "--wd", "--clip", "--shard", "--precision", "--offload",
        "--prefetch", "--comm", "--deterministic", "--device-mem", "--ckpt-dir", "--ckpt-every",
        "--resume", "--log", "--trace", "--seed", "--on-nonfinite", "--allow-batch-change",
        "--tensorboard",
    };
    for (size_t i = 0; i < FSDP_TEST_LEN(flags); i++)
        ck_assert_msg(strstr(buf, flags[i]), "train --help does not document %s", flags[i]);
    ck_assert_int_eq(fsdp_test_cli(buf, sizeof buf, "--help"), 0);
    ck_assert_ptr_nonnull(strstr(buf, "train"));
}
END_TEST

/* Whether the option block that starts at h (its "  --name ..." line) has
 * a value line "<spaces>v  help" before the next option. */
static bool has_value_line(const char *h, const char *v)
{
    size_t n = strlen(v);
    for (const char *l = strchr(h, '\n'); l && strncmp(l, "\n  --", 5); l = strchr(l + 1, '\n')) {
        const char *t = l + 1;
        while (*t == ' ')
            t++;
        if (t - l > 6 && !strncmp(t, v, n) && t[n] == ' ')
            return true;
    }
    return false;
}

/* Every choice option: the values --help lists are exactly the values the
 * parser accepts and the ones its error message lists, each value has its
 * help line, and the default shown is a listed value. Transports and
 * backends are checked against the library's tables too. */
START_TEST(test_help_and_parser_share_tables)
{
    static const char *const opts[] = {"backend", "shard", "precision", "offload", "prefetch",
                                       "comm", "on-nonfinite"};
    static char help[1 << 16], out[1 << 14];
    ck_assert_int_eq(fsdp_test_cli(help, sizeof help, "train --help"), 0);
    for (size_t i = 0; i < FSDP_TEST_LEN(opts); i++) {
        char head[64], values[256];
        snprintf(head, sizeof head, "  --%s ", opts[i]);
        const char *h = strstr(help, head);
        ck_assert_msg(h, "train --help lacks %s", head);
        ck_assert_int_eq(sscanf(h + strlen(head), "%255s", values), 1);
        /* the parser accepts each listed value, and lists the same ones */
        char listed[256] = "";
        int n_values = 0;
        for (char *save, *v = strtok_r(values, "|", &save); v; v = strtok_r(NULL, "|", &save)) {
            int rc = fsdp_test_cli(out, sizeof out, "train --%s %s --help", opts[i], v);
            ck_assert_msg(rc == 0, "--%s %s (listed in --help) is refused:\n%s", opts[i], v, out);
            ck_assert_msg(!strcmp(opts[i], "prefetch") || has_value_line(h, v),
                          "--%s: value '%s' has no help line", opts[i], v);
            size_t len = strlen(listed);
            snprintf(listed + len, sizeof listed - len, "%s%s", n_values ? "," : "", v);
            n_values++;
        }
        ck_assert_int_eq(fsdp_test_cli(out, sizeof out, "train --%s bogus", opts[i]), 2);
        ck_assert_msg(strstr(out, "expected"), "--%s bogus: %s", opts[i], out);
        for (char *save, *v = strtok_r(listed, ",", &save); v; v = strtok_r(NULL, ",", &save)) {
            char want[64];
            snprintf(want, sizeof want, "%s", v);
            ck_assert_msg(strstr(strstr(out, "expected"), want), "--%s bogus: %s lacks '%s'",
                          opts[i], out, want);
        }
        /* the default shown is one of the values */
        const char *eol = strchr(h, '\n');
        const char *def = strstr(h, "(default ");
        ck_assert_msg(def && def < eol, "--%s shows no default", opts[i]);
    }
    /* the --shard values are the engine's strategies, each spelled as the
     * engine spells it (one table, beside the enum in engine/shardmap.h) */
    const char *h = strstr(help, "  --shard ");
    char values[128];
    ck_assert_int_eq(sscanf(h + strlen("  --shard "), "%127s", values), 1);
    int n_strategies = 0;
    for (char *save, *v = strtok_r(values, "|", &save); v; v = strtok_r(NULL, "|", &save)) {
        fsdp_shard_strategy st;
        ck_assert_msg(fsdp_shard_strategy_parse(v, &st) == FSDP_STATUS_OK, "--shard %s: %s", v,
                      fsdp_error_msg());
        ck_assert_str_eq(fsdp_shard_strategy_name(st), v);
        n_strategies++;
    }
    ck_assert_int_eq(n_strategies, FSDP_SHARD_COUNT);
    /* the transport values are the library's table, in its order */
    char want[128];
    snprintf(want, sizeof want, "--comm %s ",
             fsdp_names_join(&fsdp_comm_kind_names, 0, "|", "|", (char[96]){0}, 96));
    ck_assert_msg(strstr(help, want), "train --help lacks '%s'", want);
    snprintf(want, sizeof want, "--backend %s ",
             fsdp_names_join(&fsdp_backend_names, 0, "|", "|", (char[96]){0}, 96));
    ck_assert_msg(strstr(help, want), "train --help lacks '%s'", want);
}
END_TEST

START_TEST(test_oom_exit_1)
{
    int rc = fsdp_test_cli(buf, sizeof buf,
                           "train --model small --device-mem 2MiB --steps 1 --eval 0");
    ck_assert_msg(rc == 1, "exit %d:\n%.600s", rc, buf);
    ck_assert_ptr_nonnull(strstr(buf, "out of memory"));
    ck_assert_ptr_nonnull(strstr(buf, "cap 2.00 MiB"));
}
END_TEST

START_TEST(test_train_writes_metrics)
{
    char path[512];
    fsdp_test_path(path, sizeof path, "metrics.jsonl");
    int rc = fsdp_test_cli(buf, sizeof buf,
                           "train --model tiny --devices 2 --batch 2 --seq 16 --steps 3 --eval 8 "
                           "--log %s", path);
    ck_assert_msg(rc == 0, "exit %d:\n%.600s", rc, buf);
    ck_assert_ptr_nonnull(strstr(buf, "step     3/3"));
    ck_assert_ptr_nonnull(strstr(buf, "held-out accuracy"));
    char *text = fsdp_test_read_file(path, NULL);
    static const char *const keys[] = {"\"step\":", "\"loss\":", "\"lr\":", "\"grad_norm\":",
                                       "\"tokens\":", "\"tokens_per_s\":", "\"step_ms\":",
                                       "\"mfu\":", "\"peak_bytes\":[", "\"comm_bytes\":["};
    int n = 0;
    for (char *save, *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        n++;
        size_t len = strlen(line);
        ck_assert(line[0] == '{' && line[len - 1] == '}');
        for (size_t k = 0; k < FSDP_TEST_LEN(keys); k++)
            ck_assert_msg(strstr(line, keys[k]), "metrics line %d lacks %s: %s", n, keys[k], line);
        int step = 0;
        ck_assert_int_eq(sscanf(strstr(line, "\"step\":"), "\"step\":%d", &step), 1);
        ck_assert_int_eq(step, n);
    }
    free(text);
    ck_assert_int_eq(n, 3);
}
END_TEST

START_TEST(test_bad_data_file)
{
    int rc = fsdp_test_cli(buf, sizeof buf,
                           "train --model tiny --data '/nonexistent/shard_*.bin' --steps 1");
    ck_assert_msg(rc == 1 || rc == 2, "exit %d", rc);
    ck_assert_ptr_nonnull(strstr(buf, "/nonexistent/shard_*.bin"));
}
END_TEST

/* ---- first contact ------------------------------------------------------------- */

/* make in the repository, as if typed (none of the calling make's settings) */
#define MAKE_CMD                                                                  \
    "env -u MAKEFLAGS -u MAKELEVEL -u MFLAGS make --no-print-directory INSTALL_DEPS=0 " \
    "CUDA=0"

/* A build prints a line per stage, not the compiler's command lines (V=1
 * does); `make run` builds with a job per core, unless -j is given. */
START_TEST(test_make_is_quiet)
{
    char dir[512];
    fsdp_test_mkdir(dir, sizeof dir, "build");
    int rc = fsdp_test_sh(buf, sizeof buf, MAKE_CMD " BUILD=%s %s/obj/src/core/crc32c.o", dir, dir);
    if (rc == 127) {
        printf("SKIP: %s: no make here\n", __func__);
        return;
    }
    ck_assert_msg(rc == 0, "make: exit %d:\n%s", rc, buf);
    ck_assert_msg(!strncmp(buf, "  CC ", 5) && strchr(buf, '\n') == buf + strlen(buf) - 1 &&
                      strstr(buf, "V=1"),
                  "a quiet build prints one line for the stage:\n%s", buf);
    rc = fsdp_test_sh(buf, sizeof buf, MAKE_CMD " BUILD=%s V=1 %s/obj/src/core/names.o", dir, dir);
    ck_assert_msg(rc == 0 && strstr(buf, "-c src/core/names.c -o"), "V=1:\n%s", buf);
    /* the flags make runs the goal with: -j<cores> for run only, the user's -j first */
    rc = fsdp_test_sh(buf, sizeof buf, MAKE_CMD " BUILD=%s -pn run | grep '^MAKEFLAGS = '", dir);
    ck_assert_msg(rc == 0 && strstr(buf, " -j"), "make run: %s", buf);
    rc = fsdp_test_sh(buf, sizeof buf, MAKE_CMD " BUILD=%s -j1 -pn run | grep '^MAKEFLAGS = '", dir);
    ck_assert_msg(rc == 0 && strstr(buf, " -j1 ") , "make -j1 run: %s", buf);
    rc = fsdp_test_sh(buf, sizeof buf, MAKE_CMD " BUILD=%s -pn all | grep '^MAKEFLAGS = '", dir);
    ck_assert_msg(rc == 0 && !strstr(buf, "-j"), "make: %s", buf);
}
END_TEST

/* The progress line prints a loss with 6 significant digits however small
 * it gets (it used to print 6 decimals: 0.001626 for 0.00162578, and
 * 0.000000 for 4e-7): against the metrics file's 9. */
START_TEST(test_step_line_digits)
{
    char data[512], log[512];
    fsdp_test_path(data, sizeof data, "a.txt");
    fsdp_test_path(log, sizeof log, "m.jsonl");
    char *text = malloc(4001);
    ck_assert_ptr_nonnull(text);
    memset(text, 'a', 4000); /* the next byte is always 'a': the loss falls fast */
    text[4000] = '\0';
    fsdp_test_write_file(data, text);
    free(text);
    int rc = fsdp_test_cli(buf, sizeof buf, "train --model tiny --data %s --devices 1 --batch 4 "
                           "--seq 16 --steps 30 --lr 1e-2 --warmup 2 --eval 0 --log %s", data, log);
    ck_assert_msg(rc == 0, "exit %d:\n%s", rc, buf);
    char *metrics = fsdp_test_read_file(log, NULL);
    const char *line = buf, *m = metrics;
    int n = 0;
    double last = 1;
    while ((line = strstr(line, "| loss ")) && (m = strstr(m, "\"loss\":"))) {
        double shown = strtod(line + 7, NULL), logged = strtod(m + 7, NULL);
        ck_assert_msg(fabs(shown - logged) <= 1e-5 * fabs(logged),
                      "step %d: the line says loss %.9g, the log %.9g", n + 1, shown, logged);
        last = logged;
        line++, m++, n++;
    }
    free(metrics);
    ck_assert_int_eq(n, 30);
    ck_assert_msg(last < 0.01, "the loss ended at %g: the test needs small losses", last);
}
END_TEST

/* The demo's samples say that answers are written reversed. */
START_TEST(test_demo_samples_say_reversed)
{
    int rc = fsdp_test_cli(buf, sizeof buf, "train --model tiny --devices 1 --batch 4 --steps 2 "
                           "--eval 8");
    ck_assert_msg(rc == 0, "exit %d:\n%s", rc, buf);
    int n = 0;
    for (const char *l = buf; (l = strstr(l, "  sample: ")); l++, n++) {
        char want[16], plain[16];
        const char *e = strstr(l, " expected ");
        ck_assert_msg(e && sscanf(e, " expected %15s (%15s reversed)", want, plain) == 2,
                      "%.80s", l);
        size_t k = strlen(want);
        ck_assert_uint_eq(strlen(plain), k);
        for (size_t i = 0; i < k; i++)
            ck_assert_msg(plain[i] == want[k - 1 - i], "%.80s", l);
    }
    ck_assert_msg(n == 5, "%d sample lines:\n%s", n, buf);
}
END_TEST

/* A command whose arguments hold the test's scratch paths, and what it must
 * do: exit rc and print every non-NULL expect. */
typedef struct built_case {
    char args[768];
    int rc;
    const char *expect[3];
} built_case;

/* Append a case to cases[*n] (the array must have room: asserted). */
static void __attribute__((format(printf, 8, 9)))
built(built_case *cases, int *n, int cap, int rc, const char *e0, const char *e1, const char *e2,
      const char *fmt, ...)
{
    ck_assert_int_lt(*n, cap);
    built_case *c = &cases[(*n)++];
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(c->args, sizeof c->args, fmt, ap);
    va_end(ap);
    ck_assert_msg(k > 0 && (size_t)k < sizeof c->args, "command too long: %s", fmt);
    c->rc = rc;
    c->expect[0] = e0;
    c->expect[1] = e1;
    c->expect[2] = e2;
}

static void run_built(const built_case *cases, int n)
{
    static char out[1 << 14];
    for (int i = 0; i < n; i++) {
        int rc = fsdp_test_cli(out, sizeof out, "%s", cases[i].args);
        REQUIRE(rc == cases[i].rc, "'%s': exit %d, expected %d:\n%s", cases[i].args, rc,
                cases[i].rc, out);
        for (int k = 0; k < 3; k++)
            REQUIRE(!cases[i].expect[k] || strstr(out, cases[i].expect[k]),
                    "'%s': the message lacks '%s':\n%s", cases[i].args, cases[i].expect[k], out);
    }
}

/* Issue 29, 2: outputs were not checked against inputs, and each of these
 * exited 0 after overwriting an input. Every command now refuses (exit 2)
 * an output that names a file an input names (the same file however it is
 * spelled: ./x, a symlink, a hard link; a file of a glob or of a model
 * directory) or another output names, naming both flags, and leaves the
 * input as it was. */
START_TEST(test_outputs_spare_inputs)
{
    char dir[128], data[160], model[160], hf[160], hf2[160], link[160], hard[160], sub[160];
    fsdp_test_mkdir(dir, sizeof dir, "outputs");
    pathf(data, sizeof data, "%s/d.jsonl", dir);
    pathf(model, sizeof model, "%s/m.bin", dir);
    pathf(hf, sizeof hf, "%s/hf", dir);
    pathf(hf2, sizeof hf2, "%s/hf2", dir);
    pathf(link, sizeof link, "%s/link.jsonl", dir);
    pathf(hard, sizeof hard, "%s/hard.bin", dir);
    pathf(sub, sizeof sub, "%s/sub", dir);
    fsdp_test_write_file(data, "{\"text\": \"hello world\"}\n");
    char cmd[1024];
    pathf(cmd, sizeof cmd, "cp tests/fixtures/tiny_gpt2.bin %s && cp -r tests/fixtures/hf_gpt2 "
          "%s && cp -r tests/fixtures/hf_gpt2 %s && ln -s d.jsonl %s && ln %s %s && mkdir %s && "
          "cp %s %s/o_000000.bin", model, hf, hf2, link, model, hard, sub, data, dir);
    ck_assert_int_eq(system(cmd), 0);
    size_t n_data, n_model, n_st;
    char *data0 = fsdp_test_read_file(data, &n_data);
    char *model0 = fsdp_test_read_file(model, &n_model);
    char st_path[192];
    pathf(st_path, sizeof st_path, "%s/model.safetensors", hf);
    char *st0 = fsdp_test_read_file(st_path, &n_st);
    const char *tok = "tests/fixtures/tok_gpt2.json";
    const char *run = "--devices 1 --batch 1 --seq 8 --steps 1 --eval 0";
    built_case cases[16];
    int n = 0;
#define CASE(e0, e1, e2, ...) built(cases, &n, 16, 2, e0, e1, e2, __VA_ARGS__)
    CASE("OUT", "is the file that IN reads", NULL, "tokenize %s %s --tokenizer %s", data, data,
         tok);
    CASE("OUT", "--tokenizer", NULL, "tokenize %s %s --tokenizer %s", data, tok, tok);
    CASE("OUT", "IN", NULL, "tokenize %s %s --tokenizer %s", data, link, tok);
    CASE("OUT", "IN", NULL, "tokenize %s/o_000000.bin %s/o.bin --format jsonl --tokenizer %s "
         "--shard-tokens 1", dir, dir, tok); /* IN has the name of OUT's first shard */
    CASE("--logits", "--model", NULL, "sample --model %s --logits %s --ids --prompt 1 --tokens 1",
         model, model);
    CASE("--logits", "--model", st_path, "sample --model %s --logits %s --ids --prompt 1",
         hf, st_path);
    CASE("--log", "--data", NULL, "train --model tiny --data %s --tokenizer %s --log %s %s", data,
         tok, data, run);
    CASE("--log", "--data", NULL, "train --model tiny --data '%s/*.jsonl' --tokenizer %s --log %s "
         "%s", dir, tok, link, run);
    CASE("--log", "--model", NULL, "train --model %s --log %s %s", model, hard, run);
    CASE("--trace", "--model", NULL, "train --model %s --trace %s/./m.bin %s", model, dir, run);
    CASE("--log", "--trace", NULL, "train --model tiny --log %s/t.json --trace %s/sub/../t.json "
         "%s", dir, dir, run);
    CASE("--trace", "--model", NULL, "plan --model %s --trace %s --seq 8", model, model);
    CASE("OUT", "IN", NULL, "convert %s %s --to hf", hf, hf);
    CASE("OUT", "IN", NULL, "convert %s %s", st_path, st_path);
    CASE("not empty", "golden.safetensors", NULL, "convert %s %s --to ckpt", hf, hf2);
#undef CASE
    run_built(cases, n);
    static char out[1 << 14];
    size_t k;
    char *now = fsdp_test_read_file(data, &k);
    ck_assert(k == n_data && !memcmp(now, data0, k));
    free(now);
    now = fsdp_test_read_file(model, &k);
    ck_assert(k == n_model && !memcmp(now, model0, k));
    free(now);
    now = fsdp_test_read_file(st_path, &k);
    ck_assert(k == n_st && !memcmp(now, st0, k));
    free(now);
    pathf(cmd, sizeof cmd, "test ! -e %s/LOCK && test -z \"$(ls -d %s/step_* 2>/dev/null)\" && "
          "test ! -e %s/t.json && test -z \"$(ls %s/o_000001.bin 2>/dev/null)\"", hf2, hf2, dir,
          dir);
    REQUIRE(system(cmd) == 0, "a refused command wrote something: %s", cmd);
    free(data0);
    free(model0);
    free(st0);
    /* and paths that differ are fine */
    int rc = fsdp_test_cli(out, sizeof out, "tokenize %s %s/o.bin --tokenizer %s --quiet", data,
                           dir, tok);
    ck_assert_msg(rc == 0, "%s", out);
}
END_TEST

/* Issue 29, 9: the smaller ones, each as the red team found it. */
START_TEST(test_smaller_ones)
{
    char dir[128], nan_bin[160], long_bin[160], hfd[160], hfn[160], rows[160];
    fsdp_test_mkdir(dir, sizeof dir, "small");
    pathf(nan_bin, sizeof nan_bin, "%s/nan.bin", dir);
    pathf(long_bin, sizeof long_bin, "%s/long.bin", dir);
    pathf(hfd, sizeof hfd, "%s/hfd", dir);
    pathf(hfn, sizeof hfn, "%s/hfn", dir);
    pathf(rows, sizeof rows, "%s/r.jsonl", dir);
    /* NaN weights (the first 64 parameters, past the 1 KiB header); 4 bytes too many; a
     * model.safetensors that is a directory; a config.json whose model_type holds \u0000;
     * a chat role that does */
    char cmd[2048];
    pathf(cmd, sizeof cmd,
          "cp tests/fixtures/tiny_gpt2.bin %s && printf '\\377\\377\\377\\177%%.0s' $(seq 64) | "
          "dd of=%s bs=1 seek=1024 conv=notrunc 2>/dev/null && cp tests/fixtures/tiny_gpt2.bin "
          "%s && printf abcd >> %s && mkdir -p %s/model.safetensors && cp "
          "tests/fixtures/hf_gpt2/config.json %s && cp -r tests/fixtures/llama_qwen2 %s && "
          "cp tests/fixtures/tok_qwen2.json %s/tokenizer.json && sed -i "
          "'s/\"model_type\": *\"qwen2\"/\"model_type\": \"qwen2\\\\u0000x\"/' %s/config.json",
          nan_bin, nan_bin, long_bin, long_bin, hfd, hfd, hfn, hfn, hfn);
    ck_assert_int_eq(system(cmd), 0);
    fsdp_test_write_file(rows, "{\"messages\": [{\"role\": \"user\\u0000x\", \"content\": "
                               "\"a\"}, {\"role\": \"assistant\", \"content\": \"b\"}]}\n");
    char *cfg = fsdp_test_read_file(strcat(strcpy((char[192]){0}, hfn), "/config.json"), NULL);
    REQUIRE(strstr(cfg, "qwen2\\u0000x"), "the edit did not take: %s", cfg);
    free(cfg);
    built_case cases[16];
    int n = 0;
#define CASE(r, e, ...) built(cases, &n, 16, r, e, NULL, NULL, __VA_ARGS__)
    CASE(1, "logit 0 is NaN", "sample --model %s --ids --prompt 1 --tokens 2", nan_bin);
    CASE(2, "--gpu-tflops: 0 is out of range", "plan --fit --gpu-tflops 0 --device-mem 1GiB");
    CASE(2, "--gpu-tflops: -0 is out of range", "plan --fit --gpu-tflops -0 --device-mem 1GiB");
    CASE(2, "--devices: 0 is out of range", "eval --model %s --data synthetic --devices 0",
         long_bin);
    CASE(2, "--devices: 0 is out of range", "sample --model %s --devices 0", long_bin);
    CASE(0, "final loss", "train --model tiny --lr 10 --wd 0.1 --steps 1 --devices 1 --batch 1 "
         "--eval 0 --quiet"); /* 10 x 0.1 is 1 */
    CASE(2, "keep lr x wd <= 1", "train --lr 10 --wd 0.11 --steps 1");
    CASE(1, "4 more than its header", "sample --model %s --ids --prompt 1", long_bin);
    CASE(1, "model.safetensors is a directory", "sample --model %s --ids --prompt 1", hfd);
    CASE(1, "\"model_type\" string (it holds \\u0000)", "sample --model %s --ids --prompt 1",
         hfn);
    CASE(1, "\"role\" holds \\u0000", "tokenize %s %s/r.bin --tokenizer "
         "tests/fixtures/tok_llama3.json", rows, dir);
    CASE(2, "with --ids, --prompt must be token ids", "sample --model "
         "tests/fixtures/llama_qwen2 --ids --prompt -1");
    CASE(1, "logits file '/dev/full' is a character device", "sample --model "
         "tests/fixtures/tiny_gpt2.bin --ids --prompt 1 --tokens 1 --logits /dev/full");
#undef CASE
    run_built(cases, n);
    static char out[1 << 14];
    /* --logits on a full disk says why */
    int rc = fsdp_test_sh(out, sizeof out, "trap '' XFSZ; ulimit -f 1; exec %s sample --model "
                          "tests/fixtures/tiny_gpt2.bin --ids --prompt 1 --tokens 8 --logits "
                          "%s/l.bin", FSDP_BIN, dir);
    REQUIRE(rc == 1 && strstr(out, "disk full"), "exit %d: %s", rc, out);
}
END_TEST

int main(void)
{
    const fsdp_test_tcase tcases[] = {
        {"cli", 300, .tmpdir = true,
         FSDP_TESTS(test_usage_errors, test_transport_must_fit_backend, test_help_lists_every_flag,
                    test_help_and_parser_share_tables, test_oom_exit_1, test_train_writes_metrics,
                    test_bad_data_file)},
        {"first_contact", 300, .tmpdir = true,
         FSDP_TESTS(test_make_is_quiet, test_step_line_digits, test_demo_samples_say_reversed)},
        {"outputs", 120, .tmpdir = true, FSDP_TESTS(test_outputs_spare_inputs)},
        {"small", 120, .tmpdir = true, FSDP_TESTS(test_smaller_ones)},
    };
    return fsdp_test_main("cli", tcases, FSDP_TEST_LEN(tcases));
}
