/*
 * test_mpi.c - jobs of several processes, in one process: the world's
 * placement of ranks (core/world.c), the summation tree cut at process
 * boundaries (comm/mpi_tree.c), the `mpi` transport (comm/mpi_coll.c) and
 * the cross-process rendezvous (comm/rdv.c), over a loopback stand-in for
 * MPI: P simulated processes, each a thread with its own world of L rank
 * threads, that trade messages through memory. It runs under ASan and
 * TSan; the same code under real mpirun is test_mpi_procs.c's.
 *
 * The loopback procs implement procs.h's contract as MPI does: messages
 * on a channel match in order, sizes must agree, waits poll the world's
 * abort flag; a local failure (the span's fail hook) fails every other
 * simulated process's world, as a watcher or MPI_Abort would end them.
 */
#include <check.h>
#include <pthread.h>
#include <string.h>

#include "coll_sweep.h"
#include "comm/cuda_comm.h"
#include "comm/mpi_coll.h"
#include "comm/mpi_layout.h"
#include "comm/mpi_tree.h"
#include "comm/procs.h"
#include "comm/transport.h"
#include "comm_util.h"
#include "core/clock.h"
#include "core/flight.h"
#include "core/world.h"
#include "device/device.h"
#include "testutil.h"

#define LOOP_MAX 8      /* simulated processes */
#define LOOP_CHANNELS 16 /* channels in use at once (slot 0: exchanges) */

/* ---- the loopback procs ---------------------------------------------------------- */

struct loop_msg {
    struct loop_msg *next;
    size_t bytes;
    unsigned char data[];
};

struct loop_job {
    int P;
    bool no_xfer;               /* act as the dir procs: no collective data */
    double watchdog_s;          /* > 0: every process's stall watchdog (core/flight.h) */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct loop_msg *head[LOOP_MAX][LOOP_MAX][LOOP_CHANNELS]; /* [from][to][channel] */
    struct loop_msg *tail[LOOP_MAX][LOOP_MAX][LOOP_CHANNELS];
    fsdp_world *worlds[LOOP_MAX];
    int n_fail_calls;
    int channel_ids[LOOP_CHANNELS]; /* the channel numbers of slots 1.. (0: free) */
};

/* The slot of channel ch (mu held): 0 for the exchanges' channel 0, else
 * the slot already given to ch or a new one. */
static int loop_slot_locked(struct loop_job *j, int ch)
{
    if (ch == 0)
        return 0;
    int k = 1;
    while (k < LOOP_CHANNELS && j->channel_ids[k] && j->channel_ids[k] != ch)
        k++;
    FSDP_ASSERT(k < LOOP_CHANNELS);
    j->channel_ids[k] = ch;
    return k;
}

static fsdp_status loop_xfer(fsdp_procs *p, fsdp_world *w, int ch, const fsdp_procs_msg *msgs,
                             int n, const char *what, bool *pending)
{
    *pending = false; /* sends are copied at once; receives end here */
    struct loop_job *j = p->ctx;
    int me = p->process;
    FSDP_ASSERT(ch >= 0);
    pthread_mutex_lock(&j->mu);
    ch = loop_slot_locked(j, ch);
    for (int i = 0; i < n; i++) {
        if (!msgs[i].send)
            continue;
        struct loop_msg *m = malloc(sizeof *m + msgs[i].bytes);
        FSDP_ASSERT(m);
        m->next = NULL;
        m->bytes = msgs[i].bytes;
        memcpy(m->data, msgs[i].buf, msgs[i].bytes);
        struct loop_msg **t = &j->tail[me][msgs[i].peer][ch];
        if (*t)
            (*t)->next = m;
        else
            j->head[me][msgs[i].peer][ch] = m;
        *t = m;
    }
    pthread_cond_broadcast(&j->cv);
    fsdp_status st = FSDP_STATUS_OK;
    for (int i = 0; i < n && st == FSDP_STATUS_OK; i++) {
        if (msgs[i].send)
            continue;
        struct loop_msg **h = &j->head[msgs[i].peer][me][ch];
        while (!*h && !(w && fsdp_world_aborted(w))) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += 5 * 1000 * 1000;
            ts.tv_sec += ts.tv_nsec / 1000000000L;
            ts.tv_nsec %= 1000000000L;
            pthread_cond_timedwait(&j->cv, &j->mu, &ts);
        }
        struct loop_msg *m = *h;
        if (!m) {
            st = fsdp_error_set(FSDP_STATUS_ABORTED, "process %d: %s abandoned: a rank failed",
                                me, what);
            break;
        }
        if (m->bytes != msgs[i].bytes) {
            st = fsdp_error_set(FSDP_STATUS_INTERNAL, "process %d: %s: %zu bytes from process "
                                "%d, %zu posted", me, what, m->bytes, msgs[i].peer,
                                msgs[i].bytes);
            break;
        }
        *h = m->next;
        if (!*h)
            j->tail[msgs[i].peer][me][ch] = NULL;
        memcpy(msgs[i].buf, m->data, m->bytes);
        free(m);
    }
    pthread_mutex_unlock(&j->mu);
    return st;
}

static fsdp_status loop_exchange(fsdp_procs *p, fsdp_world *w, const void *mine, size_t bytes,
                                 void *all)
{
    struct loop_job *j = p->ctx;
    fsdp_procs_msg msgs[2 * LOOP_MAX];
    int n = 0;
    for (int q = 0; q < j->P; q++) {
        if (q == p->process)
            continue;
        msgs[n++] = (fsdp_procs_msg){q, true, (void *)mine, bytes};
        msgs[n++] = (fsdp_procs_msg){q, false, (char *)all + (size_t)q * bytes, bytes};
    }
    memcpy((char *)all + (size_t)p->process * bytes, mine, bytes);
    bool pending;
    return loop_xfer(p, w, 0, msgs, n, "exchange", &pending);
}

