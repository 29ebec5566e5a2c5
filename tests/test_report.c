/*
 * test_report.c - looking at a run: TensorBoard event files (CRC-32C test
 * vectors; TFRecord framing and Event encoding against records written by
 * tensorboard's own RecordWriter; the writer; a trainer run and its resume
 * through the sink, read back here and, when the tensorboard package is
 * installed, by TensorBoard's EventAccumulator through
 * tools/check_tensorboard.py), and `fsdp plot`'s panels, log scale and
 * resume marks.
 *
 * The earlier plot tests (a real run's chart, bad inputs, the command's
 * exit codes) are in test_plan; hostile metrics files in test_hostile.
 */
#include <check.h>
#include <dirent.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/crc32c.h"
#include "file_util.h"
#include "report/plot.h"
#include "report/tensorboard.h"
#include "testutil.h"
#include "train_util.h"

/* ---- CRC-32C ------------------------------------------------------------------ */

START_TEST(test_crc32c_vectors)
{
    /* the check value of the CRC catalogue, and RFC 3720 (iSCSI) B.4 */
    ck_assert_uint_eq(fsdp_crc32c(0, "123456789", 9), 0xE3069283u);
    unsigned char b[32];
    memset(b, 0, sizeof b);
    ck_assert_uint_eq(fsdp_crc32c(0, b, sizeof b), 0x8A9136AAu);
    memset(b, 0xff, sizeof b);
    ck_assert_uint_eq(fsdp_crc32c(0, b, sizeof b), 0x62A8AB43u);
    for (int i = 0; i < 32; i++)
        b[i] = (unsigned char)i;
    ck_assert_uint_eq(fsdp_crc32c(0, b, sizeof b), 0x46DD794Eu);
    for (int i = 0; i < 32; i++)
        b[i] = (unsigned char)(31 - i);
    ck_assert_uint_eq(fsdp_crc32c(0, b, sizeof b), 0x113FDB5Cu);
    /* continued over pieces: the same */
    ck_assert_uint_eq(fsdp_crc32c(fsdp_crc32c(0, "1234", 4), "56789", 5), 0xE3069283u);
    ck_assert_uint_eq(fsdp_crc32c(0, NULL, 0), 0u);
    /* TensorFlow's mask */
    ck_assert_uint_eq(fsdp_crc32c_mask(0), 0xa282ead8u);
    ck_assert_uint_eq(fsdp_crc32c_mask(0xE3069283u), ((0xE3069283u >> 15) | (0xE3069283u << 17)) +
                                                         0xa282ead8u);
}
END_TEST

/* ---- Event encoding and TFRecord framing --------------------------------------- */

/* Records written by tensorboard's RecordWriter from event_pb2.Event
 * (tools/check_tensorboard.py --golden prints them). */
static const struct golden {
    const char *what;
    const char *bytes;
    size_t n;
} goldens[] = {
    {"file_version, wall_time 1.5",
     "\x18\x00\x00\x00\x00\x00\x00\x00\xa3\x7f\x4b\x22\x09\x00\x00\x00\x00\x00\x00\xf8\x3f\x1a"
     "\x0d\x62\x72\x61\x69\x6e\x2e\x45\x76\x65\x6e\x74\x3a\x32\x2a\x28\x64\x6c",
     40},
    {"SessionLog START at step 301, wall_time 1.5",
     "\x10\x00\x00\x00\x00\x00\x00\x00\x95\xfb\xfe\x18\x09\x00\x00\x00\x00\x00\x00\xf8\x3f\x10"
     "\xad\x02\x3a\x02\x08\x01\xd1\x79\x49\xd4",
     32},
    {"step 7, wall_time 1700000000.25: train/loss 2.25, memory/peak_bytes/device_0 841424",
     "\x43\x00\x00\x00\x00\x00\x00\x00\xb1\x85\x25\xa0\x09\x00\x00\x10\x40\xfc\x54\xd9\x41\x10"
     "\x07\x2a\x36\x0a\x11\x0a\x0a\x74\x72\x61\x69\x6e\x2f\x6c\x6f\x73\x73\x15\x00\x00\x10\x40"
     "\x0a\x21\x0a\x1a\x6d\x65\x6d\x6f\x72\x79\x2f\x70\x65\x61\x6b\x5f\x62\x79\x74\x65\x73\x2f"
     "\x64\x65\x76\x69\x63\x65\x5f\x30\x15\x00\x6d\x4d\x49\xa4\xda\x6b\x28",
     83},
};

