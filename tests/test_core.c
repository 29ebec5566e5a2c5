/*
 * test_core.c - the runtime under everything: rank threads and their world
 * (launch/join, barrier, first error, abort, relaunch, fault hook, stop
 * hooks), status and dtype names, per-thread error messages and the first
 * error kept through teardown, byte sizes, logging settings.
 *
 * Rank threads never call Check's assertions: they record what they saw in
 * the test's argument struct (or return an error with a message) and the
 * main thread asserts after the join.
 */
#include <check.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/error.h"
#include "core/flight.h"
#include "core/json.h"
#include "core/log.h"
#include "core/rng.h"
#include "core/utf8.h"
#include "core/world.h"
#include "device/device.h"
#include "testutil.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* What each rank saw, for the main thread to check. */
struct ranks_seen {
    atomic_int n_ran;
    int ran[16];
    int log_rank[16];
    fsdp_status st[16];
    char msg[16][FSDP_ERROR_MSG_MAX];
    double t_return[16];   /* when the rank's body returned */
    double t_fail;         /* when the failing rank returned its error */
    atomic_int counter;
};

/* ---- launch and join ------------------------------------------------------ */

static fsdp_status ok_rank(fsdp_world *w, int rank, void *p)
{
    struct ranks_seen *s = p;
    s->ran[rank]++;
    s->log_rank[rank] = fsdp_log_rank();
    atomic_fetch_add(&s->n_ran, 1);
    (void)w;
    return FSDP_STATUS_OK;
}

START_TEST(test_launch_runs_every_rank_once)
{
    static const int sizes[] = {1, 2, 3, 8, 16};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        int n = sizes[i];
        fsdp_world *w = NULL;
        ck_assert_int_eq(fsdp_world_init(&w, n), FSDP_STATUS_OK);
        ck_assert_int_eq(w->n_ranks, n);
        struct ranks_seen s;
        memset(&s, 0, sizeof s);
        ck_assert_int_eq(fsdp_world_launch(w, ok_rank, &s), FSDP_STATUS_OK);
        ck_assert_int_eq(atomic_load(&s.n_ran), n);
        for (int r = 0; r < n; r++) {
            ck_assert_int_eq(s.ran[r], 1);
            ck_assert_int_eq(s.log_rank[r], r); /* log lines of rank r say "rank r" */
        }
        ck_assert(!fsdp_world_aborted(w));
        fsdp_world_free(w);
    }
    ck_assert_int_eq(fsdp_log_rank(), -1); /* the main thread has no rank */
}
END_TEST

START_TEST(test_world_init_rejects_bad_sizes)
{
    fsdp_world *w = NULL;
    ck_assert_int_eq(fsdp_world_init(&w, 0), FSDP_STATUS_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(fsdp_error_msg(), "got 0"));
    ck_assert_int_eq(fsdp_world_init(&w, -3), FSDP_STATUS_INVALID_ARG);
    ck_assert_int_eq(fsdp_world_init(&w, 1025), FSDP_STATUS_INVALID_ARG);
    ck_assert_ptr_null(w);
    fsdp_world_free(NULL); /* no-op */
}
END_TEST

/* ---- barrier -------------------------------------------------------------- */

static fsdp_status barrier_rank(fsdp_world *w, int rank, void *p)
{
    struct ranks_seen *s = p;
    int n = w->n_ranks;
    for (int it = 0; it < 200; it++) {
        atomic_fetch_add(&s->counter, 1);
        FSDP_TRY(fsdp_world_barrier(w));
        /* every rank has counted this round, and nobody the next one yet */
        int c = atomic_load(&s->counter);
        if (c != n * (it + 1))
            return fsdp_error_set(FSDP_STATUS_INTERNAL,
                                  "round %d: counter %d after the barrier, expected %d", it, c,
                                  n * (it + 1));
        FSDP_TRY(fsdp_world_barrier(w));
    }
    (void)rank;
    return FSDP_STATUS_OK;
}

START_TEST(test_barrier_separates_rounds)
{
    static const int sizes[] = {1, 2, 5, 8};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        fsdp_world *w = NULL;
        ck_assert_int_eq(fsdp_world_init(&w, sizes[i]), FSDP_STATUS_OK);
        struct ranks_seen s;
        memset(&s, 0, sizeof s);
        fsdp_status st = fsdp_world_launch(w, barrier_rank, &s);
        ck_assert_msg(st == FSDP_STATUS_OK, "%d ranks: %s", sizes[i], fsdp_error_msg());
        fsdp_world_free(w);
    }
}
END_TEST

/* ---- failures ------------------------------------------------------------- */

/* Rank `bad` fails after 50 ms with IO; the others wait in a barrier and
 * record how they returned. */
struct fail_arg {
    struct ranks_seen s;
    int bad;
    fsdp_status bad_status;
};

static fsdp_status fail_rank(fsdp_world *w, int rank, void *p)
{
    struct fail_arg *a = p;
    fsdp_status st;
    if (rank == a->bad) {
        usleep(50000);
        st = fsdp_error_set(a->bad_status, "cannot open 'data/x.bin': No such file");
        a->s.t_fail = now_s();
    } else {
        st = fsdp_world_barrier(w);
    }
    a->s.st[rank] = st;
    snprintf(a->s.msg[rank], sizeof a->s.msg[rank], "%s", st ? fsdp_error_msg() : "");
    a->s.t_return[rank] = now_s();
    return st;
}

START_TEST(test_failing_rank_aborts_barrier_waiters)
{
    int n = 6;
    fsdp_world *w = NULL;
    ck_assert_int_eq(fsdp_world_init(&w, n), FSDP_STATUS_OK);
    struct fail_arg a;
    memset(&a, 0, sizeof a);
    a.bad = 4;
    a.bad_status = FSDP_STATUS_IO;
    fsdp_status st = fsdp_world_launch(w, fail_rank, &a);
    ck_assert_int_eq(st, FSDP_STATUS_IO);
    ck_assert_str_eq(fsdp_error_msg(), "rank 4: cannot open 'data/x.bin': No such file");
    ck_assert(fsdp_world_aborted(w));
    ck_assert_int_eq(w->first_rank, 4);
    for (int r = 0; r < n; r++) {
        if (r == a.bad)
            continue;
        ck_assert_int_eq(a.s.st[r], FSDP_STATUS_ABORTED);
        ck_assert_ptr_nonnull(strstr(a.s.msg[r], "another rank failed"));
        double waited = a.s.t_return[r] - a.s.t_fail;
        ck_assert_msg(waited < 1.0, "rank %d returned %.3f s after the failure", r, waited);
    }
    fsdp_world_free(w);
}
END_TEST