static void loop_fail(fsdp_procs *p, fsdp_world *w, int rank, fsdp_status st, const char *msg)
{
    struct loop_job *j = p->ctx;
    (void)w;
    pthread_mutex_lock(&j->mu);
    j->n_fail_calls++;
    for (int q = 0; q < j->P; q++)
        if (q != p->process && j->worlds[q])
            fsdp_world_fail(j->worlds[q], rank, st, msg);
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
}

static void loop_attach(fsdp_procs *p, fsdp_world *w)
{
    struct loop_job *j = p->ctx;
    pthread_mutex_lock(&j->mu);
    j->worlds[p->process] = w;
    pthread_mutex_unlock(&j->mu);
}

static void loop_detach(fsdp_procs *p, fsdp_world *w)
{
    struct loop_job *j = p->ctx;
    pthread_mutex_lock(&j->mu);
    if (j->worlds[p->process] == w)
        j->worlds[p->process] = NULL;
    pthread_mutex_unlock(&j->mu);
}

static fsdp_status loop_fini(fsdp_procs *p, fsdp_status st)
{
    free(p);
    return st;
}

static const struct fsdp_procs_i loop_procs_i = {
    "loopback", loop_exchange, loop_xfer, loop_fail, loop_attach, loop_detach, loop_fini,
};
static const struct fsdp_procs_i loop_no_xfer_i = {
    "loopback", loop_exchange, NULL, loop_fail, loop_attach, loop_detach, loop_fini,
};

static void job_init(struct loop_job *j, int P)
{
    memset(j, 0, sizeof *j);
    ck_assert(P <= LOOP_MAX);
    j->P = P;
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
}

/* Free the job; every message must have been received. */
static void job_fini(struct loop_job *j, bool all_received)
{
    int left = 0;
    for (int a = 0; a < LOOP_MAX; a++)
        for (int b = 0; b < LOOP_MAX; b++)
            for (int c = 0; c < LOOP_CHANNELS; c++)
                for (struct loop_msg *m = j->head[a][b][c], *n; m; m = n, left++) {
                    n = m->next;
                    free(m);
                }
    if (all_received)
        ck_assert_msg(left == 0, "%d message(s) never received", left);
    pthread_cond_destroy(&j->cv);
    pthread_mutex_destroy(&j->mu);
}

/* ---- simulated processes ------------------------------------------------------- */

struct sim {
    struct loop_job *job;
    int me, n_local;
    fsdp_rank_fn fn;
    void *arg;
    fsdp_status st;                /* world init, then the launch */
    bool leaked;                   /* shared state of a transport left behind */
    char msg[FSDP_ERROR_MSG_MAX];
    pthread_t tid;
};

static void *sim_main(void *p)
{
    struct sim *s = p;
    fsdp_procs *pr = calloc(1, sizeof *pr);
    FSDP_ASSERT(pr);
    pr->iface = s->job->no_xfer ? &loop_no_xfer_i : &loop_procs_i;
    pr->kind = FSDP_PROCS_MPI;
    pr->process = s->me;
    pr->n_processes = s->job->P;
    pr->timeout_s = 60;
    pr->ctx = s->job;
    snprintf(pr->host, sizeof pr->host, "sim%d", s->me);
    fsdp_world *w = NULL;
    s->st = fsdp_procs_world_init(&w, pr, s->n_local);
    if (s->st == FSDP_STATUS_OK && s->job->watchdog_s > 0)
        s->st = fsdp_world_set_watchdog(w, s->job->watchdog_s, NULL);
    if (s->st == FSDP_STATUS_OK)
        s->st = fsdp_world_launch(w, s->fn, s->arg);
    snprintf(s->msg, sizeof s->msg, "%s", fsdp_error_msg());
    s->leaked = w && (w->comm_shared || w->rdv_shared);
    fsdp_world_free(w);
    fsdp_procs_fini(pr, FSDP_STATUS_OK);
    return NULL;
}

/* Run fn as a job of P simulated processes of L ranks each (n_local[p] if
 * given); sims[p] gets each process's status and message. */
static void run_job(struct loop_job *j, int P, int L, const int *n_local, fsdp_rank_fn fn,
                    void *arg, struct sim *sims)
{
    for (int p = 0; p < P; p++) {
        sims[p] = (struct sim){.job = j, .me = p, .n_local = n_local ? n_local[p] : L,
                               .fn = fn, .arg = arg};
        ck_assert_int_eq(pthread_create(&sims[p].tid, NULL, sim_main, &sims[p]), 0);
    }
    for (int p = 0; p < P; p++) {
        pthread_join(sims[p].tid, NULL);
        ck_assert_msg(!sims[p].leaked, "process %d: a transport's shared state outlived its "
                      "ranks", p);
    }
}

static void run_job_ok(int P, int L, fsdp_rank_fn fn, void *arg)
{
    struct loop_job j;
    struct sim sims[LOOP_MAX];
    job_init(&j, P);
    run_job(&j, P, L, NULL, fn, arg, sims);
    for (int p = 0; p < P; p++)
        ck_assert_msg(sims[p].st == FSDP_STATUS_OK, "%d x %d, process %d: %s: %s", P, L, p,
                      fsdp_status_name(sims[p].st), sims[p].msg);
    job_fini(&j, true);
}

/* Run fn as a job of P processes of L ranks each that is to fail; sims[p]
 * gets each process's status and message. Messages the failure left
 * unreceived are freed. */
static void run_job_failing(int P, int L, fsdp_rank_fn fn, void *arg, struct sim *sims)
{
    struct loop_job j;
    job_init(&j, P);
    run_job(&j, P, L, NULL, fn, arg, sims);
    job_fini(&j, false);
}

/* Every one of the P processes ended with st and a message holding frag. */
static void every_process_ended(const struct sim *sims, int P, fsdp_status st, const char *frag)
{
    for (int p = 0; p < P; p++)
        ck_assert_msg(sims[p].st == st && strstr(sims[p].msg, frag), "process %d: %s: %s", p,
                      fsdp_status_name(sims[p].st), sims[p].msg);
}

/* Run fn(arg) as job j (j->P processes of L ranks each, or n_local[p]):
 * every process must end with st and a message holding frag. */