/* The record of the event in b: header, data, footer. */
static size_t frame(const fsdp_sbuf *b, unsigned char *out)
{
    unsigned char head[12], foot[4];
    fsdp_tfrecord_frame(b->p, b->n, head, foot);
    memcpy(out, head, 12);
    memcpy(out + 12, b->p, b->n);
    memcpy(out + 12 + b->n, foot, 4);
    return 12 + b->n + 4;
}

START_TEST(test_event_encoding)
{
    unsigned char rec[256];
    for (int k = 0; k < 3; k++) {
        fsdp_sbuf b = {0};
        if (k == 0)
            fsdp_tboard_event_version(&b, 1.5);
        else if (k == 1)
            fsdp_tboard_event_start(&b, 1.5, 301);
        else
            fsdp_tboard_event_scalars(&b, 1700000000.25, 7,
                                      (const fsdp_tboard_scalar[]){
                                          {"train/loss", 2.25f},
                                          {"memory/peak_bytes/device_0", 841424.0f}},
                                      2);
        ck_assert(!b.oom);
        size_t n = frame(&b, rec);
        ck_assert_msg(n == goldens[k].n && !memcmp(rec, goldens[k].bytes, n),
                      "%s: %zu bytes, not tensorboard's %zu", goldens[k].what, n, goldens[k].n);
        free(b.p);
    }
    /* a step past 2^31 and many values: varints of several bytes */
    fsdp_sbuf b = {0};
    fsdp_tboard_scalar v[40];
    for (int i = 0; i < 40; i++)
        v[i] = (fsdp_tboard_scalar){"memory/peak_bytes/device_12", (float)i};
    fsdp_tboard_event_scalars(&b, 2.0, (int64_t)1 << 40, v, 40);
    /* wall_time (9) + step key and 6-byte varint (7) + summary key and 2-byte length (3) +
     * 40 values of 2 + (2 + 27) + 5 */
    ck_assert_uint_eq(b.n, 9 + 7 + 3 + 40 * (2 + 29 + 5));
    ck_assert_uint_eq((unsigned char)b.p[9], 0x10);                 /* step, varint */
    ck_assert_uint_eq((unsigned char)b.p[15], (1ull << 40) >> 35);  /* its last 7 bits */
    free(b.p);
}
END_TEST

/* ---- reading event files back --------------------------------------------------- */

/* An event file's records checked one by one (length, both CRCs, nothing
 * left over); returns how many. The data of record k goes to data[k]
 * (when not NULL, up to 4 records, 512 bytes each) with its size in n[k]. */
static int check_records(const char *path, unsigned char (*data)[512], size_t *n)
{
    size_t len;
    unsigned char *f = (unsigned char *)fsdp_test_read_file(path, &len);
    int count = 0;
    size_t at = 0;
    while (at < len) {
        REQUIRE(len - at >= 16, "%s: a record cut short at byte %zu", path, at);
        uint64_t dl = 0;
        for (int i = 0; i < 8; i++)
            dl |= (uint64_t)f[at + i] << (8 * i);
        REQUIRE(dl <= len - at - 16, "%s: record %d claims %llu bytes", path, count,
                (unsigned long long)dl);
        unsigned char head[12], foot[4];
        fsdp_tfrecord_frame(f + at + 12, dl, head, foot);
        REQUIRE(!memcmp(head, f + at, 12), "%s: record %d: bad length CRC", path, count);
        REQUIRE(!memcmp(foot, f + at + 12 + dl, 4), "%s: record %d: bad data CRC", path, count);
        if (data && count < 4 && dl <= 512) {
            memcpy(data[count], f + at + 12, dl);
            n[count] = dl;
        }
        at += 16 + dl;
        count++;
    }
    free(f);
    return count;
}

