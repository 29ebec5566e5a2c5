/*
 * fileio.c - opening regular files only, bounded line reading, positional
 * I/O, atomic file writes, directory fsync, growing strings (fileio.h).
 */
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/fileio.h"

static atomic_ullong n_syncs; /* fsync and syncfs calls made here (fsdp_fileio_sync_count) */

uint64_t fsdp_fileio_sync_count(void) { return atomic_load(&n_syncs); }

/* fsync, counted */
static int sync_fd(int fd)
{
    atomic_fetch_add(&n_syncs, 1);
    return fsync(fd);
}

/* "a FIFO (named pipe)" etc., for "<what> '<path>' is ..., not a regular file" */
static const char *file_kind(mode_t mode)
{
    if (S_ISDIR(mode))
        return "a directory";
    if (S_ISFIFO(mode))
        return "a FIFO (named pipe)";
    if (S_ISCHR(mode))
        return "a character device";
    if (S_ISBLK(mode))
        return "a block device";
    if (S_ISSOCK(mode))
        return "a socket";
    return "a special file";
}

static fsdp_status not_regular(const char *what, const char *path, mode_t mode, bool writing)
{
    return fsdp_error_set(FSDP_STATUS_IO,
                          "%s '%s' is %s, not a regular file; %s", what, path, file_kind(mode),
                          writing ? "fsdp left it untouched: give the path of a regular file "
                                    "to create or replace"
                                  : "fsdp reads only regular files: give the path of one");
}

/* ---- reading ----------------------------------------------------------------- */

fsdp_status fsdp_open_regular(const char *path, const char *what, int *fd, uint64_t *size_bytes)
{
    *fd = -1;
    struct stat sb;
    if (stat(path, &sb) != 0)
        return fsdp_error_set(FSDP_STATUS_IO, "cannot open %s '%s': %s", what, path,
                              strerror(errno));
    if (!S_ISREG(sb.st_mode))
        return not_regular(what, path, sb.st_mode, false);
    int k = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (k < 0)
        return fsdp_error_set(FSDP_STATUS_IO, "cannot open %s '%s': %s", what, path,
                              strerror(errno));
    /* the path may have been replaced between stat and open */
    int rc = fstat(k, &sb);
    if (rc != 0 || !S_ISREG(sb.st_mode)) {
        fsdp_status st = rc != 0 ? fsdp_error_set(FSDP_STATUS_IO, "cannot stat %s '%s': %s",
                                                  what, path, strerror(errno))
                                 : not_regular(what, path, sb.st_mode, false);
        close(k);
        return st;
    }
    int fl = fcntl(k, F_GETFL);
    if (fl < 0 || fcntl(k, F_SETFL, fl & ~O_NONBLOCK) != 0) {
        fsdp_status st = fsdp_error_set(FSDP_STATUS_IO, "cannot set up %s '%s' for reading: %s",
                                        what, path, strerror(errno));
        close(k);
        return st;
    }
    if (size_bytes)
        *size_bytes = (uint64_t)sb.st_size;
    *fd = k;
    return FSDP_STATUS_OK;
}

fsdp_status fsdp_fopen_regular(const char *path, const char *what, FILE **f, uint64_t *size_bytes)
{
    int fd;
    *f = NULL;
    FSDP_TRY(fsdp_open_regular(path, what, &fd, size_bytes));
    if (!(*f = fdopen(fd, "rb"))) {
        fsdp_status st = fsdp_error_set(FSDP_STATUS_OOM, "cannot open a stream on %s '%s': %s",
                                        what, path, strerror(errno));
        close(fd);
        return st;
    }
    return FSDP_STATUS_OK;
}

/* "<what> '<path>' is [at least ]<size>, larger than the limit of <max>";
 * size: the file's size, or (growing) what was read of it so far */
static fsdp_status too_large(const char *what, const char *path, uint64_t size, bool growing,
                             uint64_t max_bytes)
{
    char a[32], b[32];
    return fsdp_error_set(FSDP_STATUS_FORMAT,
                          "%s '%s' is %s%s, larger than the limit of %s; is it the right file?",
                          what, path, growing ? "at least " : "",
                          fsdp_fmt_bytes(a, sizeof a, (double)size),
                          fsdp_fmt_bytes(b, sizeof b, (double)max_bytes));
}

