/*
 * trace.h - Chrome trace-event recording of the engine's work: one track
 * per rank and stream (compute, comm, copy, CPU optimizer), duration events
 * with their bytes, and each device's memory in use as counter events.
 * Open the JSON in Perfetto or chrome://tracing.
 *
 * Each rank appends only to its own buffer, from its own thread; the file
 * is written after the ranks are joined. A compute, comm or copy event is
 * stamped by host work queued on its stream (fsdp_device_launch_host), so
 * its times are when the stream reached its start and its end: with the
 * cpu backend's async streams, on the stream's own thread, so the tracks
 * show prefetch and reduce-scatter overlapping compute (or not); inline,
 * when the rank thread ran it; on cuda, when CUDA's host-callback thread
 * ran the stamp. Meta stamps on the rank thread.
 */
#ifndef FSDP_ENGINE_TRACE_H
#define FSDP_ENGINE_TRACE_H

#include <stddef.h>
#include <stdint.h>

#include "fsdp/fsdp.h"

typedef enum fsdp_trace_track {
    FSDP_TRACE_COMPUTE = 0,
    FSDP_TRACE_COMM,
    FSDP_TRACE_COPY,
    FSDP_TRACE_OPTIM,
    FSDP_TRACE_TRACK_COUNT
} fsdp_trace_track;

typedef struct fsdp_trace fsdp_trace;
struct fsdp_device;

/* A rank's view of the trace: where it records (NULL: not tracing), its
 * rank, and the device whose streams stamp its events and whose memory in
 * use the counter events show. The engine keeps one per rank. */
typedef struct fsdp_trace_rank {
    fsdp_trace *trace;
    int rank;
    struct fsdp_device *dev;
} fsdp_trace_rank;

fsdp_status fsdp_trace_init(fsdp_trace **out, int n_ranks);
void fsdp_trace_free(fsdp_trace *t);

/* Nanoseconds on a monotonic clock. */
uint64_t fsdp_trace_now_ns(void);

/* Record on the rank's trace, if there is one (else no-op). begin/end pair
 * up per track (no nesting within a track). Called on the rank's thread. */
void fsdp_trace_begin(const fsdp_trace_rank *t, fsdp_trace_track track, const char *name,
                      const char *detail, size_t bytes);
void fsdp_trace_end(const fsdp_trace_rank *t, fsdp_trace_track track);
/* A complete event with explicit times (e.g. a CPU optimizer job). */
void fsdp_trace_span(const fsdp_trace_rank *t, fsdp_trace_track track, const char *name,
                     const char *detail, size_t bytes, uint64_t t0_ns, uint64_t t1_ns);

/* Write every rank's events as Chrome trace-event JSON. */
fsdp_status fsdp_trace_write(const fsdp_trace *t, const char *path);

#endif /* FSDP_ENGINE_TRACE_H */
