/*
 * meet.h - the in-process half of a collective, shared by the transports
 * whose ranks are threads that read each other's buffers (comm/host.c, and
 * comm/mpi_coll.c for the ranks of one process): each member publishes what
 * it issued in its slot of a table shared by the group's members in this
 * process, and the members meet.
 *
 * Meetings. Each member counts the meetings it has reached; arriving adds
 * one to the table's arrival count, and meeting s is complete when the
 * count reaches s x n (n members), so exactly one member, the last to
 * arrive, completes it. It may first run a hook (mpi_coll.c lays out the
 * collective there) while the others wait; then it publishes the meeting
 * as done and wakes the sleepers. A waiter spins briefly (yields only, when
 * the process runs more ranks than there are cores), then sleeps on the
 * world's condition variable and polls the abort flag.
 *
 * Stalls. The first meeting has the stall watchdog's deadline
 * (core/flight.h): a member that waits longer reports who has arrived and
 * who has not (each slot keeps the meeting its member arrived at last) and
 * leaves as on an abort. The later meetings have none: the members they
 * wait for are inside the collective already, and its one wait on
 * something else, the mpi leader's transfer, has its own.
 *
 * Aborts. Only the first meeting of a collective (fsdp_meet_begin) can be
 * left on the abort flag: once every member has passed it, every member
 * reaches the later ones without waiting on anything else, and leaving
 * early would free buffers other members still read. A member that gives
 * up withdraws its arrival, unless the meeting was completed meanwhile
 * (then it stays and goes on), so after a failed collective every member
 * has reached the same number of meetings again and the communicators can
 * be used by a later launch of the same world. This assumes the abort flag
 * is only set when a rank has stopped issuing collectives (the launcher
 * sets it when a rank's function returns an error; another process's
 * failure sets it too).
 *
 * Threads: a member's calls come from one thread at a time (the rank's,
 * or whichever thread issues its collectives), in order. The table is kept
 * in the world's registry (comm.h) under the transport's kind; its first
 * member creates it, every member attaches and detaches under w->mu, and
 * the last to detach frees it.
 */
#ifndef FSDP_COMM_MEET_H
#define FSDP_COMM_MEET_H

#include <stdatomic.h>

#include "comm/comm.h"
#include "core/world.h"

/* What one member published for its current collective: written by the
 * member before it arrives at the first meeting, read by the others after
 * it, until the collective's last meeting. */
typedef struct fsdp_meet_slot {
    fsdp_coll_args args;
    const void *send;
    void *recv;
    unsigned long seq; /* meetings the member reached (kept when it detaches) */
    int attached;      /* w->mu */
    atomic_ulong at;   /* the meeting the member arrived at last (the stall report) */
} fsdp_meet_slot;

/* The table of a group's members in this process. A transport's shared
 * state starts with one (so the registry's pointer is both). */
typedef struct fsdp_meet {
    int n;                /* members in this process */
    fsdp_comm_group g;    /* the group; slot i is its member base + i (set by the first
                           * member to attach) */
    int base;
    int n_refs;           /* members attached; w->mu */
    atomic_ulong arrived; /* arrivals at every meeting so far: s x n once meeting s is complete */
    atomic_ulong done;    /* the last meeting completed (its hook run) */
    atomic_int n_sleepers;
    fsdp_meet_slot *slots; /* (n,) */
} fsdp_meet;

/* One member's side: its slot, its count of meetings and of collectives. */
typedef struct fsdp_meet_rank {
    fsdp_meet *m;
    int index;           /* slot: the member's index among the group's members here */
    unsigned long seq;   /* meetings reached */
    long n_coll;         /* collectives issued (1-based once one is) */
    int n_spin;          /* polls before sleeping */
    bool oversubscribed; /* more ranks than online cores: yield, don't spin */
} fsdp_meet_rank;

/* A transport's table: its names for messages and how its shared state is
 * made. The kind's address is the transport's key in the registry. */
typedef struct fsdp_meet_kind {
    const char *name; /* "host": "rank 3: host collectives initialised twice; ..." */
    const char *what; /* "the host collectives": "out of host memory for the host collectives" */
    /* A new zeroed shared state for group g (w->mu held), its fsdp_meet
     * initialised with fsdp_meet_init; arg is the attach call's. A message
     * on failure, nothing left allocated. */
    fsdp_status (*create)(fsdp_world *w, const fsdp_comm_group *g, void *arg, fsdp_meet **out);
    /* Free a state create made (fsdp_meet_fini included). */
    void (*destroy)(fsdp_meet *m);
} fsdp_meet_kind;

/* Room for n zeroed slots and the counters at 0; false when out of host
 * memory (create says so). fsdp_meet_fini frees the slots. */
bool fsdp_meet_init(fsdp_meet *m, int n);
void fsdp_meet_fini(fsdp_meet *m);

/* Attach global rank `rank`, member `index` of the members of g in this
 * process, to the group's table of kind k, creating it if this is the
 * first member; takes w->mu. INTERNAL if the member is attached already (a
 * communicator of it was never finalised). r's count of meetings continues
 * the slot's. */
fsdp_status fsdp_meet_attach(fsdp_meet_rank *r, fsdp_world *w, const fsdp_meet_kind *k,
                             const fsdp_comm_group *g, int rank, int index, void *arg);

/* Detach r (takes w->mu); the last member's detach frees the table. Safe
 * on a member that never attached. */
void fsdp_meet_detach(fsdp_meet_rank *r, fsdp_world *w, const fsdp_meet_kind *k,
                      const fsdp_comm_group *g);

/* Start collective number ++r->n_coll of kind a->kind on c: the fault hook
 * and argument checks (fsdp_comm_begin_check), then ABORTED "rank R:
 * collective K (kind) not started: <refused>" when the transport refuses
 * (refused non-NULL) or, "another rank failed", when the world's abort
 * flag is set; publish a, send and recv in the slot; the first meeting,
 * abortable, whose last member runs hook(c) first (NULL: none), STALLED
 * with the watchdog's report when it passes its deadline. On error
 * nothing of this member is read by the others. */
fsdp_status fsdp_meet_begin(fsdp_meet_rank *r, fsdp_comm *c, const fsdp_coll_args *a,
                            const void *send, void *recv, const char *refused,
                            void (*hook)(fsdp_comm *c));

/* The next meeting of a collective already begun: arrive and wait for
 * every member (not abortable, see above). */
void fsdp_meet_arrive(fsdp_meet_rank *r, fsdp_comm *c);

/* The slot of member i. */
static inline fsdp_meet_slot *fsdp_meet_slot_of(const fsdp_meet_rank *r, int i)
{
    return &r->m->slots[i];
}

#endif /* FSDP_COMM_MEET_H */