static void run_job_ending(struct loop_job *j, int L, const int *n_local, fsdp_rank_fn fn,
                           const void *arg, fsdp_status st, const char *frag)
{
    struct sim sims[LOOP_MAX];
    run_job(j, j->P, L, n_local, fn, (void *)arg, sims);
    every_process_ended(sims, j->P, st, frag);
}

/* A cpu device and the mpi transport for a rank (comm picked by the table
 * for a job of w->n_processes). */
static fsdp_status env_init(struct rank_env *e, fsdp_world *w, int rank)
{
    memset(e, 0, sizeof *e);
    FSDP_TRY(fsdp_device_init(&e->dev, FSDP_BACKEND_CPU, w, rank, rank - w->rank_offset, 0));
    e->have_dev = true;
    if (w->n_processes > 1) {
        fsdp_transport_req req = {.backend = FSDP_BACKEND_CPU, .kind = FSDP_COMM_AUTO,
                                  .n_processes = w->n_processes};
        FSDP_TRY(fsdp_comm_init(&e->comm, &req, w, &e->dev, rank));
    } else {
        FSDP_TRY(fsdp_comm_mpi_init(&e->comm, w, &e->dev, rank));
    }
    e->have_comm = true;
    /* a job of one process gets mpi's in-process form: host */
    if (strcmp(e->comm.iface->name, w->n_processes > 1 ? "mpi" : "host"))
        return fsdp_error_set(FSDP_STATUS_INTERNAL, "rank %d: got transport %s", rank,
                              e->comm.iface->name);
    return FSDP_STATUS_OK;
}

/* ---- the world ------------------------------------------------------------------- */

struct span_log {
    int n_calls, rank;
    fsdp_status st;
    char msg[256];
    int ran[16];
};

static void span_fail(void *ctx, fsdp_world *w, int rank, fsdp_status st, const char *msg)
{
    struct span_log *l = ctx;
    (void)w;
    l->n_calls++;
    l->rank = rank;
    l->st = st;
    snprintf(l->msg, sizeof l->msg, "%s", msg);
}

static fsdp_status placement_rank(fsdp_world *w, int rank, void *arg)
{
    struct span_log *l = arg;
    l->ran[rank]++;
    fsdp_world_remove_rank_stop(w, rank, NULL, NULL); /* asserts the rank is local */
    if (rank == 3)
        return fsdp_error_set(FSDP_STATUS_IO, "rank 3 cannot read its shard");
    return FSDP_STATUS_OK;
}

START_TEST(test_world_places_ranks_in_processes)
{
    const char *hosts[3] = {"ha", "hb", "hc"};
    struct span_log l;
    memset(&l, 0, sizeof l);
    fsdp_world_span span = {.process = 1, .n_processes = 3, .hosts = hosts, .fail = span_fail,
                            .ctx = &l};
    fsdp_world *w;
    ck_assert_int_eq(fsdp_world_init_span(&w, 2, &span), FSDP_STATUS_OK);
    ck_assert_int_eq(w->n_ranks, 6);
    ck_assert_int_eq(w->n_local, 2);
    ck_assert_int_eq(w->rank_offset, 2);
    for (int r = 0; r < 6; r++) {
        ck_assert_int_eq(fsdp_world_is_local(w, r), r == 2 || r == 3);
        ck_assert_int_eq(fsdp_world_process_of(w, r), r / 2);
    }
    char where[96];
    ck_assert_str_eq(fsdp_world_where(w, 5, where, sizeof where), " (process 2 of 3, host hc)");
    /* only the local ranks run, with their global numbers; the first local
     * failure reaches the span once, with its rank and message */
    fsdp_status st = fsdp_world_launch(w, placement_rank, &l);
    ck_assert_int_eq(st, FSDP_STATUS_IO);
    ck_assert_str_eq(fsdp_error_msg(), "rank 3 (process 1 of 3, host hb): rank 3 cannot read its "
                                       "shard");
    for (int r = 0; r < 6; r++)
        ck_assert_int_eq(l.ran[r], r == 2 || r == 3);
    ck_assert_int_eq(l.n_calls, 1);
    ck_assert_int_eq(l.rank, 3);
    ck_assert_int_eq(l.st, FSDP_STATUS_IO);
    ck_assert_str_eq(l.msg, "rank 3 cannot read its shard");
    /* a failure of another process's rank is recorded, not sent back */
    fsdp_world_fail(w, 5, FSDP_STATUS_OOM, "rank 5 ran out of memory");
    ck_assert_int_eq(l.n_calls, 1);
    fsdp_world_free(w);
    /* one process: messages as before */
    ck_assert_int_eq(fsdp_world_init(&w, 2), FSDP_STATUS_OK);
    ck_assert_int_eq(w->rank_offset, 0);
    ck_assert_int_eq(w->n_processes, 1);
    ck_assert_str_eq(fsdp_world_where(w, 1, where, sizeof where), "");
    fsdp_world_free(w);
}
END_TEST

static fsdp_status barrier_rank(fsdp_world *w, int rank, void *arg)
{
    (void)rank, (void)arg;
    return fsdp_world_barrier(w);
}

/* Another process's failure may come before or between launches: it is
 * never lost, and the job cannot go on without that process. */
START_TEST(test_world_keeps_a_peer_failure)
{
    const char *hosts[2] = {"ha", "hb"};
    fsdp_world_span span = {.process = 0, .n_processes = 2, .hosts = hosts};
    fsdp_world *w;
    ck_assert_int_eq(fsdp_world_init_span(&w, 2, &span), FSDP_STATUS_OK);
    ck_assert_int_eq(fsdp_world_launch(w, barrier_rank, NULL), FSDP_STATUS_OK);
    fsdp_world_fail(w, 3, FSDP_STATUS_OOM, "rank 3 ran out of memory");
    for (int k = 0; k < 2; k++) {
        ck_assert_int_eq(fsdp_world_launch(w, barrier_rank, NULL), FSDP_STATUS_OOM);
        ck_assert_str_eq(fsdp_error_msg(), "rank 3 (process 1 of 2, host hb): rank 3 ran out of "
                                           "memory");
    }
    fsdp_world_free(w);
}
END_TEST