/* The first real error wins over later ones and over ABORTED reports. */
static fsdp_status two_failures_rank(fsdp_world *w, int rank, void *p)
{
    (void)p;
    switch (rank) {
    case 0: /* gives up at once, as if it had seen an abort */
        return fsdp_error_set(FSDP_STATUS_ABORTED, "aborted: gave up");
    case 1:
        usleep(20000);
        return fsdp_error_set(FSDP_STATUS_OOM, "device 1 out of memory");
    case 2:
        usleep(200000);
        return fsdp_error_set(FSDP_STATUS_FORMAT, "bad magic");
    default:
        return fsdp_world_barrier(w);
    }
}

START_TEST(test_first_real_error_wins)
{
    fsdp_world *w = NULL;
    ck_assert_int_eq(fsdp_world_init(&w, 4), FSDP_STATUS_OK);
    fsdp_status st = fsdp_world_launch(w, two_failures_rank, NULL);
    ck_assert_int_eq(st, FSDP_STATUS_OOM);
    ck_assert_str_eq(fsdp_error_msg(), "rank 1: device 1 out of memory");
    fsdp_world_free(w);
}
END_TEST

static fsdp_status all_abort_rank(fsdp_world *w, int rank, void *p)
{
    (void)w;
    (void)p;
    return fsdp_error_set(FSDP_STATUS_ABORTED, "rank %d gave up", rank);
}

START_TEST(test_only_aborts_return_aborted)
{
    fsdp_world *w = NULL;
    ck_assert_int_eq(fsdp_world_init(&w, 3), FSDP_STATUS_OK);
    ck_assert_int_eq(fsdp_world_launch(w, all_abort_rank, NULL), FSDP_STATUS_ABORTED);
    ck_assert_ptr_nonnull(strstr(fsdp_error_msg(), "gave up"));
    fsdp_world_free(w);
}
END_TEST

/* fsdp_world_fail from inside a rank, before it returns. */
static fsdp_status fail_inside_rank(fsdp_world *w, int rank, void *p)
{
    struct ranks_seen *s = p;
    if (rank == 1) {
        fsdp_world_fail(w, rank, FSDP_STATUS_FORMAT, "checkpoint 'ck/7': bad manifest");
        /* the flag is visible at once, before this rank returns */
        s->ran[rank] = fsdp_world_aborted(w);
        return FSDP_STATUS_FORMAT;
    }
    s->st[rank] = fsdp_world_barrier(w);
    return s->st[rank];
}

START_TEST(test_fail_from_inside_a_rank)
{
    fsdp_world *w = NULL;
    ck_assert_int_eq(fsdp_world_init(&w, 3), FSDP_STATUS_OK);
    struct ranks_seen s;
    memset(&s, 0, sizeof s);
    ck_assert_int_eq(fsdp_world_launch(w, fail_inside_rank, &s), FSDP_STATUS_FORMAT);
    ck_assert_str_eq(fsdp_error_msg(), "rank 1: checkpoint 'ck/7': bad manifest");
    ck_assert_int_eq(s.ran[1], 1);
    ck_assert_int_eq(s.st[0], FSDP_STATUS_ABORTED);
    ck_assert_int_eq(s.st[2], FSDP_STATUS_ABORTED);
    fsdp_world_free(w);
}
END_TEST

START_TEST(test_relaunch_after_failure)
{
    fsdp_world *w = NULL;
    ck_assert_int_eq(fsdp_world_init(&w, 4), FSDP_STATUS_OK);
    for (int round = 0; round < 3; round++) {
        struct fail_arg a;
        memset(&a, 0, sizeof a);
        a.bad = round % 4;
        a.bad_status = FSDP_STATUS_INVALID_ARG;
        ck_assert_int_eq(fsdp_world_launch(w, fail_rank, &a), FSDP_STATUS_INVALID_ARG);
        ck_assert(fsdp_world_aborted(w));
        /* the abort flag and the barrier are reset by the next launch */
        struct ranks_seen s;
        memset(&s, 0, sizeof s);
        fsdp_status st = fsdp_world_launch(w, barrier_rank, &s);
        ck_assert_msg(st == FSDP_STATUS_OK, "round %d: %s", round, fsdp_error_msg());
        ck_assert(!fsdp_world_aborted(w));
        ck_assert_int_eq(w->first_status, FSDP_STATUS_OK);
    }
    fsdp_world_free(w);
}
END_TEST

/* ---- teardown after a failure: stop hooks and the first error -------------- */

/* A world of n ranks in which rank's k-th operation of kind fails. */
static fsdp_world *world_with_fault(int n, fsdp_fault_kind kind, int rank, long k)
{
    fsdp_world *w = NULL;
    ck_assert_int_eq(fsdp_world_init(&w, n), FSDP_STATUS_OK);
    fsdp_world_set_fault(w, kind, rank, k);
    return w;
}

struct teardown_arg {
    int fail_rank;                /* -1: nobody fails */
    int n_stop[8];                /* stop hook runs per rank */
    int order[8][3];              /* which hooks ran, in order */
    int stop_on_own_thread[8];
    pthread_t tid[8];
    int stop_ret[8][2];           /* fsdp_world_rank_stop's results */
    int aborted_after_stop[8];    /* the world knew of the failure right after the stop */
    fsdp_status st[8];
};

struct stop_ctx {
    struct teardown_arg *a;
    int rank, id;
};

static void count_stop(void *p)
{
    struct stop_ctx *c = p;
    if (c->a->n_stop[c->rank] < 3)
        c->a->order[c->rank][c->a->n_stop[c->rank]] = c->id;
    c->a->n_stop[c->rank]++;
    c->a->stop_on_own_thread[c->rank] = pthread_equal(pthread_self(), c->a->tid[c->rank]);
}

/* Each rank: a cpu device, three allocations, a barrier; the fault hook
 * fails the failing rank's second allocation. Teardown then does what a
 * real one does after a failure: stop first, then hit errors of its own
 * (an allocation over the cap with the same status, a failed "sync"),
 * then release the device, and return the status of the failure. */
