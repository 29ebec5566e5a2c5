/*
 * outputs.h - what a training run writes besides checkpoint contents: the
 * checks that its outputs can be created, made before step 1 so that a bad
 * --ckpt-dir, --trace or --log fails at once instead of after the run, and
 * the metrics file (JSON Lines), every write and flush of which is checked.
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
 * dropped. A number that is not finite is written as null, so the file
 * stays JSON. */
typedef struct fsdp_metrics {
    FILE *f;
    const char *path;     /* not copied */
    fsdp_world *world;    /* the FSDP_FAULT_WRITE hook (rank 0), or NULL */
    bool failed;          /* a write failed: every later one is refused */
} fsdp_metrics;

typedef struct fsdp_metrics_record {
    int step;             /* 1-based */
    double loss, lr, grad_norm, tokens, tokens_per_s, step_ms;
    double mfu;           /* < 0: unknown (null) */
    bool skipped;
    int n_ranks;
    const fsdp_rank_stats *stats; /* [n_ranks] */
    bool inter;           /* a job of several nodes: inter_bytes[] too (each device's bytes
                             received from other nodes; comm.h says which rank counts them) */
} fsdp_metrics_record;

/* Open (append: keep what is there, for a resumed run). IO naming the path. */
fsdp_status fsdp_metrics_open(fsdp_metrics *m, const char *path, bool append, fsdp_world *w);

/* Write one record and flush it: IO naming the file, the step and the
 * reason when any part of it could not be written (the file may then end
 * in a partial line); every later call fails the same way. */
fsdp_status fsdp_metrics_write(fsdp_metrics *m, const fsdp_metrics_record *r);

/* Close (m->f NULL is fine): IO if the close found an unwritten buffer. */
fsdp_status fsdp_metrics_close(fsdp_metrics *m);

#endif /* FSDP_TRAIN_OUTPUTS_H */
