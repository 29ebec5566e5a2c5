/*
 * file_util.h - small file helpers for the test suites that build and then
 * damage files (checkpoints, shard files): temporary directories, byte
 * surgery, whole-file reads and writes. Header-only (static inline), so a
 * suite includes it without a build change; every helper aborts the
 * running Check test on failure.
 */
#ifndef FSDP_TESTS_FILE_UTIL_H
#define FSDP_TESTS_FILE_UTIL_H

#include <check.h>
#include <dirent.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <signal.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "testutil.h"

static inline bool exists(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0;
}

/* XOR one byte (0x5a), counted from the start or the end of the file. */
static inline void flip_byte(const char *path, long off_from_end_or_start, bool from_end)
{
    int fd = open(path, O_RDWR);
    REQUIRE(fd >= 0, "open %s", path);
    off_t size = lseek(fd, 0, SEEK_END);
    off_t off = from_end ? size - off_from_end_or_start : off_from_end_or_start;
    unsigned char c;
    REQUIRE(pread(fd, &c, 1, off) == 1, "read %s", path);
    c ^= 0x5a;
    REQUIRE(pwrite(fd, &c, 1, off) == 1, "write %s", path);
    close(fd);
}

/* Overwrite a little-endian u32 at `off`. */
static inline void set_u32(const char *path, off_t off, uint32_t v)
{
    int fd = open(path, O_RDWR);
    REQUIRE(fd >= 0 && pwrite(fd, &v, 4, off) == 4, "write %s", path);
    close(fd);
}

static inline void copy_file(const char *src, const char *dst)
{
    FILE *a = fopen(src, "rb"), *b = fopen(dst, "wb");
    REQUIRE(a && b, "copy %s -> %s", src, dst);
    char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, a)) > 0)
        REQUIRE(fwrite(buf, 1, n, b) == n, "copy");
    fclose(a);
    ck_assert_int_eq(fclose(b), 0);
}

/* The whole file, NUL-terminated (malloc'd); its size in *size if given. */
static inline char *slurp_n(const char *path, size_t *size)
{
    return fsdp_test_read_file(path, size);
}

static inline char *slurp(const char *path) { return slurp_n(path, NULL); }

/* path replaced by the n bytes at data. */
static inline void spit(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    REQUIRE(f && fwrite(data, 1, n, f) == n, "write %s", path);
    ck_assert_int_eq(fclose(f), 0);
}

/* Entries in dir other than . and .. */
static inline int count_entries(const char *dir)
{
    DIR *d = opendir(dir);
    REQUIRE(d, "open directory %s", dir);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    closedir(d);
    return n;
}

/* text with its first `old` replaced by `new` (malloc'd); text must hold
 * old. */
static inline char *mutate(const char *text, const char *old, const char *new)
{
    const char *p = strstr(text, old);
    REQUIRE(p, "text lacks '%s'", old);
    size_t a = (size_t)(p - text), n = strlen(text), lo = strlen(old), ln = strlen(new);
    char *out = malloc(n - lo + ln + 1);
    ck_assert_ptr_nonnull(out);
    memcpy(out, text, a);
    memcpy(out + a, new, ln);
    memcpy(out + a + ln, p + lo, n - a - lo + 1);
    return out;
}

/* Newlines in the file (0 if it cannot be opened: not written yet). */
static inline int count_lines(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    int n = 0, ch;
    while ((ch = fgetc(f)) != EOF)
        n += ch == '\n';
    fclose(f);
    return n;
}

/* fn(arg) in a child process whose files may not grow past limit bytes (a
 * write past it fails with EFBIG, "File too large", instead of raising
 * SIGXFSZ): whether fn returned true. The test's own process, and Check's
 * reporting, stay without a limit. */
static inline bool in_child_with_file_limit(rlim_t limit, bool (*fn)(void *), void *arg)
{
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        signal(SIGXFSZ, SIG_IGN);
        struct rlimit rl = {.rlim_cur = limit, .rlim_max = limit};
        setrlimit(RLIMIT_FSIZE, &rl);
        _exit(fn(arg) ? 0 : 1);
    }
    int status;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

#endif /* FSDP_TESTS_FILE_UTIL_H */