static fsdp_status teardown_rank(fsdp_world *w, int rank, void *p)
{
    struct teardown_arg *a = p;
    struct stop_ctx sc[3] = {{a, rank, 0}, {a, rank, 1}, {a, rank, 2}};
    a->tid[rank] = pthread_self();
    for (int i = 0; i < 3; i++) /* one per communicator, say; the middle one ends early */
        if (fsdp_world_add_rank_stop(w, rank, count_stop, &sc[i]) != FSDP_STATUS_OK)
            return FSDP_STATUS_INTERNAL;
    fsdp_world_remove_rank_stop(w, rank, count_stop, &sc[1]);
    fsdp_device d;
    fsdp_status st = fsdp_device_init(&d, FSDP_BACKEND_CPU, w, rank, rank, (size_t)1 << 20);
    if (st != FSDP_STATUS_OK)
        return st;
    void *bufs[3] = {NULL, NULL, NULL};
    for (int i = 0; i < 3 && st == FSDP_STATUS_OK; i++)
        st = fsdp_device_alloc(&d, 1024, FSDP_MEM_PARAM, "unit 'h.0' shard", &bufs[i]);
    if (st == FSDP_STATUS_OK)
        st = fsdp_world_barrier(w);
    a->stop_ret[rank][0] = fsdp_world_rank_stop(w, rank, st);
    a->stop_ret[rank][1] = fsdp_world_rank_stop(w, rank, st);
    a->aborted_after_stop[rank] = fsdp_world_aborted(w);
    if (st != FSDP_STATUS_OK) {
        void *big = NULL;
        fsdp_device_alloc(&d, (size_t)2 << 20, FSDP_MEM_ACT, "teardown scratch", &big);
        fsdp_error_set(FSDP_STATUS_CUDA, "rank %d: teardown: stream sync failed", rank);
    }
    for (int i = 0; i < 3; i++)
        fsdp_device_free(&d, bufs[i]);
    fsdp_device_fini(&d);
    a->st[rank] = st;
    return st;
}

START_TEST(test_teardown_keeps_first_error_and_stops_once)
{
    fsdp_world *w = world_with_fault(3, FSDP_FAULT_ALLOC, 1, 2);
    struct teardown_arg a = {.fail_rank = 1};
    fsdp_status st = fsdp_world_launch(w, teardown_rank, &a);
    ck_assert_int_eq(st, FSDP_STATUS_OOM);
    /* the failure the user sees is the injected one, not the teardown's */
    ck_assert_msg(strncmp(fsdp_error_msg(), "rank 1: device 1: injected allocation failure", 45) == 0,
                  "%s", fsdp_error_msg());
    ck_assert_ptr_null(strstr(fsdp_error_msg(), "teardown"));
    ck_assert_int_eq(a.st[1], FSDP_STATUS_OOM);
    for (int r = 0; r < 3; r++) {
        if (r != 1)
            ck_assert_int_eq(a.st[r], FSDP_STATUS_ABORTED);
        /* every rank ran its two hooks, newest first, once, on its own thread */
        ck_assert_int_eq(a.n_stop[r], 2);
        ck_assert_int_eq(a.order[r][0], 2);
        ck_assert_int_eq(a.order[r][1], 0);
        ck_assert_int_eq(a.stop_on_own_thread[r], 1);
        ck_assert_int_eq(a.stop_ret[r][0], 1);
        ck_assert_int_eq(a.stop_ret[r][1], 1);
        /* the failing rank's stop told the world before it returned */
        ck_assert_int_eq(a.aborted_after_stop[r], 1);
    }

    /* a clean run: nobody stops, and the hooks are gone after the launch */
    fsdp_world_set_fault(w, FSDP_FAULT_ALLOC, 1, 0);
    memset(&a, 0, sizeof a);
    a.fail_rank = -1;
    ck_assert_msg(fsdp_world_launch(w, teardown_rank, &a) == FSDP_STATUS_OK, "%s",
                  fsdp_error_msg());
    for (int r = 0; r < 3; r++) {
        ck_assert_int_eq(a.n_stop[r], 0);
        ck_assert_int_eq(a.stop_ret[r][0], 0);
        ck_assert_int_eq(w->stop[r].n, 0);
    }
    ck_assert(!fsdp_world_rank_stop(NULL, 0, FSDP_STATUS_INTERNAL));
    /* a rank holds at most FSDP_RANK_STOP_MAX hooks */
    struct stop_ctx many[FSDP_RANK_STOP_MAX + 1];
    for (int i = 0; i <= FSDP_RANK_STOP_MAX; i++) {
        many[i] = (struct stop_ctx){&a, 0, i};
        ck_assert_int_eq(fsdp_world_add_rank_stop(w, 0, count_stop, &many[i]),
                         i < FSDP_RANK_STOP_MAX ? FSDP_STATUS_OK : FSDP_STATUS_INTERNAL);
    }
    for (int i = 0; i < FSDP_RANK_STOP_MAX; i++)
        fsdp_world_remove_rank_stop(w, 0, count_stop, &many[i]);
    ck_assert_int_eq(w->stop[0].n, 0);
    fsdp_world_free(w);
}
END_TEST

/* ---- the fault hook ------------------------------------------------------- */

static fsdp_status fault_count_rank(fsdp_world *w, int rank, void *p)
{
    struct ranks_seen *s = p;
    for (int i = 1; i <= 10; i++)
        if (fsdp_world_fault_hit(w, FSDP_FAULT_ALLOC, rank))
            s->log_rank[rank] = i; /* which operation was hit */
    for (int i = 1; i <= 10; i++)
        if (fsdp_world_fault_hit(w, FSDP_FAULT_COLLECTIVE, rank))
            s->ran[rank] = i;
    return FSDP_STATUS_OK;
}

START_TEST(test_fault_hook_hits_kth_on_one_rank)
{
    fsdp_world *w = world_with_fault(4, FSDP_FAULT_ALLOC, 2, 7);
    struct ranks_seen s = {0};
    ck_assert_int_eq(fsdp_world_launch(w, fault_count_rank, &s), FSDP_STATUS_OK);
    for (int r = 0; r < 4; r++) {
        ck_assert_int_eq(s.log_rank[r], r == 2 ? 7 : 0);
        ck_assert_int_eq(s.ran[r], 0); /* collectives not armed */
    }
    /* re-arming restarts the count; k = 0 disarms */
    fsdp_world_set_fault(w, FSDP_FAULT_COLLECTIVE, 0, 1);
    fsdp_world_set_fault(w, FSDP_FAULT_ALLOC, 2, 0);
    memset(&s, 0, sizeof s);
    ck_assert_int_eq(fsdp_world_launch(w, fault_count_rank, &s), FSDP_STATUS_OK);
    for (int r = 0; r < 4; r++) {
        ck_assert_int_eq(s.log_rank[r], 0);
        ck_assert_int_eq(s.ran[r], r == 0 ? 1 : 0);
    }
    fsdp_world_free(w);
}
END_TEST

