/*
 * test_hostile.c - files and paths as a hostile or unlucky user hands them
 * to fsdp (issue 15): nothing lost, nothing silent, nothing hangs.
 *
 * - reading: only regular files are read (a FIFO without a writer, a
 *   device node, a directory are refused at once, never waited on);
 * - bounds: one line and one file are bounded, with the limit named;
 * - metrics: `fsdp plot` takes null and non-finite numbers as gaps,
 *   empty peak arrays, an incomplete last line, absurd magnitudes, and
 *   refuses malformed lines naming the line and the field;
 * - writing: the atomic writer never replaces or removes what is at the
 *   path unless it is a regular file and the whole new file was written
 *   (device nodes, FIFOs, directories, symlinks to them, a failed write,
 *   a path swapped while writing);
 * - checkpoint directories: one run at a time (flock), the holder named,
 *   stale lock files never block.
 *
 * Every hostile file is made by the test, small (sparse where it must look
 * large), in the suite's scratch directory (testutil.h), which is removed
 * even when a test fails.
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "case_util.h"
#include "ckpt/ckpt_dir.h"
#include "core/error.h"
#include "core/fileio.h"
#include "core/json.h"
#include "file_util.h"
#include "report/plot.h"
#include "report/svg.h"
#include "testutil.h"
#include "train/train.h"
#include "train_util.h"

/* ---- helpers ------------------------------------------------------------------ */

/* Files are written and read with file_util.h's spit and slurp. */
static void write_text(const char *path, const char *text) { spit(path, text, strlen(text)); }

/* A sparse file of `size` zero bytes (costs no disk). */
static void sparse_file(const char *path, off_t size)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(ftruncate(fd, size), 0);
    close(fd);
}

/* st must be `want`, and the message must hold every fragment (NULL-ended). */
static void expect_error(fsdp_status st, fsdp_status want, ...)
{
    const char *msg = fsdp_error_msg();
    REQUIRE(st == want, "status %s, expected %s (message: %s)", fsdp_status_name(st),
            fsdp_status_name(want), msg);
    va_list ap;
    va_start(ap, want);
    for (const char *frag; (frag = va_arg(ap, const char *));)
        REQUIRE(strstr(msg, frag), "message lacks '%s': %s", frag, msg);
    va_end(ap);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static const char *const METRICS_OK =
    "{\"step\":1,\"loss\":5.5,\"tokens_per_s\":100,\"peak_bytes\":[1000,1000]}\n"
    "{\"step\":2,\"loss\":4.5,\"tokens_per_s\":200,\"peak_bytes\":[1000,1000]}\n"
    "{\"step\":3,\"loss\":3.5,\"tokens_per_s\":300,\"peak_bytes\":[1000,1000]}\n";

/* Render m into memory; the SVG text (caller frees). */
static char *render(const fsdp_metrics *m)
{
    char *svg = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&svg, &n);
    ck_assert_ptr_nonnull(f);
    fsdp_status st = fsdp_metrics_write_svg(m, "t", f);
    ck_assert_int_eq(fclose(f), 0);
    REQUIRE(st == FSDP_STATUS_OK, "drawing failed: %s", fsdp_error_msg());
    REQUIRE(n > 0 && strstr(svg, "</svg>"), "no complete SVG");
    return svg;
}

/* ---- reading: regular files only -------------------------------------------------- */

START_TEST(test_open_regular)
{
    char p[128], q[128], fifo[128];
    fsdp_test_path(p, sizeof p, "file");
    write_text(p, "hello");
    int fd;
    uint64_t size = 0;
    ck_assert_int_eq(fsdp_open_regular(p, "test file", &fd, &size), FSDP_STATUS_OK);
    ck_assert_uint_eq(size, 5);
    int fl = fcntl(fd, F_GETFL);
    ck_assert(fl >= 0 && !(fl & O_NONBLOCK)); /* cleared after the checks */
    ck_assert(fcntl(fd, F_GETFD) & FD_CLOEXEC);
    char b[8];
    ck_assert_int_eq(read(fd, b, sizeof b), 5);
    close(fd);
    /* through a symlink to a regular file */
    fsdp_test_path(q, sizeof q, "link");
    ck_assert_int_eq(symlink(p, q), 0);
    ck_assert_int_eq(fsdp_open_regular(q, "test file", &fd, NULL), FSDP_STATUS_OK);
    close(fd);
    FILE *f;
    ck_assert_int_eq(fsdp_fopen_regular(p, "test file", &f, NULL), FSDP_STATUS_OK);
    ck_assert_int_eq(fgetc(f), 'h');
    fclose(f);

    /* refused, each at once, with one message form */
    fsdp_test_path(fifo, sizeof fifo, "fifo");
    ck_assert_int_eq(mkfifo(fifo, 0600), 0);
    fsdp_test_path(q, sizeof q, "fifo_link");
    ck_assert_int_eq(symlink(fifo, q), 0);
    static const text_case bad[] = {{NULL, "a FIFO (named pipe), not a regular file"},
               {NULL, "a FIFO (named pipe)"},
               {"/dev/null", "a character device, not a regular file"},
               {"/dev/zero", "a character device"},
               {"/tmp", "a directory, not a regular file"}};
    double t0 = now_s();
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const char *path = bad[i].in ? bad[i].in : i == 0 ? fifo : q;
        fd = 7;
        expect_error(fsdp_open_regular(path, "test file", &fd, NULL), FSDP_STATUS_IO, "test file",
                     path, bad[i].want, "fsdp reads only regular files", NULL);
        ck_assert_int_eq(fd, -1);
        f = (FILE *)1;
        expect_error(fsdp_fopen_regular(path, "test file", &f, NULL), FSDP_STATUS_IO, bad[i].want,
                     NULL);
        ck_assert_ptr_null(f);
    }
    REQUIRE(now_s() - t0 < 5, "refusing took %.1f s", now_s() - t0);
    fsdp_test_path(q, sizeof q, "missing");
    expect_error(fsdp_open_regular(q, "test file", &fd, NULL), FSDP_STATUS_IO,
                 "cannot open test file", q, "No such file", NULL);
}
END_TEST