static int by_name(const void *a, const void *b)
{
    return strcmp(a, b);
}

/* The event files in dir, sorted by name (as TensorBoard reads them), into
 * names[0..max); returns how many there are. */
static int event_files(const char *dir, char names[][512], int max)
{
    DIR *d = opendir(dir);
    ck_assert_msg(d != NULL, "cannot open %s", dir);
    int k = 0;
    for (struct dirent *e; (e = readdir(d));)
        if (!strncmp(e->d_name, "events.out.tfevents.", 20)) {
            ck_assert_int_lt(k, max);
            pathf(names[k++], 512, "%s/%s", dir, e->d_name);
        }
    closedir(d);
    qsort(names, (size_t)k, 512, by_name);
    return k;
}

START_TEST(test_writer)
{
    char dir[512], names[4][512];
    fsdp_test_path(dir, sizeof dir, "tb/run"); /* parents are created */
    fsdp_tboard *tb;
    fsdp_status st = fsdp_tboard_open(&tb, dir, 1);
    ck_assert_msg(st == FSDP_STATUS_OK, "%s", fsdp_error_msg());
    const char *p = fsdp_tboard_path(tb);
    char host[256] = "";
    gethostname(host, sizeof host - 1);
    ck_assert_msg(strstr(p, "/events.out.tfevents.") && strstr(p, host), "%s", p);
    fsdp_tboard_scalar v = {"train/loss", 3.5f};
    ck_assert_int_eq(fsdp_tboard_write(tb, 1, &v, 1), FSDP_STATUS_OK);
    v.value = 3.25f;
    ck_assert_int_eq(fsdp_tboard_write(tb, 2, &v, 1), FSDP_STATUS_OK);
    /* a second writer in the same directory at once: another file, named after it */
    fsdp_tboard *tb2;
    ck_assert_int_eq(fsdp_tboard_open(&tb2, dir, 3), FSDP_STATUS_OK);
    ck_assert_str_ne(fsdp_tboard_path(tb2), p);
    ck_assert_int_eq(fsdp_tboard_close(tb2), FSDP_STATUS_OK);
    ck_assert_int_eq(fsdp_tboard_close(tb), FSDP_STATUS_OK);
    ck_assert_int_eq(fsdp_tboard_close(NULL), FSDP_STATUS_OK);
    ck_assert_int_eq(event_files(dir, names, 4), 2);
    unsigned char data[4][512];
    size_t n[4];
    /* the first file: version, START at 1, two steps */
    ck_assert_int_eq(check_records(names[0], data, n), 4);
    fsdp_sbuf b = {0};
    fsdp_tboard_event_version(&b, 0);
    ck_assert(n[0] == b.n && !memcmp(data[0] + 9, b.p + 9, b.n - 9)); /* all but wall_time */
    b.n = 0;
    fsdp_tboard_event_start(&b, 0, 1);
    ck_assert(n[1] == b.n && !memcmp(data[1] + 9, b.p + 9, b.n - 9));
    b.n = 0;
    fsdp_tboard_event_scalars(&b, 0, 2, &v, 1);
    ck_assert(n[3] == b.n && !memcmp(data[3] + 9, b.p + 9, b.n - 9));
    free(b.p);
    ck_assert_int_eq(check_records(names[1], NULL, NULL), 2);

    /* a directory that cannot be: a file in the way */
    char file[512], under[600];
    fsdp_test_path(file, sizeof file, "plain");
    fsdp_test_write_file(file, "x");
    pathf(under, sizeof under, "%s/tb", file);
    st = fsdp_tboard_open(&tb, under, 1);
    ck_assert_int_eq(st, FSDP_STATUS_IO);
    ck_assert_msg(strstr(fsdp_error_msg(), "--tensorboard") && strstr(fsdp_error_msg(), under),
                  "%s", fsdp_error_msg());
    ck_assert_ptr_null(tb);
}
END_TEST

