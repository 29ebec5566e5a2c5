/*
 * mpi_procs.c - the `mpi` processes (comm/procs.h): a job started by
 * mpirun, one process per node, MPI_COMM_WORLD's ranks being the processes.
 *
 * Threads: fsdp needs one MPI caller at a time, not concurrent ones: per
 * collective one thread per process (the first local rank) moves the data,
 * and the main thread calls MPI before and after the rank threads run. So
 * it asks for MPI_THREAD_SERIALIZED, checks at run time that Open MPI
 * provides it, and takes one mutex around every MPI call, which also
 * covers MPI_Abort from the watchdog. Waits never block inside MPI: they
 * post non-blocking operations and poll them (MPI_Test*, under the mutex),
 * checking the world's abort flag and the peer timeout between polls, so
 * Open MPI's progress runs in the polls.
 *
 * Failures: errors on our communicator return codes (MPI_ERRORS_RETURN)
 * instead of killing the job, so they reach the user as fsdp errors. A
 * process that dies is noticed by mpirun, which ends the others (Open
 * MPI's default; a process that exits non-zero without MPI_Finalize ends
 * the job too). A failure in this process ends the job through
 * fsdp_procs_fini (MPI_Abort); should this process not get there within
 * FSDP_ABORT_GRACE seconds of its first failure (a rank stuck in a long
 * computation), the watchdog prints the failure and calls MPI_Abort.
 *
 * Only this file and mpi_stub.c know whether the build has MPI.
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <mpi.h>

#include "comm/procs.h"
#include "core/clock.h"
#include "core/fileio.h"
#include "core/log.h"
#include "core/threads.h"

/* Largest piece of one message (MPI counts are int). */
#define MPI_PIECE ((size_t)1 << 30)

struct mpi_ctx {
    MPI_Comm comm;             /* a duplicate of MPI_COMM_WORLD, errors returned */
    pthread_mutex_t mu;        /* held around every MPI call */
    bool we_init;              /* MPI_Init_thread was ours: we finalize */
    double grace_s;
    /* the watchdog */
    pthread_t dog;
    bool have_dog;
    pthread_mutex_t dog_mu;
    pthread_cond_t dog_cv;
    bool dog_armed, dog_stop;
    double dog_deadline;
    char dog_msg[FSDP_ERROR_MSG_MAX + 128];
};

static const char *mpi_err(int rc, char *buf)
{
    int n = 0;
    if (MPI_Error_string(rc, buf, &n) != MPI_SUCCESS)
        snprintf(buf, MPI_MAX_ERROR_STRING, "MPI error %d", rc);
    return buf;
}

static const char *thread_level_name(int level)
{
    return level == MPI_THREAD_SINGLE       ? "MPI_THREAD_SINGLE"
           : level == MPI_THREAD_FUNNELED   ? "MPI_THREAD_FUNNELED"
           : level == MPI_THREAD_SERIALIZED ? "MPI_THREAD_SERIALIZED"
           : level == MPI_THREAD_MULTIPLE   ? "MPI_THREAD_MULTIPLE"
                                            : "unknown";
}

/* End every process of the job now, this one included. */
static void abort_job(struct mpi_ctx *m)
{
    fflush(stdout);
    fflush(stderr);
    pthread_mutex_lock(&m->mu);
    MPI_Abort(MPI_COMM_WORLD, 1);
    _exit(1); /* MPI_Abort does not return; should it, do not linger */
}

static void *watchdog_main(void *arg)
{
    struct mpi_ctx *m = arg;
    pthread_mutex_lock(&m->dog_mu);
    while (!m->dog_stop) {
        if (!m->dog_armed) {
            pthread_cond_wait(&m->dog_cv, &m->dog_mu);
            continue;
        }
        double left = m->dog_deadline - fsdp_now_s();
        if (left <= 0) {
            fprintf(stderr, "fsdp: %s\nfsdp: this process did not end within %g s of that "
                    "failure (FSDP_ABORT_GRACE); ending every process of the job\n",
                    m->dog_msg, m->grace_s);
            pthread_mutex_unlock(&m->dog_mu);
            abort_job(m);
        }
        fsdp_cond_wait_ns(&m->dog_cv, &m->dog_mu, (long)((left < 0.5 ? left : 0.5) * 1e9));
    }
    pthread_mutex_unlock(&m->dog_mu);
    return NULL;
}