/* ---- names and messages ---------------------------------------------------- */

/* ---- the stall watchdog (core/flight.h) ------------------------------------------ */

/* Every rank meets twice; rank `late` skips the second barrier and waits
 * for the world to stop (a rank that never arrives). */
struct stall_arg {
    int late;
    struct ranks_seen s;
};

static fsdp_status stall_rank(fsdp_world *w, int rank, void *p)
{
    struct stall_arg *a = p;
    fsdp_flight_step(w->flight, rank, 7);
    fsdp_status st = fsdp_world_barrier(w);
    if (st == FSDP_STATUS_OK && rank == a->late) {
        fsdp_world_wait_aborted(w);
        st = fsdp_error_set(FSDP_STATUS_ABORTED, "rank %d: stopped", rank);
    } else if (st == FSDP_STATUS_OK) {
        st = fsdp_world_barrier(w);
    }
    a->s.st[rank] = st;
    snprintf(a->s.msg[rank], sizeof a->s.msg[rank], "%s", st ? fsdp_error_msg() : "");
    return st;
}

/* A barrier that a rank never reaches: one report names the barrier, the
 * step, who arrived and what the missing rank did last, within the
 * deadline; the flight record file holds every rank's last collectives;
 * the world runs again afterwards. */
START_TEST(test_barrier_stall_is_reported)
{
    const double limit = 0.3;
    char path[512];
    fsdp_test_path(path, sizeof path, "flight.json");
    fsdp_world *w = NULL;
    ck_assert_int_eq(fsdp_world_init(&w, 3), FSDP_STATUS_OK);
    ck_assert_int_eq(fsdp_world_set_watchdog(w, limit, path), FSDP_STATUS_OK);
    ck_assert(fsdp_watchdog_deadline(w, false) == 0); /* no deadline while nothing runs */
    struct stall_arg *a = calloc(1, sizeof *a);
    a->late = 2;
    double t0 = now_s();
    fsdp_status st = fsdp_world_launch(w, stall_rank, a);
    double dt = now_s() - t0;
    const char *msg = fsdp_error_msg();
    ck_assert_msg(st == FSDP_STATUS_STALLED, "%s: %s", fsdp_status_name(st), msg);
    static const char *const want[] = {
        "stalled: waited", "at step 7 in barrier of this process's ranks",
        "the barrier of this process's ranks (0-2): arrived: ranks 0-1; not arrived: rank 2",
        "rank 2's newest collective: barrier of this process's ranks, barrier at step 7 (record "
        "entry 1), done",
        "the last collectives of this process's ranks are in "};
    for (size_t i = 0; i < FSDP_TEST_LEN(want); i++)
        ck_assert_msg(strstr(msg, want[i]), "the report lacks '%s':\n%s", want[i], msg);
    ck_assert_msg(dt >= limit && dt < limit + 1.0, "ended after %.2f s", dt);
    ck_assert_int_eq(a->s.st[2], FSDP_STATUS_ABORTED);
    ck_assert_msg((a->s.st[0] == FSDP_STATUS_STALLED) + (a->s.st[1] == FSDP_STATUS_STALLED) == 1,
                  "%s / %s", a->s.msg[0], a->s.msg[1]);
    /* the record: JSON, every rank, their barriers in order */
    fsdp_json *j = NULL;
    ck_assert_int_eq(fsdp_json_parse_file(path, &j), FSDP_STATUS_OK);
    const fsdp_json *ranks = fsdp_json_get(j, "ranks");
    ck_assert_msg(ranks && ranks->n == 3, "%s", path);
    int reporter = a->s.st[0] == FSDP_STATUS_STALLED ? 0 : 1;
    const fsdp_json *c0 = fsdp_json_get(fsdp_json_at(ranks, reporter), "collectives");
    ck_assert(c0 && c0->n == 2); /* still waiting when it reported */
    ck_assert_str_eq(fsdp_json_get(fsdp_json_at(c0, 1), "state")->str, "running");
    const fsdp_json *c2 = fsdp_json_get(fsdp_json_at(ranks, 2), "collectives");
    ck_assert(c2 && c2->n == 1);
    ck_assert_str_eq(fsdp_json_get(fsdp_json_at(c2, 0), "state")->str, "done");
    ck_assert(strstr(fsdp_json_get(j, "report")->str, "not arrived: rank 2"));
    fsdp_json_free(j);
    /* the same world meets again */
    a->late = -1;
    ck_assert_int_eq(fsdp_world_launch(w, stall_rank, a), FSDP_STATUS_OK);
    /* off: no deadline */
    ck_assert_int_eq(fsdp_world_set_watchdog(w, 0, NULL), FSDP_STATUS_OK);
    ck_assert_ptr_null(w->flight);
    ck_assert_int_eq(fsdp_world_set_watchdog(w, -1, NULL), FSDP_STATUS_INVALID_ARG);
    free(a);
    fsdp_world_free(w);
}
END_TEST

/* The flight record without a world: it keeps its own ranks only (others, and a NULL
 * record, are ignored), composes a stall's report from the stall and what it recorded,
 * and writes the record with the process, host and deadline it is given. */