fsdp_status fsdp_read_file(const char *path, const char *what, size_t max_bytes, char **buf,
                           size_t *n)
{
    *buf = NULL;
    *n = 0;
    int fd;
    uint64_t size;
    FSDP_TRY(fsdp_open_regular(path, what, &fd, &size));
    if (size > max_bytes) {
        close(fd);
        return too_large(what, path, size, false, max_bytes);
    }
    fsdp_status st = FSDP_STATUS_OK;
    char *b = NULL;
    size_t len = 0, cap = 0;
    /* read to the end, whatever the size said: the file may be changing */
    for (;;) {
        if (len == cap) {
            size_t most = max_bytes + 1; /* one byte more tells it is over */
            cap = !cap ? (size_t)size + 1 : cap * 2 < most ? cap * 2 : most;
            char *nb = realloc(b, cap);
            if (!nb) {
                st = fsdp_error_set(FSDP_STATUS_OOM, "out of host memory reading %s '%s'", what,
                                    path);
                break;
            }
            b = nb;
        }
        ssize_t k = read(fd, b + len, cap - len);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0) {
            st = fsdp_error_set(FSDP_STATUS_IO, "cannot read %s '%s': %s", what, path,
                                strerror(errno));
            break;
        }
        if (k == 0)
            break;
        len += (size_t)k;
        if (len > max_bytes) {
            st = too_large(what, path, len, true, max_bytes);
            break;
        }
    }
    close(fd);
    if (st != FSDP_STATUS_OK) {
        free(b);
        return st;
    }
    b[len] = '\0'; /* the loop ends with len < cap: reads go only into free room */
    *buf = b;
    *n = len;
    return FSDP_STATUS_OK;
}

fsdp_status fsdp_line_reader_open(fsdp_line_reader *lr, const char *path, const char *what,
                                  size_t max_line_bytes, uint64_t max_bytes)
{
    memset(lr, 0, sizeof *lr);
    lr->fd = -1;
    lr->path = path;
    lr->what = what;
    lr->max_line_bytes = max_line_bytes;
    lr->max_bytes = max_bytes;
    uint64_t size;
    FSDP_TRY(fsdp_open_regular(path, what, &lr->fd, &size));
    lr->open = true;
    if (size > max_bytes) {
        fsdp_status st = too_large(lr->what, lr->path, size, false, lr->max_bytes);
        fsdp_line_reader_close(lr);
        return st;
    }
    lr->cap = max_line_bytes < (1u << 16) ? max_line_bytes + 1 : (1u << 16);
    if (!(lr->buf = malloc(lr->cap))) {
        fsdp_line_reader_close(lr);
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory reading %s '%s'", what, path);
    }
    return FSDP_STATUS_OK;
}

static fsdp_status line_too_long(const fsdp_line_reader *lr)
{
    char b[32];
    return fsdp_error_set(FSDP_STATUS_FORMAT,
                          "%s '%s' line %d is longer than %s (the limit for one line); is it "
                          "the right file?",
                          lr->what, lr->path, lr->line_no + 1,
                          fsdp_fmt_bytes(b, sizeof b, (double)lr->max_line_bytes));
}

/* Read more bytes after lr->end, moving the unread ones to the front or
 * growing the buffer (up to one line and its '\n') first. */
static fsdp_status fill(fsdp_line_reader *lr)
{
    if (lr->beg > 0) {
        memmove(lr->buf, lr->buf + lr->beg, lr->end - lr->beg);
        lr->end -= lr->beg;
        lr->beg = 0;
    }
    if (lr->end == lr->cap) {
        size_t most = lr->max_line_bytes + 1;
        size_t cap = lr->cap * 2 < most ? lr->cap * 2 : most;
        char *b = realloc(lr->buf, cap);
        if (!b)
            return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory reading %s '%s'",
                                  lr->what, lr->path);
        lr->buf = b;
        lr->cap = cap;
    }
    ssize_t k;
    do
        k = read(lr->fd, lr->buf + lr->end, lr->cap - lr->end);
    while (k < 0 && errno == EINTR);
    if (k < 0)
        return fsdp_error_set(FSDP_STATUS_IO, "cannot read %s '%s' (line %d): %s", lr->what,
                              lr->path, lr->line_no + 1, strerror(errno));
    if (k == 0)
        lr->eof = true;
    lr->end += (size_t)k;
    lr->n_read += (uint64_t)k;
    if (lr->n_read > lr->max_bytes) /* it grew while being read */
        return too_large(lr->what, lr->path, lr->n_read, true, lr->max_bytes);
    return FSDP_STATUS_OK;
}

