/*
 * world.h - the ranks of one job as this process sees them: rank threads,
 * barrier, abort flag, first error, the fault-injection test hook, and
 * where every rank lives when the job spans several processes.
 *
 * A world holds n_ranks ranks. A job of one process runs them all on its
 * own POSIX threads. A job of P processes (one per node, started by mpirun
 * or through a rendezvous directory: comm/procs.h) runs n_local = n_ranks
 * / P of them in each process: global rank = process * n_local + local
 * index, so the ranks of a process are [rank_offset, rank_offset + n_local).
 * Ranks are global everywhere (rank functions, messages, the fault hook);
 * only this process's threads run here. fsdp_world_launch() runs the
 * local ranks, each on its own thread.
 *
 * When a rank's function returns an error, the world keeps the first such
 * error (status, rank, message), sets the abort flag and wakes every
 * waiter; every wait in the runtime (barrier, host collectives, engine
 * waits) polls the flag, so the other ranks return FSDP_STATUS_ABORTED
 * promptly instead of hanging. In a job of several processes the failure
 * of a local rank is also handed to the span's fail hook (comm/procs.c),
 * which tells the other processes; they record it (as the failure of a
 * rank that is not theirs) through fsdp_world_fail, which sets their abort
 * flag in turn.
 *
 * Waiting on the host is not all: a GPU may be running a collective kernel
 * that waits for a rank that will never come, and such a kernel keeps
 * every later cudaFree (which waits for the whole device) from returning.
 * So each rank can register stop hooks (nccl: ncclCommAbort, one per
 * communicator: hybrid sharding has three) that its own thread runs as soon
 * as it sees the abort flag in a device wait, and that teardown runs first,
 * before any device memory is freed (fsdp_world_rank_stop).
 */
#ifndef FSDP_CORE_WORLD_H
#define FSDP_CORE_WORLD_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "core/error.h"
#include "core/flight.h"
#include "core/names.h"

/* Test hook: make the k-th operation of a kind on one rank fail (SQLite-style
 * fault injection). Counted per rank, 1-based; k = 0 disables. Armed by
 * fsdp_world_set_fault, or for every world of a process by the environment
 * (testing only; the commands' tests use it):
 *
 *     FSDP_FAULT=RANK:OP:K     OP: alloc | collective | write | stall
 *
 * e.g. FSDP_FAULT=1:collective:7 fails the 7th collective of rank 1, and
 * FSDP_FAULT=1:stall:7 makes it never arrive (it waits, publishing
 * nothing, until the world is aborted, then returns ABORTED: the stall
 * watchdog's test, core/flight.h). When a
 * world armed that way is freed without the fault having fired, a warning
 * says how many operations of that kind the rank made (so a test can count
 * them with a K larger than any run). */
typedef enum fsdp_fault_kind {
    FSDP_FAULT_ALLOC = 0,     /* device and pinned host allocations (device.c, every backend) */
    FSDP_FAULT_COLLECTIVE,    /* collectives, barriers included (host, peer, nccl) */
    FSDP_FAULT_WRITE,         /* a run's file writes: each metrics record, each checkpoint
                               * block of a rank file, a checkpoint's manifest and its commit */
    FSDP_FAULT_STALL,         /* collectives, as FSDP_FAULT_COLLECTIVE counts them: the k-th
                               * never arrives */
    FSDP_FAULT_KIND_COUNT
} fsdp_fault_kind;

/* The OP names of FSDP_FAULT: alloc, collective, write, stall. */
extern const fsdp_name_table fsdp_fault_kind_names;

typedef struct fsdp_world fsdp_world;

/* Longest host name kept (longer ones are cut). */
#define FSDP_HOST_MAX 64
/* Stop hooks a rank may hold at once (a transport's communicators). */
#define FSDP_RANK_STOP_MAX 4

/* Per-rank entry point run by fsdp_world_launch on the rank's thread. */
typedef fsdp_status (*fsdp_rank_fn)(fsdp_world *w, int rank, void *arg);