/* ---- the trainer's sink ----------------------------------------------------------- */

/* tiny on 2 devices, 8 steps, checkpoints every 3, --log and --tensorboard
 * into dir; the first run stops after step 5 as a crash would (its last
 * checkpoint: step 3), the second resumes. */
static void crash_and_resume(const char *dir, char *log, size_t n_log, char *tbdir, size_t n_tb)
{
    char ck[512];
    pathf(log, n_log, "%s/m.jsonl", dir);
    pathf(tbdir, n_tb, "%s/tb", dir);
    pathf(ck, sizeof ck, "%s/ck", dir);
    fsdp_train_config c;
    train_config_cpu(&c, "tiny", 2);
    c.eng.batch = 2;
    c.steps = 8;
    c.warmup = 2;
    c.log_path = log;
    c.ckpt_dir = ck;
    c.ckpt_every = 3;
    c.stop_after = 5;
    fsdp_tboard_sink tb;
    fsdp_tboard_sink_init(&tb, tbdir);
    c.sink = &tb.sink;
    fsdp_train_result r;
    run_ok(&c, &r);
    ck_assert_int_eq(r.steps, 5);
    fsdp_train_result_free(&r);
    ck_assert_ptr_null(tb.tb); /* closed */
    c.stop_after = 0;
    c.resume = true;
    run_ok(&c, &r);
    ck_assert_int_eq(r.first_step, 3);
    ck_assert_int_eq(r.steps, 8);
    fsdp_train_result_free(&r);
}

START_TEST(test_train_resume_files)
{
    char dir[512], log[600], tbdir[600], names[4][512];
    fsdp_test_mkdir(dir, sizeof dir, "run");
    crash_and_resume(dir, log, sizeof log, tbdir, sizeof tbdir);
    /* the log: 5 lines, then the resumed run's 5 from step 4, its first saying so */
    char *text = fsdp_test_read_file(log, NULL);
    char *resumed = strstr(text, "\"resumed_from\":3");
    ck_assert_msg(resumed && !strstr(resumed + 5, "resumed_from"), "%s", text);
    char *line = resumed;
    while (line > text && line[-1] != '\n')
        line--;
    ck_assert_msg(!strncmp(line, "{\"step\":4,", 10) && line - text > 0, "%s", text);
    free(text);
    /* one file per run, each: version, START (1, then 4), a record per step */
    ck_assert_int_eq(event_files(tbdir, names, 4), 2);
    unsigned char data[4][512];
    size_t n[4];
    ck_assert_int_eq(check_records(names[0], data, n), 2 + 5);
    fsdp_sbuf b = {0};
    fsdp_tboard_event_start(&b, 0, 1);
    ck_assert(n[1] == b.n && !memcmp(data[1] + 9, b.p + 9, b.n - 9));
    ck_assert_int_eq(check_records(names[1], data, n), 2 + 5);
    b.n = 0;
    fsdp_tboard_event_start(&b, 0, 4);
    ck_assert(n[1] == b.n && !memcmp(data[1] + 9, b.p + 9, b.n - 9));
    free(b.p);
}
END_TEST

/* TensorBoard's own reader agrees with the log (tools/check_tensorboard.py);
 * skipped without python3 and the tensorboard package. */