static void mpi_fail(fsdp_procs *p, fsdp_world *w, int rank, fsdp_status st, const char *msg)
{
    struct mpi_ctx *m = p->ctx;
    char where[96];
    pthread_mutex_lock(&m->dog_mu);
    if (!m->dog_armed) {
        snprintf(m->dog_msg, sizeof m->dog_msg, "rank %d%s failed (%s): %s", rank,
                 fsdp_world_where(w, rank, where, sizeof where), fsdp_status_name(st), msg);
        m->dog_deadline = fsdp_now_s() + m->grace_s;
        m->dog_armed = true;
        pthread_cond_broadcast(&m->dog_cv);
    }
    pthread_mutex_unlock(&m->dog_mu);
}

/* Poll req until done (MPI_Test under the mutex), polling the world and
 * the timeout between tests. */
static fsdp_status wait_all(fsdp_procs *p, fsdp_world *w, int n, MPI_Request *reqs,
                            MPI_Status *sts, const char *what, const char *whom)
{
    struct mpi_ctx *m = p->ctx;
    unsigned spins = 0;
    double t0 = fsdp_now_s();
    for (;;) {
        int done = 0;
        pthread_mutex_lock(&m->mu);
        int rc = MPI_Testall(n, reqs, &done, sts);
        pthread_mutex_unlock(&m->mu);
        if (rc != MPI_SUCCESS) {
            char e[MPI_MAX_ERROR_STRING];
            for (int i = 0; rc == MPI_ERR_IN_STATUS && i < n; i++)
                if (sts[i].MPI_ERROR != MPI_SUCCESS && sts[i].MPI_ERROR != MPI_ERR_PENDING) {
                    rc = sts[i].MPI_ERROR;
                    break;
                }
            return fsdp_error_set(FSDP_STATUS_INTERNAL, "process %d (host %s): %s with %s "
                                  "failed in MPI: %s", p->process, p->host, what, whom,
                                  mpi_err(rc, e));
        }
        if (done)
            return FSDP_STATUS_OK;
        FSDP_TRY(fsdp_procs_wait(p, w, &spins, t0, what, whom));
    }
}

static fsdp_status mpi_exchange(fsdp_procs *p, fsdp_world *w, const void *mine, size_t bytes,
                                void *all)
{
    struct mpi_ctx *m = p->ctx;
    if (bytes > INT_MAX)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "exchange of %zu bytes per process: too "
                              "large", bytes);
    MPI_Request req;
    MPI_Status status;
    pthread_mutex_lock(&m->mu);
    int rc = MPI_Iallgather(mine, (int)bytes, MPI_BYTE, all, (int)bytes, MPI_BYTE, m->comm, &req);
    pthread_mutex_unlock(&m->mu);
    if (rc != MPI_SUCCESS) {
        char e[MPI_MAX_ERROR_STRING];
        return fsdp_error_set(FSDP_STATUS_INTERNAL, "process %d: MPI_Iallgather: %s", p->process,
                              mpi_err(rc, e));
    }
    return wait_all(p, w, 1, &req, &status, "exchange of records", "the other processes");
}

/* A transfer that passed the stall watchdog's deadline: STALLED, its
 * message which processes have answered (every operation with them done)
 * and which have not; m->mu held. */
static fsdp_status stalled_peers(fsdp_procs *p, fsdp_world *w, MPI_Request *reqs,
                                 const int *peer, size_t k)
{
    int P = p->n_processes;
    char *state = calloc((size_t)P, 1); /* 1: in the transfer, 2: has not answered */
    if (!state)
        return fsdp_error_set(FSDP_STATUS_STALLED, "the other processes have not answered");
    for (size_t i = 0; i < k; i++) {
        int flag = 1;
        if (reqs[i] != MPI_REQUEST_NULL)
            MPI_Request_get_status(reqs[i], &flag, MPI_STATUS_IGNORE);
        if (state[peer[i]] < 2)
            state[peer[i]] = flag ? 1 : 2;
    }
    fsdp_sbuf in = {0}, out = {0};
    fsdp_sbuf_printf(&in, "process %d (this one)", p->process);
    for (int q = 0; q < P; q++) {
        fsdp_sbuf *b = state[q] == 2 ? &out : state[q] == 1 ? &in : NULL;
        if (!b)
            continue;
        fsdp_sbuf_printf(b, "%sprocess %d (host %s", b->n ? ", " : "", q, w ? w->hosts[q] : "?");
        if (w)
            fsdp_sbuf_printf(b, ", ranks %d-%d", q * w->n_local, (q + 1) * w->n_local - 1);
        fsdp_sbuf_printf(b, ")");
    }
    fsdp_status st = fsdp_error_set(FSDP_STATUS_STALLED, "answered: %s; not answered: %s",
                                    in.p ? in.p : "?", out.p ? out.p : "none");
    free(in.p);
    free(out.p);
    free(state);
    return st;
}

