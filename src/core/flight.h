/*
 * flight.h - the stall watchdog: a deadline on every wait in a collective
 * or barrier, a flight record of the last collectives each rank of this
 * process issued, and the one report a stall ends the job with.
 *
 * A rank that never reaches a collective (a bug, data it cannot read,
 * another process's different settings, a lost process) would leave the
 * others waiting for ever. With the watchdog armed (fsdp_world_set_watchdog;
 * every world starts with FSDP_WATCHDOG, default 300 s), each wait that can
 * be left (the first meeting of a collective, the world's barrier, the
 * collective handshake of the cuda transports, and a wait on another
 * process) gives up once it has lasted that long: the first rank of the
 * process to give up writes the report (fsdp_flight_stall) and fails the
 * world with STALLED, so every other rank stops at its abort flag and the
 * job ends without a checkpoint. The report names the waiting rank, the
 * step, the collective (its label, such as "unit 'h.3' all-gather", its
 * number, kind, size and group), which ranks (or processes) have arrived
 * and which have not, and what each missing rank of this process ran
 * last; the record of every local rank goes to a JSON file (the path given
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
 * streams). One mutex per rank guards its ring.
 *
 * Threads: fsdp_world_set_watchdog before the world is launched; the rest
 * from any thread while the ranks run.
 */
#ifndef FSDP_CORE_FLIGHT_H
#define FSDP_CORE_FLIGHT_H

#include <stdbool.h>
#include <stddef.h>

#include "core/world.h"

/* Entries kept per rank. */
#define FSDP_FLIGHT_RING 32
/* The watchdog's deadline when FSDP_WATCHDOG does not say (seconds). */
#define FSDP_WATCHDOG_DEFAULT_S 300.0
/* Largest deadline accepted (seconds: a week). */
#define FSDP_WATCHDOG_MAX_S 604800.0

/* FSDP_WATCHDOG's value (its default when unset): seconds, 0 = off;
 * INVALID_ARG naming the variable for a malformed or negative value. */
fsdp_status fsdp_watchdog_env(double *seconds);

/* Arm (seconds > 0) or disarm (0) w's watchdog, and say where a stall
 * writes the flight record of this process's ranks (NULL: nowhere; the
 * report still names what the missing ranks ran last). Before launch.
 * OOM or INVALID_ARG (seconds out of 0..FSDP_WATCHDOG_MAX_S). */
fsdp_status fsdp_world_set_watchdog(fsdp_world *w, double seconds, const char *record_path);

/* The deadline of a wait in a collective or barrier of w's ranks: the
 * watchdog's seconds while w's ranks run, else 0 (no deadline). remote:
 * a wait on another process (later: see above). */
double fsdp_watchdog_deadline(const fsdp_world *w, bool remote);

/* A collective as the record keeps it. */
typedef struct fsdp_flight_coll {
    const char *kind;      /* "all_gather", ..., "barrier" (a static string) */
    const char *dtype;     /* "fp32" (a static string), or NULL */
    size_t numel;
    int first, stride, count; /* its group: global ranks first + i * stride */
    const char *label;     /* what the caller named it ("unit 'h.3' all-gather"), or NULL */
} fsdp_flight_coll;

/* Record that local `rank` issued c: returns its entry's number (the
 * rank's count of recorded collectives, from 1), 0 when w keeps no record. */
long fsdp_flight_issue(fsdp_world *w, int rank, const fsdp_flight_coll *c);

/* Entry `seq` of rank started running / ended (ok: done, else failed). A
 * seq of 0, or one the ring has dropped, is ignored. */
void fsdp_flight_start(fsdp_world *w, int rank, long seq);
void fsdp_flight_end(fsdp_world *w, int rank, long seq, bool ok);

/* Local rank `rank` is at step `step` (1-based; 0 before the first): the
 * step its next collectives are recorded with. */
void fsdp_flight_step(fsdp_world *w, int rank, long step);

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

/* Report the stall s, once per launch of w: compose the report, write the
 * flight record, fail the world (fsdp_world_fail: every other rank stops,
 * and the other processes hear of it) and return STALLED with the report
 * as this thread's message. A second stall in the same launch returns
 * ABORTED (the first one's report stands). */
fsdp_status fsdp_flight_stall(fsdp_world *w, const fsdp_stall *s);

/* fsdp_flight_stall for a wait among n members of this process: member i
 * is global rank rank_at(ctx, i) and has arrived when arrived(ctx, i)
 * (both called from this thread, without locks held); the report lists
 * both sets ("arrived: ranks 0-1, 3; not arrived: rank 2", then `note`
 * when not NULL) and what each missing one ran last. */
fsdp_status fsdp_flight_stall_among(fsdp_world *w, int rank, long seq, double waited_s,
                                    const char *wait, int n,
                                    int (*rank_at)(const void *ctx, int i),
                                    bool (*arrived)(const void *ctx, int i), const void *ctx,
                                    const char *note);

/* Ranks as a short list into buf ("0-2, 5, 7-8"; "" for none): ranks in
 * increasing order. Returns buf. */
const char *fsdp_flight_ranks(const int *ranks, int n, char *buf, size_t len);

/* Free w's record (fsdp_world_free). */
void fsdp_flight_free(fsdp_world *w);

#endif /* FSDP_CORE_FLIGHT_H */