/* A rank's stop hook: end this rank's device work that may wait for other
 * ranks (see above). Runs on the rank's own thread, at most once per
 * registration; must not block on the device. */
typedef void (*fsdp_rank_stop_fn)(void *arg);

/* Where a world's processes are and how a local failure reaches them;
 * filled by the layer that connects the processes (comm/procs.c). */
typedef struct fsdp_world_span {
    int process, n_processes;      /* this process's index; processes in the job */
    const char *const *hosts;      /* (n_processes,) host names, copied */
    /* The first failure of a local rank (never ABORTED, never a rank of
     * another process): tell the other processes. Called on the failing
     * thread, without the world's mutex held, at most once per launch.
     * May be NULL. */
    void (*fail)(void *ctx, fsdp_world *w, int rank, fsdp_status st, const char *msg);
    /* fsdp_world_free is about to free w. May be NULL. */
    void (*detach)(void *ctx, fsdp_world *w);
    void *ctx;                     /* the hooks' argument; also kept as w->procs */
} fsdp_world_span;

struct fsdp_world {
    int n_ranks;                   /* ranks of the whole job, every process */
    int n_local;                   /* ranks run here: n_ranks / n_processes */
    int rank_offset;               /* global rank of the first local one */
    int process, n_processes;      /* 0 and 1 for a job of one process */
    char (*hosts)[FSDP_HOST_MAX];  /* (n_processes,) host of every process */
    void (*span_fail)(void *ctx, fsdp_world *w, int rank, fsdp_status st, const char *msg);
    void (*span_detach)(void *ctx, fsdp_world *w);
    void *procs;                   /* the span's ctx (comm/procs.h); NULL: one process */
    bool span_failed;              /* the fail hook ran in this launch; mu */
    bool peer_failed;              /* a rank of another process failed: the job is over,
                                    * every later launch fails at once with it; mu */

    atomic_int aborted;            /* set once any rank failed */

    pthread_mutex_t mu;            /* guards the barrier and first error */
    pthread_cond_t cv;
    int barrier_waiting;
    unsigned long barrier_gen;

    fsdp_status first_status;      /* first non-ABORTED error of any rank */
    int first_rank;
    char first_msg[FSDP_ERROR_MSG_MAX];

    struct {                       /* armed from any thread, while ranks run */
        atomic_int rank;
        atomic_long k;
        atomic_long count;         /* operations of this kind seen on `rank` */
    } fault[FSDP_FAULT_KIND_COUNT];
    int fault_env;                 /* kind armed from FSDP_FAULT, or -1 */
    unsigned barrier_or;           /* fsdp_world_barrier_or: OR of this round so far */
    unsigned barrier_result;       /* ... and of the round that completed last */

    struct fsdp_rank_stop {        /* written and read by the rank's thread only */
        int n;                     /* hooks registered, in order */
        fsdp_rank_stop_fn fn[FSDP_RANK_STOP_MAX];
        void *arg[FSDP_RANK_STOP_MAX];
    } *stop;                       /* [n_local], by local index */

    void *comm_shared;             /* the communicators' shared states, per group (comm/comm.c) */
    void *rdv_shared;              /* cuda collectives' rendezvous (comm/rdv.c) */

    /* the stall watchdog (fsdp_world_set_watchdog, core/flight.h) */
    double watchdog_s;             /* deadline of a wait in a collective or barrier; 0: none */
    fsdp_flight *flight;           /* the flight record of the local ranks (NULL: none) */
    char flight_path[4096];        /* where a stall writes it ("": nowhere) */
    atomic_int running;            /* fsdp_world_launch is running the ranks */
    atomic_int stall_reported;     /* a stall was reported in this launch */
    atomic_ulong *barrier_at;      /* (n_local,) the barrier round each local rank arrived at
                                    * last, plus one (0: none) */
};

