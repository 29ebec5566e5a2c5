/*
 * world.h - the ranks of one process: rank threads, barrier, abort flag,
 * first error, and the fault-injection test hook.
 *
 * A world holds N ranks, each run on its own POSIX thread by
 * fsdp_world_launch(). When a rank's function returns an error, the world
 * keeps the first such error (status, rank, message), sets the abort flag
 * and wakes every waiter; every wait in the runtime (barrier, host
 * collectives, engine waits) polls the flag, so the other ranks return
 * FSDP_STATUS_ABORTED promptly instead of hanging.
 *
 * Waiting on the host is not all: a GPU may be running a collective kernel
 * that waits for a rank that will never come, and such a kernel keeps
 * every later cudaFree (which waits for the whole device) from returning.
 * So each rank can register a stop hook (nccl: ncclCommAbort) that its own
 * thread runs as soon as it sees the abort flag in a device wait, and that
 * teardown runs first, before any device memory is freed
 * (fsdp_world_rank_stop).
 */
#ifndef FSDP_CORE_WORLD_H
#define FSDP_CORE_WORLD_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "core/error.h"
#include "core/names.h"

/* Test hook: make the k-th operation of a kind on one rank fail (SQLite-style
 * fault injection). Counted per rank, 1-based; k = 0 disables. Armed by
 * fsdp_world_set_fault, or for every world of a process by the environment
 * (testing only; the commands' tests use it):
 *
 *     FSDP_FAULT=RANK:OP:K     OP: alloc | collective | write
 *
 * e.g. FSDP_FAULT=1:collective:7 fails the 7th collective of rank 1. When a
 * world armed that way is freed without the fault having fired, a warning
 * says how many operations of that kind the rank made (so a test can count
 * them with a K larger than any run). */
typedef enum fsdp_fault_kind {
    FSDP_FAULT_ALLOC = 0,     /* device and pinned host allocations (device.c, every backend) */
    FSDP_FAULT_COLLECTIVE,    /* collectives, barriers included (host, peer, nccl) */
    FSDP_FAULT_WRITE,         /* a run's file writes: each metrics record, each checkpoint
                               * block of a rank file, a checkpoint's manifest and its commit */
    FSDP_FAULT_KIND_COUNT
} fsdp_fault_kind;

/* The OP names of FSDP_FAULT: alloc, collective, write. */
extern const fsdp_name_table fsdp_fault_kind_names;

typedef struct fsdp_world fsdp_world;

/* Per-rank entry point run by fsdp_world_launch on the rank's thread. */
typedef fsdp_status (*fsdp_rank_fn)(fsdp_world *w, int rank, void *arg);

/* A rank's stop hook: end this rank's device work that may wait for other
 * ranks (see above). Runs on the rank's own thread, at most once per
 * registration; must not block on the device. */
typedef void (*fsdp_rank_stop_fn)(void *arg);

struct fsdp_world {
    int n_ranks;
    atomic_int aborted;            /* set once any rank failed */

    pthread_mutex_t mu;            /* guards the barrier and first error */
    pthread_cond_t cv;
    int barrier_waiting;
    unsigned long barrier_gen;

    fsdp_status first_status;      /* first non-ABORTED error of any rank */
    int first_rank;
    char first_msg[FSDP_ERROR_MSG_MAX];

    struct {
        int rank;
        long k;
        atomic_long count;         /* operations of this kind seen on `rank` */
    } fault[FSDP_FAULT_KIND_COUNT];
    int fault_env;                 /* kind armed from FSDP_FAULT, or -1 */
    unsigned barrier_or;           /* fsdp_world_barrier_or: OR of this round so far */
    unsigned barrier_result;       /* ... and of the round that completed last */

    struct fsdp_rank_stop {
        fsdp_rank_stop_fn fn;      /* NULL: none; written and read by the rank's thread only */
        void *arg;
    } *stop;                       /* [n_ranks] */