/* Every reader this suite owns refuses a FIFO with no writer (it used to
 * hang forever) and /dev/zero (it used to grow without bound). */
START_TEST(test_readers_refuse_special_files)
{
    char dir[128], fifo[128], svg[128];
    fsdp_test_mkdir(dir, sizeof dir, "hostile");
    pathf(fifo, sizeof fifo, "%s/metrics.jsonl", dir);
    pathf(svg, sizeof svg, "%s/out.svg", dir);
    ck_assert_int_eq(mkfifo(fifo, 0600), 0);
    double t0 = now_s();
    fsdp_metrics m;
    expect_error(fsdp_metrics_read(fifo, &m), FSDP_STATUS_IO, "metrics file", fifo, "FIFO", NULL);
    ck_assert_int_eq(m.n_steps, 0);
    fsdp_plot_info info;
    expect_error(fsdp_plot_metrics(fifo, svg, &info), FSDP_STATUS_IO, "FIFO", NULL);
    expect_error(fsdp_plot_metrics("/dev/zero", svg, &info), FSDP_STATUS_IO, "/dev/zero",
                 "character device", NULL);
    fsdp_json *v = (fsdp_json *)1;
    expect_error(fsdp_json_parse_file(fifo, &v), FSDP_STATUS_IO, "JSON file", fifo, "FIFO", NULL);
    ck_assert_ptr_null(v);
    expect_error(fsdp_json_parse_file("/dev/zero", &v), FSDP_STATUS_IO, "character device", NULL);
    expect_error(fsdp_json_parse_file(dir, &v), FSDP_STATUS_IO, "directory", NULL);
    fsdp_line_reader lr;
    expect_error(fsdp_line_reader_open(&lr, fifo, "text file", 100, 1000), FSDP_STATUS_IO, "FIFO",
                 NULL);
    fsdp_line_reader_close(&lr); /* safe after a failed open */
    REQUIRE(now_s() - t0 < 5, "refusing took %.1f s", now_s() - t0);
    ck_assert_int_eq(access(svg, F_OK), -1); /* no SVG from a failed plot */
    ck_assert_int_eq(count_entries(dir), 1);  /* and no temporary file */
}
END_TEST

/* ---- bounds --------------------------------------------------------------------- */

START_TEST(test_line_reader)
{
    char p[128];
    fsdp_test_path(p, sizeof p, "lines");
    /* NUL bytes kept, CRLF left to the caller, a line of exactly the limit,
     * an empty line, a last line without '\n' */
    static const char text[] = "ab\0c\r\n0123456789\n\nlast";
    spit(p, text, sizeof text - 1);
    fsdp_line_reader lr;
    ck_assert_int_eq(fsdp_line_reader_open(&lr, p, "text file", 10, 1000), FSDP_STATUS_OK);
    static const struct {
        const char *s;
        size_t n;
        bool term;
    } want[] = {{"ab\0c\r", 5, true}, {"0123456789", 10, true}, {"", 0, true}, {"last", 4, false}};
    const char *line;
    size_t len;
    bool term;
    for (int i = 0; i < 4; i++) {
        ck_assert_int_eq(fsdp_line_reader_next(&lr, &line, &len, &term), FSDP_STATUS_OK);
        REQUIRE(line && len == want[i].n && !memcmp(line, want[i].s, len) && term == want[i].term,
                "line %d: got %zu bytes", i + 1, len);
        ck_assert_int_eq(lr.line_no, i + 1);
    }
    ck_assert_int_eq(fsdp_line_reader_next(&lr, &line, &len, &term), FSDP_STATUS_OK);
    ck_assert_ptr_null(line);
    ck_assert_int_eq(fsdp_line_reader_next(&lr, &line, &len, &term), FSDP_STATUS_OK); /* stays */
    ck_assert_ptr_null(line);
    fsdp_line_reader_close(&lr);
    fsdp_line_reader_close(&lr); /* twice is fine */

    /* one byte over the line limit, with and without its '\n', and at the
     * end of the file: the line is named */
    static const char *const over[] = {"ok\n01234567890\nnext\n", "ok\n01234567890", "ok\n0123456789012345678901234"};
    for (int i = 0; i < 3; i++) {
        write_text(p, over[i]);
        ck_assert_int_eq(fsdp_line_reader_open(&lr, p, "text file", 10, 1000), FSDP_STATUS_OK);
        ck_assert_int_eq(fsdp_line_reader_next(&lr, &line, &len, &term), FSDP_STATUS_OK);
        expect_error(fsdp_line_reader_next(&lr, &line, &len, &term), FSDP_STATUS_FORMAT,
                     "text file", p, "line 2 is longer than 10 B", NULL);
        fsdp_line_reader_close(&lr);
    }

    /* the file size: over the limit at open, and grown past it after open */
    write_text(p, "0123456789\n0123456789\n");
    expect_error(fsdp_line_reader_open(&lr, p, "text file", 100, 21), FSDP_STATUS_FORMAT, p,
                 "is 22 B, larger than the limit of 21 B", NULL);
    ck_assert_int_eq(fsdp_line_reader_open(&lr, p, "text file", 100, 22), FSDP_STATUS_OK);
    FILE *f = fopen(p, "a");
    fputs("more\n", f);
    fclose(f);
    expect_error(fsdp_line_reader_next(&lr, &line, &len, &term), FSDP_STATUS_FORMAT,
                 "is at least 27 B, larger than the limit of 22 B", NULL);
    fsdp_line_reader_close(&lr);

    /* long lines across many reads of the buffer */
    f = fopen(p, "w");
    for (int i = 0; i < 3; i++) {
        for (int k = 0; k < 200000; k++)
            fputc('a' + i, f);
        fputc('\n', f);
    }
    fclose(f);
    ck_assert_int_eq(fsdp_line_reader_open(&lr, p, "text file", 200000, 1 << 20), FSDP_STATUS_OK);
    for (int i = 0; i < 3; i++) {
        ck_assert_int_eq(fsdp_line_reader_next(&lr, &line, &len, &term), FSDP_STATUS_OK);
        REQUIRE(len == 200000 && line[0] == 'a' + i && line[len - 1] == 'a' + i && term,
                "long line %d", i);
    }
    fsdp_line_reader_close(&lr);
}
END_TEST

