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
 * dir; then keep only the `keep` newest complete checkpoints (0: all).
 * Rank 0 only. */
fsdp_status fsdp_ckpt_commit(const char *dir, uint64_t step, int keep);

/* A fresh random 64-bit run id (never 0). */
uint64_t fsdp_ckpt_new_run_id(void);

#endif /* FSDP_CKPT_CKPT_DIR_H */
