/*
 * outputs.h - what a training run writes besides checkpoint contents: the
 * checks that its outputs can be created, made before step 1 so that a bad
 * --ckpt-dir, --trace or --log fails at once instead of after the run, the
 * metrics file (JSON Lines), every write and flush of which is checked, and
 * the table through which the caller adds other writers of the same
 * figures (TensorBoard event files, report/tensorboard.h) without the
 * trainer knowing their formats.
 */
#ifndef FSDP_TRAIN_OUTPUTS_H
#define FSDP_TRAIN_OUTPUTS_H

#include <stdbool.h>
#include <stdio.h>

#include "core/world.h"
#include "engine/engine.h"

/* Create directory `dir` and its parents if needed, and check that a file
 * can be created in it (one is created and removed again). `what` names it
 * in the message ("--ckpt-dir"). IO naming the path and the reason. */
fsdp_status fsdp_output_dir_check(const char *dir, const char *what);

/* Check that `path` can be written later: not a directory, and when it
 * does not exist yet, a file can be created in its directory (one is
 * created and removed again). Nothing at `path` is created or changed. */
fsdp_status fsdp_output_file_check(const char *path, const char *what);

/* Where process q writes what it alone knows of a run's file `path` (the
 * trace of its ranks): path itself on process 0, "NAME.q.EXT" ("NAME.q")
 * on the others. */
void fsdp_output_process_path(const char *path, int q, char *out, size_t n);

/* Where process q writes the stall watchdog's flight record (core/flight.h):
 * beside the metrics file, "NAME.flight.json" for --log NAME.EXT, else
 * "fsdp_flight.json" in the working directory; process q > 0 with ".q"
 * before ".json" (fsdp_output_process_path). */
void fsdp_output_flight_path(const char *log_path, int q, char *out, size_t n);

/* The metrics file: one JSON object per step (docs/metrics.md: step, loss, lr,
 * grad_norm, tokens, tokens_per_s, step_ms, mfu, peak_bytes[],
 * comm_bytes[], host_bytes[]), "skipped": true for a step whose update was
 * dropped, "eval_loss" on a step followed by an evaluation, and
 * "resumed_from": S on the first line of a run resumed from the
 * checkpoint of step S. A number that is not finite is written as null,
 * so the file stays JSON. */
typedef struct fsdp_metrics_file {
    FILE *f;
    const char *path;     /* not copied */
    fsdp_world *world;    /* the FSDP_FAULT_WRITE hook (rank 0), or NULL */
    bool failed;          /* a write failed: every later one is refused */
} fsdp_metrics_file;

typedef struct fsdp_metrics_record {
    int step;             /* 1-based */
    double loss, lr, grad_norm, tokens, tokens_per_s, step_ms;
    double mfu;           /* < 0: unknown (null) */
    bool skipped;
    int n_ranks;
    const fsdp_rank_stats *stats; /* [n_ranks] */
    bool inter;           /* a job of several nodes: inter_bytes[] too (each device's bytes
                             received from other nodes; comm.h says which rank counts them) */
    bool has_eval;        /* eval_loss holds the held-out loss measured after this step */
    double eval_loss;
    int resumed_from;     /* > 0: the first record of a run resumed from this step */
} fsdp_metrics_record;

/* Open (append: keep what is there, for a resumed run). IO naming the path. */
fsdp_status fsdp_metrics_open(fsdp_metrics_file *m, const char *path, bool append, fsdp_world *w);

/* Write one record and flush it: IO naming the file, the step and the
 * reason when any part of it could not be written (the file may then end
 * in a partial line); every later call fails the same way. */
fsdp_status fsdp_metrics_write(fsdp_metrics_file *m, const fsdp_metrics_record *r);

/* Close (m->f NULL is fine): IO if the close found an unwritten buffer. */
fsdp_status fsdp_metrics_close(fsdp_metrics_file *m);

/* ---- other writers of the figures ----------------------------------------------- */

/* A writer of the run's figures in another format, given by the caller
 * (fsdp_train_config.sink). The trainer calls it on process 0 only, from
 * one thread at a time (the main thread, or rank 0's), in this order:
 * open once before step 1, write after each step that counts (the record
 * --log gets), eval for the held-out figures measured after the last step,
 * close once whether or not the run succeeded (also when open failed).
 * A failed open fails the run before step 1; a failed write or eval stops
 * it as a failed metrics write does (after the step, with a checkpoint).
 * Every slot is required and returns a status with its message set. */
typedef struct fsdp_metrics_sink_i {
    /* The run goes on after `done` steps (0: a fresh run; S: resumed from
     * the checkpoint of step S, so that steps after S written by an
     * earlier run are stale). */
    fsdp_status (*open)(void *self, int done);
    fsdp_status (*write)(void *self, const fsdp_metrics_record *r);
    /* A held-out figure measured after step `step`: `name` is "accuracy"
     * (the synthetic task's exact-match fraction, in [0, 1]). */
    fsdp_status (*eval)(void *self, int step, const char *name, double value);
    fsdp_status (*close)(void *self);
} fsdp_metrics_sink_i;

typedef struct fsdp_metrics_sink {
    const fsdp_metrics_sink_i *iface;
    void *self;
} fsdp_metrics_sink;

#endif /* FSDP_TRAIN_OUTPUTS_H */
