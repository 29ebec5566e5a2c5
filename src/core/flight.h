/*
 * flight.h - the flight record of the stall watchdog: the last collectives
 * each rank of this process issued, and the report a stall ends the job
 * with, composed from what the caller passes.
 *
 * A rank that never reaches a collective (a bug, data it cannot read,
 * another process's different settings, a lost process) would leave the
 * others waiting for ever. The world (core/world.h) keeps the watchdog:
 * armed (fsdp_world_set_watchdog; every world starts with FSDP_WATCHDOG,
 * default 300 s), each wait that can be left (the first meeting of a
 * collective, the world's barrier, the collective handshake of the cuda
 * transports, and a wait on another process) gives up once it has lasted
 * that long: the first rank of the process to give up reports the stall
 * (fsdp_world_stall) and fails the world with STALLED, so every other rank
 * stops at its abort flag and the job ends without a checkpoint. The report
 * (fsdp_flight_report) names the waiting rank, the step, the collective
 * (its label, such as "unit 'h.3' all-gather", its number, kind, size and
 * group), which ranks (or processes) have arrived and which have not, and
 * what each missing rank of this process ran last; the record of every
 * local rank goes to a JSON file (fsdp_flight_record_write; the path given
 * to fsdp_world_set_watchdog; docs/formats.md).
 *
 * Waits on another process give up later than local ones (by the deadline
 * again, at most 10 s more), so that the process holding the rank that did
 * not arrive, which can name it, reports first, and the job ends with its
 * report.
 *
 * The record: a ring of FSDP_FLIGHT_RING entries per local rank. An entry
 * is made when a collective is issued (on the rank's thread, with the
 * rank's step), marked running and then done or failed by the thread that
 * runs it (the rank's, or its device's comm stream worker with async cpu
 * streams). One mutex per rank guards its ring. The record knows ranks by
 * number only (local ones: rank_offset .. rank_offset + n_local - 1); it
 * does not know the world.
 *
 * Threads: fsdp_flight_init and fsdp_flight_free before and after the
 * ranks run; the rest from any thread while they run.
 */
#ifndef FSDP_CORE_FLIGHT_H
#define FSDP_CORE_FLIGHT_H

#include <stdbool.h>
#include <stddef.h>

#include "core/error.h"
#include "core/fileio.h"

/* Entries kept per rank. */
#define FSDP_FLIGHT_RING 32
/* The watchdog's deadline when FSDP_WATCHDOG does not say (seconds). */
#define FSDP_WATCHDOG_DEFAULT_S 300.0
/* Largest deadline accepted (seconds: a week). */
#define FSDP_WATCHDOG_MAX_S 604800.0

typedef struct fsdp_flight fsdp_flight;

/* FSDP_WATCHDOG's value (its default when unset): seconds, 0 = off;
 * INVALID_ARG naming the variable for a malformed or negative value. */
fsdp_status fsdp_watchdog_env(double *seconds);

/* The record of n_local ranks, numbered rank_offset .. rank_offset +
 * n_local - 1, none with an entry yet; *out NULL and OOM on failure. */
fsdp_status fsdp_flight_init(fsdp_flight **out, int n_local, int rank_offset);

/* Free f (NULL is fine). */
void fsdp_flight_free(fsdp_flight *f);

/* A collective as the record keeps it. */
typedef struct fsdp_flight_coll {
    const char *kind;      /* "all_gather", ..., "barrier" (a static string) */
    const char *dtype;     /* "fp32" (a static string), or NULL */
    size_t numel;
    int first, stride, count; /* its group: global ranks first + i * stride */
    const char *label;     /* what the caller named it ("unit 'h.3' all-gather"), or NULL */
} fsdp_flight_coll;

/* Record that local `rank` issued c: returns its entry's number (the
 * rank's count of recorded collectives, from 1), 0 when f is NULL (no
 * record kept) or rank is not one of f's. The same holds for the calls
 * below: a NULL f, or a rank not its own, is ignored. */
long fsdp_flight_issue(fsdp_flight *f, int rank, const fsdp_flight_coll *c);

/* Entry `seq` of rank started running / ended (ok: done, else failed). A
 * seq of 0, or one the ring has dropped, is ignored. */
void fsdp_flight_start(fsdp_flight *f, int rank, long seq);
void fsdp_flight_end(fsdp_flight *f, int rank, long seq, bool ok);

/* Local rank `rank` is at step `step` (1-based; 0 before the first): the
 * step its next collectives are recorded with. */
void fsdp_flight_step(fsdp_flight *f, int rank, long step);

/* A wait that passed its deadline. */
typedef struct fsdp_stall {
    int rank;            /* the waiting rank (global, run by this process) */
    long seq;            /* its entry for the collective it waits in (0: its newest running one) */
    double waited_s;
    const char *wait;    /* what it waits in: "collective 14 (all_gather of 6144 x fp32 over
                          * ranks 0-3)" */
    const char *who;     /* who arrived and who did not: "arrived: ranks 0-1, 3; not arrived:
                          * rank 2" */
    const int *missing;  /* (n_missing,) ranks of this process that did not arrive: the
                          * report says what each ran last */
    int n_missing;
} fsdp_stall;

/* Where the record was kept: the process and its host, the watchdog's
 * deadline (the report and the record name them). */
typedef struct fsdp_flight_where {
    int process, n_processes;
    const char *host;
    double watchdog_s;
} fsdp_flight_where;

/* The report of stall s, appended to b: the waiting rank, its waited
 * seconds against the deadline, the step and collective it waits in (from
 * its entry s->seq in f, f NULL: none), s->wait, s->who, and what each of
 * s->missing ran last. Ends without a full stop: the caller adds where the
 * record went and the advice. */
void fsdp_flight_report(fsdp_flight *f, const fsdp_flight_where *at, const fsdp_stall *s,
                        fsdp_sbuf *b);

/* The flight record of every rank of f, with `report`, as JSON into path
 * (atomically: docs/formats.md, "Flight record"). OK, or the error of the
 * write with its message. */
fsdp_status fsdp_flight_record_write(fsdp_flight *f, const fsdp_flight_where *at,
                                     const char *report, const char *path);

/* Ranks as a short list into buf ("0-2, 5, 7-8"; "" for none): ranks in
 * increasing order. Returns buf. */
const char *fsdp_flight_ranks(const int *ranks, int n, char *buf, size_t len);

#endif /* FSDP_CORE_FLIGHT_H */