/* A regular file of zeros (no newline) stops at the line limit, one over
 * the size limit at once; both read at most about a line. */
START_TEST(test_bounded_inputs)
{
    char p[128], svg[128];
    fsdp_test_path(p, sizeof p, "zeros.jsonl");
    fsdp_test_path(svg, sizeof svg, "out.svg");
    fsdp_plot_info info;
    sparse_file(p, (off_t)64 << 20);
    double t0 = now_s();
    expect_error(fsdp_plot_metrics(p, svg, &info), FSDP_STATUS_FORMAT, p,
                 "line 1 is longer than 1.00 MiB (the limit for one line)", NULL);
    sparse_file(p, (off_t)FSDP_PLOT_MAX_FILE_BYTES + 1);
    expect_error(fsdp_plot_metrics(p, svg, &info), FSDP_STATUS_FORMAT, p,
                 "larger than the limit of 1.00 GiB", NULL);
    fsdp_json *v;
    sparse_file(p, (off_t)FSDP_JSON_MAX_FILE_BYTES + 1);
    expect_error(fsdp_json_parse_file(p, &v), FSDP_STATUS_FORMAT, p,
                 "larger than the limit of 256.0 MiB", NULL);
    REQUIRE(now_s() - t0 < 10, "bounded reads took %.1f s", now_s() - t0);
    ck_assert_int_eq(access(svg, F_OK), -1);
    /* just under the JSON limit is read (and refused as JSON) */
    write_text(p, "[1, 2,]");
    expect_error(fsdp_json_parse_file(p, &v), FSDP_STATUS_FORMAT, "JSON file", p, "column 7",
                 NULL);
    write_text(p, "{\"a\": 1e999, \"b\": -1e999}");
    ck_assert_int_eq(fsdp_json_parse_file(p, &v), FSDP_STATUS_OK);
    ck_assert(isinf(fsdp_json_get(v, "a")->number) && fsdp_json_get(v, "b")->number < 0);
    fsdp_json_free(v);
}
END_TEST

/* ---- metrics: what fsdp plot accepts --------------------------------------------------- */

START_TEST(test_metrics_nulls_and_gaps)
{
    char p[128];
    fsdp_test_path(p, sizeof p, "m.jsonl");
    /* null is how the trainer writes a non-finite number; 1e999 parses
     * as infinity; blank and CRLF lines; peaks of varying length */
    write_text(p, "\n"
                  "{\"step\":1,\"loss\":null,\"tokens_per_s\":null,\"peak_bytes\":[null,5]}\r\n"
                  "   \n"
                  "{\"step\":2,\"loss\":1e999,\"peak_bytes\":[]}\n"
                  "{\"step\":3,\"loss\":2.5,\"tokens_per_s\":-1e999,\"peak_bytes\":[7,8,9]}\n"
                  "{\"step\":4,\"loss\":2,\"tokens_per_s\":40}");
    fsdp_metrics m;
    ck_assert_int_eq(fsdp_metrics_read(p, &m), FSDP_STATUS_OK);
    ck_assert_int_eq(m.n_steps, 4);
    ck_assert_int_eq(m.n_devices, 3);
    ck_assert(!m.skipped_last_line); /* a complete last line without '\n' counts */
    ck_assert(isnan(m.loss[0]) && isnan(m.loss[1]) && m.loss[2] == 2.5 && m.loss[3] == 2);
    ck_assert(isnan(m.tokens_per_s[0]) && isnan(m.tokens_per_s[1]) && isnan(m.tokens_per_s[2]) &&
              m.tokens_per_s[3] == 40);
    static const int first[] = {0, 2, 2, 5, 5};
    for (int i = 0; i <= 4; i++)
        ck_assert_int_eq(m.peak_first[i], first[i]);
    ck_assert(isnan(m.peak[0]) && m.peak[1] == 5 && m.peak[2] == 7 && m.peak[4] == 9);
    char *svg = render(&m);
    ck_assert_ptr_null(strstr(svg, "nan"));
    ck_assert_ptr_null(strstr(svg, "inf"));
    ck_assert_ptr_nonnull(strstr(svg, "final loss 2;"));
    free(svg);
    fsdp_metrics_free(&m);
    fsdp_metrics_free(&m); /* twice is fine */

    /* every loss null, no peaks anywhere (an empty array used to reach
     * qsort(NULL, 0)), no throughput */
    write_text(p, "{\"step\":1,\"loss\":null,\"peak_bytes\":[]}\n"
                  "{\"step\":2,\"loss\":null,\"peak_bytes\":[]}\n");
    ck_assert_int_eq(fsdp_metrics_read(p, &m), FSDP_STATUS_OK);
    ck_assert_int_eq(m.n_devices, 0);
    svg = render(&m);
    ck_assert_ptr_nonnull(strstr(svg, "no loss in this file"));
    ck_assert_ptr_nonnull(strstr(svg, "no tokens_per_s in this file"));
    ck_assert_ptr_nonnull(strstr(svg, "no peak_bytes in this file"));
    ck_assert_ptr_nonnull(strstr(svg, "final loss null (not finite)"));
    ck_assert_ptr_null(strstr(svg, "<polyline"));
    free(svg);
    fsdp_metrics_free(&m);

    /* equal devices share one line; unequal ones get one each */
    write_text(p, METRICS_OK);
    ck_assert_int_eq(fsdp_metrics_read(p, &m), FSDP_STATUS_OK);
    svg = render(&m);
    ck_assert_ptr_nonnull(strstr(svg, "devices 0..1"));
    free(svg);
    fsdp_metrics_free(&m);
    write_text(p, "{\"step\":1,\"loss\":1,\"peak_bytes\":[1,2]}\n");
    ck_assert_int_eq(fsdp_metrics_read(p, &m), FSDP_STATUS_OK);
    svg = render(&m);
    ck_assert_ptr_nonnull(strstr(svg, "device 1<"));
    ck_assert_ptr_null(strstr(svg, "all equal"));
    free(svg);
    fsdp_metrics_free(&m);
}
END_TEST

