/*
 * fileio.h - durable file writes and a growing text buffer, shared by every
 * writer (llm.c and safetensors model files, checkpoints).
 *
 * An atomic file is written under "<path>.tmp.<pid>", then flushed, fsynced,
 * closed, renamed over path, and the parent directory fsynced: a crash at
 * any moment leaves either the old file or the complete new one.
 */
#ifndef FSDP_CORE_FILEIO_H
#define FSDP_CORE_FILEIO_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "core/error.h"

typedef struct fsdp_atomic_file {
    FILE *f;             /* write here between open and commit */
    const char *path;    /* final name (not copied: must outlive the writer) */
    char tmp[4096];
} fsdp_atomic_file;

/* Create the temporary file for `path`; `what` names the file in messages
 * ("model file"). */
fsdp_status fsdp_atomic_open(fsdp_atomic_file *af, const char *path, const char *what);
/* Finish: write_ok says whether every write succeeded; then flush, fsync,
 * close, rename, fsync the directory. On any failure the temporary file is
 * removed and the status says which step failed. */
fsdp_status fsdp_atomic_commit(fsdp_atomic_file *af, bool write_ok);
/* Drop an unfinished file (no-op after commit or if never opened). */
void fsdp_atomic_abort(fsdp_atomic_file *af);

/* Positional I/O of exactly n bytes at byte `off` of fd, retrying short
 * transfers and EINTR. `what` and `path` name the file in messages
 * ("checkpoint file", "model file"). Reading past the end is FORMAT (the
 * file is shorter than its header says: truncated?), other failures IO. */
fsdp_status fsdp_pread_all(int fd, void *buf, size_t n, uint64_t off, const char *what,
                           const char *path);
fsdp_status fsdp_pwrite_all(int fd, const void *buf, size_t n, uint64_t off, const char *what,
                            const char *path);

/* Create (or truncate) `path` holding exactly text[0..n), fsynced and closed.
 * Not atomic: for files inside a directory that is itself renamed into place. */
fsdp_status fsdp_write_file_sync(const char *path, const char *text, size_t n, const char *what);

/* fsync a directory, so renames and creations inside it are durable. */
fsdp_status fsdp_fsync_dir(const char *dir);

/* A growing string; a failed allocation sets oom and later calls do nothing. */
typedef struct fsdp_sbuf {
    char *p;
    size_t n, cap;
    bool oom;
} fsdp_sbuf;

void fsdp_sbuf_printf(fsdp_sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif /* FSDP_CORE_FILEIO_H */