    void *comm_shared;             /* host collectives' rendezvous (comm/host.c) */
    void *rdv_shared;              /* cuda collectives' rendezvous (comm/rdv.c) */
};

/* A world of n_ranks ranks (1..FSDP_MAX_RANKS); the fault hook is armed
 * from FSDP_FAULT when it is set (INVALID_ARG for a malformed value or a
 * rank outside the world). */
fsdp_status fsdp_world_init(fsdp_world **out, int n_ranks);
/* Free w (NULL is fine); warns about an FSDP_FAULT that never fired. */
void fsdp_world_free(fsdp_world *w);

/* Run fn(w, r, arg) on N new threads, r = 0..N-1, and join them. Returns OK,
 * or the first error a rank reported (never ABORTED unless every failure
 * was an abort); its message, prefixed with "rank R: " unless it already
 * starts so, becomes the calling thread's fsdp_error_msg(). The world can be launched again afterwards
 * (the abort flag and first error are reset at the start of each launch). */
fsdp_status fsdp_world_launch(fsdp_world *w, fsdp_rank_fn fn, void *arg);

/* Record a failure of `rank` (first one wins), set the abort flag and wake
 * every waiter. Called by the launcher; callable by code that must fail the
 * world from inside a rank before returning. */
void fsdp_world_fail(fsdp_world *w, int rank, fsdp_status st, const char *msg);

static inline bool fsdp_world_aborted(fsdp_world *w)
{
    return atomic_load_explicit(&w->aborted, memory_order_acquire) != 0;
}

/* Register (fn != NULL) or remove (fn == NULL) rank's stop hook. Call on
 * the rank's own thread; one hook per rank (a later one replaces it). */
void fsdp_world_set_rank_stop(fsdp_world *w, int rank, fsdp_rank_stop_fn fn, void *arg);

/* On rank's own thread, with st = this rank's status so far (OK unless it
 * failed): if st is a failure or the world is aborted, run the rank's stop
 * hook, if any, once (it is removed first) and return true; else return
 * false and leave it. A failure that the world has not seen yet is
 * recorded first (fsdp_world_fail, with the thread's message as the
 * launcher would take it), so every other rank stops too: stopping
 * collectives may need all ranks (ncclCommAbort waits for the ranks of
 * its node in some NCCL versions). Teardown calls this first, before
 * freeing any device memory; the cuda device's waits call it (st = OK)
 * when they see the abort flag. w may be NULL (false). */
bool fsdp_world_rank_stop(fsdp_world *w, int rank, fsdp_status st);

/* Wait until all ranks arrive. Returns ABORTED (with a message) if the world
 * is aborted before or while waiting. */
fsdp_status fsdp_world_barrier(fsdp_world *w);

/* A barrier that also agrees on a value: each rank brings `mine`, and every
 * rank gets the bitwise OR of all of them in *all. This is how the ranks
 * take one decision from state only some of them see (a stop request, a
 * failed write on rank 0): whatever each rank samples, all of them act on
 * the same bits. ABORTED as fsdp_world_barrier (then *all is 0). Every
 * rank must call the same barrier at the same point; fsdp_world_barrier
 * counts as bringing 0. */
fsdp_status fsdp_world_barrier_or(fsdp_world *w, unsigned mine, unsigned *all);

/* Block on the world's condition variable until woken or ~10 ms pass; the
 * caller holds w->mu and re-checks its predicate and the abort flag. */
void fsdp_world_wait_locked(fsdp_world *w);

/* Arm the fault hook (test only). */
void fsdp_world_set_fault(fsdp_world *w, fsdp_fault_kind kind, int rank, long k);

/* Count one operation of `kind` on `rank`; true if it is the one to fail. */
bool fsdp_world_fault_hit(fsdp_world *w, fsdp_fault_kind kind, int rank);

#endif /* FSDP_CORE_WORLD_H */