START_TEST(test_train_tensorboard_reader)
{
    char dir[512], log[600], tbdir[600], cmd[2048], out[8192];
    fsdp_test_mkdir(dir, sizeof dir, "run");
    crash_and_resume(dir, log, sizeof log, tbdir, sizeof tbdir);
    pathf(cmd, sizeof cmd, "python3 tools/check_tensorboard.py '%s' '%s' 2>&1", tbdir, log);
    FILE *p = popen(cmd, "r");
    ck_assert_ptr_nonnull(p);
    size_t k = fread(out, 1, sizeof out - 1, p);
    out[k] = '\0';
    int status = pclose(p);
    int rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    if (rc == 77 || rc == 127) {
        printf("SKIP: %s: no python3 with the tensorboard package (pip install tensorboard)\n",
               __func__);
        return;
    }
    ck_assert_msg(rc == 0, "check_tensorboard.py exit %d:\n%s", rc, out);
    ck_assert_msg(strstr(out, "steps 1..8"), "%s", out);
}
END_TEST

/* Run c (in a child with a file size limit): it stops with the event
 * file's write error after a few steps. */
static bool run_stops_on_write_error(void *arg)
{
    const fsdp_train_config *c = arg;
    fsdp_train_result r;
    fsdp_status st = fsdp_train_run(c, &r);
    const char *msg = fsdp_error_msg();
    bool ok = st == FSDP_STATUS_IO && strstr(msg, "TensorBoard event file") &&
              strstr(msg, "File too large") && r.steps > 2 && r.steps < c->steps;
    if (!ok)
        fprintf(stderr, "status %d after %d steps: %s\n", (int)st, r.steps, msg);
    return ok;
}

/* A write that fails (a file size limit) stops the run after the step,
 * with an error naming the event file; the directory in the way of
 * --tensorboard fails the run before step 1. */
START_TEST(test_train_write_fails)
{
    char dir[512], tbdir[600];
    fsdp_test_mkdir(dir, sizeof dir, "run");
    pathf(tbdir, sizeof tbdir, "%s/tb", dir);
    fsdp_train_config c;
    train_config_cpu(&c, "tiny", 2);
    c.eng.batch = 2;
    c.steps = 40;
    fsdp_tboard_sink tb;
    fsdp_tboard_sink_init(&tb, tbdir);
    c.sink = &tb.sink;
    ck_assert(in_child_with_file_limit(2000, run_stops_on_write_error, &c));

    pathf(tbdir, sizeof tbdir, "%s/in-the-way", dir);
    fsdp_test_write_file(tbdir, "not a directory");
    fsdp_tboard_sink_init(&tb, tbdir);
    run_fail(&c, FSDP_STATUS_IO, "--tensorboard", tbdir);
}
END_TEST

/* ---- fsdp plot: panels, log scale, resumes -------------------------------------------- */

/* Occurrences of needle in s. */
static int count(const char *s, const char *needle)
{
    int k = 0;
    for (const char *p = s; (p = strstr(p, needle)); p += strlen(needle))
        k++;
    return k;
}

/* s drawn through the command (fsdp plot IN OUT extra), the SVG returned. */
static char *plot(const char *metrics, const char *extra, const char *expect)
{
    char in[512], svg[512], out[4096];
    fsdp_test_path(in, sizeof in, "m.jsonl");
    fsdp_test_path(svg, sizeof svg, "m.svg");
    fsdp_test_write_file(in, metrics);
    int rc = fsdp_test_cli(out, sizeof out, "plot %s %s %s", in, svg, extra);
    REQUIRE(rc == 0 && strstr(out, expect), "fsdp plot %s: exit %d:\n%s", extra, rc, out);
    return fsdp_test_read_file(svg, NULL);
}

/* A run of 4 steps, resumed from step 2 with 3 more (each with lr and
 * grad_norm; eval_loss at steps 2 and 4, then 3 and 5). */