/* The last line of a run still writing (or cut by a full disk) is left
 * out and reported; an incomplete line anywhere else is an error. */
START_TEST(test_metrics_incomplete_last_line)
{
    char p[128], svg[128], out[4096];
    fsdp_test_path(p, sizeof p, "m.jsonl");
    fsdp_test_path(svg, sizeof svg, "m.svg");
    char text[1024];
    pathf(text, sizeof text, "%s{\"step\":4,\"loss\":3.1,\"tokens_p", METRICS_OK);
    write_text(p, text);
    fsdp_plot_info info;
    ck_assert_int_eq(fsdp_plot_metrics(p, svg, &info), FSDP_STATUS_OK);
    ck_assert_int_eq(info.n_steps, 3);
    ck_assert_int_eq(info.n_devices, 2);
    ck_assert(info.skipped_last_line);
    char args[512];
    pathf(args, sizeof args, "plot %s %s", p, svg);
    ck_assert_int_eq(fsdp_test_cli(out, sizeof out, "%s", args), 0);
    REQUIRE(strstr(out, "the last line of") && strstr(out, "is incomplete") &&
                strstr(out, "3 step(s), 2 device(s)"),
            "%s", out);
    /* only the incomplete line: nothing to plot */
    write_text(p, "{\"step\":1,\"lo");
    expect_error(fsdp_plot_metrics(p, svg, &info), FSDP_STATUS_FORMAT,
                 "holds no complete metrics lines", NULL);
    /* cut in the middle of the file: an error naming the line */
    pathf(text, sizeof text, "{\"step\":1,\"lo\n%s", METRICS_OK);
    write_text(p, text);
    expect_error(fsdp_plot_metrics(p, svg, &info), FSDP_STATUS_FORMAT, "line 1, column", NULL);
}
END_TEST

START_TEST(test_metrics_malformed)
{
    char p[128];
    fsdp_test_path(p, sizeof p, "m.jsonl");
    static const struct {
        const char *text, *frag1, *frag2;
    } cases[] = {
        {"", "holds no metrics lines", "--log"},
        {"\n \n\r\n", "holds no metrics lines", NULL},
        {"[1,2]\n", "line 1: expected a JSON object, found an array", NULL},
        {"{\"step\":1,\"loss\":1}\n7\n", "line 2: expected a JSON object, found a number", NULL},
        {"{\"loss\":1}\n", "line 1: \"step\" must be a finite number, found nothing", NULL},
        {"{\"step\":null,\"loss\":1}\n", "\"step\" must be a finite number, found a null", NULL},
        {"{\"step\":1e999,\"loss\":1}\n", "\"step\" must be a finite number, found a non-finite number", NULL},
        {"{\"step\":\"1\",\"loss\":1}\n", "found a string", NULL},
        {"{\"step\":1}\n", "\"loss\" must be a number or null, found nothing", NULL},
        {"{\"step\":1,\"loss\":true}\n", "\"loss\" must be a number or null, found a boolean", NULL},
        {"{\"step\":1,\"loss\":1,\"tokens_per_s\":\"fast\"}\n", "\"tokens_per_s\"", "a string"},
        {"{\"step\":1,\"loss\":1,\"peak_bytes\":7}\n", "\"peak_bytes\" must be an array", NULL},
        {"{\"step\":1,\"loss\":1,\"peak_bytes\":[1,\"x\"]}\n", "element 1 is a string", NULL},
        {"{\"step\":1,\"loss\":1,\"peak_bytes\":[[1]]}\n", "element 0 is an array", NULL},
        {"{\"step\":1,\"loss\":nan}\n", "line 1, column 18", "did the run diverge?"},
        {"{\"step\":1,\"loss\":-inf}\n", "did the run diverge?", NULL},
        {"{\"step\":1,\"loss\":1}\n{\"step\":2,\"loss\":1}}\n", "line 2, column 20", NULL},
        {"{\"step\":1,\"lo\0ss\":1}\n", "line 1, column 14", "byte 0x00"},
        {"{\"step\":1,\"loss\":1}\n\xff\xfe{}\n", "line 2", "byte 0xff"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        /* the NUL case: its length is up to the '\n' */
        const char *t = cases[i].text;
        size_t n = strlen(t);
        if (i == 17)
            n += 1 + strlen(t + n + 1);
        spit(p, t, n);
        fsdp_metrics m;
        fsdp_status st = fsdp_metrics_read(p, &m);
        const char *msg = fsdp_error_msg();
        REQUIRE(st == FSDP_STATUS_FORMAT, "case %zu: status %s (%s)", i, fsdp_status_name(st), msg);
        REQUIRE(strstr(msg, p) && strstr(msg, cases[i].frag1) &&
                    (!cases[i].frag2 || strstr(msg, cases[i].frag2)),
                "case %zu: %s", i, msg);
        ck_assert_int_eq(m.n_steps, 0);
        ck_assert_ptr_null(m.step);
    }
    /* more devices than fsdp runs */
    FILE *f = fopen(p, "w");
    fputs("{\"step\":1,\"loss\":1,\"peak_bytes\":[0", f);
    for (int d = 1; d <= FSDP_PLOT_MAX_DEVICES; d++)
        fputs(",0", f);
    fputs("]}\n", f);
    fclose(f);
    fsdp_metrics m;
    expect_error(fsdp_metrics_read(p, &m), FSDP_STATUS_FORMAT, "lists 1025 devices", NULL);
}
END_TEST

/* Absurd magnitudes: the drawing stays finite (no NaN or inf in the SVG,
 * no float-to-int overflow under UBSan). */
START_TEST(test_metrics_extreme_values)
{
    char p[128];
    fsdp_test_path(p, sizeof p, "m.jsonl");
    static const char *const files[] = {
        "{\"step\":-1.7e308,\"loss\":-1.7e308,\"tokens_per_s\":1.7e308,\"peak_bytes\":[1.7e308]}\n"
        "{\"step\":1.7e308,\"loss\":1.7e308,\"tokens_per_s\":1.7e308,\"peak_bytes\":[-1.7e308]}\n"
        "{\"step\":0,\"loss\":0,\"tokens_per_s\":1.7e308,\"peak_bytes\":[0]}\n",
        "{\"step\":5e-324,\"loss\":5e-324,\"peak_bytes\":[5e-324]}\n"
        "{\"step\":1e-323,\"loss\":1e-323,\"peak_bytes\":[1e-323]}\n",
        "{\"step\":7,\"loss\":1}\n{\"step\":7,\"loss\":1}\n",
        "{\"step\":1e300,\"loss\":-0.0}\n",
        "{\"step\":3,\"loss\":1}\n{\"step\":2,\"loss\":1}\n{\"step\":1,\"loss\":1}\n",
    };
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        write_text(p, files[i]);
        fsdp_metrics m;
        fsdp_status st = fsdp_metrics_read(p, &m);
        REQUIRE(st == FSDP_STATUS_OK, "file %zu: %s", i, fsdp_error_msg());
        char *svg = render(&m);
        REQUIRE(!strstr(svg, "nan") && !strstr(svg, "inf"), "file %zu: a non-finite coordinate",
                i);
        free(svg);
        fsdp_metrics_free(&m);
    }
    double lo = -1.7e308, hi = 1.7e308;
    double step = fsdp_svg_nice_range(&lo, &hi, 8);
    ck_assert(isfinite(step) && step > 0 && isfinite(lo) && isfinite(hi) && lo < hi);
    lo = 5e-324;
    hi = 1e-323;
    step = fsdp_svg_nice_range(&lo, &hi, 5);
    ck_assert(isfinite(step) && step > 0 && lo <= 5e-324 && hi >= 1e-323);
}
END_TEST