/* A world of n_ranks ranks (1..FSDP_MAX_RANKS), all in this process; the
 * fault hook is armed from FSDP_FAULT when it is set (INVALID_ARG for a
 * malformed value or a rank outside the world), the stall watchdog from
 * FSDP_WATCHDOG (core/flight.h). */
fsdp_status fsdp_world_init(fsdp_world **out, int n_ranks);
/* A world of n_local ranks in each of span->n_processes processes, this
 * one being span->process (span NULL: fsdp_world_init). Every process of
 * the job makes its own with the same n_local. */
fsdp_status fsdp_world_init_span(fsdp_world **out, int n_local, const fsdp_world_span *span);
/* Free w (NULL is fine); warns about an FSDP_FAULT that never fired. */
void fsdp_world_free(fsdp_world *w);

/* Whether global rank `rank` runs in this process. */
static inline bool fsdp_world_is_local(const fsdp_world *w, int rank)
{
    return rank >= w->rank_offset && rank < w->rank_offset + w->n_local;
}

/* The process that runs global rank `rank`. */
static inline int fsdp_world_process_of(const fsdp_world *w, int rank)
{
    return rank / w->n_local;
}

/* Where rank lives, for messages: "" in a job of one process, else
 * " (process 1 of 2, host nodeb)". Returns buf (at least 96 bytes). */
const char *fsdp_world_where(const fsdp_world *w, int rank, char *buf, size_t n);

/* Run fn(w, r, arg) for the local ranks r = rank_offset .. rank_offset +
 * n_local - 1, each on a new thread, and join them. Returns OK, or the
 * first error a rank reported (never ABORTED unless every failure was an
 * abort); its message, prefixed with the rank unless it already starts
 * so (and, across processes, where it ran: fsdp_world_where), becomes the
 * calling thread's
 * fsdp_error_msg(). The world can be launched again afterwards (the abort
 * flag and first error are reset at the start of each launch, unless
 * another process failed: see fsdp_world_fail). */
fsdp_status fsdp_world_launch(fsdp_world *w, fsdp_rank_fn fn, void *arg);

/* Record a failure of global `rank` (first one wins), set the abort flag
 * and wake every waiter. Called by the launcher; callable by code that
 * must fail the world from inside a rank before returning, and by the
 * layer connecting the processes for a failure reported by another
 * process, at any time (then rank is not local, the span's fail hook is
 * not called, and the failure outlives the launch: the job cannot go on
 * without that process, so later launches return it at once). */
void fsdp_world_fail(fsdp_world *w, int rank, fsdp_status st, const char *msg);

static inline bool fsdp_world_aborted(fsdp_world *w)
{
    return atomic_load_explicit(&w->aborted, memory_order_acquire) != 0;
}

/* Register fn(arg) as one of rank's stop hooks, on the rank's own thread.
 * INTERNAL when it already holds FSDP_RANK_STOP_MAX. */
fsdp_status fsdp_world_add_rank_stop(fsdp_world *w, int rank, fsdp_rank_stop_fn fn, void *arg);
/* Remove the hook fn(arg) of rank, if registered; on the rank's thread. */
void fsdp_world_remove_rank_stop(fsdp_world *w, int rank, fsdp_rank_stop_fn fn, void *arg);

/* On rank's own thread, with st = this rank's status so far (OK unless it
 * failed): if st is a failure or the world is aborted, run the rank's stop
 * hooks once each, the newest first (they are removed first), and return
 * true; else return
 * false and leave it. A failure that the world has not seen yet is
 * recorded first (fsdp_world_fail, with the thread's message as the
 * launcher would take it), so every other rank stops too: stopping
 * collectives may need all ranks (ncclCommAbort waits for the ranks of
 * its node in some NCCL versions). Teardown calls this first, before
 * freeing any device memory; the cuda device's waits call it (st = OK)
 * when they see the abort flag. w may be NULL (false). */
bool fsdp_world_rank_stop(fsdp_world *w, int rank, fsdp_status st);