static const char resumed_log[] =
    "{\"step\":1,\"loss\":4,\"lr\":0.001,\"grad_norm\":2,\"tokens_per_s\":10,\"peak_bytes\":[5]}\n"
    "{\"step\":2,\"loss\":3,\"lr\":0.002,\"grad_norm\":1.5,\"tokens_per_s\":10,\"peak_bytes\":[5],"
    "\"eval_loss\":3.5}\n"
    "{\"step\":3,\"loss\":2,\"lr\":0.003,\"grad_norm\":1,\"tokens_per_s\":10,\"peak_bytes\":[5]}\n"
    "{\"step\":4,\"loss\":1,\"lr\":0.004,\"grad_norm\":1,\"tokens_per_s\":10,\"peak_bytes\":[5],"
    "\"eval_loss\":2.5}\n"
    "{\"step\":3,\"loss\":2.1,\"lr\":0.003,\"grad_norm\":1,\"tokens_per_s\":10,\"peak_bytes\":[5],"
    "\"eval_loss\":2.7,\"resumed_from\":2}\n"
    "{\"step\":4,\"loss\":1.1,\"lr\":0.004,\"grad_norm\":1,\"tokens_per_s\":10,"
    "\"peak_bytes\":[5]}\n"
    "{\"step\":5,\"loss\":0.5,\"lr\":0.005,\"grad_norm\":0.5,\"tokens_per_s\":10,"
    "\"peak_bytes\":[5],\"eval_loss\":2.4}\n";

START_TEST(test_plot_panels_and_resume)
{
    char *svg = plot(resumed_log, "", "7 step(s), 1 device(s), 1 resume(s) marked");
    static const char *const titles[] = {">training loss<", ">learning rate<",
                                         ">gradient norm (before clipping)<", ">held-out loss<",
                                         ">throughput<", ">peak device memory, per device<"};
    for (size_t k = 0; k < FSDP_TEST_LEN(titles); k++)
        ck_assert_msg(strstr(svg, titles[k]), "no panel %s", titles[k]);
    /* the resume: a dashed line in each of the six panels, labelled once; the steps are 1..5,
     * the two lines a resume ran again are counted apart */
    ck_assert_int_eq(count(svg, "stroke-dasharray=\"5,3\""), 6);
    ck_assert_int_eq(count(svg, ">resumed<"), 1);
    ck_assert_msg(strstr(svg, "5 steps; final loss 0.5; mean 10 tokens/s after the first step; 1 "
                              "device(s); resumed at step 3 (2 earlier line(s) of steps run "
                              "again, in grey)"),
                  "%.300s", strstr(svg, "step(s)") ? strstr(svg, "step(s)") - 4 : svg);
    /* the held-out loss in its colour: steps 2, 3 (the resumed run's) and 5, joined across
     * the lines without a value, and the legend; the stale step 4, alone, a grey dot */
    ck_assert_int_eq(count(svg, "\"#56B4E9\""), 1 + 1);
    ck_assert_int_eq(count(svg, "<circle"), 1);
    ck_assert_int_eq(count(svg, "<circle cx"), count(svg, "fill=\"#CCCCCC\"/>"));
    free(svg);

    /* an older log without resumed_from: a step going back is a resume too */
    char old[sizeof resumed_log];
    snprintf(old, sizeof old, "%s", resumed_log);
    char *key = strstr(old, ",\"resumed_from\":2"); /* 17 bytes */
    memmove(key, key + 17, strlen(key + 17) + 1);
    svg = plot(old, "", "1 resume(s) marked");
    ck_assert_int_eq(count(svg, "stroke-dasharray=\"5,3\""), 6);
    free(svg);

    /* a log without lr, grad_norm or eval_loss: notes, not errors */
    svg = plot("{\"step\":1,\"loss\":3}\n{\"step\":2,\"loss\":2}\n", "", "2 step(s)");
    ck_assert(strstr(svg, "no lr in this file") && strstr(svg, "no grad_norm in this file") &&
              strstr(svg, "no eval_loss in this file"));
    ck_assert_int_eq(count(svg, "stroke-dasharray"), 0);
    free(svg);
}
END_TEST