START_TEST(test_flight_record_alone)
{
    fsdp_flight *f = NULL;
    ck_assert_int_eq(fsdp_flight_init(&f, 2, 4), FSDP_STATUS_OK); /* ranks 4 and 5 */
    const fsdp_flight_coll ag = {.kind = "all_gather", .dtype = "fp32", .numel = 96, .first = 0,
                                 .stride = 1, .count = 8, .label = "unit 'h.1' all-gather"};
    const fsdp_flight_coll bar = {.kind = "barrier", .first = 4, .stride = 1, .count = 2};
    ck_assert_int_eq(fsdp_flight_issue(f, 3, &ag), 0);
    ck_assert_int_eq(fsdp_flight_issue(f, 6, &ag), 0);
    ck_assert_int_eq(fsdp_flight_issue(NULL, 4, &ag), 0);
    fsdp_flight_step(f, 4, 3);
    fsdp_flight_step(f, 5, 2);
    long a = fsdp_flight_issue(f, 4, &ag), b = fsdp_flight_issue(f, 5, &bar);
    ck_assert(a == 1 && b == 1);
    fsdp_flight_start(f, 4, a);
    fsdp_flight_start(f, 5, b);
    fsdp_flight_end(f, 5, b, true);

    const fsdp_flight_where at = {.process = 1, .n_processes = 2, .host = "node-b",
                                  .watchdog_s = 2.5};
    const int missing[] = {5};
    const fsdp_stall s = {.rank = 4, .waited_s = 2.6, .wait = "collective 1",
                          .who = "arrived: rank 4; not arrived: rank 5", .missing = missing,
                          .n_missing = 1};
    fsdp_sbuf rep = {0};
    fsdp_flight_report(f, &at, &s, &rep);
    ck_assert_ptr_nonnull(rep.p);
    static const char *const want[] = {
        "rank 4: stalled: waited 2.6 s (the watchdog's limit, --watchdog 2.5) at step 3 in unit "
        "'h.1' all-gather, collective 1: arrived: rank 4; not arrived: rank 5",
        "; rank 5's newest collective: barrier at step 2 (record entry 1), done "};
    for (size_t i = 0; i < FSDP_TEST_LEN(want); i++)
        ck_assert_msg(strstr(rep.p, want[i]), "the report lacks '%s':\n%s", want[i], rep.p);

    char path[512];
    fsdp_test_path(path, sizeof path, "alone.json");
    ck_assert_int_eq(fsdp_flight_record_write(f, &at, rep.p, path), FSDP_STATUS_OK);
    free(rep.p);
    fsdp_json *j = NULL;
    ck_assert_int_eq(fsdp_json_parse_file(path, &j), FSDP_STATUS_OK);
    ck_assert(fsdp_json_get(j, "process")->number == 1 &&
              fsdp_json_get(j, "n_processes")->number == 2 &&
              fsdp_json_get(j, "watchdog_s")->number == 2.5);
    ck_assert_str_eq(fsdp_json_get(j, "host")->str, "node-b");
    const fsdp_json *ranks = fsdp_json_get(j, "ranks");
    ck_assert(ranks && ranks->n == 2);
    static const char *const state[] = {"running", "done"};
    for (int i = 0; i < 2; i++) {
        const fsdp_json *r = fsdp_json_at(ranks, i), *c = fsdp_json_get(r, "collectives");
        ck_assert(fsdp_json_get(r, "rank")->number == 4 + i && c && c->n == 1);
        ck_assert_str_eq(fsdp_json_get(fsdp_json_at(c, 0), "state")->str, state[i]);
    }
    fsdp_json_free(j);
    fsdp_flight_free(f);
    fsdp_flight_free(NULL);
}
END_TEST

/* Rank lists in reports. */
START_TEST(test_flight_rank_lists)
{
    char buf[64];
    ck_assert_str_eq(fsdp_flight_ranks((int[]){0, 1, 2, 5, 7, 8}, 6, buf, sizeof buf),
                     "0-2, 5, 7-8");
    ck_assert_str_eq(fsdp_flight_ranks((int[]){3}, 1, buf, sizeof buf), "3");
    ck_assert_str_eq(fsdp_flight_ranks(NULL, 0, buf, sizeof buf), "");
}
END_TEST

START_TEST(test_status_and_dtype_names)
{
    static const char *const want[FSDP_STATUS_COUNT] = {
        "OK", "INVALID_ARG", "OOM", "IO", "FORMAT", "CUDA", "NCCL",
        "ABORTED", "UNSUPPORTED", "INTERNAL", "NONFINITE", "STALLED",
    };
    for (int st = 0; st < FSDP_STATUS_COUNT; st++)
        ck_assert_str_eq(fsdp_status_name((fsdp_status)st), want[st]);
    ck_assert_str_eq(fsdp_status_name(FSDP_STATUS_COUNT), "UNKNOWN");
    ck_assert_str_eq(fsdp_status_name((fsdp_status)-1), "UNKNOWN");
    ck_assert_uint_eq(fsdp_dtype_size(FSDP_DTYPE_F32), 4);
    ck_assert_uint_eq(fsdp_dtype_size(FSDP_DTYPE_BF16), 2);
    ck_assert_str_eq(fsdp_dtype_name(FSDP_DTYPE_F32), "fp32");
    ck_assert_str_eq(fsdp_dtype_name(FSDP_DTYPE_BF16), "bf16");
    ck_assert_str_eq(fsdp_backend_name(FSDP_BACKEND_CPU), "cpu");
    ck_assert_str_eq(fsdp_backend_name(FSDP_BACKEND_CUDA), "cuda");
    ck_assert_str_eq(fsdp_backend_name(FSDP_BACKEND_META), "meta");
    ck_assert_str_eq(fsdp_backend_name(FSDP_BACKEND_COUNT), "unknown");
}
END_TEST

static fsdp_status open_file(const char *path)
{
    return fsdp_error_set(FSDP_STATUS_IO, "cannot open '%s'", path);
}

static fsdp_status load(const char *path, int *cleaned)
{
    fsdp_status st;
    FSDP_CHECK(FSDP_STATUS_OK);
    FSDP_CHECK(open_file(path));
    return FSDP_STATUS_OK; /* not reached */
fail:
    *cleaned = 1;
    fsdp_error_prefix("loading model '%s'", "gpt2");
    return st;
}

static fsdp_status try_twice(void)
{
    FSDP_TRY(FSDP_STATUS_OK);
    FSDP_TRY(fsdp_error_set(FSDP_STATUS_UNSUPPORTED, "no"));
    return FSDP_STATUS_INTERNAL; /* not reached */
}