START_TEST(test_world_span_refuses_bad_layouts)
{
    fsdp_world *w;
    fsdp_world_span span = {.process = 2, .n_processes = 2};
    ck_assert_int_eq(fsdp_world_init_span(&w, 2, &span), FSDP_STATUS_INVALID_ARG);
    span.process = 0;
    ck_assert_int_eq(fsdp_world_init_span(&w, FSDP_MAX_RANKS / 2 + 1, &span),
                     FSDP_STATUS_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(fsdp_error_msg(), "in each of 2 processes"));
    ck_assert_int_eq(fsdp_world_init_span(&w, 0, &span), FSDP_STATUS_INVALID_ARG);
}
END_TEST

/* ---- the tree cut at process boundaries ------------------------------------------ */

/* Whether [lo, hi) is a node of the global tree over [0, n). */
static bool is_tree_node(int lo, int hi, int a, int b)
{
    if (lo == a && hi == b)
        return true;
    if (b - a < 2 || lo < a || hi > b)
        return false;
    int mid = a + (b - a) / 2;
    return is_tree_node(lo, hi, a, mid) || is_tree_node(lo, hi, mid, b);
}

START_TEST(test_cover_cuts_the_global_tree)
{
    float x[64], tmpmem[8][FSDP_MPI_BLOCK], *tmp[8], dst[FSDP_MPI_BLOCK];
    for (int i = 0; i < 8; i++)
        tmp[i] = tmpmem[i];
    for (int P = 1; P <= 8; P++)
        for (int L = 1; L <= 8; L++) {
            int N = P * L;
            fsdp_mpi_cover cv;
            ck_assert_int_eq(fsdp_mpi_cover_init(&cv, P, L), FSDP_STATUS_OK);
            ck_assert_int_le(cv.depth, 8);
            for (int q = 0; q < P; q++) {
                /* the nodes tile the process's block, in order, each a tree node */
                int at = q * L;
                for (int k = 0; k < cv.n_nodes[q]; k++) {
                    int lo = cv.node_lo[q * FSDP_MPI_COVER_MAX + k];
                    int hi = cv.node_hi[q * FSDP_MPI_COVER_MAX + k];
                    ck_assert_int_eq(lo, at);
                    ck_assert_int_gt(hi, lo);
                    ck_assert_msg(is_tree_node(lo, hi, 0, N), "%dx%d: [%d,%d) is no node", P, L,
                                  lo, hi);
                    at = hi;
                }
                ck_assert_int_eq(at, (q + 1) * L);
                if ((P & (P - 1)) == 0) /* a power of two: one node per process */
                    ck_assert_int_eq(cv.n_nodes[q], 1);
            }
            /* evaluating from every process's view, with the others' nodes as
             * payloads computed independently, gives fsdp_tree_sum exactly */
            for (int i = 0; i < N; i++)
                x[i] = sweep_gen(77, i, (size_t)(P * 10 + L));
            float want = fsdp_tree_sum(x, N);
            for (int me = 0; me < P; me++) {
                unsigned char pay[LOOP_MAX * 2][FSDP_MPI_COVER_MAX * 16];
                const unsigned char *remote[8] = {0};
                const void *leaf[8];
                for (int j = 0; j < L; j++)
                    leaf[j] = &x[me * L + j];
                for (int q = 0; q < P; q++) {
                    if (q == me)
                        continue;
                    for (int k = 0; k < cv.n_nodes[q]; k++) {
                        int lo = cv.node_lo[q * FSDP_MPI_COVER_MAX + k];
                        int hi = cv.node_hi[q * FSDP_MPI_COVER_MAX + k];
                        float v = fsdp_tree_sum(x + lo, hi - lo);
                        memcpy(pay[q] + fsdp_mpi_node_off(&cv, q, k, FSDP_DTYPE_F32, 1), &v, 4);
                    }
                    remote[q] = pay[q];
                }
                fsdp_mpi_tree_job jb = {.cv = &cv, .me = me, .dt = FSDP_DTYPE_F32,
                                        .leaf = leaf, .remote = remote, .len = 1, .off = 0,
                                        .n = 1};
                const float *got = fsdp_mpi_tree_eval(&jb, 0, N, dst, tmp);
                ck_assert_msg(!memcmp(got, &want, 4), "%dx%d from process %d: %.9g, want %.9g",
                              P, L, me, (double)*got, (double)want);
            }
            fsdp_mpi_cover_fini(&cv);
        }
}
END_TEST

/* The payload bytes of every collective balance: what each process sends
 * to the others is what they receive from it, summed over the job. */
START_TEST(test_inter_bytes_balance)
{
    static const int layouts[][2] = {{2, 2}, {3, 2}, {2, 3}, {4, 1}, {5, 3}, {8, 8}};
    for (size_t i = 0; i < FSDP_TEST_LEN(layouts); i++)
        for (int k = 0; k < FSDP_COLL_KIND_COUNT; k++)
            for (int d = 0; d < FSDP_DTYPE_COUNT; d++) {
                int P = layouts[i][0], L = layouts[i][1];
                size_t sent = 0, recv = 0, s, r;
                for (int p = 0; p < P; p++) {
                    ck_assert_int_eq(fsdp_comm_mpi_inter_bytes((fsdp_coll_kind)k, 1001,
                                                               (fsdp_dtype)d, P, L, p, L, &s,
                                                               &r),
                                     FSDP_STATUS_OK);
                    sent += s;
                    recv += r;
                }
                ck_assert_msg(sent == recv && sent > 0, "%dx%d %s: sent %zu, received %zu", P, L,
                              fsdp_coll_kind_name((fsdp_coll_kind)k), sent, recv);
                if (k == FSDP_COLL_ALL_GATHER) /* every chunk reaches every other process */
                    ck_assert_uint_eq(sent, (size_t)P * (P - 1) * L * 1001 *
                                                fsdp_dtype_size((fsdp_dtype)d));
                if (k == FSDP_COLL_BROADCAST)
                    ck_assert_uint_eq(sent,
                                      (size_t)(P - 1) * 1001 * fsdp_dtype_size((fsdp_dtype)d));
            }
    size_t s, r;
    /* one process sends nothing; a bad layout is refused */
    ck_assert_int_eq(fsdp_comm_mpi_inter_bytes(FSDP_COLL_ALL_REDUCE, 100, FSDP_DTYPE_F32, 1, 4, 0,
                                               0, &s, &r), FSDP_STATUS_OK);
    ck_assert_uint_eq(s + r, 0);
    ck_assert_int_eq(fsdp_comm_mpi_inter_bytes(FSDP_COLL_ALL_REDUCE, 100, FSDP_DTYPE_F32, 2, 4, 2,
                                               0, &s, &r), FSDP_STATUS_INVALID_ARG);
}
END_TEST