fsdp_status fsdp_line_reader_next(fsdp_line_reader *lr, const char **line, size_t *len,
                                  bool *terminated)
{
    *line = NULL;
    *len = 0;
    *terminated = false;
    if (!lr->open)
        return FSDP_STATUS_OK;
    for (;;) {
        char *start = lr->buf + lr->beg;
        size_t avail = lr->end - lr->beg;
        char *nl = memchr(start, '\n', avail);
        size_t n = nl ? (size_t)(nl - start) : avail; /* the line so far */
        if (n > lr->max_line_bytes)
            return line_too_long(lr);
        if (!nl && !lr->eof) {
            FSDP_TRY(fill(lr));
            continue;
        }
        if (!nl && avail == 0)
            return FSDP_STATUS_OK; /* the end */
        *line = start;
        *len = n;
        *terminated = nl != NULL;
        lr->beg += n + (nl != NULL);
        lr->line_no++;
        return FSDP_STATUS_OK;
    }
}

void fsdp_line_reader_close(fsdp_line_reader *lr)
{
    if (lr->open)
        close(lr->fd);
    lr->open = false;
    lr->fd = -1;
    free(lr->buf);
    lr->buf = NULL;
    lr->cap = lr->beg = lr->end = 0;
}

/* ---- positional I/O ----------------------------------------------------------- */

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
    if (st == FSDP_STATUS_OK && sync_fd(fd) != 0)
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
    int rc = sync_fd(fd);
    int err = errno;
    close(fd);
    if (rc != 0)
        return fsdp_error_set(FSDP_STATUS_IO, "cannot fsync directory '%s': %s", dir,
                              strerror(err));
    return FSDP_STATUS_OK;
}

/* ---- writing ----------------------------------------------------------------- */

/* Where a writer of `path` may put its file: dst = path when nothing is
 * there or a regular file is, the file a symlink names when it names a
 * regular file; anything else is refused (see fsdp_atomic_open). *mode is
 * the replaced file's mode, 0 when there is none. */
static fsdp_status output_target(const char *path, const char *what, char *dst, size_t n,
                                 mode_t *mode)
{
    struct stat sb;
    *mode = 0;
    if (lstat(path, &sb) != 0) {
        if (errno != ENOENT)
            return fsdp_error_set(FSDP_STATUS_IO, "cannot check %s path '%s': %s", what, path,
                                  strerror(errno));
        if (snprintf(dst, n, "%s", path) >= (int)n)
            return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "%s path '%.64s...' is too long",
                                  what, path);
        return FSDP_STATUS_OK;
    }
    if (S_ISLNK(sb.st_mode)) {
        char *real = realpath(path, NULL);
        if (!real)
            return fsdp_error_set(FSDP_STATUS_IO,
                                  "%s '%s' is a symbolic link that cannot be followed (%s); "
                                  "fsdp left it untouched: give the path of a regular file",
                                  what, path, strerror(errno));
        int k = snprintf(dst, n, "%s", real);
        free(real);
        if (k >= (int)n)
            return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "%s path '%.64s...' is too long",
                                  what, path);
        if (stat(dst, &sb) != 0)
            return fsdp_error_set(FSDP_STATUS_IO, "cannot check %s path '%s': %s", what, dst,
                                  strerror(errno));
    } else if (snprintf(dst, n, "%s", path) >= (int)n) {
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "%s path '%.64s...' is too long", what,
                              path);
    }
    if (!S_ISREG(sb.st_mode))
        return not_regular(what, path, sb.st_mode, true);
    *mode = sb.st_mode;
    return FSDP_STATUS_OK;
}

