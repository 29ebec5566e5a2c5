/*
 * tensorboard.h - TensorBoard event files: `fsdp train --tensorboard DIR`
 * writes the figures of --log as scalar summaries that TensorBoard reads
 * (docs/metrics.md lists the tags).
 *
 * A file DIR/events.out.tfevents.<unix seconds>.<host>.<nanoseconds> (a
 * name TensorBoard recognises by "tfevents"; names sort in the order runs
 * began, which is the order TensorBoard reads a directory's files in) is a
 * sequence of TFRecords, each
 *
 *     uint64 length, uint32 masked CRC-32C of those 8 bytes,
 *     the data (length bytes), uint32 masked CRC-32C of the data
 *
 * (little-endian; the mask is core/crc32c.h's), whose data is one `Event`
 * protocol buffer (tensorboard's event.proto and summary.proto):
 *
 *     Event      { double wall_time = 1; int64 step = 2; string file_version = 3;
 *                  Summary summary = 5; SessionLog session_log = 7; }
 *     Summary    { repeated Value value = 1; }
 *     Value      { string tag = 1; float simple_value = 2; }
 *     SessionLog { SessionStatus status = 1; }   (START = 1)
 *
 * A file holds, in order: the file_version event ("brain.Event:2"), a
 * SessionLog START at the run's first step, then one event per step with
 * all of that step's scalars. On START, TensorBoard drops what earlier
 * files of the directory hold at that step and after it: a run resumed
 * from a checkpoint at step S writes a new file starting at S + 1, and the
 * steps an interrupted run logged past its checkpoint disappear, as they
 * do from the run's history. Fields equal to zero are left out, as
 * protobuf's own encoders do.
 */
#ifndef FSDP_REPORT_TENSORBOARD_H
#define FSDP_REPORT_TENSORBOARD_H

#include <stdint.h>

#include "core/fileio.h"
#include "train/outputs.h"

#define FSDP_TBOARD_FILE_VERSION "brain.Event:2"

/* One scalar of an event: tag (e.g. "train/loss") and its value. */
typedef struct fsdp_tboard_scalar {
    const char *tag;
    float value;
} fsdp_tboard_scalar;

/* ---- encoding (what the writer below uses; tests check it against tensorboard's own) ---- */

/* The TFRecord frame of n data bytes: the header (length, its masked CRC)
 * and the footer (the data's masked CRC). */
void fsdp_tfrecord_frame(const void *data, size_t n, unsigned char header[12],
                         unsigned char footer[4]);

/* Append one Event's protocol-buffer bytes to b (b->oom on failure):
 * the file_version event; a SessionLog START at `step`; the scalars v[0..n)
 * of `step` in one Summary. */
void fsdp_tboard_event_version(fsdp_sbuf *b, double wall_time);
void fsdp_tboard_event_start(fsdp_sbuf *b, double wall_time, int64_t step);
void fsdp_tboard_event_scalars(fsdp_sbuf *b, double wall_time, int64_t step,
                               const fsdp_tboard_scalar *v, int n);

/* ---- the writer ---------------------------------------------------------------- */

typedef struct fsdp_tboard fsdp_tboard;

/* Create DIR (and its parents) if needed and a new event file in it (never
 * an existing one), and write the file_version event and a SessionLog
 * START at first_step (1-based: the first step this run will write).
 * Errors: IO naming the directory or file and what to do, OOM. */
fsdp_status fsdp_tboard_open(fsdp_tboard **tb, const char *dir, int64_t first_step);

/* Write the scalars v[0..n) of `step` as one event and flush it, so that
 * TensorBoard sees each step as it ends. IO naming the file, the step and
 * the reason; every later write then fails the same way. */
fsdp_status fsdp_tboard_write(fsdp_tboard *tb, int64_t step, const fsdp_tboard_scalar *v, int n);

/* The event file's path (valid until close). */
const char *fsdp_tboard_path(const fsdp_tboard *tb);

/* Close and free (NULL is fine): IO when the close found an unwritten buffer. */
fsdp_status fsdp_tboard_close(fsdp_tboard *tb);

/* ---- the trainer's sink (train/outputs.h) --------------------------------------- */

/* The metrics sink that writes a run's figures into DIR: each record as
 * train/loss, train/lr, train/grad_norm, train/tokens_per_s,
 * train/step_ms, train/mfu (when known), eval/loss (when the record has
 * it) and memory/peak_bytes/device_D for each device; the held-out figures
 * as eval/NAME. A step whose value is not finite writes NaN (TensorBoard
 * leaves it out of its charts). Nothing is created until the trainer opens
 * the sink. */
typedef struct fsdp_tboard_sink {
    fsdp_metrics_sink sink; /* hand &sink to fsdp_train_config.sink */
    const char *dir;        /* not copied */
    fsdp_tboard *tb;        /* the open file, or NULL */
} fsdp_tboard_sink;

void fsdp_tboard_sink_init(fsdp_tboard_sink *s, const char *dir);

#endif /* FSDP_REPORT_TENSORBOARD_H */
