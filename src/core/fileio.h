/*
 * fileio.h - how fsdp opens, reads and writes files, shared by every reader
 * and writer (model files, checkpoints, metrics, reports), so that no file
 * operation can hang on a FIFO, grow without bound, or destroy what the
 * user had at a path.
 *
 * Readers open through fsdp_open_regular (or fsdp_fopen_regular): only
 * regular files (a symlink to one is fine) are read; a FIFO, device node,
 * directory or socket is refused with one message form, before any read
 * can block. Line-oriented readers use fsdp_line_reader, which bounds both
 * the length of one line and the total bytes read.
 *
 * Writers of whole files go through the atomic writer: the file is written
 * under a temporary name in the same directory, then flushed, fsynced,
 * closed, renamed over the path, and the directory fsynced: a crash at any
 * moment leaves either the old file or the complete new one. It only ever
 * replaces a regular file (or creates a new one); anything else at the path
 * is refused and left as it was, and on failure only its own temporary
 * file is removed. Many files that belong together (token shards) are
 * staged: each written the same way, all renamed at the end after one sync
 * of the filesystem.
 */
#ifndef FSDP_CORE_FILEIO_H
#define FSDP_CORE_FILEIO_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "core/error.h"

/* ---- reading ---------------------------------------------------------------- */

/* Open `path` read-only, but only if it is a regular file (symlinks are
 * followed). `what` names the file in messages ("metrics file").
 *
 * How: stat first (so a device node is never opened at all: opening some
 * has side effects), open with O_NONBLOCK (so a FIFO swapped in meanwhile
 * cannot block the open), re-check the opened file with fstat, then clear
 * O_NONBLOCK. The descriptor is close-on-exec; the caller closes it.
 *
 * Errors: IO "cannot open <what> '<path>': <reason>" when it is missing or
 * unreadable; IO "<what> '<path>' is a FIFO (named pipe), not a regular
 * file; ..." (or a directory, a character device, a block device, a
 * socket). *fd is -1 on error. size_bytes (may be NULL) receives the file's
 * size at open. */
fsdp_status fsdp_open_regular(const char *path, const char *what, int *fd, uint64_t *size_bytes);

/* The same as a stdio stream ("rb"); the caller fcloses it. *f is NULL on
 * error. */
fsdp_status fsdp_fopen_regular(const char *path, const char *what, FILE **f,
                               uint64_t *size_bytes);

/* The whole of the regular file `path` (opened as fsdp_open_regular does)
 * in a new buffer *buf of *n bytes and a NUL after them; the caller frees
 * it. Reads to the end whatever the size said at open (the file may be
 * changing) and at most max_bytes + 1 bytes. Errors: those of
 * fsdp_open_regular; FORMAT "<what> '<path>' is [at least ]<size>, larger
 * than the limit of <max_bytes>; is it the right file?"; OOM; IO. *buf is
 * NULL on error. */
fsdp_status fsdp_read_file(const char *path, const char *what, size_t max_bytes, char **buf,
                           size_t *n);

/* Lines of a regular file, read in chunks with two bounds, so a hostile
 * or wrong file (a disk image, one endless line) costs at most about
 * max_line_bytes of memory and max_bytes of reading before a clear error.
 * Lines may hold any byte (NUL included); "\r\n" is left to the caller.
 * Zero-initialised means closed. */
typedef struct fsdp_line_reader {
    int fd;
    bool open, eof;
    const char *path, *what;  /* not copied: must outlive the reader */
    size_t max_line_bytes;    /* longest line accepted, without its '\n' */
    uint64_t max_bytes;       /* most bytes read from the file */
    uint64_t n_read;
    char *buf;                /* (cap,): unread bytes at [beg, end) */
    size_t cap, beg, end;
    int line_no;              /* 1-based number of the line last returned */
} fsdp_line_reader;

/* Open `path` (fsdp_open_regular's checks and messages). A file already
 * larger than max_bytes is refused at once: FORMAT "<what> '<path>' is
 * <size>, larger than the limit of <max>". */
fsdp_status fsdp_line_reader_open(fsdp_line_reader *lr, const char *path, const char *what,
                                  size_t max_line_bytes, uint64_t max_bytes);

/* Next line: *line points into the reader's buffer (valid until the next
 * call), *len excludes the '\n', *terminated is false only for a last line
 * that lacks its '\n' (a file still being written, or cut short). At the
 * end of the file returns OK with *line = NULL. Errors: IO (read failed),
 * FORMAT naming the line number and the limit when a line is longer than
 * max_line_bytes or the file grows past max_bytes while being read. */
fsdp_status fsdp_line_reader_next(fsdp_line_reader *lr, const char **line, size_t *len,
                                  bool *terminated);

/* Close and free; no-op when never opened or already closed. */
void fsdp_line_reader_close(fsdp_line_reader *lr);