/* Wait until all local ranks (this process's threads) arrive. Returns
 * ABORTED (with a message) if the world is aborted before or while
 * waiting, STALLED with the stall watchdog's report (core/flight.h) when
 * the wait passes its deadline. Ranks of other processes meet through the
 * collectives. Called on rank threads (the thread's log rank names it). */
fsdp_status fsdp_world_barrier(fsdp_world *w);

/* A barrier that also agrees on a value: each rank brings `mine`, and every
 * rank gets the bitwise OR of all of them in *all. This is how the ranks
 * take one decision from state only some of them see (a stop request, a
 * failed write on rank 0): whatever each rank samples, all of them act on
 * the same bits. ABORTED as fsdp_world_barrier (then *all is 0). Every
 * rank must call the same barrier at the same point; fsdp_world_barrier
 * counts as bringing 0. Like fsdp_world_barrier it covers this process's
 * ranks only: a decision across processes goes through a collective. */
fsdp_status fsdp_world_barrier_or(fsdp_world *w, unsigned mine, unsigned *all);

/* Block on the world's condition variable until woken or ~10 ms pass; the
 * caller holds w->mu and re-checks its predicate and the abort flag. */
void fsdp_world_wait_locked(fsdp_world *w);

/* Block until w's abort flag is set (the injected stall of FSDP_FAULT). */
void fsdp_world_wait_aborted(fsdp_world *w);

/* ---- the stall watchdog (core/flight.h) ---- */

/* Arm (seconds > 0) or disarm (0) w's watchdog, and say where a stall
 * writes the flight record of this process's ranks (NULL: nowhere; the
 * report still names what the missing ranks ran last). Before launch.
 * OOM or INVALID_ARG (seconds out of 0..FSDP_WATCHDOG_MAX_S). */
fsdp_status fsdp_world_set_watchdog(fsdp_world *w, double seconds, const char *record_path);

/* The deadline of a wait in a collective or barrier of w's ranks: the
 * watchdog's seconds while w's ranks run, else 0 (no deadline). remote:
 * a wait on another process (later: core/flight.h). */
double fsdp_watchdog_deadline(const fsdp_world *w, bool remote);

/* Report the stall s, once per launch of w: compose the report
 * (fsdp_flight_report), write the flight record, fail the world
 * (fsdp_world_fail: every other rank stops, and the other processes hear
 * of it) and return STALLED with the report as this thread's message. A
 * second stall in the same launch returns ABORTED (the first one's report
 * stands). */
fsdp_status fsdp_world_stall(fsdp_world *w, const fsdp_stall *s);

/* fsdp_world_stall for a wait among n members of this process: member i
 * is global rank rank_at(ctx, i) and has arrived when arrived(ctx, i)
 * (both called from this thread, without locks held); the report lists
 * both sets ("arrived: ranks 0-1, 3; not arrived: rank 2", then `note`
 * when not NULL) and what each missing one ran last. */
fsdp_status fsdp_world_stall_among(fsdp_world *w, int rank, long seq, double waited_s,
                                   const char *wait, int n,
                                   int (*rank_at)(const void *ctx, int i),
                                   bool (*arrived)(const void *ctx, int i), const void *ctx,
                                   const char *note);

/* fsdp_world_stall_among for a wait among all of this process's ranks,
 * counted in rounds: local rank i has arrived at round `round` when
 * at[i] == round + 1 ((n_local,), written by the ranks as they arrive). */
fsdp_status fsdp_world_stall_local(fsdp_world *w, int rank, long seq, double waited_s,
                                   const char *wait, const atomic_ulong *at, unsigned long round,
                                   const char *note);

/* Arm the fault hook (test only); rank is global (a rank of another
 * process never fails here). */
void fsdp_world_set_fault(fsdp_world *w, fsdp_fault_kind kind, int rank, long k);

/* Count one operation of `kind` on `rank`; true if it is the one to fail. */
bool fsdp_world_fault_hit(fsdp_world *w, fsdp_fault_kind kind, int rank);

#endif /* FSDP_CORE_WORLD_H */