/* ---- writing: the atomic writer never destroys what is at the path ------------------- */

/* Write "new" through the atomic writer; the status. */
static fsdp_status atomic_write(const char *path, const char *text)
{
    fsdp_atomic_file af;
    fsdp_status st = fsdp_atomic_open(&af, path, "test output");
    if (st != FSDP_STATUS_OK)
        return st;
    bool ok = fputs(text, af.f) >= 0;
    return fsdp_atomic_commit(&af, ok);
}

START_TEST(test_atomic_regular_and_symlink)
{
    char dir[128], p[128], link[128], target[128];
    fsdp_test_mkdir(dir, sizeof dir, "hostile");
    pathf(p, sizeof p, "%s/out", dir);
    /* new file */
    ck_assert_int_eq(atomic_write(p, "one"), FSDP_STATUS_OK);
    char *s = slurp(p);
    ck_assert_str_eq(s, "one");
    free(s);
    /* replaced, keeping its permissions */
    ck_assert_int_eq(chmod(p, 0640), 0);
    ck_assert_int_eq(atomic_write(p, "two"), FSDP_STATUS_OK);
    s = slurp(p);
    ck_assert_str_eq(s, "two");
    free(s);
    struct stat sb;
    ck_assert_int_eq(stat(p, &sb), 0);
    ck_assert_int_eq(sb.st_mode & 07777, 0640);
    /* a failed write (write_ok false) and an abandoned one leave it as it was */
    fsdp_atomic_file af;
    ck_assert_int_eq(fsdp_atomic_open(&af, p, "test output"), FSDP_STATUS_OK);
    fputs("three", af.f);
    expect_error(fsdp_atomic_commit(&af, false), FSDP_STATUS_IO, "cannot write test output", p,
                 "was left as it was", NULL);
    ck_assert_int_eq(fsdp_atomic_open(&af, p, "test output"), FSDP_STATUS_OK);
    fputs("four", af.f);
    fsdp_atomic_abort(&af);
    fsdp_atomic_abort(&af); /* twice is fine */
    s = slurp(p);
    ck_assert_str_eq(s, "two");
    free(s);
    ck_assert_int_eq(count_entries(dir), 1); /* no temporary left */
    /* a symlink to a regular file: the file is replaced, the link kept */
    pathf(target, sizeof target, "%s/target", dir);
    pathf(link, sizeof link, "%s/link", dir);
    write_text(target, "old");
    ck_assert_int_eq(symlink("target", link), 0);
    ck_assert_int_eq(atomic_write(link, "new"), FSDP_STATUS_OK);
    ck_assert_int_eq(lstat(link, &sb), 0);
    ck_assert(S_ISLNK(sb.st_mode));
    s = slurp(target);
    ck_assert_str_eq(s, "new");
    free(s);
    ck_assert_int_eq(count_entries(dir), 3);
    /* a parent directory that does not exist */
    pathf(p, sizeof p, "%s/no/such/dir/out", dir);
    expect_error(atomic_write(p, "x"), FSDP_STATUS_IO, "cannot create", "test output", p, NULL);
}
END_TEST