START_TEST(test_error_messages_and_macros)
{
    int cleaned = 0;
    fsdp_error_clear();
    ck_assert_str_eq(fsdp_error_msg(), "");
    ck_assert_int_eq(load("a.bin", &cleaned), FSDP_STATUS_IO);
    ck_assert_int_eq(cleaned, 1);
    ck_assert_str_eq(fsdp_error_msg(), "loading model 'gpt2': cannot open 'a.bin'");
    ck_assert_int_eq(try_twice(), FSDP_STATUS_UNSUPPORTED);
    ck_assert_str_eq(fsdp_error_msg(), "no");
    fsdp_error_copy("copied");
    ck_assert_str_eq(fsdp_error_msg(), "copied");
    fsdp_error_copy(NULL);
    ck_assert_str_eq(fsdp_error_msg(), "");
    /* a message longer than the buffer is cut, not overflowed */
    char big[3 * FSDP_ERROR_MSG_MAX];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    fsdp_error_set(FSDP_STATUS_IO, "%s", big);
    ck_assert_uint_eq(strlen(fsdp_error_msg()), FSDP_ERROR_MSG_MAX - 1);
    fsdp_error_prefix("p");
    ck_assert_uint_eq(strlen(fsdp_error_msg()), FSDP_ERROR_MSG_MAX - 1);
    ck_assert(!strncmp(fsdp_error_msg(), "p: xxx", 6));
}
END_TEST

/* The first error since the last clear survives later errors, takes
 * prefixes and wraps that extend it, and is forgotten by a clear. */
START_TEST(test_first_error_kept)
{
    const char *m = NULL;
    fsdp_error_clear();
    ck_assert_int_eq(fsdp_error_first(&m), FSDP_STATUS_OK);
    ck_assert_str_eq(m, "");
    fsdp_error_set(FSDP_STATUS_OK, "not an error");
    ck_assert_int_eq(fsdp_error_first(NULL), FSDP_STATUS_OK);
    fsdp_error_set(FSDP_STATUS_CUDA, "kernel fault");
    fsdp_error_prefix("unit 'h.3' forward");
    /* a wrap of the current message extends the first error */
    fsdp_error_set(FSDP_STATUS_CUDA, "rank 2: %s", fsdp_error_msg());
    ck_assert_int_eq(fsdp_error_first(&m), FSDP_STATUS_CUDA);
    ck_assert_str_eq(m, "rank 2: unit 'h.3' forward: kernel fault");
    /* teardown errors replace the current message only */
    fsdp_error_set(FSDP_STATUS_ABORTED, "stream sync gave up");
    fsdp_error_prefix("freeing the engine");
    fsdp_error_copy("copied");
    ck_assert_str_eq(fsdp_error_msg(), "copied");
    ck_assert_int_eq(fsdp_error_first(&m), FSDP_STATUS_CUDA);
    ck_assert_str_eq(m, "rank 2: unit 'h.3' forward: kernel fault");
    fsdp_error_clear();
    ck_assert_int_eq(fsdp_error_first(&m), FSDP_STATUS_OK);
    fsdp_error_set(FSDP_STATUS_IO, "later failure");
    ck_assert_int_eq(fsdp_error_first(&m), FSDP_STATUS_IO);
    ck_assert_str_eq(m, "later failure");
    fsdp_error_clear();
}
END_TEST

/* Each thread has its own message. */
static fsdp_status msg_rank(fsdp_world *w, int rank, void *p)
{
    struct ranks_seen *s = p;
    fsdp_error_set(FSDP_STATUS_IO, "message of rank %d", rank);
    FSDP_TRY(fsdp_world_barrier(w)); /* everyone has set theirs */
    snprintf(s->msg[rank], sizeof s->msg[rank], "%s", fsdp_error_msg());
    return FSDP_STATUS_OK;
}

START_TEST(test_error_messages_are_per_thread)
{
    fsdp_world *w = NULL;
    ck_assert_int_eq(fsdp_world_init(&w, 4), FSDP_STATUS_OK);
    fsdp_error_set(FSDP_STATUS_IO, "main thread");
    struct ranks_seen s;
    memset(&s, 0, sizeof s);
    ck_assert_int_eq(fsdp_world_launch(w, msg_rank, &s), FSDP_STATUS_OK);
    char want[64];
    for (int r = 0; r < 4; r++) {
        snprintf(want, sizeof want, "message of rank %d", r);
        ck_assert_str_eq(s.msg[r], want);
    }
    ck_assert_str_eq(fsdp_error_msg(), "main thread");
    fsdp_world_free(w);
}
END_TEST

/* ---- byte sizes ------------------------------------------------------------- */

START_TEST(test_parse_bytes)
{
    static const struct {
        const char *s;
        size_t want;
    } good[] = {
        {"4096", 4096},
        {"0", 0},
        {"1e9", 1000000000},
        {"1.5e3", 1500},
        {"512M", (size_t)512 << 20},
        {"512m", (size_t)512 << 20},
        {"24GiB", (size_t)24 << 30},
        {"24gib", (size_t)24 << 30},
        {"24G", (size_t)24 << 30},
        {"1K", 1024},
        {"2KiB", 2048},
        {"1T", (size_t)1 << 40},
        {"1P", (size_t)1 << 50},
        {"1KB", 1000},
        {"3MB", 3000000},
        {"2GB", 2000000000},
        {"1.5G", (size_t)3 << 29},
        {"100B", 100},
        {"7 MiB", (size_t)7 << 20},
    };
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        size_t v = 12345;
        fsdp_status st = fsdp_parse_bytes(good[i].s, &v);
        ck_assert_msg(st == FSDP_STATUS_OK, "'%s': %s", good[i].s, fsdp_error_msg());
        ck_assert_msg(v == good[i].want, "'%s' -> %zu, want %zu", good[i].s, v, good[i].want);
    }
    static const char *const bad[] = {
        "", "abc", "-5", "12X", "GiB", "1KiBx", "1Gi", "5 apples", "1e30", "nan", "inf",
        "1MiBB", "--1",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        size_t v = 777;
        fsdp_status st = fsdp_parse_bytes(bad[i], &v);
        ck_assert_msg(st == FSDP_STATUS_INVALID_ARG, "'%s' accepted as %zu", bad[i], v);
        ck_assert_uint_eq(v, 777); /* untouched on error */
        if (*bad[i])
            ck_assert_msg(strstr(fsdp_error_msg(), bad[i]) && strstr(fsdp_error_msg(), "24GiB"),
                          "message for '%s': %s", bad[i], fsdp_error_msg());
    }
    size_t v;
    ck_assert_int_eq(fsdp_parse_bytes(NULL, &v), FSDP_STATUS_INVALID_ARG);
}
END_TEST