/* ---- the collectives --------------------------------------------------------------- */

struct sweep_arg {
    const size_t *sizes;
    int n_sizes;
    uint64_t digest[LOOP_MAX * LOOP_MAX];
};

static fsdp_status sweep_rank(fsdp_world *w, int rank, void *p)
{
    struct sweep_arg *a = p;
    struct rank_env e;
    fsdp_status st = env_init(&e, w, rank);
    if (st == FSDP_STATUS_OK)
        st = coll_sweep_rank(&e.comm, a->sizes, a->n_sizes, &a->digest[rank]);
    env_fini(&e);
    return st;
}

/* The job laid out as P x L, against the reference and against a host
 * world of the same N ranks in one process (digests). */
static const int sweep_layouts[][2] = {{1, 4}, {2, 2}, {4, 1}, {3, 2}, {2, 3}, {3, 1}, {1, 1}};

START_TEST(test_collectives_match_tree_and_host)
{
    static const size_t sizes[] = {1, 5, 2049, 9000};
    static const size_t small[] = {1, 5, 300};
    int P = sweep_layouts[_i][0], L = sweep_layouts[_i][1], N = P * L;
    struct sweep_arg a = {.sizes = FSDP_TEST_TSAN ? small : sizes,
                          .n_sizes = FSDP_TEST_TSAN ? 3 : 4};
    run_job_ok(P, L, sweep_rank, &a);
    uint64_t host[LOOP_MAX * LOOP_MAX] = {0};
    fsdp_status st = coll_sweep_host_digests(N, a.sizes, a.n_sizes, host);
    ck_assert_msg(st == FSDP_STATUS_OK, "host, %d ranks: %s", N, fsdp_error_msg());
    for (int r = 0; r < N; r++)
        ck_assert_msg(a.digest[r] == host[r], "%d x %d: rank %d's outputs differ from host's",
                      P, L, r);
}
END_TEST

/* Empty collectives, and the byte counters: comm.h's logical counts for
 * the N ranks, and the payload moved between processes on each process's
 * first rank, equal to fsdp_comm_mpi_inter_bytes. */
static fsdp_status count_rank(fsdp_world *w, int rank, void *p)
{
    (void)p;
    struct rank_env e;
    fsdp_status st = env_init(&e, w, rank);
    float buf[4 * 7 * 6] = {0}, out[4 * 7 * 6];
    int N = w->n_ranks;
    bool leader = rank == w->rank_offset;
    for (int k = 0; k < FSDP_COLL_KIND_COUNT && st == FSDP_STATUS_OK; k++)
        for (size_t numel = 0; numel < 8 && st == FSDP_STATUS_OK; numel += 7) {
            fsdp_comm_reset_stats(&e.comm);
            fsdp_dtype dt = numel ? FSDP_DTYPE_BF16 : FSDP_DTYPE_F32;
            switch (k) {
            case FSDP_COLL_ALL_GATHER:
                st = fsdp_comm_all_gather(&e.comm, buf, out, numel, dt, NULL);
                break;
            case FSDP_COLL_REDUCE_SCATTER:
                st = fsdp_comm_reduce_scatter(&e.comm, buf, out, numel, dt, FSDP_REDUCE_SUM,
                                              NULL);
                break;
            case FSDP_COLL_ALL_REDUCE:
                st = fsdp_comm_all_reduce(&e.comm, buf, out, numel, dt, FSDP_REDUCE_AVG, NULL);
                break;
            default:
                st = fsdp_comm_broadcast(&e.comm, buf, numel, dt, N - 1, NULL);
                break;
            }
            st = synced(&e.comm, st);
            if (st != FSDP_STATUS_OK)
                break;
            size_t s, r, es = fsdp_dtype_size(dt);
            st = fsdp_comm_mpi_inter_bytes((fsdp_coll_kind)k, numel, dt, w->n_processes,
                                           w->n_local, w->process, N - 1, &s, &r);
            if (!leader)
                s = r = 0;
            size_t chunk = numel * es, logical = k == FSDP_COLL_ALL_REDUCE
                                                     ? 2 * (chunk * (size_t)(N - 1) / (size_t)N)
                                                     : chunk * (size_t)(N - 1);
            if (k == FSDP_COLL_BROADCAST)
                logical = rank == N - 1 ? chunk : 0;
            if (st == FSDP_STATUS_OK &&
                (e.comm.bytes_inter_sent[k] != s || e.comm.bytes_inter_recv[k] != r ||
                 e.comm.bytes_sent[k] != logical))
                st = fsdp_error_set(FSDP_STATUS_INTERNAL,
                                    "rank %d, %s of %zu: inter sent %zu recv %zu (want %zu, %zu), "
                                    "logical sent %zu (want %zu)", rank,
                                    fsdp_coll_kind_name((fsdp_coll_kind)k), numel,
                                    e.comm.bytes_inter_sent[k], e.comm.bytes_inter_recv[k], s, r,
                                    e.comm.bytes_sent[k], logical);
        }
    env_fini(&e);
    return st;
}

START_TEST(test_counts_follow_the_layout)
{
    run_job_ok(3, 2, count_rank, NULL);
    run_job_ok(2, 3, count_rank, NULL);
}
END_TEST

/* ---- groups ---------------------------------------------------------------------- */

