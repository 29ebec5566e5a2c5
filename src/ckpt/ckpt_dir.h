/*
 * ckpt_dir.h - checkpoint directories: DIR/step_NNNNNNNN/ with a DONE marker
 * written last, found, begun and committed atomically, and pruned.
 *
 * Atomicity: a checkpoint is written into DIR/step_00000010.tmp; every file
 * in it is fsynced, then DONE is written and fsynced, the directory is
 * fsynced and renamed to its final name, and DIR is fsynced. Only
 * directories named exactly step_<digits> that contain DONE are complete;
 * anything else (a *.tmp left by a crash, a *.old being deleted, a step
 * directory without DONE) is ignored by fsdp_ckpt_latest, and *.tmp / *.old
 * are removed by the next fsdp_ckpt_begin. A crash at any point therefore
 * leaves every earlier complete checkpoint loadable.
 *
 * One run at a time: a run holds DIR/LOCK (fsdp_ckpt_dir_lock) while it
 * writes checkpoints, so a second run into the same directory fails at
 * once, naming the first one's pid and host.
 */
#ifndef FSDP_CKPT_CKPT_DIR_H
#define FSDP_CKPT_CKPT_DIR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/error.h"

#define FSDP_CKPT_PATH_MAX 4096

/* ---- directories ----------------------------------------------------------- */

/* "DIR/step_%08llu" + suffix ("" or ".tmp"); INVALID_ARG if too long. */
fsdp_status fsdp_ckpt_step_path(char *out, size_t n, const char *dir, uint64_t step,
                                const char *suffix);
/* "CKPT/rank_%05d.bin" */
fsdp_status fsdp_ckpt_rank_path(char *out, size_t n, const char *ckpt, int rank);

/* True if `ckpt` is a directory holding a DONE marker. */
bool fsdp_ckpt_is_complete(const char *ckpt);

/* Newest complete checkpoint in dir: *found = false when there is none (or
 * dir does not exist). Incomplete directories are skipped. IO error only
 * when dir exists but cannot be listed. */
fsdp_status fsdp_ckpt_latest(const char *dir, uint64_t *step, bool *found);

/* Start writing checkpoint `step`: create dir (and its parents) if needed,
 * remove leftovers of interrupted saves (step_*.tmp, step_*.old), and
 * create an empty DIR/step_<step>.tmp. Rank 0 only, before the ranks write. */
fsdp_status fsdp_ckpt_begin(const char *dir, uint64_t step);

/* Finish checkpoint `step` once every file in the .tmp directory is
 * written and fsynced: write DONE, fsync, rename to the final name (a
 * complete checkpoint of the same step already there is replaced), fsync
 * dir; then keep only the `keep` newest complete checkpoints (0: all),
 * and the one DIR/BEST names besides them. Rank 0 only. */
fsdp_status fsdp_ckpt_commit(const char *dir, uint64_t step, int keep);

/* ---- the best checkpoint (--keep-best) ---------------------------------------- */

/* DIR/BEST: "step N\neval_loss X\n", the checkpoint with the lowest
 * held-out loss so far. fsdp_ckpt_commit never prunes step N. */
#define FSDP_CKPT_BEST_NAME "BEST"

/* Record step `step` (complete already) as the best, with its loss:
 * written beside, fsynced and renamed over DIR/BEST. Rank 0 only. */
fsdp_status fsdp_ckpt_best_write(const char *dir, uint64_t step, double loss);

/* DIR/BEST's step and loss; *found false when there is none. FORMAT
 * naming the file when it does not read as written. */
fsdp_status fsdp_ckpt_best_read(const char *dir, uint64_t *step, double *loss, bool *found);

/* ---- one run per directory ----------------------------------------------------- */

/* The lock file inside a checkpoint directory. */
#define FSDP_CKPT_LOCK_NAME "LOCK"

/* An exclusive lock on a checkpoint directory, held by an open descriptor
 * of DIR/LOCK (flock). Zero-initialised means "not held". */
typedef struct fsdp_ckpt_lock {
    int fd;
    bool held;
    char path[FSDP_CKPT_PATH_MAX]; /* DIR/LOCK */
} fsdp_ckpt_lock;

/* Take the lock on `dir` (created with its parents if needed) for the
 * lifetime of a run that writes checkpoints there, so two runs never write
 * (or prune) one directory at once. Never blocks: when another process
 * holds it, fails at once with IO "checkpoint directory 'D' is in use by
 * another fsdp run (pid P on host H, since T); wait for it to finish or
 * choose another --ckpt-dir". The holder writes "pid P host H since T"
 * into the lock file once it has the lock.
 *
 * The kernel drops a flock when its holder dies, so the LOCK file a
 * killed run leaves behind never blocks the next run. fsdp_ckpt_dir_unlock
 * removes the file while still holding the lock; a process that opened
 * the file just before then finds, once it gets the lock, that the path no
 * longer names what it locked, and starts over.
 *
 * Also refused: a LOCK that is not a regular file (IO), a directory that
 * cannot be created or written (IO, naming it: the run would fail at its
 * first checkpoint otherwise), a filesystem without flock (IO). The lock
 * is per open file: a second lock of the same directory in the same
 * process also fails. The descriptor is close-on-exec. */
fsdp_status fsdp_ckpt_dir_lock(fsdp_ckpt_lock *lk, const char *dir);

/* Remove the lock file and release the lock; no-op when not held. */
void fsdp_ckpt_dir_unlock(fsdp_ckpt_lock *lk);

/* ---- run ids ------------------------------------------------------------------- */

/* A fresh random 64-bit run id (never 0). */
uint64_t fsdp_ckpt_new_run_id(void);

#endif /* FSDP_CKPT_CKPT_DIR_H */
