/*
 * procs.h - the processes of a job: how this process finds the others,
 * tells them of a failure, and moves bytes to and from them for the
 * collectives that span processes (comm/mpi_coll.c).
 *
 * A job is one process (no fsdp_procs at all: every rank is a thread of
 * it), or P processes, one per node, each running n_local rank threads
 * (core/world.h: global rank = process * n_local + local index). The
 * processes meet in one of two ways, picked in one place (fsdp_procs_init):
 *
 *   mpi  started by mpirun (Open MPI): MPI_COMM_WORLD's ranks are the
 *        processes. Exchanges, transfers of collective data, and the end
 *        of the job on a failure (MPI_Abort) all go through MPI.
 *   dir  started by hand or by a scheduler with FSDP_RDV_DIR (a directory
 *        every process sees: a shared file system), FSDP_PROCESS and
 *        FSDP_N_PROCESSES. Small records are exchanged through files
 *        written atomically (NCCL's unique id, host names); a failure is
 *        published as a file the others watch; every process keeps a
 *        heartbeat so a dead one is noticed. It moves no bulk data: enough
 *        for NCCL, which brings its own network, not for the cpu backend.
 *
 * Lifetime (what `fsdp` main does): fsdp_procs_init first (before any
 * thread; NULL out = a job of one process), fsdp_procs_world_init for the
 * world, fsdp_world_free, then fsdp_procs_fini with the run's status last:
 * with a failure it ends every process of the job (under MPI it does not
 * return), so the others never wait for this one.
 *
 * Failures: the world hands the first failure of a local rank to the
 * procs (the span's fail hook, core/world.h). mpi: if this process has not
 * reached fsdp_procs_fini with the failure within FSDP_ABORT_GRACE seconds
 * (a rank stuck in a long computation), a watchdog prints the failure and
 * calls MPI_Abort itself. A process that dies is noticed by mpirun, which
 * ends the others (Open MPI's default). dir: the failure is written to the
 * directory; the other processes' watchers record it in their worlds
 * (fsdp_world_fail with the failed rank), whose abort flags stop their
 * ranks; a heartbeat that stops for dead_s seconds (15 by default: the
 * watcher beats 4 times a second whatever the ranks do) fails the world
 * the same way. Every wait on another process polls the world's abort
 * flag and gives up after FSDP_PEER_TIMEOUT seconds (600 by default; 0:
 * never), naming the process it waited for; a wait of the world's running
 * ranks also has the stall watchdog's deadline (core/flight.h).
 *
 * Threads: every function may be called from any thread; the mpi procs
 * serialise their MPI calls on one mutex (MPI_THREAD_SERIALIZED, checked
 * at MPI_Init_thread): one caller at a time is all fsdp needs, since one
 * thread per process moves the data of each collective (comm/mpi_coll.c).
 */
#ifndef FSDP_COMM_PROCS_H
#define FSDP_COMM_PROCS_H

#include <stdbool.h>
#include <stddef.h>

#include "core/names.h"
#include "core/world.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum fsdp_procs_kind {
    FSDP_PROCS_AUTO = 0, /* mpi if started by mpirun, dir if a directory is given, else single */
    FSDP_PROCS_SINGLE,   /* one process: no fsdp_procs */
    FSDP_PROCS_MPI,
    FSDP_PROCS_DIR,
    FSDP_PROCS_KIND_COUNT
} fsdp_procs_kind;

/* Names and help of the kinds ("auto", "single", "mpi", "dir"). */
extern const fsdp_name_table fsdp_procs_kind_names;

typedef struct fsdp_procs_opts {
    fsdp_procs_kind kind;
    const char *dir;          /* dir: the rendezvous directory (empty at the start of a job) */
    int process, n_processes; /* dir: this process's index, the job's processes */
    double timeout_s;         /* longest wait on another process without progress; 0: none */
    double abort_grace_s;     /* mpi: how long a failing process may take to end the job */
    double dead_s;            /* dir: a peer whose heartbeat stops this long is dead (0: 15) */
} fsdp_procs_opts;

/* The options from the environment: FSDP_RDV_DIR, FSDP_PROCESS,
 * FSDP_N_PROCESSES, FSDP_PEER_TIMEOUT, FSDP_ABORT_GRACE (kind AUTO).
 * INVALID_ARG naming the variable for a malformed value. */
fsdp_status fsdp_procs_opts_env(fsdp_procs_opts *o);

typedef struct fsdp_procs fsdp_procs;

/* One message of a transfer: `bytes` of buf sent to process `peer`, or
 * received from it into buf. */
typedef struct fsdp_procs_msg {
    int peer;
    bool send;
    void *buf;
    size_t bytes;
} fsdp_procs_msg;