/* Hybrid sharding's communicators on P nodes of L ranks: the ranks of a
 * node, and the ranks with one local index on every node. A node's
 * reduce-scatter followed by an all-reduce across nodes adds each element
 * in the two-level tree (nodes' sums, then across nodes), which is comm.h's
 * tree over all N ranks when P is a power of two. The node group's
 * all-gather and the cross group's broadcast move the right bytes; the
 * cross group's bytes between processes (mpi) follow the layout formula
 * for P processes of one member. Runs as P processes (the loopback) or as
 * P simulated nodes in one process (host), with the same results. */
struct groups_arg {
    int P, L;
    fsdp_backend backend;
};

static fsdp_status groups_check(int rank, const char *what, size_t i, float got, float want)
{
    if (memcmp(&got, &want, sizeof got))
        return fsdp_error_set(FSDP_STATUS_INTERNAL, "rank %d: %s element %zu is %a, want %a",
                              rank, what, i, (double)got, (double)want);
    return FSDP_STATUS_OK;
}

static fsdp_status groups_rank(fsdp_world *w, int rank, void *p)
{
    const struct groups_arg *a = p;
    int P = a->P, L = a->L, N = P * L, q = rank / L, j = rank % L;
    const size_t shard = 3001, S = (size_t)L * shard;
    fsdp_device dev;
    fsdp_comm node, cross;
    bool have_node = false, have_cross = false;
    float *in = malloc(S * sizeof *in), *out = malloc(S * sizeof *out);
    float *sh = malloc(shard * sizeof *sh);
    fsdp_status st = in && out && sh ? FSDP_STATUS_OK : fsdp_error_set(FSDP_STATUS_OOM, "buffers");
    if (st == FSDP_STATUS_OK)
        st = fsdp_device_init(&dev, a->backend, w, rank, rank - w->rank_offset, 0);
    if (st != FSDP_STATUS_OK) {
        free(in), free(out), free(sh);
        return st;
    }
    fsdp_transport_req req = {.backend = a->backend, .n_processes = w->n_processes};
    fsdp_comm_group gn = {q * L, 1, L, L}, gc = {j, L, P, L};
    st = fsdp_comm_init_group(&node, &req, w, &dev, &gn, rank);
    have_node = st == FSDP_STATUS_OK;
    if (st == FSDP_STATUS_OK)
        st = fsdp_comm_init_group(&cross, &req, w, &dev, &gc, rank);
    have_cross = st == FSDP_STATUS_OK;
    if (st == FSDP_STATUS_OK && (node.rank != j || node.n_ranks != L || cross.rank != q ||
                                 cross.n_ranks != P || cross.global_rank != rank))
        st = fsdp_error_set(FSDP_STATUS_INTERNAL, "rank %d: group ranks %d/%d and %d/%d", rank,
                            node.rank, node.n_ranks, cross.rank, cross.n_ranks);
    bool computes = fsdp_device_computes(&dev);
    for (size_t i = 0; i < S; i++)
        in[i] = sweep_gen(7, rank, i);
    if (st == FSDP_STATUS_OK) {
        st = fsdp_comm_reduce_scatter(&node, in, sh, shard, FSDP_DTYPE_F32, FSDP_REDUCE_SUM, NULL);
        st = synced(&node, st);
    }
    if (st == FSDP_STATUS_OK) {
        st = fsdp_comm_all_reduce(&cross, sh, sh, shard, FSDP_DTYPE_F32, FSDP_REDUCE_SUM, NULL);
        st = synced(&cross, st);
    }
    for (size_t e = 0; computes && e < shard && st == FSDP_STATUS_OK; e++) {
        size_t i = (size_t)j * shard + e;
        float nodes[64], all[64];
        for (int n = 0; n < P; n++) {
            float mine[64];
            for (int k = 0; k < L; k++)
                all[n * L + k] = mine[k] = sweep_gen(7, n * L + k, i);
            nodes[n] = fsdp_tree_sum(mine, L);
        }
        float two_level = fsdp_tree_sum(nodes, P), flat = fsdp_tree_sum(all, N);
        st = groups_check(rank, "hybrid sum", i, sh[e], two_level);
        if (st == FSDP_STATUS_OK && !(P & (P - 1)))
            st = groups_check(rank, "hybrid sum vs one tree over every rank", i, sh[e], flat);
    }
    /* the node's all-gather of its shards, the cross group's broadcast */
    for (size_t e = 0; e < shard; e++)
        sh[e] = (float)(rank * 100000 + (int)e);
    if (st == FSDP_STATUS_OK) {
        st = fsdp_comm_all_gather(&node, sh, out, shard, FSDP_DTYPE_F32, NULL);
        st = synced(&node, st);
    }
    for (size_t i = 0; computes && i < S && st == FSDP_STATUS_OK; i++)
        st = groups_check(rank, "node all_gather", i, out[i],
                          (float)((q * L + (int)(i / shard)) * 100000 + (int)(i % shard)));
    fsdp_comm_reset_stats(&cross);
    if (st == FSDP_STATUS_OK) {
        st = fsdp_comm_broadcast(&cross, sh, shard, FSDP_DTYPE_F32, P - 1, NULL);
        st = synced(&cross, st);
    }
    for (size_t e = 0; computes && e < shard && st == FSDP_STATUS_OK; e++)
        st = groups_check(rank, "cross broadcast", e, sh[e],
                          (float)(((P - 1) * L + j) * 100000 + (int)e));
    /* bytes between processes (nodes, on meta): the layout of P x 1 */
    size_t want_s = 0, want_r = 0;
    if (st == FSDP_STATUS_OK && (w->n_processes > 1 || a->backend == FSDP_BACKEND_META))
        st = fsdp_comm_mpi_inter_bytes(FSDP_COLL_BROADCAST, shard, FSDP_DTYPE_F32, P, 1, q, P - 1,
                                       &want_s, &want_r);
    if (st == FSDP_STATUS_OK && (cross.bytes_inter_sent[FSDP_COLL_BROADCAST] != want_s ||
                                 cross.bytes_inter_recv[FSDP_COLL_BROADCAST] != want_r))
        st = fsdp_error_set(FSDP_STATUS_INTERNAL, "rank %d: broadcast across nodes: %zu/%zu "
                            "bytes between nodes, want %zu/%zu", rank,
                            cross.bytes_inter_sent[FSDP_COLL_BROADCAST],
                            cross.bytes_inter_recv[FSDP_COLL_BROADCAST], want_s, want_r);
    if (have_cross)
        fsdp_comm_fini(&cross);
    if (have_node)
        fsdp_comm_fini(&node);
    fsdp_device_fini(&dev);
    free(in), free(out), free(sh);
    return st;
}