/* Positional I/O of exactly n bytes at byte `off` of fd, retrying short
 * transfers and EINTR. `what` and `path` name the file in messages
 * ("checkpoint file", "model file"). Reading past the end is FORMAT (the
 * file is shorter than its header says: truncated?), other failures IO. */
fsdp_status fsdp_pread_all(int fd, void *buf, size_t n, uint64_t off, const char *what,
                           const char *path);
fsdp_status fsdp_pwrite_all(int fd, const void *buf, size_t n, uint64_t off, const char *what,
                            const char *path);

/* ---- writing ---------------------------------------------------------------- */

/* Zero-initialised means "not open" (fsdp_atomic_abort is then a no-op). */
typedef struct fsdp_atomic_file {
    FILE *f;             /* write here between open and commit */
    const char *path;    /* the name given (not copied: must outlive the writer) */
    const char *what;
    char dst[4096];      /* the file replaced: path, or the regular file a symlink names */
    char tmp[4096];      /* "<dst>.tmp.<pid>.<k>" while open, else "" */
} fsdp_atomic_file;

/* Create the temporary file for `path`; `what` names the file in messages
 * ("model file"). Refuses, leaving it untouched, a path that exists and is
 * not a regular file (a device node such as /dev/full or /dev/null, a FIFO,
 * a directory, a socket, a symlink to one of those or to nothing): IO
 * "<what> '<path>' is a character device, not a regular file; ...". A
 * symlink to a regular file is followed: the file it names is replaced and
 * the link kept. The temporary file is created exclusively (never through
 * an existing name) next to that file and takes the replaced file's
 * permission bits. */
fsdp_status fsdp_atomic_open(fsdp_atomic_file *af, const char *path, const char *what);

/* Finish: write_ok says whether every write succeeded; then flush, fsync,
 * close, check the path again (the same refusal as open, should something
 * else have appeared there meanwhile), rename, fsync the directory. On any
 * failure the temporary file is removed, whatever was at the path is left
 * as it was, and the status (IO) says which step failed. */
fsdp_status fsdp_atomic_commit(fsdp_atomic_file *af, bool write_ok);

/* Drop an unfinished file: close and remove the temporary file (no-op
 * after commit or if never opened). Never touches the path itself. */
void fsdp_atomic_abort(fsdp_atomic_file *af);

/* The first half of commit: flush, fsync when sync, close; the temporary
 * file stays (af->tmp) and nothing at the path changes. On failure the
 * temporary file is removed and the status is commit's. */
fsdp_status fsdp_atomic_close(fsdp_atomic_file *af, bool write_ok, bool sync);

/* ---- staged files ------------------------------------------------------------ */

/* Files written with the atomic writer and put in place together at the
 * end (fsdp tokenize's shards): until fsdp_staged_publish nothing at any
 * of their paths has changed, so a run that fails leaves every file it
 * would have replaced as it was. Publishing syncs the filesystem once
 * (syncfs) instead of once per file, and each directory once.
 * Zero-initialised: empty. */
typedef struct fsdp_staged {
    struct fsdp_staged_file *files; /* (n,) */
    int n, cap;
} fsdp_staged;

/* Close af (fsdp_atomic_close without fsync) and keep its temporary file
 * in s; af is closed afterwards either way. OOM or commit's IO errors (the
 * temporary file is then removed). */
fsdp_status fsdp_staged_add(fsdp_staged *s, fsdp_atomic_file *af, bool write_ok);

/* Sync, then rename each file over its path in the order added (commit's
 * checks first: only a regular file is replaced), then fsync their
 * directories. The first failure stops it: the files renamed before it are
 * in place (each complete), the rest are removed. Empties s. `what` names
 * the files in messages ("token shards"). */
fsdp_status fsdp_staged_publish(fsdp_staged *s, const char *what);

/* Remove every temporary file of s and empty it. */
void fsdp_staged_abort(fsdp_staged *s);

/* Create (or truncate) `path` holding exactly text[0..n), fsynced and closed.
 * Not atomic: for files inside a directory that is itself renamed into place. */
fsdp_status fsdp_write_file_sync(const char *path, const char *text, size_t n, const char *what);

/* fsync a directory, so renames and creations inside it are durable. */
fsdp_status fsdp_fsync_dir(const char *dir);

/* How many fsync and syncfs calls this file's functions made in this
 * process (for tests: what a batch of files costs). */
uint64_t fsdp_fileio_sync_count(void);

/* ---- strings ----------------------------------------------------------------- */

/* A growing string; a failed allocation sets oom and later calls do nothing. */
typedef struct fsdp_sbuf {
    char *p;
    size_t n, cap;
    bool oom;
} fsdp_sbuf;

void fsdp_sbuf_printf(fsdp_sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Append n bytes (any bytes, NULs included); b->p stays NUL-terminated after them. */
void fsdp_sbuf_put(fsdp_sbuf *b, const void *data, size_t n);

#endif /* FSDP_CORE_FILEIO_H */