START_TEST(test_fmt_bytes)
{
    char buf[32];
    ck_assert_str_eq(fsdp_fmt_bytes(buf, sizeof buf, 0), "0 B");
    ck_assert_str_eq(fsdp_fmt_bytes(buf, sizeof buf, 1023), "1023 B");
    ck_assert_str_eq(fsdp_fmt_bytes(buf, sizeof buf, 1024), "1.00 KiB");
    ck_assert_str_eq(fsdp_fmt_bytes(buf, sizeof buf, 1.5 * 1024 * 1024 * 1024), "1.50 GiB");
    ck_assert_str_eq(fsdp_fmt_bytes(buf, sizeof buf, 24.0 * (1 << 30)), "24.0 GiB");
    ck_assert_str_eq(fsdp_fmt_bytes(buf, sizeof buf, 1099511627776.0), "1.00 TiB");
}
END_TEST

/* ---- logging settings (read once per process: checked in a child) -------- */

/* Run fn in a fresh child process with the given environment; returns the
 * child's exit code (0 = every check passed). stderr goes to err_path. */
static int in_child(const char *log, const char *subsys, const char *err_path,
                    int (*fn)(void))
{
    pid_t pid = fork();
    if (pid == 0) {
        if (log)
            setenv("FSDP_LOG", log, 1);
        else
            unsetenv("FSDP_LOG");
        if (subsys)
            setenv("FSDP_LOG_SUBSYS", subsys, 1);
        else
            unsetenv("FSDP_LOG_SUBSYS");
        unsetenv("FSDP_CPU_THREADS");
        if (err_path && !freopen(err_path, "w", stderr))
            _exit(99);
        int rc = fn();
        fflush(stderr);
        _exit(rc);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 100;
}

static int child_defaults(void)
{
    if (strcmp(fsdp_env_get(FSDP_ENV_LOG), "warn") ||
        strcmp(fsdp_env_get(FSDP_ENV_LOG_SUBSYS), "all") ||
        strcmp(fsdp_env_get(FSDP_ENV_CPU_THREADS), "0"))
        return 1;
    if (!fsdp_log_enabled(FSDP_LOG_WARN, FSDP_SUB_COMM) || !fsdp_log_enabled(FSDP_LOG_ERROR, 0))
        return 2;
    if (fsdp_log_enabled(FSDP_LOG_INFO, FSDP_SUB_COMM) ||
        fsdp_log_enabled(FSDP_LOG_DEBUG, FSDP_SUB_ALL))
        return 3;
    return 0;
}

static int child_debug_comm(void)
{
    if (!fsdp_log_enabled(FSDP_LOG_DEBUG, FSDP_SUB_COMM) ||
        !fsdp_log_enabled(FSDP_LOG_INFO, FSDP_SUB_SHARD))
        return 1;
    if (fsdp_log_enabled(FSDP_LOG_DEBUG, FSDP_SUB_ALLOC) ||
        fsdp_log_enabled(FSDP_LOG_INFO, FSDP_SUB_DATA))
        return 2;
    if (!fsdp_log_enabled(FSDP_LOG_WARN, FSDP_SUB_ALLOC)) /* warnings ignore the mask */
        return 3;
    fsdp_log_set_rank(3);
    FSDP_DEBUG(FSDP_SUB_COMM, "gathered %d bytes", 42);
    FSDP_DEBUG(FSDP_SUB_ALLOC, "not shown");
    fsdp_log_set_rank(-1);
    FSDP_WARN(FSDP_SUB_CORE, "from main");
    return 0;
}

static int child_error_level(void)
{
    if (!fsdp_log_enabled(FSDP_LOG_ERROR, FSDP_SUB_CORE) ||
        fsdp_log_enabled(FSDP_LOG_WARN, FSDP_SUB_CORE))
        return 1;
    return 0;
}

static int child_bad_values(void)
{
    /* unknown level: the default (warn); unknown subsystems only: all */
    if (!fsdp_log_enabled(FSDP_LOG_WARN, FSDP_SUB_CORE) ||
        fsdp_log_enabled(FSDP_LOG_INFO, FSDP_SUB_CORE))
        return 1;
    return 0;
}

START_TEST(test_log_settings)
{
    char path[] = "/tmp/fsdp_test_core_logXXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    close(fd);
    ck_assert_int_eq(in_child(NULL, NULL, NULL, child_defaults), 0);
    ck_assert_int_eq(in_child("error", NULL, NULL, child_error_level), 0);
    ck_assert_int_eq(in_child("loud", "nothing", NULL, child_bad_values), 0);
    ck_assert_int_eq(in_child("DEBUG", "comm,shard", path, child_debug_comm), 0);
    char text[512] = {0};
    FILE *f = fopen(path, "r");
    ck_assert_ptr_nonnull(f);
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    unlink(path);
    text[n] = '\0';
    ck_assert_str_eq(text, "fsdp[rank 3] DEBUG: gathered 42 bytes\nfsdp WARN: from main\n");
}
END_TEST

/* ---- the normal draw's fast path ------------------------------------------------------ */

/* fsdp_rng_box_muller(a, b) is libm's Box-Muller float, bit for bit: at the
 * places where polynomials and libm part most (u1 at its ends and its
 * reduction's boundaries; u2 around every quadrant boundary and every zero
 * of cos, a run of neighbouring bit patterns each) and for random bits. */
START_TEST(test_box_muller_is_libms)
{
    /* u1 = (a >> 11 + 0.5) / 2^53 and u2 = (b >> 11) / 2^53: a and b from the
     * 53-bit integer */
    static const double u1s[] = {0, 1, 0.5, 0.70710678118654752, 0.35355339059327376, 0.25,
                                 1.0 / 3, 0.999, 1e-9};
    static const double u2s[] = {0, 0.125, 0.25, 0.375, 0.5, 0.625, 0.75, 0.875, 1};
    long n = 0;
    for (size_t i = 0; i < FSDP_TEST_LEN(u1s); i++)
        for (size_t j = 0; j < FSDP_TEST_LEN(u2s); j++)
            for (int64_t d1 = -40; d1 <= 40; d1 += 8)
                for (int64_t d2 = -2000; d2 <= 2000; d2++) {
                    int64_t i1 = (int64_t)(u1s[i] * 9007199254740992.0) + d1;
                    int64_t i2 = (int64_t)(u2s[j] * 9007199254740992.0) + d2;
                    if (i1 < 0 || i2 < 0 || i1 >= (1ll << 53) || i2 >= (1ll << 53))
                        continue;
                    uint64_t a = (uint64_t)i1 << 11, b = (uint64_t)i2 << 11;
                    float want = fsdp_rng_box_muller_libm(a, b), got = fsdp_rng_box_muller(a, b);
                    if (memcmp(&want, &got, sizeof want)) /* (check's asserts cost a write) */
                        ck_abort_msg("u1 %.17g, u2 %.17g: %.9g, libm %.9g", (double)i1 / 0x1p53,
                                     (double)i2 / 0x1p53, got, want);
                    n++;
                }
    ck_assert_int_gt(n, 500000);
    for (uint64_t k = 0; k < 2000000; k++) {
        uint64_t a = fsdp_rng_mix(k), b = fsdp_rng_mix(~k);
        float want = fsdp_rng_box_muller_libm(a, b), got = fsdp_rng_box_muller(a, b);
        if (memcmp(&want, &got, sizeof want))
            ck_abort_msg("bits %016llx %016llx: %.9g, libm %.9g", (unsigned long long)a,
                         (unsigned long long)b, got, want);
    }
}
END_TEST

/* fsdp_rng_normal_fill is scale * fsdp_rng_normal, element by element, for
 * any start and length (blocks of 64 and their tails). */
START_TEST(test_normal_fill_is_the_draw)
{
    static const struct {
        uint64_t seed, stream, first;
        size_t n;
    } runs[] = {{1234, 99, 0, 3000000}, {7, 0, 12345, 777}, {0, ~0ull, (1ull << 40) - 5, 65},
                {42, 3, 1, 1}};
    for (size_t r = 0; r < FSDP_TEST_LEN(runs); r++) {
        size_t n = runs[r].n;
        float *got = malloc(n * sizeof *got);
        ck_assert_ptr_nonnull(got);
        fsdp_rng_normal_fill(runs[r].seed, runs[r].stream, runs[r].first, n, 0.02f, got);
        for (size_t i = 0; i < n; i++) {
            float want = 0.02f * fsdp_rng_normal(runs[r].seed, runs[r].stream, runs[r].first + i);
            if (memcmp(&want, &got[i], sizeof want))
                ck_abort_msg("run %zu, element %zu: %.9g, libm %.9g", r, i, got[i], want);
        }
        free(got);
    }
}
END_TEST

/* ---- lossy UTF-8 (utf8.h) ---------------------------------------------------- */

/* hex ("-": empty) into b; its length */
static size_t unhex(const char *h, uint8_t *b)
{
    size_t n = 0;
    for (; h[0] != '-' && h[0] && h[1]; h += 2) {
        unsigned v;
        if (sscanf(h, "%2x", &v) != 1)
            ck_abort_msg("bad hex '%s'", h);
        b[n++] = (uint8_t)v;
    }
    return n;
}

/* in fed as pieces of `step` bytes (0: cut once at `cut`), then ended */
static size_t lossy_fed(const uint8_t *in, size_t n, size_t step, size_t cut, uint8_t *out)
{
    fsdp_utf8_stream s = {0};
    size_t w = 0;
    if (step == 0) {
        w += fsdp_utf8_lossy(&s, in, cut, false, out);
        w += fsdp_utf8_lossy(&s, in + cut, n - cut, false, out + w);
    } else {
        for (size_t i = 0; i < n; i += step)
            w += fsdp_utf8_lossy(&s, in + i, n - i < step ? n - i : step, false, out + w);
    }
    w += fsdp_utf8_lossy(&s, NULL, 0, true, out + w);
    if (s.n_pend != 0)
        ck_abort_msg("a character still open after the end");
    return w;
}

/* tests/fixtures/utf8_lossy.txt (tools/gen_utf8_fixture.py: Python's
 * decode("utf-8", "replace"), the tokenizers decoders' lossy decode): each
 * case's output, fed whole, a byte at a time, in 3- and 5-byte pieces and cut
 * once at every position, is the reference's, and within the size bound. */
START_TEST(test_utf8_lossy_is_the_references)
{
    FILE *f = fopen("tests/fixtures/utf8_lossy.txt", "r");
    ck_assert_ptr_nonnull(f);
    char in_hex[512], want_hex[1024];
    int n_cases = 0, n_broken = 0;
    while (fscanf(f, "%511s %1023s", in_hex, want_hex) == 2) {
        uint8_t in[256], want[512], got[FSDP_UTF8_LOSSY_MAX(256)];
        size_t n = unhex(in_hex, in), nw = unhex(want_hex, want);
        n_broken += nw != n || memcmp(in, want, n) != 0;
        const size_t steps[] = {1, 3, 5, 1000};
        for (size_t k = 0; k < 4 + n + 1; k++) {
            size_t w = k < 4 ? lossy_fed(in, n, steps[k], 0, got) : lossy_fed(in, n, 0, k - 4, got);
            if (w > FSDP_UTF8_LOSSY_MAX(n) || w != nw || memcmp(got, want, w) != 0)
                ck_abort_msg("%s: %s, want %s (%s %zu)", in_hex, w ? "differs" : "empty",
                             want_hex, k < 4 ? "pieces of" : "cut at",
                             k < 4 ? steps[k] : k - 4);
        }
        n_cases++;
    }
    fclose(f);
    ck_assert_int_ge(n_cases, 700);
    ck_assert_int_ge(n_broken, 300); /* most cases need a replacement */
}
END_TEST

int main(void)
{
    const fsdp_test_tcase tcases[] = {
        {"world", 60,
         FSDP_TESTS(test_launch_runs_every_rank_once, test_world_init_rejects_bad_sizes,
                    test_barrier_separates_rounds, test_failing_rank_aborts_barrier_waiters,
                    test_first_real_error_wins, test_only_aborts_return_aborted,
                    test_fail_from_inside_a_rank, test_relaunch_after_failure,
                    test_fault_hook_hits_kth_on_one_rank,
                    test_teardown_keeps_first_error_and_stops_once)},
        {"errors",
         FSDP_TESTS(test_status_and_dtype_names, test_error_messages_and_macros,
                    test_error_messages_are_per_thread, test_first_error_kept, test_parse_bytes,
                    test_fmt_bytes)},
        {"log", 30, FSDP_TESTS(test_log_settings)},
        {"rng", 120, FSDP_TESTS(test_box_muller_is_libms, test_normal_fill_is_the_draw)},
        {"utf8", 30, FSDP_TESTS(test_utf8_lossy_is_the_references)},
        {"watchdog", 30, .tmpdir = true,
         FSDP_TESTS(test_barrier_stall_is_reported, test_flight_record_alone,
                    test_flight_rank_lists)},
    };
    return fsdp_test_main("core", tcases, FSDP_TEST_LEN(tcases));
}