fsdp_status fsdp_atomic_open(fsdp_atomic_file *af, const char *path, const char *what)
{
    static atomic_uint counter;
    memset(af, 0, sizeof *af);
    af->path = path;
    af->what = what;
    mode_t mode;
    FSDP_TRY(output_target(path, what, af->dst, sizeof af->dst, &mode));
    /* exclusive creation: never writes through a name that already exists
     * (a leftover of a crash, a link planted there) */
    int fd = -1;
    for (int tries = 0; fd < 0 && tries < 16; tries++) {
        if (snprintf(af->tmp, sizeof af->tmp, "%s.tmp.%ld.%u", af->dst, (long)getpid(),
                     atomic_fetch_add(&counter, 1)) >= (int)sizeof af->tmp) {
            af->tmp[0] = '\0';
            return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "%s path '%.64s...' is too long",
                                  what, path);
        }
        fd = open(af->tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
        if (fd < 0 && errno != EEXIST)
            break;
    }
    if (fd < 0) {
        fsdp_status st = fsdp_error_set(FSDP_STATUS_IO, "cannot create '%s' to write %s '%s': %s",
                                        af->tmp, what, path, strerror(errno));
        af->tmp[0] = '\0';
        return st;
    }
    /* the new file keeps the permissions of the one it replaces (best
     * effort: the default mode is a fine fallback) */
    if (mode)
        (void)fchmod(fd, mode & 07777);
    if (!(af->f = fdopen(fd, "wb"))) {
        fsdp_status st = fsdp_error_set(FSDP_STATUS_OOM, "cannot open a stream on '%s': %s",
                                        af->tmp, strerror(errno));
        close(fd);
        unlink(af->tmp);
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
        unlink(af->tmp); /* our own file: created exclusively by fsdp_atomic_open */
    af->tmp[0] = '\0';
}

fsdp_status fsdp_atomic_close(fsdp_atomic_file *af, bool write_ok, bool sync)
{
    fsdp_status st;
    int err = errno; /* the caller's failed write, if it failed */
    if (!af->f)
        return fsdp_error_set(FSDP_STATUS_INTERNAL, "%s '%s' closed without being open",
                              af->what, af->path);
    if (fflush(af->f) != 0) { /* after an error: retried, so errno is fresh */
        write_ok = false;
        err = errno;
    }
    if (!write_ok || ferror(af->f)) {
        st = fsdp_error_set(FSDP_STATUS_IO,
                            "cannot write %s '%s': %s (disk full? free some space or write "
                            "elsewhere); '%s' was left as it was",
                            af->what, af->path, err ? strerror(err) : "write error", af->path);
        goto fail;
    }
    if (sync && sync_fd(fileno(af->f)) != 0) {
        st = fsdp_error_set(FSDP_STATUS_IO, "cannot fsync %s '%s': %s; '%s' was left as it was",
                            af->what, af->tmp, strerror(errno), af->path);
        goto fail;
    }
    int rc = fclose(af->f);
    af->f = NULL;
    if (rc != 0) {
        st = fsdp_error_set(FSDP_STATUS_IO, "cannot close %s '%s': %s; '%s' was left as it was",
                            af->what, af->tmp, strerror(errno), af->path);
        goto fail;
    }
    return FSDP_STATUS_OK;
fail:
    fsdp_atomic_abort(af);
    return st;
}

/* Rename the closed temporary file tmp over dst, the file `path` led to
 * when it was opened, after checking that it still leads there. On
 * failure tmp is removed. */
static fsdp_status publish(const char *path, const char *what, const char *dst, const char *tmp)
{
    /* something else may have appeared at the path while we wrote */
    char now[4096];
    mode_t mode;
    fsdp_status st = output_target(path, what, now, sizeof now, &mode);
    if (st == FSDP_STATUS_OK && strcmp(now, dst))
        st = fsdp_error_set(FSDP_STATUS_IO, "%s '%s' changed while it was written (it now "
                            "leads to '%s'); fsdp left it untouched", what, path, now);
    if (st == FSDP_STATUS_OK && rename(tmp, dst) != 0)
        st = fsdp_error_set(FSDP_STATUS_IO, "cannot rename '%s' to '%s': %s", tmp, dst,
                            strerror(errno));
    if (st != FSDP_STATUS_OK)
        unlink(tmp); /* our own file: created exclusively by fsdp_atomic_open */
    return st;
}

fsdp_status fsdp_atomic_commit(fsdp_atomic_file *af, bool write_ok)
{
    FSDP_TRY(fsdp_atomic_close(af, write_ok, true));
    fsdp_status st = publish(af->path, af->what, af->dst, af->tmp);
    af->tmp[0] = '\0';
    if (st != FSDP_STATUS_OK)
        return st;
    char dir[sizeof af->dst];
    memcpy(dir, af->dst, sizeof dir);
    return fsdp_fsync_dir(dirname(dir));
}

/* ---- staged files ---------------------------------------------------------------- */

struct fsdp_staged_file {
    char *path, *dst, *tmp; /* as in fsdp_atomic_file; path copied */
};

fsdp_status fsdp_staged_add(fsdp_staged *s, fsdp_atomic_file *af, bool write_ok)
{
    FSDP_TRY(fsdp_atomic_close(af, write_ok, false));
    fsdp_status st = FSDP_STATUS_OK;
    if (s->n == s->cap) {
        int cap = s->cap ? 2 * s->cap : 16;
        struct fsdp_staged_file *f = realloc(s->files, (size_t)cap * sizeof *f);
        if (f) {
            s->files = f;
            s->cap = cap;
        }
    }
    struct fsdp_staged_file *f = s->n < s->cap ? &s->files[s->n] : NULL;
    if (f && (f->path = strdup(af->path)) && (f->dst = strdup(af->dst)) &&
        (f->tmp = strdup(af->tmp))) {
        s->n++;
    } else {
        if (f) {
            free(f->path);
            free(f->dst);
        }
        st = fsdp_error_set(FSDP_STATUS_OOM, "out of host memory keeping %s '%s'", af->what,
                            af->path);
        unlink(af->tmp);
    }
    af->tmp[0] = '\0'; /* the file is s's now (or gone) */
    return st;
}

/* Free s's list; remove the temporary files from index `from` on. */
static void staged_free(fsdp_staged *s, int from)
{
    for (int i = 0; i < s->n; i++) {
        if (i >= from)
            unlink(s->files[i].tmp);
        free(s->files[i].path);
        free(s->files[i].dst);
        free(s->files[i].tmp);
    }
    free(s->files);
    s->files = NULL;
    s->n = s->cap = 0;
}

fsdp_status fsdp_staged_publish(fsdp_staged *s, const char *what)
{
    fsdp_status st = FSDP_STATUS_OK;
    int i = 0;
    if (s->n > 0) { /* one sync of the filesystem instead of one fsync per file */
        int fd = open(s->files[0].tmp, O_RDONLY | O_CLOEXEC);
        atomic_fetch_add(&n_syncs, 1);
        if (fd < 0 || syncfs(fd) != 0)
            st = fsdp_error_set(FSDP_STATUS_IO, "cannot sync the %s written to '%s': %s; "
                                "nothing was replaced", what, s->files[0].path,
                                strerror(errno));
        if (fd >= 0)
            close(fd);
    }
    char dir[4096] = "", next[4096];
    for (; st == FSDP_STATUS_OK && i < s->n; i++) {
        const struct fsdp_staged_file *f = &s->files[i];
        st = publish(f->path, what, f->dst, f->tmp);
        char d[4096];
        snprintf(d, sizeof d, "%s", f->dst);
        snprintf(next, sizeof next, "%s", dirname(d));
        if (dir[0] && strcmp(dir, next) && st == FSDP_STATUS_OK)
            st = fsdp_fsync_dir(dir); /* each directory once, after its last rename */
        snprintf(dir, sizeof dir, "%s", next);
    }
    if (st == FSDP_STATUS_OK && dir[0])
        st = fsdp_fsync_dir(dir);
    staged_free(s, i); /* a failed publish removed its own file */
    return st;
}

void fsdp_staged_abort(fsdp_staged *s) { staged_free(s, 0); }

/* Room for `more` bytes and a NUL after b->n; false (oom set) when the
 * memory is not there. */
static bool sbuf_reserve(fsdp_sbuf *b, size_t more)
{
    if (b->oom)
        return false;
    if (b->p && b->n + more < b->cap)
        return true;
    if (more >= SIZE_MAX / 2 - b->n) {
        b->oom = true;
        return false;
    }
    size_t cap = b->cap ? b->cap * 2 : 4096;
    while (cap < b->n + more + 1)
        cap *= 2;
    char *q = realloc(b->p, cap);
    if (!q) {
        b->oom = true;
        return false;
    }
    b->p = q;
    b->cap = cap;
    return true;
}

void fsdp_sbuf_printf(fsdp_sbuf *b, const char *fmt, ...)
{
    for (size_t need = 0;;) {
        if (!sbuf_reserve(b, need))
            return;
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(b->p + b->n, b->cap - b->n, fmt, ap);
        va_end(ap);
        if (k < 0) {
            b->oom = true;
            return;
        }
        if (b->n + (size_t)k < b->cap) {
            b->n += (size_t)k;
            return;
        }
        need = (size_t)k;
    }
}

void fsdp_sbuf_put(fsdp_sbuf *b, const void *data, size_t n)
{
    if (!sbuf_reserve(b, n))
        return;
    if (n)
        memcpy(b->p + b->n, data, n);
    b->n += n;
    b->p[b->n] = '\0';
}