START_TEST(test_atomic_refuses_special_paths)
{
    char dir[128], fifo[128], sub[128], l1[128], l2[128], l3[128];
    fsdp_test_mkdir(dir, sizeof dir, "hostile");
    pathf(fifo, sizeof fifo, "%s/fifo", dir);
    pathf(sub, sizeof sub, "%s/sub", dir);
    pathf(l1, sizeof l1, "%s/to_fifo", dir);
    pathf(l2, sizeof l2, "%s/to_null", dir);
    pathf(l3, sizeof l3, "%s/dangling", dir);
    ck_assert_int_eq(mkfifo(fifo, 0600), 0);
    ck_assert_int_eq(mkdir(sub, 0755), 0);
    ck_assert_int_eq(symlink(fifo, l1), 0);
    ck_assert_int_eq(symlink("/dev/null", l2), 0);
    ck_assert_int_eq(symlink("nowhere", l3), 0);
    struct stat full0, null0;
    ck_assert_int_eq(stat("/dev/full", &full0), 0);
    ck_assert_int_eq(stat("/dev/null", &null0), 0);
    static const text_case cases[] = {
        {"/dev/full", "is a character device, not a regular file"},
        {"/dev/null", "is a character device"},
        {NULL, "is a FIFO (named pipe)"},
        {NULL, "is a directory"},
        {NULL, "is a FIFO"},
        {NULL, "is a character device"},
        {NULL, "symbolic link that cannot be followed"},
    };
    const char *paths[] = {"/dev/full", "/dev/null", fifo, sub, l1, l2, l3};
    for (size_t i = 0; i < sizeof paths / sizeof paths[0]; i++) {
        fsdp_atomic_file af;
        expect_error(fsdp_atomic_open(&af, paths[i], "test output"), FSDP_STATUS_IO, "test output",
                     paths[i], cases[i].want, "left it untouched", NULL);
        ck_assert_ptr_null(af.f);
        fsdp_atomic_abort(&af); /* a no-op after a refused open */
    }
    /* through the SVG writer too (fsdp plot, fsdp plan --svg) */
    fsdp_svg s;
    expect_error(fsdp_svg_open(&s, "/dev/full", 10, 10, NULL), FSDP_STATUS_IO, "SVG file",
                 "/dev/full", "character device", NULL);
    /* everything is still what it was */
    struct stat sb;
    ck_assert_int_eq(stat("/dev/full", &sb), 0);
    ck_assert(S_ISCHR(sb.st_mode) && sb.st_rdev == full0.st_rdev);
    ck_assert_int_eq(stat("/dev/null", &sb), 0);
    ck_assert(S_ISCHR(sb.st_mode) && sb.st_rdev == null0.st_rdev);
    ck_assert_int_eq(lstat(fifo, &sb), 0);
    ck_assert(S_ISFIFO(sb.st_mode));
    ck_assert_int_eq(lstat(sub, &sb), 0);
    ck_assert(S_ISDIR(sb.st_mode));
    ck_assert_int_eq(count_entries(sub), 0);
    ck_assert_int_eq(lstat(l3, &sb), 0);
    ck_assert(S_ISLNK(sb.st_mode));
    ck_assert_int_eq(count_entries(dir), 5); /* no temporary files */

    /* the path turns into a FIFO while the file is written: commit refuses,
     * removes only its own temporary file */
    char p[128];
    pathf(p, sizeof p, "%s/swapped", dir);
    write_text(p, "old");
    fsdp_atomic_file af;
    ck_assert_int_eq(fsdp_atomic_open(&af, p, "test output"), FSDP_STATUS_OK);
    fputs("new", af.f);
    ck_assert_int_eq(unlink(p), 0);
    ck_assert_int_eq(mkfifo(p, 0600), 0);
    expect_error(fsdp_atomic_commit(&af, true), FSDP_STATUS_IO, "is a FIFO", NULL);
    ck_assert_int_eq(lstat(p, &sb), 0);
    ck_assert(S_ISFIFO(sb.st_mode));
    ck_assert_int_eq(count_entries(dir), 6);
}
END_TEST

/* A write that really fails (the file-size limit stands in for a full
 * disk): the SVG already at the path is unchanged, no temporary is left. */
START_TEST(test_atomic_failed_write_keeps_old)
{
    char dir[128], m[128], svg[128];
    fsdp_test_mkdir(dir, sizeof dir, "hostile");
    pathf(m, sizeof m, "%s/m.jsonl", dir);
    pathf(svg, sizeof svg, "%s/m.svg", dir);
    write_text(m, METRICS_OK);
    write_text(svg, "<svg>the old chart</svg>\n");
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        signal(SIGXFSZ, SIG_IGN); /* writes past the limit fail with EFBIG */
        struct rlimit rl = {.rlim_cur = 2000, .rlim_max = 2000};
        setrlimit(RLIMIT_FSIZE, &rl);
        fsdp_plot_info info;
        fsdp_status st = fsdp_plot_metrics(m, svg, &info);
        const char *msg = fsdp_error_msg();
        _exit(st == FSDP_STATUS_IO && strstr(msg, "cannot write SVG file") &&
                      strstr(msg, "File too large") && strstr(msg, "was left as it was")
                  ? 0
                  : 1);
    }
    int status;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    char *s = slurp(svg);
    ck_assert_str_eq(s, "<svg>the old chart</svg>\n");
    free(s);
    ck_assert_int_eq(count_entries(dir), 2);
    /* without the limit it is replaced */
    fsdp_plot_info info;
    ck_assert_int_eq(fsdp_plot_metrics(m, svg, &info), FSDP_STATUS_OK);
    s = slurp(svg);
    ck_assert_ptr_nonnull(strstr(s, "fsdp metrics: m.jsonl"));
    free(s);
}
END_TEST

/* The command as a user runs it: `fsdp plot m.jsonl /dev/full` used to
 * report the error and then unlink /dev/full. */
START_TEST(test_cli_plot_outputs)
{
    char dir[128], m[128], args[512], out[4096], fifo[128];
    fsdp_test_mkdir(dir, sizeof dir, "hostile");
    pathf(m, sizeof m, "%s/m.jsonl", dir);
    pathf(fifo, sizeof fifo, "%s/fifo.svg", dir);
    write_text(m, METRICS_OK);
    ck_assert_int_eq(mkfifo(fifo, 0600), 0);
    struct stat full0, sb;
    ck_assert_int_eq(stat("/dev/full", &full0), 0);
    const char *outs[] = {"/dev/full", "/dev/null", fifo, dir};
    for (int i = 0; i < 4; i++) {
        pathf(args, sizeof args, "plot %s %s", m, outs[i]);
        ck_assert_int_eq(fsdp_test_cli(out, sizeof out, "%s", args), 1);
        REQUIRE(strstr(out, "fsdp plot: error: SVG file") && strstr(out, outs[i]) &&
                    strstr(out, "not a regular file"),
                "%s: %s", outs[i], out);
    }
    ck_assert_int_eq(stat("/dev/full", &sb), 0);
    ck_assert(S_ISCHR(sb.st_mode) && sb.st_rdev == full0.st_rdev);
    ck_assert_int_eq(lstat(fifo, &sb), 0);
    ck_assert(S_ISFIFO(sb.st_mode));
    /* a FIFO as the metrics file: refused at once, not waited on */
    pathf(args, sizeof args, "plot %s %s/x.svg", fifo, dir);
    ck_assert_int_eq(fsdp_test_cli(out, sizeof out, "%s", args), 1);
    REQUIRE(strstr(out, "metrics file") && strstr(out, "FIFO"), "%s", out);
    /* the SVG path naming the metrics file is a usage error; the metrics stay */
    pathf(args, sizeof args, "plot %s %s", m, m);
    ck_assert_int_eq(fsdp_test_cli(out, sizeof out, "%s", args), 2);
    REQUIRE(strstr(out, "OUT.svg") && strstr(out, "is the file that METRICS.jsonl reads"), "%s",
            out);
    char *s = slurp(m);
    ck_assert_str_eq(s, METRICS_OK);
    free(s);
    ck_assert_int_eq(count_entries(dir), 2);
    /* and the plan's SVG */
    ck_assert_int_eq(fsdp_test_cli(out, sizeof out, "plan --devices 2 --svg /dev/full"),
                     1);
    REQUIRE(strstr(out, "/dev/full") && strstr(out, "not a regular file"), "%s", out);
    ck_assert_int_eq(stat("/dev/full", &sb), 0);
    ck_assert(S_ISCHR(sb.st_mode));
}
END_TEST