static fsdp_status mpi_xfer(fsdp_procs *p, fsdp_world *w, int channel, const fsdp_procs_msg *msgs,
                            int n_msgs, const char *what, bool *pending)
{
    *pending = false;
    struct mpi_ctx *m = p->ctx;
    size_t n = 0;
    for (int i = 0; i < n_msgs; i++)
        n += msgs[i].bytes ? (msgs[i].bytes + MPI_PIECE - 1) / MPI_PIECE : 1;
    MPI_Request *reqs = calloc(n, sizeof *reqs);
    MPI_Status *sts = calloc(n, sizeof *sts);
    size_t *want = calloc(n, sizeof *want);
    int *peer = calloc(n, sizeof *peer);
    fsdp_status st = FSDP_STATUS_OK;
    if (!reqs || !sts || !want || !peer) {
        st = fsdp_error_set(FSDP_STATUS_OOM, "process %d: out of host memory posting %s",
                            p->process, what);
        goto out;
    }
    size_t k = 0;
    pthread_mutex_lock(&m->mu);
    for (int i = 0; i < n_msgs && st == FSDP_STATUS_OK; i++) {
        const fsdp_procs_msg *g = &msgs[i];
        size_t off = 0;
        do {
            size_t len = g->bytes - off < MPI_PIECE ? g->bytes - off : MPI_PIECE;
            char *at = (char *)g->buf + off;
            int rc = g->send ? MPI_Isend(at, (int)len, MPI_BYTE, g->peer, channel, m->comm,
                                         &reqs[k])
                             : MPI_Irecv(at, (int)len, MPI_BYTE, g->peer, channel, m->comm,
                                         &reqs[k]);
            if (rc != MPI_SUCCESS) {
                char e[MPI_MAX_ERROR_STRING];
                st = fsdp_error_set(FSDP_STATUS_INTERNAL, "process %d: %s: posting %zu bytes "
                                    "%s process %d failed: %s", p->process, what, len,
                                    g->send ? "to" : "from", g->peer, mpi_err(rc, e));
                break;
            }
            want[k] = g->send ? SIZE_MAX : len;
            peer[k] = g->peer;
            k++;
            off += len;
        } while (off < g->bytes);
    }
    pthread_mutex_unlock(&m->mu);
    if (st == FSDP_STATUS_OK)
        st = wait_all(p, w, (int)k, reqs, sts, what, "the other processes");
    if (st != FSDP_STATUS_OK) {
        *pending = k > 0; /* never cancelled: MPI may still read or write them */
        /* name who has not answered */
        char who[160] = "";
        pthread_mutex_lock(&m->mu);
        for (size_t i = 0; i < k; i++) {
            int flag = 1;
            if (reqs[i] != MPI_REQUEST_NULL)
                MPI_Request_get_status(reqs[i], &flag, MPI_STATUS_IGNORE);
            if (!flag) { /* the first one pending is enough */
                snprintf(who, sizeof who, "; waiting on process %d (%s it)", peer[i],
                         want[i] == SIZE_MAX ? "sending to" : "receiving from");
                break;
            }
        }
        if (st == FSDP_STATUS_STALLED)
            st = stalled_peers(p, w, reqs, peer, k);
        pthread_mutex_unlock(&m->mu);
        if (*who && st != FSDP_STATUS_STALLED)
            fsdp_error_set(st, "%s%s", fsdp_error_msg(), who);
        goto out;
    }
    for (size_t i = 0; i < k; i++) {
        int got = 0;
        if (want[i] == SIZE_MAX)
            continue;
        MPI_Get_count(&sts[i], MPI_BYTE, &got);
        if ((size_t)got != want[i]) {
            st = fsdp_error_set(FSDP_STATUS_INTERNAL, "process %d: %s: process %d sent %d bytes "
                                "where %zu were expected", p->process, what, peer[i], got,
                                want[i]);
            break;
        }
    }
out:
    free(reqs);
    free(sts);
    free(want);
    free(peer);
    return st;
}

static void stop_watchdog(struct mpi_ctx *m)
{
    if (!m->have_dog)
        return;
    fsdp_threads_stop(&m->dog_mu, &m->dog_cv, &m->dog_stop, &m->dog, 1);
    m->have_dog = false;
}

