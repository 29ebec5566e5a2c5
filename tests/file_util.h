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
#include <fcntl.h>
#include <ftw.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* A passing REQUIRE costs nothing (Check reports every passing ck_assert). */
#define REQUIRE(cond, ...)             \
    do {                               \
        if (!(cond))                   \
            ck_abort_msg(__VA_ARGS__); \
    } while (0)

/* A fresh directory /tmp/fsdp_test_<tag>_XXXXXX in buf. */
static inline void make_tmpdir_tag(char *buf, size_t n, const char *tag)
{
    snprintf(buf, n, "/tmp/fsdp_test_%s_XXXXXX", tag);
    ck_assert_ptr_nonnull(mkdtemp(buf));
}

static inline int rm_entry(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb, (void)flag, (void)ftw;
    return remove(p);
}

/* Remove dir and everything below it (no symlinks followed). */
static inline void rm_rf(const char *dir) { nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS); }

static inline bool exists(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0;
}

/* snprintf that fails the test instead of truncating. */
static inline void pathf(char *out, size_t n, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static inline void pathf(char *out, size_t n, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(out, n, fmt, ap);
    va_end(ap);
    REQUIRE(k > 0 && (size_t)k < n, "path too long");
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
    FILE *f = fopen(path, "rb");
    REQUIRE(f, "open %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    REQUIRE(b && fread(b, 1, (size_t)n, f) == (size_t)n, "read %s", path);
    b[n] = '\0';
    fclose(f);
    if (size)
        *size = (size_t)n;
    return b;
}

static inline char *slurp(const char *path) { return slurp_n(path, NULL); }

static inline void spit(const char *path, const char *text, size_t n)
{
    FILE *f = fopen(path, "wb");
    REQUIRE(f && fwrite(text, 1, n, f) == n, "write %s", path);
    ck_assert_int_eq(fclose(f), 0);
}

#endif /* FSDP_TESTS_FILE_UTIL_H */