static const int group_layouts[][2] = {{2, 2}, {2, 3}, {4, 2}, {3, 2}};

START_TEST(test_groups_hybrid_sums)
{
    int P = group_layouts[_i][0], L = group_layouts[_i][1];
    struct groups_arg a = {P, L, FSDP_BACKEND_CPU};
    run_job_ok(P, L, groups_rank, &a); /* P processes: mpi across them */
    for (int k = 0; k < 2; k++) {      /* P simulated nodes in one process: host, meta */
        a.backend = k ? FSDP_BACKEND_META : FSDP_BACKEND_CPU;
        fsdp_world *w;
        ck_assert_int_eq(fsdp_world_init(&w, P * L), FSDP_STATUS_OK);
        fsdp_status st = fsdp_world_launch(w, groups_rank, &a);
        ck_assert_msg(st == FSDP_STATUS_OK, "%s, %d x %d in one process: %s",
                      k ? "meta" : "host", P, L, fsdp_error_msg());
        ck_assert_ptr_null(w->comm_shared);
        fsdp_world_free(w);
    }
}
END_TEST

/* Groups must sit alike on every process; members of a group refuse it. */
START_TEST(test_groups_refuse_bad_layouts)
{
    fsdp_comm_group g = {0, 2, 3, 0};
    int nodes[8], P, L;
    ck_assert_int_eq(fsdp_comm_group_index(&g, 4), 2);
    ck_assert_int_eq(fsdp_comm_group_index(&g, 3), -1);
    ck_assert_int_eq(fsdp_comm_group_index(&g, 6), -1);
    ck_assert_int_eq(fsdp_comm_group_layout(&g, 2, &P, &L, nodes), FSDP_STATUS_OK);
    ck_assert_int_eq(P, 3);
    ck_assert_int_eq(L, 1);
    ck_assert_int_eq(nodes[2], 2);
    g = (fsdp_comm_group){1, 1, 4, 0}; /* ranks 1..4 on nodes of 2: 1 + 2 + 1 */
    ck_assert_int_eq(fsdp_comm_group_layout(&g, 2, &P, &L, nodes), FSDP_STATUS_INVALID_ARG);
    g = (fsdp_comm_group){0, 1, 4, 0};
    ck_assert_int_eq(fsdp_comm_group_layout(&g, 2, &P, &L, nodes), FSDP_STATUS_OK);
    ck_assert_int_eq(P * 10 + L, 22);
    fsdp_world *w;
    ck_assert_int_eq(fsdp_world_init(&w, 4), FSDP_STATUS_OK);
    g = (fsdp_comm_group){0, 2, 3, 0};
    ck_assert_int_eq(fsdp_comm_group_check(&g, w, 0, "test"), FSDP_STATUS_INVALID_ARG);
    g = (fsdp_comm_group){0, 2, 2, 0};
    ck_assert_int_eq(fsdp_comm_group_check(&g, w, 1, "test"), FSDP_STATUS_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(fsdp_error_msg(), "rank 1 is not a member"));
    ck_assert_int_eq(fsdp_comm_group_check(&g, w, 2, "test"), FSDP_STATUS_OK);
    fsdp_world_free(w);
}
END_TEST

/* ---- failures -------------------------------------------------------------------- */

/* Process 1 issues a different size: every rank of both processes fails,
 * the leaders naming both collectives. */
static fsdp_status mismatch_rank(fsdp_world *w, int rank, void *p)
{
    (void)p;
    struct rank_env e;
    float buf[64], out[256];
    fsdp_status st = env_init(&e, w, rank);
    if (st == FSDP_STATUS_OK) {
        st = fsdp_comm_all_gather(&e.comm, buf, out, w->process == 1 ? 31 : 30,
                                  FSDP_DTYPE_F32, NULL);
        st = synced(&e.comm, st);
    }
    env_fini(&e);
    return st;
}

START_TEST(test_mismatch_between_processes_fails_everywhere)
{
    struct sim sims[2];
    run_job_failing(2, 2, mismatch_rank, NULL, sims);
    for (int p = 0; p < 2; p++) {
        ck_assert_int_ne(sims[p].st, FSDP_STATUS_OK);
        ck_assert_msg(strstr(sims[p].msg, "mismatch between processes") &&
                          strstr(sims[p].msg, "all_gather(30 x fp32") &&
                          strstr(sims[p].msg, "all_gather(31 x fp32") &&
                          strstr(sims[p].msg, "host sim"),
                      "process %d: %s", p, sims[p].msg);
    }
}
END_TEST

/* Rank 3 (process 1) fails in its 3rd collective; process 0, waiting for
 * its data, ends too, with that first error named: rank, process, host,
 * collective. p: the fault's kind (FSDP_FAULT_COLLECTIVE, or STALL). */
static fsdp_status fault_rank(fsdp_world *w, int rank, void *p)
{
    struct rank_env e;
    float buf[40] = {0}, out[40];
    fsdp_status st = env_init(&e, w, rank);
    if (rank == 3) /* counted on rank 3's own thread: arm it there */
        fsdp_world_set_fault(w, *(const fsdp_fault_kind *)p, 3, 3);
    for (int i = 0; i < 10 && st == FSDP_STATUS_OK; i++) {
        st = fsdp_comm_all_reduce(&e.comm, buf, out, 10, FSDP_DTYPE_F32, FSDP_REDUCE_SUM, NULL);
        st = synced(&e.comm, st);
    }
    env_fini(&e);
    return st;
}