static void mpi_free(fsdp_procs *p)
{
    struct mpi_ctx *m = p->ctx;
    if (m) {
        stop_watchdog(m);
        pthread_cond_destroy(&m->dog_cv);
        pthread_mutex_destroy(&m->dog_mu);
        pthread_mutex_destroy(&m->mu);
        free(m);
    }
    free(p);
}

static fsdp_status mpi_fini(fsdp_procs *p, fsdp_status st)
{
    struct mpi_ctx *m = p->ctx;
    if (st != FSDP_STATUS_OK) {
        fprintf(stderr, "fsdp: process %d of %d (host %s) failed (%s); ending every process of "
                "the job\n", p->process, p->n_processes, p->host, fsdp_status_name(st));
        abort_job(m);
    }
    stop_watchdog(m);
    pthread_mutex_lock(&m->mu);
    MPI_Comm_free(&m->comm);
    if (m->we_init)
        MPI_Finalize();
    pthread_mutex_unlock(&m->mu);
    mpi_free(p);
    return FSDP_STATUS_OK;
}

static const struct fsdp_procs_i mpi_procs_i = {
    /* .name     = */ "mpi",
    /* .exchange = */ mpi_exchange,
    /* .xfer     = */ mpi_xfer,
    /* .fail     = */ mpi_fail,
    /* .attach   = */ NULL, /* failures elsewhere end this process through mpirun */
    /* .detach   = */ NULL,
    /* .fini     = */ mpi_fini,
};

const bool fsdp_procs_mpi_built = true;

fsdp_status fsdp_procs_mpi_init(fsdp_procs **out, const fsdp_procs_opts *o)
{
    *out = NULL;
    int inited = 0, provided = MPI_THREAD_SINGLE, rc;
    char e[MPI_MAX_ERROR_STRING];
    MPI_Initialized(&inited);
    fsdp_procs *p = calloc(1, sizeof *p);
    struct mpi_ctx *m = calloc(1, sizeof *m);
    if (!p || !m) {
        free(p);
        free(m);
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory starting MPI");
    }
    p->ctx = m;
    pthread_mutex_init(&m->mu, NULL);
    pthread_mutex_init(&m->dog_mu, NULL);
    fsdp_cond_init_monotonic(&m->dog_cv);
    if (!inited) {
        rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided);
        if (rc != MPI_SUCCESS) {
            mpi_free(p);
            return fsdp_error_set(FSDP_STATUS_INTERNAL, "MPI_Init_thread failed: %s",
                                  mpi_err(rc, e));
        }
        m->we_init = true;
    } else {
        MPI_Query_thread(&provided);
    }
    if (provided < MPI_THREAD_SERIALIZED) {
        if (m->we_init)
            MPI_Finalize();
        mpi_free(p);
        return fsdp_error_set(FSDP_STATUS_UNSUPPORTED,
                              "this MPI provides %s, but fsdp needs MPI_THREAD_SERIALIZED (its "
                              "rank threads take turns calling MPI): use an MPI built with "
                              "thread support (Debian's Open MPI is)",
                              thread_level_name(provided));
    }
    MPI_Comm_dup(MPI_COMM_WORLD, &m->comm);
    MPI_Comm_set_errhandler(m->comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(m->comm, &p->process);
    MPI_Comm_size(m->comm, &p->n_processes);
    p->iface = &mpi_procs_i;
    p->kind = FSDP_PROCS_MPI;
    p->timeout_s = o->timeout_s;
    m->grace_s = o->abort_grace_s > 0 ? o->abort_grace_s : 10;
    if (gethostname(p->host, sizeof p->host))
        snprintf(p->host, sizeof p->host, "?");
    p->host[sizeof p->host - 1] = '\0';
    if (p->n_processes > FSDP_MAX_RANKS) {
        mpi_fini(p, FSDP_STATUS_OK);
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "mpirun started %d processes; at most %d",
                              p->n_processes, FSDP_MAX_RANKS);
    }
    rc = pthread_create(&m->dog, NULL, watchdog_main, m);
    if (rc) {
        mpi_fini(p, FSDP_STATUS_OK);
        return fsdp_error_set(FSDP_STATUS_INTERNAL, "cannot start the MPI watchdog: %s",
                              strerror(rc));
    }
    m->have_dog = true;
    *out = p;
    return FSDP_STATUS_OK;
}