/* ---- checkpoint directories: one run at a time ----------------------------------------- */

/* A child takes the lock and holds it until told (a byte on `go`); it
 * reports having it with a byte on `ready`. */
static pid_t lock_holder_child(const char *dir, int *ready_rd, int *go_wr)
{
    int ready[2], go[2];
    ck_assert_int_eq(pipe(ready), 0);
    ck_assert_int_eq(pipe(go), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        close(ready[0]);
        close(go[1]);
        fsdp_ckpt_lock lk = {0};
        char c = fsdp_ckpt_dir_lock(&lk, dir) == FSDP_STATUS_OK ? 'y' : 'n';
        if (write(ready[1], &c, 1) != 1 || read(go[0], &c, 1) < 0)
            _exit(2);
        if (c == 'k') /* die holding it */
            _exit(0);
        fsdp_ckpt_dir_unlock(&lk);
        _exit(0);
    }
    close(ready[1]);
    close(go[0]);
    char c = 0;
    ck_assert_int_eq(read(ready[0], &c, 1), 1);
    ck_assert_int_eq(c, 'y');
    *ready_rd = ready[0];
    *go_wr = go[1];
    return pid;
}

static void release_child(pid_t pid, int ready_rd, int go_wr, char how)
{
    ck_assert_int_eq(write(go_wr, &how, 1), 1);
    int status;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    close(ready_rd);
    close(go_wr);
}

START_TEST(test_lock_two_processes)
{
    char dir[128], ck[128], lockp[160], host[256], frag[64];
    fsdp_test_mkdir(dir, sizeof dir, "hostile");
    pathf(ck, sizeof ck, "%s/a/ck", dir); /* created with its parents */
    pathf(lockp, sizeof lockp, "%s/" FSDP_CKPT_LOCK_NAME, ck);
    int rd, wr;
    pid_t pid = lock_holder_child(ck, &rd, &wr);
    fsdp_ckpt_lock lk = {0};
    double t0 = now_s();
    ck_assert_int_eq(gethostname(host, sizeof host), 0);
    pathf(frag, sizeof frag, "(pid %d on host ", (int)pid);
    expect_error(fsdp_ckpt_dir_lock(&lk, ck), FSDP_STATUS_IO, "checkpoint directory", ck,
                 "is in use by another fsdp run", frag, ", since ", "choose another --ckpt-dir",
                 NULL);
    ck_assert(!lk.held);
    REQUIRE(now_s() - t0 < 2, "a held lock took %.1f s to report", now_s() - t0);
    fsdp_ckpt_dir_unlock(&lk); /* not held: no-op */
    ck_assert_int_eq(access(lockp, F_OK), 0); /* the holder's file untouched */
    release_child(pid, rd, wr, 'u');
    ck_assert_int_eq(access(lockp, F_OK), -1); /* removed on release */
    ck_assert_int_eq(fsdp_ckpt_dir_lock(&lk, ck), FSDP_STATUS_OK);
    ck_assert(lk.held);
    char *s = slurp(lockp);
    char want[64];
    pathf(want, sizeof want, "pid %d host ", (int)getpid());
    REQUIRE(!strncmp(s, want, strlen(want)) && strstr(s, " since "), "lock file: %s", s);
    free(s);
    /* one lock per open file: a second one in this process fails too */
    fsdp_ckpt_lock lk2 = {0};
    expect_error(fsdp_ckpt_dir_lock(&lk2, ck), FSDP_STATUS_IO, "in use", NULL);
    fsdp_ckpt_dir_unlock(&lk);
    ck_assert(!lk.held);
    ck_assert_int_eq(count_entries(ck), 0);
}
END_TEST

/* A run killed while holding the lock leaves LOCK behind: it blocks
 * nobody; neither does one with someone else's text in it. */
START_TEST(test_lock_stale)
{
    char dir[128], lockp[128];
    fsdp_test_mkdir(dir, sizeof dir, "hostile");
    pathf(lockp, sizeof lockp, "%s/" FSDP_CKPT_LOCK_NAME, dir);
    int rd, wr;
    pid_t pid = lock_holder_child(dir, &rd, &wr);
    release_child(pid, rd, wr, 'k'); /* exits without unlocking */
    ck_assert_int_eq(access(lockp, F_OK), 0);
    fsdp_ckpt_lock lk = {0};
    ck_assert_int_eq(fsdp_ckpt_dir_lock(&lk, dir), FSDP_STATUS_OK);
    fsdp_ckpt_dir_unlock(&lk);
    write_text(lockp, "pid 1 host elsewhere since yesterday\n\x01\xff garbage");
    ck_assert_int_eq(fsdp_ckpt_dir_lock(&lk, dir), FSDP_STATUS_OK);
    char *s = slurp(lockp);
    ck_assert_ptr_null(strstr(s, "garbage")); /* rewritten by the new holder */
    free(s);
    fsdp_ckpt_dir_unlock(&lk);
}
END_TEST