START_TEST(test_plot_log_scale)
{
    /* a loss falling by five orders of magnitude, one value <= 0 (a gap on a log axis) */
    static const char losses[] = "{\"step\":1,\"loss\":2.5}\n{\"step\":2,\"loss\":0.03}\n"
                                 "{\"step\":3,\"loss\":0}\n{\"step\":4,\"loss\":4e-4}\n"
                                 "{\"step\":5,\"loss\":4e-5}\n";
    char *svg = plot(losses, "--loss-scale log", "5 step(s)");
    ck_assert(strstr(svg, ">loss (log scale)<"));
    /* decade ticks from 1e-05 to 10 */
    static const char *const ticks[] = {">1e-05<", ">0.0001<", ">0.001<", ">0.01<", ">0.1<",
                                        ">1<", ">10<"};
    for (size_t k = 0; k < FSDP_TEST_LEN(ticks); k++)
        ck_assert_msg(strstr(svg, ticks[k]), "no tick %s", ticks[k]);
    ck_assert(!strstr(svg, "nan") && !strstr(svg, "inf"));
    free(svg);
    /* linear: no such ticks */
    svg = plot(losses, "", "5 step(s)");
    ck_assert(strstr(svg, ">loss<") && !strstr(svg, ">1e-05<"));
    free(svg);
    /* within a decade: 1, 2, 5 ticks around the values */
    svg = plot("{\"step\":1,\"loss\":2.2}\n{\"step\":2,\"loss\":4.1}\n", "--loss-scale log",
               "2 step(s)");
    ck_assert(strstr(svg, ">2<") && strstr(svg, ">5<"));
    free(svg);
    char out[1024];
    ck_assert_int_eq(fsdp_test_cli(out, sizeof out, "plot a.jsonl b.svg --loss-scale cubic"), 2);
    ck_assert_msg(strstr(out, "linear or log"), "%s", out);
}
END_TEST

START_TEST(test_plot_reader_keys)
{
    char p[512];
    fsdp_test_path(p, sizeof p, "m.jsonl");
    fsdp_metrics m;
    fsdp_test_write_file(p, "{\"step\":1,\"loss\":3,\"lr\":null,\"grad_norm\":1e999,"
                            "\"eval_loss\":2}\n{\"step\":2,\"loss\":2,\"resumed_from\":1}\n");
    ck_assert_int_eq(fsdp_metrics_read(p, &m), FSDP_STATUS_OK);
    ck_assert(isnan(m.lr[0]) && isnan(m.grad_norm[0]) && m.eval_loss[0] == 2);
    ck_assert(isnan(m.lr[1]) && isnan(m.eval_loss[1]));
    ck_assert(!m.resumed[0] && m.resumed[1] && m.n_resumes == 1);
    fsdp_metrics_free(&m);
    static const struct {
        const char *line, *key;
    } bad[] = {
        {"{\"step\":1,\"loss\":3,\"lr\":\"high\"}\n", "\"lr\" must be a number or null"},
        {"{\"step\":1,\"loss\":3,\"eval_loss\":[1]}\n", "\"eval_loss\" must be a number or null"},
        {"{\"step\":1,\"loss\":3,\"resumed_from\":true}\n", "\"resumed_from\" must be a number"},
    };
    for (size_t k = 0; k < FSDP_TEST_LEN(bad); k++) {
        fsdp_test_write_file(p, bad[k].line);
        ck_assert_int_eq(fsdp_metrics_read(p, &m), FSDP_STATUS_FORMAT);
        ck_assert_msg(strstr(fsdp_error_msg(), bad[k].key) && strstr(fsdp_error_msg(), "line 1"),
                      "%s", fsdp_error_msg());
    }
}
END_TEST

int main(void)
{
    const fsdp_test_tcase tcases[] = {
        {"tensorboard", 120, .tmpdir = true,
         FSDP_TESTS(test_crc32c_vectors, test_event_encoding, test_writer, test_train_resume_files,
                    test_train_tensorboard_reader, test_train_write_fails)},
        {"plot", 60, .tmpdir = true,
         FSDP_TESTS(test_plot_panels_and_resume, test_plot_log_scale, test_plot_reader_keys)},
    };
    return fsdp_test_main("report", tcases, FSDP_TEST_LEN(tcases));
}
