/*
 * rdv_dir.c - the `dir` processes (comm/procs.h): a job's processes meet
 * through files in a directory they all see (a shared file system), as
 * NCCL's examples pass the unique id and llm.c's -pf option does. For
 * jobs without MPI; it carries small records, never collective data.
 *
 * Files (names are fixed; the directory must be empty when a job starts,
 * and a job that ends cleanly leaves it empty again):
 *   rec.<g>.<p>  process p's record of exchange g
 *   hb.<p>       process p's heartbeat: a counter its watcher rewrites
 *   abort        the job's first failure: rank, process, status, message
 *   done.<p>     process p ended cleanly (process 0 then removes the rest)
 * Every file is written under a temporary name and renamed into place, so
 * a reader sees all of it or nothing; `abort` is linked into place, so the
 * first failure wins. No fsync: nothing here must survive a crash.
 *
 * Each process runs a watcher thread (every HB_PERIOD_MS): it rewrites its
 * heartbeat, and fails the attached world (fsdp_world_fail with the rank
 * that failed) when `abort` appears or a peer's heartbeat stops changing
 * for dead_s seconds. Exchanges poll the same conditions. A record of
 * exchange g - 1 is removed once exchange g is complete: every process has
 * then read it (it wrote record g only after finishing exchange g - 1).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "comm/procs.h"
#include "core/clock.h"
#include "core/log.h"
#include "core/threads.h"

#define HB_PERIOD_MS 250

struct dir_ctx {
    char *dir;
    unsigned long gen;          /* exchanges done */
    double dead_s;
    pthread_mutex_t mu;         /* world, failure, stop */
    pthread_cond_t cv;
    fsdp_world *world;          /* attached world, or NULL */
    bool stop;                  /* the watcher should end */
    bool have_thread;
    pthread_t watcher;
    fsdp_status remote_st;      /* a failure seen in the directory (OK: none) */
    int remote_rank;            /* -1: the process itself failed */
    int remote_proc;
    char remote_msg[FSDP_ERROR_MSG_MAX];
    unsigned long *hb_seen;     /* (n,) last counter seen of each peer */
    double *hb_when;            /* (n,) when it last changed (0: never seen) */
};

static char *dir_path(const struct dir_ctx *d, char *buf, size_t n, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static char *dir_path(const struct dir_ctx *d, char *buf, size_t n, const char *fmt, ...)
{
    int k = snprintf(buf, n, "%s/", d->dir);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + k, n - (size_t)k, fmt, ap);
    va_end(ap);
    return buf;
}

/* Write bytes to path through a temporary name (unique to this process of
 * the job: pids repeat across nodes); link (first wins: EEXIST is OK and
 * leaves the existing file) or rename into place. */
static fsdp_status put_file(const char *path, const void *bytes, size_t n, bool link_only,
                            int process)
{
    char tmp[4300];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d.%ld", path, process, (long)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0)
        return fsdp_error_set(FSDP_STATUS_IO, "rendezvous: cannot create '%s': %s", tmp,
                              strerror(errno));
    const char *p = bytes;
    size_t left = n;
    while (left) {
        ssize_t w = write(fd, p, left);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            int e = errno;
            close(fd);
            unlink(tmp);
            return fsdp_error_set(FSDP_STATUS_IO, "rendezvous: writing '%s': %s", tmp,
                                  strerror(e));
        }
        p += w;
        left -= (size_t)w;
    }
    close(fd);
    int rc = link_only ? link(tmp, path) : rename(tmp, path);
    int e = errno;
    if (link_only)
        unlink(tmp);
    if (rc && !(link_only && e == EEXIST))
        return fsdp_error_set(FSDP_STATUS_IO, "rendezvous: cannot place '%s': %s", path,
                              strerror(e));
    return FSDP_STATUS_OK;
}