START_TEST(test_lock_hostile_paths)
{
    char dir[128], lockp[128], p[128];
    fsdp_test_mkdir(dir, sizeof dir, "hostile");
    pathf(lockp, sizeof lockp, "%s/" FSDP_CKPT_LOCK_NAME, dir);
    fsdp_ckpt_lock lk = {0};
    /* a FIFO as LOCK: refused, not waited on */
    ck_assert_int_eq(mkfifo(lockp, 0600), 0);
    expect_error(fsdp_ckpt_dir_lock(&lk, dir), FSDP_STATUS_IO, lockp, "not a regular file", NULL);
    ck_assert_int_eq(unlink(lockp), 0);
    /* a symlink as LOCK */
    pathf(p, sizeof p, "%s/elsewhere", dir);
    write_text(p, "");
    ck_assert_int_eq(symlink(p, lockp), 0);
    expect_error(fsdp_ckpt_dir_lock(&lk, dir), FSDP_STATUS_IO, "symbolic link", NULL);
    ck_assert_int_eq(unlink(lockp), 0);
    /* a directory that cannot be created, or is a file */
    expect_error(fsdp_ckpt_dir_lock(&lk, "/proc/nope/ck"), FSDP_STATUS_IO, "/proc/nope", NULL);
    expect_error(fsdp_ckpt_dir_lock(&lk, p), FSDP_STATUS_IO, "not a directory", NULL);
    ck_assert(!lk.held);
}
END_TEST

/* Two processes taking and releasing the lock as fast as they can are
 * never inside together (the release removes the file: the protocol must
 * still exclude a process that opened the old file). */
START_TEST(test_lock_mutual_exclusion)
{
    char dir[128];
    fsdp_test_mkdir(dir, sizeof dir, "hostile");
    int *shared = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    ck_assert(shared != MAP_FAILED);
    enum { N_PROC = 3, ROUNDS = 150 };
    pid_t pids[N_PROC];
    for (int k = 0; k < N_PROC; k++) {
        pids[k] = fork();
        ck_assert_int_ge(pids[k], 0);
        if (pids[k] == 0) {
            int got = 0;
            for (int tries = 0; got < ROUNDS && tries < 200000; tries++) {
                fsdp_ckpt_lock lk = {0};
                if (fsdp_ckpt_dir_lock(&lk, dir) != FSDP_STATUS_OK)
                    continue; /* busy: try again */
                if (__atomic_add_fetch(&shared[0], 1, __ATOMIC_SEQ_CST) != 1)
                    __atomic_store_n(&shared[1], 1, __ATOMIC_SEQ_CST); /* two inside */
                __atomic_sub_fetch(&shared[0], 1, __ATOMIC_SEQ_CST);
                fsdp_ckpt_dir_unlock(&lk);
                got++;
            }
            _exit(got == ROUNDS ? 0 : 3);
        }
    }
    for (int k = 0; k < N_PROC; k++) {
        int status;
        ck_assert_int_eq(waitpid(pids[k], &status, 0), pids[k]);
        REQUIRE(WIFEXITED(status) && WEXITSTATUS(status) == 0, "process %d: status %d", k, status);
    }
    REQUIRE(shared[1] == 0, "two processes held the lock at once");
    munmap(shared, 4096);
    ck_assert_int_eq(count_entries(dir), 0);
}
END_TEST

/* The trainer holds the lock for its run: a second run into the same
 * directory fails at once naming the first; afterwards it runs. */
START_TEST(test_lock_trainer)
{
    char ck[128], frag[64];
    fsdp_test_path(ck, sizeof ck, "ck");
    fsdp_train_config c;
    train_config_cpu(&c, "custom:layers=1,heads=2,channels=16,vocab=256,context=16", 2);
    c.eng.batch = 2;
    c.eng.seq = 8;
    c.steps = 2;
    c.warmup = 0;
    c.n_samples = 0;
    c.ckpt_dir = ck;
    c.resume = true;
    int rd, wr;
    pid_t pid = lock_holder_child(ck, &rd, &wr);
    fsdp_train_result r;
    pathf(frag, sizeof frag, "(pid %d on host ", (int)pid);
    expect_error(fsdp_train_run(&c, &r), FSDP_STATUS_IO, ck, "in use by another fsdp run", frag,
                 NULL);
    fsdp_train_result_free(&r);
    release_child(pid, rd, wr, 'u');
    fsdp_status st = fsdp_train_run(&c, &r);
    REQUIRE(st == FSDP_STATUS_OK, "training failed: %s", fsdp_error_msg());
    ck_assert_int_eq(r.steps, 2);
    fsdp_train_result_free(&r);
    char p[160];
    pathf(p, sizeof p, "%s/step_00000002", ck);
    ck_assert(fsdp_ckpt_is_complete(p));
    ck_assert_int_eq(count_entries(ck), 1); /* the lock file is gone with the run */
}
END_TEST

int main(void)
{
    const fsdp_test_tcase tcases[] = {
        {"read", 60, .tmpdir = true,
         FSDP_TESTS(test_open_regular, test_readers_refuse_special_files, test_line_reader,
                    test_bounded_inputs)},
        {"metrics", 60, .tmpdir = true,
         FSDP_TESTS(test_metrics_nulls_and_gaps, test_metrics_incomplete_last_line,
                    test_metrics_malformed, test_metrics_extreme_values)},
        {"write", 60, .tmpdir = true,
         FSDP_TESTS(test_atomic_regular_and_symlink, test_atomic_refuses_special_paths,
                    test_atomic_failed_write_keeps_old, test_cli_plot_outputs)},
        {"lock", 120, .tmpdir = true,
         FSDP_TESTS(test_lock_two_processes, test_lock_stale, test_lock_hostile_paths,
                    test_lock_mutual_exclusion, test_lock_trainer)},
    };
    return fsdp_test_main("hostile", tcases, FSDP_TEST_LEN(tcases));
}
