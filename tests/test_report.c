/*
 * test_report.c - looking at a run: TensorBoard event files (CRC-32C test
 * vectors; TFRecord framing and Event encoding against records written by
 * tensorboard's own RecordWriter; the writer; a trainer run and its resume
 * through the sink, read back here and, when the tensorboard package is
 * installed, by TensorBoard's EventAccumulator through
 * tools/check_tensorboard.py).
 */
#include <check.h>
#include <dirent.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/crc32c.h"
#include "file_util.h"
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

int main(void)
{
    const fsdp_test_tcase tcases[] = {
        {"tensorboard", 120, .tmpdir = true,
         FSDP_TESTS(test_crc32c_vectors, test_event_encoding, test_writer, test_train_resume_files,
                    test_train_tensorboard_reader, test_train_write_fails)},
    };
    return fsdp_test_main("report", tcases, FSDP_TEST_LEN(tcases));
}