struct fsdp_procs_i {
    const char *name;
    /* All-gather of one small record per process: all[q * bytes ..] =
     * process q's `mine`. Every process calls it with the same bytes, in
     * the same order (from any one thread at a time). Waits poll w's abort
     * flag (w may be NULL) and the timeout. */
    fsdp_status (*exchange)(fsdp_procs *p, fsdp_world *w, const void *mine, size_t bytes,
                            void *all);
    /* Optional (NULL: this kind carries no collective data). Post every
     * message and wait until all are done, polling w's abort flag and the
     * timeout. A channel (0 .. 2^30) separates message matching: each user
     * of xfer (a communicator) takes one that every process gives it alike.
     * Messages between two processes on one channel match in the
     * order they were posted; a received message must have exactly the
     * size posted. On failure *pending says whether posted operations may
     * still use the buffers: then the caller must never free or reuse them
     * (the job is ending). `what` names the operation in messages
     * ("all_gather (collective 12)"). STALLED (fsdp_procs_wait): the
     * message is then which processes have answered and which have not
     * ("answered: process 0 (this one); not answered: process 1 (host b,
     * ranks 2-3)"), for the caller's report. */
    fsdp_status (*xfer)(fsdp_procs *p, fsdp_world *w, int channel, const fsdp_procs_msg *msgs,
                        int n_msgs, const char *what, bool *pending);
    /* The world's first failure of a local rank (core/world.h span). */
    void (*fail)(fsdp_procs *p, fsdp_world *w, int rank, fsdp_status st, const char *msg);
    /* fsdp_procs_world_init made w / fsdp_world_free is about to free it.
     * Optional: for failures seen outside any wait (a watcher). */
    void (*attach)(fsdp_procs *p, fsdp_world *w);
    void (*detach)(fsdp_procs *p, fsdp_world *w);
    /* End (see fsdp_procs_fini) and free p. */
    fsdp_status (*fini)(fsdp_procs *p, fsdp_status st);
};

struct fsdp_procs {
    const struct fsdp_procs_i *iface;
    fsdp_procs_kind kind;
    int process, n_processes;
    char host[FSDP_HOST_MAX];
    double timeout_s;
    void *ctx;                /* implementation private */
};

/* Connect this process to the others of its job as opts say (NULL: from
 * the environment). *out is NULL for a job of one process. Call it before
 * starting any thread. UNSUPPORTED when started by mpirun but built
 * without MPI. */
fsdp_status fsdp_procs_init(fsdp_procs **out, const fsdp_procs_opts *opts);

/* The world of this job: n_local ranks in each process (p NULL: a world
 * of n_local ranks in this process). Every process calls it with the same
 * n_local; a different one, on any process, is INVALID_ARG on all of them.
 * The world learns every process's host, and its failures reach p. */
fsdp_status fsdp_procs_world_init(fsdp_world **out, fsdp_procs *p, int n_local);

/* A wait on another process, for the implementations (procs_wait.c):
 * naps between polls (spins briefly first) and says when to give up.
 * *spins counts polls (start at 0); t0 is when the wait began (fsdp_now_s,
 * core/clock.h). Returns OK to poll again, ABORTED if w's abort flag is
 * set, STALLED once a wait of w's running ranks passes the stall
 * watchdog's deadline for waits on other processes (core/flight.h; the
 * caller reports it), or INTERNAL after the timeout, each with a message
 * naming `what` and `whom` ("process 1 (host nodeb)"). */
fsdp_status fsdp_procs_wait(fsdp_procs *p, fsdp_world *w, unsigned *spins, double t0,
                            const char *what, const char *whom);

/* The last call of a job's process: st OK ends it in order (every process
 * calls it); a failure ends every process of the job: under MPI through
 * MPI_Abort (this call does not return; the job's exit code is 1), in a
 * rendezvous directory by publishing the failure. Frees p. NULL: OK. */
fsdp_status fsdp_procs_fini(fsdp_procs *p, fsdp_status st);

/* Implementations (comm/mpi_procs.c or mpi_stub.c, comm/rdv_dir.c); o is
 * complete, kind already chosen. */
fsdp_status fsdp_procs_mpi_init(fsdp_procs **out, const fsdp_procs_opts *o);
fsdp_status fsdp_procs_dir_init(fsdp_procs **out, const fsdp_procs_opts *o);
/* Whether this process was started by an MPI launcher (its environment). */
bool fsdp_procs_mpi_launched(void);
/* The job's processes as the launcher's environment says, before MPI is
 * started (1 when not launched or not said). */
int fsdp_procs_launched_size(void);
/* Whether this build has MPI (mpi_procs.c) or its stub (mpi_stub.c). */
extern const bool fsdp_procs_mpi_built;

#ifdef __cplusplus
}
#endif

#endif /* FSDP_COMM_PROCS_H */
