/*
 * fileio.c - atomic file writes, directory fsync, growing strings.
 */
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/fileio.h"

fsdp_status fsdp_pread_all(int fd, void *buf, size_t n, uint64_t off, const char *what,
                           const char *path)
{
    char *p = buf;
    while (n > 0) {
        ssize_t k = pread(fd, p, n, (off_t)off);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0)
            return fsdp_error_set(FSDP_STATUS_IO, "cannot read %s '%s' at byte %llu: %s", what,
                                  path, (unsigned long long)off, strerror(errno));
        if (k == 0)
            return fsdp_error_set(FSDP_STATUS_FORMAT,
                                  "%s '%s' ends before byte %llu (truncated while in use?)", what,
                                  path, (unsigned long long)(off + n));
        p += k;
        n -= (size_t)k;
        off += (uint64_t)k;
    }
    return FSDP_STATUS_OK;
}

fsdp_status fsdp_pwrite_all(int fd, const void *buf, size_t n, uint64_t off, const char *what,
                            const char *path)
{
    const char *p = buf;
    while (n > 0) {
        ssize_t k = pwrite(fd, p, n, (off_t)off);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0) {
            bool full = k == 0 || errno == ENOSPC || errno == EDQUOT;
            return fsdp_error_set(FSDP_STATUS_IO, "cannot write %s '%s': %s%s", what, path,
                                  k < 0 ? strerror(errno) : "short write",
                                  full ? " (disk full? free some space or write elsewhere)" : "");
        }
        p += k;
        n -= (size_t)k;
        off += (uint64_t)k;
    }
    return FSDP_STATUS_OK;
}

fsdp_status fsdp_write_file_sync(const char *path, const char *text, size_t n, const char *what)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return fsdp_error_set(FSDP_STATUS_IO, "cannot create %s '%s': %s", what, path,
                              strerror(errno));
    fsdp_status st = fsdp_pwrite_all(fd, text, n, 0, what, path);
    if (st == FSDP_STATUS_OK && fsync(fd) != 0)
        st = fsdp_error_set(FSDP_STATUS_IO, "cannot fsync %s '%s': %s", what, path,
                            strerror(errno));
    if (close(fd) != 0 && st == FSDP_STATUS_OK)
        st = fsdp_error_set(FSDP_STATUS_IO, "cannot close %s '%s': %s", what, path,
                            strerror(errno));
    return st;
}

fsdp_status fsdp_fsync_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return fsdp_error_set(FSDP_STATUS_IO, "cannot open directory '%s' to fsync it: %s", dir,
                              strerror(errno));
    int rc = fsync(fd);
    int err = errno;
    close(fd);
    if (rc != 0)
        return fsdp_error_set(FSDP_STATUS_IO, "cannot fsync directory '%s': %s", dir,
                              strerror(err));
    return FSDP_STATUS_OK;
}

fsdp_status fsdp_atomic_open(fsdp_atomic_file *af, const char *path, const char *what)
{
    af->f = NULL;
    af->path = path;
    if (snprintf(af->tmp, sizeof af->tmp, "%s.tmp.%ld", path, (long)getpid()) >=
        (int)sizeof af->tmp) {
        af->tmp[0] = '\0';
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "%s path '%.64s...' is too long", what,
                              path);
    }
    if (!(af->f = fopen(af->tmp, "wb"))) {
        fsdp_status st = fsdp_error_set(FSDP_STATUS_IO, "cannot create '%s' to write %s '%s': %s",
                                        af->tmp, what, path, strerror(errno));
        af->tmp[0] = '\0';
        return st;
    }
    return FSDP_STATUS_OK;
}

void fsdp_atomic_abort(fsdp_atomic_file *af)
{
    if (af->f)
        fclose(af->f);
    af->f = NULL;
    if (af->tmp[0])
        unlink(af->tmp);
    af->tmp[0] = '\0';
}

fsdp_status fsdp_atomic_commit(fsdp_atomic_file *af, bool write_ok)
{
    fsdp_status st;
    if (!write_ok || fflush(af->f) != 0 || fsync(fileno(af->f)) != 0) {
        st = fsdp_error_set(FSDP_STATUS_IO, "writing '%s' failed: %s (disk full?)", af->tmp,
                            strerror(errno));
        goto fail;
    }
    int rc = fclose(af->f);
    af->f = NULL;
    if (rc != 0) {
        st = fsdp_error_set(FSDP_STATUS_IO, "closing '%s' failed: %s", af->tmp, strerror(errno));
        goto fail;
    }
    if (rename(af->tmp, af->path) != 0) {
        st = fsdp_error_set(FSDP_STATUS_IO, "cannot rename '%s' to '%s': %s", af->tmp, af->path,
                            strerror(errno));
        goto fail;
    }
    af->tmp[0] = '\0';
    char *copy = strdup(af->path);
    if (!copy)
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory");
    st = fsdp_fsync_dir(dirname(copy));
    free(copy);
    return st;
fail:
    fsdp_atomic_abort(af);
    return st;
}

void fsdp_sbuf_printf(fsdp_sbuf *b, const char *fmt, ...)
{
    if (b->oom)
        return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(b->p ? b->p + b->n : NULL, b->p ? b->cap - b->n : 0, fmt, ap);
        va_end(ap);
        if (k < 0) {
            b->oom = true;
            return;
        }
        if (b->p && b->n + (size_t)k < b->cap) {
            b->n += (size_t)k;
            return;
        }
        size_t cap = b->cap ? b->cap * 2 : 4096;
        while (cap < b->n + (size_t)k + 1)
            cap *= 2;
        char *q = realloc(b->p, cap);
        if (!q) {
            b->oom = true;
            return;
        }
        b->p = q;
        b->cap = cap;
    }
}
