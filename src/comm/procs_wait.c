/*
 * procs_wait.c - the wait on another process that every implementation of
 * the procs (mpi_procs.c, rdv_dir.c) polls with (contract in procs.h, at
 * fsdp_procs_wait): below procs.c, which picks the implementation.
 */
#include <sched.h>
#include <time.h>

#include "comm/procs.h"
#include "core/clock.h"
#include "core/flight.h"

fsdp_status fsdp_procs_wait(fsdp_procs *p, fsdp_world *w, unsigned *spins, double t0,
                            const char *what, const char *whom)
{
    if (w && fsdp_world_aborted(w))
        return fsdp_error_set(FSDP_STATUS_ABORTED,
                              "process %d: %s abandoned while waiting for %s: a rank failed",
                              p->process, what, whom);
    unsigned k = ++*spins;
    if (k < 64) {
        sched_yield(); /* the answer is often microseconds away */
        return FSDP_STATUS_OK;
    }
    double deadline = (k & 63) == 0 ? fsdp_watchdog_deadline(w, true) : 0;
    if (deadline > 0 && fsdp_now_s() - t0 > deadline)
        return fsdp_error_set(FSDP_STATUS_STALLED, "process %d (host %s): %s: no answer from %s "
                              "for %.1f s", p->process, p->host, what, whom, fsdp_now_s() - t0);
    if ((k & 63) == 0 && p->timeout_s > 0 && fsdp_now_s() - t0 > p->timeout_s)
        return fsdp_error_set(FSDP_STATUS_INTERNAL,
                              "process %d (host %s): %s: %s has not answered for %.0f s; it may "
                              "have died or hung (raise FSDP_PEER_TIMEOUT if its steps are that "
                              "slow)",
                              p->process, p->host, what, whom, p->timeout_s);
    /* 20 us naps at first, 200 us after ~40 ms of waiting: latency while a
     * collective is in flight, little CPU while a peer computes. */
    struct timespec ts = {0, k < 2000 ? 20 * 1000 : 200 * 1000};
    nanosleep(&ts, NULL);
    return FSDP_STATUS_OK;
}