/* Read up to cap bytes of path; -1 if it does not exist (yet). */
static long get_file(const char *path, void *buf, size_t cap)
{
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return -1;
    size_t got = 0;
    while (got < cap) {
        ssize_t r = read(fd, (char *)buf + got, cap - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    close(fd);
    return (long)got;
}

/* ---- failures ------------------------------------------------------------------ */

/* Record the first failure of another process (rank -1: the process
 * itself) in ctx. Caller holds d->mu. */
static void remote_failed_locked(struct dir_ctx *d, int rank, int proc, fsdp_status st,
                                 const char *msg)
{
    d->remote_st = st;
    d->remote_rank = rank;
    d->remote_proc = proc;
    snprintf(d->remote_msg, sizeof d->remote_msg, "%s", msg);
}

/* The failure another process published in `abort`, if any. */
static void read_abort_locked(fsdp_procs *p)
{
    struct dir_ctx *d = p->ctx;
    char path[4200], text[FSDP_ERROR_MSG_MAX + 128];
    long n = get_file(dir_path(d, path, sizeof path, "abort"), text, sizeof text - 1);
    if (n <= 0)
        return;
    text[n] = '\0';
    int rank = -1, proc = -1, st = FSDP_STATUS_INTERNAL, off = 0;
    if (sscanf(text, "rank %d process %d status %d%n", &rank, &proc, &st, &off) < 3 ||
        proc < 0 || proc >= p->n_processes || rank < -1 || (unsigned)st >= FSDP_STATUS_COUNT ||
        st == FSDP_STATUS_OK) {
        remote_failed_locked(d, -1, 0, FSDP_STATUS_FORMAT, "the rendezvous directory's abort "
                             "file is garbled: another job shares the directory?");
        return;
    }
    if (proc != p->process) /* our own failure: the world has it already */
        remote_failed_locked(d, rank, proc, (fsdp_status)st, text + off + (text[off] == '\n'));
}

/* A peer whose heartbeat has not changed for dead_s seconds. */
static void read_heartbeats_locked(fsdp_procs *p, double now)
{
    struct dir_ctx *d = p->ctx;
    char path[4200], hb[32], msg[256];
    for (int q = 0; q < p->n_processes && d->dead_s > 0; q++) {
        if (q == p->process)
            continue;
        long k = get_file(dir_path(d, path, sizeof path, "hb.%d", q), hb, sizeof hb - 1);
        if (k <= 0)
            continue; /* not there yet (the exchange's timeout covers it), or ended cleanly */
        hb[k] = '\0';
        unsigned long v = strtoul(hb, NULL, 10);
        if (d->hb_when[q] == 0 || v != d->hb_seen[q]) {
            d->hb_seen[q] = v;
            d->hb_when[q] = now;
        } else if (now - d->hb_when[q] > d->dead_s) {
            snprintf(msg, sizeof msg, "process %d stopped: its heartbeat in %s has not changed "
                     "for %.0f s; it died or its node is unreachable", q, d->dir, d->dead_s);
            remote_failed_locked(d, -1, q, FSDP_STATUS_INTERNAL, msg);
            return;
        }
    }
}

/* Look for another process's failure (published, or a dead heartbeat);
 * the first one found is kept in ctx and handed to the attached world.
 * Caller holds d->mu. */
static void check_peers_locked(fsdp_procs *p, double now)
{
    struct dir_ctx *d = p->ctx;
    if (d->remote_st != FSDP_STATUS_OK)
        return;
    read_abort_locked(p);
    if (d->remote_st == FSDP_STATUS_OK)
        read_heartbeats_locked(p, now);
    if (d->remote_st == FSDP_STATUS_OK || !d->world)
        return;
    /* a failure of the process itself is charged to its first rank */
    fsdp_world *w = d->world;
    int rank = d->remote_rank >= 0 && d->remote_rank < w->n_ranks ? d->remote_rank
                                                                     : d->remote_proc * w->n_local;
    if (!fsdp_world_is_local(w, rank))
        fsdp_world_fail(w, rank, d->remote_st, d->remote_msg);
}

static void *watcher_main(void *arg)
{
    fsdp_procs *p = arg;
    struct dir_ctx *d = p->ctx;
    char path[4200], hb[32];
    pthread_mutex_lock(&d->mu);
    for (unsigned long beat = 1; !d->stop; beat++) {
        pthread_mutex_unlock(&d->mu);
        int n = snprintf(hb, sizeof hb, "%lu\n", beat);
        if (put_file(dir_path(d, path, sizeof path, "hb.%d", p->process), hb, (size_t)n, false,
                     p->process) != FSDP_STATUS_OK)
            FSDP_WARN(FSDP_SUB_COMM, "process %d: %s", p->process, fsdp_error_msg());
        pthread_mutex_lock(&d->mu);
        check_peers_locked(p, fsdp_now_s());
        if (!d->stop)
            fsdp_cond_wait_ns(&d->cv, &d->mu, HB_PERIOD_MS * 1000000L);
    }
    pthread_mutex_unlock(&d->mu);
    return NULL;
}

/* Publish this process's failure (rank -1: not a rank's) unless one is
 * there already. */
static void dir_publish(fsdp_procs *p, int rank, fsdp_status st, const char *msg)
{
    struct dir_ctx *d = p->ctx;
    char path[4200], text[FSDP_ERROR_MSG_MAX + 128];
    int n = snprintf(text, sizeof text, "rank %d process %d status %d\n%s", rank, p->process,
                     (int)st, msg);
    if (put_file(dir_path(d, path, sizeof path, "abort"), text,
                 n < (int)sizeof text ? (size_t)n : sizeof text - 1, true,
                 p->process) != FSDP_STATUS_OK)
        FSDP_ERR(FSDP_SUB_COMM, "process %d could not tell the others of its failure: %s",
                 p->process, fsdp_error_msg());
}

static void dir_fail(fsdp_procs *p, fsdp_world *w, int rank, fsdp_status st, const char *msg)
{
    (void)w;
    dir_publish(p, rank, st, msg);
}

/* ---- exchange ------------------------------------------------------------------ */

static fsdp_status dir_exchange(fsdp_procs *p, fsdp_world *w, const void *mine, size_t bytes,
                                void *all)
{
    struct dir_ctx *d = p->ctx;
    char path[4200], whom[64];
    unsigned long g = ++d->gen;
    FSDP_TRY(put_file(dir_path(d, path, sizeof path, "rec.%lu.%d", g, p->process), mine, bytes,
                      false, p->process));
    memcpy((char *)all + (size_t)p->process * bytes, mine, bytes);
    for (int q = 0; q < p->n_processes; q++) {
        if (q == p->process)
            continue;
        unsigned spins = 0;
        double t0 = fsdp_now_s();
        snprintf(whom, sizeof whom, "process %d", q);
        for (;;) {
            long n = get_file(dir_path(d, path, sizeof path, "rec.%lu.%d", g, q),
                              (char *)all + (size_t)q * bytes, bytes);
            if (n == (long)bytes)
                break;
            if (n >= 0)
                return fsdp_error_set(FSDP_STATUS_FORMAT,
                                      "rendezvous: %s holds %ld bytes, expected %zu: is %s "
                                      "shared by two jobs? give each job an empty directory",
                                      path, n, bytes, d->dir);
            pthread_mutex_lock(&d->mu);
            check_peers_locked(p, fsdp_now_s());
            fsdp_status rst = d->remote_st;
            pthread_mutex_unlock(&d->mu);
            if (rst != FSDP_STATUS_OK)
                return fsdp_error_set(rst == FSDP_STATUS_ABORTED ? rst : FSDP_STATUS_ABORTED,
                                      "process %d: exchange %lu abandoned: %s", p->process, g,
                                      d->remote_msg);
            FSDP_TRY(fsdp_procs_wait(p, w, &spins, t0, "rendezvous", whom));
        }
    }
    if (g > 1)
        unlink(dir_path(d, path, sizeof path, "rec.%lu.%d", g - 1, p->process));
    return FSDP_STATUS_OK;
}

/* ---- lifetime ------------------------------------------------------------------ */

static void dir_attach(fsdp_procs *p, fsdp_world *w)
{
    struct dir_ctx *d = p->ctx;
    pthread_mutex_lock(&d->mu);
    d->world = w;
    pthread_mutex_unlock(&d->mu);
}

static void dir_detach(fsdp_procs *p, fsdp_world *w)
{
    struct dir_ctx *d = p->ctx;
    pthread_mutex_lock(&d->mu);
    if (d->world == w)
        d->world = NULL;
    pthread_mutex_unlock(&d->mu);
}

static void stop_watcher(struct dir_ctx *d)
{
    if (!d->have_thread)
        return;
    fsdp_threads_stop(&d->mu, &d->cv, &d->stop, &d->watcher, 1);
    d->have_thread = false;
}

static void dir_free(fsdp_procs *p)
{
    struct dir_ctx *d = p->ctx;
    if (d) {
        stop_watcher(d);
        pthread_cond_destroy(&d->cv);
        pthread_mutex_destroy(&d->mu);
        free(d->dir);
        free(d->hb_seen);
        free(d->hb_when);
        free(d);
    }
    free(p);
}

/* The clean end: meet once more; then every process removes its own
 * heartbeat and says it is done (done.<p>), and process 0, once every
 * process is done (so nobody reads any more), removes the last records
 * and the done files. */
static fsdp_status dir_end(fsdp_procs *p)
{
    struct dir_ctx *d = p->ctx;
    char path[4200], one = 1;
    char *all = calloc((size_t)p->n_processes, 1);
    if (!all)
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory");
    fsdp_status st = dir_exchange(p, NULL, &one, 1, all);
    free(all);
    FSDP_TRY(st);
    stop_watcher(d);
    unlink(dir_path(d, path, sizeof path, "hb.%d", p->process));
    FSDP_TRY(put_file(dir_path(d, path, sizeof path, "done.%d", p->process), "1\n", 2, false,
                      p->process));
    if (p->process != 0)
        return FSDP_STATUS_OK;
    for (int q = 0; q < p->n_processes; q++) {
        unsigned spins = 0;
        double t0 = fsdp_now_s();
        char whom[64];
        snprintf(whom, sizeof whom, "process %d", q);
        while (access(dir_path(d, path, sizeof path, "done.%d", q), F_OK) != 0)
            FSDP_TRY(fsdp_procs_wait(p, NULL, &spins, t0, "the end of the job", whom));
    }
    for (int q = 0; q < p->n_processes; q++) {
        unlink(dir_path(d, path, sizeof path, "rec.%lu.%d", d->gen, q));
        unlink(dir_path(d, path, sizeof path, "done.%d", q));
    }
    return FSDP_STATUS_OK;
}

static fsdp_status dir_fini(fsdp_procs *p, fsdp_status st)
{
    if (st == FSDP_STATUS_OK)
        st = dir_end(p);
    if (st != FSDP_STATUS_OK) {
        char msg[FSDP_ERROR_MSG_MAX];
        snprintf(msg, sizeof msg, "process %d (host %s) ended with %s: %s", p->process, p->host,
                 fsdp_status_name(st), fsdp_error_msg());
        dir_publish(p, -1, st, msg);
    }
    dir_free(p);
    return st;
}

static const struct fsdp_procs_i dir_procs_i = {
    /* .name     = */ "dir",
    /* .exchange = */ dir_exchange,
    /* .xfer     = */ NULL, /* no collective data: NCCL brings its own network */
    /* .fail     = */ dir_fail,
    /* .attach   = */ dir_attach,
    /* .detach   = */ dir_detach,
    /* .fini     = */ dir_fini,
};

fsdp_status fsdp_procs_dir_init(fsdp_procs **out, const fsdp_procs_opts *o)
{
    *out = NULL;
    struct stat sb;
    if (stat(o->dir, &sb) || !S_ISDIR(sb.st_mode))
        return fsdp_error_set(FSDP_STATUS_IO,
                              "rendezvous directory '%s' (FSDP_RDV_DIR) is not a directory: "
                              "create it on a file system every process sees", o->dir);
    fsdp_procs *p = calloc(1, sizeof *p);
    struct dir_ctx *d = calloc(1, sizeof *d);
    if (p)
        p->ctx = d;
    if (d) {
        d->dir = strdup(o->dir);
        d->hb_seen = calloc((size_t)o->n_processes, sizeof *d->hb_seen);
        d->hb_when = calloc((size_t)o->n_processes, sizeof *d->hb_when);
        pthread_mutex_init(&d->mu, NULL);
        fsdp_cond_init_monotonic(&d->cv);
    }
    if (!p || !d || !d->dir || !d->hb_seen || !d->hb_when) {
        if (p)
            dir_free(p);
        else
            free(d);
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory for the rendezvous");
    }
    p->iface = &dir_procs_i;
    p->kind = FSDP_PROCS_DIR;
    p->process = o->process;
    p->n_processes = o->n_processes;
    p->timeout_s = o->timeout_s;
    d->dead_s = o->dead_s > 0 ? o->dead_s : 15;
    if (gethostname(p->host, sizeof p->host))
        snprintf(p->host, sizeof p->host, "?");
    p->host[sizeof p->host - 1] = '\0';
    char path[4200];
    if (access(dir_path(d, path, sizeof path, "abort"), F_OK) == 0 ||
        access(dir_path(d, path, sizeof path, "rec.1.%d", p->process), F_OK) == 0 ||
        access(dir_path(d, path, sizeof path, "hb.%d", p->process), F_OK) == 0) {
        fsdp_status st = fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                                        "rendezvous directory '%s' holds files of an earlier "
                                        "run (%s): give each job an empty directory",
                                        o->dir, path);
        dir_free(p);
        return st;
    }
    /* the first beat before anyone can see this process: a peer that dies
     * right after meeting must have left a heartbeat that stops */
    fsdp_status st = put_file(dir_path(d, path, sizeof path, "hb.%d", p->process), "0\n", 2,
                              false, p->process);
    if (st != FSDP_STATUS_OK) {
        dir_free(p);
        return st;
    }
    int rc = pthread_create(&d->watcher, NULL, watcher_main, p);
    if (rc) {
        dir_free(p);
        return fsdp_error_set(FSDP_STATUS_INTERNAL, "cannot start the rendezvous watcher: %s",
                              strerror(rc));
    }
    d->have_thread = true;
    *out = p;
    return FSDP_STATUS_OK;
}