START_TEST(test_rank_failure_ends_every_process)
{
    struct loop_job j;
    job_init(&j, 2);
    static const fsdp_fault_kind fail = FSDP_FAULT_COLLECTIVE;
    struct sim sims[LOOP_MAX];
    run_job(&j, 2, 2, NULL, fault_rank, (void *)&fail, sims);
    /* where, then what (async cpu streams put the stream's words between them) */
    every_process_ended(sims, 2, FSDP_STATUS_INTERNAL, "rank 3 (process 1 of 2, host sim1): ");
    every_process_ended(sims, 2, FSDP_STATUS_INTERNAL,
                        "injected failure in collective 3 (all_reduce)");
    ck_assert_int_eq(j.n_fail_calls, 1); /* process 1 told the others once */
    job_fini(&j, false);
}
END_TEST

/* Rank 3 (process 1) never arrives at its 3rd collective: process 1's
 * other rank, waiting for it in the mpi transport's local meeting, reports
 * the stall (the stall watchdog, core/flight.h) and every process ends
 * with that report. */
START_TEST(test_stall_ends_every_process)
{
    struct loop_job j;
    job_init(&j, 2);
    j.watchdog_s = 0.4;
    double t0 = fsdp_now_s();
    static const fsdp_fault_kind stall = FSDP_FAULT_STALL;
    run_job_ending(&j, 2, NULL, fault_rank, &stall, FSDP_STATUS_STALLED,
                   "rank 2 (process 1 of 2, host sim1): stalled: waited");
    double dt = fsdp_now_s() - t0;
    ck_assert_msg(dt < 2.0, "the stall took %.2f s to end the job", dt);
    ck_assert_int_eq(j.n_fail_calls, 1); /* one report, told to the others once */
    job_fini(&j, false);
}
END_TEST

static fsdp_status devices_rank(fsdp_world *w, int rank, void *p)
{
    (void)w, (void)rank, (void)p;
    return FSDP_STATUS_OK;
}

START_TEST(test_processes_must_agree_on_devices)
{
    struct loop_job j;
    int n_local[2] = {2, 3};
    job_init(&j, 2);
    run_job_ending(&j, 0, n_local, devices_rank, NULL, FSDP_STATUS_INVALID_ARG,
                   "give every process the same --devices");
    job_fini(&j, true);
}
END_TEST

/* Processes that met through a rendezvous directory carry no collective
 * data: the cpu backend's transport says so. */
static fsdp_status no_data_rank(fsdp_world *w, int rank, void *p)
{
    (void)p;
    struct rank_env e;
    fsdp_status st = env_init(&e, w, rank);
    env_fini(&e);
    return st;
}

START_TEST(test_mpi_needs_procs_that_carry_data)
{
    struct loop_job j;
    job_init(&j, 2);
    j.no_xfer = true;
    run_job_ending(&j, 1, NULL, no_data_rank, NULL, FSDP_STATUS_UNSUPPORTED,
                   "launch them with mpirun");
    job_fini(&j, true);
}
END_TEST

/* ---- the rendezvous across processes (NCCL's id) --------------------------------- */

struct rdv_arg {
    int bad[LOOP_MAX * LOOP_MAX];
    int fail_rank;
};

static fsdp_status rdv_rank(fsdp_world *w, int rank, void *arg)
{
    struct rdv_arg *a = arg;
    fsdp_comm_rdv *r;
    FSDP_TRY(fsdp_comm_rdv_attach(w, &r));
    fsdp_status st = FSDP_STATUS_OK;
    for (int k = 0; k < 5 && st == FSDP_STATUS_OK; k++) {
        if (rank == a->fail_rank && k == 2) {
            st = fsdp_error_set(FSDP_STATUS_INTERNAL, "rank %d fails on purpose", rank);
            break;
        }
        long mine[2] = {rank, k}, all[LOOP_MAX * LOOP_MAX][2];
        st = fsdp_comm_rdv_exchange(r, w, rank, mine, sizeof mine, all, true);
        for (int q = 0; q < w->n_ranks && st == FSDP_STATUS_OK; q++)
            if (all[q][0] != q || all[q][1] != k)
                a->bad[rank]++;
    }
    fsdp_comm_rdv_detach(w, r);
    return st;
}

START_TEST(test_rdv_exchange_spans_processes)
{
    struct rdv_arg a = {.fail_rank = -1};
    run_job_ok(3, 2, rdv_rank, &a);
    for (int r = 0; r < 6; r++)
        ck_assert_int_eq(a.bad[r], 0);
    /* a rank that fails mid-way: every process ends, none hangs */
    struct sim sims[3];
    a.fail_rank = 4;
    run_job_failing(3, 2, rdv_rank, &a, sims);
    every_process_ended(sims, 3, FSDP_STATUS_INTERNAL,
                        "rank 4 (process 2 of 3, host sim2): rank 4 fails on purpose");
}
END_TEST

int main(void)
{
    const fsdp_test_tcase tcases[] = {
        {"layout", 120,
         FSDP_TESTS(test_world_places_ranks_in_processes, test_world_keeps_a_peer_failure,
                    test_world_span_refuses_bad_layouts, test_cover_cuts_the_global_tree,
                    test_inter_bytes_balance)},
        {"collectives", 300,
         FSDP_TESTS(FSDP_TEST_LOOP(test_collectives_match_tree_and_host,
                                   (int)FSDP_TEST_LEN(sweep_layouts)),
                    test_counts_follow_the_layout,
                    FSDP_TEST_LOOP(test_groups_hybrid_sums, (int)FSDP_TEST_LEN(group_layouts)),
                    test_groups_refuse_bad_layouts)},
        {"failures", 120,
         FSDP_TESTS(test_mismatch_between_processes_fails_everywhere,
                    test_rank_failure_ends_every_process, test_stall_ends_every_process,
                    test_processes_must_agree_on_devices, test_mpi_needs_procs_that_carry_data,
                    test_rdv_exchange_spans_processes)},
    };
    return fsdp_test_main("mpi", tcases, FSDP_TEST_LEN(tcases));
}
